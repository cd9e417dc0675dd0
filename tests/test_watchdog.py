"""The native watchdog: how early it asks for the GIL, and how many threads it serves."""

from __future__ import annotations

import sys
import threading
import time

import pytest

import timeoutcore
from timeoutcore import DeadlineExceeded

pytestmark = pytest.mark.skipif(timeoutcore.ENGINE != "native", reason="native core only")


def _core():  # type: ignore[no-untyped-def]
    from timeoutcore import _native

    return _native.core  # the C module itself (_engine.core is the Engine interface)


def _expected_anticipation() -> tuple[float, float]:
    interval = sys.getswitchinterval()
    if sys.version_info < (3, 12):
        return min(interval, 200e-6) + 300e-6, min(interval, 200e-6)
    return interval + 1e-3, interval


def test_anticipation_follows_the_switch_interval() -> None:
    """The watchdog asks for the GIL one switch interval + a margin early. On 3.11 it
    lowers the interval to 200 us while it waits, so it asks only 0.5 ms early (this
    branch was once compiled out by a macro tested before its definition)."""
    # The watchdog re-reads the interval each time it has acted; a deadline the thread
    # raised by itself (the watchdog late on a loaded machine) may leave the previous
    # reading for a moment, so look again after a few more fires. A wrong formula never
    # matches.
    seen = None
    for _ in range(20):
        with pytest.raises(DeadlineExceeded):
            with timeoutcore.thread_deadline(0.005):
                timeoutcore.sleep(1)
        seen = _core()._anticipation()
        if seen == pytest.approx(_expected_anticipation()):
            break
    assert seen == pytest.approx(_expected_anticipation())


def test_every_thread_due_at_once_is_stopped() -> None:
    """More threads reach their deadline in the same instant than the watchdog once
    pruned per round (64): each one is stopped."""
    n = 80
    barrier = threading.Barrier(n)
    outcome: dict[int, str] = {}

    def worker(i: int) -> None:
        barrier.wait()
        t0 = time.monotonic()
        try:
            with timeoutcore.thread_deadline_at(deadline):
                timeoutcore.sleep(30)
            outcome[i] = "ran to the end"
        except DeadlineExceeded:
            outcome[i] = "stopped" if time.monotonic() - t0 < 10 else "late"

    deadline = time.monotonic() + 0.5
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert [outcome.get(i) for i in range(n)] == ["stopped"] * n
