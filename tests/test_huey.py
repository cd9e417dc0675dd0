"""Huey task timeouts and revokes in thread workers: a real ``huey_consumer -k thread -w 1``
with ``timeoutcore.contrib.huey.install(huey, patch=True)``, on a real Redis.

One worker thread serves every test of the module (tests/huey_harness.py); each test checks
that the same thread, and no more threads than at the start, serve the next task.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from huey import RedisHuey
from huey.api import Result
from huey.exceptions import TaskException

import huey_harness
from huey_harness import Consumer
from test_readme import FENCE, FILE_NAME
from wsgi_servers import settles

LIMIT = 0.5  # the timeout of the limited tasks of huey_app
LATE = 3.0  # generous: the result is read by polling, on a loaded machine
#: jobs of the hammer (fewer on the interpreters CI runs after the first)
HAMMER = 12 if os.environ.get("TIMEOUTCORE_TESTS_ONCE_DONE") else 30


@pytest.fixture(scope="module")
def consumer(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Consumer]:
    """The module's consumer; at the end it must exit cleanly on SIGTERM with a clean log."""
    with Consumer(redis_url, tmp_path_factory.mktemp("huey")) as c:
        c.baseline = c["whoami"]().get(blocking=True, timeout=20)
        yield c
        status = c.stop()
        log = c.log()
    assert status == 0, log[-3000:]
    assert "Consumer exiting." in log
    assert_clean_log(log)


def assert_clean_log(log: str) -> None:
    """No worker died, and the only tracebacks are the worker-side bad limit's."""
    assert " died" not in log, log[-3000:]
    for block in log.split("Traceback (most recent call last):")[1:]:
        lines = [line for line in block.splitlines()[1:] if line and not line[0].isspace()]
        assert lines and lines[0].startswith("ValueError: huey task sleeper: timeout"), block


@pytest.fixture
def same_thread(consumer: Consumer) -> Iterator[None]:
    """After the test, the one worker thread that served the first task serves the next,
    and the consumer has as many threads as then."""
    yield
    assert consumer["whoami"]().get(blocking=True, timeout=20) == consumer.baseline


def outcome(result: Any, timeout: float = 20.0) -> str:
    """``ok:<value>``, or the error huey stored (``TaskTimeout(...)``, ``TaskRevoked(...)``)."""
    try:
        return f"ok:{result.get(blocking=True, timeout=timeout)}"
    except TaskException as exc:
        return str(exc.metadata.get("error"))


def timed(result: Any) -> tuple[str, float]:
    t0 = time.monotonic()
    return outcome(result), time.monotonic() - t0


def wait_for_file(path: Path, timeout: float = 20.0) -> str:
    end = time.monotonic() + timeout
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < end, f"{path} was never written"
        time.sleep(0.01)
    return path.read_text()


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts: nobody reaped it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()
    except FileNotFoundError:
        return False
    return not (state[0] == "Z" and state[1] == "1")  # a zombie of init's is gone for us


# --- limits ---------------------------------------------------------------------------------


@pytest.mark.parametrize("job", ["sleep", "requests", "cpu", "subprocess"])
def test_timeout_stops_the_job_with_tasktimeout(consumer: Consumer, same_thread: None,
                                                silent_peer: Any, tmp_path: Path,
                                                job: str) -> None:
    pidfile = tmp_path / "pids"
    result = {"sleep": lambda: consumer["sleeper"](30),
              "requests": lambda: consumer["fetch"](silent_peer.url),
              "cpu": lambda: consumer["spin"](),
              "subprocess": lambda: consumer["child"](str(pidfile))}[job]()
    got, took = timed(result)
    assert got == f"TaskTimeout('timeout ({LIMIT}s)')"
    assert LIMIT <= took < LIMIT + LATE
    # huey's own record of a timeout: its log line and SIGNAL_TIMEOUT
    assert consumer.wait_for_log(f"Task {result.id} timed out after {LIMIT}s.")
    assert consumer.wait_for_log(f"SIGNAL timeout {result.id}")
    if job == "subprocess":
        pid = int(wait_for_file(pidfile))
        end = time.monotonic() + 5
        while alive(pid) and time.monotonic() < end:
            time.sleep(0.02)
        assert not alive(pid), "the task's child process outlived it"


def test_three_limited_jobs_in_a_row_on_one_thread(consumer: Consumer, same_thread: None,
                                                   silent_peer: Any) -> None:
    t0 = time.monotonic()
    results = [consumer["sleeper"](30), consumer["fetch"](silent_peer.url), consumer["spin"]()]
    assert [outcome(r) for r in results] == [f"TaskTimeout('timeout ({LIMIT}s)')"] * 3
    assert time.monotonic() - t0 < 3 * LIMIT + LATE


def test_a_timeout_given_at_call_time(consumer: Consumer, same_thread: None) -> None:
    got, took = timed(consumer["work"](30, False, timeout=0.3))
    assert got == "TaskTimeout('timeout (0.3s)')"
    assert 0.3 <= took < 0.3 + LATE
    # a longer limit at call time than the task's own: the task finishes
    assert outcome(consumer["sleeper"](0.8, timeout=5)) == "ok:slept"


def test_a_timed_out_task_is_retried_as_huey_does(consumer: Consumer, same_thread: None,
                                                  tmp_path: Path) -> None:
    marker = tmp_path / "runs"
    result = consumer["retried"](str(marker))  # timeout=0.3, retries=1

    def stored() -> dict[str, Any]:
        """The error huey stored (its intermediate one first: store_intermediate_errors)."""
        return dict(getattr(consumer.huey.get(result.id, peek=True), "metadata", None) or {})

    final = settles(lambda: stored().get("retries"), 0, within=20)
    assert final == 0, stored()
    assert stored()["error"] == "TaskTimeout('timeout (0.3s)')"
    assert consumer.wait_for_log(f"SIGNAL retrying {result.id}")
    assert consumer.log().count(f"Task {result.id} timed out after 0.3s.") == 2
    assert marker.read_text().split() == ["run", "run"]  # retries=1: two runs


def test_no_interrupt_surfaces_after_a_job_ends(consumer: Consumer, same_thread: None) -> None:
    """Jobs that end right at their limit: each succeeds or times out, nothing else."""
    limit = 0.1
    results = [consumer["work"](limit * (0.95, 1.0, 1.05)[i % 3], i % 2 == 0, timeout=limit)
               for i in range(HAMMER)]
    got = [outcome(r) for r in results]
    unexpected = [g for g in got if g not in ("ok:done", f"TaskTimeout('timeout ({limit}s)')")]
    assert not unexpected, got
    assert_clean_log(consumer.log())


# --- revoke ---------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["result", "by_id", "task_class"])
def test_revoke_stops_a_running_task(consumer: Consumer, same_thread: None, tmp_path: Path,
                                     how: str) -> None:
    marker = tmp_path / "runs"
    blocker = consumer["blocker"]
    result = blocker(str(marker))  # 60 s, no timeout, retries=2
    wait_for_file(marker)
    t0 = time.monotonic()
    if how == "result":
        result.revoke()
    elif how == "by_id":
        consumer.huey.revoke_by_id(result.id)
    else:
        blocker.revoke()
    try:
        got = outcome(result)
        took = time.monotonic() - t0
    finally:
        if how == "task_class":
            blocker.restore()
    assert got.startswith("TaskRevoked('revoked while running")
    assert took < LATE
    assert consumer.wait_for_log(f"SIGNAL revoked {result.id}")
    assert consumer.wait_for_log(f"Task {result.id} raised CancelExecution (aborted, will "
                                 f"not be retried)")
    # not retried: no second run, nothing queued or scheduled
    time.sleep(0.3)
    assert marker.read_text().split() == ["started"]
    assert consumer.huey.pending_count() == 0 and consumer.huey.scheduled_count() == 0
    assert f"SIGNAL retrying {result.id}" not in consumer.log()


def test_a_revoke_before_the_task_runs_behaves_as_huey_has_it(consumer: Consumer,
                                                              same_thread: None,
                                                              tmp_path: Path) -> None:
    marker = tmp_path / "runs"
    first = consumer["blocker"](str(marker))  # holds the one worker thread
    wait_for_file(marker)
    waiting = consumer["clock"]()
    waiting.revoke()
    first.revoke()
    assert outcome(first).startswith("TaskRevoked(")
    # huey's own outcome: skipped, SIGNAL_REVOKED, no result
    assert consumer.wait_for_log(f"SIGNAL revoked {waiting.id}")
    assert re.search(rf"Task huey_app\.clock: {waiting.id}.* was revoked, not executing",
                     consumer.log())
    assert f"SIGNAL executing {waiting.id}" not in consumer.log()
    assert waiting.get() is None


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize("timeout, error", [(-1, ValueError), (math.nan, ValueError),
                                            (math.inf, ValueError), ("5", TypeError),
                                            (True, TypeError)])
def test_a_bad_timeout_is_refused_when_enqueued(consumer: Consumer, timeout: Any,
                                                error: type[Exception]) -> None:
    with pytest.raises(error, match="huey task sleeper: timeout"):
        consumer["sleeper"](1, timeout=timeout)
    assert consumer.huey.pending_count() == 0


def test_a_bad_timeout_from_elsewhere_fails_the_task_in_the_worker(consumer: Consumer,
                                                                   same_thread: None) -> None:
    """A task enqueued by a process without install() (here: bypassing it)."""
    huey = consumer.huey
    task = consumer["sleeper"].s(0.1, timeout=-1)
    huey.storage.enqueue(huey.serialize_task(task), task.priority)
    got = outcome(Result(huey, task))
    assert got.startswith("ValueError('huey task sleeper: timeout must be")


@pytest.mark.once
def test_install_refuses_bad_options() -> None:
    from timeoutcore.contrib.huey import install

    huey = RedisHuey("timeoutcore-test-options", url="redis://127.0.0.1:1/0")
    with pytest.raises(TypeError, match="huey.Huey instance"):
        install(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="patch must be True or False"):
        install(huey, patch="yes")  # type: ignore[arg-type]
    for bad, error in ((-1, ValueError), (0, ValueError), (math.nan, ValueError),
                       ("1", TypeError)):
        with pytest.raises(error, match="revoke_interval"):
            install(huey, revoke_interval=bad)
    assert "create_consumer" not in huey.__dict__  # nothing was installed


# --- other worker types ---------------------------------------------------------------------


@pytest.mark.once
def test_process_workers_keep_huey_own_timeout(redis_url: str, tmp_path: Path) -> None:
    """install() leaves ``-k process`` to huey's SIGALRM: the timeout still fails the task
    with TaskTimeout, and the consumer runs as before."""
    with Consumer(redis_url, tmp_path, kind="process") as c:
        got, took = timed(c["sleeper"](30))
        assert got == f"TaskTimeout('timeout ({LIMIT}s)')"
        assert LIMIT <= took < LIMIT + LATE
        assert outcome(c["sleeper"](0.1)) == "ok:slept"
        assert c.stop() == 0
        log = c.log()
    assert "huey process workers keep huey's own timeout" in log
    assert_clean_log(log)


@pytest.mark.once
def test_without_install_thread_workers_ignore_the_timeout(redis_url: str,
                                                           tmp_path: Path) -> None:
    """Why this module exists: huey's thread workers accept ``timeout`` and ignore it."""
    with Consumer(redis_url, tmp_path, install=False, patch=False,
                  caller_install=False) as c:
        got, took = timed(c["sleeper"](1.0))  # timeout=0.5
        assert got == "ok:slept" and took >= 1.0
        assert c.stop() == 0


# --- the documentation's example ------------------------------------------------------------


@pytest.mark.once
def test_docs_example_runs_with_a_thread_consumer(redis_url: str, tmp_path: Path) -> None:
    """docs/huey.md (its page is this module's, tests/test_readme.py OWN_TESTS): the
    fragments compile, tasks.py under a real consumer and client.py print what they say."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "huey.md").read_text()
    files = {}
    for lang, code in FENCE.findall(page):
        if lang == "py":
            compile(code, "<fragment>", "exec")
        else:
            first = FILE_NAME.match(code.splitlines()[0])
            assert first, f"a python block of docs/huey.md names no file:\n{code}"
            files[first[1]] = code
    assert set(files) == {"tasks.py", "client.py"}
    name = f"timeoutcore-docs-{uuid.uuid4().hex}"  # runs sharing a Redis stay apart
    assert 'RedisHuey("tasks",' in files["tasks.py"]
    (tmp_path / "tasks.py").write_text(files["tasks.py"].replace('RedisHuey("tasks",',
                                                                 f'RedisHuey("{name}",'))
    (tmp_path / "client.py").write_text(files["client.py"])
    env = dict(os.environ, REDIS_URL=redis_url, PYTHONPATH=os.pathsep.join(
        p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p))
    log_path = tmp_path / "consumer.log"
    proc = huey_harness.start(log_path, "tasks.huey", tmp_path, env, workers=4)
    try:
        huey_harness.wait_ready(proc, log_path)
        client = subprocess.run([sys.executable, "client.py"], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=60)
    finally:
        status = huey_harness.stop(proc)
        RedisHuey(name, url=redis_url).flush()
    log = log_path.read_text()
    assert client.returncode == 0, client.stderr + log
    assert client.stdout.splitlines() == [
        "stuck: TaskTimeout('timeout (0.5s)')", "done", "revoked: True"], client.stdout + log
    assert status == 0, log


@pytest.mark.once
def test_a_watcher_that_cannot_start_leaves_tasks_running_and_the_next_task_retries(
        caplog: pytest.LogCaptureFixture) -> None:
    """The revoke watcher cannot start (no thread can: a stack no memory can hold): the task
    still runs under its own limit, one warning says revokes wait, and the next task starts
    the watcher, whose revoke then stops a running task."""
    import logging
    import threading

    from huey import MemoryHuey

    from timeoutcore import DeadlineCancelled, thread_deadline
    from timeoutcore.contrib.huey import _Running

    huey = MemoryHuey(f"tc-watcher-{uuid.uuid4().hex}")

    @huey.task()
    def job() -> None:
        pass

    running = _Running(huey, 0.02)
    threads = threading.active_count()
    first, second = job.s(), job.s()
    caplog.set_level(logging.INFO, logger="huey.timeoutcore")
    threading.stack_size(1 << 40)  # no thread can be started until reset
    try:
        with thread_deadline(30) as scope:
            running.add(scope, first)  # runs on, without a watcher
            running.remove(scope)
        assert scope.cancelled() is False
    finally:
        threading.stack_size(0)
    assert running.thread is None and threading.active_count() == threads
    warned = [r for r in caplog.records if "cannot start the revoke watcher" in r.message]
    assert len(warned) == 1, caplog.text
    try:
        with pytest.raises(DeadlineCancelled) as stopped:
            with thread_deadline(30) as scope:
                running.add(scope, second)  # starts the watcher
                huey.revoke(second)
                end = time.monotonic() + 20
                while time.monotonic() < end:
                    time.sleep(0.01)
        assert stopped.value.scope is scope
        assert "revoke watcher started" in caplog.text
    finally:
        running.remove(scope)
        running.stop()
    assert threading.active_count() == threads
