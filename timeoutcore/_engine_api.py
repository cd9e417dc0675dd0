"""The engine interface: what the layers above ask of an engine, and nothing else.

Two modules satisfy :class:`Engine`: ``timeoutcore._native`` (the C core: per-thread
timers, a watchdog pthread, a thread-directed signal) and ``timeoutcore._fallback`` (pure
Python: a watchdog thread and ``PyThreadState_SetAsyncExc``). ``timeoutcore._engine``
chooses one. Where the two differ in what they can do, the difference is a capability
attribute here, so no feature module asks which engine runs.

An engine owns, for every thread, the stack of active scopes and their deadlines; it arms a
deadline at a scope's entry, fires it (injects the internal ``_DeadlineInterrupt``), and
claims the interrupt at the scope's exit, where it raises ``DeadlineExceeded``.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Callable, ContextManager, Optional, Protocol

#: The hook an engine calls around a block that needs more than a deadline:
#: ``hook(scope, "enter", None)`` before arming, ``hook(scope, "exit", exc)`` after disarming
#: (interrupts held back while it runs). See ``timeoutcore._hooks``.
Hook = Callable[[Any, str, Optional[BaseException]], None]


class EngineScope(Protocol):
    """One deadline scope of an engine (the base class of ``DeadlineScope``).

    Single-use: entered once, exited once, in the same thread. Its ``__exit__`` claims the
    interrupt of its own deadline and raises ``DeadlineExceeded`` in its place.
    """

    _hook: Optional[Hook]

    def __init__(
        self,
        seconds: Optional[float] = None,
        *,
        label: Optional[str] = None,
        raise_on_timeout: bool = True,
        deadline: Optional[float] = None,
        **extras: Any,
    ) -> None: ...

    def __enter__(self) -> Any: ...

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...

    def when(self) -> Optional[float]:
        """The absolute deadline (``time.monotonic()``), or None."""

    def reschedule(self, when: Optional[float]) -> None:
        """Move the deadline to ``when`` (None: no deadline)."""

    def expired(self) -> bool:
        """True once this scope's deadline has expired (fired)."""

    def remaining(self) -> Optional[float]:
        """Seconds left before this scope's deadline, or None."""

    def elapsed(self) -> float:
        """Seconds from entry to exit (or to now while active)."""

    @property
    def label(self) -> Optional[str]: ...
    @property
    def limit(self) -> Optional[float]: ...
    @property
    def overshoot(self) -> Optional[float]: ...
    @property
    def deferred(self) -> Optional[float]:
        """Seconds the fired interrupt waited for protected code (None: it did not fire)."""
    @property
    def deferred_where(self) -> Optional[str]:
        """"file:line in function" of the protected code that held it, or None."""
    @property
    def delivered_at(self) -> Optional[float]:
        """time.monotonic() when the interrupt surfaced inside the block, or None."""
    @property
    def fired_at(self) -> Optional[float]: ...
    @property
    def entered_at(self) -> Optional[float]: ...
    @property
    def exited_at(self) -> Optional[float]: ...
    @property
    def active(self) -> bool: ...
    @property
    def used(self) -> bool: ...
    @property
    def raise_on_timeout(self) -> bool: ...
    @property
    def thread_ident(self) -> Optional[int]: ...
    @property
    def native_id(self) -> Optional[int]: ...
    @property
    def exit_exception(self) -> Optional[BaseException]: ...


class EngineShield(Protocol):
    """Holds deadline interrupts back until it exits (then delivers a due one)."""

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: Any) -> Any: ...


class Engine(Protocol):
    """What ``timeoutcore._native`` and ``timeoutcore._fallback`` both provide."""

    #: ``"native"`` or ``"fallback"`` (``timeoutcore.ENGINE``), for people, not for code paths.
    NAME: str

    #: True when, on this interpreter, the engine's signal ends the blocking system calls that
    #: CPython retries after EINTR (``time.sleep``, socket calls, ``select``): the native
    #: engine from CPython 3.15 (cpython#144748). ``patch()`` then leaves those alone.
    INTERRUPTS_RETRIED_CALLS: bool

    @property
    def Scope(self) -> type[EngineScope]: ...  # noqa: N802 - the class itself

    @property
    def Shield(self) -> type[EngineShield]: ...  # noqa: N802 - the class itself

    def sleep(self, seconds: float) -> None:
        """Sleep; at this thread's deadline end early and raise there."""

    def checkpoint(self) -> None:
        """Raise the interrupt here if this thread's deadline has passed."""

    def remaining(self) -> Optional[float]:
        """Seconds left before this thread's earliest deadline, or None."""

    def current_deadline(self) -> Optional[float]:
        """This thread's earliest deadline as a ``time.monotonic()`` value, or None."""

    def current_scope(self) -> Optional[EngineScope]:
        """The innermost active scope of this thread, or None."""

    def shield(self) -> EngineShield:
        """A context manager holding deadline interrupts back until it exits."""

    def wait_shield(self) -> ContextManager[Any]:
        """What the patched stdlib waits hold around their own bookkeeping (the lock a
        ``Condition.wait`` re-acquires, a socket timeout to restore): ``shield()`` where
        that is safe, else a no-op context manager."""

    def _set_default_hook(self, hook: Optional[Hook]) -> None:
        """Give ``hook`` to every scope created from now on (None: none)."""

    def _raise_in_scope(self, scope: Any, exc: type[BaseException]) -> bool:
        """Raise ``exc`` in the thread running ``scope`` if it is active (best effort)."""

    def scope_stacks(self, all_threads: bool) -> list[tuple[EngineScope, ...]]:
        """The active scopes, one tuple per thread, outermost first: of every live thread
        (``all_threads``) or of the calling thread only. A snapshot."""

    def wait_readable(self, fd: int, timeout: float, control: bool = False) -> bool:
        """Wait until ``fd`` is readable (or hung up) or ``timeout`` seconds have passed:
        True if it is ready, False otherwise (the caller loops). For a thread with urgent
        work and no deadline of its own: the native engine then takes the GIL back within a
        fast switch interval even while other threads are busy (the fast window).
        ``control``: ``fd`` is the Redis registry's subscriber socket; the native engine
        first applies, without the GIL, the cancels queued on it for scopes armed with
        :meth:`remote_arm` (the message stays queued for the caller to read)."""

    def remote_arm(self, scope: Any, token: str) -> None:
        """Let a cancel naming ``token`` (32 lowercase hex digits) on a control socket
        waited on with ``wait_readable(..., control=True)`` stop ``scope`` as
        ``scope.cancel()`` would, without waiting for the GIL. Called in the thread about
        to enter ``scope``; every arm is taken back with :meth:`remote_disarm`. The
        pure-Python engine does nothing (its caller's ``cancel()`` does the work)."""

    def remote_disarm(self, scope: Any) -> bool:
        """Take back ``scope``'s :meth:`remote_arm`; False if it had none."""
