"""Quiet the report of an interrupt that CPython dropped in an unraisable context.

A weakref callback, a finalizer or a GC callback runs where an exception cannot propagate:
CPython passes it to ``sys.unraisablehook``, which prints "Exception ignored in ...", and
drops it. When that exception is the core's internal interrupt, the core has already
learned the callback (no later delivery lands there) and sent the interrupt again for the
block's next safe point (``csrc/tc_unraisable.c``, from the ``sys.unraisablehook`` audit
event, which fires whatever hook is installed). The report would only show the library's
own bookkeeping, so the hook installed here drops it and passes everything else on to the
hook that was in place.

Rule: the wrapper forwards to the hook it found at install time, and steps aside if
somebody installs another one later (pytest does, per session): then the report is
printed by that hook; the deadline is enforced all the same.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from .errors import _DeadlineInterrupt

_Hook = Callable[[Any], object]


class _QuietInterrupts:
    """``sys.unraisablehook`` that drops reports of the internal interrupt."""

    def __init__(self, chained: _Hook) -> None:
        self.chained = chained

    def __call__(self, unraisable: Any) -> None:
        exc_type = getattr(unraisable, "exc_type", None)
        if isinstance(exc_type, type) and issubclass(exc_type, _DeadlineInterrupt):
            return
        self.chained(unraisable)


def install() -> None:
    """Wrap the current ``sys.unraisablehook`` (once; idempotent)."""
    if not isinstance(sys.unraisablehook, _QuietInterrupts):
        sys.unraisablehook = _QuietInterrupts(sys.unraisablehook)
