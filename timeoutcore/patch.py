"""``patch()``: make the stdlib's blocking calls end at the thread's deadline.

Explicit, idempotent and reversible (``unpatch()``), like gevent's monkey-patching, but the
patched calls change behaviour only inside a ``thread_deadline`` scope. Outside any scope
each one starts with one C call (``remaining() is None``, a thread-local look-up) and then
calls the original with the same arguments: same results, same exceptions, same timeouts.

Inside a scope (the docs' table: docs/explanation/what-stops.md):

* ``time.sleep`` -> ``timeoutcore.sleep`` (ends at the deadline);
* ``socket.socket`` ``recv``, ``recv_into``, ``recvfrom``, ``recvfrom_into``, ``send``,
  ``sendall``, ``sendto``, ``accept``, ``connect``/``connect_ex``, and ``ssl.SSLSocket``
  ``read``, ``write``, ``send`` (so ``recv*``/``sendall``), ``do_handshake``, ``unwrap``:
  they wait only in a poll the stop wake reaches, whatever the socket's own timeout (which
  keeps its meaning: ``socket.timeout`` when it comes first); TLS runs OpenSSL
  non-blocking and waits between attempts (``_patch_socket`` has the details);
* ``select.select``, ``select.poll`` objects' ``poll``, every ``selectors`` selector's
  ``select`` (except a wait on nothing but the socket of a connection whose running
  command ``contrib.db.guard`` will cancel: that one is the original call, ended by the
  cancel -- "waits left to a statement's cancel" below);
* ``threading.Condition.wait`` -- hence ``Event.wait``, ``Semaphore.acquire``,
  ``queue.Queue.get``/``put``, ``Condition.wait_for``, ``concurrent.futures`` waits --
  and ``threading.Thread.join``;
* ``subprocess.Popen``: a child started inside a scope gets a session and process group of
  its own and is *scope-owned*: when the deadline interrupts ``wait``/``communicate``
  (and so ``subprocess.run``/``call``/``check_output``), its group is killed and it is
  reaped before the interrupt goes on.

Every wait runs with ``min(timeout, time to the stop)`` and is woken when the stop time
changes (``timeoutcore._stop``: the hard deadline, a ``soft_raise`` soft limit, an earlier
``reschedule()``, a ``cancel()``): select, poll and selector waits also watch the thread's
wake-up eventfd, ``Condition.wait`` waits on a waiter the wake can release, and
``Thread.join`` (a lock only its thread's end releases) re-reads the stop time every 2 ms.
When the wait ends for the deadline, ``checkpoint()`` raises the scope's interrupt right
there. Python-level originals with their
own state (``Condition.wait``, ``Thread.join``, ``Popen.wait``/``communicate``) run under
``shield()`` (native engine), so the interrupt never lands half-way through their
bookkeeping. The patches work with the fallback engine too (it has no signal at all, so
they are the only way its blocking calls end at the deadline).

On CPython >= 3.15 with the native engine, the core's signal interrupts ``time.sleep``,
socket calls and ``select`` by itself (PyErr_CheckSignals raises the pending interrupt,
cpython#144748): those patches are skipped there. ``patched_targets()`` tells what is on.

Layout: this module holds the table and the ``time``/``select``/``threading`` wrappers;
the socket and TLS ones are in ``_patch_socket``, the ``Popen`` ones in
``_patch_subprocess``, both imported only when ``patch()`` runs; the waits they are built
on are ``timeoutcore.blocking``'s.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any, Callable, Iterable, Optional, Tuple

from . import _stop
from ._engine import core
from .blocking import _ORIGINAL_ATTR, Make, _is_number, _remaining, _shield, bounded_wait


__all__ = ["is_patched", "patch", "patched_targets", "unpatch"]

_core_sleep: Callable[[float], None] = core.sleep

#: CPython 3.15+ interrupts blocking system calls itself once the native core's signal
#: arrives (cpython#144748): the engine says whether that holds here.
NATIVE_INTERRUPTS = core.INTERRUPTS_RETRIED_CALLS

_MISSING = object()
_JOIN_SLICE = 0.002  # s
_POLLIN = 1  # select.POLLIN (and EPOLLIN)
_allocate_lock = threading.Lock

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


# --- waits left to a statement's cancel ----------------------------------------------------
#
# A database driver that runs its protocol in Python (psycopg 3 without its C speed-up: its
# pure-Python implementation, the only one on free-threaded CPython) waits for the server
# in select.select / select.poll / a selector, in slices of its own (psycopg: 100 ms),
# between sending a query and reading its result. Ended there by the deadline, the wait
# raises our interrupt inside the driver's protocol code: psycopg's Connection.wait drains a
# cancelled query only for KeyboardInterrupt/SystemExit, so it drops the half-done exchange
# and the connection stays ACTIVE ("another command is already in progress"), however
# guard()'s cancel ended the query on the server. So while guard(conn) is armed in a scope
# (once the scope is stopped: until it exits, for the driver's own clean-up; contrib.db)
# and a command is in progress on the connection, a patched wait of this thread on that
# connection's socket alone is the original call: the deadline does not end it, guard()'s
# cancel does -- the server answers, the driver reads that answer to its end, and the
# interrupt surfaces when the driver returns (guard() protects the driver's code), exactly
# as with the C implementation, whose wait is not patched. A wait with no command in
# progress (psycopg's notifies()) still ends at the deadline: no cancel would end it, and
# the connection has no exchange to lose. Rejected: raising in the wait and draining in
# guard()'s exit (it needs the driver's private generators, and a cancel that raced the
# raise); honouring every protected module in the patched waits (the default ones are the
# standard library code patch() is built to end waits inside, at points where no lock is
# held).


class _LeftToCancel(threading.local):
    def __init__(self) -> None:
        # fd -> the live() of each registration on it (a connection may be guarded twice)
        self.fds: dict[int, list[Callable[[], bool]]] = {}


_left = _LeftToCancel()


def _leave_to_cancel(fd: int, live: Callable[[], bool]) -> Callable[[], None]:
    """In this thread, until the returned undo is called (in this thread too): a patched
    ``select``/``poll``/selector wait on ``fd`` alone is the original call, which the
    deadline does not end, while ``live()`` is true at its start (a command in progress,
    which the cancel ends; false once the connection is closed: its fd number may be
    reused by another socket). For ``contrib.db.guard`` (see above)."""
    if isinstance(fd, bool) or not isinstance(fd, int):
        raise TypeError(f"fd must be an int, not {type(fd).__name__}")
    if fd < 0:
        raise ValueError(f"fd must be a file descriptor (>= 0), got {fd}")
    if not callable(live):
        raise TypeError(f"live must be callable, not {type(live).__name__}")
    fds = _left.fds
    fds.setdefault(fd, []).append(live)

    def undo() -> None:
        lives = fds.get(fd)
        if lives is None or live not in lives:
            return
        lives.remove(live)
        if not lives:
            del fds[fd]

    return undo


def _fd_of(obj: Any) -> Optional[int]:
    """The descriptor ``select``/``poll`` take ``obj`` for (an int, or ``fileno()``); None
    when there is none (the original call reports that)."""
    if isinstance(obj, int):
        return int(obj)
    try:
        n = obj.fileno()
    except (AttributeError, OSError, TypeError, ValueError):
        return None
    return n if isinstance(n, int) else None


def _left_to_cancel(watched: Iterable[Any]) -> bool:
    """Does this wait watch only sockets that a guard's cancel ends (and at least one)?"""
    fds = _left.fds
    if not fds:
        return False
    seen = False
    for obj in watched:
        n = _fd_of(obj)
        lives = None if n is None else fds.get(n)
        if not lives or not any(live() for live in lives):
            return False
        seen = True
    return seen


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
    if _left_to_cancel(rlist + wlist + xlist):
        return orig(rlist, wlist, xlist, *args[3:])

    wake = _stop.wake_fd()
    watched = rlist + [wake]

    def step(t: Optional[float]) -> Tuple[bool, Any]:
        r, w, x = orig(watched, wlist, xlist, t)
        result = ([fd for fd in r if fd is not wake], w, x)
        return bool(result[0] or w or x), result

    return bounded_wait(step, timeout)


class _Poll:
    """What the patched ``select.poll()`` returns: a C poll object whose ``poll`` ends at
    the deadline. ``register``/``modify``/``unregister`` are the C object's own, the
    registered descriptors noted (a wait on a guarded connection alone is left to its
    cancel)."""

    __slots__ = ("_fds", "_poll", "modify")

    def __init__(self, factory: Callable[[], Any]) -> None:
        p = factory()
        self._poll = p
        self._fds: set[int] = set()
        self.modify = p.modify

    def register(self, fd: Any, *args: Any) -> None:
        self._poll.register(fd, *args)
        n = _fd_of(fd)
        if n is not None:
            self._fds.add(n)

    def unregister(self, fd: Any) -> None:
        self._poll.unregister(fd)
        n = _fd_of(fd)
        if n is not None:
            self._fds.discard(n)

    def poll(self, *args: Any, **kwargs: Any) -> Any:
        if _remaining() is None or _left_to_cancel(self._fds):
            return self._poll.poll(*args, **kwargs)
        wake = _stop.wake_fd()
        self._poll.register(wake, _POLLIN)  # for this call only: the caller never sees it
        try:
            return _scoped_poll(self._poll.poll, args, kwargs, wake)
        finally:
            self._poll.unregister(wake)


def _scoped_poll(orig: Callable[..., Any], args: Tuple[Any, ...],
                 kwargs: dict[str, Any], wake: int) -> Any:
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
        result = [ev for ev in result if ev[0] != wake]
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
        if _left.fds:
            keys = self.get_map()
            if keys is not None and _left_to_cancel(key.fd for key in keys.values()):
                return orig(self, timeout)

        def step(t: Optional[float]) -> Tuple[bool, Any]:
            result = orig(self, t)  # our wake-up fd has no key: the selector drops it
            return bool(result), result

        undo = _watch_wake(self)
        try:
            return bounded_wait(step, timeout)
        finally:
            undo()

    return select


def _nothing() -> None:
    return None


def _watch_wake(selector: Any) -> Callable[[], None]:
    """Add this thread's wake-up fd to ``selector``'s own poll set (epoll, poll, devpoll
    object, or ``SelectSelector``'s readers) for one ``select``; returns the undo."""
    fd = _stop.wake_fd()
    inner = getattr(selector, "_selector", None)
    if inner is not None and callable(getattr(inner, "register", None)):
        try:
            inner.register(fd, _POLLIN)  # EPOLLIN == POLLIN
        except (OSError, ValueError):
            return _nothing
        return lambda: inner.unregister(fd)
    readers = getattr(selector, "_readers", None)
    if isinstance(readers, set):
        readers.add(fd)
        return lambda: readers.discard(fd)
    return _nothing


# --- threading -----------------------------------------------------------------------------


class _Waiter:
    """What a patched ``Condition.wait`` queues in ``Condition._waiters`` instead of a bare
    lock: ``release()`` (what ``notify`` calls) marks it notified; ``wake()`` (the stop time
    changed) releases it without. Either may come first; the lock is released once."""

    __slots__ = ("_lock", "_mutex", "_open", "notified")

    def __init__(self) -> None:
        self._lock = _allocate_lock()
        self._lock.acquire()
        self._mutex = _allocate_lock()
        self._open = False
        self.notified = False

    def _release(self) -> None:
        with self._mutex:
            if self._open:
                return
            self._open = True
        self._lock.release()

    def release(self) -> None:
        self.notified = True
        self._release()

    def wake(self) -> None:
        self._release()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)


def _condition_step(cond: Any, t: Optional[float]) -> bool:
    """One ``Condition.wait`` (the stdlib's own logic, with a :class:`_Waiter`) that a wake
    ends early: True only when notified. Runs under the wait shield, so the lock is always
    re-acquired before the interrupt lands."""
    if not cond._is_owned():
        raise RuntimeError("cannot wait on un-acquired lock")
    waiter = _Waiter()
    if not _stop.add_waker(waiter.wake):
        return False  # the stop time changed since it was read: re-read it
    try:
        with _shield():
            cond._waiters.append(waiter)
            saved = cond._release_save()
            try:
                if t is None:
                    waiter.acquire()
                elif t > 0:
                    waiter.acquire(True, t)
            finally:
                cond._acquire_restore(saved)
                if not waiter.notified:
                    try:
                        cond._waiters.remove(waiter)
                    except ValueError:
                        pass
    finally:
        _stop.remove_waker(waiter.wake)
    return waiter.notified


def _make_condition_wait(orig: Callable[..., bool]) -> Callable[..., bool]:
    def wait(self: Any, timeout: Optional[float] = None) -> bool:
        if (_remaining() is None or not (timeout is None or _is_number(timeout))
                or not hasattr(self, "_waiters")):
            return orig(self, timeout)

        def step(t: Optional[float]) -> Tuple[bool, bool]:
            got = _condition_step(self, t)
            return got, got

        result: bool = bounded_wait(step, timeout)
        return result

    return wait


def _make_join(orig: Callable[..., None]) -> Callable[..., None]:
    def join(self: Any, timeout: Optional[float] = None) -> None:
        if _remaining() is None or not (timeout is None or _is_number(timeout)):
            return orig(self, timeout)

        def step(t: Optional[float]) -> Tuple[bool, None]:
            # The lock join waits on is released only by the thread's end: no wake-up can
            # reach it, so re-read the stop time every _JOIN_SLICE.
            rem = _remaining()
            if rem is not None and rem > 0.0:  # not past a (shielded) deadline
                t = _JOIN_SLICE if t is None else min(t, _JOIN_SLICE)
            with _shield():
                orig(self, t)
            return not self.is_alive(), None

        bounded_wait(step, timeout)
        return None

    return join


# --- the table of patches ------------------------------------------------------------------


def _targets() -> list[tuple[str, Any, str, Make]]:
    """(group, owner, attribute, make(original) -> wrapper), in the order they are applied.

    The modules of the socket/TLS and subprocess patches are imported here, when
    ``patch()`` runs: ``import timeoutcore`` loads neither ``socket``, ``ssl`` nor
    ``subprocess``.
    """
    import select
    import selectors

    from . import _patch_socket, _patch_subprocess

    net = _patch_socket.targets()
    out: list[tuple[str, Any, str, Make]] = [("sleep", time, "sleep", _make_sleep)]
    out += [t for t in net if t[0] == "socket"]
    out += [
        ("select", select, "select", _make_select),
        ("select", select, "poll", _make_poll_factory),
    ]
    out += [t for t in net if t[0] == "ssl"]
    for name in ("SelectSelector", "_PollLikeSelector", "EpollSelector", "DevpollSelector",
                 "KqueueSelector"):
        cls = getattr(selectors, name, None)
        if cls is not None and "select" in vars(cls):
            out.append(("select", cls, "select", _make_selector_select))
    out += [
        ("threading", threading.Condition, "wait", _make_condition_wait),
        ("threading", threading.Thread, "join", _make_join),
    ]
    out += _patch_subprocess.targets()
    if NATIVE_INTERRUPTS:
        out = [t for t in out if t[0] not in ("sleep", "socket", "ssl", "select")]
    return out


def _name(owner: Any, attr: str) -> str:
    mod = getattr(owner, "__module__", None) if isinstance(owner, type) else None
    if isinstance(owner, type):
        return f"{mod}.{owner.__qualname__}.{attr}"
    return f"{owner.__name__}.{attr}"


def patch() -> None:
    """Make the standard library's blocking calls end at the calling thread's deadline.

    Replaces, process-wide, ``time.sleep``; the blocking ``socket`` and ``ssl.SSLSocket``
    methods (so ``urllib``, ``http.client``, ``requests``, ``httpx``, redis-py);
    ``select.select``, ``select.poll`` objects and every ``selectors`` selector;
    ``threading.Condition.wait`` (so ``Event``, ``Semaphore``, ``queue.Queue``,
    ``concurrent.futures`` waits) and ``Thread.join``; and ``subprocess.Popen`` (a child
    started inside a scope is killed with its process group and reaped when the deadline
    ends its wait). Outside a ``thread_deadline`` scope each patched call is the original:
    same results, exceptions and timeouts. Inside one, a wait ends at the scope's stop
    (hard deadline, ``soft_raise`` soft limit, ``cancel()``) with the scope's exception;
    a shorter timeout of the call's own keeps its meaning. Idempotent; :func:`unpatch`
    undoes it and :func:`patched_targets` lists what is patched (on CPython 3.15+ with
    the C core, sleep, sockets and select need no patch and are skipped)."""
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
