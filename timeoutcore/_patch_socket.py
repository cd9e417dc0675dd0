"""The socket and TLS part of ``patch()``: the patched methods and their scoped paths.

Imported by ``timeoutcore.patch`` when ``patch()`` runs, never by ``import timeoutcore``.
Each wrapper starts with one C call (``remaining() is None``: not in a scope) and then calls
the original unchanged; inside a scope it takes the scoped path below, built on
``timeoutcore.blocking``'s waits.

The rule: **inside a scope a patched call never blocks anywhere but in a wait that the
thread's stop wake reaches** (``blocking.bounded_wait`` over ``poll`` and the thread's
eventfd), whatever the socket's own timeout. A stop that moves earlier while the call
waits -- ``cancel()``, an earlier ``reschedule()``, ``cancel_all()``, a ``soft_raise`` soft
limit -- therefore ends it at once, and the socket's own timeout is kept exactly: the same
wait ends with ``socket.timeout`` when the socket's timeout, counted from the call's start,
comes first. Rejected: running the original blocking call whenever the socket's own timeout
ends before the stop time (the earlier design); nothing could wake it when the stop time
moved, so a ``cancel()`` waited for the socket's timeout (redis-py's 5 s, ``requests``'s).

* ``recv*``/``send*``/``sendto`` on a blocking socket: tried with ``MSG_DONTWAIT``, waited
  for on ``EAGAIN`` (the socket itself is not changed);
* the same on a socket with a timeout: waited for readiness first (a ready socket costs one
  ``poll(0)``), then the original, which finds the socket ready and does not block;
* ``accept``: wait for a pending connection, then accept;
* ``connect``/``connect_ex``: started non-blocking, the connection waited for, its result
  read from ``SO_ERROR``;
* every ``ssl.SSLSocket`` record-layer call (``read``/``write``/``send`` and so ``recv*``,
  ``sendall``; ``do_handshake``; ``unwrap``): OpenSSL runs non-blocking, and on
  ``SSLWantReadError``/``SSLWantWriteError`` the call waits for the descriptor and retries.
  A readable TLS socket is not a readable TLS stream (a TLS 1.3 session ticket is a record
  without application data): a blocking read after a readiness wait would sit inside
  OpenSSL, out of the wake's reach, for the rest of the time.

``connect`` and the TLS calls set the socket's timeout to ``0.0`` for the length of each
attempt (never for a wait) under the engine's wait shield, so it is always restored before
anything can raise. This is sound only because nobody else uses the socket meanwhile: a
socket being connected has no other user, and a TLS object is never used by two threads at
once (OpenSSL's ``SSL`` object is not thread-safe; CPython does not lock it).

Known limit: a socket with a timeout, or an ``accept`` on any socket, whose readiness a
second thread takes away between the wait and the original call (two threads reading one
socket) blocks in the original up to its own timeout (a blocking one: until ready).
"""

from __future__ import annotations

import errno
import os
import socket
from typing import Any, Callable, Optional

try:
    import ssl
except ImportError:  # pragma: no cover - Python built without OpenSSL
    ssl = None  # type: ignore[assignment]

from .blocking import (
    _POLLIN,
    Make,
    _POLLOUT,
    _monotonic,
    _poll,
    _poll_step,
    _remaining,
    _shield,
    bounded_wait,
    original,
)

_DONTWAIT: int = getattr(socket, "MSG_DONTWAIT", 0)
_EAGAIN = errno.EAGAIN
_EWOULDBLOCK = errno.EWOULDBLOCK
# A non-blocking connect in progress (EINTR: POSIX says it goes on asynchronously too).
_CONNECTING = (errno.EINPROGRESS, errno.EINTR)


def _is_flags(value: Any) -> bool:
    """An int (``socket.MSG_*`` are ``IntFlag`` members), not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def _sock_wait(sock: Any, events: int, end: Optional[float],
               message: str = "timed out") -> None:
    """Wait for ``events`` on ``sock`` until ``end`` (monotonic; ``None``: no limit) or the
    thread's stop time, woken by its stop wake; ``socket.timeout(message)`` at ``end``.

    A socket that is ready already costs one ``poll(0)``: the stop is not looked at then
    (the call goes ahead; a stop that passed surfaces at the next line, as anywhere)."""
    poller = _poll()
    poller.register(sock.fileno(), events)
    if poller.poll(0):
        return
    left = None if end is None else max(0.0, end - _monotonic())
    if not bounded_wait(_poll_step(poller), left):
        raise socket.timeout(message)


def _with_dontwait(args: tuple[Any, ...], kwargs: dict[str, Any], index: int,
                   keywords: bool) -> Optional[tuple[tuple[Any, ...], dict[str, Any]]]:
    """``args``/``kwargs`` with ``MSG_DONTWAIT`` added to the flags at ``index``; ``None``
    when the arguments are not well-formed (the caller then lets the original complain) or
    the caller asked for ``MSG_DONTWAIT`` itself (its ``EAGAIN`` is the caller's answer)."""
    if "flags" in kwargs:
        if not keywords or not _is_flags(kwargs["flags"]) or kwargs["flags"] & _DONTWAIT:
            return None
        kwargs = dict(kwargs, flags=kwargs["flags"] | _DONTWAIT)
        return args, kwargs
    if len(args) > index:
        if not _is_flags(args[index]) or args[index] & _DONTWAIT:
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
    so other threads using it see no change), and on ``EAGAIN`` wait for readiness. Socket
    with a timeout: wait for readiness (``socket.timeout`` at the socket's own timeout),
    then make the call. Either wait ends at the thread's stop time, and is woken when that
    moves earlier.
    """
    timeout = sock.gettimeout()
    if timeout == 0.0 or sock.fileno() < 0:
        return orig(sock, *args, **kwargs)
    if timeout is not None:
        _sock_wait(sock, events, _monotonic() + timeout)
        return orig(sock, *args, **kwargs)
    fixed = _with_dontwait(args, kwargs, flags_index, keywords)
    if fixed is None:
        return orig(sock, *args, **kwargs)
    dargs, dkwargs = fixed
    while True:
        try:
            return orig(sock, *dargs, **dkwargs)
        except BlockingIOError:
            pass
        _sock_wait(sock, events, None)  # outside the handler: no chained EAGAIN


_RUN_ORIGINAL = object()


def sock_send(sock: Any, orig_send: Callable[..., Any], args: tuple[Any, ...],
              kwargs: dict[str, Any], sendall: bool) -> Any:
    """``send``/``sendall`` inside a scope (``orig_send`` is the unpatched ``send``).

    Returns :data:`_RUN_ORIGINAL` when the original should run unchanged (a non-blocking
    socket, ``MSG_DONTWAIT`` in the caller's flags, arguments it should reject itself). A blocking stream socket's ``send``
    returns once everything is queued, like the kernel's blocking ``send``; ``sendall``
    keeps CPython's meaning of a socket timeout: the whole call's, from its start.
    """
    timeout = sock.gettimeout()
    if (timeout == 0.0 or sock.fileno() < 0 or kwargs or not 1 <= len(args) <= 2
            or (len(args) == 2 and (not _is_flags(args[1]) or args[1] & _DONTWAIT))):
        return _RUN_ORIGINAL  # (a caller's own MSG_DONTWAIT: its EAGAIN is the answer)
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
    """``socket._accept()`` inside a scope: wait until a connection is pending (at most the
    socket's own timeout), then accept (see the module's known limit)."""
    timeout = sock.gettimeout()
    if timeout == 0.0 or sock.fileno() < 0:
        return orig(sock)
    _sock_wait(sock, _POLLIN, None if timeout is None else _monotonic() + timeout)
    return orig(sock)


def sock_connect(sock: Any, orig: Callable[[Any, Any], Any],
                 orig_connect_ex: Callable[[Any, Any], int], address: Any, ex: bool) -> Any:
    """``connect`` (``ex`` false) or ``connect_ex`` inside a scope.

    The connection is started with the socket non-blocking for that one system call
    (under the wait shield: its timeout is always restored), then waited for like any
    other socket wait; a connection that does not complete within the socket's own
    timeout raises ``socket.timeout`` (``connect_ex``: returns ``EWOULDBLOCK``), as
    CPython's own. The outcome is CPython's: ``SO_ERROR`` raised as ``OSError`` (its
    subclass for the errno) or returned by ``connect_ex``.
    """
    timeout = sock.gettimeout()
    if timeout == 0.0 or sock.fileno() < 0:
        return orig(sock, address)
    end = None if timeout is None else _monotonic() + timeout
    with _shield():
        sock.settimeout(0.0)
        try:
            err = orig_connect_ex(sock, address)
        finally:
            sock.settimeout(timeout)
    if err in _CONNECTING:
        try:
            _sock_wait(sock, _POLLOUT, end)
        except socket.timeout:
            if ex:
                return _EWOULDBLOCK
            raise
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err == errno.EISCONN:
            err = 0
    elif err == _EAGAIN and timeout is None:
        # A Unix socket whose listener's backlog is full: no readiness to wait for (a
        # blocking connect sleeps in the kernel until there is room). The original does it.
        return orig(sock, address)
    if ex:
        return err
    if err:
        raise OSError(err, os.strerror(err))
    return None


# What a TLS call's socket.timeout says: CPython's _ssl messages.
_TLS_READ, _TLS_WRITE, _TLS_HANDSHAKE, _TLS_SHUTDOWN = range(4)
_TLS_MESSAGES = {
    _TLS_READ: "The read operation timed out",
    _TLS_WRITE: "The write operation timed out",
    _TLS_HANDSHAKE: "The handshake operation timed out",
}


def ssl_call(sock: Any, orig: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any], op: int) -> Any:
    """An ``ssl.SSLSocket`` call inside a scope (``op``: one of the ``_TLS_*`` kinds).

    Each attempt runs OpenSSL non-blocking: the socket's timeout is ``0.0`` for the length
    of the attempt only, under the wait shield, so it is restored before anything can
    raise (sound because a TLS object is never used by two threads at once, see the module
    docstring). ``SSLWantReadError``/``SSLWantWriteError`` -- no record yet, or one
    without application data such as a TLS 1.3 session ticket -- is waited for where the
    stop wake reaches the wait, then the attempt is retried with the same arguments (what
    OpenSSL requires of a retried write). The socket's own timeout counts from the call's
    start and raises ``socket.timeout`` with ``_ssl``'s message.
    """
    timeout = sock.gettimeout()
    if timeout == 0.0 or sock.fileno() < 0 or getattr(sock, "_sslobj", None) is None:
        return orig(sock, *args, **kwargs)
    if op == _TLS_READ and sock.pending():
        return orig(sock, *args, **kwargs)  # decrypted data waiting: returns at once
    end = None if timeout is None else _monotonic() + timeout
    while True:
        with _shield():
            sock.settimeout(0.0)
            try:
                return orig(sock, *args, **kwargs)
            except ssl.SSLWantReadError:
                events = _POLLIN
            except ssl.SSLWantWriteError:
                events = _POLLOUT
            finally:
                sock.settimeout(timeout)
        message = _TLS_MESSAGES.get(op) or _TLS_MESSAGES[
            _TLS_READ if events == _POLLIN else _TLS_WRITE]
        _sock_wait(sock, events, end, message)  # outside the handler: nothing chained


# --- the wrappers --------------------------------------------------------------------------


def _make_sock_io(orig: Callable[..., Any], events: int, flags_index: int,
                  keywords: bool) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _remaining() is None:
            return orig(self, *args, **kwargs)
        return sock_io(self, orig, args, kwargs, events, flags_index, keywords)

    return method


def _make_sendto(orig: Callable[..., Any]) -> Callable[..., Any]:
    def sendto(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _remaining() is None:
            return orig(self, *args, **kwargs)
        # sendto(data, address) or sendto(data, flags, address)
        if not kwargs and len(args) == 2:
            args = (args[0], 0, args[1])
        elif kwargs or len(args) != 3 or not _is_flags(args[1]):
            return orig(self, *args, **kwargs)
        return sock_io(self, orig, args, {}, _POLLOUT, 1, False)

    return sendto


def _make_send(orig_send: Callable[..., Any], orig: Callable[..., Any],
               sendall: bool) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _remaining() is None:
            return orig(self, *args, **kwargs)
        result = sock_send(self, orig_send, args, kwargs, sendall)
        if result is _RUN_ORIGINAL:
            return orig(self, *args, **kwargs)
        return result

    return method


def _make_accept(orig: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def _accept(self: Any) -> Any:
        if _remaining() is None:
            return orig(self)
        return sock_accept(self, orig)

    return _accept


def _make_connect(orig_connect_ex: Callable[..., Any], orig: Callable[..., Any],
                  ex: bool) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _remaining() is None or kwargs or len(args) != 1:
            return orig(self, *args, **kwargs)
        return sock_connect(self, orig, orig_connect_ex, args[0], ex)

    return method


def _make_ssl(orig: Callable[..., Any], op: int) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _remaining() is None:
            return orig(self, *args, **kwargs)
        return ssl_call(self, orig, args, kwargs, op)

    return method


def _make_handshake(orig: Callable[..., Any]) -> Callable[..., Any]:
    def do_handshake(self: Any, *args: Any, **kwargs: Any) -> Any:
        # ``block`` only matters on a non-blocking socket (it makes the handshake block),
        # which the scoped path leaves to the original; there it would undo the attempt's
        # non-blocking mode, so a well-formed ``block`` is dropped.
        if (_remaining() is None or len(args) + len(kwargs) > 1
                or (kwargs and "block" not in kwargs)):
            return orig(self, *args, **kwargs)
        if self.gettimeout() == 0.0:
            return orig(self, *args, **kwargs)
        return ssl_call(self, orig, (), {}, _TLS_HANDSHAKE)

    return do_handshake


# --- the table ---------------------------------------------------------------------------


def targets() -> list[tuple[str, Any, str, Make]]:
    """(group, owner, attribute, make(original) -> wrapper) for the socket and TLS
    methods; no socket entries where ``MSG_DONTWAIT`` does not exist."""
    sock = socket.socket
    out: list[tuple[str, Any, str, Make]] = []
    if _DONTWAIT:
        out += [
            ("socket", sock, "recv", lambda o: _make_sock_io(o, _POLLIN, 1, False)),
            ("socket", sock, "recvfrom", lambda o: _make_sock_io(o, _POLLIN, 1, False)),
            ("socket", sock, "recv_into", lambda o: _make_sock_io(o, _POLLIN, 2, True)),
            ("socket", sock, "recvfrom_into", lambda o: _make_sock_io(o, _POLLIN, 2, True)),
            ("socket", sock, "send",
             lambda o: _make_send(original(socket.socket.send), o, False)),
            ("socket", sock, "sendall",
             lambda o: _make_send(original(socket.socket.send), o, True)),
            ("socket", sock, "sendto", _make_sendto),
            ("socket", sock, "_accept", _make_accept),
            ("socket", sock, "connect",
             lambda o: _make_connect(original(socket.socket.connect_ex), o, False)),
            ("socket", sock, "connect_ex",
             lambda o: _make_connect(original(socket.socket.connect_ex), o, True)),
        ]
    if ssl is not None:
        tls = ssl.SSLSocket
        out += [
            ("ssl", tls, "read", lambda o: _make_ssl(o, _TLS_READ)),
            ("ssl", tls, "write", lambda o: _make_ssl(o, _TLS_WRITE)),
            ("ssl", tls, "send", lambda o: _make_ssl(o, _TLS_WRITE)),
            ("ssl", tls, "do_handshake", _make_handshake),
            ("ssl", tls, "unwrap", lambda o: _make_ssl(o, _TLS_SHUTDOWN)),
        ]
    return out
