"""The direct delivery (csrc/accel_direct_delivery.c: direct_delivery_try; 3.11 and 3.12): a thread
paused at its loop's back-edge meets an asynchronous exception first thing when it has the
GIL back, so its interrupt is decided from outside and sent without arming the hook -- but
never into protected code. Reads the delivery counters; skipped where it is off. What the
thread goes through (stopped, every exit run) is test_integrity.py's, on every path."""

from __future__ import annotations

import threading

import pytest
from test_integrity import _cancelled_at_back_edge, _free

from . import accelerated, native_only, stats

pytestmark = [native_only, accelerated("direct_delivery")]


def test_protected_code_on_the_paused_threads_stack_is_left_to_the_hook() -> None:
    """The outside check sees protected code on the paused thread's stack: nothing is sent
    directly; the hook delivers once the protected call has returned."""
    lock = threading.Lock()
    before = stats()
    assert _cancelled_at_back_edge("protected", lock) == ["left the protected call", "stopped"]
    assert _free(lock)
    after = stats()
    assert after["direct_raises"] == before["direct_raises"]
    assert after["hook_raises"] > before["hook_raises"]


@pytest.mark.parametrize("shape", ["while", "one-line", "for"])
def test_a_thread_paused_at_a_back_edge_gets_its_interrupt_directly(shape: str) -> None:
    """Each cancel of a thread paused at its back-edge is sent directly, none by the hook;
    every exit still runs."""
    lock = threading.Lock()
    before = stats()
    for _ in range(3):
        assert _cancelled_at_back_edge(shape, lock) == ["stopped"]
        assert _free(lock)
    after = stats()
    sent = after["direct_raises"] - before["direct_raises"]
    hooked = after["hook_raises"] - before["hook_raises"]
    assert sent == 3 and hooked == 0, (sent, hooked)
