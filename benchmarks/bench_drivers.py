"""From the deadline to the exception for a query blocked in a database driver's C code,
stopped through ``timeoutcore.contrib.db.guard(conn)`` (``interrupt_with`` the driver's
own cancel), in a worker thread.

Group ``driver``: each trial runs a query that would take seconds -- a recursive CTE in
SQLite (in memory), ``SELECT pg_sleep(10)`` on a real PostgreSQL through psycopg2 and
psycopg 3 -- under a 0.2 s deadline; the figure is the moment ``DeadlineExceeded`` is caught
minus the deadline (``p50_ms``/``p99_ms``), then the connection is rolled back and reused.

    python -m pytest benchmarks/bench_drivers.py --benchmark-only
"""

from __future__ import annotations

import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import pytest
from bench_triggers import _quantiles
from pytest_benchmark.fixture import BenchmarkFixture

import timeoutcore
from timeoutcore.contrib.db import guard

TRIALS = 15
LIMIT = 0.2
CTE = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
       "SELECT count(*) FROM c")


def _trial(conn: Any, query: Callable[[], Any]) -> float:
    start = time.monotonic()
    try:
        with timeoutcore.thread_deadline(LIMIT), guard(conn):
            query()
    except timeoutcore.DeadlineExceeded:
        pass
    late = time.monotonic() - (start + LIMIT)
    conn.rollback()
    return late


def _measure(benchmark: BenchmarkFixture, case: str, connect: Callable[[], Any],
             run: Callable[[Any], Any]) -> None:
    lat: list[float] = []
    with ThreadPoolExecutor(1) as pool:
        conn = pool.submit(connect).result()  # sqlite3 connections stay in their thread

        def once() -> None:
            lat.append(pool.submit(_trial, conn, lambda: run(conn)).result())
        benchmark.pedantic(once, rounds=TRIALS, iterations=1)
        pool.submit(conn.close).result()
    benchmark.extra_info.update(_quantiles(lat), case=case)


@pytest.mark.benchmark(group="driver")
def test_sqlite_query(benchmark: BenchmarkFixture) -> None:
    _measure(benchmark, "sqlite3 recursive CTE <- hard", lambda: sqlite3.connect(":memory:"),
             lambda c: c.execute(CTE).fetchall())


@pytest.mark.benchmark(group="driver")
@pytest.mark.parametrize("driver", ["psycopg2", "psycopg"])
def test_postgres_query(benchmark: BenchmarkFixture, driver: str, postgres_dsn: str) -> None:
    mod = pytest.importorskip(driver)
    _measure(benchmark, f"{driver} pg_sleep(10) <- hard", lambda: mod.connect(postgres_dsn),
             lambda c: c.cursor().execute("SELECT pg_sleep(10)"))
