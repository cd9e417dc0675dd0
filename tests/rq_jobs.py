"""The jobs the RQ workers of tests/test_rq.py and benchmarks/bench_rq.py run (the worker
imports this module by name: it runs with cwd = tests/)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from typing import Any

from rq import SimpleWorker, get_current_job
from rq.timeouts import TimerDeathPenalty


def noop() -> str:
    return "ok"


def where() -> dict[str, Any]:
    """The worker's pid, the thread running the job, and the threads alive."""
    return {"pid": os.getpid(), "thread": threading.get_ident(),
            "threads": sorted(t.name for t in threading.enumerate())}


def sleep(seconds: float) -> str:
    time.sleep(seconds)
    return "slept"


def sleep_swallowing(seconds: float) -> str:
    """A job that catches every ``Exception`` around its wait."""
    try:
        time.sleep(seconds)
    except Exception:  # noqa: BLE001 - the point: a limit is not an Exception inside the job
        return "swallowed"
    return "slept"


def http_get(url: str) -> int:
    import requests

    return requests.get(url, timeout=60).status_code


def cpu(seconds: float) -> int:
    """A pure-Python loop for ``seconds``."""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
    return n


def child(pid_file: str) -> int:
    """``subprocess.run`` of a ``sleep 30`` whose pid is written to ``pid_file``."""
    return subprocess.run(["sh", "-c", f"echo $$ > {pid_file}; exec sleep 30"],
                          check=False).returncode


def work(seconds: float) -> str:
    """Half asleep, half computing, ``seconds`` in all: a job that ends near its limit."""
    time.sleep(seconds / 2)
    cpu(seconds / 2)
    return "done"


def note_stopped(job: Any, connection: Any) -> None:
    """An ``on_stopped`` callback: leaves a mark in the job's meta."""
    job.meta["on_stopped"] = True
    job.save_meta()


def note_failed(job: Any, connection: Any, *exc_info: Any) -> None:
    job.meta["on_failure"] = True
    job.save_meta()


def limit_seen() -> Any:
    """Nothing: for a job that reads its own meta (it shows the meta reached the worker)."""
    job = get_current_job()
    return None if job is None else dict(job.meta)


class TimerSimpleWorker(SimpleWorker):
    """RQ's own ``SimpleWorker`` with RQ's ``TimerDeathPenalty`` (the stock choice for a
    worker whose jobs do not run in the main thread): the benchmark's baseline."""

    death_penalty_class = TimerDeathPenalty
