"""Real Huey consumers for the tests and the benchmark: ``huey_consumer huey_app.huey`` in a
subprocess (cwd = tests/), on a Huey of its own name, and the same app in this process to
enqueue, revoke and read results."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from huey_app import App, make_huey, stamps_key
from wsgi_servers import settles

TESTS = Path(__file__).resolve().parent


def start(log_path: Path, target: str, cwd: Path, env: dict[str, str], *,
          kind: str = "thread", workers: int = 1) -> subprocess.Popen[bytes]:
    """``huey_consumer <target> -k <kind> -w <workers>`` in ``cwd`` (never the source tree:
    it would shadow the installed package), its output in ``log_path``; polling the queue
    at least every 50 ms when it does not block on it."""
    with log_path.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "huey.bin.huey_consumer", target, "-k", kind,
             "-w", str(workers), "-d", "0.01", "-m", "0.05"],
            cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
        )


def wait_ready(proc: subprocess.Popen[bytes], log_path: Path, timeout: float = 60.0) -> None:
    """Return once the consumer has started its workers; AssertionError (with its log) if
    it exits or takes longer than ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while "Huey consumer started" not in log_path.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > end:
            raise AssertionError("the consumer did not start:\n"
                                 + log_path.read_text(errors="replace")[-3000:])
        time.sleep(0.02)


def stop(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM (huey's immediate shutdown), then wait for the consumer; its exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode


class Consumer:
    """``huey_consumer huey_app.huey -k <kind> -w <workers>`` in a subprocess; ``app`` is the
    same app (same name, same tasks) in this process. ``install``/``patch``: the consumer's
    app calls ``timeoutcore.contrib.huey.install(huey, patch=patch)``; ``signals``: what
    it does with huey's signals (``huey_app.make_huey``); ``caller_install``: install() in
    this process's app too (where it checks the limits of what is enqueued)."""

    baseline: Any = None  # what a test module saw of the consumer at its start

    def __init__(self, url: str, folder: Path, *, kind: str = "thread", workers: int = 1,
                 install: bool = True, patch: bool = True, signals: str = "log",
                 caller_install: bool = True) -> None:
        self.name = f"timeoutcore-test-{uuid.uuid4().hex}"
        self.kind = kind
        self.app: App = make_huey(url, self.name, install=caller_install)
        self.log_path = folder / f"consumer-{kind}-{self.name[-8:]}.log"
        env = dict(os.environ, TC_URL=url, TC_HUEY_NAME=self.name,
                   TC_INSTALL=str(int(install)), TC_PATCH=str(int(patch)),
                   TC_SIGNALS=signals,
                   PYTHONPATH=os.pathsep.join(
                       p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p))
        self.proc = start(self.log_path, "huey_app.huey", TESTS, env, kind=kind,
                          workers=workers)
        try:
            wait_ready(self.proc, self.log_path)
        except AssertionError:
            self.stop()
            raise

    @property
    def huey(self) -> Any:
        return self.app.huey

    def __getitem__(self, task: str) -> Any:
        return self.app[task]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, text: str, timeout: float = 10.0) -> bool:
        """Whether ``text`` shows up in the consumer's log within ``timeout`` seconds."""
        return bool(settles(lambda: text in self.log(), True, within=timeout))

    def stop(self) -> int:
        return stop(self.proc)

    def close(self) -> int:
        """Stop the consumer, delete this app's keys from Redis (queue, schedule, results,
        flags, stamps) and close this process's connections; the consumer's exit status."""
        status = self.stop()
        huey = self.app.huey
        huey.flush()
        huey.storage.conn.delete(stamps_key(huey))
        huey.storage.conn.connection_pool.disconnect()
        return status

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
