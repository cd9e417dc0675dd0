"""The Huey app of tests/test_huey.py and benchmarks/bench_huey.py.

A consumer runs ``huey_consumer huey_app.huey -k thread -w 1`` (cwd = tests/) with its
settings in the environment (``TC_*``, see :func:`_from_env`); the test process builds the
same app with :func:`make_huey` (same name, same task names) to enqueue tasks, revoke them
and read their results.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from typing import Any, Optional

from huey import RedisHuey

from conftest import burn, spin_forever  # the tests' workloads (tests/ is on the path)

#: Where the app logs what it sees (huey's consumer logs the "huey" tree).
app_log = logging.getLogger("huey.tc_app")


def _note(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")


class App:
    """A Huey instance and its tasks (huey's TaskWrappers) by function name."""

    def __init__(self, huey: RedisHuey, tasks: dict[str, Any]) -> None:
        self.huey = huey
        self.tasks = tasks

    def __getitem__(self, name: str) -> Any:
        return self.tasks[name]


def stamps_key(huey: RedisHuey) -> str:
    """The Redis hash where a consumer with ``stamps`` records ``<task id>:<signal>`` ->
    ``time.monotonic()`` (one clock for every process of the machine)."""
    return f"{huey.name}:stamps"


def make_huey(url: str, name: str, *, install: bool = False, patch: bool = False,
              signals: str = "log") -> App:
    """The app: a RedisHuey named ``name`` on ``url`` with the tasks below; ``install``:
    ``timeoutcore.contrib.huey.install(huey, patch=patch)`` first, as a user does.
    ``signals``: what a consumer does with huey's task signals: ``log`` them
    ("SIGNAL <name> <task id>"), record their ``stamps`` (:func:`stamps_key`), or nothing
    (``off``, the benchmark's throughput rounds)."""
    if signals not in ("log", "stamps", "off"):
        raise ValueError(f"signals must be log, stamps or off, not {signals!r}")
    huey = RedisHuey(name, url=url)
    if install:
        from timeoutcore.contrib.huey import install as install_timeoutcore

        install_timeoutcore(huey, patch=patch)

    if signals == "stamps":
        @huey.signal()
        def stamp_signal(signal: str, task: Any, *args: Any, **kwargs: Any) -> None:
            huey.storage.conn.hset(stamps_key(huey), f"{task.id}:{signal}", time.monotonic())
    elif signals == "log":
        @huey.signal()
        def log_signal(signal: str, task: Any, *args: Any, **kwargs: Any) -> None:
            app_log.info("SIGNAL %s %s", signal, task.id)

    @huey.task(timeout=0.5)
    def sleeper(seconds: float, marker: Optional[str] = None) -> str:
        if marker:
            _note(marker, "started")
        time.sleep(seconds)
        return "slept"

    @huey.task(timeout=0.5)
    def fetch(url: str) -> str:
        import requests

        return requests.get(url, timeout=30).text

    @huey.task(timeout=0.5)
    def spin() -> str:
        try:
            spin_forever()
        except Exception:  # noqa: BLE001 - catching everything must not keep it alive
            spin_forever()
        return "ran to the end"

    @huey.task(timeout=0.5)
    def child(pidfile: str) -> int:
        proc = subprocess.Popen(["sleep", "30"])
        _note(pidfile, str(proc.pid))
        return proc.wait()

    @huey.task(timeout=0.3, retries=1)
    def retried(marker: str) -> str:
        _note(marker, "run")
        time.sleep(5)
        return "slept"

    @huey.task(retries=2)
    def blocker(marker: str, seconds: float = 60.0) -> str:
        """No timeout, retries: only a revoke ends it early, and it must not run again."""
        _note(marker, "started")
        time.sleep(seconds)
        return "slept"

    @huey.task()
    def work(seconds: float, cpu: bool) -> str:
        if cpu:
            burn(seconds)
        else:
            time.sleep(seconds)
        return "done"

    @huey.task()
    def crunch(n: int) -> None:
        """A fixed amount of CPU work, whatever the load of the machine (the benchmark's
        task: a spin that watches the clock does less work when the machine is busy)."""
        sum(range(n))

    @huey.task()
    def whoami() -> list[Any]:
        """The worker thread that runs it, and how many threads the consumer has."""
        return [threading.get_ident(), threading.current_thread().name,
                threading.active_count()]

    @huey.task()
    def gate(key: str) -> list[float]:
        """Hold the worker until ``key`` (a Redis list) gets an item (or 60 s pass); then
        the CPU seconds of the consumer and of this worker thread."""
        huey.storage.conn.blpop([key], timeout=60)
        return [time.process_time(), time.thread_time()]

    @huey.task()
    def clock() -> list[float]:
        """``time.monotonic()`` (one clock for the machine's processes), the CPU seconds of
        the consumer and of this worker thread."""
        return [time.monotonic(), time.process_time(), time.thread_time()]

    tasks = [sleeper, fetch, spin, child, retried, blocker, work, crunch, whoami, gate, clock]
    return App(huey, {t.func.__name__: t for t in tasks})


def _from_env() -> RedisHuey:
    return make_huey(os.environ["TC_URL"], os.environ["TC_HUEY_NAME"],
                     install=os.environ.get("TC_INSTALL") == "1",
                     patch=os.environ.get("TC_PATCH") == "1",
                     signals=os.environ.get("TC_SIGNALS", "log")).huey


_app: list[RedisHuey] = []


def __getattr__(name: str) -> Any:
    """``huey_app.huey``: the consumer's app, built from the environment on first use."""
    if name != "huey":
        raise AttributeError(name)
    if not _app:
        _app.append(_from_env())
    return _app[0]
