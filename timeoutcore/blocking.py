"""Deadline-aware blocking primitives: waits that end at the thread's deadline.

On CPython < 3.15 the core's signal knocks a blocking system call loose, but CPython retries
it (PEP 475) without looking at the pending interrupt, so ``time.sleep``, socket calls,
``select`` and lock waits are not stopped by the signal alone. The waits here stop anyway,
by the one technique that needs no help from CPython: a wait with its own timeout,
``min(timeout, remaining())``, ends at the deadline by itself (and CPython's retry loop
recomputes the time left after the core's signal, so it ends promptly), then
``checkpoint()`` raises the scope's interrupt right there.

Every wait here ends at the thread's *stop time* (``timeoutcore._stop``: the hard deadline,
a pending ``soft_raise`` soft limit, an earlier ``reschedule()`` or a ``cancel()``), and is
woken when that time changes while it waits (poll-based waits watch the thread's wake-up
eventfd). Outside any deadline scope every function here behaves like the plain wait it
wraps.
Inside ``shield()`` the deadline is held back: the waits run to their own timeout.

:func:`bounded_wait` is the building block (any wait that takes a timeout); the others are
ready-made: :func:`wait_readable`, :func:`wait_writable`, :func:`acquire` (any lock) and
:func:`socket_timeout` (the timeout to give a socket operation).
"""

from __future__ import annotations

import select
import time
from typing import Any, Callable, Optional, Tuple, TypeVar, Union

from . import _stop, _validate
from ._engine import core

__all__ = [
    "acquire",
    "bounded_wait",
    "socket_timeout",
    "wait_readable",
    "wait_writable",
]

T = TypeVar("T")

#: One wait of :func:`bounded_wait`: called with a timeout in seconds (``None``: no
#: timeout), returns ``(done, value)``.
Step = Callable[[Optional[float]], Tuple[bool, T]]

# The core's functions, looked up once: on the fast path a patched call pays one C call.
_remaining: Callable[[], Optional[float]] = core.remaining
_checkpoint: Callable[[], None] = core.checkpoint
# Held around waits whose cleanup must not be torn by the interrupt (the lock a
# Condition.wait re-acquires, a socket timeout to restore): the engine says what is safe.
_shield: Callable[[], Any] = core.wait_shield
_monotonic = time.monotonic
_stop_begin: Callable[[], None] = _stop.begin
_stop_remaining: Callable[[], Optional[float]] = _stop.remaining
_deliver_due: Callable[[], None] = _stop.deliver_due

_ORIGINAL_ATTR = "__timeoutcore_original__"


#: One entry of ``timeoutcore.patch``'s table: ``make(original) -> wrapper``.
Make = Callable[[Any], Callable[..., Any]]


def original(fn: Any) -> Any:
    """The function a timeoutcore patch wraps (``fn`` itself when it is not one)."""
    return getattr(fn, _ORIGINAL_ATTR, fn)


# Captured unpatched, so that these primitives never go through timeoutcore.patch().
_poll: Callable[[], Any] = original(select.poll)
_POLLIN = select.POLLIN
_POLLOUT = select.POLLOUT
# poll() takes milliseconds as a C int: wait in slices of at most a day.
_MAX_POLL_S = 86400.0


def _is_number(value: Any) -> bool:
    """An int or float that is not NaN (bool included, as the stdlib accepts it)."""
    return isinstance(value, (int, float)) and value == value


def _check_timeout(timeout: Optional[float], fn: str) -> None:
    _validate.seconds(timeout, fn, "timeout", allow_zero=True, allow_none=True, bounded=False)


def bounded_wait(step: Step[T], timeout: Optional[float]) -> T:
    """Run ``step`` -- one wait with a timeout -- so that it ends at this thread's deadline.

    ``step(t)`` waits at most ``t`` seconds (``None``: without a timeout) and returns
    ``(done, value)``; ``done`` is false when it merely timed out. ``bounded_wait`` returns
    the ``value`` of the step that finished the wait: the first one that is done, or the one
    that ran out the caller's ``timeout``. When the deadline comes first it raises the
    scope's interrupt (which the scope turns into ``DeadlineExceeded``).

    Outside a scope, and when ``timeout`` ends before the deadline, this is exactly one
    ``step(timeout)``. Inside ``shield()`` the deadline cannot end the wait: the steps run
    to ``timeout``. ``timeout`` must be ``None`` or a number; it is passed to the first
    step unchanged (negative values included) and later steps get what is left of it.
    """
    end = None if timeout is None else _monotonic() + timeout
    left = timeout
    while True:
        _stop_begin()  # before the stop time is read: a later change wakes the step
        rem = _stop_remaining()
        if rem is None:
            return step(left)[1]
        if rem <= 0.0:
            _checkpoint()  # raises, unless interrupts are held back by shield()
            return step(left)[1]
        # A soft limit that passed (during a shielded step, or while the soft timer was
        # still delivering it): raise it here. After begin(), not before: the soft timer
        # marks a delivered soft exception *then* wakes, and the stop time no longer counts
        # a passed soft limit -- a wake drained by begin() must find the mark here (on a
        # free-threaded build both run truly in parallel: the step then waited for the
        # hard deadline, about 1 wait in 300).
        _deliver_due()
        last = left is not None and left <= rem  # the caller's timeout ends first...
        # A far stop time (a scope of years) is waited for a day at a time: poll() and the
        # selectors take milliseconds as a C int.
        done, value = step(left if last else min(rem, _MAX_POLL_S))
        if done:
            return value
        _checkpoint()
        if end is not None:
            left = max(0.0, end - _monotonic())
            if last and left <= 0.0:  # ...unless a wake ended the step before it
                _deliver_due()  # a passed soft limit first (the loop's next turn would)
                return value


def _fileno(fd: Any) -> int:
    if isinstance(fd, int) and not isinstance(fd, bool):
        n = fd
    elif hasattr(fd, "fileno"):
        n = fd.fileno()
        if not isinstance(n, int):
            raise TypeError(f"fileno() returned {type(n).__name__}, not int")
    else:
        raise TypeError(f"expected a file descriptor or an object with fileno(), not "
                        f"{type(fd).__name__}")
    if n < 0:
        raise ValueError(f"file descriptor cannot be a negative integer ({n})")
    return n


def _poll_step(poller: Any) -> Step[bool]:
    """A step that polls ``poller`` and, inside a scope, this thread's wake-up eventfd (a
    wake alone ends the step as not done: ``bounded_wait`` re-reads the stop time)."""
    wake = _stop.wake_fd() if _remaining() is not None else -1
    if wake >= 0:
        poller.register(wake, _POLLIN)

    def ready_of(events: Any) -> bool:
        return any(fd != wake for fd, _ in events)

    def step(t: Optional[float]) -> Tuple[bool, bool]:
        if t is None:
            ready = ready_of(poller.poll())
            return ready, ready
        t = max(t, 0.0)
        # Long timeouts: slices, each ending on the same absolute time.
        end = _monotonic() + t
        for _ in range(1 + int(t // _MAX_POLL_S)):
            events = poller.poll(min(t, _MAX_POLL_S) * 1000.0)
            ready = ready_of(events)
            t = end - _monotonic()
            if events or t <= 0:
                break
        return ready, ready

    return step


def wait_for(fds: Any, events: int, timeout: Optional[float] = None) -> bool:
    """Wait until one of ``fds`` has one of the poll ``events``; ``False`` on timeout.

    Ends at this thread's deadline with the scope's interrupt. (Used by ``run()``; the
    public one-descriptor forms are :func:`wait_readable` and :func:`wait_writable`.)
    """
    poller = _poll()
    for fd in fds:
        poller.register(_fileno(fd), events)
    return bounded_wait(_poll_step(poller), timeout)


def wait_readable(fd: Union[int, Any], timeout: Optional[float] = None) -> bool:
    """Wait until ``fd`` (a descriptor, or an object with ``fileno()``) is readable.

    Returns ``True`` when it is readable (or has an error or hang-up to report), ``False``
    when ``timeout`` seconds passed first (``None``: no timeout). At this thread's deadline
    it raises the scope's interrupt instead. Based on ``select.poll`` (no ``FD_SETSIZE``
    limit; poll's millisecond timeout is ended promptly at the deadline by the core's
    signal).
    """
    _check_timeout(timeout, "wait_readable()")
    poller = _poll()
    poller.register(_fileno(fd), _POLLIN)
    return bounded_wait(_poll_step(poller), timeout)


def wait_writable(fd: Union[int, Any], timeout: Optional[float] = None) -> bool:
    """Like :func:`wait_readable`, until ``fd`` is writable."""
    _check_timeout(timeout, "wait_writable()")
    poller = _poll()
    poller.register(_fileno(fd), _POLLOUT)
    return bounded_wait(_poll_step(poller), timeout)


def socket_timeout(sock_timeout: Optional[float]) -> Optional[float]:
    """The timeout to give a socket operation so that it ends by this thread's deadline.

    ``sock_timeout`` is the socket's own (``sock.gettimeout()``): ``None`` (blocking), ``0.0``
    (non-blocking) or seconds. Returns ``min(sock_timeout, remaining())``: a socket with its
    own shorter timeout keeps it, a non-blocking socket stays non-blocking, and outside a
    scope the value comes back unchanged. After an operation with the returned timeout
    raised ``socket.timeout``, call ``checkpoint()``: it raises the scope's interrupt if the
    deadline was the cause. The result is never ``0.0`` for a blocking socket: at or past the
    deadline it is a microsecond (so that the operation times out instead of failing with
    ``BlockingIOError``).
    """
    if sock_timeout is not None:
        _check_timeout(sock_timeout, "socket_timeout()")
    rem = _remaining()
    if rem is None or sock_timeout == 0.0:
        return sock_timeout
    if sock_timeout is not None and sock_timeout <= rem:
        return sock_timeout
    return max(rem, 1e-6)


def acquire(lock: Any, blocking: bool = True, timeout: float = -1) -> bool:
    """``lock.acquire(blocking, timeout)`` that ends at this thread's deadline.

    For any lock with the ``threading.Lock`` signature (``Lock``, ``RLock``, ``Semaphore``
    ...). ``timeout=-1`` waits without a timeout, as ``Lock.acquire`` does. Plain
    ``Lock.acquire`` is not changed by ``patch()`` (C lock types cannot be); use this instead.
    """
    if not blocking or _remaining() is None or not _is_number(timeout):
        return bool(lock.acquire(blocking, timeout))

    def step(t: Optional[float]) -> Tuple[bool, bool]:
        got = bool(lock.acquire(True, -1 if t is None else t))
        return got, got

    return bounded_wait(step, None if timeout == -1 else timeout)
