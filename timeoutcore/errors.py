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
    swallows it anyway, it is raised again until the block exits.
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

    def __init__(self, scope: Any) -> None:
        self.scope = scope
        self.label = scope.label
        self.limit = scope.limit
        self.elapsed = scope.elapsed()
        self.overshoot = scope.overshoot
        name = f" {self.label!r}" if self.label is not None else ""
        limit = f"{self.limit:g} s " if self.limit is not None else ""
        over = f", {self.overshoot * 1e3:.3f} ms late" if self.overshoot is not None else ""
        super().__init__(
            f"deadline{name} exceeded: {limit}limit, block left after {self.elapsed:.6f} s{over}"
        )

    def __reduce__(self) -> Any:
        return (_rebuild_exceeded, (str(self), self.label, self.limit, self.elapsed, self.overshoot))


def _rebuild_exceeded(
    message: str,
    label: Optional[str],
    limit: Optional[float],
    elapsed: float,
    overshoot: Optional[float],
) -> DeadlineExceeded:
    exc = DeadlineExceeded.__new__(DeadlineExceeded)
    TimeoutError.__init__(exc, message)
    exc.scope = None
    exc.label, exc.limit, exc.elapsed, exc.overshoot = label, limit, elapsed, overshoot
    return exc


class SoftDeadlineExceeded(Exception):
    """Raised inside a block whose soft limit passed, when ``soft_raise=True``.

    An ordinary ``Exception`` on purpose: the body may catch it and clean up; the hard
    limit still follows.
    """
