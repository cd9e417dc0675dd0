"""The exceptions of timeoutcore.

Inside a guarded block the deadline arrives as :class:`_DeadlineInterrupt`, a
``BaseException`` that ``except Exception:`` cannot swallow; the scope whose deadline
fired claims it at its exit and raises the public :class:`DeadlineExceeded` (a
``TimeoutError``) in its place.
"""

from __future__ import annotations

from typing import Any, Optional


class _DeadlineInterrupt(BaseException):
    """Internal: raised inside a block whose deadline fired.

    Never catch it; it becomes :class:`DeadlineExceeded` at the scope boundary. If a body
    swallows it anyway, it is raised again until the block exits. One the body catches and
    keeps, to raise it later (a hook caller handing it on), is not raised again while it is
    kept, for up to about a second.
    """


class DeadlineExceeded(TimeoutError):
    """A ``thread_deadline`` block ran past its deadline and was interrupted.

    Attributes (a snapshot taken when the block was left):
    ``scope`` the scope that fired (``None`` once pickled), ``label``, ``limit`` (seconds or
    ``None`` for an absolute deadline), ``elapsed`` (seconds from entry to exit) and
    ``overshoot`` (seconds between the deadline and the moment the block was left).
    """

    scope: Any
    label: Optional[str]
    limit: Optional[float]
    elapsed: float
    overshoot: Optional[float]
    #: Why the block was cancelled (``scope.cancel(reason)``, ``cancel_all(reason)``);
    #: None for a deadline, or a cancel without a reason.
    reason: Optional[str] = None

    def __new__(cls, scope: Any = None, *args: Any) -> DeadlineExceeded:
        # A scope stopped by ``cancel()`` is reported as the subclass DeadlineCancelled,
        # whoever builds the exception (the C core calls DeadlineExceeded(scope)).
        if cls is DeadlineExceeded and getattr(scope, "_cancelled", False):
            cls = DeadlineCancelled
        return super().__new__(cls)  # args are set by __init__

    def __init__(self, scope: Any) -> None:
        self.scope = scope
        self.label = scope.label
        self.limit = scope.limit
        self.elapsed = scope.elapsed()
        self.overshoot = scope.overshoot
        name = f" {self.label!r}" if self.label is not None else ""
        limit = f"{self.limit:g} s " if self.limit is not None else ""
        over = f", {self.overshoot * 1e3:.3f} ms late" if self.overshoot is not None else ""
        if isinstance(self, DeadlineCancelled):
            self.reason = getattr(scope, "_cancel_reason", None)
            why = f" ({self.reason})" if self.reason else ""
            message = f"block{name} cancelled{why}: left after {self.elapsed:.6f} s"
        else:
            message = (
                f"deadline{name} exceeded: {limit}limit, block left after {self.elapsed:.6f} s"
                f"{over}"
            )
        # Set directly: with __new__ overridden, OSError's __init__ leaves args alone.
        self.args = (message,)

    def __reduce__(self) -> Any:
        return (
            _rebuild_exceeded,
            (str(self), self.label, self.limit, self.elapsed, self.overshoot, type(self),
             self.reason),
        )


class DeadlineCancelled(DeadlineExceeded):
    """The block was stopped by ``scope.cancel()`` (for instance a coordinator's
    ``DeadlineRegistry.cancel(job)``) rather than by its clock. A ``DeadlineExceeded``, so
    code that handles deadlines handles cancellation the same way; its result's status is
    ``cancelled``."""


def _rebuild_exceeded(
    message: str,
    label: Optional[str],
    limit: Optional[float],
    elapsed: float,
    overshoot: Optional[float],
    cls: type[DeadlineExceeded] = DeadlineExceeded,
    reason: Optional[str] = None,
) -> DeadlineExceeded:
    exc: DeadlineExceeded = cls.__new__(cls)
    exc.args = (message,)
    exc.reason = reason
    exc.scope = None
    exc.label, exc.limit, exc.elapsed, exc.overshoot = label, limit, elapsed, overshoot
    return exc


class SoftDeadlineExceeded(Exception):
    """Raised inside a block whose soft limit passed, when ``soft_raise=True``.

    An ordinary ``Exception`` on purpose: the body may catch it and clean up; the hard
    limit still follows.
    """
