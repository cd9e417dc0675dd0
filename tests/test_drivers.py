"""Database drivers, for real: a blocked query stops at the trigger with interrupt_with, and
a SQLite statement waiting for another connection's lock stops at the deadline too."""

from __future__ import annotations

import json
import os
import select
import sqlite3
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import pytest
from conftest import burn, run_under_trigger

import timeoutcore
from timeoutcore import DeadlineCancelled, DeadlineExceeded
from timeoutcore.contrib.db import guard

WAIT = 10.0  # s: the most a block waits for its deadline (a broken build fails, never hangs)
FOREVER = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"


def _in_worker(fn: Callable[[], Any]) -> Any:
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn).result()


def _stopped(conn: Any, query: Callable[[], Any], trigger: str) -> tuple[str, float]:
    """(how the block ended, seconds late) for ``query`` under ``guard(conn)``; a soft
    exception replaces the driver's own "cancelled" error when leaving ``guard``."""

    def body() -> None:
        with guard(conn):
            query()

    outcome, elapsed, due = run_under_trigger(trigger, body, 0.2)
    return outcome, elapsed - due


WANT = {"hard": "hard", "soft": "soft", "cancel": "cancelled"}


@pytest.mark.parametrize("trigger", ["hard", "soft", "cancel"])
def test_sqlite_query_stops(trigger: str) -> None:
    def job() -> tuple[str, float, list[Any]]:
        conn = sqlite3.connect(":memory:")
        outcome, late = _stopped(conn, lambda: conn.execute(FOREVER).fetchall(), trigger)
        return outcome, late, conn.execute("SELECT 1").fetchall()

    outcome, late, after = _in_worker(job)
    assert outcome == WANT[trigger]
    assert late < 2.0, late  # a bound (~ms unloaded); broken: the query runs for ever
    assert after == [(1,)]


def test_interrupt_with_is_not_called_after_exit() -> None:
    calls: list[float] = []
    with pytest.raises(DeadlineExceeded):
        with timeoutcore.thread_deadline(0.2):
            with timeoutcore.interrupt_with(lambda: calls.append(time.monotonic())):
                pass
            burn(WAIT)  # the deadline comes here, in the scope, after interrupt_with exited
    time.sleep(0.3)  # fn would be called on the interrupter thread: give it time to show
    assert calls == []


def test_a_failing_fn_does_not_prevent_the_interrupt(caplog: Any) -> None:
    called = threading.Event()

    def boom() -> None:
        called.set()
        raise RuntimeError("boom")

    def job() -> str:
        try:
            with timeoutcore.thread_deadline(0.1), timeoutcore.interrupt_with(boom):
                # An unpatched Event.wait is a C lock wait the core's signal cannot end:
                # only fn (which then fails) releases it, so fn surely runs before the
                # block ends, and the deadline's interrupt must still surface after it.
                called.wait(5)
        except DeadlineExceeded:
            return "hard"
        return "returned"

    assert _in_worker(job) == "hard"
    # fn fails on the interrupter thread, which logs it just after: wait for the record.
    end = time.monotonic() + 5
    while "boom" not in caplog.text and time.monotonic() < end:
        time.sleep(0.01)
    assert "boom" in caplog.text


@pytest.mark.parametrize("driver", ["psycopg2", "psycopg"])
@pytest.mark.parametrize("trigger", ["hard", "soft", "cancel"])
def test_postgres_query_stops(driver: str, trigger: str, postgres_dsn: str) -> None:
    mod = pytest.importorskip(driver)

    def job() -> tuple[str, float, Any]:
        conn = mod.connect(postgres_dsn)
        cur = conn.cursor()
        outcome, late = _stopped(conn, lambda: cur.execute("SELECT pg_sleep(10)"), trigger)
        conn.rollback()
        cur.execute("SELECT 1")
        row = cur.fetchone()
        conn.close()
        return outcome, late, row

    outcome, late, row = _in_worker(job)
    assert outcome == WANT[trigger]
    # a bound, not a latency figure (benchmarks/bench_drivers.py measures that): the cancel
    # request's round trip to the server takes whole scheduler turns on a loaded machine;
    # broken, the query runs its 10 s
    assert late < 2.0, late
    assert row[0] == 1


# psycopg's pure-Python wait functions: wait_poll is its choice on Linux and macOS,
# wait_select on Windows, wait_selector elsewhere; wait_epoll only when asked for.
PURE_PYTHON_WAITS = ["wait_poll", "wait_select", "wait_selector"] + (
    ["wait_epoll"] if hasattr(select, "epoll") else [])


@pytest.mark.parametrize("wait", PURE_PYTHON_WAITS)
def test_pure_python_psycopg_stops_leave_the_connection_usable(wait: str,
                                                               postgres_dsn: str) -> None:
    """psycopg's pure-Python implementation (the only one on free-threaded CPython) waits
    for the server in select/poll/a selector, which patch() ends at the deadline. A stop
    under guard() must still end the block with its own exception and leave the connection
    as the C implementation does: failed (a rollback clears it), never ACTIVE with
    "another command is already in progress". Four stops of a query in a row on one
    connection, then a stop of a notifies() wait (no command in progress: the patched wait
    itself must end at the deadline; not with wait_epoll, whose epoll object is not
    patched), in a child process: psycopg picks its implementation and wait function when
    imported. Last, a stop of a query on a connection opened inside the scope: its `with`
    exit (rollback, close) runs in the stopped scope and must still close it."""
    pytest.importorskip("psycopg")
    stops = ["hard", "soft", "cancel", "hard"] + (["notifies"] if wait != "wait_epoll" else [])
    stops.append("inside")
    proc = subprocess.run(
        [sys.executable, "psycopg_python_stops.py", postgres_dsn, *stops],
        cwd=Path(__file__).parent, capture_output=True, text=True, timeout=120,
        env=dict(os.environ, PSYCOPG_IMPL="python", PSYCOPG_WAIT_FUNC=wait))
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    if "skip" in got:
        pytest.skip(got["skip"])
    assert (got["impl"], got["wait"]) == ("python", wait)
    assert [s["stop"] for s in got["stops"]] == stops
    for stop in got["stops"]:
        assert stop["outcome"] == WANT.get(stop["stop"], "hard"), stop
        # a stopped query: failed, or done; a stopped notifies(): as it was. Broken: ACTIVE
        ok = {"notifies": ("IDLE", "INTRANS"), "inside": ("CLOSED",)}.get(
            stop["stop"], ("IDLE", "INERROR"))
        assert stop["status"] in ok, stop
        assert stop["after"] == 1, stop  # rollback(), then SELECT 1
        assert stop["late"] < 2.0, stop  # a bound (as above); broken: the query's 10 s
    assert got["left"] == {"guards": 0, "fds": 0}


# --- SQLite: a statement waiting for another connection's lock -----------------------------

BUSY_MS = int(WAIT * 1000)  # the waiting connection's busy timeout: a broken guard waits it


def _locked(tmp_path: Any) -> tuple[sqlite3.Connection, sqlite3.Connection]:
    """(holder, waiter): holder has the file's exclusive lock, waiter waits up to WAIT for it."""
    path = str(tmp_path / "locked.db")
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE t(x)")
    holder.execute("BEGIN EXCLUSIVE")
    waiter = sqlite3.connect(path, timeout=WAIT, check_same_thread=False)
    return holder, waiter


def _unlocked_afterwards(holder: sqlite3.Connection, waiter: sqlite3.Connection) -> None:
    """The old busy timeout is back, the waiter works, and neither holds a lock."""
    assert waiter.execute("PRAGMA busy_timeout").fetchone() == (BUSY_MS,)
    holder.execute("ROLLBACK")
    waiter.execute("INSERT INTO t VALUES (2)")
    waiter.commit()
    assert not waiter.in_transaction
    holder.execute("INSERT INTO t VALUES (3)")  # autocommit: needs the lock the waiter had
    assert holder.execute("SELECT x FROM t ORDER BY x").fetchall() == [(2,), (3,)]
    holder.close()
    waiter.close()


@pytest.mark.parametrize("trigger", ["hard", "soft"])
def test_sqlite_lock_wait_stops(trigger: str, tmp_path: Any) -> None:
    holder, waiter = _locked(tmp_path)

    def job() -> tuple[str, float, Any]:
        outcome, late = _stopped(waiter, lambda: waiter.execute("INSERT INTO t VALUES (1)"),
                                 trigger)
        return outcome, late, waiter.in_transaction

    outcome, late, in_tx = _in_worker(job)
    assert outcome == WANT[trigger]  # the deadline's exception, not "database is locked"
    assert late < 2.0, late  # broken: the busy timeout, WAIT s
    assert not in_tx
    _unlocked_afterwards(holder, waiter)


def test_sqlite_lock_wait_hears_a_cancel_by_the_stop_time_at_entry(tmp_path: Any) -> None:
    """The documented bound: a cancel during the lock wait ends it at the latest at the stop
    time the guard saw at entry (SQLite's busy handler cannot be woken), with the cancel's
    exception."""
    holder, waiter = _locked(tmp_path)

    def job() -> tuple[str, float]:
        scope = timeoutcore.thread_deadline(1.0)
        timer = threading.Timer(0.1, scope.cancel)
        start = time.monotonic()
        try:
            with scope, guard(waiter):
                timer.start()
                waiter.execute("INSERT INTO t VALUES (1)")
        except DeadlineCancelled:
            return "cancelled", time.monotonic() - start
        finally:
            timer.join()
        return "returned", time.monotonic() - start

    outcome, elapsed = _in_worker(job)
    assert outcome == "cancelled"
    assert elapsed < 1.0 + 2.0, elapsed  # broken: WAIT s
    _unlocked_afterwards(holder, waiter)


def test_sqlite_own_busy_timeout_first_is_the_drivers_error(tmp_path: Any) -> None:
    """A busy timeout shorter than the time left is the caller's: it ends with "database is
    locked" and stays as it was."""
    holder, waiter = _locked(tmp_path)
    waiter.execute(f"PRAGMA busy_timeout = {BUSY_MS}")
    quick = sqlite3.connect(str(tmp_path / "locked.db"), timeout=0.05,
                            check_same_thread=False)

    def job() -> str:
        try:
            with timeoutcore.thread_deadline(WAIT), guard(quick):
                quick.execute("INSERT INTO t VALUES (1)")
        except sqlite3.OperationalError as e:
            return str(e)
        return "returned"

    assert _in_worker(job) == "database is locked"
    assert quick.execute("PRAGMA busy_timeout").fetchone() == (50,)
    quick.rollback()
    quick.close()
    _unlocked_afterwards(holder, waiter)


def test_sqlite_busy_timeout_restored_with_a_cursor_left_open(tmp_path: Any) -> None:
    """interrupt() came while the block's cursor was half read: SQLite refuses every
    statement until that cursor is reset; guard still puts the busy timeout back, and the
    connection works afterwards even while the cursor is still referenced."""
    conn = sqlite3.connect(str(tmp_path / "rows.db"), timeout=WAIT, check_same_thread=False)
    conn.execute("CREATE TABLE t(x)")
    conn.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(100)])
    conn.commit()
    kept: list[sqlite3.Cursor] = []

    def job() -> str:
        try:
            with timeoutcore.thread_deadline(0.2), guard(conn):
                cur = conn.execute("SELECT x FROM t")
                kept.append(cur)
                cur.fetchone()
                # interrupt() ends this one (the SELECT is still open): always called,
                # since nothing else can end the query
                conn.execute(FOREVER).fetchall()
        except DeadlineExceeded:
            return "hard"
        return "returned"

    assert _in_worker(job) == "hard"
    assert conn.execute("PRAGMA busy_timeout").fetchone() == (BUSY_MS,)
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (100,)
    assert len(kept) == 1
    conn.close()


def test_sqlite_guard_outside_a_scope_changes_nothing(tmp_path: Any) -> None:
    conn = sqlite3.connect(str(tmp_path / "free.db"), timeout=WAIT)
    with guard(conn):
        assert conn.execute("PRAGMA busy_timeout").fetchone() == (BUSY_MS,)
    with timeoutcore.thread_deadline(WAIT), guard(conn):
        lowered = conn.execute("PRAGMA busy_timeout").fetchone()[0]
    assert 0 < lowered <= BUSY_MS
    assert conn.execute("PRAGMA busy_timeout").fetchone() == (BUSY_MS,)
    conn.close()


def test_guard_refuses_what_is_not_a_connection() -> None:
    from timeoutcore import interrupt

    with pytest.raises(TypeError, match="object"):
        guard(object())
    with pytest.raises(TypeError, match="str"):
        guard("app.db")
    assert not interrupt._interrupter._guards  # nothing armed
    conn = sqlite3.connect(":memory:")
    conn.close()
    with pytest.raises(sqlite3.ProgrammingError):  # a closed connection: entry fails
        with timeoutcore.thread_deadline(WAIT), guard(conn):
            pass
    assert not interrupt._interrupter._guards
