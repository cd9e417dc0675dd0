"""The pure-Python engine, for platforms without ``timer_create`` (or when
``TIMEOUTCORE_ENGINE=fallback``).

The same :class:`~timeoutcore._engine_api.Engine` as the native one: ``Scope``, ``Shield``,
``sleep``, ``checkpoint``, ``remaining``, ``current_deadline``, ``current_scope``,
``shield``. A daemon watchdog thread raises the interrupt with
``PyThreadState_SetAsyncExc``. What it cannot do, and the native engine does:

* no signal: a blocking system call is not knocked loose (only ``sleep`` below ends early);
* ``__exit__`` is Python code, so an interrupt injected while it runs can, rarely (about
  1 in 10^5 racing blocks), surface just after the block;
* the watchdog waits a whole GIL switch interval before it can inject (~5 ms late).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import select
import sys
import threading
import time
import weakref
from typing import Any, Literal, Optional

from . import _fork, _validate
from .errors import DeadlineExceeded, _DeadlineInterrupt

NAME = "fallback"
#: No signal at all: a blocking call is never knocked loose, on any CPython.
INTERRUPTS_RETRIED_CALLS = False

_NEVER = math.inf
_addr = ctypes.cast(ctypes.pythonapi.PyThreadState_SetAsyncExc, ctypes.c_void_p).value or 0
# Two prototypes of the same C function: raise a class, or clear with NULL.
_set_async_exc = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.py_object)(_addr)
_clear_async_exc = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)(_addr)


def _inject(ident: int, exc: type) -> None:
    _set_async_exc(ident, exc)


class _Drain(BaseException):
    """Private: what :func:`_clear` raises into its own thread and catches at once."""


def _noop() -> None:
    pass


def _clear(ident: int) -> None:
    """Take back what was raised into thread ``ident`` -- always the calling thread (its
    scope's exit, a shield, a checkpoint) -- and not consumed yet.

    On 3.11, ``PyThreadState_SetAsyncExc(ident, NULL)`` leaves the interpreter-wide "async
    exception pending" bit set when nothing was pending; stale, it keeps every thread's eval
    breaker tripped, and a thread that is traced (the native engine's delivery hook, a
    debugger) then spins at its next function entry. So there the pending exception is
    replaced by :class:`_Drain` and consumed right here, which clears the bit."""
    if sys.version_info >= (3, 12):
        _clear_async_exc(ident, None)
        return
    consumed = False
    try:
        _set_async_exc(ident, _Drain)
        _noop()  # its entry checks the eval breaker: _Drain surfaces here
        _noop()
    except _Drain:
        consumed = True
    if not consumed:  # pragma: no cover - never seen; do not leave it pending
        _clear_async_exc(ident, None)


class _ThreadState:
    __slots__ = ("ident", "stack", "fired", "shield", "reinject_at", "step", "cond", "__weakref__")

    def __init__(self, ident: int) -> None:
        self.ident = ident
        self.stack: list[Scope] = []
        self.fired: Optional[Scope] = None
        self.shield = 0
        self.reinject_at = _NEVER
        self.step = 0.002
        self.cond = threading.Condition(threading.Lock())

    def deadline(self) -> float:
        return min((s._deadline for s in self.stack), default=_NEVER)

    def due(self, now: float) -> Optional[Scope]:
        for s in self.stack:  # outermost first
            if s._deadline <= now:
                return s
        return None


class _Watchdog:
    def __init__(self) -> None:
        self.lock = threading.Condition(threading.Lock())
        # weak values: a thread's state lives in its threading.local and goes with it
        self.states: weakref.WeakValueDictionary[int, _ThreadState] = (
            weakref.WeakValueDictionary()
        )
        self.thread: Optional[threading.Thread] = None
        self.local = threading.local()

    def state(self) -> _ThreadState:
        st: Optional[_ThreadState] = getattr(self.local, "st", None)
        if st is None:
            st = _ThreadState(threading.get_ident())
            self.local.st = st
            with self.lock:
                self.states[st.ident] = st
        return st

    def ensure(self) -> None:
        if self.thread is None or not self.thread.is_alive():
            self.thread = threading.Thread(target=self.run, name="timeoutcore-watchdog", daemon=True)
            self.thread.start()

    def mark_fired(self, st: _ThreadState, now: float) -> bool:
        """Mark the outermost due scope fired (lock held); False if none is, or shielded."""
        due = st.due(now)
        if due is None or st.shield:
            return False
        if st.fired is None:
            st.fired = due
            due._expired = True
            due._fired_at = now
        st.step = 0.002
        st.reinject_at = now + st.step
        return True

    def fire(self, st: _ThreadState, now: float, local: bool) -> bool:
        if not self.mark_fired(st, now):
            return False
        if local:
            raise _DeadlineInterrupt
        _inject(st.ident, _DeadlineInterrupt)
        with st.cond:
            st.cond.notify_all()
        return True

    def run(self) -> None:
        with self.lock:
            while True:
                now = time.monotonic()
                nxt = _NEVER
                for st in list(self.states.values()):
                    if st.shield:
                        continue
                    if st.fired is not None:
                        if st.reinject_at <= now and not st.fired._exiting:
                            _inject(st.ident, _DeadlineInterrupt)
                            st.step = min(st.step * 2, 0.1)
                            st.reinject_at = now + st.step
                        nxt = min(nxt, st.reinject_at)
                        continue
                    d = st.deadline()
                    if d <= now:
                        self.fire(st, now, False)
                        nxt = min(nxt, st.reinject_at)
                    else:
                        nxt = min(nxt, d)
                self.lock.wait(None if nxt == _NEVER else max(nxt - time.monotonic(), 0))


_wd = _Watchdog()


def _after_fork_in_child() -> None:
    global _wd
    old = _wd
    _wd = _Watchdog()
    st = getattr(old.local, "st", None)
    if st is not None:
        st.ident = threading.get_ident()
        _wd.local.st = st
        _wd.states[st.ident] = st
        if st.stack:
            _wd.ensure()


_fork.register(_fork.ENGINE, after_in_child=_after_fork_in_child)


def _drop_above(st: _ThreadState, scope: Scope) -> None:
    """Drop scopes above ``scope`` whose exit never ran.  (A loop of its own frame: on
    CPython 3.13.0 an exception raised at a `while <cond>:` back-edge skips the frame's
    with-exits, cpython#130279, and the caller holds the watchdog lock in one.)"""
    while st.stack and st.stack[-1] is not scope:
        st.stack.pop()._state = 2


class Scope:
    """Pure-Python deadline scope (same behaviour as the native one, less precise)."""

    __slots__ = (
        "_label", "_seconds", "_deadline", "_raise", "_has_deadline", "_state", "_expired",
        "_entered", "_exited", "_fired_at", "_st", "_ident", "_exiting", "_hook",
        "_exit_exc", "_native_id", "_soft_pending",
    )

    def __init__(
        self,
        seconds: Optional[float] = None,
        *,
        label: Optional[str] = None,
        raise_on_timeout: bool = True,
        deadline: Optional[float] = None,
        **extras: Any,
    ) -> None:
        secs = _validate.seconds(seconds, "thread_deadline()", "seconds", allow_none=True)
        v = math.nan if secs is None else secs
        if label is not None and not isinstance(label, str):
            raise TypeError(
                f"thread_deadline(): label must be a str or None, not {type(label).__name__}"
            )
        self._seconds = v
        self._deadline = _NEVER
        self._has_deadline = False
        if deadline is not None:
            if not math.isnan(v):
                raise TypeError("thread_deadline(): give either seconds or deadline, not both")
            self._deadline = _validate.monotonic(deadline, "thread_deadline_at()")
            self._has_deadline = True
        self._label = label
        self._raise = bool(raise_on_timeout)
        self._state = 0
        self._expired = False
        self._entered = 0.0
        self._exited = 0.0
        self._fired_at = 0.0
        self._st: Optional[_ThreadState] = None
        self._ident: Optional[int] = None
        self._exiting = False
        self._hook: Optional[Any] = _default_hook
        self._exit_exc: Optional[BaseException] = None
        self._native_id: Optional[int] = None
        self._soft_pending = False
        if extras:
            init_extras = getattr(self, "_init_extras", None)
            if init_extras is None:
                raise TypeError(
                    f"thread_deadline() got an unexpected keyword argument {sorted(extras)[0]!r}"
                )
            init_extras(extras)

    def __enter__(self) -> Any:
        if self._state != 0:
            raise RuntimeError(
                "this deadline scope is already active; scopes are not re-entrant"
                if self._state == 1
                else "this deadline scope was already used; scopes are not reusable "
                "(create a new one, or use it as a decorator)"
            )
        st = _wd.state()
        if self._hook is not None:
            self._hook(self, "enter", None)
        now = time.monotonic()
        self._native_id = threading.get_native_id()
        if not self._has_deadline:
            self._deadline = _NEVER if math.isnan(self._seconds) else now + self._seconds
        self._entered = now
        self._st = st
        self._ident = st.ident
        if self._deadline != _NEVER:
            _wd.ensure()  # outside the lock: Thread.start() waits for the new thread
        with _wd.lock:
            self._state = 1
            st.stack.append(self)
            if self._deadline <= now:
                # Already past (cancelled before entry): fired now, so that the block
                # ends DeadlineExceeded at its exit however quick it is. The watchdog
                # raises into it only a step later (mark_fired): an async exception
                # raised at once could land in this __enter__, before the with block
                # starts, and escape it.
                _wd.mark_fired(st, now)
            if self._deadline != _NEVER:
                _wd.lock.notify()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        self._exiting = True  # first: the watchdog stops re-raising into this exit
        st = self._st
        if self._state != 1:
            raise RuntimeError("__exit__ of a deadline scope that is not active")
        if st is None or st is not getattr(_wd.local, "st", None):
            raise RuntimeError("a deadline scope must be exited in the thread that entered it")
        with _wd.lock:
            now = time.monotonic()
            _drop_above(st, self)
            if st.fired is None and st.due(now) is self:
                # The backstop: a block still running when its deadline passed ends
                # expired, even if the watchdog has not fired it yet (a C call that held
                # the GIL to the block's end). Marked here, it is claimed below like any
                # fire that met the exit. Not when an enclosing scope is due too (due()
                # is the outermost): that one fires below. mark_fired declines in a shield.
                _wd.mark_fired(st, now)
            if st.stack:
                st.stack.pop()
            self._state = 2
            self._exited = now
            claimed = st.fired is self
            if claimed or self._soft_pending:
                st.fired = None if claimed else st.fired
                self._soft_pending = False
                _clear(st.ident)
            self._exit_exc = exc
            if self._hook is not None:
                st.shield += 1
                try:
                    self._hook(self, "exit", exc)
                except Exception:  # noqa: BLE001 - as the native core: reported, not raised
                    import logging  # only on this error path: not a cost of every import

                    logging.getLogger("timeoutcore").exception("scope hook %r failed", self._hook)
                finally:
                    st.shield -= 1
                now = time.monotonic()  # an enclosing deadline may have passed in the hook
            outer_due = st.fired is None and not st.shield and st.due(now) is not None
            if outer_due:
                self._st = None
                _wd.fire(st, now, True)  # raises the interrupt for the enclosing scope
        self._st = None
        if claimed:
            if not self._raise:
                # abandon silently: swallow our interrupt, never the block's own error
                return exc_type is None or issubclass(exc_type, _DeadlineInterrupt)
            err = DeadlineExceeded(self)
            if exc_type is not None and issubclass(exc_type, _DeadlineInterrupt):
                raise err from None
            raise err
        return False

    def when(self) -> Optional[float]:
        if self._state == 0 and not self._has_deadline:
            return None
        return None if self._deadline == _NEVER else self._deadline

    def reschedule(self, when: Optional[float]) -> None:
        d = _NEVER if when is None else _validate.monotonic(when, "reschedule()")
        if self._state == 2:
            raise RuntimeError("reschedule() on a scope that has exited")
        self._deadline = d
        if self._state == 0:
            self._has_deadline = True
            self._seconds = math.nan
            return
        st = self._st
        with _wd.lock:
            _wd.lock.notify()
            if st is not None and st.fired is None and st is getattr(_wd.local, "st", None):
                now = time.monotonic()
                if d <= now and not st.shield:
                    _wd.fire(st, now, True)

    def expired(self) -> bool:
        return self._expired

    def remaining(self) -> Optional[float]:
        if self._state == 0 and not self._has_deadline:
            return None if math.isnan(self._seconds) else self._seconds
        if self._deadline == _NEVER:
            return None
        end = self._exited if self._state == 2 else time.monotonic()
        return max(self._deadline - end, 0.0)

    def elapsed(self) -> float:
        if self._state == 0:
            return 0.0
        end = self._exited if self._state == 2 else time.monotonic()
        return end - self._entered

    @property
    def label(self) -> Optional[str]:
        return self._label

    @property
    def limit(self) -> Optional[float]:
        if not math.isnan(self._seconds):
            return self._seconds
        if self._deadline == _NEVER or self._state == 0:
            return None
        return self._deadline - self._entered

    @property
    def overshoot(self) -> Optional[float]:
        if not self._expired or self._state != 2:
            return None
        return max(self._exited - self._deadline, 0.0)

    @property
    def deferred(self) -> Optional[float]:
        # This engine never defers (it cannot see where the interrupt will surface).
        return 0.0 if self._expired else None

    @property
    def deferred_where(self) -> Optional[str]:
        return None

    @property
    def delivered_at(self) -> Optional[float]:
        return None

    @property
    def fired_at(self) -> Optional[float]:
        return self._fired_at if self._expired else None

    @property
    def entered_at(self) -> Optional[float]:
        return None if self._state == 0 else self._entered

    @property
    def exited_at(self) -> Optional[float]:
        return self._exited if self._state == 2 else None

    @property
    def active(self) -> bool:
        return self._state == 1

    @property
    def used(self) -> bool:
        return self._state != 0

    @property
    def raise_on_timeout(self) -> bool:
        return self._raise

    @property
    def thread_ident(self) -> Optional[int]:
        return self._ident

    @property
    def native_id(self) -> Optional[int]:
        return self._native_id

    @property
    def exit_exception(self) -> Optional[BaseException]:
        return self._exit_exc


class Shield:
    """Hold deadline interrupts back until the block exits."""

    __slots__ = ("_st", "_state")

    def __init__(self) -> None:
        self._st: Optional[_ThreadState] = None
        self._state = 0

    def __enter__(self) -> Shield:
        if self._state:
            raise RuntimeError("a shield is not reusable")
        st = _wd.state()
        with _wd.lock:
            st.shield += 1
            if st.shield == 1 and st.fired is not None:
                _clear(st.ident)
        self._st = st
        self._state = 1
        return self

    def __exit__(self, *exc: Any) -> Literal[False]:
        st = self._st
        if self._state != 1 or st is None or st is not getattr(_wd.local, "st", None):
            raise RuntimeError("shield exited twice or in another thread than it was entered")
        self._state = 2
        with _wd.lock:
            st.shield -= 1
            if st.shield == 0:
                now = time.monotonic()
                if st.fired is not None:
                    st.reinject_at = now + st.step
                    raise _DeadlineInterrupt
                if st.due(now) is not None:
                    _wd.fire(st, now, True)
                _wd.lock.notify()
        return False


def sleep(seconds: float) -> None:
    """Sleep like time.sleep, but end at this thread's deadline and raise there."""
    if seconds is None:  # as the C core: its own message for None
        raise TypeError("sleep(): seconds must be a number, not None")
    secs = _validate.seconds(seconds, "sleep()", "seconds", allow_zero=True)
    st: Optional[_ThreadState] = getattr(_wd.local, "st", None)
    target = time.monotonic() + secs
    if st is None:
        time.sleep(secs)
        return
    while True:
        now = time.monotonic()
        if not st.shield:
            if st.fired is not None:
                raise _DeadlineInterrupt
            if st.deadline() <= now:
                with _wd.lock:
                    if _wd.fire(st, now, True):
                        return
        if now >= target:
            return
        until = target if st.shield else min(target, st.deadline())
        with st.cond:
            st.cond.wait(max(until - now, 0))


def checkpoint() -> None:
    """Raise here if this thread's deadline has passed; else return None."""
    st: Optional[_ThreadState] = getattr(_wd.local, "st", None)
    if st is None or not st.stack or st.shield:
        return
    if st.fired is not None:
        _clear(st.ident)
        raise _DeadlineInterrupt
    now = time.monotonic()
    if st.deadline() <= now:
        with _wd.lock:
            _wd.fire(st, now, True)


def current_deadline() -> Optional[float]:
    """This thread's earliest deadline as a time.monotonic() value, or None."""
    st: Optional[_ThreadState] = getattr(_wd.local, "st", None)
    if st is None or not st.stack:
        return None
    d = st.deadline()
    return None if d == _NEVER else d


def remaining() -> Optional[float]:
    """Seconds left before this thread's earliest deadline, or None when unguarded."""
    d = current_deadline()
    return None if d is None else max(d - time.monotonic(), 0.0)


def current_scope() -> Optional[Scope]:
    """The innermost active scope of this thread, or None."""
    st: Optional[_ThreadState] = getattr(_wd.local, "st", None)
    return st.stack[-1] if st is not None and st.stack else None


_default_hook: Optional[Any] = None


def _set_default_hook(hook: Optional[Any]) -> None:
    """Give ``hook`` to every scope created from now on (None: no hook)."""
    global _default_hook
    _default_hook = hook


def _raise_in_scope(scope: Scope, exc: type) -> bool:
    """Raise ``exc`` in the thread running ``scope`` if it is active (best effort)."""
    st = scope._st
    with _wd.lock:
        if scope._state != 1 or scope._exiting or st is None or st.shield or st.fired is not None:
            return False
        scope._soft_pending = True
        _inject(st.ident, exc)
        with st.cond:
            st.cond.notify_all()
        return True


def scope_stacks(all_threads: bool) -> list[tuple[Any, ...]]:
    """The active scopes, one tuple per thread (outermost first): of every thread, or of
    this thread only."""
    if not all_threads:
        st: Optional[_ThreadState] = getattr(_wd.local, "st", None)
        return [tuple(st.stack)] if st is not None and st.stack else []
    with _wd.lock:
        return [tuple(st.stack) for st in list(_wd.states.values()) if st.stack]


def wait_readable(fd: int, timeout: float, control: bool = False) -> bool:
    """Wait until ``fd`` is readable (or hung up) or ``timeout`` seconds have passed; True if
    it is ready. No urgency here: the GIL comes back as for any other wait, and ``control``
    changes nothing (no remote arms: the registry's own ``cancel()`` applies them)."""
    if fd < 0:
        raise ValueError(f"wait_readable(): fd must be >= 0, not {fd}")
    if not 0.0 <= timeout <= 86400.0:
        raise ValueError("wait_readable(): timeout must be 0 to 86400 s")
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(math.ceil(timeout * 1e3)))  # PEP 475 retries EINTR


def remote_arm(scope: Any, token: str) -> None:
    """Nothing: without the native core a remote cancel is applied by the registry's
    subscriber thread, in Python (see ``timeoutcore._engine_api``)."""


def remote_disarm(scope: Any) -> bool:
    """Nothing was armed: False."""
    return False


def shield() -> Shield:
    """A context manager holding deadline interrupts back until it exits."""
    return Shield()


def wait_shield() -> contextlib.nullcontext[None]:
    """No shield around the patched stdlib waits: this engine's shield is Python code that
    takes the engine's lock, and the engine itself waits on threading primitives while
    holding it (starting its watchdog thread). Its interrupts are asynchronous anyway,
    exactly as without the patch."""
    return contextlib.nullcontext()
