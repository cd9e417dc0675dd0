"""Real RQ workers for tests/test_rq.py and benchmarks/bench_rq.py: ``python -m rq.cli
worker --worker-class ...`` in a subprocess (cwd = tests/, so that it imports the installed
timeoutcore and tests/rq_jobs.py), on a queue of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Optional

from redis import Redis
from rq.job import Job, JobStatus

TESTS = Path(__file__).resolve().parent
ENDED = (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED)


def job_env() -> dict[str, str]:
    """The environment of a process that imports rq_jobs."""
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path)


class RQWorker:
    """One ``rq worker`` process of ``worker_class`` on a fresh queue; ``stop()`` sends it
    SIGTERM (RQ's warm shutdown) and reaps it. ``burst``: it exits once the queue is empty."""

    def __init__(self, url: str, worker_class: str, folder: Path, *, burst: bool = False,
                 queue: Optional[str] = None, wait: bool = True) -> None:
        self.url = url
        self.redis = Redis.from_url(url)
        self.queue = queue or f"timeoutcore-rq-{uuid.uuid4().hex[:12]}"
        self.name = f"{self.queue}-w"
        self.log_path = folder / f"{self.name}.log"
        command = [sys.executable, "-m", "rq.cli", "worker", "--worker-class", worker_class,
                   "--url", url, "--name", self.name, self.queue]
        if burst:
            command.append("--burst")
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen(command, cwd=TESTS, env=job_env(), stdout=out,
                                         stderr=subprocess.STDOUT)
        if wait:
            self.wait_listening()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_listening(self, timeout: float = 30.0) -> None:
        end = time.monotonic() + timeout
        while "*** Listening on" not in self.log():
            if self.proc.poll() is not None or time.monotonic() > end:
                self.stop()
                raise AssertionError(f"the RQ worker did not start:\n{self.log()[-3000:]}")
            time.sleep(0.02)

    def stop(self, timeout: float = 20.0) -> int:
        """Warm shutdown; the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.redis.close()
        return self.proc.returncode

    def __enter__(self) -> RQWorker:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def wait_ended(job: Job, timeout: float = 30.0) -> str:
    """The job's status once it has ended (finished, failed, stopped), polled every 10 ms."""
    end = time.monotonic() + timeout
    while True:
        status = job.get_status(refresh=True)
        if status in ENDED or time.monotonic() > end:
            return str(status.value if isinstance(status, JobStatus) else status)
        time.sleep(0.01)


def wait_status(job: Job, status: str, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while job.get_status(refresh=True) != status:
        if time.monotonic() > end:
            raise AssertionError(f"job {job.id} never became {status}: {job.get_status()}")
        time.sleep(0.005)
