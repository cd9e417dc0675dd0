"""``patch()``: make the stdlib's blocking calls end at the thread's deadline.

Explicit, idempotent and reversible (``unpatch()``), like gevent's monkey-patching, but the
patched calls change behaviour only inside a ``thread_deadline`` scope. Outside any scope
each one starts with one C call (``remaining() is None``, a thread-local look-up) and then
calls the original with the same arguments: same results, same exceptions, same timeouts.

Inside a scope (see the README's "What can be interrupted"):

* ``time.sleep`` -> ``timeoutcore.sleep`` (ends at the deadline);
* ``socket.socket`` ``recv``, ``recv_into``, ``recvfrom``, ``recvfrom_into``, ``send``,
  ``sendall``, ``sendto``: a blocking socket is tried with ``MSG_DONTWAIT`` and waited for
  with ``poll`` until the deadline (the socket itself is not changed); a socket with its own
  shorter timeout keeps it; ``accept`` waits for a pending connection until the deadline;
  ``connect``/``connect_ex`` run with the socket's timeout set to the time left;
* ``ssl.SSLSocket`` ``read``, ``write``, ``send`` (so ``recv*``/``sendall``) and
  ``do_handshake``: run with the socket's timeout set to the time left (OpenSSL retries
  after ``EINTR`` itself);
* ``select.select``, ``select.poll`` objects' ``poll``, every ``selectors`` selector's
  ``select``;
* ``threading.Condition.wait`` -- hence ``Event.wait``, ``Semaphore.acquire``,
  ``queue.Queue.get``/``put``, ``Condition.wait_for``, ``concurrent.futures`` waits --
  and ``threading.Thread.join``;
* ``subprocess.Popen``: a child started inside a scope gets a session and process group of
  its own and is *scope-owned*: when the deadline interrupts ``wait``/``communicate``
  (and so ``subprocess.run``/``call``/``check_output``), its group is killed and it is
  reaped before the interrupt goes on.

Every wait runs with ``min(timeout, remaining())``; when it ends for the deadline,
``checkpoint()`` raises the scope's interrupt right there. Python-level originals with their
own state (``Condition.wait``, ``Thread.join``, ``Popen.wait``/``communicate``) run under
``shield()`` (native engine), so the interrupt never lands half-way through their
bookkeeping. The patches work with the fallback engine too (it has no signal at all, so
they are the only way its blocking calls end at the deadline).

On CPython >= 3.15 with the native engine, the core's signal interrupts ``time.sleep``,
socket calls and ``select`` by itself (PyErr_CheckSignals raises the pending interrupt,
cpython#144748): those patches are skipped there. ``patched_targets()`` tells what is on.
"""

from __future__ import annotations

import functools
import selectors
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Optional, Tuple

try:
    import ssl
except ImportError:  # pragma: no cover - Python built without OpenSSL
    ssl = None  # type: ignore[assignment]

from . import blocking
from ._engine import ENGINE, core
from .blocking import _RUN_ORIGINAL, _is_number, bounded_wait, original
from .errors import _DeadlineInterrupt

__all__ = ["is_patched", "patch", "patched_targets", "unpatch"]

_remaining: Callable[[], Optional[float]] = core.remaining
_shield = blocking._shield  # see there: none with the fallback engine
_core_sleep: Callable[[float], None] = core.sleep

#: CPython 3.15+ interrupts blocking system calls itself once the core's signal arrives.
NATIVE_INTERRUPTS = sys.version_info >= (3, 15) and ENGINE == "native"

_ORIGINAL_ATTR = "__timeoutcore_original__"
_MISSING = object()

# (owner, attribute name) -> the value before patch(), or _MISSING (it was inherited).
_saved: dict[tuple[Any, str], Any] = {}
_lock = threading.Lock()


def _mark(wrapper: Callable[..., Any], orig: Callable[..., Any]) -> Callable[..., Any]:
    try:
        functools.update_wrapper(wrapper, orig)
    except (AttributeError, TypeError):  # pragma: no cover - C callables without metadata
        pass
    setattr(wrapper, _ORIGINAL_ATTR, orig)
    return wrapper


# --- time ----------------------------------------------------------------------------------


def _make_sleep(orig: Callable[[float], None]) -> Callable[..., None]:
    def sleep(*args: Any, **kwargs: Any) -> None:
        if _remaining() is None:
            return orig(*args, **kwargs)
        if kwargs or len(args) != 1:
            return orig(*args, **kwargs)
        secs = args[0]
        if (isinstance(secs, bool) or not isinstance(secs, (int, float))
                or not 0 <= secs <= 3e8):
            return orig(secs)  # the original's own errors, or its own huge sleep
        return _core_sleep(float(secs))

    return sleep


# --- socket --------------------------------------------------------------------------------


def _make_sock_io(orig: Callable[..., Any], events: int, flags_index: int,
                  keywords: bool) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _remaining() is None:
            return orig(self, *args, **kwargs)
        return blocking.sock_io(self, orig, args, kwargs, events, flags_index, keywords)

    return method


def _make_sendto(orig: Callable[..., Any]) -> Callable[..., Any]:
    def sendto(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _remaining() is None:
            return orig(self, *args, **kwargs)
        # sendto(data, address) or sendto(data, flags, address)
        if not kwargs and len(args) == 2:
            args = (args[0], 0, args[1])
        elif kwargs or len(args) != 3 or not blocking._is_flags(args[1]):
            return orig(self, *args, **kwargs)
        return blocking.sock_io(self, orig, args, {}, blocking._POLLOUT, 1, False)

    return sendto


def _make_send(orig_send: Callable[..., Any], orig: Callable[..., Any],
               sendall: bool) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _remaining() is None:
            return orig(self, *args, **kwargs)
        result = blocking.sock_send(self, orig_send, args, kwargs, sendall)
        if result is _RUN_ORIGINAL:
            return orig(self, *args, **kwargs)
        return result

    return method


def _make_accept(orig: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def _accept(self: Any) -> Any:
        if _remaining() is None:
            return orig(self)
        return blocking.sock_accept(self, orig)

    return _accept


def _make_connect(orig: Callable[..., Any], ex: bool) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _remaining() is None or kwargs or len(args) != 1:
            return orig(self, *args, **kwargs)
        return blocking.sock_connect(self, orig, args[0], ex)

    return method


def _make_ssl(orig: Callable[..., Any], reading: bool) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _remaining() is None:
            return orig(self, *args, **kwargs)
        return blocking.ssl_call(self, orig, args, kwargs, reading)

    return method


# --- select / selectors --------------------------------------------------------------------


def _make_select(orig: Callable[..., Any]) -> Callable[..., Any]:
    def select(*args: Any, **kwargs: Any) -> Any:
        if _remaining() is None:
            return orig(*args, **kwargs)
        return _scoped_select(orig, args, kwargs)

    return select


def _scoped_select(orig: Callable[..., Any], args: Tuple[Any, ...],
                   kwargs: dict[str, Any]) -> Any:
    if kwargs or len(args) not in (3, 4):
        return orig(*args, **kwargs)
    timeout = args[3] if len(args) == 4 else None
    if not (timeout is None or (_is_number(timeout) and timeout >= 0)):
        return orig(*args)
    try:
        # Re-iterable copies (the wait may be repeated); bad arguments: the original's error.
        rlist, wlist, xlist = list(args[0]), list(args[1]), list(args[2])
    except TypeError:
        return orig(*args)

    def step(t: Optional[float]) -> Tuple[bool, Any]:
        result = orig(rlist, wlist, xlist, t)
        return bool(result[0] or result[1] or result[2]), result

    return bounded_wait(step, timeout)


class _Poll:
    """What the patched ``select.poll()`` returns: a C poll object whose ``poll`` ends at
    the deadline. ``register``/``modify``/``unregister`` are the C object's own."""

    __slots__ = ("_poll", "modify", "register", "unregister")

    def __init__(self, factory: Callable[[], Any]) -> None:
        p = factory()
        self._poll = p
        self.register = p.register
        self.modify = p.modify
        self.unregister = p.unregister

    def poll(self, *args: Any, **kwargs: Any) -> Any:
        if _remaining() is None:
            return self._poll.poll(*args, **kwargs)
        return _scoped_poll(self._poll.poll, args, kwargs)


def _scoped_poll(orig: Callable[..., Any], args: Tuple[Any, ...],
                 kwargs: dict[str, Any]) -> Any:
    if kwargs or len(args) > 1:
        return orig(*args, **kwargs)
    ms = args[0] if args else None
    if ms is None or (_is_number(ms) and ms < 0):
        timeout = None
    elif _is_number(ms):
        timeout = ms / 1000.0
    else:
        return orig(*args)
    first = timeout

    def step(t: Optional[float]) -> Tuple[bool, Any]:
        if t is None:
            result = orig(*args)
        elif t is first:
            result = orig(ms)  # the caller's own value: the same rounding as the original
        else:
            result = orig(t * 1000.0)
        return bool(result), result

    return bounded_wait(step, timeout)


def _make_poll_factory(orig: Callable[[], Any]) -> Callable[[], Any]:
    def poll() -> Any:
        return _Poll(orig)

    return poll


def _make_selector_select(orig: Callable[..., Any]) -> Callable[..., Any]:
    def select(self: Any, timeout: Optional[float] = None) -> Any:
        if _remaining() is None or not (timeout is None or _is_number(timeout)):
            return orig(self, timeout)

        def step(t: Optional[float]) -> Tuple[bool, Any]:
            result = orig(self, t)
            return bool(result), result

        return bounded_wait(step, timeout)

    return select


# --- threading -----------------------------------------------------------------------------


def _make_condition_wait(orig: Callable[..., bool]) -> Callable[..., bool]:
    def wait(self: Any, timeout: Optional[float] = None) -> bool:
        if _remaining() is None or not (timeout is None or _is_number(timeout)):
            return orig(self, timeout)

        def step(t: Optional[float]) -> Tuple[bool, bool]:
            with _shield():  # the wait re-acquires the lock before the interrupt lands
                got = orig(self, t)
            return got, got

        result: bool = bounded_wait(step, timeout)
        return result

    return wait


def _make_join(orig: Callable[..., None]) -> Callable[..., None]:
    def join(self: Any, timeout: Optional[float] = None) -> None:
        if _remaining() is None or not (timeout is None or _is_number(timeout)):
            return orig(self, timeout)

        def step(t: Optional[float]) -> Tuple[bool, None]:
            with _shield():
                orig(self, t)
            return not self.is_alive(), None

        bounded_wait(step, timeout)
        return None

    return join


# --- subprocess ----------------------------------------------------------------------------

_OWNED = "_timeoutcore_owned"  # on a Popen started inside a scope: "group" or "pid"
_START_NEW_SESSION_POS = 15  # Popen(args, bufsize, ..., restore_signals, start_new_session)


def _make_popen_init(orig: Callable[..., None]) -> Callable[..., None]:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if _remaining() is None:
            return orig(self, *args, **kwargs)
        own = "pid"
        if ("start_new_session" not in kwargs and "process_group" not in kwargs
                and len(args) <= _START_NEW_SESSION_POS):
            kwargs["start_new_session"] = True
        if kwargs.get("start_new_session") is True:
            own = "group"
        orig(self, *args, **kwargs)
        setattr(self, _OWNED, own)
        return None

    return __init__


def _abandon(proc: Any) -> None:
    """The deadline interrupted a wait on ``proc``: a scope-owned child is killed, reaped."""
    owned = getattr(proc, _OWNED, None)
    if owned is not None:
        from .subprocess import kill_and_reap

        kill_and_reap(proc, group=owned == "group")


def _make_popen_wait(orig: Callable[..., Any]) -> Callable[..., Any]:
    def wait(self: Any, timeout: Optional[float] = None) -> Any:
        if (_remaining() is None or self.returncode is not None
                or not (timeout is None or _is_number(timeout))):
            return orig(self, timeout)

        def step(t: Optional[float]) -> Tuple[bool, Any]:
            with _shield():
                try:
                    return True, orig(self, t)
                except subprocess.TimeoutExpired as exc:
                    return False, exc

        return _owned_wait(self, step, timeout)

    return wait


def _owned_wait(proc: Any, step: Callable[[Optional[float]], Tuple[bool, Any]],
                timeout: Optional[float]) -> Any:
    """Run a Popen wait in deadline-bounded steps; if the deadline interrupts it, kill and
    reap the scope-owned child before the interrupt goes on."""
    try:
        result = bounded_wait(step, timeout)
    except _DeadlineInterrupt:
        _abandon(proc)
        raise
    if isinstance(result, subprocess.TimeoutExpired):
        result.timeout = timeout  # type: ignore[assignment]
        raise result
    return result


def _make_communicate(orig: Callable[..., Any]) -> Callable[..., Any]:
    def communicate(self: Any, input: Any = None, timeout: Optional[float] = None) -> Any:  # noqa: A002
        if (_remaining() is None or not (timeout is None or _is_number(timeout))):
            return orig(self, input, timeout)
        sent = [False]

        def step(t: Optional[float]) -> Tuple[bool, Any]:
            data = None if sent[0] else input  # a retried communicate() must not resend
            sent[0] = True
            with _shield():
                try:
                    return True, orig(self, data, t)
                except subprocess.TimeoutExpired as exc:
                    return False, exc

        return _owned_wait(self, step, timeout)

    return communicate


# --- the table of patches ------------------------------------------------------------------


def _targets() -> list[tuple[str, Any, str, Callable[[Any], Callable[..., Any]]]]:
    """(group, owner, attribute, make(original) -> wrapper)."""
    import select

    pollin = blocking._POLLIN
    sock = socket.socket
    out: list[tuple[str, Any, str, Callable[[Any], Callable[..., Any]]]] = [
        ("sleep", time, "sleep", _make_sleep),
        ("socket", sock, "recv", lambda o: _make_sock_io(o, pollin, 1, False)),
        ("socket", sock, "recvfrom", lambda o: _make_sock_io(o, pollin, 1, False)),
        ("socket", sock, "recv_into", lambda o: _make_sock_io(o, pollin, 2, True)),
        ("socket", sock, "recvfrom_into", lambda o: _make_sock_io(o, pollin, 2, True)),
        ("socket", sock, "send",
         lambda o: _make_send(original(socket.socket.send), o, False)),
        ("socket", sock, "sendall",
         lambda o: _make_send(original(socket.socket.send), o, True)),
        ("socket", sock, "sendto", _make_sendto),
        ("socket", sock, "_accept", _make_accept),
        ("socket", sock, "connect", lambda o: _make_connect(o, False)),
        ("socket", sock, "connect_ex", lambda o: _make_connect(o, True)),
        ("select", select, "select", _make_select),
        ("select", select, "poll", _make_poll_factory),
    ]
    if ssl is not None:
        tls = ssl.SSLSocket
        out += [
            ("ssl", tls, "read", lambda o: _make_ssl(o, True)),
            ("ssl", tls, "write", lambda o: _make_ssl(o, False)),
            ("ssl", tls, "send", lambda o: _make_ssl(o, False)),
            ("ssl", tls, "do_handshake", lambda o: _make_ssl(o, False)),
        ]
    for name in ("SelectSelector", "_PollLikeSelector", "EpollSelector", "DevpollSelector",
                 "KqueueSelector"):
        cls = getattr(selectors, name, None)
        if cls is not None and "select" in vars(cls):
            out.append(("select", cls, "select", _make_selector_select))
    out += [
        ("threading", threading.Condition, "wait", _make_condition_wait),
        ("threading", threading.Thread, "join", _make_join),
        ("subprocess", subprocess.Popen, "__init__", _make_popen_init),
        ("subprocess", subprocess.Popen, "wait", _make_popen_wait),
        ("subprocess", subprocess.Popen, "communicate", _make_communicate),
    ]
    if not blocking._DONTWAIT:
        out = [t for t in out if t[0] != "socket"]
    if NATIVE_INTERRUPTS:
        out = [t for t in out if t[0] not in ("sleep", "socket", "ssl", "select")]
    return out


def _name(owner: Any, attr: str) -> str:
    mod = getattr(owner, "__module__", None) if isinstance(owner, type) else None
    if isinstance(owner, type):
        return f"{mod}.{owner.__qualname__}.{attr}"
    return f"{owner.__name__}.{attr}"


def patch() -> None:
    """Patch the stdlib's blocking calls (see the module docstring). Idempotent."""
    with _lock:
        if _saved:
            return
        for _, owner, attr, make in _targets():
            own = vars(owner).get(attr, _MISSING) if isinstance(owner, type) else getattr(
                owner, attr)
            current = getattr(owner, attr)
            wrapper = _mark(make(current), current)
            _saved[(owner, attr)] = (own, wrapper)
            setattr(owner, attr, wrapper)


def unpatch() -> None:
    """Undo :func:`patch`: every patched attribute is the original object again.

    An attribute somebody else replaced after ``patch()`` is left alone. Idempotent.
    """
    with _lock:
        for (owner, attr), (own, wrapper) in reversed(list(_saved.items())):
            current = (vars(owner).get(attr, _MISSING) if isinstance(owner, type)
                       else getattr(owner, attr, _MISSING))
            if current is not wrapper:
                continue
            if own is _MISSING:
                delattr(owner, attr)
            else:
                setattr(owner, attr, own)
        _saved.clear()


def is_patched() -> bool:
    """Is :func:`patch` in effect?"""
    return bool(_saved)


def patched_targets() -> Tuple[str, ...]:
    """The dotted names of what :func:`patch` replaced (empty when not patched)."""
    return tuple(_name(owner, attr) for owner, attr in _saved)
