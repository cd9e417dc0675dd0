"""No process outlives its task: real ``celery worker`` processes (prefork, threads, solo)
over a real Redis, ``install(app, patch=True, reap=True, shutdown_grace=1.0)`` and without
the options; every process a task starts writes its pid to a file, and each check is by PID:
nothing left running, no zombie.

The tasks are in tests/celery_app.py (``p.*``): a shell with a background grandchild, run
with ``subprocess.run``, ``communicate()``, or started and never waited for; a soft limit in
``communicate()``; a daemon that escapes into a session of its own; a child that exits by
itself and is never waited for.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

celery = pytest.importorskip("celery")

from celery.exceptions import TaskRevokedError, TimeLimitExceeded  # noqa: E402
from celery_harness import Worker  # noqa: E402

WAIT = 30  # s: the most a result is waited for
#: The hard limit a task that overruns it is called with under prefork. The child stops the
#: task hard_margin(limit) before Celery's kill (10 % of the limit, at least 50 ms): the
#: failure (after killing and reaping the task's processes) must reach the parent within
#: that margin, which takes hundreds of ms on a loaded machine, or Celery replaces the
#: child. A limit of 4 s leaves 0.4 s; each such call costs 0.9 times the limit, so the
#: threads and solo pools (no kill from a parent to race) keep the tasks' own 1 s.
PREFORK_LIMIT = 4.0
GRACE = 1.0
POOLS = ["prefork", "threads", "solo"]


def _pids(pidfile: Path) -> list[int]:
    try:
        return [int(x) for x in pidfile.read_text().split()]
    except FileNotFoundError:
        return []


def _alive(pid: int) -> str | None:
    """The /proc state of ``pid`` (Z: a zombie), or None when it is gone -- or a zombie
    re-parented to PID 1: init's to reap (some container inits reap lazily)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None if fields[0] == "Z" and fields[1] == "1" else fields[0]


def _survivors(pidfile: Path, timeout: float = 5.0) -> dict[int, str]:
    """The recorded processes still there (running or zombie) after ``timeout`` s."""
    end = time.monotonic() + timeout
    while True:
        left = {pid: state for pid in _pids(pidfile) if (state := _alive(pid)) is not None}
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.02)


def _wait_started(pidfile: Path, n: int = 2, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while len(_pids(pidfile)) < n:
        assert time.monotonic() < end, "the task did not start its processes"
        time.sleep(0.02)


def _kill(pids: Any) -> None:
    import os

    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _worker(pool: str, folder: Path, redis_url: str, **options: Any) -> Worker:
    # prefork with one child: that the same child serves the next task is checked by pid
    return Worker(redis_url, pool, folder, install=True, patch=True,
                  concurrency=1 if pool == "prefork" else 2, **options)


def _server_pid(worker: Worker) -> int:
    """The pid that runs the tasks: the worker, or its one prefork child."""
    pid: int = worker.app.tasks["t.pid"].delay().get(timeout=WAIT)
    return pid


@pytest.fixture(scope="module", params=POOLS)
def full(request: Any, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    folder = tmp_path_factory.mktemp(f"cleanup-{request.param}")
    with _worker(request.param, folder, redis_url, reap=True, shutdown_grace=GRACE) as worker:
        worker.pool = request.param  # type: ignore[attr-defined]
        yield worker


@pytest.fixture(scope="module", params=POOLS)
def plain(request: Any, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    folder = tmp_path_factory.mktemp(f"plain-{request.param}")
    with _worker(request.param, folder, redis_url) as worker:
        worker.pool = request.param  # type: ignore[attr-defined]
        yield worker


LIMITED = [  # task, what it ends with
    ("p.run", TimeLimitExceeded),
    ("p.communicate", TimeLimitExceeded),
    ("p.left_running", TimeLimitExceeded),
    ("p.soft", "cleaned up after the soft limit"),
]
LEFT_BEHIND = [("p.escape", "left a daemon"), ("p.zombie", "left a child")]


def _call(worker: Worker, task: str, pidfile: Path, expect: Any) -> Any:
    options: dict[str, Any] = {}
    if expect is TimeLimitExceeded and getattr(worker, "pool", None) == "prefork":
        options["time_limit"] = PREFORK_LIMIT
    result = worker.app.tasks[task].apply_async((str(pidfile),), **options)
    if isinstance(expect, type):
        with pytest.raises(expect):
            result.get(timeout=WAIT)
        assert result.state == "FAILURE"
    else:
        assert result.get(timeout=WAIT) == expect
        assert result.state == "SUCCESS"
    return result


@pytest.mark.parametrize("task, expect", LIMITED + LEFT_BEHIND)
def test_with_the_options_nothing_survives_a_task(full: Worker, tmp_path: Path, task: str,
                                                  expect: Any) -> None:
    server = _server_pid(full)
    pidfile = tmp_path / "pids"
    _call(full, task, pidfile, expect)
    assert _pids(pidfile), "the task recorded no process"
    assert _survivors(pidfile) == {}, full.log()[-3000:]
    assert _server_pid(full) == server  # the same thread's process / prefork child goes on
    assert full.app.tasks["t.quick"].delay(4).get(timeout=WAIT) == 8


# The README suite runs it; the other interpreters' CI runs skip it (CI time): the same
# stops, deliveries and process kills run on every interpreter in the test above, which
# only adds the options.
@pytest.mark.once
@pytest.mark.parametrize("task, expect", LIMITED)
def test_without_the_options_a_stopped_task_leaves_nothing(plain: Worker, tmp_path: Path,
                                                           task: str, expect: Any) -> None:
    server = _server_pid(plain)
    pidfile = tmp_path / "pids"
    _call(plain, task, pidfile, expect)
    assert _survivors(pidfile) == {}, plain.log()[-3000:]
    assert _server_pid(plain) == server


def test_without_reap_an_escaped_daemon_survives(plain: Worker, tmp_path: Path) -> None:
    """What reap=True is for: a daemon in a session of its own is no process of the task's
    any more; only a subreaper finds it."""
    pidfile = tmp_path / "pids"
    _call(plain, "p.escape", pidfile, "left a daemon")
    left = _survivors(pidfile, timeout=0.5)
    try:
        assert list(left.values()) not in ([], ["Z"]), left
    finally:
        _kill(left)


def test_revoke_terminate_stops_the_task_and_its_processes(full: Worker, tmp_path: Path) -> None:
    if full.pool == "solo":  # type: ignore[attr-defined]
        pytest.skip("solo: Celery's event loop runs the task, so it reads a revoke only "
                    "after the task has ended (the registry's cancel() reaches it)")
    pidfile = tmp_path / "pids"
    result = full.app.tasks["p.long"].delay(str(pidfile))
    _wait_started(pidfile)
    full.app.control.revoke(result.id, terminate=True)
    with pytest.raises(TaskRevokedError):
        result.get(timeout=WAIT)
    assert result.state == "REVOKED"
    assert _survivors(pidfile) == {}, full.log()[-3000:]
    assert "NotImplementedError" not in full.log()
    assert full.app.tasks["t.quick"].delay(5).get(timeout=WAIT) == 10


def _shut_down(pool: str, redis_url: str, folder: Path, pidfile: Path, signals: list[int],
               wait: float) -> tuple[Any, float, str]:
    """A worker with the options runs ``p.long``; send it ``signals`` (0.2 s apart) and
    wait for it to exit: (the task's result, seconds to exit, the worker's log)."""
    worker = _worker(pool, folder, redis_url, reap=True, shutdown_grace=GRACE)
    try:
        result = worker.app.tasks["p.long"].delay(str(pidfile))
        _wait_started(pidfile)
        start = time.monotonic()
        for signum in signals:
            worker.proc.send_signal(signum)
            time.sleep(0.2)
        worker.proc.wait(wait)
        took = time.monotonic() - start
    finally:
        log = worker.stop()
    return result, took, log


@pytest.mark.parametrize("pool", POOLS)
def test_warm_shutdown_cancels_running_tasks_after_the_grace(
        pool: str, redis_url: str, tmp_path: Path) -> None:
    """SIGTERM, and SIGTERM again (a repeated signal changes nothing: the grace runs from
    the first): the running task is cancelled after it, and the worker exits."""
    pidfile = tmp_path / "pids"
    result, took, log = _shut_down(pool, redis_url, tmp_path, pidfile,
                                   [signal.SIGTERM, signal.SIGTERM], GRACE + 20)
    assert took < GRACE + 15, log[-3000:]
    assert _survivors(pidfile) == {}, log[-3000:]
    with pytest.raises(TaskRevokedError):
        result.get(timeout=WAIT)
    assert result.state == "REVOKED"
    assert "NotImplementedError" not in log


@pytest.mark.parametrize("pool", POOLS)
def test_cold_shutdown_stops_the_task_and_its_processes(pool: str, redis_url: str,
                                                        tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    result, took, log = _shut_down(pool, redis_url, tmp_path, pidfile, [signal.SIGQUIT], 20)
    assert took < 15, log[-3000:]
    assert _survivors(pidfile) == {}, log[-3000:]
    assert "NotImplementedError" not in log, log[-3000:]
    # Celery records a cold shutdown's cancel as a retry (the task is redelivered)
    assert result.state == "RETRY", (result.state, log[-3000:])


def test_install_refuses_bad_options() -> None:
    from celery import Celery

    from timeoutcore.contrib.celery import install

    app = Celery("bad", set_as_current=False)
    with pytest.raises(ValueError, match="shutdown_grace"):
        install(app, shutdown_grace=-1)
    with pytest.raises(TypeError, match="shutdown_grace"):
        install(app, shutdown_grace="1")
    with pytest.raises(TypeError, match="reap"):
        install(app, reap=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="patch"):
        install(app, patch="yes")  # type: ignore[arg-type]
    assert not [s for s in app.steps["worker"] if "timeoutcore" in getattr(s, "name", "")]



def test_a_revoke_before_the_body_starts_stops_the_task_at_entry() -> None:
    """Celery accepts a task (it can be revoked from then on) a little before its body
    starts: a cancel in between is kept and applied when the scope is registered."""
    from timeoutcore import DeadlineCancelled, thread_deadline
    from timeoutcore.contrib.celery import TERMINATED, _Running

    running = _Running()
    assert running.add("task-0", thread_deadline(60)) is False  # nothing kept for it
    assert running.cancel("task-1", TERMINATED) is None  # no scope yet: kept
    scope = thread_deadline(60)
    assert running.add("task-1", scope) is True  # applied: the caller stops it at entry
    with pytest.raises(DeadlineCancelled) as info:
        with scope:
            time.sleep(5)
    assert info.value.reason == TERMINATED and not running.early
