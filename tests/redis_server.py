"""A real ``redis-server`` on loopback for the tests, started and stopped through its pidfile.

``.ci/run`` starts one for the whole run and exports ``TIMEOUTCORE_TEST_REDIS_URL``; without
that variable the session fixture starts its own (``redis-server`` on PATH), and a test that
must stop Redis mid-job always gets a private one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, Optional
from urllib.parse import urlparse

import pytest

ENV = "TIMEOUTCORE_TEST_REDIS_URL"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ping(host: str, port: int, timeout: float = 0.5) -> bool:
    """True if a Redis server answers PING at host:port (raw protocol, no client library)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One ``redis-server --daemonize yes`` in ``folder``; ``stop()`` kills it via its pidfile."""

    def __init__(self, folder: Path, port: Optional[int] = None) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise FileNotFoundError("redis-server is not on PATH")
        self.exe = exe
        self.folder = folder
        self.port = port or free_port()
        self.pidfile = folder / f"redis-{self.port}.pid"
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [self.exe, "--bind", "127.0.0.1", "--port", str(self.port), "--daemonize", "yes",
             "--pidfile", str(self.pidfile), "--dir", str(self.folder), "--save", "",
             "--appendonly", "no", "--logfile", str(self.folder / f"redis-{self.port}.log")],
            check=True, timeout=timeout,
        )
        end = time.monotonic() + timeout
        for _ in range(int(timeout / 0.02)):
            if ping("127.0.0.1", self.port):
                return self
            if time.monotonic() > end:
                break
            time.sleep(0.02)
        raise RuntimeError(f"redis-server on port {self.port} did not answer PING")

    def pid(self) -> Optional[int]:
        try:
            return int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None

    def stop(self, timeout: float = 10.0) -> None:
        pid = self.pid()
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        for _ in range(int(timeout / 0.02)):
            if not ping("127.0.0.1", self.port, timeout=0.1):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
            time.sleep(0.02)
        self.pidfile.unlink(missing_ok=True)


@contextlib.contextmanager
def session_redis(new_folder: Callable[[], Path]) -> Iterator[str]:
    """The URL of a live Redis for a test session: $TIMEOUTCORE_TEST_REDIS_URL (it must
    answer), else a ``redis-server`` started in ``new_folder()`` and stopped afterwards;
    skips only where neither exists."""
    url = os.environ.get(ENV)
    if url:
        parsed = urlparse(url)
        if not ping(parsed.hostname or "127.0.0.1", parsed.port or 6379, timeout=2.0):
            pytest.fail(f"{ENV}={url} does not answer PING")
        yield url
        return
    try:
        server = RedisServer(new_folder()).start()
    except FileNotFoundError:
        pytest.skip(f"no Redis: install redis-server or set {ENV}")
    try:
        yield server.url
    finally:
        server.stop()


def wait_for_job(registry: Any, job: str, timeout: float = 10.0) -> Any:
    """The JobInfo of ``job`` as soon as ``registry`` lists it (polls every 5 ms)."""
    end = time.monotonic() + timeout
    for _ in range(int(timeout / 0.005)):
        info = registry.get(job)
        if info is not None:
            return info
        if time.monotonic() > end:
            break
        time.sleep(0.005)
    raise AssertionError(f"job {job} never appeared in the registry")
