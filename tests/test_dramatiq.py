"""timeoutcore.contrib.dramatiq: time limits and abort in a real ``python -m dramatiq``
worker (tests/dramatiq_app.py, tests/dramatiq_harness.py) over a real Redis broker and
Results backend.

One worker process, one worker thread, serves the module (its start-up is what costs): that
it survives every test, keeps its threads and exits cleanly on SIGTERM is checked at the end.
"""

from __future__ import annotations

import math
import os
import random
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

dramatiq = pytest.importorskip("dramatiq")
pytest.importorskip("redis")

import redis  # noqa: E402
from dramatiq.brokers.stub import StubBroker  # noqa: E402
from dramatiq.middleware import TimeLimitExceeded as StockTimeLimitExceeded  # noqa: E402
from dramatiq_app import LIMIT_MS  # noqa: E402
from dramatiq_harness import DramatiqWorker, WorkerProcess, alive  # noqa: E402
from redis_server import wait_for_job  # noqa: E402

import timeoutcore  # noqa: E402
from timeoutcore.contrib import dramatiq as tc_dramatiq  # noqa: E402
from timeoutcore.contrib.dramatiq import Aborted, TimeLimit, TimeLimitExceeded, abort  # noqa: E402
from timeoutcore.contrib.redis import DeadlineRegistry  # noqa: E402

LIMIT = LIMIT_MS / 1000
LATE = 3.0  # s: how late past its limit a message may fail on a loaded machine (generous)
#: messages in the hammer (fewer on the interpreters after the first CI run)
HAMMER = 12 if os.environ.get("TIMEOUTCORE_TESTS_ONCE_DONE") else 40


@pytest.fixture(scope="module")
def registry_prefix() -> str:
    return f"tc-dramatiq-reg-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def worker(redis_url: str, registry_prefix: str,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[DramatiqWorker]:
    """The module's worker: 1 thread, this package's TimeLimit with patch() and a registry.
    At the end: its threads are those it started with (timeoutcore's own helpers aside),
    no child is left, no scope is active, SIGTERM stops it with status 0 and its log holds
    no traceback but the expected failures'."""
    folder = tmp_path_factory.mktemp("dramatiq")
    with DramatiqWorker(redis_url, folder, registry_prefix=registry_prefix) as w:
        before = _state(w)
        yield w
        after = _state(w)
        assert after["pid"] == before["pid"] and after["thread"] == before["thread"]
        assert _plain(after["threads"]) == _plain(before["threads"]), (before, after)
        assert after["children"] == []
        assert after["scopes"] == [f"state[{after['message_id']}]"]
    assert w.proc.returncode == 0, w.log()[-3000:]
    _assert_clean_log(w.log())


def _state(w: DramatiqWorker) -> dict[str, Any]:
    message = w.send("state")
    return dict(w.result(message), message_id=message.message_id)


def _plain(threads: list[str]) -> list[str]:
    """The worker's threads but timeoutcore's helpers (started on first use, then kept)."""
    return [t for t in threads if not t.startswith("timeoutcore-")]


#: What a traceback in the worker's log may end with: the failures the tests cause.
EXPECTED = ("timeoutcore.contrib.dramatiq.TimeLimitExceeded: ",
            "timeoutcore.contrib.dramatiq.InvalidTimeLimit: ",
            "dramatiq.middleware.middleware.MiddlewareError: failed by the saboteur",
            "RuntimeError: raised by the saboteur")


def _assert_clean_log(log: str) -> None:
    for block in log.split("Traceback (most recent call last):")[1:]:
        lines = [line for line in block.splitlines()[1:] if line and not line[0].isspace()]
        last = lines[0] if lines else ""
        assert last.startswith(EXPECTED), f"unexpected traceback in the worker:\n{block[:3000]}"
    assert "Unexpected failure in" not in log.replace(
        "Unexpected failure in before_process_message of <dramatiq_app.Saboteur", ""), log


def _fails_at_the_limit(w: DramatiqWorker, message: Any, sent: float, limit: float = LIMIT,
                        kind: str = "TimeLimitExceeded") -> float:
    failure = w.failure(message)
    took = time.monotonic() - sent
    assert failure.orig_exc_type == kind, (failure.orig_exc_type, failure.orig_exc_msg)
    assert limit <= took < limit + LATE, took
    return took


@pytest.mark.parametrize("actor", ["sleep", "http", "spin", "child"])
def test_limit_stops_the_actor_and_the_same_thread_takes_the_next(
        worker: DramatiqWorker, actor: str, silent_peer: Any, redis_url: str) -> None:
    """time.sleep, requests.get to a server that never answers, a CPU loop and a child
    process: each fails with dramatiq's TimeLimitExceeded at its limit; the child is gone."""
    thread = worker.result(worker.send("state"))["thread"]
    arg: Any = {"sleep": 60, "http": silent_peer.url, "spin": 60,
                "child": f"{worker.namespace}:child:{uuid.uuid4().hex}"}[actor]
    sent = time.monotonic()
    message = worker.send(actor, arg)
    _fails_at_the_limit(worker, message, sent)
    if actor == "child":
        pid = int(redis.Redis.from_url(redis_url).get(arg) or 0)
        assert pid and not alive(pid)
    for i in range(3):  # the one worker thread is free again
        assert worker.result(worker.send("quick", i)) == 2 * i
    state = worker.result(worker.send("state"))
    assert state["thread"] == thread and state["children"] == []
    assert f"Time limit exceeded ({LIMIT_MS} ms) for message {message.message_id}" in worker.log()


def test_three_limited_messages_in_a_row_on_one_thread(worker: DramatiqWorker) -> None:
    sent = time.monotonic()
    messages = [worker.send(name, 60) for name in ("sleep", "spin", "sleep")]
    for i, message in enumerate(messages):
        _fails_at_the_limit(worker, message, sent, limit=(i + 1) * LIMIT)
    assert worker.result(worker.send("quick", 4)) == 8


def test_message_option_overrides_the_actors_limit(worker: DramatiqWorker) -> None:
    sent = time.monotonic()
    message = worker.send("spin", 60, time_limit=200)
    _fails_at_the_limit(worker, message, sent, limit=0.2)
    assert "200 ms" in worker.failure(message).orig_exc_msg
    assert worker.result(worker.send("spin", 0.05, time_limit=5000)) == "ran to the end"


def test_soft_limit_warns_on_dramatiqs_logger_and_the_actor_runs_on(
        worker: DramatiqWorker) -> None:
    message = worker.send("soft", 1.0)  # the warning comes at 0.2 s while it still runs
    assert worker.result(message) == "ran to the end"
    expected = f"[dramatiq.middleware.time_limit.TimeLimit] [WARNING] Soft time limit (200 ms) " \
               f"exceeded for soft[{message.message_id}]"
    end = time.monotonic() + 10  # logged from the soft timer's callback thread
    while expected not in worker.log() and time.monotonic() < end:
        time.sleep(0.02)
    assert expected in worker.log()


def test_no_limit_with_inf(worker: DramatiqWorker) -> None:
    assert worker.result(worker.send("unlimited", 0.7)) == "ran to the end"


def test_hammer_of_messages_ending_at_their_limit(worker: DramatiqWorker) -> None:
    """Work about as long as the limit: every message succeeds or fails with the limit,
    never anything else, and the worker goes on."""
    rng = random.Random(39)
    messages = [worker.send("busy_or_not", rng.uniform(0.045, 0.055), time_limit=50)
                for _ in range(HAMMER)]
    outcomes = []
    for message in messages:
        try:
            outcomes.append(worker.result(message))
        except dramatiq.results.ResultFailure as exc:
            assert exc.orig_exc_type == "TimeLimitExceeded", exc.orig_exc_msg
            outcomes.append("limit")
    assert set(outcomes) <= {"done", "limit"}
    assert worker.result(worker.send("quick", 5)) == 10


@pytest.mark.parametrize("how", ["skip", "fail", "raise"])
def test_another_middleware_going_wrong_leaves_nothing_behind(worker: DramatiqWorker,
                                                              how: str) -> None:
    message = worker.send("sabotaged", how)
    if how == "raise":  # dramatiq logs the error and runs the actor anyway
        assert worker.result(message) == "ran (raise)"
    elif how == "fail":
        assert worker.failure(message).orig_exc_type == "MiddlewareError"
    else:  # skipped, not failed: Results stores None
        assert worker.result(message) is None
    state = _state(worker)
    assert state["scopes"] == [f"state[{state['message_id']}]"]
    sent = time.monotonic()
    _fails_at_the_limit(worker, worker.send("spin", 60), sent)


def test_abort_stops_a_running_message_which_is_not_retried(
        worker: DramatiqWorker, redis_url: str, registry_prefix: str) -> None:
    coordinator = DeadlineRegistry.from_url(redis_url, prefix=registry_prefix)
    r = redis.Redis.from_url(redis_url)
    key = f"{worker.namespace}:runs:{uuid.uuid4().hex}"
    message = worker.send("counted", key, 60)  # retried up to 3 times, 50-100 ms apart
    info = wait_for_job(coordinator, message.message_id)
    assert info.label == f"counted[{message.message_id}]"
    # The registry lists the message before its body runs: abort only once the body has
    # counted its run, or the abort may stop it before the count (a run of 0, not 1).
    end = time.monotonic() + 10.0
    while r.get(key) is None and time.monotonic() < end:
        time.sleep(0.005)
    sent = time.monotonic()
    assert abort(message, registry=coordinator) is True
    failure = worker.failure(message)
    assert time.monotonic() - sent < 2.0  # blocked in time.sleep(60)
    assert failure.orig_exc_type == "Aborted"
    time.sleep(0.5)  # a retry would have run by now
    assert r.get(key) == b"1"
    assert coordinator.get(message.message_id) is None
    log = worker.log()
    assert f"Failed to process message counted('{key}', 60) with expected exception " \
           "Aborted." in log
    assert f"Aborting message '{message.message_id}'." in log  # Retries: throws -> fail()
    assert worker.result(worker.send("quick", 6)) == 12
    coordinator.close()


def test_abort_stops_a_message_blocked_in_a_socket_read(
        worker: DramatiqWorker, silent_peer: Any, redis_url: str,
        registry_prefix: str) -> None:
    coordinator = DeadlineRegistry.from_url(redis_url, prefix=registry_prefix)
    try:
        message = worker.send("http", silent_peer.url, time_limit=5000)
        wait_for_job(coordinator, message.message_id)
        sent = time.monotonic()
        assert abort(message, registry=coordinator) is True
        failure = worker.failure(message)
        assert failure.orig_exc_type == "Aborted"
        assert time.monotonic() - sent < 2.0  # not at the 5 s limit
    finally:
        coordinator.close()


def test_abort_before_the_message_runs_fails_it_at_its_start(
        worker: DramatiqWorker, redis_url: str, registry_prefix: str) -> None:
    """Chosen: an abort of a message that is not running is kept (abort_ttl ms); the
    message fails with Aborted when it starts, its body never run, and is not retried."""
    coordinator = DeadlineRegistry.from_url(redis_url, prefix=registry_prefix)
    r = redis.Redis.from_url(redis_url)
    busy = f"{worker.namespace}:runs:{uuid.uuid4().hex}"
    queued = f"{worker.namespace}:runs:{uuid.uuid4().hex}"
    first = worker.send("counted", busy, 2.0)  # holds the one worker thread meanwhile
    wait_for_job(coordinator, first.message_id)
    second = worker.send("counted", queued, 0)
    assert abort(second.message_id, registry=coordinator) is False
    assert worker.result(first) == "ran to the end"
    assert worker.failure(second).orig_exc_type == "Aborted"
    time.sleep(0.3)
    assert r.get(queued) is None  # never ran, never retried
    # abort_ttl=0: running messages only; a finished one is not found
    assert abort(first, registry=coordinator, abort_ttl=0) is False
    assert r.exists(f"{registry_prefix}:dramatiq-abort:{first.message_id}") == 0
    coordinator.close()


def test_a_bad_limit_that_reaches_the_worker_fails_that_message(
        worker: DramatiqWorker, redis_url: str) -> None:
    """A sender without this middleware (nothing checked before the enqueue)."""
    from dramatiq_app import make_broker

    sender = make_broker(redis_url, worker.namespace, limits="stock")
    try:
        message = sender.get_actor("quick").send_with_options(args=(1,), time_limit=-5)
        failure = worker.failure(message)
        assert failure.orig_exc_type == "InvalidTimeLimit"
        assert "time_limit must be a positive number of milliseconds" in failure.orig_exc_msg
    finally:
        sender.close()
    assert worker.result(worker.send("quick", 7)) == 14


@pytest.mark.once  # argument checks
def test_bad_limits_are_refused_where_they_are_given() -> None:
    for bad, error in ((-1, ValueError), (0, ValueError), (math.nan, ValueError),
                       ("500", TypeError), (True, TypeError), (None, TypeError)):
        with pytest.raises(error, match="time_limit"):
            TimeLimit(time_limit=bad)
    with pytest.raises(ValueError, match="soft_time_limit"):
        TimeLimit(soft_time_limit=-3)
    with pytest.raises(TypeError, match="patch"):
        TimeLimit(patch="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="registry"):
        TimeLimit(registry="redis://localhost")
    broker = StubBroker(middleware=[TimeLimit()])
    with pytest.raises(ValueError, match="actor 'bad'.*time_limit"):
        dramatiq.actor(time_limit=-5, broker=broker, actor_name="bad")(lambda: None)
    good = dramatiq.actor(broker=broker, actor_name="good")(lambda: None)
    with pytest.raises(ValueError, match="time_limit"):
        good.send_with_options(time_limit=math.nan)
    with pytest.raises(TypeError, match="soft_time_limit"):
        good.send_with_options(soft_time_limit="1s")
    with pytest.raises(TypeError, match="registry"):
        abort("some-id", registry=None)
    broker.close()


@pytest.mark.once
def test_abort_arguments(redis_url: str) -> None:
    registry = DeadlineRegistry.from_url(redis_url, prefix=f"tc-abort-{uuid.uuid4().hex[:6]}")
    with pytest.raises(ValueError, match="abort_ttl"):
        abort("x", registry=registry, abort_ttl=-1)
    with pytest.raises(TypeError, match="message id"):
        abort(42, registry=registry)
    registry.close()


@pytest.mark.once  # the exception types
def test_exceptions_are_dramatiqs_and_not_exceptions() -> None:
    assert issubclass(TimeLimitExceeded, StockTimeLimitExceeded)
    assert not issubclass(TimeLimitExceeded, Exception)
    assert not issubclass(Aborted, Exception)


def test_skipped_message_leaves_no_pending_limit() -> None:
    """The hooks' contract in this thread: after_skip_message (and after_process_message)
    drop what before_process_message prepared, so an actor called directly afterwards runs
    under no scope."""
    middleware = TimeLimit(time_limit=1000)
    broker = StubBroker(middleware=[middleware])
    seen: list[Any] = []
    actor = dramatiq.actor(broker=broker, actor_name="probe")(
        lambda: seen.append(timeoutcore.current_scope()))
    for after in ("after_skip_message", "after_process_message"):
        message = dramatiq.broker.MessageProxy(actor.message())
        middleware.before_process_message(broker, message)
        getattr(middleware, after)(broker, message)
        actor()
    middleware.before_process_message(broker, dramatiq.broker.MessageProxy(actor.message()))
    actor()  # as the worker calls it: under the message's scope
    middleware.after_process_message(broker, message)
    assert seen[:2] == [None, None]
    assert seen[2] is not None and seen[2].label.startswith("probe[")
    broker.close()


@pytest.mark.once  # dramatiq's own behaviour, without timeoutcore
def test_stock_time_limit_waits_for_a_blocking_call(redis_url: str, tmp_path: Path) -> None:
    """Why this module exists: the stock middleware's exception lands when time.sleep(3)
    returns, 2.5 s after the 0.5 s limit."""
    with DramatiqWorker(redis_url, tmp_path, limits="stock") as stock:
        sent = time.monotonic()
        failure = stock.failure(stock.send("sleep", 3))
        assert failure.orig_exc_type == "TimeLimitExceeded"
        assert time.monotonic() - sent >= 3.0


def test_install_replaces_the_stock_middleware_in_place() -> None:
    broker = StubBroker()
    names = [type(m).__name__ for m in broker.middleware]
    ours = tc_dramatiq.install(broker, time_limit=1234)
    assert [type(m).__name__ for m in broker.middleware] == names
    assert broker.middleware[names.index("TimeLimit")] is ours and ours.time_limit == 1234
    broker.close()


DOCS = Path(__file__).resolve().parent.parent / "docs" / "dramatiq.md"


def _doc_blocks() -> list[tuple[str, str]]:
    """(kind, code) of the page's code blocks: ``python`` (a file, named on its first
    line) or ``py`` (a fragment)."""
    if not DOCS.exists():
        pytest.skip("docs/ is not beside tests/ (not a source checkout)")
    fence = re.compile(r"^```(python|py)\n(.*?)^```", re.M | re.S)
    return [(m[1], m[2]) for m in fence.finditer(DOCS.read_text(encoding="utf-8"))]


@pytest.mark.once  # the documentation's example (tests/test_readme.py: OWN_TESTS)
def test_docs_example_limits_and_aborts(redis_url: str, silent_peer: Any,
                                        tmp_path: Path) -> None:
    """docs/dramatiq.md: app.py run by a real worker, client.py prints what it says."""
    files = {}
    for kind, code in _doc_blocks():
        if kind == "py":
            compile(code, str(DOCS), "exec")
            continue
        name = code.splitlines()[0].split()[1]
        files[name] = code
    assert set(files) == {"app.py", "client.py"}, set(files)
    for name, code in files.items():
        (tmp_path / name).write_text(code, encoding="utf-8")
    env = {"REDIS_URL": redis_url, "HUNG_URL": silent_peer.url}
    worker = WorkerProcess("app", tmp_path, env)
    try:
        client = subprocess.run([sys.executable, "client.py"], cwd=tmp_path, text=True,
                                capture_output=True, timeout=60,
                                env=dict(os.environ, **env, PYTHONPATH=str(tmp_path)))
    finally:
        code = worker.stop()
    assert client.returncode == 0, client.stderr
    assert client.stdout.splitlines() == ["at the limit: TimeLimitExceeded",
                                          "was running: True", "aborted: Aborted"]
    assert code == 0, worker.log()[-3000:]
