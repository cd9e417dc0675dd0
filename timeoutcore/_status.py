"""How a guarded block ended, read from the exited scope itself (no pydantic on this path:
metrics count it for every block)."""

from __future__ import annotations

import threading
from typing import Any, Literal, Optional

from .errors import DeadlineExceeded, _DeadlineInterrupt

#: The status of a guarded block; ``timed_out`` is the one of a block stopped at its limit.
Status = Literal["completed", "soft_exceeded", "timed_out", "cancelled", "error"]


def status_of(scope: Any) -> Status:
    """``timed_out`` / ``cancelled`` / ``error`` / ``soft_exceeded`` / ``completed`` for an
    exited scope."""
    if scope.expired():
        return "cancelled" if getattr(scope, "_cancelled", False) else "timed_out"
    exc = scope.exit_exception
    if exc is not None and not isinstance(exc, (DeadlineExceeded, _DeadlineInterrupt)):
        return "error"
    if getattr(scope, "_soft_fired", False):
        return "soft_exceeded"
    return "completed"


def thread_name(ident: Optional[int]) -> Optional[str]:
    """The name of the live thread ``ident`` (a scope's ``thread_ident``), or None."""
    thread = threading._active.get(ident) if ident is not None else None  # type: ignore[attr-defined]
    return thread.name if thread is not None else None
