"""redis-py's connection pools under deadlines, for real (redis-py against a live
``redis-server``): with ``contrib.redis_client.protect_pools()`` a command, pipeline or
pub/sub call stopped by a deadline or ``cancel()`` gives its connection back, and a command
blocked on the network is still stopped at its deadline."""

from __future__ import annotations

import gc
import inspect
import os
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import timeoutcore
from timeoutcore import DeadlineExceeded
from timeoutcore.contrib import redis_client
from timeoutcore.contrib.redis_client import protect_pools
from timeoutcore.protect import _snapshot

redis = pytest.importorskip("redis")

WAIT = 5.0  # s: a BlockingConnectionPool's own wait; a lost connection makes it run out
THREADS = 8
BLOCKS = 60  # per thread
SIZES = {"blocking": 2, "plain": THREADS}  # a plain pool of 8 for 8 threads never runs out


@pytest.fixture(scope="module", autouse=True)
def _protected() -> None:
    protect_pools()


def _fds() -> int:
    return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else -1


@pytest.fixture(params=["blocking", "plain"])
def pool(request: Any, redis_url: str) -> Iterator[Any]:
    """A small pool of the kind asked for; every fd it opened is closed afterwards."""
    gc.collect()  # an earlier test's garbage closing its socket here is not this pool's
    fds = _fds()
    if request.param == "blocking":
        p = redis.BlockingConnectionPool.from_url(redis_url, max_connections=2, timeout=WAIT)
    else:
        p = redis.ConnectionPool.from_url(redis_url, max_connections=THREADS)
    p.test_size = SIZES[request.param]
    yield p
    p.disconnect()
    # A connect stopped at its explicit point leaves its new socket to the collector:
    # redis-py's _connect() closes it only on OSError, and the traceback's frames hold it
    # in a cycle. Every other socket is closed by disconnect().
    gc.collect()
    assert _fds() == fds, "a connection's socket was left open"


def _intact(pool: Any) -> None:
    """Every connection of the pool can be taken at once, each a different one that answers
    PING; then they go back. A lost connection: ``ConnectionError`` after WAIT (blocking
    pool) or ``MaxConnectionsError`` (plain pool); one released twice: the same connection
    handed out twice."""
    size = pool.test_size
    conns: list[Any] = []
    try:
        for _ in range(size):
            conns.append(pool.get_connection())
        assert len({id(c) for c in conns}) == size, "one connection handed out twice"
        for conn in conns:
            conn.send_command("PING")
            assert conn.read_response() in (b"PONG", "PONG")
    finally:
        for conn in conns:
            pool.release(conn)


def _work(client: Any, rnd: random.Random, tag: str) -> None:
    """One block's work: commands, a pipeline, a WATCH transaction or a pub/sub round."""
    key, empty, channel = f"{tag}:k", f"{tag}:empty", f"{tag}:ch"
    kind = rnd.randrange(4)
    if kind == 0:
        for i in range(10):
            client.set(key, i)
            assert client.get(key) == str(i).encode()
        client.blpop([empty], timeout=0.01)
    elif kind == 1:
        for _ in range(5):
            with client.pipeline(transaction=False) as pipe:
                pipe.set(key, 1).incr(key).get(key)
                assert pipe.execute() == [True, 2, b"2"]
    elif kind == 2:
        def bump(pipe: Any) -> None:
            value = int(pipe.get(key) or 0)
            pipe.multi()
            pipe.set(key, value + 1)

        for _ in range(5):
            client.transaction(bump, key)
    else:
        # No PUBLISH here: it would need a second connection while the pub/sub one is
        # held, and two such blocks would wait for each other on a pool of 2.
        with client.pubsub() as ps:
            ps.subscribe(channel)
            for _ in range(3):
                ps.get_message(timeout=0.01)
            ps.unsubscribe(channel)


def _pool_failure(exc: BaseException) -> bool:
    """Whether a block's ``DeadlineExceeded`` came after the pool failed it: no free
    connection (``ConnectionError``, ``MaxConnectionsError``: a connection was lost) or a
    connection in a bad state (``InvalidResponse``, a ``ResponseError``: one connection
    shared by two threads, or returned with a reply unread). A ``WatchError`` is
    ``transaction()``'s own retry, and cannot happen here (each thread has its own key)."""
    seen: BaseException | None = exc.__context__
    while seen is not None:
        if isinstance(seen, redis.exceptions.RedisError) \
                and not isinstance(seen, redis.exceptions.WatchError):
            return True
        seen = seen.__context__
    return False


def _hammer(pool: Any, trigger: str) -> dict[str, int]:
    """THREADS x BLOCKS blocks of :func:`_work` on one client, each stopped after 1-20 ms
    (``trigger``: its deadline under ``patch()``, its deadline without it, or ``cancel()``
    from a timer). Returns how the blocks ended; anything but a finished block or a
    ``DeadlineExceeded`` fails."""
    client = redis.Redis(connection_pool=pool)
    counts = {"finished": 0, "stopped": 0}
    errors: list[BaseException] = []
    lock = threading.Lock()
    threads_before = set(threading.enumerate())

    def worker(n: int) -> None:
        rnd = random.Random(n)
        tag = f"timeoutcore-test-pool-{os.getpid()}-{n}"
        for _ in range(BLOCKS):
            delay = rnd.uniform(0.001, 0.02)
            timer = None
            try:
                with timeoutcore.thread_deadline(30.0 if trigger == "cancel" else delay) \
                        as scope:
                    if trigger == "cancel":
                        timer = threading.Timer(delay, scope.cancel)
                        timer.start()
                    _work(client, rnd, tag)
                outcome = "finished"
            except DeadlineExceeded as exc:
                if _pool_failure(exc):  # what a lost connection looks like: stop here
                    with lock:
                        errors.append(exc)
                    return
                outcome = "stopped"
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                with lock:
                    errors.append(exc)
                return
            finally:
                if timer is not None:
                    timer.cancel()
                    timer.join()
            with lock:
                counts[outcome] += 1

    if trigger != "unpatched":
        timeoutcore.patch()
    try:
        threads = [threading.Thread(target=worker, args=(n,)) for n in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), "a worker hangs"
    finally:
        if trigger != "unpatched":
            timeoutcore.unpatch()
    assert not errors, errors[:3]
    assert set(threading.enumerate()) == threads_before, "a thread was left behind"
    assert client.ping() is True
    client.delete(*[f"timeoutcore-test-pool-{os.getpid()}-{n}:k" for n in range(THREADS)])
    return counts


@pytest.mark.parametrize("trigger", ["deadline", "unpatched", "cancel"])
def test_stopped_blocks_give_every_connection_back(pool: Any, trigger: str) -> None:
    counts = _hammer(pool, trigger)
    # Proof that the hammer stopped commands at all (without protect_pools() about one run
    # in two already lost a connection of the blocking pool's 2): a share of its blocks.
    assert counts["stopped"] >= THREADS * BLOCKS // 10, counts
    assert counts["stopped"] + counts["finished"] == THREADS * BLOCKS
    _intact(pool)


@pytest.mark.parametrize("patched", [True, False], ids=["patched", "unpatched"])
def test_blocked_command_still_stops_at_its_deadline(redis_url: str, patched: bool) -> None:
    """A BLPOP waiting for a key that never comes: under ``patch()`` its socket read is an
    explicit point and ends at the deadline although the command runs protected; without
    it the read waits out BLPOP's own timeout (nothing stops a socket read then) and the
    interrupt surfaces when the command returns. Either way the one connection of the pool
    is back, disconnected or not, and the next command works."""
    pool = redis.BlockingConnectionPool.from_url(redis_url, max_connections=1, timeout=WAIT)
    client = redis.Redis(connection_pool=pool)
    key = f"timeoutcore-test-pool-{os.getpid()}-never"
    server_wait = 30.0 if patched else 1.0  # BLPOP's own timeout
    if patched:
        timeoutcore.patch()
    try:
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            with timeoutcore.thread_deadline(0.2) as scope:
                client.blpop([key], timeout=server_wait)
        elapsed = time.monotonic() - start
    finally:
        if patched:
            timeoutcore.unpatch()
    assert scope.expired()
    if patched:
        assert elapsed < 0.2 + 5.0, elapsed  # broken: BLPOP's 30 s
    else:
        assert elapsed >= server_wait, elapsed  # the command ran to its own end
    conn = pool.get_connection()  # the pool's only connection: ConnectionError if lost
    pool.release(conn)
    assert client.ping() is True
    pool.disconnect()


def test_protect_pools_is_idempotent_and_protects_the_checkout_paths() -> None:
    names = protect_pools()
    assert protect_pools() == names
    for name in ("redis.connection.ConnectionPool.get_connection",
                 "redis.connection.ConnectionPool.release",
                 "redis.connection.BlockingConnectionPool.get_connection",
                 "redis.connection.BlockingConnectionPool.release",
                 "redis.client.Redis.execute_command",
                 "redis.client.Pipeline.execute", "redis.client.Pipeline.reset",
                 "redis.client.PubSub.execute_command", "redis.client.PubSub.reset"):
        assert name in names
    codes = _snapshot()[2]
    for fn in (redis.BlockingConnectionPool.get_connection, redis.ConnectionPool.release,
               redis.client.Pipeline.execute):
        assert inspect.unwrap(fn).__code__ in codes


def test_protect_pools_refuses_an_unknown_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """A required function missing: RuntimeError naming it, and nothing protected."""
    monkeypatch.setattr(redis_client, "_done", ())
    monkeypatch.setattr(redis_client, "_TARGETS", (
        ("redis.client", "Redis", "no_such_method_here", True),
        ("redis.client", "Monitor", "next_command", True),
    ))
    before = _snapshot()[2]
    with pytest.raises(RuntimeError, match="redis.client.Redis.no_such_method_here"):
        protect_pools()
    assert _snapshot()[2] == before
    assert redis_client._done == ()
