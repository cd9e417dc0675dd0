"""The prepared exception (csrc/accel_prepare.c: prepare_before_due): ahead of a deadline the
watchdog builds the scope's DeadlineExceeded (free-threaded: the thread itself, once pre-armed,
prepare_in_thread); the exit takes its figures again, and a reschedule or a cancel drops it.
Reads the scope's ``_prepared`` and the counter; skipped where it is off."""

from __future__ import annotations

import time
from typing import Any

import pytest
from conftest import burn

import timeoutcore
from timeoutcore import DeadlineExceeded

from . import accelerated, native_only, stats

pytestmark = [native_only, accelerated("prepare")]



def _prepared_by_deadline(scope: timeoutcore.DeadlineScope) -> bool:
    """Spin until the scope's exception is prepared (True) or its deadline has passed
    (False). The loop lives in its own frame on purpose (conftest.burn, cpython#130279):
    the deadline may be raised at its back-edge."""
    due = scope.when()
    while scope._prepared is None:
        if time.monotonic() >= due:
            return False
    return True


def test_the_exception_is_prepared_ahead_and_the_exit_takes_its_figures_again() -> None:
    """Ahead of a deadline the scope's DeadlineExceeded is built (built at the exit, after
    a long spin, its code is cold): by the watchdog, or free-threaded by the thread itself
    -- at the self-fire's trigger, or at its first hook event once pre-armed. The exit runs its constructor again, so the
    block gets what a new one says of the exited scope, never the figures of the moment it
    was prepared. A prepare that did not come before the deadline (a loaded machine)
    leaves a trial that shows only the exit's own exception: the trials go on until a few
    were prepared ahead of their deadline."""
    before = stats()
    wanted = 3
    prepared = trials = 0
    # The cap: a watchdog that never prepares fails, never hangs.
    while (prepared < wanted or trials < 5) and trials < 100:
        trials += 1
        scope = timeoutcore.thread_deadline(0.03, label="prepared")
        with pytest.raises(DeadlineExceeded) as info:
            with scope:
                prepared += _prepared_by_deadline(scope)
                burn(5)
        e, fresh = info.value, DeadlineExceeded(scope)
        assert type(e) is DeadlineExceeded and e.scope is scope
        assert (str(e), e.label, e.limit, e.elapsed, e.overshoot) == (
            str(fresh), "prepared", 0.03, fresh.elapsed, fresh.overshoot)
        assert scope._prepared is None  # taken by the exit
    after = stats()
    assert prepared >= wanted, (trials, prepared)
    assert after["prepared"] > before["prepared"], (before, after)


def test_a_prepared_exception_follows_a_reschedule_and_a_cancel() -> None:
    """A reschedule (and so a cancel) drops what was prepared for the old deadline; and a scope found cancelled at its exit gets a DeadlineCancelled, never the
    prepared DeadlineExceeded -- the state a cancel() leaves when it meets the exit between
    setting its flag and its reschedule, set here by hand. (A trial whose deadline comes
    before the prepare is seen, on a loaded machine, proves nothing and is not counted:
    the trials go on until enough of each kind were.)"""
    dropped = reported = trials = 0
    # The cap: a prepare that is never dropped, or a cancel never reported, fails, never hangs.
    while (reported < 5 or dropped < 5) and trials < 400:
        trials += 1
        scope = timeoutcore.thread_deadline(0.02)
        scope_any: Any = scope
        try:
            with scope:
                if _prepared_by_deadline(scope):
                    if trials % 2:
                        old = scope._prepared
                        scope.reschedule(time.monotonic() + 0.02)
                        # gone, or (free-threaded) built again for the new deadline
                        dropped += scope._prepared is not old
                        scope.reschedule(time.monotonic())  # fire now
                    else:
                        scope_any._cancelled = True
                burn(5)
        except DeadlineExceeded as e:
            if getattr(scope, "_cancelled", False):
                assert type(e) is timeoutcore.DeadlineCancelled, type(e)
                reported += 1
    assert reported >= 5 and dropped >= 5, (trials, dropped, reported)
