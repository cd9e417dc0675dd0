"""The Celery app of tests/test_celery.py, for worker subprocesses and the test process.

A worker runs ``celery -A celery_app worker ...`` with its settings in the environment
(``TC_*``, see :func:`from_env`); the test process builds the same app with
:func:`make_app` to send tasks and read results.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

from celery import Celery
from celery.exceptions import SoftTimeLimitExceeded
from conftest import burn, spin_forever  # the tests' workloads (tests/ is on the path)


def make_app(url: str, queue: str, *, install: bool = False, patch: bool = False,
             app_time_limit: Optional[float] = None,
             registry_prefix: Optional[str] = None) -> Celery:
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

    if install:
        from timeoutcore.contrib.celery import install as install_timeoutcore

        registry: Any = None
        if registry_prefix:
            from timeoutcore.contrib.redis import DeadlineRegistry

            registry = DeadlineRegistry.from_url(url, prefix=registry_prefix)
        install_timeoutcore(app, patch=patch, registry=registry)
    return app


def from_env() -> Optional[Celery]:
    """The worker's app, from TC_URL, TC_QUEUE, TC_INSTALL, TC_PATCH, TC_APP_TIME_LIMIT,
    TC_REGISTRY_PREFIX; None outside a worker started by the tests."""
    env = os.environ
    if "TC_QUEUE" not in env:
        return None
    limit = env.get("TC_APP_TIME_LIMIT")
    return make_app(env["TC_URL"], env["TC_QUEUE"], install=env.get("TC_INSTALL") == "1",
                    patch=env.get("TC_PATCH") == "1",
                    app_time_limit=float(limit) if limit else None,
                    registry_prefix=env.get("TC_REGISTRY_PREFIX") or None)


app = from_env()
