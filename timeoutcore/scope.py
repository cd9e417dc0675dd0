"""``thread_deadline`` / ``thread_deadline_at``: the scope object, ``sleep``, ``shield``.

The scope's ``__enter__``/``__exit__`` are the engine's own (C in the native engine):
between "the block finished" and "disarmed, pending interrupt cleared" no bytecode runs,
so a deadline interrupt never surfaces after the block has exited. This module adds only
what is not on that path: the decorator form and ``repr``.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, TypeVar

from ._engine import core

F = TypeVar("F", bound=Callable[..., Any])


class _ScopeMixin:
    """What every engine's scope gets on top of its own enter/exit: the decorator form."""

    __slots__ = ()

    def __call__(self, fn: F) -> F:
        """Decorate ``fn``: every call runs under a fresh scope with these settings."""
        if not callable(fn):
            raise TypeError(f"thread_deadline(...) decorates a callable, not {type(fn).__name__}")
        scope: Any = self
        if scope.used:
            raise RuntimeError("cannot use a scope that was already entered as a decorator")
        cls = type(self)
        when = scope.when()
        limit = None if when is not None else scope.limit
        label, raise_on_timeout = scope.label, scope.raise_on_timeout

        @functools.wraps(fn)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            new: Any = cls(limit, label=label, raise_on_timeout=raise_on_timeout, deadline=when)  # type: ignore[call-arg]
            with new:
                return fn(*args, **kwargs)

        return guarded  # type: ignore[return-value]

    def __repr__(self) -> str:
        scope: Any = self
        state = "active" if scope.active else ("done" if scope.used else "new")
        fired = ", expired" if scope.expired() else ""
        return f"<DeadlineScope label={scope.label!r} limit={scope.limit!r} {state}{fired}>"


class DeadlineScope(_ScopeMixin, core.Scope):  # type: ignore[misc]
    """A hard deadline for the block it guards, in the thread that enters it.

    ``thread_deadline(seconds, *, label=None, raise_on_timeout=True)`` returns one.
    ``seconds`` counts from entry into the block; ``None`` means no deadline. When the
    deadline passes, the block is interrupted wherever it is (Python code, or a blocking
    call the signal can knock loose) and ``DeadlineExceeded`` is raised at the block's exit;
    with ``raise_on_timeout=False`` the block is abandoned silently and ``expired()`` tells.

    A scope is single-use. Used as a decorator it makes a fresh scope for every call.
    Methods: ``when()``, ``reschedule(when)``, ``expired()``, ``remaining()``,
    ``elapsed()``; attributes ``label``, ``limit``, ``overshoot``, ``fired_at``,
    ``entered_at``, ``exited_at``, ``active``, ``thread_ident``.
    """

    __slots__ = ()


thread_deadline = DeadlineScope


def thread_deadline_at(
    when: float, *, label: Optional[str] = None, raise_on_timeout: bool = True
) -> DeadlineScope:
    """Like ``thread_deadline`` with an absolute deadline, a ``time.monotonic()`` value."""
    return DeadlineScope(None, label=label, raise_on_timeout=raise_on_timeout, deadline=when)


def sleep(seconds: float) -> None:
    """Sleep like ``time.sleep``; if this thread's deadline comes first, end there and raise.

    Returns early on the core's signal, so it is the precise way to wait inside a block.
    """
    core.sleep(seconds)


def checkpoint() -> None:
    """Raise the deadline interrupt here if the current thread's deadline has passed.

    For code that waits with its own timeout (``min(timeout, remaining())``): call it when
    the wait returns, and the block ends precisely at its deadline. Cheap: one thread-local
    look-up and a clock read. Outside any scope, and inside ``shield()``, it does nothing.
    """
    core.checkpoint()


def remaining() -> Optional[float]:
    """Seconds left before the current thread's earliest deadline; ``None`` when unguarded."""
    result: Optional[float] = core.remaining()
    return result


def current_scope() -> Optional[DeadlineScope]:
    """The innermost active scope of the current thread, or ``None``."""
    result: Optional[DeadlineScope] = core.current_scope()
    return result


def shield() -> Any:
    """A context manager, used inside a scope, that holds deadline interrupts back.

    An interrupt due while the shield is active is delivered when the shield exits, so
    cleanup inside it is never torn. Outside any scope it does nothing.
    """
    return core.shield()
