"""The socket and TLS part of ``patch()``: the patched methods and their scoped paths.

Imported by ``timeoutcore.patch`` when ``patch()`` runs, never by ``import timeoutcore``.
Each wrapper starts with one C call (``remaining() is None``: not in a scope) and then calls
the original unchanged; inside a scope it takes the scoped path below, built on
``timeoutcore.blocking``'s waits:

* ``recv*``/``send*``: a blocking socket is tried with ``MSG_DONTWAIT`` and waited for with
  ``poll`` until the deadline (the socket itself is not changed);
* ``accept``: wait for a pending connection until the deadline;
* ``connect``/``connect_ex`` and every ``ssl.SSLSocket`` call: run with the socket's timeout
  set to the time left (under the engine's wait shield, so it is always restored).
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
    _checkpoint,
    _monotonic,
    _poll,
    _poll_step,
    _remaining,
    _shield,
    _stop_remaining,
    bounded_wait,
    original,
)

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
    rem = _stop_remaining()
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
    rem = _stop_remaining()
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
    rem = _stop_remaining()
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
    rem = _stop_remaining()
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
    rem = _stop_remaining()
    if (rem is None or timeout == 0.0 or (timeout is not None and timeout <= rem)
            or sock.fileno() < 0 or getattr(sock, "_sslobj", None) is None):
        return orig(sock, *args, **kwargs)
    if reading and sock.pending():
        return orig(sock, *args, **kwargs)  # decrypted data waiting: returns at once
    end = None if timeout is None else _monotonic() + timeout
    while True:
        rem = _stop_remaining()
        left = None if end is None else end - _monotonic()
        if rem is None or (left is not None and left <= rem):
            return orig(sock, *args, **kwargs)  # the socket's own timeout ends it first
        if rem <= 0.0:
            _checkpoint()  # raises, unless shielded: then the original, unchanged
            return orig(sock, *args, **kwargs)
        if reading and not sock.pending():
            # Wait for the peer where a wake-up can reach the wait (a cancel, a reschedule);
            # OpenSSL then reads the record that arrived.
            _sock_wait(sock, _POLLIN, end)
            rem = _stop_remaining()
            if rem is None or rem <= 0.0:
                _checkpoint()
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


def _make_connect(orig: Callable[..., Any], ex: bool) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _remaining() is None or kwargs or len(args) != 1:
            return orig(self, *args, **kwargs)
        return sock_connect(self, orig, args[0], ex)

    return method


def _make_ssl(orig: Callable[..., Any], reading: bool) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _remaining() is None:
            return orig(self, *args, **kwargs)
        return ssl_call(self, orig, args, kwargs, reading)

    return method


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
            ("socket", sock, "connect", lambda o: _make_connect(o, False)),
            ("socket", sock, "connect_ex", lambda o: _make_connect(o, True)),
        ]
    if ssl is not None:
        tls = ssl.SSLSocket
        out += [
            ("ssl", tls, "read", lambda o: _make_ssl(o, True)),
            ("ssl", tls, "write", lambda o: _make_ssl(o, False)),
            ("ssl", tls, "send", lambda o: _make_ssl(o, False)),
            ("ssl", tls, "do_handshake", lambda o: _make_ssl(o, False)),
        ]
    return out
