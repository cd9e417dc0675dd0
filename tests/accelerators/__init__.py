"""Tests of the latency accelerators' mechanisms: one module per accelerator,
``test_<name>.py``, beside the switch tests (tests/test_accelerators.py).

The rule of the suite: a test elsewhere pins what a user sees (the exception, where it
surfaced, how late within a generous bound, the thread free, no timer left) and passes with
``TIMEOUTCORE_ACCEL=none``; only these modules read an accelerator's counters
(``timeoutcore._native.stats()``) or its internal state, so a change to a heuristic edits
the accelerator's own tests and nothing else. Each test here is skipped where its
accelerator is off (:func:`accelerated`). Counts of live resources (``timers_live``,
``slots_live``, ``hooked_now``: what exists now, not which path ran) are ownership facts and
may be read anywhere.

A package (``accelerators.test_<name>``), so its module names cannot clash with the suite's
top-level ones; tests/conftest.py is still importable as ``conftest``.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest

import timeoutcore

#: The whole package is the native core's: the pure-Python engine has no accelerators.
native_only = pytest.mark.skipif(timeoutcore.ENGINE != "native", reason="native core only")


def accelerated(name: str) -> pytest.MarkDecorator:
    """For a test of one accelerator's mechanism (it reads that accelerator's counters):
    skipped where that accelerator is off (TIMEOUTCORE_ACCEL, this CPython, the pure-Python
    engine), saying which."""
    why = timeoutcore.accelerators(explain=True)
    if name not in why:
        raise ValueError(f"accelerated(): no accelerator named {name!r}")
    return pytest.mark.skipif(why[name] is not None,
                              reason=f"a test of the {name} accelerator, off: {why[name]}")


def stats() -> dict[str, int]:
    """The native core's counters (a fresh copy)."""
    from timeoutcore import _native

    return _native.stats()


def core() -> Any:
    """The C module itself (``_engine.core`` is the Engine interface)."""
    from timeoutcore import _native

    return _native.core


def running_watchdog() -> int:
    """Start the watchdog (a block with a deadline) and return its kernel thread id."""
    from timeoutcore import _native

    with timeoutcore.thread_deadline(10):
        pass
    give_up = time.monotonic() + 5
    while (wd := _native.watchdog_native_id()) == 0 and time.monotonic() < give_up:
        time.sleep(0.001)
    assert wd != 0
    return wd


def spin_for(seconds: float) -> None:
    """A CPU loop whose back-edge is a plain jump, where the self-fire raises at once (a
    ``while <cond>:`` loop goes through the hook on 3.12+, 0.5 ms or more later)."""
    end = time.monotonic() + seconds
    for i in itertools.count():
        if not i & 63 and time.monotonic() >= end:
            return
