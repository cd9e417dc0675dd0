"""Huey with timeoutcore.contrib.huey: how late a timeout or a revoke stops a task, and what
install() costs a task, against stock huey in the same run.

Real consumers (``huey_consumer huey_app.huey -w 1``, tests/huey_harness.py) on a real Redis
($TIMEOUTCORE_TEST_REDIS_URL, else a ``redis-server`` started for the run):

- ``limit_to_failed``: a task blocked in ``time.sleep`` or spinning in Python with a 0.2 s
  timeout, enqueued back to back on one worker: ms from the limit (``SIGNAL_EXECUTING`` +
  0.2 s) to huey's ``SIGNAL_TIMEOUT``, p50/p99 -- thread workers with install(patch=True),
  and huey's process workers (``-k process``: ``SIGALRM`` in the worker process) as the
  stock mechanism. Stock thread workers have none: the same task runs to its end there
  (``stock_thread_workers``: how long a 0.5 s sleep under a 0.2 s timeout ran).
- ``revoke_running``: ``Result.revoke()`` of a task sleeping in a thread worker: ms from the
  call to ``SIGNAL_REVOKED`` (the task stopped), p50/p99. Stock huey never stops it.
- ``overhead_<n>ms_tasks``: one worker thread draining 300 queued tasks of 1 ms of CPU
  (a fixed ``sum(range(n))``, calibrated here; 1,200 empty ones), stock vs install(patch=True), rounds alternated (ABBA): the median
  round's wall time per task and its ratio (installed / stock: 1.02 is 2 % fewer tasks a
  second), and the CPU time per task of the consumer process and of its worker thread
  (less disturbed by other load on the machine than the wall time; for empty tasks, what
  huey and install() cost per task).
- ``execute_<n>ms_tasks``: the same without the consumer around it, so without its noise:
  ``huey.execute(task)`` of 1,000 tasks of ``n`` ms of CPU in one thread, on a MemoryHuey
  whose thread consumer was made (not started) with and without install(patch=True), rounds
  alternated; the median round's CPU time per task (``time.thread_time``: the machine's
  other load does not count), the microseconds install() adds, and the ratio.
- ``rejected_alternatives``: what the per-task Redis registry (``DeadlineRegistry``) would
  add to each task, and what one check of a task's revoke flags costs the watcher.

Run: ``python benchmarks/bench_huey.py`` (about 2 minutes); writes
``benchmarks/results/huey.json``.
"""

from __future__ import annotations

import contextlib
import json
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"
RESULTS = HERE / "results" / "huey.json"
COMMAND = "python benchmarks/bench_huey.py"

LIMIT = 0.2  # seconds: the timeout of the limit_to_failed tasks
TRIALS = 60  # per kind and worker type
REVOKES = 100
TASKS_PER_ROUND = 300
ROUNDS = 12  # per configuration


def _percentiles(ms: list[float]) -> dict[str, Any]:
    import harness

    return dict(trials=len(ms), **harness.percentiles(ms))


@contextlib.contextmanager
def _redis(folder: Path) -> Iterator[str]:
    from redis_server import session_redis

    with session_redis(lambda: folder / "redis") as url:
        yield url


def _stamps(consumer: Any) -> dict[str, float]:
    from huey_app import stamps_key

    raw = consumer.huey.storage.conn.hgetall(stamps_key(consumer.huey))
    return {k.decode(): float(v) for k, v in raw.items()}


def _wait_stamp(consumer: Any, field: str, timeout: float = 30.0) -> float:
    from huey_app import stamps_key

    conn, key = consumer.huey.storage.conn, stamps_key(consumer.huey)
    end = time.monotonic() + timeout
    while True:
        value = conn.hget(key, field)
        if value is not None:
            return float(value)
        if time.monotonic() > end:
            raise AssertionError(f"no {field} stamp in {timeout} s:\n{consumer.log()[-2000:]}")
        time.sleep(0.001)


def limit_to_failed(consumer: Any, cpu: bool) -> dict[str, Any]:
    """Tasks queued back to back, each with a LIMIT timeout; ms from each one's limit to
    its SIGNAL_TIMEOUT."""
    results = [consumer["work"](30, cpu, timeout=LIMIT) for _ in range(TRIALS)]
    _wait_stamp(consumer, f"{results[-1].id}:timeout", timeout=TRIALS * (LIMIT + 1))
    stamps = _stamps(consumer)
    late = [(stamps[f"{r.id}:timeout"] - stamps[f"{r.id}:executing"] - LIMIT) * 1e3
            for r in results]
    return _percentiles(late)


def stock_thread_runs_on(consumer: Any) -> dict[str, Any]:
    """Stock thread workers: a 0.5 s sleep under a LIMIT timeout runs to its end."""
    ran = []
    for _ in range(3):
        result = consumer["work"](0.5, False, timeout=LIMIT)
        end = _wait_stamp(consumer, f"{result.id}:complete")
        ran.append(end - _stamps(consumer)[f"{result.id}:executing"])
    return {"timeout_s": LIMIT, "task_s": 0.5, "ran_s": [round(x, 3) for x in ran],
            "note": "completed: huey's thread workers do not enforce timeout"}


def revoke_running(consumer: Any, folder: Path) -> dict[str, Any]:
    took = []
    for i in range(REVOKES):
        result = consumer["blocker"](str(folder / f"revoke-{i}"))
        _wait_stamp(consumer, f"{result.id}:executing")
        time.sleep(0.005 + (i % 10) * 0.003)  # into the sleep, at varied phases of the poll
        t0 = time.monotonic()
        result.revoke()
        took.append((_wait_stamp(consumer, f"{result.id}:revoked") - t0) * 1e3)
    return _percentiles(took)


def iterations_for(ms: float) -> int:
    """``n`` for which ``sum(range(n))`` (huey_app's crunch task) takes ``ms`` ms of CPU
    here (the fastest of a few tries: the least disturbed)."""
    if not ms:
        return 0
    n = 1_000_000
    took = min(_cpu_of(n) for _ in range(5))
    return max(1, int(n * ms / 1e3 / took))


def _cpu_of(n: int) -> float:
    t0 = time.thread_time()
    sum(range(n))
    return time.thread_time() - t0


def _drain_round(consumer: Any, n: int, tasks: int) -> dict[str, float]:
    """Seconds per task -- ``wall``, ``cpu`` (the consumer process), ``thread_cpu`` (its
    one worker thread) -- for the worker to run ``tasks`` queued crunch(n) tasks: a gate
    task holds the worker while they are queued; the clock task after them tells when the
    last one has ended."""
    huey, key = consumer.huey, f"{consumer.name}:gate:{uuid.uuid4().hex}"
    gate = consumer["gate"](key)
    for _ in range(tasks):
        consumer["crunch"](n)
    clock = consumer["clock"]()
    end = time.monotonic() + 30
    while huey.pending_count() > tasks + 1:  # until the worker holds the gate
        assert time.monotonic() < end, consumer.log()[-2000:]
        time.sleep(0.005)
    t0 = time.monotonic()
    huey.storage.conn.rpush(key, b"go")
    t1, cpu1, thread1 = clock.get(blocking=True, timeout=120)
    cpu0, thread0 = gate.get(blocking=True, timeout=10)
    huey.storage.conn.delete(key)
    per = tasks + 1
    return {"wall": (t1 - t0) / per, "cpu": (cpu1 - cpu0) / per,
            "thread_cpu": (thread1 - thread0) / per}


def overhead(stock: Any, installed: Any, ms: int, tasks: int) -> dict[str, Any]:
    rounds: dict[str, list[dict[str, float]]] = {"stock": [], "installed": []}
    n = iterations_for(ms)
    for consumer in (stock, installed):  # warm-up
        _drain_round(consumer, n, tasks)
    for _ in range(ROUNDS // 2):
        for name in ("stock", "installed", "installed", "stock"):
            rounds[name].append(_drain_round(stock if name == "stock" else installed, n,
                                             tasks))

    def median(name: str, what: str) -> float:
        return statistics.median(r[what] for r in rounds[name])

    out: dict[str, Any] = {"task_cpu_ms": ms, "task": f"sum(range({n}))",
                           "tasks_per_round": tasks, "rounds": ROUNDS}
    for what, label in (("wall", ""), ("cpu", "cpu_"), ("thread_cpu", "thread_cpu_")):
        out[f"stock_{label}us_per_task"] = round(median("stock", what) * 1e6, 1)
        out[f"installed_{label}us_per_task"] = round(median("installed", what) * 1e6, 1)
        out[f"{label}ratio"] = round(median("installed", what) / median("stock", what), 4)
    out["stock_rounds_us"] = [round(r["wall"] * 1e6, 1) for r in rounds["stock"]]
    out["installed_rounds_us"] = [round(r["wall"] * 1e6, 1) for r in rounds["installed"]]
    return out


EXECUTE_TASKS = 1000
EXECUTE_ROUNDS = 20  # per configuration


def _memory_huey(installed: bool) -> tuple[Any, Any]:
    """A MemoryHuey with a CPU task, its thread consumer made (so install() hooks it) but
    never started; the task wrapper."""
    from huey import MemoryHuey

    from timeoutcore.contrib.huey import install

    huey = MemoryHuey(f"bench-huey-{uuid.uuid4().hex}")
    if installed:
        install(huey, patch=True)

    @huey.task()
    def cpu(n: int) -> None:
        sum(range(n))

    huey.create_consumer(workers=1, worker_type="thread")
    return huey, cpu


def execute_cost(ms: int) -> dict[str, Any]:
    configs = {"stock": _memory_huey(False), "installed": _memory_huey(True)}
    per_task: dict[str, list[float]] = {"stock": [], "installed": []}

    n = iterations_for(ms)

    def one_round(name: str) -> float:
        huey, cpu = configs[name]
        tasks = [cpu.s(n) for _ in range(EXECUTE_TASKS)]
        t0 = time.thread_time()
        for task in tasks:
            huey.execute(task)
        return (time.thread_time() - t0) / EXECUTE_TASKS

    for name in configs:  # warm-up
        one_round(name)
    for _ in range(EXECUTE_ROUNDS // 2):
        for name in ("stock", "installed", "installed", "stock"):
            per_task[name].append(one_round(name))
    stock_us = statistics.median(per_task["stock"]) * 1e6
    installed_us = statistics.median(per_task["installed"]) * 1e6
    return {
        "task_cpu_ms": ms, "tasks_per_round": EXECUTE_TASKS, "rounds": EXECUTE_ROUNDS,
        "stock_us_per_task": round(stock_us, 2),
        "installed_us_per_task": round(installed_us, 2),
        "added_us_per_task": round(installed_us - stock_us, 2),
        "ratio": round(installed_us / stock_us, 4),
        "ratio_of_fastest_rounds": round(min(per_task["installed"]) / min(per_task["stock"]), 4),
    }


def rejected_alternatives(url: str) -> dict[str, Any]:
    """The per-task cost of publishing every task in the Redis deadline registry (what
    contrib.celery does), and of one revoke-flag check of the watcher."""
    from huey import RedisHuey
    from huey.api import Task

    from timeoutcore import thread_deadline
    from timeoutcore.contrib.redis import DeadlineRegistry

    n = 500
    registry = DeadlineRegistry.from_url(url, prefix=f"bench-huey-{uuid.uuid4().hex}")
    huey = RedisHuey(f"bench-huey-{uuid.uuid4().hex}", url=url)
    try:
        def per_block(fn: Any) -> float:
            samples = []
            for _ in range(5):
                t0 = time.perf_counter()
                for i in range(n):
                    fn(i)
                samples.append((time.perf_counter() - t0) / n)
            return statistics.median(samples) * 1e6

        def plain(i: int) -> None:
            with thread_deadline(30):
                pass

        def registered(i: int) -> None:
            with registry.deadline(f"job-{i}", 30):
                pass

        task = Task(id=str(uuid.uuid4()))

        def check(i: int) -> None:
            huey.is_revoked(task, peek=False)

        plain_us, registered_us, check_us = per_block(plain), per_block(registered), \
            per_block(check)
    finally:
        registry.close()
        registry.client.connection_pool.disconnect()
        huey.storage.conn.connection_pool.disconnect()
    return {
        "scope_us": round(plain_us, 2),
        "registry_scope_us": round(registered_us, 2),
        "registry_added_us_per_task": round(registered_us - plain_us, 2),
        "revoke_check_us": round(check_us, 2),
        "note": "registry_added_us_per_task: what publishing each task in the Redis registry "
                "would add to every task (two Redis round trips); revoke_check_us: one "
                "huey.is_revoked() of the watcher, made once per revoke_interval per "
                "running task",
    }


def main() -> dict[str, Any]:
    sys.path.insert(0, str(TESTS))  # huey_app, huey_harness, redis_server (before benchmarks/)
    sys.path.insert(1, str(HERE))
    from huey_harness import Consumer

    import harness
    import timeoutcore

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-huey-") as tmp:
        folder = Path(tmp)
        with _redis(folder) as url:
            print("limit -> failed ...", flush=True)
            with Consumer(url, folder, signals="stamps") as threads, \
                    Consumer(url, folder, kind="process", install=False, patch=False,
                             signals="stamps", caller_install=False) as processes:
                out["limit_to_failed"] = {
                    "limit_s": LIMIT,
                    "thread_installed_sleep": limit_to_failed(threads, cpu=False),
                    "thread_installed_cpu": limit_to_failed(threads, cpu=True),
                    "process_stock_sleep": limit_to_failed(processes, cpu=False),
                    "process_stock_cpu": limit_to_failed(processes, cpu=True),
                    "what": "ms from SIGNAL_EXECUTING + limit to SIGNAL_TIMEOUT",
                }
                print("revoke ...", flush=True)
                out["revoke_running"] = dict(
                    revoke_interval_s=0.05, **revoke_running(threads, folder),
                    what="ms from Result.revoke() to SIGNAL_REVOKED (the task stopped); "
                         "stock huey: never (the task runs to its end)")
            with Consumer(url, folder, install=False, patch=False, signals="stamps",
                          caller_install=False) as stock:
                out["stock_thread_workers"] = stock_thread_runs_on(stock)
            print("overhead ...", flush=True)
            with Consumer(url, folder, install=False, patch=False, signals="off",
                          caller_install=False) as stock, \
                    Consumer(url, folder, signals="off") as installed:
                out["overhead_1ms_tasks"] = overhead(stock, installed, 1, TASKS_PER_ROUND)
                out["overhead_0ms_tasks"] = overhead(stock, installed, 0, 4 * TASKS_PER_ROUND)
            out["rejected_alternatives"] = rejected_alternatives(url)
    print("execute cost ...", flush=True)
    for ms in (1, 0):
        out[f"execute_{ms}ms_tasks"] = execute_cost(ms)
    env = harness.environment()
    env.update(command=COMMAND, huey=_version("huey"), redis_py=_version("redis"),
               engine=timeoutcore.ENGINE, python=platform.python_version())
    out["environment"] = env
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    return out


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


if __name__ == "__main__":
    print(json.dumps(main(), indent=2, sort_keys=True))
    print(f"written: {RESULTS.relative_to(HERE.parent)}", file=sys.stderr)
