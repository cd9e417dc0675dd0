"""Deadline-aware blocking primitives: waits that end at the thread's deadline.

On CPython < 3.15 the core's signal knocks a blocking system call loose, but CPython retries
it (PEP 475) without looking at the pending interrupt, so ``time.sleep``, socket calls,
``select`` and lock waits are not stopped by the signal alone. The waits here stop anyway,
by the one technique that needs no help from CPython: a wait with its own timeout,
``min(timeout, remaining())``, ends at the deadline by itself (and CPython's retry loop
recomputes the time left after the core's signal, so it ends promptly), then
``checkpoint()`` raises the scope's interrupt right there.

Outside any deadline scope every function here behaves like the plain wait it wraps.
Inside ``shield()`` the deadline is held back: the waits run to their own timeout.

:func:`bounded_wait` is the building block (any wait that takes a timeout); the others are
ready-made: :func:`wait_readable`, :func:`wait_writable`, :func:`acquire` (any lock) and
:func:`socket_timeout` (the timeout to give a socket operation).
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import socket
import time
from typing import Any, Callable, Optional, Tuple, TypeVar, Union

from . import _validate
from ._engine import ENGINE, core

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
# Condition.wait re-acquires, a socket timeout to restore). The fallback engine's shield is
# Python code that takes the engine's lock, and that engine itself waits on threading
# primitives while holding it (starting its watchdog thread): there, no shield -- its
# interrupts are asynchronous anyway, exactly as without the patch.
_shield: Callable[[], Any] = core.shield if ENGINE == "native" else contextlib.nullcontext
_monotonic = time.monotonic

_ORIGINAL_ATTR = "__timeoutcore_original__"


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
        rem = _remaining()
        if rem is None or (left is not None and left <= rem):
            return step(left)[1]
        if rem <= 0.0:
            _checkpoint()  # raises, unless interrupts are held back by shield()
            return step(left)[1]
        done, value = step(rem)
        if done:
            return value
        _checkpoint()
        if end is not None:
            left = max(0.0, end - _monotonic())


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
    def step(t: Optional[float]) -> Tuple[bool, bool]:
        if t is None:
            ready = bool(poller.poll())
            return ready, ready
        t = max(t, 0.0)
        # Long timeouts: slices, each ending on the same absolute time.
        end = _monotonic() + t
        for _ in range(1 + int(t // _MAX_POLL_S)):
            ready = bool(poller.poll(min(t, _MAX_POLL_S) * 1000.0))
            t = end - _monotonic()
            if ready or t <= 0:
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
    ``Lock.acquire`` is not changed by ``patch()`` (see the README); use this instead.
    """
    if not blocking or _remaining() is None or not _is_number(timeout):
        return bool(lock.acquire(blocking, timeout))

    def step(t: Optional[float]) -> Tuple[bool, bool]:
        got = bool(lock.acquire(True, -1 if t is None else t))
        return got, got

    return bounded_wait(step, None if timeout == -1 else timeout)


# --- sockets: the scoped paths of the patched methods (timeoutcore.patch) -----------------

_DONTWAIT: int = getattr(socket, "MSG_DONTWAIT", 0)
_EAGAIN = errno.EAGAIN
_EWOULDBLOCK = errno.EWOULDBLOCK


def _is_flags(value: Any) -> bool:
    """An int (``socket.MSG_*`` are ``IntFlag`` members), not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def _timed_out() -> OSError:
    return socket.timeout("timed out")


def _sock_wait(sock: Any, events: int, end: Optional[float]) -> None:
    """Wait for ``events`` on ``sock`` until ``end`` (monotonic; ``None``: no limit) or the
    deadline; raise ``socket.timeout`` at ``end``."""
    poller = _poll()
    poller.register(sock.fileno(), events)
    left = None if end is None else max(0.0, end - _monotonic())
    if not bounded_wait(_poll_step(poller), left):
        raise _timed_out()


def _with_dontwait(args: tuple[Any, ...], kwargs: dict[str, Any], index: int,
                   keywords: bool) -> Optional[tuple[tuple[Any, ...], dict[str, Any]]]:
    """``args``/``kwargs`` with ``MSG_DONTWAIT`` added to the flags at ``index``; ``None``
    when the arguments are not well-formed (the caller then lets the original complain)."""
    if "flags" in kwargs:
        if not keywords or not _is_flags(kwargs["flags"]):
            return None
        kwargs = dict(kwargs, flags=kwargs["flags"] | _DONTWAIT)
        return args, kwargs
    if len(args) > index:
        if not _is_flags(args[index]):
            return None
        return args[:index] + (args[index] | _DONTWAIT,) + args[index + 1:], kwargs
    if len(args) == index:
        return args + (_DONTWAIT,), kwargs
    if keywords and args:
        return args, dict(kwargs, flags=_DONTWAIT)
    return None


def sock_io(sock: Any, orig: Callable[..., Any], args: tuple[Any, ...],
            kwargs: dict[str, Any], events: int, flags_index: int, keywords: bool) -> Any:
    """A socket receive/send call (``orig(sock, *args, **kwargs)``) inside a scope.

    Blocking socket: try the call with ``MSG_DONTWAIT`` (the socket itself is left alone,
    so other threads using it see no change), and on ``EAGAIN`` wait for readiness until
    the deadline. Socket with a timeout longer than the time left: wait for readiness until
    the deadline (``socket.timeout`` at the socket's own timeout), then make the call.
    """
    timeout = sock.gettimeout()
    rem = _remaining()
    if rem is None or timeout == 0.0 or (timeout is not None and timeout <= rem):
        return orig(sock, *args, **kwargs)
    if sock.fileno() < 0 or not _DONTWAIT:
        return orig(sock, *args, **kwargs)
    if timeout is not None:
        _sock_wait(sock, events, _monotonic() + timeout)
        return orig(sock, *args, **kwargs)
    fixed = _with_dontwait(args, kwargs, flags_index, keywords)
    if fixed is None:
        return orig(sock, *args, **kwargs)
    dargs, dkwargs = fixed
    return _blocking_io(sock, orig, dargs, dkwargs, events)


def _blocking_io(sock: Any, orig: Callable[..., Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any], events: int) -> Any:
    while True:
        try:
            return orig(sock, *args, **kwargs)
        except BlockingIOError:
            pass
        _sock_wait(sock, events, None)  # outside the handler: no chained EAGAIN


_RUN_ORIGINAL = object()


def sock_send(sock: Any, orig_send: Callable[..., Any], args: tuple[Any, ...],
              kwargs: dict[str, Any], sendall: bool) -> Any:
    """``send``/``sendall`` inside a scope (``orig_send`` is the unpatched ``send``).

    Returns :data:`_RUN_ORIGINAL` when the original should run unchanged (not in a scope,
    a timeout that ends first, a non-blocking socket, arguments it should reject itself).
    A blocking stream socket's ``send`` returns once everything is queued, like the kernel's
    blocking ``send``; ``sendall`` keeps its total-time meaning of a socket timeout.
    """
    timeout = sock.gettimeout()
    rem = _remaining()
    if (rem is None or timeout == 0.0 or (timeout is not None and timeout <= rem)
            or sock.fileno() < 0 or not _DONTWAIT or kwargs or not 1 <= len(args) <= 2
            or (len(args) == 2 and not _is_flags(args[1]))):
        return _RUN_ORIGINAL
    data = args[0]
    flags: int = args[1] if len(args) == 2 else 0
    blocking = timeout is None
    end = None if blocking else _monotonic() + timeout
    whole = sendall or (blocking and sock.type == socket.SOCK_STREAM)
    payload: Any = data  # the caller's own object first: argument errors are the original's
    view: Optional[memoryview] = None
    sent = 0
    while True:
        if blocking:
            try:
                n = orig_send(sock, payload, flags | _DONTWAIT)
            except BlockingIOError:
                n = -1
            if n < 0:
                _sock_wait(sock, _POLLOUT, None)
                continue
        else:
            _sock_wait(sock, _POLLOUT, end)
            n = orig_send(sock, payload, flags)
        sent += n
        if view is None:
            view = memoryview(data)
            if view.ndim != 1 or view.itemsize != 1:
                view = view.cast("B")
        if sent >= view.nbytes or not whole:
            return None if sendall else sent
        payload = view[sent:]


def sock_accept(sock: Any, orig: Callable[[Any], Any]) -> Any:
    """``socket._accept()`` inside a scope: wait until a connection is pending or the
    deadline, then accept (see the README: a lost race with another acceptor blocks)."""
    timeout = sock.gettimeout()
    rem = _remaining()
    if (rem is None or timeout == 0.0 or (timeout is not None and timeout <= rem)
            or sock.fileno() < 0):
        return orig(sock)
    _sock_wait(sock, _POLLIN, None if timeout is None else _monotonic() + timeout)
    return orig(sock)


def sock_connect(sock: Any, orig: Callable[[Any, Any], Any], address: Any, ex: bool) -> Any:
    """``connect``/``connect_ex`` inside a scope.

    A connection needs a non-blocking socket to be waited for, so the socket's timeout is
    set to the time left for the duration of the call (under ``shield()``, so it is always
    restored) -- the one patched socket call that changes the socket's state while it runs.
    """
    timeout = sock.gettimeout()
    rem = _remaining()
    if (rem is None or timeout == 0.0 or (timeout is not None and timeout <= rem)
            or sock.fileno() < 0):
        return orig(sock, address)
    if rem <= 0.0:
        _checkpoint()  # raises unless shielded; shielded: the original, unchanged
        return orig(sock, address)
    end = None if timeout is None else _monotonic() + timeout
    timed_out = False
    result: Any = None
    with _shield():
        sock.settimeout(max(rem, 1e-6))
        try:
            result = orig(sock, address)
        except socket.timeout:
            timed_out = True
        finally:
            sock.settimeout(timeout)
    if ex and result in (_EAGAIN, _EWOULDBLOCK):
        timed_out = True
    if not timed_out:
        return result
    _checkpoint()  # the deadline ended it: raise here
    # Shielded (or woken early): the attempt goes on; finish it within the caller's timeout.
    try:
        _sock_wait(sock, _POLLOUT, end)
    except socket.timeout:
        if ex:
            return _EAGAIN
        raise
    err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if ex:
        return err
    if err:
        raise OSError(err, os.strerror(err))
    return None


def ssl_call(sock: Any, orig: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any], reading: bool) -> Any:
    """An ``ssl.SSLSocket`` call (``read``, ``write``, ``send``, ``do_handshake``) inside a
    scope.

    The TLS record layer runs inside OpenSSL, which retries after ``EINTR`` on a blocking
    socket; so, like ``connect``, the call runs with the socket's timeout set to the time
    left (under ``shield()``, so it is always restored) and ``checkpoint()`` follows a
    timeout that the deadline caused. TLS objects are not used by two threads at once, so
    changing the timeout for the call is safe there.
    """
    timeout = sock.gettimeout()
    rem = _remaining()
    if (rem is None or timeout == 0.0 or (timeout is not None and timeout <= rem)
            or sock.fileno() < 0 or getattr(sock, "_sslobj", None) is None):
        return orig(sock, *args, **kwargs)
    if reading and sock.pending():
        return orig(sock, *args, **kwargs)  # decrypted data waiting: returns at once
    end = None if timeout is None else _monotonic() + timeout
    while True:
        rem = _remaining()
        left = None if end is None else end - _monotonic()
        if rem is None or (left is not None and left <= rem):
            return orig(sock, *args, **kwargs)  # the socket's own timeout ends it first
        if rem <= 0.0:
            _checkpoint()  # raises, unless shielded: then the original, unchanged
            return orig(sock, *args, **kwargs)
        timed_out = False
        with _shield():
            sock.settimeout(rem)
            try:
                return orig(sock, *args, **kwargs)
            except socket.timeout:
                timed_out = True
            finally:
                sock.settimeout(timeout)
        if timed_out:
            _checkpoint()
