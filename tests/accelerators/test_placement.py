"""The placement (csrc/accel_placement_rescue.c: placement_before_sleep, placement_step_aside;
free-threaded builds only): ahead of a pre-armed deadline the watchdog moves to the guarded
thread's CPU, and goes back to its own CPU set once nothing is pre-armed. Reads its counter and
the watchdog's affinity; skipped where it is off."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

import timeoutcore

from . import accelerated, native_only, stats

pytestmark = [native_only, accelerated("placement")]


def _spin_until_expired(scope: Any) -> None:
    while not scope.expired():  # its own frame (cpython#130279: conftest.burn)
        pass


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs two CPUs to move between")
def test_the_watchdog_awaits_a_deadline_on_the_threads_cpu_then_goes_back() -> None:
    from timeoutcore import _native  # the watchdog's thread id

    own = os.sched_getaffinity(0)
    before = stats()["pins"]
    for _ in range(5):  # one would do on an idle machine; a loaded one may skip a move
        with timeoutcore.thread_deadline(0.05, raise_on_timeout=False) as s:
            _spin_until_expired(s)
        assert s.expired()
        if stats()["pins"] > before:
            break
    assert stats()["pins"] > before, "the watchdog never moved to the thread's CPU"
    # with nothing pre-armed left it runs on its own CPU set again
    wd = _native.watchdog_native_id()
    assert wd > 0
    end = time.monotonic() + 5
    while os.sched_getaffinity(wd) != own and time.monotonic() < end:
        time.sleep(0.01)
    assert os.sched_getaffinity(wd) == own
