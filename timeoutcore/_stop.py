"""A thread's *stop time*, and the wake-up that tells its waits the stop time changed.

Every wait timeoutcore makes deadline-aware (``bounded_wait`` and what is built on it: the
patched stdlib waits, ``run()``, subprocess and socket waits) follows one rule: it ends
when the thread's *current* stop time passes, or when that time changes while it waits.
The stop time is the earliest of

* the hard deadline (the engine's ``current_deadline()``, which already includes an
  earlier ``reschedule()`` and a ``cancel()``, i.e. ``reschedule(now)``);
* the soft limit of every active ``soft_raise`` scope of the thread that has not passed yet
  (registered here by ``_hooks`` at the scope's entry, dropped at its exit).

A stop time known in advance needs no help: the wait's own timeout ends it. A change made
by another thread (``reschedule``, ``cancel``, the soft timer delivering a soft exception
or finding it refused by a shielded wait step) calls :func:`wake` with the waiting thread's
id, and the wait learns of it in one of two ways, whichever its blocking primitive allows:

* an *eventfd* per thread (:func:`wake_fd`), which poll/select based waits watch along
  with their own descriptors;
* a *waker* callback (:func:`add_waker`) for waits on a lock (``Condition.wait``).

Lost wake-ups are ruled out by a per-thread generation counter: :func:`begin` (called by a
wait before it reads the stop time) drains the eventfd and notes the generation, and
:func:`add_waker` refuses (returns False) when a wake came in since, so the wait re-reads
the stop time instead of blocking on stale information.

Cost: nothing outside a scope (the patched calls test ``remaining() is None`` first); inside
one, a thread-local look-up, and a read of the eventfd per wait.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Optional

from ._engine import core, engine_of
from .errors import SoftDeadlineExceeded

_current_deadline: Callable[[], Optional[float]] = core.current_deadline
_monotonic = time.monotonic


class _Record:
    """What one thread's waits and its wakers share (see the module docstring)."""

    __slots__ = ("__weakref__", "fd", "gen", "ident", "listened", "lock", "soft",
                 "soft_claimed", "soft_hit", "wait_gen", "wakers")

    def __init__(self, ident: int) -> None:
        self.ident = ident
        self.lock = threading.Lock()
        self.fd = -1  # the eventfd, created on first use
        self.gen = 0  # bumped by every wake()
        self.wait_gen = 0  # the generation the current wait started from
        self.soft: dict[Any, float] = {}  # soft_raise scope -> its soft time (pending)
        self.soft_claimed: set[Any] = set()  # scopes whose delivery is being attempted
        self.soft_hit: set[Any] = set()  # active scopes whose soft exception was sent
        self.wakers: list[Callable[[], None]] = []
        self.listened = False


class _Owner:
    """Held in a thread-local: when the thread ends, its record goes and its fd closes."""

    __slots__ = ("rec",)

    def __init__(self, rec: _Record) -> None:
        self.rec = rec

    def __del__(self, _close: Callable[[int], None] = os.close) -> None:
        rec = self.rec
        records = _records
        if records is not None:  # None at interpreter shutdown
            records.pop(rec.ident, None)
        with rec.lock:  # never while wake() writes to it: the number could be reused
            if rec.fd >= 0:
                try:
                    _close(rec.fd)
                except OSError:
                    pass
                rec.fd = -1


_records: dict[int, _Record] = {}
_local = threading.local()
#: Called with a thread id after every wake() (``timeoutcore.interrupt`` listens).
listeners: list[Callable[[int], None]] = []


def record() -> _Record:
    """This thread's record (created on first use)."""
    owner: Optional[_Owner] = getattr(_local, "owner", None)
    if owner is None:
        ident = threading.get_ident()
        rec = _Record(ident)
        _records[ident] = rec
        owner = _local.owner = _Owner(rec)
    return owner.rec


def stop_time() -> Optional[float]:
    """This thread's current stop time (``time.monotonic()``), ``None`` when unguarded.

    A soft limit that has passed is no longer counted: the soft timer is delivering it, and
    wakes the thread when it has."""
    hard = _current_deadline()
    if hard is None:
        return None
    owner: Optional[_Owner] = getattr(_local, "owner", None)
    if owner is None or not owner.rec.soft:
        return hard
    return _earliest(owner.rec.soft, hard, _monotonic())


def remaining() -> Optional[float]:
    """Seconds until :func:`stop_time` (may be negative), ``None`` when unguarded.

    Zero or less only when the hard deadline has passed (or a cancel came): a soft limit
    counts only while it is ahead."""
    hard = _current_deadline()
    if hard is None:
        return None
    # Rule: one clock reading both decides which soft limits are still ahead and measures
    # the time left. Read twice (stop_time(), then the clock again), a soft limit that fell
    # due between the two readings made the time left negative although neither the hard
    # deadline had passed nor had the soft exception been sent: a wait took that for "the
    # stop has come", found nothing to raise, and returned early as if done (a Thread.join
    # under soft_raise returned with the thread still running).
    now = _monotonic()
    owner: Optional[_Owner] = getattr(_local, "owner", None)
    if owner is not None and owner.rec.soft:
        hard = _earliest(owner.rec.soft, hard, now)
    return hard - now


def _earliest(soft: dict[Any, float], hard: float, now: float) -> float:
    """The earliest of ``hard`` and the soft times still ahead of ``now``."""
    for when in soft.values():
        if now < when < hard:
            hard = when
    return hard


def begin() -> None:
    """Called by a wait before it reads the stop time: drain the eventfd, note the
    generation (see :func:`add_waker`)."""
    rec = record()
    rec.wait_gen = rec.gen
    if rec.fd >= 0:
        try:
            os.eventfd_read(rec.fd)
        except BlockingIOError:
            pass


def wake_fd() -> int:
    """This thread's eventfd: readable after a :func:`wake` (drained by :func:`begin`)."""
    rec = record()
    if rec.fd < 0:
        fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        with rec.lock:
            rec.fd = fd
    return rec.fd


def add_waker(fn: Callable[[], None]) -> bool:
    """Call ``fn()`` at the next wake of this thread (until :func:`remove_waker`).

    False (and nothing registered) when a wake came in since :func:`begin`: the caller
    must not block, but re-read the stop time."""
    rec = record()
    with rec.lock:
        if rec.gen != rec.wait_gen:
            return False
        rec.wakers.append(fn)
    return True


def remove_waker(fn: Callable[[], None]) -> None:
    rec = record()
    with rec.lock:
        try:
            rec.wakers.remove(fn)
        except ValueError:
            pass


def wake(ident: Optional[int]) -> None:
    """Tell thread ``ident``'s waits that its stop time changed (from any thread)."""
    rec = _records.get(ident) if ident is not None else None
    if rec is not None:
        with rec.lock:
            rec.gen += 1
            wakers = list(rec.wakers)
            # Under the lock: the owner closes the fd under it too, so this never writes
            # into a descriptor number the process has since reused for something else.
            if rec.fd >= 0:
                try:
                    os.eventfd_write(rec.fd, 1)
                except OSError:
                    pass
        for fn in wakers:
            fn()
    if ident is not None:
        for listener in listeners:
            listener(ident)


# --- soft limits that raise (registered by _hooks in the guarded thread) ---------------------


def add_soft(scope: Any, when: float) -> None:
    """A ``soft_raise`` scope of this thread was entered: its soft time is a stop time."""
    record().soft[scope] = when


def remove_soft(scope: Any) -> None:
    """The scope exited."""
    rec = record()
    rec.soft.pop(scope, None)
    rec.soft_hit.discard(scope)
    rec.soft_claimed.discard(scope)


def deliver_soft(scope: Any) -> bool:
    """Raise ``scope``'s soft exception in its thread, once, and wake its waits.

    Called by the soft timer at the soft limit and by the guarded thread itself between two
    steps of a wait (a wait whose steps are shielded would otherwise refuse it for as long
    as it waits). True when it is delivered (now or before); False when the core refused
    (the block is shielded): the soft timer tries again later, and a refusal seen from
    another thread wakes the guarded thread's wait so that it can deliver it itself."""
    rec = _records.get(scope.thread_ident)
    if rec is None:
        rec = record() if scope.thread_ident == threading.get_ident() else None
    if rec is not None:
        with rec.lock:
            if scope in rec.soft_claimed:
                return True
            rec.soft_claimed.add(scope)
            # Marked before the raise, not after: the exception can surface in the thread
            # before this call returns (free-threaded: at once, in parallel), and a wait it
            # ends reads the mark to know that a stop ended it (stopping(): a scope-owned
            # child is killed then; unmarked, about 1 Popen.wait in 2000 left it running).
            rec.soft_hit.add(scope)
    exc = SoftDeadlineExceeded if scope._soft_raise is True else scope._soft_raise
    if not engine_of(scope)._raise_in_scope(scope, exc):
        if rec is not None:
            rec.soft_hit.discard(scope)
            rec.soft_claimed.discard(scope)
        if scope.thread_ident != threading.get_ident():
            # Refused because the thread is shielded -- often by a wait's own shield (a
            # Condition.wait step): wake that wait, so that between two steps it delivers
            # the soft exception itself (deliver_due). Without this wake the step slept on
            # to the hard deadline, the stop time no longer counting the passed soft limit
            # (free-threaded: about 1 Event.wait in 300 when the step's own timeout and the
            # soft timer came together).
            wake(scope.thread_ident)
        return False
    wake(scope.thread_ident)
    return True


def deliver_due() -> None:
    """In the guarded thread, between two steps of a wait: raise, right here, a soft
    exception whose time has passed (delivering it first if the soft timer has not).

    Right here, because the native engine delivers a soft exception at the thread's next
    line outside protected code (timeoutcore.protect), and a wait inside ``Queue.get`` or
    ``Event.wait`` would otherwise go back to waiting -- until the hard deadline -- with
    the soft exception pending. Its checkpoint is the explicit raise point."""
    owner: Optional[_Owner] = getattr(_local, "owner", None)
    if owner is None or not owner.rec.soft:
        return
    rec = owner.rec
    now = _monotonic()
    for scope, when in list(rec.soft.items()):
        if when <= now and (scope in rec.soft_hit or scope not in rec.soft_claimed):
            if scope in rec.soft_hit or deliver_soft(scope):
                engine_of(scope).checkpoint()


def soft_times(ident: int) -> list[float]:
    """The pending soft times of thread ``ident`` (for a watcher in another thread)."""
    rec = _records.get(ident)
    return [] if rec is None else list(rec.soft.values())


def stopping() -> bool:
    """Has a stop reached this thread: its hard deadline passed (or a cancel), or a soft
    exception was sent (or is being sent) to one of its active scopes?"""
    hard = _current_deadline()
    if hard is None:
        return False
    if hard <= _monotonic():
        return True
    owner: Optional[_Owner] = getattr(_local, "owner", None)
    return owner is not None and bool(owner.rec.soft_hit)
