"""The integrations: what install(app) costs a Celery threads-pool worker per task, and how
long a job takes to stop after a coordinator's ``DeadlineRegistry.cancel()`` (sent from
another process; the job alone, or next to spinning threads).

Both need a Redis (``redis_url`` fixture: TIMEOUTCORE_TEST_REDIS_URL or a redis-server
started for the session).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import record_per_op
from pytest_benchmark.fixture import BenchmarkFixture

import harness as bench

import timeoutcore

celery = pytest.importorskip("celery")
pytest.importorskip("redis")

from celery import Celery  # noqa: E402

from timeoutcore.contrib.redis import DeadlineRegistry  # noqa: E402

TESTS = Path(__file__).resolve().parent.parent / "tests"

TASKS = 200
WORKERS = 4
CANCEL_TRIALS = 60


def _batch(app: Celery) -> float:
    """Seconds per task for TASKS tasks sent at once and all results collected."""
    task = app.tasks["t.one_ms"]
    t0 = time.perf_counter()
    results = [task.delay() for _ in range(TASKS)]
    for r in results:
        r.get(timeout=60)
    return (time.perf_counter() - t0) / TASKS


@pytest.fixture(scope="module")
def workers(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Celery, Celery]]:
    """Two real worker processes (tests/celery_harness.py), threads pool, WORKERS threads:
    one without install(app), one with it."""
    sys.path.insert(0, str(TESTS))
    try:
        from celery_harness import Worker
    finally:
        sys.path.remove(str(TESTS))
    folder = tmp_path_factory.mktemp("celery-bench")
    with Worker(redis_url, "threads", folder, install=False, concurrency=WORKERS) as plain, \
            Worker(redis_url, "threads", folder, install=True, concurrency=WORKERS) as guarded:
        yield plain.app, guarded.app


@pytest.mark.benchmark(group="celery")
def test_celery_threads_pool_cost_per_task(benchmark: BenchmarkFixture,
                                           workers: tuple[Celery, Celery]) -> None:
    plain_app, guarded_app = workers
    plain: list[float] = []
    guarded: list[float] = []

    def both() -> None:  # interleaved, so drift hits both alike
        plain.append(_batch(plain_app))
        guarded.append(_batch(guarded_app))

    benchmark.pedantic(both, rounds=7, warmup_rounds=1)  # type: ignore[no-untyped-call]
    p, g = statistics.median(plain), statistics.median(guarded)
    benchmark.extra_info.update(
        case=f"Celery threads pool, {TASKS} x 1 ms tasks, {WORKERS} threads",
        plain_us_per_task=round(p * 1e6, 1),
        installed_us_per_task=round(g * 1e6, 1),
        cost_us_per_task=round((g - p) * 1e6, 1),
        ratio=round(g / p, 3),
        note=(f"per task: without install {p * 1e6:.0f} us, with install(app) "
              f"{g * 1e6:.0f} us ({g / p:.3f}x)"),
    )


GUARD_OPS = 2000


def _guard_paths() -> tuple[Any, Any]:
    """The task body as Celery's tracer calls it: plainly, and through install()'s guard
    with the limits the pool hands over (hard 10 s, soft 5 s)."""
    from timeoutcore.contrib import celery as tc_celery

    app = Celery(f"bench-{uuid.uuid4().hex[:8]}", set_as_current=False)

    @app.task(name="b.noop")
    def noop() -> None:
        return None

    plain_run = noop.run
    tc_celery._guard_task(noop)
    guarded_run = noop.run
    limits = tc_celery._Limits(10.0, 5.0, lambda soft, seconds: None)

    def plain(n: int) -> None:
        for _ in range(n):
            plain_run()

    def guarded(n: int) -> None:
        for _ in range(n):
            tc_celery._with_limits(guarded_run, limits)

    return plain, guarded


@pytest.mark.benchmark(group="overhead")
@pytest.mark.parametrize("variant", ["plain", "guarded"])
def test_celery_guard_cost_in_the_pool_thread(benchmark: BenchmarkFixture, variant: str) -> None:
    plain, guarded = _guard_paths()
    fn = plain if variant == "plain" else guarded
    benchmark.pedantic(fn, args=(GUARD_OPS,), rounds=20, warmup_rounds=2)  # type: ignore[no-untyped-call]
    what = "plain" if variant == "plain" else "through install()'s guard, soft+hard limits"
    record_per_op(benchmark, f"Celery task body (no-op), {what}", GUARD_OPS)


def _percentiles(seconds: list[float]) -> dict[str, float]:
    ms = sorted(s * 1e3 for s in seconds)
    q = statistics.quantiles(ms, n=100, method="inclusive")
    return {"p50_ms": round(q[49], 3), "p90_ms": round(q[89], 3), "p99_ms": round(q[98], 3),
            "max_ms": round(ms[-1], 3)}


# The coordinator runs in a process of its own, as it would in production: in this process
# its own command would first wait for the GIL behind the spinning job (a whole switch
# interval), which is the coordinator's cost, not the time the job takes to stop. It prints
# the moment it sent each cancel (time.perf_counter: CLOCK_MONOTONIC, the same clock here).
_COORDINATOR = r"""
import sys, time
from timeoutcore.contrib.redis import DeadlineRegistry
coordinator = DeadlineRegistry.from_url(sys.argv[1], prefix=sys.argv[2])
for line in sys.stdin:
    sent = time.perf_counter()
    coordinator.cancel(line.strip())
    print(repr(sent), flush=True)
"""


def _cancel_trial(worker_side: DeadlineRegistry, coordinator: subprocess.Popen[str], kind: str,
                  job: str) -> tuple[float, float]:
    """(seconds from the cancel's send to the job's body stopping, ... to its block having
    exited). The block's exit deletes the job's key in Redis: a round trip of its own."""
    box: dict[str, float] = {}
    entered = threading.Event()

    def run() -> None:
        scope = worker_side.deadline(job, 30)
        try:
            with scope:
                entered.set()
                try:
                    if kind == "sleep":
                        timeoutcore.sleep(30)
                    else:
                        for _ in range(10**15):
                            pass
                except BaseException:
                    box["stopped"] = time.perf_counter()  # the interrupt surfaced in the body
                    raise
        except timeoutcore.DeadlineExceeded:
            box["exited"] = time.perf_counter()

    thread = threading.Thread(target=run)
    thread.start()
    entered.wait(10)
    time.sleep(0.005)
    assert coordinator.stdin is not None and coordinator.stdout is not None
    coordinator.stdin.write(job + "\n")
    coordinator.stdin.flush()
    thread.join(10)
    sent = float(coordinator.stdout.readline())
    return box["stopped"] - sent, box["exited"] - sent


CANCEL_CASES = [("sleep", 0), ("cpu loop", 0), ("cpu loop", 3)]


@pytest.mark.benchmark(group="cancel")
@pytest.mark.parametrize("kind,hogs", CANCEL_CASES,
                         ids=[f"{k.replace(' ', '-')}-{h}hogs" for k, h in CANCEL_CASES])
def test_cancel_to_stop_latency(benchmark: BenchmarkFixture, redis_url: str, kind: str,
                                hogs: int) -> None:
    """From a coordinator's cancel() (another process) to the job's DeadlineCancelled: the
    job sleeps or spins in Python, alone or next to ``hogs`` other spinning threads."""
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    worker_side = DeadlineRegistry.from_url(redis_url, prefix=prefix)
    coordinator = subprocess.Popen([sys.executable, "-c", _COORDINATOR, redis_url, prefix],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    samples: list[float] = []
    exits: list[float] = []
    before = bench.core_stats()

    def trials() -> None:
        with bench.cpu_hogs(hogs):
            for i in range(CANCEL_TRIALS):
                stopped, exited = _cancel_trial(worker_side, coordinator, kind, f"job-{i}")
                samples.append(stopped)
                exits.append(exited)

    try:
        benchmark.pedantic(trials, rounds=1, warmup_rounds=0)  # type: ignore[no-untyped-call]
    finally:
        worker_side.close()
        assert coordinator.stdin is not None
        coordinator.stdin.close()
        coordinator.wait(30)
    after = bench.core_stats()
    exited = {f"exited_{k}": v for k, v in _percentiles(exits).items()}
    read = after.get("remote_cancels", 0) - before.get("remote_cancels", 0)
    benchmark.extra_info.update(
        case=f"cancel() -> job stopped ({kind}, {hogs} spinning)", python=sys.version.split()[0],
        trials=len(samples), remote_cancels=read, **_percentiles(samples), **exited,
        note=(f"block exited (key deleted) p50 / p90 / p99 {exited['exited_p50_ms']:.3f} / "
              f"{exited['exited_p90_ms']:.3f} / {exited['exited_p99_ms']:.3f} ms; "
              f"{read} of {len(samples)} cancels read off the socket without the GIL"))
