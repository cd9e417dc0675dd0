"""The Celery app of tests/test_celery.py, for worker subprocesses and the test process.

A worker runs ``celery -A celery_app worker ...`` with its settings in the environment
(``TC_*``, see :func:`from_env`); the test process builds the same app with
:func:`make_app` to send tasks and read results.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from typing import Any, Optional

from celery import Celery
from celery.exceptions import SoftTimeLimitExceeded
from conftest import burn, spin_forever  # the tests' workloads (tests/ is on the path)


#: A shell that records its pid and its background grandchild's, then waits on it: the
#: process tree a task leaves behind when only the shell is stopped.
def tree(pidfile: str, wait: int = 60) -> list[str]:
    f = shlex.quote(pidfile)
    return ["sh", "-c", f"sleep {wait} & echo $! >> {f}; echo $$ >> {f}; wait"]


def record(pidfile: str, pid: int) -> None:
    with open(pidfile, "a") as f:
        f.write(f"{pid}\n")


def make_app(url: str, queue: str, *, install: bool = False, patch: bool = False,
             app_time_limit: Optional[float] = None,
             registry_prefix: Optional[str] = None, reap: bool = False,
             shutdown_grace: Optional[float] = None) -> Celery:
    app = Celery("celery_app", broker=url, backend=url, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        worker_send_task_events=True,
        task_send_sent_event=False,
        broker_connection_retry_on_startup=True,
        result_expires=300,
        event_queue_expires=60,
        worker_prefetch_multiplier=1,
    )
    if app_time_limit is not None:
        app.conf.task_time_limit = app_time_limit

    @app.task(name="t.soft_then_finish", soft_time_limit=0.3, time_limit=5)
    def soft_then_finish() -> str:
        try:
            burn(3.0)
        except SoftTimeLimitExceeded:
            return "cleaned up after the soft limit"
        return "ran to the end"

    @app.task(name="t.soft_uncaught", soft_time_limit=0.3, time_limit=5)
    def soft_uncaught() -> str:
        burn(3.0)
        return "ran to the end"

    @app.task(name="t.hard", time_limit=0.5)
    def hard() -> str:
        for _ in range(1000):  # swallowing exceptions must not keep it alive
            try:
                spin_forever()
            except Exception:  # noqa: BLE001
                pass
        return "ran to the end"

    @app.task(name="t.sleep_hard", time_limit=0.5)
    def sleep_hard() -> str:
        time.sleep(3.0)
        return "ran to the end"

    @app.task(name="t.quick")
    def quick(x: int) -> int:
        return x * 2

    @app.task(name="t.burn")
    def burn_task(seconds: float) -> str:
        burn(seconds)
        return "ran to the end"

    @app.task(name="t.one_ms", time_limit=10, soft_time_limit=5)
    def one_ms() -> int:  # the benchmark's task
        end = time.perf_counter() + 0.001
        n = 0
        while time.perf_counter() < end:
            n += 1
        return n

    @app.task(name="t.pid")
    def pid() -> int:
        return os.getpid()

    # --- processes a task leaves behind (tests/test_celery_cleanup.py) -------------------

    @app.task(name="p.run", time_limit=1)
    def run_tree(pidfile: str) -> str:
        subprocess.run(tree(pidfile))
        return "ran to the end"

    @app.task(name="p.communicate", time_limit=1)
    def communicate_tree(pidfile: str) -> str:
        proc = subprocess.Popen(tree(pidfile), stdout=subprocess.PIPE)
        record(pidfile, proc.pid)
        proc.communicate()
        return "ran to the end"

    # The soft limit must pass inside the try, not while the tree starts: 1.5 s leaves a
    # loaded machine room for Popen (0.5 s was once passed before the try was reached).
    @app.task(name="p.soft", soft_time_limit=1.5, time_limit=5)
    def soft_communicate(pidfile: str) -> str:
        proc = subprocess.Popen(tree(pidfile), stdout=subprocess.PIPE)
        record(pidfile, proc.pid)
        try:
            proc.communicate()
        except SoftTimeLimitExceeded:
            return "cleaned up after the soft limit"
        return "ran to the end"

    @app.task(name="p.left_running", time_limit=1)
    def left_running(pidfile: str) -> str:
        proc = subprocess.Popen(tree(pidfile))  # never waited for
        record(pidfile, proc.pid)
        spin_forever()
        return "ran to the end"

    @app.task(name="p.escape")
    def escape(pidfile: str) -> str:
        # a daemon in a session of its own, whose parent exits at once: no process tree
        # of the task's leads to it any more
        subprocess.run(["sh", "-c", f"setsid sleep 60 < /dev/null > /dev/null 2>&1 & "
                                    f"echo $! >> {shlex.quote(pidfile)}"])
        return "left a daemon"

    @app.task(name="p.zombie")
    def zombie(pidfile: str) -> str:
        proc = subprocess.Popen(["true"])  # exits by itself; nobody waits for it
        record(pidfile, proc.pid)
        return "left a child"

    @app.task(name="p.long")
    def long_tree(pidfile: str) -> str:
        subprocess.run(tree(pidfile))
        return "ran to the end"

    if install:
        from timeoutcore.contrib.celery import install as install_timeoutcore

        registry: Any = None
        if registry_prefix:
            from timeoutcore.contrib.redis import DeadlineRegistry

            registry = DeadlineRegistry.from_url(url, prefix=registry_prefix)
        install_timeoutcore(app, patch=patch, registry=registry, reap=reap,
                            shutdown_grace=shutdown_grace)
    return app


def from_env() -> Optional[Celery]:
    """The worker's app, from TC_URL, TC_QUEUE, TC_INSTALL, TC_PATCH, TC_APP_TIME_LIMIT,
    TC_REGISTRY_PREFIX, TC_REAP, TC_SHUTDOWN_GRACE; None outside a worker started by the
    tests."""
    env = os.environ
    if "TC_QUEUE" not in env:
        return None
    limit = env.get("TC_APP_TIME_LIMIT")
    grace = env.get("TC_SHUTDOWN_GRACE")
    return make_app(env["TC_URL"], env["TC_QUEUE"], install=env.get("TC_INSTALL") == "1",
                    patch=env.get("TC_PATCH") == "1",
                    app_time_limit=float(limit) if limit else None,
                    registry_prefix=env.get("TC_REGISTRY_PREFIX") or None,
                    reap=env.get("TC_REAP") == "1",
                    shutdown_grace=float(grace) if grace else None)


app = from_env()
