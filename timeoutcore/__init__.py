"""timeoutcore: hard time limits for any Python thread.

``with thread_deadline(0.25): ...`` stops the block at 0.25 s with ``DeadlineExceeded``
in the thread that runs it -- a pool worker as well as the main thread.
"""

from __future__ import annotations

from . import metrics
from ._engine import ENGINE
from .blocking import acquire, bounded_wait, socket_timeout, wait_readable, wait_writable
from .errors import DeadlineCancelled, DeadlineExceeded, SoftDeadlineExceeded
from .executor import DeadlineExecutor
from .metrics import Metrics
from .patch import is_patched, patch, patched_targets, unpatch
from .policy import DeadlinePolicy, PolicyTable, set_policy_table
from .results import DeadlineResult, ResultLog
from .subprocess import RunResult, run
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


def set_default_result_log(result_log: "ResultLog | None") -> None:
    """Append the result of *every* guarded block to ``result_log`` (None: stop)."""
    from ._hooks import set_default_result_log as _set

    _set(result_log)


__all__ = [
    "ENGINE",
    "DeadlineCancelled",
    "DeadlineExceeded",
    "DeadlineExecutor",
    "DeadlinePolicy",
    "DeadlineResult",
    "DeadlineScope",
    "Metrics",
    "PolicyTable",
    "ResultLog",
    "RunResult",
    "SoftDeadlineExceeded",
    "acquire",
    "bounded_wait",
    "checkpoint",
    "current_scope",
    "is_patched",
    "metrics",
    "patch",
    "patched_targets",
    "remaining",
    "run",
    "set_default_result_log",
    "set_policy_table",
    "shield",
    "sleep",
    "socket_timeout",
    "thread_deadline",
    "thread_deadline_at",
    "unpatch",
    "wait_readable",
    "wait_writable",
    "__version__",
]
