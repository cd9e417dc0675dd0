"""What do the optional features cost a block that does NOT time out, and what does the
deadline-aware pool cost against a plain ThreadPoolExecutor?

Same conventions as bench_overhead.py (group "overhead", ``per_op_ns`` per block; the no-op
``with`` row of that file is the baseline when both run in one session). The pool
comparison reports tasks per second for 1 ms tasks and the ratio to the plain pool measured
in the same run.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor, wait

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from conftest import record_per_op as _record

from timeoutcore import DeadlineExecutor, metrics, thread_deadline

OPS = 1000
ROUNDS = 30
LIMIT = 10.0

pytestmark = pytest.mark.benchmark(group="overhead")


def _plain(n: int) -> None:
    for _ in range(n):
        with thread_deadline(LIMIT):
            pass


def _soft(n: int) -> None:
    for _ in range(n):
        with thread_deadline(LIMIT, soft=5.0):
            pass


def _with_result(n: int) -> None:
    for _ in range(n):
        with thread_deadline(LIMIT) as scope:
            pass
        scope.result  # noqa: B018 - building it is what is measured


def test_block_plain(benchmark: BenchmarkFixture) -> None:
    benchmark.pedantic(_plain, args=(OPS,), rounds=ROUNDS, warmup_rounds=2)  # type: ignore[no-untyped-call]
    _record(benchmark, "`with thread_deadline(10)` (reference for the rows below)", OPS)


def test_block_with_soft_limit(benchmark: BenchmarkFixture) -> None:
    benchmark.pedantic(_soft, args=(OPS,), rounds=ROUNDS, warmup_rounds=2)  # type: ignore[no-untyped-call]
    _record(benchmark, "`with thread_deadline(10, soft=5)`", OPS)


def test_block_with_result_requested(benchmark: BenchmarkFixture) -> None:
    benchmark.pedantic(_with_result, args=(OPS,), rounds=ROUNDS, warmup_rounds=2)  # type: ignore[no-untyped-call]
    _record(benchmark, "`with thread_deadline(10)` + scope.result (pydantic)", OPS)


def test_block_with_metrics_on(benchmark: BenchmarkFixture) -> None:
    metrics.enable()
    try:
        benchmark.pedantic(_plain, args=(OPS,), rounds=ROUNDS, warmup_rounds=2)  # type: ignore[no-untyped-call]
    finally:
        metrics.disable()
        metrics.collector.reset()
    _record(benchmark, "`with thread_deadline(10)`, metrics collector on", OPS)


def _one_ms() -> None:
    time.sleep(0.001)


TASKS = 400
WORKERS = 4


def _throughput(make_pool: object) -> float:
    with make_pool() as pool:  # type: ignore[operator]
        t0 = time.perf_counter()
        wait([pool.submit(_one_ms) for _ in range(TASKS)])
        return TASKS / (time.perf_counter() - t0)


@pytest.mark.benchmark(group="throughput")
def test_pool_throughput_vs_threadpoolexecutor(benchmark: BenchmarkFixture) -> None:
    plain: list[float] = []
    guarded: list[float] = []

    def both() -> None:  # interleaved, so drift hits both alike
        plain.append(_throughput(lambda: ThreadPoolExecutor(WORKERS)))
        guarded.append(_throughput(lambda: DeadlineExecutor(WORKERS, policy=LIMIT)))

    benchmark.pedantic(both, rounds=7, warmup_rounds=1)  # type: ignore[no-untyped-call]
    p, g = sorted(plain)[len(plain) // 2], sorted(guarded)[len(guarded) // 2]
    benchmark.extra_info.update(
        case=f"{TASKS} x 1 ms tasks on {WORKERS} workers: tasks/s",
        threadpool_tasks_per_s=round(p, 1),
        deadline_executor_tasks_per_s=round(g, 1),
        slowdown_percent=round((p - g) / p * 100, 2),
        note=(f"ThreadPoolExecutor {p:.0f}/s, DeadlineExecutor {g:.0f}/s "
              f"({(p - g) / p * 100:.1f} % slower)"),
    )
