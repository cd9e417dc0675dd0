"""What does a block that does NOT time out cost?

The measured code is ``benchmarks/harness.py`` (what ``python -m timeoutcore bench --full`` runs):
each case's ``empty_blocks(n)`` runs ``n`` blocks with an empty body under a limit that never
fires. All cases run in one session so their ratios mean something; ``per_op_ns`` in
``extra_info`` is the median round divided by the blocks per round (loop overhead included,
identical in every case). The no-op Python context manager is the baseline the table divides
by. The classic recipes are written inline with ``try/finally`` -- their cheapest form.
Optional peers (stopit, func_timeout) are skipped when not installed.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

import harness as bench
from conftest import record_per_op as _record

from timeoutcore import ENGINE, thread_deadline

ROUNDS = 100
THREAD_ROUNDS = 20  # methods that start a thread per block (~0.1-1 ms each)

pytestmark = pytest.mark.benchmark(group="overhead")

CASES = bench.overhead_cases()




@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_overhead(
    benchmark: BenchmarkFixture, case: tuple[str, str, bench.Method, Callable[[int], None]]
) -> None:
    key, title, method, blocks = case
    missing = method.missing()
    if missing is not None:
        pytest.skip(missing)
    if method.main_thread_only and threading.current_thread() is not threading.main_thread():
        pytest.skip("signal-based recipes need the main thread")
    if ENGINE == "native":
        with thread_deadline(None):  # gives this thread its slot and kernel timer
            pass
    ops = method.ops
    rounds = ROUNDS if ops == bench.CHEAP_OPS else THREAD_ROUNDS
    before = _watchdog_wakeups() if key == "timeoutcore" else None
    # setup=cleanup: untimed, lets the threads of the previous round exit first.
    benchmark.pedantic(  # type: ignore[no-untyped-call]
        blocks, args=(ops,), setup=method.cleanup, rounds=rounds, warmup_rounds=3
    )
    method.cleanup()
    _record(benchmark, f"{title} [{ENGINE}]" if method is bench.TIMEOUTCORE else title, ops,
            baseline=key == "none")
    if before is not None:
        wakeups = _watchdog_wakeups() - before
        blocks_run = (rounds + 3) * ops
        benchmark.extra_info["watchdog_wakeups_per_block"] = round(wakeups / blocks_run, 4)


def _watchdog_wakeups() -> int:
    if ENGINE != "native":
        return 0
    from timeoutcore import _native

    return _native.stats()["watchdog_wakeups"]


# --- blocks entered in parallel -------------------------------------------------------------
# On a free-threaded CPython the threads below really run at once; a plain entry and exit
# share no lock between threads (csrc/tc_lock.h). Each round is harness.parallel_round; the
# baseline is the same threads running a no-op context manager. per_op_ns is wall time per
# block over all threads (so with 2 cores, perfect scaling halves it from 1 to 2 threads).


@pytest.mark.parametrize("threads", [1, 2, 4, 8])
@pytest.mark.parametrize("kind", ["noop", "timeoutcore"])
def test_parallel_blocks(benchmark: BenchmarkFixture, kind: str, threads: int) -> None:
    make: Callable[[], Any] = bench.NoOp if kind == "noop" else bench.never_firing_scope
    benchmark.pedantic(bench.parallel_round, args=(threads, make),  # type: ignore[no-untyped-call]
                       rounds=5, warmup_rounds=1)
    _record(benchmark, f"{kind}, {threads} thread(s) in parallel", threads * bench.PARALLEL_BLOCKS,
            baseline=kind == "noop" and threads == 1)
