"""``thread_deadline`` / ``thread_deadline_at``: the scope object, ``sleep``, ``shield``.

The scope's ``__enter__``/``__exit__`` are the engine's own (C in the native engine):
between "the block finished" and "disarmed, pending interrupt cleared" no bytecode runs,
so a deadline interrupt never surfaces after the block has exited. This module adds only
what is not on that path: the decorator form and ``repr``.
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar, cast

from . import _hooks, _stop, _validate
from ._engine import core

F = TypeVar("F", bound=Callable[..., Any])

# Per-scope state of the optional features; every engine's scope class declares them.
EXTRA_SLOTS = ("_extras", "_soft", "_on_soft", "_soft_raise", "_soft_fired", "_cleanups",
               "_result_log", "_observer", "_cancelled", "_soft_retry", "_soft_entering",
               "_cancel_reason", "_children")
_EXTRA_KEYS = ("soft_limit", "soft", "on_soft", "soft_raise", "result_log", "observer")


class _ScopeMixin:
    """What every engine's scope gets on top of its own enter/exit: soft limits, cleanup
    handlers, results, the decorator form and ``repr``. None of it is on the path of a
    block that does not use it."""

    __slots__ = ()

    def _init_extras(self, extras: dict[str, Any]) -> None:
        """Called by the engine's constructor with the keywords it does not know."""
        scope: Any = self
        unknown = sorted(set(extras) - set(_EXTRA_KEYS))
        if unknown:
            raise TypeError(f"thread_deadline() got an unexpected keyword argument {unknown[0]!r}")
        soft = _validate.alias("thread_deadline()", "soft_limit", extras.get("soft_limit"),
                               "soft", extras.get("soft"))
        on_soft = extras.get("on_soft")
        soft_raise = extras.get("soft_raise", False)
        result_log = extras.get("result_log")
        observer = extras.get("observer")
        if soft is not None:
            arg = "soft_limit" if extras.get("soft_limit") is not None else "soft"
            soft = _validate.seconds(soft, "thread_deadline()", arg)
            hard = scope.limit
            if hard is None and scope.when() is None:
                raise ValueError("thread_deadline(): soft needs a hard limit (seconds)")
            if hard is not None and soft >= hard:
                raise ValueError(
                    f"thread_deadline(): soft ({soft!r} s) must be less than the hard limit ({hard!r} s)"
                )
        elif on_soft is not None or soft_raise:
            raise ValueError("thread_deadline(): on_soft and soft_raise need soft=<seconds>")
        if on_soft is not None and not callable(on_soft):
            raise TypeError("thread_deadline(): on_soft must be callable")
        if not isinstance(soft_raise, bool) and not (
            isinstance(soft_raise, type) and issubclass(soft_raise, Exception)
        ):
            raise TypeError(
                "thread_deadline(): soft_raise must be a bool or an Exception subclass, "
                f"not {soft_raise!r}"
            )
        if result_log is not None and not hasattr(result_log, "write"):
            raise TypeError("thread_deadline(): result_log must be a ResultLog (or have .write)")
        if observer is not None and not (
            callable(getattr(observer, "on_enter", None))
            and callable(getattr(observer, "on_exit", None))
        ):
            raise TypeError("thread_deadline(): observer needs on_enter(scope) and on_exit(scope)")
        scope._extras = dict(extras)
        scope._soft = None if soft is None else float(soft)
        scope._on_soft = on_soft
        scope._soft_raise = soft_raise
        scope._result_log = result_log
        scope._observer = observer
        if soft is not None or result_log is not None or observer is not None:
            scope._hook = _hooks.dispatch

    def on_timeout(self, fn: Callable[..., Any], *args: Any) -> None:
        """Register ``fn(*args)`` to run in the guarded thread if this scope's deadline
        fires: after the interrupt, before ``DeadlineExceeded`` propagates, last registered
        first. A handler that raises is logged and does not stop the others."""
        scope: Any = self
        if not callable(fn):
            raise TypeError(f"on_timeout() needs a callable, not {type(fn).__name__}")
        if scope.exited_at is not None:
            raise RuntimeError("on_timeout() on a scope that has exited")
        cleanups = getattr(scope, "_cleanups", None)
        if cleanups is None:
            cleanups = scope._cleanups = []
        cleanups.append((fn, args))
        scope._hook = _hooks.dispatch

    def reschedule(self, when: Optional[float]) -> None:
        """Move the deadline to ``when`` (a ``time.monotonic()`` value; ``None``: none).

        The engine re-arms it; then the block's waits are woken (``timeoutcore._stop``) so
        that each re-reads the stop time: an earlier one ends them there, a later one lets
        them run on."""
        super().reschedule(when)  # type: ignore[misc]
        _stop.wake(getattr(self, "thread_ident", None))

    def cancel(self, reason: Optional[str] = None) -> None:
        """Stop the block now, from any thread, as if its deadline had passed: it is
        interrupted the same way (blocking calls included), and its exit raises
        :class:`~timeoutcore.errors.DeadlineCancelled` (a ``DeadlineExceeded``, whose
        ``reason`` is ``reason``); its result's status is ``cancelled``. Cancelling a scope
        before it is entered makes it stop at entry; after it has exited, or once it has
        expired, cancel() does nothing."""
        scope: Any = self
        if reason is not None and not isinstance(reason, str):
            raise TypeError(f"cancel(): reason must be a str or None, not {type(reason).__name__}")
        if scope.exited_at is not None or scope.expired():
            return
        scope._cancel_reason = reason
        scope._cancelled = True
        try:
            scope.reschedule(time.monotonic())
        except RuntimeError:  # it exited meanwhile
            pass

    @property
    def cancel_reason(self) -> Optional[str]:
        """The ``reason`` given to :meth:`cancel`, or None."""
        return getattr(self, "_cancel_reason", None)

    def cancelled(self) -> bool:
        """True if :meth:`cancel` stopped this block (it was interrupted after a cancel)."""
        scope: Any = self
        return bool(getattr(self, "_cancelled", False)) and bool(scope.expired())

    @property
    def result(self) -> Any:
        """A :class:`~timeoutcore.results.DeadlineResult` for this block (after it exited)."""
        scope: Any = self
        if scope.exited_at is None:
            raise RuntimeError("the result exists once the block has exited")
        return _hooks.features.build_result(scope)

    @property
    def soft_limit(self) -> Optional[float]:
        """The soft limit in seconds, or None."""
        return getattr(self, "_soft", None)

    @property
    def expired_at(self) -> Optional[float]:
        """``time.monotonic()`` when this scope's deadline expired, or None (``fired_at`` is
        the older name of the same value)."""
        scope: Any = self
        result: Optional[float] = scope.fired_at
        return result

    def soft_expired(self) -> bool:
        """True once the soft limit has passed while the block was running."""
        return bool(getattr(self, "_soft_fired", False))

    @classmethod
    def from_policy(cls, name: Any, table: Any = None, **overrides: Any) -> Any:
        """A fresh scope for job ``name`` (a job name looked up in ``table`` -- by default
        the table set with ``policy.set_policy_table`` or read from the environment -- or a
        ``DeadlinePolicy``)."""
        if not isinstance(name, str):  # a DeadlinePolicy
            return name.scope(**overrides)
        return (table or _hooks.features.policy_table()).scope(name, **overrides)

    def __call__(self, fn: F) -> F:
        """Decorate ``fn``: every call runs under a fresh scope with these settings."""
        if not callable(fn):
            raise TypeError(f"thread_deadline(...) decorates a callable, not {type(fn).__name__}")
        scope: Any = self
        if scope.used:
            raise RuntimeError("cannot use a scope that was already entered as a decorator")
        cls = type(self)
        when = scope.when()
        kw: dict[str, Any] = dict(getattr(scope, "_extras", None) or {})
        kw.update(label=scope.label, raise_on_timeout=scope.raise_on_timeout, deadline=when)
        limit = None if when is not None else scope.limit

        @functools.wraps(fn)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            new: Any = cls(limit, **kw)  # type: ignore[call-arg]
            with new:
                return fn(*args, **kwargs)

        return guarded  # type: ignore[return-value]

    def __repr__(self) -> str:
        scope: Any = self
        state = "active" if scope.active else ("done" if scope.used else "new")
        fired = ", expired" if scope.expired() else ""
        return f"<DeadlineScope label={scope.label!r} limit={scope.limit!r} {state}{fired}>"


if TYPE_CHECKING:
    # For type checkers the pure-Python engine's scope, a concrete class, stands in for
    # whichever engine runs (both satisfy _engine_api.EngineScope, which mypy checks).
    from ._fallback import Scope as _EngineScope
else:
    _EngineScope = core.Scope  # the chosen engine's scope type (C in the native engine)


class DeadlineScope(_ScopeMixin, _EngineScope):
    """A hard deadline for the block it guards, in the thread that enters it.

    ``thread_deadline(seconds, *, label=None, raise_on_timeout=True, soft_limit=None,
    on_soft=None, soft_raise=False, result_log=None)`` returns one. ``seconds``, the hard
    limit (read back as ``limit``), counts from entry into the block; ``None`` means no
    deadline. When the deadline expires, the block is interrupted wherever it is (Python
    code, or a blocking call the signal can knock loose) and ``DeadlineExceeded`` is raised
    at the block's exit. A block that is still running when its deadline passes never ends
    normally: if nothing could interrupt it inside (a C call holding the GIL to its end), its
    exit raises. With ``raise_on_timeout=False`` the block is abandoned silently and
    ``expired()`` tells; an exception the block raised itself still propagates.

    ``soft_limit`` (alias ``soft``; seconds from entry, below the hard limit) logs a warning, calls
    ``on_soft(scope)`` once on a callback thread, and with ``soft_raise=True`` raises the
    catchable ``SoftDeadlineExceeded`` inside the block (or, given an ``Exception``
    subclass as ``soft_raise``, that exception); the hard limit still follows.

    ``observer``: an object whose ``on_enter(scope)`` runs in the guarded thread before the
    deadline is armed and ``on_exit(scope)`` after it is disarmed (shielded from the
    deadline); what ``contrib.redis`` uses to publish a block's deadline.

    A scope is single-use. Used as a decorator it makes a fresh scope for every call.
    Methods: ``when()``, ``reschedule(when)``, ``expired()``, ``soft_expired()``,
    ``remaining()``, ``elapsed()``, ``on_timeout(fn, *args)``, ``cancel()``, ``cancelled()``;
    attributes ``label``, ``limit``, ``soft_limit``, ``overshoot``, ``result`` (after exit),
    ``expired_at`` (alias ``fired_at``), ``entered_at``, ``exited_at``, ``active``,
    ``thread_ident``, ``native_id``.
    """

    __slots__ = EXTRA_SLOTS


thread_deadline = DeadlineScope


def thread_deadline_at(
    when: float, *, label: Optional[str] = None, raise_on_timeout: bool = True, **extras: Any
) -> DeadlineScope:
    """Like ``thread_deadline`` with an absolute deadline, a ``time.monotonic()`` value."""
    return DeadlineScope(
        None, label=label, raise_on_timeout=raise_on_timeout, deadline=when, **extras
    )


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


def current_deadline() -> Optional[float]:
    """The current thread's effective deadline: the earliest deadline of its active scopes,
    as a ``time.monotonic()`` value (like trio's ``current_effective_deadline()``).

    ``None`` when no active scope of this thread has a deadline. Unlike ``remaining()``,
    the value does not shrink as time passes, so it can be handed on as an absolute
    deadline (to ``thread_deadline_at`` in a helper thread, or to a wait of your own).
    """
    return core.current_deadline()


def current_scope() -> Optional[DeadlineScope]:
    """The innermost active scope of the current thread, or ``None``."""
    return cast(Optional[DeadlineScope], core.current_scope())


def shield() -> Any:
    """A context manager, used inside a scope, that holds deadline interrupts back.

    An interrupt due while the shield is active is delivered when the shield exits, so
    cleanup inside it is never torn. Outside any scope it does nothing.
    """
    return core.shield()
