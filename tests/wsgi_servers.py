"""Real WSGI servers for the tests: gunicorn (``gthread`` worker) and waitress, each a
process of its own on a free loopback port, stopped (and its process group killed) after.

``serve(kind, app, env, folder)`` is a context manager that yields a :class:`Server` once
it answers ``GET <ready_path>``; its log (stdout and stderr) goes to ``server.log_path``.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

from redis_server import free_port

TESTS = Path(__file__).resolve().parent


class Server:
    def __init__(self, kind: str, proc: subprocess.Popen[bytes], port: int,
                 log_path: Path) -> None:
        self.kind = kind
        self.proc = proc
        self.port = port
        self.log_path = log_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def request(self, path: str, headers: Optional[dict[str, str]] = None,
                timeout: float = 30.0) -> tuple[int, bytes, float]:
        """One request on a fresh connection (``Connection: close``): status, body and the
        seconds it took. A response cut short raises ``http.client.IncompleteRead``."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            start = time.monotonic()
            conn.request("GET", path, headers={"Connection": "close", **(headers or {})})
            resp = conn.getresponse()
            body = resp.read()
            return resp.status, body, time.monotonic() - start
        finally:
            conn.close()

    def json(self, path: str, headers: Optional[dict[str, str]] = None) -> Any:
        status, body, _ = self.request(path, headers)
        assert status == 200, (status, body)
        return json.loads(body)


def only_aborts(log: str) -> bool:
    """gunicorn and waitress log the ResponseAborted the middleware raises to them, with
    its traceback: that is the abort working. Any other traceback in a log is a defect."""
    for block in log.split("Traceback (most recent call last):")[1:]:
        lines = [line for line in block.splitlines()[1:] if line and not line[0].isspace()]
        what = lines[0] if lines else ""  # the exception this traceback ends with
        if not what.startswith(("timeoutcore.contrib.wsgi.ResponseAborted: ",
                                "timeoutcore.errors.DeadlineExceeded: ")):  # its cause
            return False
    return True


def settles(read: Any, want: Any, within: float = 10.0) -> Any:
    """Poll ``read()`` until it equals ``want`` (a server closes a finished connection, and
    PostgreSQL ends a closed session's backend, a moment after the client has its answer);
    return the last value read."""
    end = time.monotonic() + within
    while True:
        got = read()
        if got == want or time.monotonic() > end:
            return got
        time.sleep(0.05)


def assert_clean_log(log: str) -> None:
    """gunicorn's own timeout never fired, and the only tracebacks are the aborts."""
    assert "WORKER TIMEOUT" not in log
    assert only_aborts(log), log


def _command(kind: str, app: str, port: int, threads: int) -> list[str]:
    bind = f"127.0.0.1:{port}"
    if kind == "gunicorn":
        return [sys.executable, "-m", "gunicorn", "-k", "gthread", "--threads", str(threads),
                "-w", "1", "-b", bind, "--timeout", "5", "--graceful-timeout", "2",
                "-c", str(TESTS / "wsgi_gunicorn_conf.py"), app]
    if kind == "waitress":
        return [sys.executable, "-m", "waitress", f"--listen={bind}", f"--threads={threads}",
                app]
    raise ValueError(f"unknown server {kind!r}")


@contextlib.contextmanager
def serve(kind: str, app: str, env: dict[str, str], folder: Path, threads: int = 4,
          ready_path: str = "/fast", timeout: float = 30.0) -> Iterator[Server]:
    port = free_port()
    log_path = folder / f"{kind}-{port}.log"
    path = env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    full_env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join([str(TESTS), path])}
    if kind == "waitress":
        full_env["WSGI_TEST_PATCH_AT_IMPORT"] = "1"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(_command(kind, app, port, threads), stdout=log,
                                stderr=subprocess.STDOUT, env=full_env, cwd=str(TESTS),
                                start_new_session=True)
    server = Server(kind, proc, port, log_path)
    try:
        end = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{kind} exited with {proc.returncode}:\n{server.log()}")
            try:
                if server.request(ready_path, timeout=2.0)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > end:
                raise RuntimeError(f"{kind} did not answer in {timeout} s:\n{server.log()}")
            time.sleep(0.05)
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # workers, and anything they left
        proc.wait()
