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


def test_anticipation_follows_the_switch_interval() -> None:
    """The watchdog asks for the GIL one switch interval + a margin early. On 3.11 it
    lowers the interval to 200 us while it waits, so it asks only 0.5 ms early (this
    branch was once compiled out by a macro tested before its definition)."""
    with timeoutcore.thread_deadline(0.01):
        pass  # starts the watchdog, which reads the switch interval
    with pytest.raises(DeadlineExceeded):
        with timeoutcore.thread_deadline(0.01):
            timeoutcore.sleep(1)  # one fire: the watchdog re-reads it after acting
    lead, switch = _core()._anticipation()
    interval = sys.getswitchinterval()
    if sys.version_info < (3, 12):
        assert switch == pytest.approx(min(interval, 200e-6))
        assert lead == pytest.approx(switch + 300e-6)
    else:
        assert switch == pytest.approx(interval)
        assert lead == pytest.approx(interval + 1e-3)


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
