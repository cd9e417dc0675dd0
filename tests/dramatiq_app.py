"""The Dramatiq actors of tests/test_dramatiq.py and benchmarks/bench_dramatiq.py.

A worker runs ``python -m dramatiq dramatiq_app`` with its settings in the environment
(``TC_*``, read by :func:`from_env`); the test process builds the same broker with
:func:`make_broker` to send messages and read results. Every run has a namespace of its
own (broker keys, results, registry), so runs sharing one Redis never see each other's
messages.

``TC_LIMITS``: ``timeoutcore`` (this package's TimeLimit, ``install(broker, patch=True)``),
``timeoutcore-nopatch`` (the same without ``patch()``), ``stock`` (dramatiq's own TimeLimit,
as the broker comes), or ``none``. ``TC_STOPWATCH=1``
adds :class:`Stopwatch` (the benchmark's clock, in the worker).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from typing import Any, Optional

import dramatiq
import redis
import requests
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import MiddlewareError, SkipMessage
from dramatiq.middleware import TimeLimit as StockTimeLimit
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

from conftest import burn as _burn  # the tests' workloads (tests/ is on the path)

LIMIT_MS = 500  # the limit of the actors that overrun it


def make_broker(url: str, namespace: str, *, limits: str = "timeoutcore",
                registry_prefix: Optional[str] = None, worker: bool = False) -> RedisBroker:
    """The broker and its Results backend; with ``worker`` the time-limit middleware is
    set up as the worker runs it (the sending side needs none of it)."""
    broker = RedisBroker(url=url, namespace=namespace)
    broker.add_middleware(Results(backend=RedisBackend(url=url, namespace=f"{namespace}-r")))
    if limits in ("timeoutcore", "timeoutcore-nopatch"):
        from timeoutcore.contrib.dramatiq import install

        registry = None
        if registry_prefix:
            from timeoutcore.contrib.redis import DeadlineRegistry

            registry = DeadlineRegistry.from_url(url, prefix=registry_prefix)
        install(broker, patch=worker and limits == "timeoutcore", registry=registry)
    elif limits == "none":
        broker.middleware[:] = [m for m in broker.middleware
                                if not isinstance(m, StockTimeLimit)]
    if worker:
        broker.add_middleware(Saboteur())  # after the time-limit middleware
    if worker and os.environ.get("TC_STOPWATCH") == "1":
        broker.middleware.insert(0, Stopwatch(url, namespace))  # first in, last out
    dramatiq.set_broker(broker)
    _declare(broker, url, namespace)
    return broker


class Saboteur(dramatiq.Middleware):
    """Another middleware that goes wrong before a message of actor ``sabotaged`` runs,
    as its argument says: ``skip`` (SkipMessage: the message is skipped), ``fail`` (a
    MiddlewareError: the message fails before the actor is called), ``raise`` (any other
    error: dramatiq logs it and runs the actor anyway)."""

    def before_process_message(self, broker: Any, message: Any) -> None:
        if message.actor_name != "sabotaged":
            return
        how = message.args[0]
        if how == "skip":
            raise SkipMessage("skipped by the saboteur")
        if how == "fail":
            raise MiddlewareError("failed by the saboteur")
        if how == "raise":
            raise RuntimeError("raised by the saboteur")


class Stopwatch(dramatiq.Middleware):
    """The benchmark's clock in the worker: for every message, the ms from the first
    middleware's before_process_message to the last after_process_message hook (the whole
    middleware path and the actor), and the end time, in the Redis hash ``<ns>:stopwatch``."""

    def __init__(self, url: str, namespace: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.key = f"{namespace}:stopwatch"
        self.started = threading.local()

    def before_process_message(self, broker: Any, message: Any) -> None:
        self.started.at = time.perf_counter()

    def after_process_message(self, broker: Any, message: Any, *, result: Any = None,
                              exception: Optional[BaseException] = None) -> None:
        end = time.perf_counter()
        took = (end - self.started.at) * 1000
        self.client.hset(self.key, message.message_id, f"{took:.4f} {end:.6f}")

    after_skip_message = after_process_message


def _declare(broker: RedisBroker, url: str, namespace: str) -> None:
    r = redis.Redis.from_url(url)
    once: dict[str, Any] = {"store_results": True, "max_retries": 0}
    limited = dict(once, time_limit=LIMIT_MS)
    # every actor's options are accepted by a broker without our middleware too
    soft_ok = "soft_time_limit" in broker.actor_options

    @dramatiq.actor(**limited)
    def sleep(seconds: float) -> str:
        time.sleep(seconds)
        return "slept"

    @dramatiq.actor(**limited)
    def http(url: str) -> str:
        requests.get(url, timeout=60)
        return "answered"

    @dramatiq.actor(**limited)
    def spin(seconds: float) -> str:
        _burn(seconds)
        return "ran to the end"

    @dramatiq.actor(**limited)
    def child(key: str) -> str:
        proc = subprocess.Popen(["sleep", "30"])
        r.set(key, proc.pid, ex=300)
        proc.wait()
        return "child exited"

    @dramatiq.actor(**once)
    def quick(x: int) -> int:
        return 2 * x

    @dramatiq.actor(**once)
    def state() -> dict[str, Any]:
        """The worker process as the actors see it: its threads, children and the scopes
        active in it (the one this message runs under, nothing else)."""
        import timeoutcore

        return {"pid": os.getpid(), "thread": threading.current_thread().name,
                "threads": sorted(t.name for t in threading.enumerate()),
                "children": _children(),
                "scopes": [s.label for s in timeoutcore.active_scopes()]}

    @dramatiq.actor(**once)
    def sabotaged(how: str) -> str:
        return f"ran ({how})"

    @dramatiq.actor(max_retries=0)
    def one_ms() -> None:
        """The benchmark's per-message cost: 1 ms of CPU, nothing stored."""
        _burn(0.001)

    @dramatiq.actor(**once)
    def busy_or_not(seconds: float) -> str:
        """The hammer's body: ends by itself at about its limit."""
        _burn(seconds)
        return "done"

    # Retries with a short backoff: a retry after an abort would show within a second.
    @dramatiq.actor(store_results=True, max_retries=3, min_backoff=50, max_backoff=100,
                    time_limit=30_000)
    def counted(key: str, seconds: float) -> str:
        r.incr(key)
        r.expire(key, 300)
        time.sleep(seconds)
        return "ran to the end"

    if soft_ok:
        @dramatiq.actor(store_results=True, max_retries=0, time_limit=5000,
                        soft_time_limit=200)
        def soft(seconds: float) -> str:
            _burn(seconds)
            return "ran to the end"

    @dramatiq.actor(store_results=True, max_retries=0, time_limit=float("inf"))
    def unlimited(seconds: float) -> str:
        time.sleep(seconds)
        return "ran to the end"


def _children() -> list[int]:
    """The pids of this process's live children (Linux /proc)."""
    pid = os.getpid()
    found = []
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            found = [int(p) for p in f.read().split()]
    except OSError:
        pass
    return found


def from_env() -> RedisBroker:
    env = os.environ
    return make_broker(env["TC_URL"], env["TC_NS"], limits=env.get("TC_LIMITS", "timeoutcore"),
                       registry_prefix=env.get("TC_REGISTRY_PREFIX") or None, worker=True)


if os.environ.get("TC_NS") and os.environ.get("TC_WORKER") == "1":
    broker = from_env()
