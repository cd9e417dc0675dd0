"""Connection pools under deadlines, for real (psycopg_pool on a live PostgreSQL): a wait for
a connection stopped by the deadline leaves no waiter behind and loses no connection."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import timeoutcore
from timeoutcore import DeadlineExceeded
from timeoutcore.contrib.db import connection, getconn

psycopg_pool = pytest.importorskip("psycopg_pool")

WAIT = 10.0  # s: the pool's own timeout; a broken helper waits it out


@pytest.fixture
def pool(postgres_dsn: str) -> Iterator[Any]:
    p = psycopg_pool.ConnectionPool(postgres_dsn, min_size=2, max_size=2, timeout=WAIT,
                                    open=True)
    p.wait(WAIT)
    yield p
    p.close()


def _intact(pool: Any) -> None:
    """Both connections are back in the pool and nobody waits."""
    stats = pool.get_stats()
    assert stats["pool_size"] == 2
    assert stats["pool_available"] == 2, stats
    assert stats.get("requests_waiting", 0) == 0, stats
    conns = [pool.getconn(timeout=WAIT) for _ in range(2)]  # a lost one: PoolTimeout
    for conn in conns:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        pool.putconn(conn)


@pytest.mark.parametrize("patched", [False, True], ids=["plain", "patched"])
def test_stopped_wait_leaves_no_waiter(pool: Any, patched: bool) -> None:
    held = [pool.getconn(), pool.getconn()]  # the pool is empty: getconn must wait
    if patched:
        timeoutcore.patch()
    try:
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded) as info:
            with timeoutcore.thread_deadline(0.2):
                getconn(pool)
        elapsed = time.monotonic() - start
    finally:
        if patched:
            timeoutcore.unpatch()
    chain, exc = [], info.value.__context__
    while exc is not None:
        chain.append(type(exc))
        exc = exc.__context__
    assert psycopg_pool.PoolTimeout in chain  # the pool ended its wait itself
    assert elapsed < 0.2 + 2.0, elapsed  # broken: the pool's WAIT s
    # The timed-out waiter stays queued, failed, as after the pool's own timeout: the next
    # putconn() skips it. A waiter stopped by the raw interrupt is not failed, and takes
    # the connection with it.
    for conn in held:
        pool.putconn(conn)
    _intact(pool)


def test_own_timeout_first_is_the_pools_error(pool: Any) -> None:
    held = [pool.getconn(), pool.getconn()]
    with pytest.raises(psycopg_pool.PoolTimeout):
        with timeoutcore.thread_deadline(WAIT):
            getconn(pool, timeout=0.1)
    for conn in held:
        pool.putconn(conn)
    _intact(pool)


def test_connection_goes_back_however_the_block_ends(pool: Any) -> None:
    with pytest.raises(DeadlineExceeded):
        with timeoutcore.thread_deadline(0.2), connection(pool) as conn:
            conn.execute("SELECT pg_sleep(0)")
            time.sleep(0.01)  # unpatched here: the deadline lands in the loop below
            end = time.monotonic() + WAIT
            while time.monotonic() < end:
                pass
    with connection(pool) as conn:  # outside any scope: the plain pool.connection()
        assert conn.execute("SELECT 1").fetchone() == (1,)
    _intact(pool)


def test_hammer_loses_no_connection(pool: Any) -> None:
    """8 threads x 200 blocks whose 1-20 ms deadlines often expire while waiting for one of
    the 2 connections (patched sleeps inside, so the holders are stopped too)."""
    counts = {"ok": 0, "deadline": 0}
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(seed: int) -> None:
        rnd = random.Random(seed)
        for _ in range(200):
            kind = "ok"
            try:
                with timeoutcore.thread_deadline(rnd.uniform(0.001, 0.02)):
                    with connection(pool):
                        time.sleep(rnd.uniform(0.0, 0.01))
            except DeadlineExceeded:
                kind = "deadline"
            except BaseException as e:  # noqa: BLE001 - collected, the test fails on it
                with lock:
                    errors.append(e)
                return
            with lock:
                counts[kind] += 1

    timeoutcore.patch()
    try:
        threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads)
    finally:
        timeoutcore.unpatch()
    assert errors == []
    assert counts["ok"] + counts["deadline"] == 1600
    assert counts["deadline"] > 0 and counts["ok"] > 0, counts  # both paths were taken
    _intact(pool)


def test_bad_input_is_refused(pool: Any) -> None:
    with pytest.raises(TypeError, match="object"):
        getconn(object())
    with pytest.raises(TypeError, match="'soon'"):
        getconn(pool, timeout="soon")
    conn = pool.getconn()
    try:
        with pytest.raises(TypeError, match="Connection"):  # a connection, not its pool
            with connection(conn):
                pass
    finally:
        pool.putconn(conn)
    _intact(pool)  # nothing taken, nobody waiting
