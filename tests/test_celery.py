"""Celery time limits in the threads and solo pools, with a real worker over a real Redis.

Each test app gets its own queue names, so runs sharing one Redis (CI runs the suite on
several interpreters) never see each other's tasks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

celery = pytest.importorskip("celery")

from celery import Celery  # noqa: E402
from celery.contrib.testing.worker import start_worker  # noqa: E402
from celery.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded  # noqa: E402
from conftest import burn, spin_forever  # noqa: E402

import timeoutcore  # noqa: E402
from timeoutcore.contrib.celery import install, is_enforcing  # noqa: E402

WAIT = 30  # seconds a test waits for a result at most (a broken build fails, never hangs)


def make_app(redis_url: str, *, installed: bool, patch: bool = False) -> Celery:
    app = Celery(f"tc-{uuid.uuid4().hex[:8]}", broker=redis_url, backend=redis_url,
                 set_as_current=False)
    app.conf.update(
        task_default_queue=f"timeoutcore-test-{uuid.uuid4().hex}",
        worker_send_task_events=True,
        task_send_sent_event=False,
        broker_connection_retry_on_startup=True,
        result_expires=300,
        worker_hijack_root_logger=False,
        event_queue_expires=60,
    )

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

    if installed:
        install(app, patch=patch)
    return app


class Events:
    """A real Celery event receiver: collects task-failed / task-succeeded by task id."""

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
            recv = self.app.events.Receiver(
                conn, handlers={"task-failed": self._on, "task-succeeded": self._on})
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


@pytest.fixture(scope="module", params=["threads", "solo"])
def installed_worker(request: Any, redis_url: str) -> Iterator[tuple[Celery, Any]]:
    """One worker per pool for the tests below: that it survives each of them is part of
    what they check."""
    was_patched = timeoutcore.is_patched()
    app = make_app(redis_url, installed=True, patch=True)
    with start_worker(app, pool=request.param, concurrency=2, perform_ping_check=False,
                      loglevel="WARNING", shutdown_timeout=10) as worker:
        yield app, worker
    if not was_patched:  # install(patch=True) patched this process at worker start
        timeoutcore.unpatch()


def test_soft_limit_raises_softtimelimitexceeded_inside_the_task(
    installed_worker: tuple[Celery, Any],
) -> None:
    app, worker = installed_worker
    assert is_enforcing(worker)
    start = time.monotonic()
    result = app.tasks["t.soft_then_finish"].delay()
    assert result.get(timeout=WAIT) == "cleaned up after the soft limit"
    assert time.monotonic() - start < 2.5  # stopped at ~0.3 s, not after the 3 s body


def test_uncaught_soft_limit_fails_the_task_with_softtimelimitexceeded(
    installed_worker: tuple[Celery, Any],
) -> None:
    app, _ = installed_worker
    result = app.tasks["t.soft_uncaught"].delay()
    with pytest.raises(SoftTimeLimitExceeded):
        result.get(timeout=WAIT)
    assert result.state == "FAILURE"


def test_hard_limit_fails_the_task_with_timelimitexceeded_and_the_worker_goes_on(
    installed_worker: tuple[Celery, Any],
) -> None:
    app, _ = installed_worker
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
        # the same worker (and its threads) serve the next tasks
        assert [app.tasks["t.quick"].delay(i).get(timeout=WAIT) for i in range(10)] == [
            2 * i for i in range(10)]
        ok = app.tasks["t.soft_then_finish"].delay()
        assert ok.get(timeout=WAIT) == "cleaned up after the soft limit"
        events.wait_for(ok.id, "task-succeeded")


def test_hard_limit_stops_time_sleep_with_patch(installed_worker: tuple[Celery, Any]) -> None:
    app, _ = installed_worker
    start = time.monotonic()
    with pytest.raises(TimeLimitExceeded):
        app.tasks["t.sleep_hard"].delay().get(timeout=WAIT)
    assert time.monotonic() - start < 2.5


def test_limits_given_at_call_time_and_app_wide(redis_url: str) -> None:
    app = make_app(redis_url, installed=True)
    app.conf.task_time_limit = 0.4  # the app-wide default, for tasks without their own
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False,
                      loglevel="WARNING", shutdown_timeout=10):
        burn_task = app.tasks["t.burn"]
        with pytest.raises(TimeLimitExceeded) as info:
            burn_task.delay(3.0).get(timeout=WAIT)
        assert info.value.args == (0.4,)
        with pytest.raises(SoftTimeLimitExceeded):
            burn_task.apply_async((3.0,), soft_time_limit=0.2, time_limit=2).get(timeout=WAIT)
        with pytest.raises(TimeLimitExceeded) as info:
            burn_task.apply_async((3.0,), time_limit=0.25).get(timeout=WAIT)
        assert info.value.args == (0.25,)
        assert burn_task.apply_async((0.05,), time_limit=2).get(timeout=WAIT) == "ran to the end"


def test_without_install_the_threads_pool_ignores_time_limits(redis_url: str) -> None:
    """Why this module exists: Celery's threads pool accepts the limits and ignores them."""
    app = make_app(redis_url, installed=False)
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False,
                      loglevel="WARNING", shutdown_timeout=10) as worker:
        assert not is_enforcing(worker)
        start = time.monotonic()
        soft = app.tasks["t.soft_uncaught"].delay()
        assert soft.get(timeout=WAIT) == "ran to the end"  # 3 s past a 0.3 s soft limit
        assert time.monotonic() - start >= 3.0
        assert app.tasks["t.burn"].apply_async((0.8,), time_limit=0.3).get(
            timeout=WAIT) == "ran to the end"


PREFORK_APP = """
import os, time
from celery import Celery
from celery.exceptions import SoftTimeLimitExceeded
from timeoutcore.contrib.celery import install

app = Celery("prefork_probe", broker=os.environ["TC_URL"], backend=os.environ["TC_URL"])
app.conf.update(task_default_queue=os.environ["TC_QUEUE"],
                broker_connection_retry_on_startup=True)

@app.task(name="p.soft", soft_time_limit=0.3, time_limit=5)
def soft():
    try:
        time.sleep(3)
    except SoftTimeLimitExceeded:
        return "soft in pid %d" % os.getpid()

@app.task(name="p.hard", time_limit=0.5)
def hard():
    time.sleep(3)

install(app)
"""


def test_prefork_is_left_to_celery(redis_url: str, tmp_path: Path) -> None:
    """install() adds nothing to a prefork worker: Celery's own enforcement (signals to and
    killing of child processes) produces the results."""
    (tmp_path / "prefork_probe.py").write_text(textwrap.dedent(PREFORK_APP))
    queue = f"timeoutcore-prefork-{uuid.uuid4().hex}"
    env = dict(os.environ, TC_URL=redis_url, TC_QUEUE=queue,
               PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "prefork_probe", "worker", "-P", "prefork",
             "-c", "1", "-l", "DEBUG", "--without-gossip", "--without-mingle",
             "--without-heartbeat"],
            cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        sys.path.insert(0, str(tmp_path))
        os.environ["TC_URL"], os.environ["TC_QUEUE"] = redis_url, queue
        try:
            import prefork_probe  # type: ignore[import-not-found]
        finally:
            sys.path.remove(str(tmp_path))
        app = prefork_probe.app
        soft = app.tasks["p.soft"].delay().get(timeout=WAIT)
        assert soft.startswith("soft in pid ") and int(soft.split()[-1]) != proc.pid
        with pytest.raises(TimeLimitExceeded):
            app.tasks["p.hard"].delay().get(timeout=WAIT)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.environ.pop("TC_URL", None)
        os.environ.pop("TC_QUEUE", None)
        sys.modules.pop("prefork_probe", None)
    text = log.read_text(errors="replace")
    assert "timeoutcore stays out" in text, text[-3000:]
    assert "enforced by timeoutcore" not in text
