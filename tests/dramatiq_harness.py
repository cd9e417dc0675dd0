"""Real Dramatiq workers for the tests and the benchmark: ``python -m dramatiq <module>
--processes 1 --threads N`` in a process group of its own; for tests/dramatiq_app.py on a
namespace of its own, with the same broker in this process to send messages and read their
results."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Optional

from dramatiq.results import ResultFailure, Results

from dramatiq_app import make_broker

TESTS = Path(__file__).resolve().parent
READY = "Worker process is ready for action."
WAIT_MS = 30_000  # a result a test waits for at most (a broken build fails, never hangs)


class WorkerProcess:
    """``python -m dramatiq <module> --processes 1 --threads N`` started in ``folder`` (its
    cwd, on its path) with ``env`` added, its log in ``log_path``; ready when it says so."""

    def __init__(self, module: str, folder: Path, env: dict[str, str], *, threads: int = 1,
                 log_name: str = "dramatiq.log") -> None:
        self.log_path = folder / log_name
        pythonpath = os.pathsep.join(p for p in (str(folder), str(TESTS),
                                                 os.environ.get("PYTHONPATH")) if p)
        full_env = dict(os.environ, **env, PYTHONPATH=pythonpath,
                        dramatiq_worker_timeout="100")  # the idle poll, ms (default 1 s)
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dramatiq", module, "--processes", "1",
                 "--threads", str(threads)],
                cwd=folder, env=full_env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _wait_ready(self, timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        while READY not in self.log():
            if self.proc.poll() is not None or time.monotonic() > end:
                raise AssertionError(f"the dramatiq worker did not start:\n{self.log()[-3000:]}")
            time.sleep(0.05)

    def stop(self) -> int:
        """SIGTERM (dramatiq's clean shutdown); the return code. Whatever is left of its
        process group is killed."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.wait()


class DramatiqWorker(WorkerProcess):
    """A worker of tests/dramatiq_app.py on a namespace of its own (``proc``: dramatiq's
    parent; the actors run in its one worker process), and ``broker``, the same broker in
    this process."""

    def __init__(self, url: str, folder: Path, *, limits: str = "timeoutcore",
                 threads: int = 1, registry_prefix: Optional[str] = None,
                 stopwatch: bool = False) -> None:
        self.namespace = f"tc-dramatiq-{uuid.uuid4().hex[:12]}"
        self.broker = make_broker(url, self.namespace, limits=limits,
                                  registry_prefix=registry_prefix)
        self.backend = next(m.backend for m in self.broker.middleware if isinstance(m, Results))
        env = dict(TC_URL=url, TC_NS=self.namespace, TC_LIMITS=limits, TC_WORKER="1",
                   TC_REGISTRY_PREFIX=registry_prefix or "", TC_STOPWATCH=str(int(stopwatch)))
        super().__init__("dramatiq_app", folder, env, threads=threads,
                         log_name=f"dramatiq-{limits}-{self.namespace[-6:]}.log")

    def actor(self, name: str) -> Any:
        return self.broker.get_actor(name)

    def send(self, name: str, *args: Any, **options: Any) -> Any:
        """The message sent to actor ``name`` (``options``: ``send_with_options``'s)."""
        return self.actor(name).send_with_options(args=args, **options)

    def result(self, message: Any, timeout_ms: int = WAIT_MS) -> Any:
        """What the actor returned; a failure is raised as ResultFailure."""
        return message.get_result(backend=self.backend, block=True, timeout=timeout_ms)

    def failure(self, message: Any, timeout_ms: int = WAIT_MS) -> ResultFailure:
        """The failure stored for the message (AssertionError if it succeeded)."""
        try:
            value = self.result(message, timeout_ms)
        except ResultFailure as exc:
            return exc
        raise AssertionError(f"message {message.message_id} succeeded: {value!r}")

    def stop(self) -> int:
        code = super().stop()
        self.broker.close()
        return code

    def __enter__(self) -> DramatiqWorker:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
