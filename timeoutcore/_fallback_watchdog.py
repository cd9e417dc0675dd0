"""The pure-Python engine's watchdog: every thread's scope stack, and the one thread that
fires their deadlines (``timeoutcore._fallback`` is the engine around it).

One daemon thread, started under a lock of its own on the first scope with a deadline
(again in a fork's child). At a deadline it marks the outermost due scope fired and sends
its interrupt to the thread's delivery hook (:mod:`timeoutcore._fallback_deliver`), which
raises it in the thread at a safe line; it sends again at growing steps while the block
runs on (the interrupt swallowed, or still pending: then it nudges the hook). It takes the
engine's lock only while it holds the GIL and never sleeps on it (:class:`Watchdog`).
"""

from __future__ import annotations

import ctypes
import math
import sys
import threading
import time
import weakref
from typing import Any, Optional

from . import _fallback_deliver as _dl
from .errors import _DeadlineInterrupt

#: A scope of ``timeoutcore._fallback`` (not imported: that module imports this one). The
#: watchdog reads its _deadline and _exiting and writes _expired and _fired_at.
Scope = Any

_NEVER = math.inf
_addr = ctypes.cast(ctypes.pythonapi.PyThreadState_SetAsyncExc, ctypes.c_void_p).value or 0
# Two prototypes of the same C function: raise a class, or clear with NULL.
_set_async_exc = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.py_object)(_addr)
_clear_async_exc = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)(_addr)
tstate_get = ctypes.PYFUNCTYPE(ctypes.c_void_p)(("PyThreadState_Get", ctypes.pythonapi))


class _Drain(BaseException):
    """Private: what :func:`clear` raises into its own thread and catches at once."""


def _noop() -> None:
    pass


def clear(ident: int) -> None:
    """Take back an asynchronous exception sent to thread ``ident`` -- always the calling
    thread -- by the hookless path (``ThreadState.injected``) and not consumed yet.

    On 3.11, ``PyThreadState_SetAsyncExc(ident, NULL)`` leaves the interpreter-wide "async
    exception pending" bit set when nothing was pending; stale, it keeps every thread's eval
    breaker tripped, and a thread that is traced (the delivery hook, a debugger) then spins
    at its next function entry. So there the pending exception is replaced by
    :class:`_Drain` and consumed right here, which clears the bit."""
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


class ThreadState:
    __slots__ = ("ident", "stack", "fired", "shield", "reinject_at", "step", "cond",
                 "tstate", "thread", "injected", "sent", "held_since", "soft_sent",
                 "__weakref__")

    def __init__(self, ident: int) -> None:
        self.ident = ident
        self.stack: list[Scope] = []
        self.fired: Optional[Scope] = None
        self.shield = 0
        self.reinject_at = _NEVER
        self.step = 0.002
        self.cond = threading.Condition(threading.Lock())
        self.tstate: int = tstate_get() or 0  # the thread's own PyThreadState (3.11 hook)
        self.thread = threading.current_thread()
        self.injected = False  # an asynchronous exception was sent (hookless path)
        # The interrupt last raised in the thread for ``fired`` (:func:`interrupt`), weakly,
        # and when a re-send first found it still held (:func:`held`).
        self.sent: Optional[weakref.ref[BaseException]] = None
        self.held_since = 0.0
        # The soft exception last raised in the thread (weakly) and its scope, while that
        # scope is active (timeoutcore._fallback_dropped knows it again).
        self.soft_sent: Optional[tuple[weakref.ref[BaseException], Any]] = None

    def deadline(self) -> float:
        return min((s._deadline for s in self.stack), default=_NEVER)

    def due(self, now: float) -> Optional[Scope]:
        for s in self.stack:  # outermost first
            if s._deadline <= now:
                return s
        return None


#: How long an interrupt the body still holds holds its re-send back, in seconds (the
#: native core's TC_REINJECT_HELD_MAX_NS: csrc/tc_tuning.h says why).
HELD_MAX = 1.0


def interrupt(st: ThreadState) -> _DeadlineInterrupt:
    """The thread itself: a new interrupt to raise, noted as the one sent up its body."""
    exc = _DeadlineInterrupt()
    st.sent = weakref.ref(exc)
    st.held_since = 0.0
    return exc


def held(st: ThreadState, now: float) -> bool:
    """Does ``st``'s body still hold the interrupt last raised in it -- caught and kept, to
    be raised again later, as pluggy's hook loop hands it on to the wrapper that entered
    the scope? Then it is not sent again (a second one would end that loop early and
    leave the wrapper's scope entered), for up to :data:`HELD_MAX` seconds: a body that
    keeps every interrupt and goes on still ends. (csrc/tc_slot.c: interrupt_held.)"""
    sent = st.sent
    if sent is None or sent() is None:
        st.sent = None
        return False
    if not st.held_since:
        st.held_since = now
    return now - st.held_since < HELD_MAX


def take_back(st: ThreadState) -> None:
    """The thread itself: nothing stays pending or injected for it."""
    _dl.take_back(st.ident)
    if st.injected:
        st.injected = False
        clear(st.ident)


class Watchdog:
    def __init__(self) -> None:
        # The engine's lock: every thread's scope stack changes and fires under it. Never
        # held where an interrupt can surface (the module docstring), and never held by the
        # watchdog while it waits for the GIL: it takes it only without blocking (run()).
        self.lock = threading.Lock()
        # The watchdog sleeps on this, not on a condition of self.lock: a watchdog that
        # wakes holding the engine's lock and then waits for the GIL stalls every thread
        # that enters or exits a scope, and runs only once they are all blocked on it --
        # in their exits, past their deadlines, where it then fired nearly every block.
        self.wake = threading.Event()
        self.next_wake = _NEVER  # when the watchdog wakes by itself; poke() if earlier
        # The thread another thread (the watchdog, a soft limit's timer) is firing or
        # sending to right now, lock held: set before it looks at the scope's _exiting,
        # cleared after. Scope.__exit__ reads it, after setting _exiting, to know whether it
        # may leave without the lock (under the GIL each step is atomic and in order: the
        # firer either sees _exiting, or the exit sees it firing and takes the lock).
        self.firing: Optional[ThreadState] = None
        # weak values: a thread's state lives in its threading.local and goes with it
        self.states: weakref.WeakValueDictionary[int, ThreadState] = (
            weakref.WeakValueDictionary()
        )
        self.thread: Optional[threading.Thread] = None
        self.local = threading.local()
        # Exactly one watchdog: the check and the start under one lock of their own (not
        # self.lock: a scope's entry calls this outside self.lock, and Thread.start()
        # waits for the new thread).
        self.start_lock = threading.Lock()

    def state(self) -> ThreadState:
        st: Optional[ThreadState] = getattr(self.local, "st", None)
        if st is None:
            st = ThreadState(threading.get_ident())
            self.local.st = st
            with self.lock:
                self.states[st.ident] = st
        return st

    def ensure(self) -> None:
        t = self.thread
        if t is not None and t.is_alive():
            return
        with self.start_lock:
            t = self.thread
            if t is None or not t.is_alive():
                t = threading.Thread(target=self.run, name="timeoutcore-watchdog", daemon=True)
                t.start()
                self.thread = t

    def mark_fired(self, st: ThreadState, now: float) -> bool:
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

    def send(self, st: ThreadState, exc: type[BaseException], scope: Optional[Scope]) -> None:
        """Lock held: make ``exc`` pending for it and arm the
        hook; without a hook, an asynchronous exception if its stack allows it now."""
        _dl.pending[st.ident] = (exc, scope)
        if not _dl.arm(st.ident, st.tstate):
            if scope is not None and _dl.precheck(st.ident, scope):
                _dl.pending.pop(st.ident, None)
                st.injected = True
                _dl.stats["hookless"] += 1
                _set_async_exc(st.ident, exc)
        with st.cond:
            st.cond.notify_all()

    def fire(self, st: ThreadState, now: float, local: bool) -> bool:
        """Lock held: fire ``st``'s outermost due scope -- ``local``: the thread itself,
        raising here; else for its hook. A scope already in its exit is left to it."""
        if local:
            if not self.mark_fired(st, now):
                return False
            _dl.take_back(st.ident)
            raise interrupt(st)
        self.firing = st  # before the look at _exiting: Scope.__exit__'s fast path
        try:
            due = st.due(now)
            if due is None or due._exiting or not self.mark_fired(st, now):
                return False
            self.send(st, _DeadlineInterrupt, st.fired)
            return True
        finally:
            self.firing = None

    def backstop(self, st: ThreadState, now: float) -> None:
        """Lock held: ``st`` fired and its block still runs: nudge a pending delivery, or
        send it again (the block swallowed it; not while it holds it, :func:`held`)."""
        assert st.fired is not None
        if st.ident in _dl.pending:
            if not _dl.nudge(st.ident, st.tstate) and _dl.precheck(st.ident, st.fired):
                _dl.pending.pop(st.ident, None)
                st.injected = True
                _dl.stats["hookless"] += 1
                _set_async_exc(st.ident, _DeadlineInterrupt)
        elif not held(st, now):
            self.send(st, _DeadlineInterrupt, st.fired)
        st.step = min(st.step * 2, 0.1)
        st.reinject_at = now + st.step

    def poke(self, when: float) -> None:
        """Wake the watchdog if ``when`` comes before its own wake-up."""
        if when < self.next_wake:
            self.next_wake = when
            self.wake.set()

    def scan(self) -> float:
        """Lock held: fire what is due, back up what fired; the next time to look."""
        now = time.monotonic()
        nxt = _NEVER
        for st in list(self.states.values()):
            if st.shield or not st.stack:
                continue
            if st.fired is not None:
                if st.reinject_at <= now and not st.fired._exiting:
                    self.backstop(st, now)
                nxt = min(nxt, st.reinject_at)
                continue
            d = st.deadline()
            if d <= now:
                self.fire(st, now, False)
                nxt = min(nxt, st.reinject_at)
            else:
                nxt = min(nxt, d)
        return nxt

    def run(self) -> None:
        while True:
            # Taken only while this thread holds the GIL (a blocking acquire would hold the
            # lock while waiting for the GIL: see self.wake); busy: a holder is inside a
            # scope's entry or exit for a few lines, so look again at once.
            if not self.lock.acquire(blocking=False):
                time.sleep(0)
                continue
            try:
                self.wake.clear()
                nxt = self.scan()
                self.next_wake = nxt
            finally:
                self.lock.release()
            self.wake.wait(None if nxt == _NEVER else max(nxt - time.monotonic(), 0))


