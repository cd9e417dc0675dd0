"""scope.cancel(): stop a block from another thread, told apart from an expired deadline."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from conftest import LATE, spin_forever

import timeoutcore

from timeoutcore.errors import DeadlineCancelled, DeadlineExceeded
from timeoutcore.results import status_of


def test_cancel_from_another_thread_stops_a_cpu_loop(api: Any, where: Any) -> None:
    scope = api.thread_deadline(30, label="job")
    timer = threading.Timer(0.1, scope.cancel)

    def body() -> float:
        timer.start()
        with pytest.raises(DeadlineCancelled) as info:
            with scope:
                spin_forever()
        assert isinstance(info.value, DeadlineExceeded)
        assert "cancelled" in str(info.value) and info.value.label == "job"
        return time.monotonic()

    start = time.monotonic()
    stopped = where(body)
    timer.join()
    assert 0.1 <= stopped - start < 0.1 + LATE
    assert scope.cancelled() and scope.expired()
    assert status_of(scope) == "cancelled"


def test_cancel_wakes_timeoutcore_sleep(api: Any) -> None:
    scope = api.thread_deadline(30)
    threading.Timer(0.1, scope.cancel).start()
    start = time.monotonic()
    with pytest.raises(DeadlineCancelled):
        with scope:
            api.sleep(30)
    assert time.monotonic() - start < 0.1 + LATE


def test_cancel_before_entry_stops_at_entry(api: Any) -> None:
    scope = api.thread_deadline(30)
    scope.cancel()
    ran = []
    with pytest.raises(DeadlineCancelled):
        with scope:
            ran.append(1)
            spin_forever()
    assert status_of(scope) == "cancelled"
    if api.name != "fallback":  # the native core raises at the block's first line
        assert ran == []


@pytest.mark.parametrize("body", ["pass", "append"])
def test_a_block_entered_past_its_deadline_always_ends_exceeded(api: Any, body: str) -> None:
    """Cancelled before entry, or a deadline already past: the block ends with the
    exception however quick it is (it used to be left to the watchdog's next pass, so
    a quick block ended normally, 500 times out of 500). The native core stops it
    before its first line; the fallback engine raises at the exit at the latest."""
    ran: list[int] = []

    def block(scope: Any) -> None:
        with scope:
            if body == "append":
                ran.append(1)

    for _ in range(50):
        cancelled = api.thread_deadline(30)
        cancelled.cancel("why")
        with pytest.raises(DeadlineCancelled) as info:
            block(cancelled)
        assert info.value.reason == "why" and status_of(cancelled) == "cancelled"
        past = api.thread_deadline_at(time.monotonic() - 1.0)
        with pytest.raises(DeadlineExceeded) as plain:
            block(past)
        assert type(plain.value) is DeadlineExceeded and status_of(past) == "timed_out"
    if api.name != "fallback":
        assert ran == []
    assert api.current_scope() is None


def test_cancel_after_exit_or_expiry_changes_nothing(api: Any) -> None:
    done = api.thread_deadline(30)
    with done:
        pass
    done.cancel()
    assert not done.cancelled() and status_of(done) == "completed"
    expired = api.thread_deadline(0.02)
    with pytest.raises(DeadlineExceeded) as info:
        with expired:
            spin_forever()
    assert type(info.value) is DeadlineExceeded
    expired.cancel()
    assert not expired.cancelled() and status_of(expired) == "timed_out"


def test_cancelling_an_outer_scope_stops_the_inner_block(api: Any) -> None:
    outer = api.thread_deadline(30, label="outer")
    threading.Timer(0.1, outer.cancel).start()
    with pytest.raises(DeadlineCancelled) as info:
        with outer:
            with api.thread_deadline(20, label="inner"):
                spin_forever()
    assert info.value.label == "outer"


@pytest.mark.skipif(timeoutcore.ENGINE != "native", reason="the native core's fire path")
def test_cancel_from_another_thread_fires_before_it_returns() -> None:
    """cancel() from another thread fires the block right there (the caller holds the GIL,
    or the core lock), rather than leaving it to the watchdog, which would first have to
    win the GIL from the busy threads; the interrupt still surfaces in the block's own
    thread, at its next safe line."""
    scope = timeoutcore.thread_deadline(30)
    entered = threading.Event()
    outcome: list[BaseException] = []

    def body() -> None:
        try:
            with scope:
                entered.set()
                spin_forever()
        except DeadlineExceeded as exc:
            outcome.append(exc)

    t = threading.Thread(target=body)
    t.start()
    assert entered.wait(10)
    scope.cancel("now")
    fired = scope.fired_at  # read before this thread lets the GIL go
    t.join(10)
    assert fired is not None  # broken: None, the watchdog fires later
    assert len(outcome) == 1 and isinstance(outcome[0], DeadlineCancelled)
    assert outcome[0].reason == "now"
