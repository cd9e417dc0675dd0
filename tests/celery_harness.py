"""Real Celery workers for the tests and benchmarks: ``celery -A celery_app worker`` in a
subprocess on a queue of its own, and a real event receiver."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Optional

from celery import Celery
from celery_app import make_app

TESTS = Path(__file__).resolve().parent


class Worker:
    """``celery -A celery_app worker`` in a subprocess, on a queue of its own; ``app`` is the
    same app in this process, to send tasks and read results."""

    def __init__(self, url: str, pool: str, folder: Path, *, install: bool = True,
                 patch: bool = False, app_time_limit: Optional[float] = None,
                 registry_prefix: Optional[str] = None, concurrency: int = 2,
                 loglevel: str = "INFO", reap: bool = False,
                 shutdown_grace: Optional[float] = None) -> None:
        self.queue = f"timeoutcore-test-{uuid.uuid4().hex}"
        self.app: Celery = make_app(url, self.queue, app_time_limit=app_time_limit)
        self.log_path = folder / f"worker-{pool}-{self.queue[-8:]}.log"
        env = dict(os.environ, TC_URL=url, TC_QUEUE=self.queue, TC_INSTALL=str(int(install)),
                   TC_PATCH=str(int(patch)), TC_APP_TIME_LIMIT=str(app_time_limit or ""),
                   TC_REGISTRY_PREFIX=registry_prefix or "", TC_REAP=str(int(reap)),
                   TC_SHUTDOWN_GRACE="" if shutdown_grace is None else str(shutdown_grace),
                   PYTHONPATH=os.pathsep.join(
                       p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p))
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "celery_app", "worker", "-P", pool,
                 "-c", str(concurrency), "-Q", self.queue, "-l", loglevel, "--without-gossip",
                 "--without-mingle", "--without-heartbeat", "-n", f"{self.queue}@%h"],
                cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT,
            )
        self._wait_ready()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, text: str, timeout: float = 10.0) -> bool:
        """Whether ``text`` shows up in the worker's log within ``timeout`` seconds."""
        end = time.monotonic() + timeout
        while text not in self.log():
            if time.monotonic() > end:
                return False
            time.sleep(0.02)
        return True

    def _wait_ready(self, timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        for _ in range(int(timeout / 0.05)):
            if " ready." in self.log():
                return
            if self.proc.poll() is not None or time.monotonic() > end:
                break
            time.sleep(0.05)
        self.stop()
        raise AssertionError(f"the worker did not start:\n{self.log()[-3000:]}")

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # warm shutdown
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.log()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class Events:
    """A real Celery event receiver: collects task events by task id."""

    KINDS = ("task-failed", "task-succeeded", "task-revoked")

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.seen: dict[str, list[dict[str, Any]]] = {}
        self.ready = threading.Event()
        self._recv: Any = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _on(self, event: dict[str, Any]) -> None:
        self.seen.setdefault(event["uuid"], []).append(event)

    def _run(self) -> None:
        with self.app.connection_for_read() as conn:
            recv = self.app.events.Receiver(conn, handlers={k: self._on for k in self.KINDS})
            on_ready = recv.on_consume_ready

            def consuming(*args: Any, **kwargs: Any) -> None:
                on_ready(*args, **kwargs)
                self.ready.set()  # the event queue is bound: no event sent from now is lost

            recv.on_consume_ready = consuming
            self._recv = recv
            recv.capture(limit=None, timeout=None, wakeup=False)

    def __enter__(self) -> Events:
        self._thread.start()
        assert self.ready.wait(10), "the event receiver did not start consuming"
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._recv is not None:
            self._recv.should_stop = True
        self._thread.join(5)

    def wait_for(self, task_id: str, kind: str, timeout: float = 10.0) -> dict[str, Any]:
        end = time.monotonic() + timeout
        for _ in range(int(timeout / 0.02)):
            for event in self.seen.get(task_id, []):
                if event["type"] == kind:
                    return event
            if time.monotonic() > end:
                break
            time.sleep(0.02)
        raise AssertionError(f"no {kind} event for {task_id}: {self.seen.get(task_id)}")
