"""The with statement's frame known by its address (csrc/accel_frame_address.c): a block's
entry makes no frame object and holds none, and the delivery hook still knows the frame as
the bound of its protected-code walk, whenever its frame object was made. Skipped where it
is off (3.13 and 3.15+, TIMEOUTCORE_ACCEL, a failed import check)."""

from __future__ import annotations

import sys
import time
from contextlib import nullcontext
from typing import Any, Optional

import pytest
from conftest import burn

from timeoutcore import DeadlineExceeded, thread_deadline

from . import accelerated, native_only

pytestmark = [native_only, accelerated("frame_address")]


def _frame_refs(cm: Any) -> int:
    """References to this frame's object, taken inside the block of `cm`."""
    with cm:
        frame = sys._getframe()
        return sys.getrefcount(frame)


def test_a_block_holds_no_reference_to_its_frame() -> None:
    """The core holds the with statement's frame object while the block runs; this
    accelerator knows the frame by address and holds nothing: inside the block the frame
    object has the references it has inside any other with statement."""
    plain = _frame_refs(nullcontext())
    assert _frame_refs(thread_deadline(10)) == plain
    assert _frame_refs(thread_deadline(None)) == plain


class _Cleanup:
    """An exit that opens a scope of its own: code named __exit__ is protected wherever it
    runs, but not inside a block it opened itself. The walk stops at the block's frame --
    the one this accelerator knows by address."""

    def __init__(self, make_frame_object: Optional[str]) -> None:
        self.make = make_frame_object

    def __enter__(self) -> "_Cleanup":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.make == "before":
            sys._getframe()
        with thread_deadline(0.05):
            if self.make == "after":
                sys._getframe()
            burn(10.0)


@pytest.mark.parametrize("make", [None, "before", "after"],
                         ids=["at-delivery", "before-entry", "after-entry"])
def test_the_block_is_known_whenever_its_frame_object_was_made(make: Optional[str]) -> None:
    """The frame object made before the entry, after it, or only by the delivery hook's
    walk: each time the interrupt surfaces in the block inside __exit__."""
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        with _Cleanup(make):
            pass
    assert time.monotonic() - t0 < 5.0
