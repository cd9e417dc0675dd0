"""Database drivers and pools: a blocked query or a pool wait stops at the thread's stop time.

A query blocked in libpq or SQLite retries ``EINTR`` itself, so the deadline's signal cannot
end it; each driver has a cancel meant for another thread, which ``guard`` hands to
:func:`timeoutcore.interrupt_with`::

    with thread_deadline(2.0), guard(conn):
        conn.execute("SELECT ...")      # ends with DeadlineExceeded at 2 s

========================  ==========================  ====================================
driver                    cancel                      afterwards
========================  ==========================  ====================================
``sqlite3``               ``conn.interrupt()``        usable (the statement is rolled back)
``psycopg2``              ``conn.cancel()``           ``conn.rollback()``, then usable
``psycopg`` (3)           ``conn.cancel_safe()``      ``conn.rollback()``, then usable
========================  ==========================  ====================================

SQLite's lock wait. A statement that waits for another connection's lock sleeps in SQLite's
busy handler, which never looks at ``interrupt()``: it waits out the connection's busy
timeout (``sqlite3.connect(timeout=5.0)`` by default) whatever the deadline. So on a sqlite3
connection ``guard`` also lowers the busy timeout (``PRAGMA busy_timeout``) to the time left
before the thread's stop time when the guard is entered, and puts the old value back when it
is left, however the block ends. A lock wait that ends there ends with the block's
``DeadlineExceeded`` (its soft exception, its cancel's), not ``database is locked``.
What this bounds, and what it cannot:

* each statement's lock wait lasts at most the time left at the guard's entry: a guard
  around the statement (the usual shape) ends its wait at the stop time; a statement
  started later in a longer block can wait past the stop time by as long as the block had
  run before it started;
* a stop that moves earlier during a lock wait (``cancel()``, an earlier ``reschedule()``)
  is heard when that wait ends. Python's ``sqlite3`` offers no busy handler of one's own
  (which could look at the stop time between its sleeps), the busy timeout can only be
  changed by a statement on the connection, which waits for the waiting statement to
  finish, and the progress handler is not called during a lock wait;
* when the stop came while the block still had a statement open (a cursor half read),
  SQLite answers "interrupted" to every statement of the connection until that cursor is
  reset, its rows lost to the interrupt anyway. To put the busy timeout back, ``guard``
  then reads each open cursor of the connection once (the read fails with "interrupted"
  and resets it); an open ``Blob`` keeps the connection interrupted, and the busy timeout
  lowered: that is logged on logger ``timeoutcore``.

Pools. A pool's waiting client is bookkeeping the pool must finish: psycopg_pool's
``getconn()`` stopped by an interrupt inside its wait stays queued as a waiter (the pool
catches only ``Exception``), and the next ``putconn()`` hands the connection to that dead
waiter, lost to the pool for good. :func:`getconn` and :func:`connection` take a
connection from a ``psycopg_pool.ConnectionPool`` with the pool's own timeout limited to
the time left, the interrupt held back meanwhile (``shield()``), so the pool ends its wait
itself; a wait that ends at the stop time ends with ``DeadlineExceeded``, never with a
waiter left queued or a connection taken from the pool and not returned::

    with thread_deadline(2.0), connection(pool) as conn:
        conn.execute("SELECT ...")

A stop that moves earlier during that wait is heard when the wait ends, at the latest at
the stop time known when it began. Only psycopg_pool is covered here (the docs' databases
page, "Connection pools", for the others).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import logging
import math
import time
from collections.abc import Iterator
from types import TracebackType
from typing import Any, Callable, ContextManager, Optional

from .. import _stop
from .._engine import core
from ..interrupt import interrupt_with
from ..patch import _leave_to_cancel
from ..protect import protect_module, protected_modules

__all__ = ["cancel_of", "connection", "getconn", "guard"]

_SQLITE_BUSY = 5  # result codes (their low byte: extended codes keep it)
_SQLITE_INTERRUPT = 9


def _is_sqlite(conn: Any) -> bool:
    try:
        import sqlite3
    except ImportError:  # a CPython built without _sqlite3: no sqlite3 connection exists
        return False
    return isinstance(conn, sqlite3.Connection)


def cancel_of(conn: Any) -> Callable[[], Any]:
    """The function that cancels ``conn``'s running statement from another thread."""
    if _is_sqlite(conn):
        return conn.interrupt  # type: ignore[no-any-return]
    module = type(conn).__module__.split(".")[0]
    if module == "psycopg" and callable(getattr(conn, "cancel_safe", None)):
        return conn.cancel_safe  # type: ignore[no-any-return]
    if module in ("psycopg", "psycopg2") or callable(getattr(conn, "cancel", None)):
        return conn.cancel  # type: ignore[no-any-return]
    raise TypeError(f"guard(): no known cancel for a {type(conn).__qualname__} connection")


def guard(conn: Any) -> ContextManager[Any]:
    """A context manager that stops ``conn``'s running statement at the thread's stop time:
    ``interrupt_with`` the right cancel for a sqlite3, psycopg2 or psycopg connection, and
    on sqlite3 also the lock wait (the module docstring). A ``TypeError`` names a ``conn``
    with no known cancel.

    psycopg 3 runs its protocol in Python where its C speed-up is not installed (its
    pure-Python implementation is the only one on free-threaded CPython): an interrupt that
    surfaced there would leave the connection with "another command already in progress".
    So guard() protects the ``psycopg`` package (:func:`timeoutcore.protect_module`), and,
    under :func:`timeoutcore.patch`, leaves the patched ``select``/``poll``/selector waits
    on the connection's socket to the cancel (``timeoutcore.patch``, "waits left to a
    statement's cancel") while a command is in progress on it: the cancelled query returns
    its error to the caller, and the interrupt surfaces there. As with psycopg's C
    implementation, a stop that the guard does not watch (a scope opened inside its block)
    is heard when the statement ends."""
    cancel = cancel_of(conn)
    if _is_sqlite(conn):
        return _SqliteGuard(conn)
    if type(conn).__module__.split(".")[0] == "psycopg":
        if "psycopg" not in protected_modules():
            protect_module("psycopg")
        return _PsycopgGuard(conn, cancel)
    return interrupt_with(cancel)


class _PsycopgGuard:
    """``guard(psycopg_conn)``: ``interrupt_with(conn.cancel_safe)``, and while it is armed
    the patched waits on the connection's socket left to that cancel."""

    # Rule: the waits stay left to the cancel until the guard exits -- or, when the scope's
    # stop has come, until that scope exits. The thread then unwinds through the driver's
    # own clean-up inside the stopped scope (psycopg's `with connect()` rolls back, then
    # closes), and a patched wait there would raise the stop again at once: the pure-Python
    # driver's rollback failed, its close was skipped and the connection stayed open until
    # the garbage collector found it. With the wait left alone the clean-up completes, as it
    # does with the C implementation (whose waits are not patched).

    __slots__ = ("_conn", "_inner", "_scope", "_undo")

    def __init__(self, conn: Any, cancel: Callable[[], Any]) -> None:
        self._conn = conn
        self._inner = interrupt_with(cancel)
        self._scope: Any = None
        self._undo: Optional[Callable[[], None]] = None

    def __enter__(self) -> _PsycopgGuard:
        if self._undo is not None:
            raise RuntimeError("guard(): this guard is already entered")
        self._inner.__enter__()
        self._scope = scope = core.current_scope()
        if scope is None:
            return self  # interrupt_with armed nothing: no cancel will end a wait
        conn = self._conn
        try:
            fd = int(conn.fileno())
        except Exception:  # noqa: BLE001 - closed or broken: its statements fail at once
            return self
        active = importlib.import_module("psycopg.pq").TransactionStatus.ACTIVE
        pgconn = conn.pgconn

        def running() -> bool:
            # A command sent and not finished: the one thing the cancel ends. Not while the
            # connection waits with no command in progress (notifies()): nothing would end
            # that wait at the stop time. A closed connection reports UNKNOWN.
            return bool(pgconn.transaction_status == active)

        if fd >= 0:
            self._undo = _leave_to_cancel(fd, running)
        return self

    def __exit__(self, exc_type: Optional[type[BaseException]],
                 exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        undo, self._undo = self._undo, None
        scope, self._scope = self._scope, None
        try:
            self._inner.__exit__(exc_type, exc, tb)  # raises the stop if it cancelled
        finally:
            if undo is not None and not _until_scope_exit(scope, undo):
                undo()


def _until_scope_exit(scope: Any, undo: Callable[[], None]) -> bool:
    """If ``scope`` was stopped and is still active: run ``undo`` when it exits (its
    timeout handlers run then, in this thread) and say True."""
    if scope is None or scope.exited_at is not None or not scope.expired():
        return False
    try:
        scope.on_timeout(undo)
    except RuntimeError:  # it exited in the meantime
        return False
    return True


def _pragma(conn: Any, sql: str) -> list[Any]:
    cur = conn.cursor()
    try:
        cur.row_factory = None  # a tuple, whatever the connection's row factory
        return cur.execute(sql).fetchall()  # type: ignore[no-any-return]
    finally:
        cur.close()


def _stopped(stop_at: Optional[float]) -> bool:
    """Has this thread's stop come: the stop time seen at ``stop_at`` passed, or a stop
    reached the thread since? (A passed soft limit no longer counts in ``_stop.remaining``:
    the soft timer may still be delivering it.)"""
    return (stop_at is not None and time.monotonic() >= stop_at) or _stop.stopping()


def _code(exc: Optional[BaseException]) -> Optional[int]:
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


class _SqliteGuard:
    """``guard(sqlite3_conn)``: ``interrupt_with(conn.interrupt)`` and the busy timeout
    limited to the time left (the module docstring)."""

    __slots__ = ("_conn", "_inner", "_old", "_stop_at")

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._inner = interrupt_with(conn.interrupt)
        self._old: Optional[int] = None  # the busy timeout to put back, ms
        self._stop_at: Optional[float] = None  # the stop time at entry (time.monotonic())

    def __enter__(self) -> _SqliteGuard:
        if self._old is not None:
            raise RuntimeError("guard(): this guard is already entered")
        left = _stop.remaining()
        self._stop_at = None if left is None else time.monotonic() + left
        if left is not None:
            old = int(_pragma(self._conn, "PRAGMA busy_timeout")[0][0])
            bound = max(0, math.ceil(left * 1000.0))
            if bound < old:
                _pragma(self._conn, f"PRAGMA busy_timeout = {bound}")
                self._old = old
        try:
            self._inner.__enter__()
        except BaseException:
            self._restore()
            raise
        return self

    def __exit__(self, exc_type: Optional[type[BaseException]],
                 exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        try:
            self._inner.__exit__(exc_type, exc, tb)  # raises the stop if it cancelled
            if _code(exc) == _SQLITE_BUSY and _stopped(self._stop_at):
                # The lock wait ran out at (or past) the stop time, before the
                # interrupter called interrupt(): the stop ended it all the same.
                core.checkpoint()
                _stop.deliver_due()
        finally:
            self._restore()

    def _restore(self) -> None:
        old, self._old = self._old, None
        if old is None:
            return
        import sqlite3

        sql = f"PRAGMA busy_timeout = {old}"
        try:
            _pragma(self._conn, sql)
            return
        except sqlite3.ProgrammingError:  # closed in the block: nothing left to restore
            return
        except sqlite3.OperationalError as e:
            if _code(e) != _SQLITE_INTERRUPT:
                raise
        # interrupt() found a statement open, and SQLite refuses every statement until
        # the open ones are reset. Each was interrupted: its next read fails and resets it.
        # Rejected: closing those cursors (a cursor from before the guard is the caller's,
        # and a closed one refuses a later execute()), or leaving the timeout lowered.
        for ref in gc.get_referrers(self._conn):
            if isinstance(ref, sqlite3.Cursor) and ref.connection is self._conn:
                try:
                    ref.fetchone()
                except sqlite3.Error:
                    pass
        try:
            _pragma(self._conn, sql)
        except sqlite3.OperationalError:
            logging.getLogger("timeoutcore").warning(
                "guard(): the busy timeout of %r stays at its lowered value, not %d ms: a "
                "statement (a Blob?) is still open on the interrupted connection",
                self._conn, old)


def _psycopg_pool() -> Any:
    """The psycopg_pool module, or None where it is not installed (an optional dependency:
    imported by name, so that the type check needs it neither)."""
    try:
        return importlib.import_module("psycopg_pool")
    except ImportError:
        return None


def _pool_timeout(pool: Any, timeout: Optional[float]) -> float:
    mod = _psycopg_pool()
    if mod is None or not isinstance(pool, mod.ConnectionPool):
        raise TypeError(f"getconn() needs a psycopg_pool.ConnectionPool, not a "
                        f"{type(pool).__qualname__}")
    if timeout is None:
        return float(pool.timeout)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or math.isnan(timeout):
        raise TypeError(f"getconn(): timeout must be a number of seconds or None, not "
                        f"{timeout!r}")
    return float(timeout)


def getconn(pool: Any, timeout: Optional[float] = None) -> Any:
    """A connection from the psycopg_pool ``pool`` (``pool.getconn(timeout)``), waiting at
    most until the thread's stop time: then the wait ends with the scope's
    ``DeadlineExceeded`` (or its cancel's, soft exception), no waiter left in the pool.
    ``timeout`` (default: the pool's) ends it first with the pool's ``PoolTimeout``.
    Give the connection back with ``pool.putconn(conn)``; :func:`connection` does.
    A ``TypeError`` names a ``pool`` that is not a ``psycopg_pool.ConnectionPool``."""
    limit = _pool_timeout(pool, timeout)
    left = _stop.remaining()
    if left is None:
        return pool.getconn(limit)
    PoolTimeout = _psycopg_pool().PoolTimeout  # noqa: N806 - the pool's exception class

    stop_at = time.monotonic() + left
    conn = None
    try:
        # Held back for the length of the pool's own bookkeeping: the pool's wait ends by
        # its timeout, the time left, and a stop raises only once the pool is done.
        with core.shield():
            conn = pool.getconn(max(0.0, min(limit, left)))
    except PoolTimeout:
        if _stopped(stop_at):
            core.checkpoint()
            _stop.deliver_due()
        raise
    except BaseException:
        if conn is not None:  # the stop came as the pool handed it over: give it back
            pool.putconn(conn)
        raise
    return conn


@contextlib.contextmanager
def connection(pool: Any, timeout: Optional[float] = None) -> Iterator[Any]:
    """``with connection(pool) as conn:`` -- ``pool.connection(timeout)`` with the wait of
    :func:`getconn`: the connection's own ``with`` (commit, or roll back on an exception),
    then back to the pool, however the block ends."""
    conn = getconn(pool, timeout)
    try:
        with conn:
            yield conn
    finally:
        pool.putconn(conn)
