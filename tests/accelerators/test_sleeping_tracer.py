"""3.11's sleeping tracer (csrc/accel_sleeping_tracer.c: sleeping_tracer_sleep): the tracer a
pre-arm puts in place sleeps until the deadline, when the thread's own timer signal wakes it.
Reads its counters; skipped where it is off (it exists on 3.11 only)."""

from __future__ import annotations

import itertools
import time

import pytest
from conftest import LATE, burn
from test_watchdog import NEAR

import timeoutcore
from timeoutcore import DeadlineExceeded

from . import accelerated, native_only, stats

pytestmark = [native_only, accelerated("sleeping_tracer")]



def _count(seconds: float, cell: list[int]) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        cell[0] += 1


def test_a_prearmed_tracer_sleeps_until_the_deadline() -> None:
    """With a tracer set, 3.11 sends every instruction of the thread down its tracing path:
    a CPU loop runs at about a quarter of its speed. So the tracer a pre-arm puts in place
    sleeps until the deadline: blocks whose deadline is near enough to be pre-armed at
    their entry, and which end before it, run their loop as fast as the same loop without
    a deadline (alternated trials; awake, the ratio was ~0.25), and no alarm goes off.
    A block descheduled past its deadline overruns and is not counted: the trials go on
    until enough blocks have ended in time (capped: a tracer that never lets one end in
    time fails)."""
    before = stats()
    cells = {"plain": [0], "armed": [0]}
    secs = {"plain": 0.0, "armed": 0.0}
    slept = 0
    for i in range(4000):
        if slept >= 100:
            break
        mode = "armed" if i % 2 else "plain"
        cell = [0]
        t0 = time.perf_counter()
        if mode == "plain":
            _count(0.0003, cell)
        else:
            try:
                with timeoutcore.thread_deadline(NEAR):
                    _count(0.0003, cell)
                slept += 1
            except DeadlineExceeded:  # descheduled past the deadline: not counted
                continue
        secs[mode] += time.perf_counter() - t0
        cells[mode][0] += cell[0]
    after = stats()
    assert slept >= 100, (slept, before, after)
    ratio = (cells["armed"][0] / secs["armed"]) / (cells["plain"][0] / secs["plain"])
    assert after["tracer_sleeps"] - before["tracer_sleeps"] >= slept, (before, after)
    assert ratio > 0.6, ratio
    assert after["hooked_now"] == 0


@pytest.mark.parametrize("shape", ["loop", "called from C"])
def test_a_sleeping_tracer_is_woken_at_the_deadline(shape: str) -> None:
    """At the deadline the thread's own timer signal wakes its tracer -- in the innermost
    eval loop, which may be one that C code called (map() calling a Python function: a
    loop of its own) -- and the thread fires at its next line: the block stops close to
    its deadline, the alarms are counted, and no hook stays armed."""
    before = stats()
    for _ in range(10):
        scope = timeoutcore.thread_deadline(NEAR)
        with pytest.raises(DeadlineExceeded):
            with scope:
                if shape == "loop":
                    burn(2)
                else:
                    sum(map(burn, itertools.repeat(0.001, 2000)))
        assert scope.overshoot is not None and scope.overshoot < LATE
    after = stats()
    assert after["tracer_alarms"] > before["tracer_alarms"], (before, after)
    assert after["hooked_now"] == 0
