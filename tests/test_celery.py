"""Celery time limits in the threads and solo pools: real ``celery worker`` processes over a
real Redis broker and result backend (tests/celery_app.py is their app).

Every worker consumes a queue of its own, so runs sharing one Redis (CI runs the suite on
several interpreters) never see each other's tasks.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

celery = pytest.importorskip("celery")

from celery.exceptions import (  # noqa: E402
    SoftTimeLimitExceeded,
    TaskRevokedError,
    TimeLimitExceeded,
)
from celery_harness import Events, Worker  # noqa: E402
from redis_server import wait_for_job  # noqa: E402

WAIT = 30  # seconds a test waits for a result at most (a broken build fails, never hangs)
#: The hard limit a prefork task that overruns it is called with. The child stops the task
#: hard_margin(limit) before Celery's kill (10 % of the limit, at least 50 ms): the failure
#: must reach the parent within that margin, which takes hundreds of ms on a loaded
#: machine. A limit of 4 s leaves 0.4 s; each such call costs 0.9 times the limit.
PREFORK_LIMIT = 4.0
ENFORCING = "time limits enforced by timeoutcore"


@pytest.fixture(scope="module", params=["threads", "solo"])
def installed(request: Any, redis_url: str,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    """One worker per pool for the tests below: that it survives each of them is part of
    what they check."""
    folder = tmp_path_factory.mktemp(f"celery-{request.param}")
    with Worker(redis_url, request.param, folder, install=True, patch=True) as worker:
        yield worker
    assert worker.proc.returncode == 0, worker.log()[-3000:]


def test_soft_limit_raises_softtimelimitexceeded_inside_the_task(installed: Worker) -> None:
    assert ENFORCING in installed.log()
    start = time.monotonic()
    result = installed.app.tasks["t.soft_then_finish"].delay()
    assert result.get(timeout=WAIT) == "cleaned up after the soft limit"
    assert time.monotonic() - start < 2.5  # stopped at ~0.3 s, not after the 3 s body
    # Celery's own warning comes from the on_soft callback, which runs on the soft timer's
    # callback pool: it may be written just after the task's result.
    assert installed.wait_for_log("Soft time limit (0.3s) exceeded for t.soft_then_finish")


def test_uncaught_soft_limit_fails_the_task_with_softtimelimitexceeded(installed: Worker) -> None:
    result = installed.app.tasks["t.soft_uncaught"].delay()
    with pytest.raises(SoftTimeLimitExceeded):
        result.get(timeout=WAIT)
    assert result.state == "FAILURE"


def test_hard_limit_fails_the_task_with_timelimitexceeded_and_the_worker_goes_on(
    installed: Worker,
) -> None:
    app = installed.app
    pid = app.tasks["t.pid"].delay().get(timeout=WAIT)
    with Events(app) as events:
        start = time.monotonic()
        result = app.tasks["t.hard"].delay()
        with pytest.raises(TimeLimitExceeded) as info:
            result.get(timeout=WAIT)
        took = time.monotonic() - start
        assert 0.5 <= took < 2.5
        assert info.value.args == (0.5,)
        assert result.state == "FAILURE"
        failed = events.wait_for(result.id, "task-failed")
        assert "TimeLimitExceeded" in failed["exception"]
        # the same worker process (and its threads) serve the next tasks
        assert [app.tasks["t.quick"].delay(i).get(timeout=WAIT) for i in range(10)] == [
            2 * i for i in range(10)]
        ok = app.tasks["t.soft_then_finish"].delay()
        assert ok.get(timeout=WAIT) == "cleaned up after the soft limit"
        events.wait_for(ok.id, "task-succeeded")
    assert app.tasks["t.pid"].delay().get(timeout=WAIT) == pid == installed.proc.pid
    assert f"Hard time limit (0.5s) exceeded for t.hard[{result.id}]" in installed.log()


def test_hard_limit_stops_time_sleep_with_patch(installed: Worker) -> None:
    start = time.monotonic()
    with pytest.raises(TimeLimitExceeded):
        installed.app.tasks["t.sleep_hard"].delay().get(timeout=WAIT)
    assert time.monotonic() - start < 2.5


def test_limits_given_at_call_time_and_app_wide(redis_url: str, tmp_path: Path) -> None:
    with Worker(redis_url, "threads", tmp_path, app_time_limit=0.4) as worker:
        burn_task = worker.app.tasks["t.burn"]
        with pytest.raises(TimeLimitExceeded) as info:
            burn_task.delay(3.0).get(timeout=WAIT)  # the app-wide task_time_limit
        assert info.value.args == (0.4,)
        with pytest.raises(SoftTimeLimitExceeded):
            burn_task.apply_async((3.0,), soft_time_limit=0.2, time_limit=2).get(timeout=WAIT)
        with pytest.raises(TimeLimitExceeded) as info:
            burn_task.apply_async((3.0,), time_limit=0.25).get(timeout=WAIT)
        assert info.value.args == (0.25,)
        assert burn_task.apply_async((0.05,), time_limit=2).get(timeout=WAIT) == "ran to the end"


@pytest.mark.once  # Celery's own behaviour, without timeoutcore
def test_without_install_the_threads_pool_ignores_time_limits(redis_url: str,
                                                              tmp_path: Path) -> None:
    """Why this module exists: Celery's threads pool accepts the limits and ignores them."""
    with Worker(redis_url, "threads", tmp_path, install=False) as worker:
        assert ENFORCING not in worker.log()
        start = time.monotonic()
        soft = worker.app.tasks["t.soft_uncaught"].delay()
        assert soft.get(timeout=WAIT) == "ran to the end"  # 3 s past a 0.3 s soft limit
        assert time.monotonic() - start >= 3.0
        assert worker.app.tasks["t.burn"].apply_async((0.8,), time_limit=0.3).get(
            timeout=WAIT) == "ran to the end"


def test_registry_lists_extends_and_cancels_celery_tasks(redis_url: str,
                                                         tmp_path: Path) -> None:
    """install(app, registry=...): revoke(terminate=True) for the threads pool."""
    pytest.importorskip("redis")
    from timeoutcore.contrib.redis import DeadlineRegistry

    prefix = f"celery-reg-{uuid.uuid4().hex[:8]}"
    coordinator = DeadlineRegistry.from_url(redis_url, prefix=prefix)
    with Worker(redis_url, "threads", tmp_path, registry_prefix=prefix) as worker, \
            Events(worker.app) as events:
        burn_task = worker.app.tasks["t.burn"]
        long = burn_task.apply_async((30,), time_limit=20)
        info = wait_for_job(coordinator, long.id)
        assert info.label == "t.burn" and info.limit == 20.0 and info.pid == worker.proc.pid
        sent = time.monotonic()
        assert coordinator.cancel(long.id)
        with pytest.raises(TaskRevokedError):
            long.get(timeout=WAIT)
        assert time.monotonic() - sent < 2.0
        assert long.state == "REVOKED"
        events.wait_for(long.id, "task-revoked")
        # extend: a 1.5 s limit (the extension lands before it however slow the machine),
        # a 2 s body, 2 s more -> it succeeds
        slow = burn_task.apply_async((2.0,), time_limit=1.5)
        wait_for_job(coordinator, slow.id)
        coordinator.extend(slow.id, 2.0)
        assert slow.get(timeout=WAIT) == "ran to the end"
        assert coordinator.get(slow.id) is None
        # the worker goes on; an unextended limit still holds
        with pytest.raises(TimeLimitExceeded):
            burn_task.apply_async((3.0,), time_limit=0.3).get(timeout=WAIT)
        assert worker.app.tasks["t.quick"].delay(21).get(timeout=WAIT) == 42
    coordinator.close()


def test_prefork_limits_are_enforced_in_the_pool_child(redis_url: str, tmp_path: Path) -> None:
    """Under prefork the child enforces the limits itself, just before Celery's kill from
    the parent: the task fails with TimeLimitExceeded and the same child takes the next
    task (Celery's own kill would have replaced it)."""
    with Worker(redis_url, "prefork", tmp_path, install=True, concurrency=1) as worker:
        app = worker.app
        child = app.tasks["t.pid"].delay().get(timeout=WAIT)
        assert child != worker.proc.pid  # the task ran in a child process
        assert app.tasks["t.soft_then_finish"].delay().get(
            timeout=WAIT) == "cleaned up after the soft limit"
        with pytest.raises(TimeLimitExceeded) as info:
            app.tasks["t.hard"].apply_async(time_limit=PREFORK_LIMIT).get(timeout=WAIT)
        assert info.value.args == (PREFORK_LIMIT,)
        assert app.tasks["t.pid"].delay().get(timeout=WAIT) == child
        log = worker.log()
    assert ENFORCING in log and "exited with 'signal 9" not in log, log[-3000:]
