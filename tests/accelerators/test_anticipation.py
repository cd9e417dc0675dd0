"""The GIL anticipation (csrc/accel_anticipation.c: anticipation_refresh, anticipation_lead):
the watchdog asks for the GIL one switch interval plus a margin ahead of a deadline, and earlier
in a crowded process. Reads its state through ``_anticipation()``; skipped where it is off."""

from __future__ import annotations

import sys
import time

import pytest
from conftest import FREE_THREADED, burn, spinning_threads

import timeoutcore
from timeoutcore import DeadlineExceeded

from . import accelerated, core, native_only, stats

pytestmark = [native_only, accelerated("anticipation")]



def _expected_anticipation(crowd: float) -> tuple[float, float, float]:
    """(lead, switch, crowd) for the crowd the watchdog reports: the lead grows by how much
    longer than one switch interval it has lately waited for the GIL, 3 ms at most."""
    if FREE_THREADED:  # nothing to wait for: the watchdog acts at the deadline itself
        return 0.0, 0.0, crowd
    interval = sys.getswitchinterval()
    margin = 800e-6  # pre-arming takes the GIL only for a moment
    return min(interval, 200e-6) + margin + min(crowd, 3e-3), min(interval, 200e-6), crowd


def test_anticipation_follows_the_switch_interval() -> None:
    """The watchdog asks for the GIL one switch interval + a margin early. It lowers the
    interval to 200 us while it waits (the fast window, every CPython with a GIL), so it
    asks only 1 ms early (this branch was once compiled out by a macro tested before its
    definition)."""
    # The watchdog re-reads the interval each time it has acted; a deadline the thread
    # raised by itself (the watchdog late on a loaded machine) may leave the previous
    # reading for a moment, so look again after a few more fires. A wrong formula never
    # matches.
    seen = None
    for _ in range(20):
        with pytest.raises(DeadlineExceeded):
            with timeoutcore.thread_deadline(0.005):
                timeoutcore.sleep(1)
        seen = core()._anticipation()
        if seen == pytest.approx(_expected_anticipation(seen[2])):
            break
    assert seen == pytest.approx(_expected_anticipation(seen[2]))
    # A quiet process: the GIL is free, so the watchdog waits only for a CPU. The bound is
    # generous, not a latency figure: the average still carries earlier tests' crowded
    # waits, and a loaded machine delays the watchdog's own thread. Broken: a negative wait,
    # or one in the wrong unit (nanoseconds taken for microseconds: a thousand times more).
    assert 0.0 <= seen[2] < 0.1


def _crowded(trials: int) -> tuple[dict[str, int], dict[str, int]]:
    """``trials`` 20 ms deadlines on a CPU loop next to 3 spinning threads; the counters
    before and after."""
    with spinning_threads(3):
        before = stats()
        for _ in range(trials):
            with pytest.raises(DeadlineExceeded):
                with timeoutcore.thread_deadline(0.02):
                    burn(5)
        after = stats()
    assert after["fires"] - before["fires"] >= trials
    return before, after


@pytest.mark.skipif(FREE_THREADED, reason="no GIL to anticipate")
@pytest.mark.skipif(timeoutcore.accelerators()["self_fire"], reason="the self-fire on: the "
                    "watchdog takes no GIL ahead in a crowded process (test_self_fire.py)")
def test_a_crowded_process_gets_an_earlier_watchdog() -> None:
    """With other threads queued for the GIL the watchdog waits longer than one switch
    interval for it, so it learns to ask earlier (the lead grows by that wait: it is at
    the deadline in time)."""
    _crowded(40)
    # No deadline is due any more, but the watchdog may still be finishing its last round:
    # it learns the crowd when the GIL comes and sets the lead from it at the round's end,
    # and in between it may run Python (the hook's drain), which lets this thread read the
    # one already changed and the other not yet.
    # A round ends within milliseconds; a lead that never follows the crowd never agrees.
    give_up = time.monotonic() + 2
    while True:
        lead, switch, crowd = core()._anticipation()
        if lead == pytest.approx(switch + 800e-6 + min(crowd, 3e-3)) or time.monotonic() > give_up:
            break
        time.sleep(0.01)
    assert crowd > 0.0  # broken: 0, the lead never grows
    assert lead == pytest.approx(switch + 800e-6 + min(crowd, 3e-3))
