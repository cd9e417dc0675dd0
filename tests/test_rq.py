"""RQ job timeouts and stop-job through timeoutcore.contrib.rq: real ``rq worker`` processes
(tests/rq_harness.py) over a real Redis, each on a queue of its own, running the jobs of
tests/rq_jobs.py.

One ``SimpleWorker`` serves most tests (that it survives each of them is part of what they
check); a forking ``Worker`` and a process hosting ``SimpleWorker``s in threads get one test
each.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("rq")

import redis  # noqa: E402
import rq  # noqa: E402
import rq_jobs  # noqa: E402
from rq import Callback, Retry  # noqa: E402
from rq.command import send_stop_job_command  # noqa: E402
from rq.job import Job  # noqa: E402
from rq.timeouts import HorseMonitorTimeoutException, JobTimeoutException  # noqa: E402
from rq_harness import TESTS, RQWorker, job_env, wait_ended, wait_status  # noqa: E402
from test_readme import FENCE  # noqa: E402

import timeoutcore  # noqa: E402
from timeoutcore.contrib.rq import META_KEY, DeathPenalty, JobStopped, Queue  # noqa: E402

DOCS = TESTS.parent / "docs" / "rq.md"
SLACK = 3.0  # seconds past its limit a stopped job may take to end (a loaded CI machine)
#: Jobs of the hammer; the interpreters after the first in CI do fewer.
HAMMER = 20 if os.environ.get("TIMEOUTCORE_TESTS_ONCE_DONE") else 60
#: What the worker's log never shows: an interrupt outside its job, or a worker in trouble.
NEVER_LOGGED = ("_DeadlineInterrupt", "Exception ignored", "unhandled exception",
                "failed to persist", "signal only works in main thread")


def _timeout_text(limit: str) -> str:
    return f"JobTimeoutException: Task exceeded maximum timeout value ({limit} seconds)"


def _children(pid: int) -> list[int]:
    """The pids of the live children of ``pid`` (zombies included: not reaped is left)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _gone(pid: int, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def _failure(job: Job) -> str:
    """The exc_info RQ recorded for the job's last run ("" if none)."""
    result = job.latest_result()
    return (result.exc_string if result is not None else None) or ""


def _ran_for(job: Job) -> float:
    job.refresh()
    assert job.started_at is not None and job.ended_at is not None
    return (job.ended_at - job.started_at).total_seconds()


def _run(queue: Queue, fn: Any, *args: Any, **options: Any) -> Job:
    """Enqueue, wait for the job's end; the job, refreshed."""
    job = queue.enqueue(fn, *args, **options)
    wait_ended(job)
    job.refresh()
    return job


@pytest.fixture(scope="module")
def simple(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RQWorker]:
    """``rq worker --worker-class timeoutcore.contrib.rq.SimpleWorker``; at the end: the
    threads it runs are those it started with, it has no child left, it exits 0 on
    SIGTERM, and its log never shows an interrupt outside a job."""
    worker = RQWorker(redis_url, "timeoutcore.contrib.rq.SimpleWorker",
                      tmp_path_factory.mktemp("rq"))
    queue = Queue(worker.queue, connection=worker.redis)
    try:
        first = _run(queue, rq_jobs.where).return_value()
        yield worker
        last = _run(queue, rq_jobs.where).return_value()
        assert last["threads"] == first["threads"]
        assert _children(worker.proc.pid) == []
    finally:
        code = worker.stop()
    log = worker.log()
    assert code == 0, log[-3000:]
    for text in NEVER_LOGGED:
        assert text not in log, log[-3000:]


@pytest.fixture
def queue(simple: RQWorker) -> Queue:
    return Queue(simple.queue, connection=simple.redis)


def test_blocking_jobs_end_at_their_limit_and_the_same_thread_takes_the_next(
    queue: Queue, simple: RQWorker, silent_peer: Any, tmp_path: Path,
) -> None:
    before = _run(queue, rq_jobs.where).return_value()
    pid_file = tmp_path / "child.pid"
    jobs = {
        "sleep": queue.enqueue(rq_jobs.sleep, 30, job_timeout=0.5),
        "requests": queue.enqueue(rq_jobs.http_get, silent_peer.url, job_timeout=0.5),
        "cpu": queue.enqueue(rq_jobs.cpu, 30, job_timeout=0.5),
        "subprocess": queue.enqueue(rq_jobs.child, str(pid_file), job_timeout=0.5),
    }
    after = queue.enqueue(rq_jobs.where)
    for kind, job in jobs.items():
        assert wait_ended(job) == "failed", kind
        assert 0.5 <= _ran_for(job) < 0.5 + SLACK, kind
        assert _failure(job).rstrip().endswith(
            _timeout_text("0.5")), (kind, _failure(job))
        assert job.id in queue.failed_job_registry, kind
    assert wait_ended(after) == "finished"
    assert (after.return_value()["pid"], after.return_value()["thread"]) == (
        before["pid"], before["thread"])
    child = int(pid_file.read_text())
    assert _gone(child), f"the job's child {child} was left running"


def test_except_exception_in_the_job_cannot_keep_it_running(queue: Queue) -> None:
    job = _run(queue, rq_jobs.sleep_swallowing, 30, job_timeout=0.3)
    assert job.get_status() == "failed"
    assert _timeout_text("0.3") in _failure(job)


def test_the_meta_limit_shortens_rqs_and_never_lengthens_it(queue: Queue) -> None:
    plain = rq.Queue(queue.name, connection=queue.connection)  # RQ's own queue, meta by hand
    short = _run(plain, rq_jobs.cpu, 30, job_timeout=20, meta={META_KEY: 0.25})
    assert short.get_status() == "failed" and 0.25 <= _ran_for(short) < 0.25 + SLACK
    assert _timeout_text("0.25") in _failure(short)
    longer = _run(plain, rq_jobs.cpu, 30, job_timeout=1, meta={META_KEY: 25.0})
    assert longer.get_status() == "failed" and 1 <= _ran_for(longer) < 1 + SLACK
    assert _timeout_text("1") in _failure(longer)


def test_no_limit_is_minus_one_and_a_bad_meta_limit_fails_the_job_clearly(
    queue: Queue,
) -> None:
    unlimited = _run(queue, rq_jobs.sleep, 0.3, job_timeout=-1)
    assert (unlimited.get_status(), unlimited.return_value()) == ("finished", "slept")
    bad = _run(rq.Queue(queue.name, connection=queue.connection), rq_jobs.noop,
               meta={META_KEY: "soon"})
    assert bad.get_status() == "failed"
    assert "TypeError" in _failure(bad) and META_KEY in _failure(bad)


def test_jobs_ending_at_their_limit_succeed_or_fail_with_it_nothing_else(
    queue: Queue, simple: RQWorker,
) -> None:
    limit = 0.05
    jobs = [queue.enqueue(rq_jobs.work, limit * (0.9 + 0.2 * (i % 5) / 4), job_timeout=limit)
            for i in range(HAMMER)]
    outcomes = {"finished": 0, "failed": 0}
    for job in jobs:
        status = wait_ended(job)
        job.refresh()
        if status == "finished":
            assert job.return_value() == "done"
        else:
            assert status == "failed", (status, _failure(job))
            assert _failure(job).rstrip().endswith(
                _timeout_text("0.05")), _failure(job)
        outcomes[status] += 1
    # Which jobs finish and which are stopped depends on the machine's load (a loaded one
    # may stop them all): what matters is that each one ended one way or the other.
    assert sum(outcomes.values()) == HAMMER, outcomes
    assert _run(queue, rq_jobs.noop).return_value() == "ok"
    for text in NEVER_LOGGED:
        assert text not in simple.log()


@pytest.mark.parametrize("blocked_in", ["sleep", "requests"])
def test_stop_job_stops_a_blocked_job_in_its_thread_and_it_is_not_retried(
    queue: Queue, silent_peer: Any, blocked_in: str,
) -> None:
    before = _run(queue, rq_jobs.where).return_value()
    fn, arg = (rq_jobs.sleep, 60) if blocked_in == "sleep" else (rq_jobs.http_get,
                                                                 silent_peer.url)
    job = queue.enqueue(fn, arg, job_timeout=-1, retry=Retry(max=2),
                        on_stopped=Callback(rq_jobs.note_stopped),
                        on_failure=Callback(rq_jobs.note_failed))
    wait_status(job, "started")
    time.sleep(0.2)  # into its sleep
    start = time.monotonic()
    send_stop_job_command(queue.connection, job.id)
    assert wait_ended(job) == "stopped"
    assert time.monotonic() - start < SLACK
    job.refresh()
    assert job.meta.get("on_stopped") is True and "on_failure" not in job.meta
    assert "JobStopped" in _failure(job)
    assert job.id in queue.failed_job_registry and job.id not in queue.job_ids
    after = _run(queue, rq_jobs.where).return_value()
    assert (after["pid"], after["thread"]) == (before["pid"], before["thread"])
    assert job.get_status(refresh=True) == "stopped"  # not retried meanwhile


def test_workers_hosted_in_threads_enforce_limits_side_by_side(redis_url: str) -> None:
    queue = Queue(f"timeoutcore-rq-threads-{os.getpid()}-{time.monotonic_ns()}",
                  connection=redis.Redis.from_url(redis_url))
    try:
        # 1.5 s: both threads must hold their job at the same moment, and on a loaded
        # machine the second thread may start its job a good while after the first.
        stuck = [queue.enqueue(rq_jobs.sleep, 30, job_timeout=1.5) for _ in range(2)]
        cpu = queue.enqueue(rq_jobs.cpu, 30, job_timeout=0.3)
        fine = queue.enqueue(rq_jobs.where)
        done = subprocess.run([sys.executable, "rq_thread_host.py", redis_url, queue.name, "2"],
                              cwd=TESTS, env=job_env(), capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr[-3000:]
        threads = json.loads(done.stdout.strip().splitlines()[-1])
        assert threads["after"] == threads["before"] == ["MainThread"]
        for job, limit in ((stuck[0], "1.5"), (stuck[1], "1.5"), (cpu, "0.3")):
            assert wait_ended(job) == "failed"
            assert float(limit) <= _ran_for(job) < float(limit) + SLACK
            assert _timeout_text(limit) in _failure(job)
        first, second = stuck
        assert first.started_at is not None and second.started_at is not None
        assert first.ended_at is not None and second.ended_at is not None
        assert max(first.started_at, second.started_at) < min(first.ended_at, second.ended_at)
        assert wait_ended(fine) == "finished"
        for text in NEVER_LOGGED:
            assert text not in done.stderr
    finally:
        queue.connection.close()


def test_the_forking_workers_horse_gets_sub_second_limits(
    redis_url: str, tmp_path: Path,
) -> None:
    with RQWorker(redis_url, "timeoutcore.contrib.rq.Worker", tmp_path) as worker:
        queue = Queue(worker.queue, connection=worker.redis)
        job = _run(queue, rq_jobs.sleep, 30, job_timeout=0.3)
        assert job.get_status() == "failed" and 0.3 <= _ran_for(job) < 0.3 + SLACK
        assert _timeout_text("0.3") in _failure(job)
        assert _run(queue, rq_jobs.noop).return_value() == "ok"
        code = worker.stop()
    assert code == 0, worker.log()[-3000:]


# --- in process -----------------------------------------------------------------------------


def test_a_stop_before_the_job_starts_keeps_it_from_starting(redis_url: str) -> None:
    """The stop-job command reaches the worker between the dequeue and the job's start (RQ's
    own handler, called from the worker's preparation here): the job never runs."""
    from rq.command import handle_stop_job_command

    from timeoutcore.contrib.rq import SimpleWorker

    class StoppedWhilePreparing(SimpleWorker):
        patch_blocking = False  # this process is pytest's: leave the stdlib alone

        def prepare_job_execution(self, job: Any, *args: Any, **kwargs: Any) -> None:
            super().prepare_job_execution(job, *args, **kwargs)
            handle_stop_job_command(self, {"command": "stop-job", "job_id": job.id})

    connection = redis.Redis.from_url(redis_url)
    queue = Queue(f"timeoutcore-rq-early-{os.getpid()}", connection=connection)
    try:
        job = queue.enqueue(rq_jobs.sleep, 30, job_timeout=-1)
        worker = StoppedWhilePreparing([queue], connection=connection)
        host = threading.Thread(target=worker.work, kwargs={"burst": True})
        start = time.monotonic()
        host.start()
        host.join(30)
        assert not host.is_alive()
        assert time.monotonic() - start < SLACK
        assert wait_ended(job) == "stopped"
        assert "stopped before it started" in _failure(job)
        assert timeoutcore.current_scope() is None
    finally:
        queue.delete(delete_jobs=True)
        connection.close()


def test_death_penalty_on_its_own_in_a_thread(patched_for_test: None) -> None:
    class Custom(Exception):
        pass

    seen: dict[str, Any] = {}

    def run() -> None:
        start = time.monotonic()
        try:
            with DeathPenalty(0.2, Custom, job_id="j"):
                time.sleep(30)
        except Custom as exc:
            seen["error"], seen["took"] = exc, time.monotonic() - start
        with DeathPenalty(-1, JobTimeoutException, job_id="j"):
            time.sleep(0.05)
        with DeathPenalty(None, JobTimeoutException):
            pass
        seen["scope after"] = timeoutcore.current_scope()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    assert 0.2 <= seen["took"] < 0.2 + SLACK
    assert str(seen["error"]) == "Task exceeded maximum timeout value (0.2 seconds)"
    assert isinstance(seen["error"].__cause__, timeoutcore.DeadlineExceeded)
    assert seen["scope after"] is None


def test_the_forking_workers_horse_monitor_keeps_rqs_sigalrm() -> None:
    """``os.wait4`` in the main thread: only SIGALRM ends it before Python 3.15."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("needs the main thread")
    child = subprocess.Popen(["sleep", "5"])
    try:
        penalty = DeathPenalty(1, HorseMonitorTimeoutException)
        assert penalty.limit is None  # not ours
        start = time.monotonic()
        with pytest.raises(HorseMonitorTimeoutException):
            with penalty:
                os.wait4(child.pid, 0)
        assert time.monotonic() - start < 1 + SLACK
        assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL
    finally:
        child.kill()
        child.wait()


@pytest.mark.once
@pytest.mark.parametrize("timeout, error, text", [
    (-2, ValueError, "timeout must be a positive finite number"),
    (-0.5, ValueError, "timeout must be a positive finite number"),
    (float("nan"), ValueError, "timeout must be a positive finite number"),
    (float("inf"), ValueError, "timeout must be a positive finite number"),
    ("5", TypeError, "timeout must be a number of seconds"),
    (True, TypeError, "timeout must be a number of seconds"),
])
def test_bad_limits_are_refused_with_a_clear_error(timeout: Any, error: type,
                                                   text: str) -> None:
    with pytest.raises(error, match=text):
        DeathPenalty(timeout, JobTimeoutException, job_id="j")
    assert timeoutcore.current_scope() is None


@pytest.mark.once
def test_bad_exception_class_and_bad_queue_timeouts(redis_url: str) -> None:
    with pytest.raises(TypeError, match="exception must be an exception class"):
        DeathPenalty(1, 42)
    connection = redis.Redis.from_url(redis_url)
    try:
        queue = Queue(f"timeoutcore-rq-bad-{os.getpid()}", connection=connection)
        for bad in (-0.5, -2, float("nan"), float("inf")):
            with pytest.raises(ValueError, match="job_timeout"):
                queue.enqueue(rq_jobs.noop, job_timeout=bad)
        assert queue.count == 0
    finally:
        connection.close()


@pytest.mark.once
def test_queue_keeps_a_float_limit_in_meta(redis_url: str) -> None:
    connection = redis.Redis.from_url(redis_url)
    try:
        queue = Queue(f"timeoutcore-rq-meta-{os.getpid()}", connection=connection)
        job = queue.enqueue(rq_jobs.noop, job_timeout=0.25, meta={"mine": 1})
        stored = Job.fetch(job.id, connection=connection)
        assert (stored.timeout, stored.meta) == (1, {"mine": 1, META_KEY: 0.25})
        whole = queue.enqueue(rq_jobs.noop, job_timeout=2.0)
        assert (whole.timeout, whole.meta) == (2, {})
        assert queue.enqueue(rq_jobs.noop, job_timeout=-1).timeout == -1
        queue.empty()
    finally:
        connection.close()


@pytest.mark.once
def test_jobstopped_is_an_exception_rq_records() -> None:
    assert issubclass(JobStopped, Exception)


@pytest.mark.once
def test_the_docs_examples_run_and_print_what_the_page_says(redis_url: str,
                                                             tmp_path: Path) -> None:
    if not DOCS.exists():
        pytest.skip("the docs are not beside tests/ (not a source checkout)")
    page = DOCS.read_text(encoding="utf-8")
    blocks = FENCE.findall(page)
    for lang, code in blocks:
        if lang == "py":
            compile(code, "<docs/rq.md fragment>", "exec")
    programs = [code for lang, code in blocks if lang == "python"]
    assert len(programs) == 1
    script = tmp_path / "example.py"
    script.write_text(programs[0], encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, REDIS_URL=redis_url))
    assert done.returncode == 0, done.stderr[-3000:]
    # what the program prints, without the worker's log lines ("08:40:35 Worker ...")
    printed = [line for line in done.stdout.splitlines()
               if not re.match(r"\d\d:\d\d:\d\d ", line)]
    shown = re.search(r"prints\n\n```text\n(.*?)\n```", page, re.S)
    assert shown is not None
    expected = shown.group(1).splitlines()
    status = re.fullmatch(r"failed after (\d+\.\d) s", printed[0])
    assert status is not None and 0.5 <= float(status.group(1)) < 0.5 + SLACK, printed
    assert expected[0].startswith("failed after ")
    assert printed[1:] == expected[1:]
