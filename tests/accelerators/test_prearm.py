"""The pre-arm (csrc/accel_prearm.c: prearm_ahead, prearm_on_enter): ahead of a deadline the
watchdog arms the delivery hook and lets the thread run on, so it fires its deadline
itself; a block that ends first takes the hook back. Reads its counters and lead; skipped
where it is off."""

from __future__ import annotations

import sys
import time

import pytest
from conftest import FREE_THREADED, LATE, burn

import timeoutcore
from timeoutcore import DeadlineExceeded

from . import accelerated, core, native_only, stats

pytestmark = [native_only, accelerated("prearm")]



#: The watchdog pre-arms the hook ahead of a deadline always with 3.11's per-thread tracer
#: and free-threaded, and on 3.12+ with a GIL only when the GIL came quickly, as it does in
#: these tests' otherwise quiet process (csrc/tc_tuning.h: TC_PREARM_ALWAYS,
#: TC_PREARM_QUIET_NS) -- and how early: the GIL anticipation's lead, or free-threaded at least 10 ms (twice the
#: recent cost of switching the delivery events on, which stops the world).
PREARM_LEAD = 0.010 if FREE_THREADED else 200e-6 + 800e-6


def _asleep_past_the_lead(scope: timeoutcore.DeadlineScope) -> None:
    """Sleep (without the GIL) until half a lead before the scope's deadline."""
    time.sleep(max(0.0, scope.when() - PREARM_LEAD / 2 - time.monotonic()))


def test_a_prearmed_thread_fires_its_own_deadline() -> None:
    """Ahead of the deadline the watchdog arms the hook and lets the thread run on; the
    thread fires the deadline itself at its first line past it, waiting neither for the
    watchdog nor for the GIL. (A watchdog late on a loaded machine fires the usual way;
    one trial that fires itself shows the path works: the trials go on until one has.)"""
    before = stats()
    trials = 0
    # The cap: a pre-armed thread that never fires itself fails, never hangs.
    while trials < 20 or (stats()["self_fires"] == before["self_fires"] and trials < 100):
        trials += 1
        scope = timeoutcore.thread_deadline(0.03)
        with pytest.raises(DeadlineExceeded):
            with scope:
                _asleep_past_the_lead(scope)
                burn(5)
        assert scope.overshoot is not None and scope.overshoot < LATE
    after = stats()
    assert after["prearms"] > before["prearms"]
    assert after["self_fires"] > before["self_fires"], (before, after)
    assert after["hooked_now"] == 0


def test_a_block_that_ends_after_the_prearm_leaves_no_hook_armed() -> None:
    """A block that ends between the pre-arm and its deadline takes the armed hook back
    at its exit (it would otherwise slow the thread, and on 3.12+ every thread, from then
    on): no thread keeps a hook armed, and nothing fires.
    Each trial ends a quarter of a lead before its deadline; one descheduled past it
    overruns and fires, and one that ended before the watchdog got to pre-arm it shows
    nothing: the trials go on until a few have ended early after their pre-arm."""
    before = stats()
    wanted, ended_early, trials = 5, 0, 0
    while ended_early < wanted and trials < 300:  # the cap: a broken pre-arm fails, never hangs
        trials += 1
        scope = timeoutcore.thread_deadline(0.03)
        prearms = stats()["prearms"]
        try:
            with scope:
                _asleep_past_the_lead(scope)
                _spin_until(scope.when() - PREARM_LEAD / 4)
        except DeadlineExceeded:  # descheduled at the wrong moment: it overran
            continue
        ended_early += stats()["prearms"] > prearms  # pre-armed, then ended before the deadline
    after = stats()
    assert ended_early >= wanted, (trials, before, after)
    assert after["prearms"] > before["prearms"], (before, after)
    assert after["hooked_now"] == 0  # broken: the hook of a block that ended stays armed


def _spin_until(t: float) -> None:
    while time.monotonic() < t:
        pass


def test_the_prearm_lead_follows_the_cost_of_switching_events() -> None:
    """Free-threaded, the watchdog pre-arms twice the recent cost of switching the
    delivery events on (a stop of the world) ahead, 10 to 50 ms; with a GIL it pre-arms
    within the GIL anticipation (0 here). 3.12+ measure the switch: after a deadline
    fired it is not 0."""
    with pytest.raises(DeadlineExceeded):
        with timeoutcore.thread_deadline(0.01):
            burn(5)
    lead, cost = core()._events_cost()
    if FREE_THREADED:
        assert lead == pytest.approx(min(max(2 * cost, 0.010), 0.050))
    else:
        assert lead == 0.0
    if sys.version_info >= (3, 12):
        assert cost > 0.0
    else:
        assert cost == 0.0  # 3.11's per-thread tracer has no events to switch
