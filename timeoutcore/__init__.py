"""timeoutcore: hard time limits for any Python thread.

``with thread_deadline(0.25): ...`` stops the block at 0.25 s with ``DeadlineExceeded``
in the thread that runs it -- a pool worker as well as the main thread.
"""

from __future__ import annotations

from ._engine import ENGINE
from .errors import DeadlineExceeded, SoftDeadlineExceeded
from .scope import (
    DeadlineScope,
    checkpoint,
    current_scope,
    remaining,
    shield,
    sleep,
    thread_deadline,
    thread_deadline_at,
)

__version__ = "0.1.0"

__all__ = [
    "ENGINE",
    "DeadlineExceeded",
    "DeadlineScope",
    "SoftDeadlineExceeded",
    "checkpoint",
    "current_scope",
    "remaining",
    "shield",
    "sleep",
    "thread_deadline",
    "thread_deadline_at",
    "__version__",
]
