"""The pure-Python engine, for platforms without ``timer_create`` (or when
``TIMEOUTCORE_ENGINE=fallback``). GIL builds only (``timeoutcore._engine``).

The same :class:`~timeoutcore._engine_api.Engine` as the native one: ``Scope``, ``Shield``,
``sleep``, ``checkpoint``, ``remaining``, ``current_deadline``, ``current_scope``,
``shield``. One daemon watchdog thread keeps every thread's deadlines; at a deadline it
marks the outermost due scope fired and makes its interrupt *pending* for that thread, and
the thread raises it itself at its next safe line boundary
(:mod:`timeoutcore._fallback_deliver`: the same protected-code rule as the native core,
decided in the target thread at the moment of delivery).

Why the engine's own critical sections never see an interrupt. Nothing raises into a thread
from outside: the hook raises only in the thread, only at a line boundary, and never while
a frame of this engine (or of protected code) lies between that line and the scope's
``with`` statement -- so never inside ``with _wd.lock:``, and never between "block
finished" and "pending interrupt taken back": the block's last line has run, then the
``with`` statement's exit call (a place the hook refuses: csrc/tc_compat.h's with-exit
test), then ``Scope.__exit__``, a frame of this module throughout, which takes the pending
interrupt back (``take_back``) before it returns. The lock is therefore never held across a
point where an interrupt can surface, and the watchdog holds it only while it scans and arms
(a Python-level lock is safe to hold there: the watchdog thread has no deadline of its own).
Explicit raise points -- ``sleep()``, ``checkpoint()``, a shield's exit, a scope's exit for
an enclosing scope -- raise synchronously, where the caller asked for it.

The one exception: a thread the hook cannot reach (3.11 with a C tracer, such as a
coverage tool's; no free ``sys.monitoring`` tool id) gets ``PyThreadState_SetAsyncExc`` after a look at
its stack from the watchdog, which from 3.13 does not say where the exception surfaces
(DESIGN.md, section 6); there an interrupt can still land in protected code.

What it cannot do, and the native engine does:

* no signal: a blocking system call is not knocked loose (only ``sleep`` below ends early);
* the watchdog is a Python thread: it waits for the GIL like any other (a switch interval
  late, more with busy threads), and while a delivery is pending the hook costs a Python
  call per line in the guarded thread (3.11) or in every thread (3.12+, where
  ``sys.monitoring`` events are interpreter-wide).
"""

from __future__ import annotations

import math
import select
import sys
import threading
import time
import weakref
from typing import Any, Literal, Optional, overload

from . import _deferral, _fork, _validate
from . import _fallback_deliver as _dl
from . import _fallback_dropped
from ._fallback_watchdog import ThreadState, Watchdog, interrupt, take_back, tstate_get
from .errors import DeadlineExceeded, _DeadlineInterrupt

NAME = "fallback"
#: No signal at all: a blocking call is never knocked loose, on any CPython.
INTERRUPTS_RETRIED_CALLS = False

#: The native core's latency accelerators (csrc/tc_accel.h): none of them exists here.
_ACCELERATORS = ("anticipation", "fast_window", "self_fire", "prearm", "sleeping_tracer",
                 "direct_delivery", "prepare", "placement", "rescue", "remote_relay",
                 "frame_address")


@overload
def accelerators(explain: Literal[False] = False) -> dict[str, bool]: ...
@overload
def accelerators(explain: Literal[True]) -> dict[str, Optional[str]]: ...
def accelerators(explain: bool = False) -> "dict[str, bool] | dict[str, Optional[str]]":
    """The native core's latency accelerators, all off: this is the pure-Python engine.

    The same keys as the native engine's ``accelerators()``; with ``explain=True`` each
    maps to the reason, "pure-Python engine".
    """
    if explain:
        why: dict[str, Optional[str]] = {name: "pure-Python engine" for name in _ACCELERATORS}
        return why
    return dict.fromkeys(_ACCELERATORS, False)

_NEVER = math.inf
# The watchdog, the thread states and the hookless path's clear live in their own module;
# the names stay reachable here (tests make a fresh engine state with _fallback._Watchdog()).
_Watchdog = Watchdog
_ThreadState = ThreadState

_wd = Watchdog()


class _Link(_dl.Engine):
    """This engine, as the delivery hook sees it."""

    def frame_of(self, scope: Any) -> Any:
        return getattr(scope, "_frame", None)

    def shielded(self, ident: int) -> bool:
        st = _wd.states.get(ident)
        return st is not None and st.shield > 0

    def on_defer(self, scope: Any, where: str) -> None:
        if isinstance(scope, Scope) and scope._deferred_where is None:
            scope._deferred_where = where

    def on_deliver(self, scope: Any, deferred: float, where: Optional[str]) -> None:
        if isinstance(scope, Scope):
            scope._delivered_at = time.monotonic()
            scope._deferred += deferred
            if where is not None and scope._deferred_where is None:
                scope._deferred_where = where

    def instance(self, ident: int, exc: type[BaseException], scope: Any) -> BaseException:
        st = _wd.states.get(ident)
        if exc is _DeadlineInterrupt and st is not None:
            return interrupt(st)
        got = exc()
        if st is not None and isinstance(scope, Scope):
            try:
                st.soft_sent = (weakref.ref(got), scope)
            except TypeError:  # a soft_raise class whose __slots__ leave out __weakref__
                st.soft_sent = None
        return got

    def before_arm(self) -> None:
        _fallback_dropped.install()

    def ours(self, exc: BaseException) -> bool:
        st = _wd.states.get(threading.get_ident())
        if st is None:
            return False
        if isinstance(exc, _DeadlineInterrupt):
            return st.fired is not None and st.sent is not None and st.sent() is exc
        soft = st.soft_sent
        return (soft is not None and soft[0]() is exc and soft[1]._state == 1
                and soft[1]._soft_pending)

    def on_dropped(self, ident: int, exc: BaseException) -> None:
        st = _wd.states.get(ident)
        # Never held by this thread here: a delivery never lands under the engine's own
        # frames. Bounded all the same: a drop is no place to wait for ever.
        if st is None or not _wd.lock.acquire(timeout=1.0):
            return
        try:
            if ident in _dl.pending or st.shield:
                return  # on its way already, or held back (the shield's end sends it)
            if isinstance(exc, _DeadlineInterrupt):
                if st.fired is not None and not st.fired._exiting:
                    _wd.send(st, _DeadlineInterrupt, st.fired)
            elif st.fired is None and st.soft_sent is not None:
                scope = st.soft_sent[1]
                if scope._state == 1 and not scope._exiting and scope._soft_pending:
                    _wd.send(st, type(exc), scope)
        finally:
            _wd.lock.release()


_dl.engine = _Link()


def _report_deferral(scope: Scope, st: ThreadState) -> None:
    """The scope's exit, its lock let go: a deferral longer than the cap is logged once
    (timeoutcore._deferral), interrupts held back meanwhile."""
    cap = _deferral.deferral_log_cap()
    if cap is None or not scope._deferred or scope._deferred <= cap:
        return
    st.shield += 1
    try:
        _deferral._report(scope)
    except Exception:  # noqa: BLE001 - a log call must not replace the block's outcome
        pass
    finally:
        st.shield -= 1




def _after_fork_in_child() -> None:
    """The child has no watchdog thread (and only this thread): a new engine state, this
    thread's carried over, and a watchdog started again if it is inside a scope."""
    global _wd
    old = _wd
    _wd = Watchdog()
    _dl.after_fork()
    st = getattr(old.local, "st", None)
    if st is not None:
        st.ident = threading.get_ident()
        st.tstate = tstate_get() or 0
        st.thread = threading.current_thread()
        st.cond = threading.Condition(threading.Lock())
        _wd.local.st = st
        _wd.states[st.ident] = st
        if st.stack:
            _wd.ensure()


_fork.register(_fork.ENGINE, after_in_child=_after_fork_in_child)


def _drop_above(st: ThreadState, scope: Scope) -> None:
    """Drop scopes above ``scope`` whose exit never ran.  (A loop of its own frame: on
    CPython 3.13.0 an exception raised at a `while <cond>:` back-edge skips the frame's
    with-exits, cpython#130279, and the caller holds the watchdog lock in one.)"""
    while st.stack and st.stack[-1] is not scope:
        st.stack.pop()._state = 2


def _run_hook(scope: Scope, st: ThreadState, exc: Optional[BaseException]) -> None:
    """The scope's exit hook, interrupts held back meanwhile; its error is reported, not
    raised (as the native core does)."""
    st.shield += 1
    try:
        assert scope._hook is not None
        scope._hook(scope, "exit", exc)
    except Exception:  # noqa: BLE001 - as the native core: reported, not raised
        import logging  # only on this error path: not a cost of every import

        logging.getLogger("timeoutcore").exception("scope hook %r failed", scope._hook)
    finally:
        st.shield -= 1


#: Functions through which a scope may be entered for another frame's with statement.
_ENTERS = frozenset({"__enter__", "__aenter__", "enter_context", "enter_async_context"})


class Scope:
    """Pure-Python deadline scope (same behaviour as the native one, less precise)."""

    __slots__ = (
        "_label", "_seconds", "_deadline", "_raise", "_has_deadline", "_state", "_expired",
        "_entered", "_exited", "_fired_at", "_st", "_ident", "_exiting", "_hook",
        "_exit_exc", "_native_id", "_soft_pending", "_frame", "_deferred", "_deferred_where",
        "_delivered_at",
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
        self._st: Optional[ThreadState] = None
        self._ident: Optional[int] = None
        self._exiting = False
        self._hook: Optional[Any] = _default_hook
        self._exit_exc: Optional[BaseException] = None
        self._native_id: Optional[int] = None
        self._soft_pending = False
        self._frame: Any = None  # the with statement's frame while active: the hook's bound
        self._deferred = 0.0
        self._deferred_where: Optional[str] = None
        self._delivered_at: Optional[float] = None
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
        # Stamped and active before the enter hook: the hook registers a soft limit, and
        # the soft timer may look at the scope the moment that limit passes -- in Python a
        # GIL switch can come between the hook and any later line, and the timer dropped a
        # soft limit whose scope it found not yet active (so the entry counts from before
        # the hook; the native core stamps it after, in C, where no switch comes between).
        now = time.monotonic()
        self._native_id = threading.get_native_id()
        if not self._has_deadline:
            self._deadline = _NEVER if math.isnan(self._seconds) else now + self._seconds
        self._entered = now
        self._st = st
        self._ident = st.ident
        # The frame of the with statement: the hook's stack check stops there. Entered by
        # hand from a wrapper's __enter__ (or an ExitStack), the frame that entered the
        # wrapper: the wrapper's __exit__ then lies inside the checked part of the stack.
        # Cleared at the exit (it holds the frame's locals).
        f = sys._getframe(1)
        while f.f_code.co_name in _ENTERS and f.f_back is not None:
            f = f.f_back
        self._frame = f
        self._state = 1
        if self._hook is not None:
            try:
                self._hook(self, "enter", None)
            except BaseException:
                self._state, self._st, self._frame = 0, None, None
                raise
        if self._deadline != _NEVER:
            _wd.ensure()  # outside the lock: Thread.start() waits for the new thread
        # No lock: only this thread changes its stack, and an append is atomic under the
        # GIL (the watchdog reads the stack, at worst without this scope: not due yet).
        st.stack.append(self)
        if self._deadline <= now:
            # Already past (cancelled before entry): fired now, so that the block ends
            # DeadlineExceeded at its exit however quick it is; the interrupt is sent a
            # step later (mark_fired), to the block's first safe line.
            with _wd.lock:
                _wd.mark_fired(st, now)
        if self._deadline != _NEVER:
            _wd.poke(self._deadline)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        self._exiting = True  # first: the watchdog fires and re-sends no more into it
        st = self._st
        if self._state != 1:
            raise RuntimeError("__exit__ of a deadline scope that is not active")
        if st is None or st is not getattr(_wd.local, "st", None):
            raise RuntimeError("a deadline scope must be exited in the thread that entered it")
        now = time.monotonic()
        if (_wd.firing is st or st.fired is not None or self._soft_pending or not st.stack
                or st.stack[-1] is not self or st.deadline() <= now):
            return self._exit_slow(st, exc_type, exc)
        # The common case, without the lock: nothing fired or sent to this thread, nobody
        # firing it now (a firer that starts from here sees _exiting), nothing due.
        st.stack.pop()
        self._state = 2
        self._exited = now
        self._frame = None
        self._exit_exc = exc
        self._st = None
        if self._hook is not None:
            _run_hook(self, st, exc)
            now = time.monotonic()  # an enclosing deadline may have passed in the hook
            if st.fired is None and not st.shield and st.due(now) is not None:
                with _wd.lock:
                    _wd.fire(st, now, True)  # raises the interrupt for the enclosing scope
        return False

    def _exit_slow(self, st: ThreadState, exc_type: Any, exc: Any) -> bool:
        """The exit when something fired, was sent, is being fired or is due: under the
        engine's lock, so that no firer acts on this scope meanwhile."""
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
            self._frame = None
            if claimed or self._soft_pending:
                if claimed:
                    st.fired = None
                    st.sent = None
                self._soft_pending = False
                st.soft_sent = None
                take_back(st)
            self._exit_exc = exc
            if self._hook is not None:
                _run_hook(self, st, exc)
                now = time.monotonic()  # an enclosing deadline may have passed in the hook
            outer_due = st.fired is None and not st.shield and st.due(now) is not None
            if outer_due:
                self._st = None
                _wd.fire(st, now, True)  # raises the interrupt for the enclosing scope
        self._st = None
        if claimed:
            _report_deferral(self, st)
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
        _wd.poke(d)
        with _wd.lock:
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
        return self._deferred if self._expired or self._delivered_at is not None else None

    @property
    def deferred_where(self) -> Optional[str]:
        return self._deferred_where

    @property
    def delivered_at(self) -> Optional[float]:
        return self._delivered_at

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
        self._st: Optional[ThreadState] = None
        self._state = 0

    def __enter__(self) -> Shield:
        if self._state:
            raise RuntimeError("a shield is not reusable")
        st = _wd.state()
        with _wd.lock:
            st.shield += 1
            if st.shield == 1 and st.fired is not None:
                take_back(st)
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
                    raise interrupt(st)
                if st.due(now) is not None:
                    _wd.fire(st, now, True)
        _wd.poke(st.deadline())  # the watchdog skipped this thread while it was shielded
        return False


def sleep(seconds: float) -> None:
    """Sleep like time.sleep, but end at this thread's deadline and raise there."""
    if seconds is None:  # as the C core: its own message for None
        raise TypeError("sleep(): seconds must be a number, not None")
    secs = _validate.seconds(seconds, "sleep()", "seconds", allow_zero=True)
    st: Optional[ThreadState] = getattr(_wd.local, "st", None)
    target = time.monotonic() + secs
    if st is None:
        time.sleep(secs)
        return
    while True:
        now = time.monotonic()
        if not st.shield:
            _raise_sent(st)
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
    st: Optional[ThreadState] = getattr(_wd.local, "st", None)
    if st is None or not st.stack or st.shield:
        return
    _raise_sent(st)
    now = time.monotonic()
    if st.deadline() <= now:
        with _wd.lock:
            _wd.fire(st, now, True)


def _raise_sent(st: ThreadState) -> None:
    """An explicit raise point of the thread itself (not shielded): raise what fired or
    was sent to it (a soft limit's exception), taken back from its hook first."""
    if st.fired is not None:
        take_back(st)
        raise interrupt(st)
    if st.ident in _dl.pending:
        got = _dl.take_back(st.ident)
        if got is not None:
            _dl.engine.on_deliver(got[1], 0.0, None)
            raise got[0]


def current_deadline() -> Optional[float]:
    """This thread's earliest deadline as a time.monotonic() value, or None."""
    st: Optional[ThreadState] = getattr(_wd.local, "st", None)
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
    st: Optional[ThreadState] = getattr(_wd.local, "st", None)
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
        _wd.firing = st  # before the look at _exiting (Scope.__exit__'s fast path)
        try:
            if (scope._state != 1 or scope._exiting or st is None or st.shield
                    or st.fired is not None):
                return False
            scope._soft_pending = True
            _wd.send(st, exc, scope)
            if st.ident in _dl.pending and st.ident != threading.get_ident():
                # Cover a loop without line boundaries at once (3.11: ``while True: pass``
                # jumps to itself): the watchdog's backstop re-sends hard interrupts only.
                _dl.nudge(st.ident, st.tstate)
            return True
        finally:
            _wd.firing = None


def scope_stacks(all_threads: bool) -> list[tuple[Any, ...]]:
    """The active scopes, one tuple per thread (outermost first): of every thread, or of
    this thread only."""
    if not all_threads:
        st: Optional[ThreadState] = getattr(_wd.local, "st", None)
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


def wait_shield() -> Shield:
    """The shield the patched stdlib waits hold around their own bookkeeping, as with the
    native engine. (It takes the engine's lock only for a few lines, and nothing of this
    engine waits while holding that lock.)"""
    return Shield()
