"""A busy pool: how late a deadline lands when other threads run CPU-bound Python, and
what the fast window (csrc/accel_fast_window.c) costs the pool.

- ``test_contention_overshoot``: a 50 ms deadline on a CPU loop in a pool worker while 1,
  3 or 7 other threads spin in Python, for timeoutcore, the ``threading.Timer`` +
  ``PyThreadState_SetAsyncExc`` recipe and the installed peers, in one session (the
  harness's contention cases; ``python -m timeoutcore bench --full`` shows the same rows).
  ``extra_info``: p50/p90/p99/max ms, and the core's counters for timeoutcore.
- ``test_contention_floor``: the physical limit of the case above -- for random instants,
  how long until a pool thread spinning next to 1, 3 or 7 others runs bytecode again (with a
  GIL at the fast window's 200 us switch interval). No deadline can land sooner.
- ``test_cpu_pool_under_deadlines``: loop turns per second of 4 CPU-bound workers without
  deadlines, with every task under one (every 4th firing half-way), and doing that same
  work without deadlines (every 4th task stops itself half-way), in one pool, 40 tasks of
  each in turn. ``extra_info['x_no_deadline']`` is the ratio of the rates against whole
  tasks, ``x_same_work`` against the same work: the deadlines' own cost, apart from what
  shorter tasks cost a pool that shares one GIL (with its quartiles over the rounds).
"""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

import harness as bench

from timeoutcore import ENGINE

LIMIT = 0.05
PLAN = replace(bench.FULL, limits=(LIMIT,), trials=100, slow_trials=3)
CASES = [bench.Case(m, bench.CPU, "worker", LIMIT, hogs=h)
         for h in bench.HOGS_LEVELS for m in bench.METHODS if not m.main_thread_only]

pytestmark = pytest.mark.benchmark(group="contention")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_contention_overshoot(benchmark: BenchmarkFixture, case: bench.Case) -> None:
    missing = case.method.missing()
    if missing is not None:
        pytest.skip(missing)
    info = benchmark.extra_info
    info.update(case=case.title, python=sys.version.split()[0], hogs=case.hogs)
    before = after = {}
    if case.method is bench.TIMEOUTCORE and ENGINE == "native":
        from timeoutcore import _native

        before = _native.stats()
    row = benchmark.pedantic(  # type: ignore[no-untyped-call]
        bench.run_case, args=(case, PLAN), rounds=1, iterations=1
    )
    info.update(trials=row["trials"], stopped=row["stopped"],
                **{k: row[k] for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms")})
    if before:
        from timeoutcore import _native

        after = _native.stats()
        info["gil_takes"] = after["gil_takes"] - before["gil_takes"]
    info["not_interrupted"] = row["not_interrupted"]
    if case.method is bench.TIMEOUTCORE:
        # Every deadline stopped its loop. (A trial whose worker was starved past the loop's
        # own end before it even armed "returns": an artefact of 7 spinners on 2 cores.)
        assert row["not_interrupted"] == 0, row


def test_cpu_pool_under_deadlines(benchmark: BenchmarkFixture) -> None:
    plan = replace(bench.FULL, throughput_reps=5)
    res = benchmark.pedantic(  # type: ignore[no-untyped-call]
        bench.run_cpu_pool, args=(plan,), rounds=1, iterations=1
    )
    benchmark.extra_info.update(
        case=f"CPU pool, {res['workers']} workers, every {res['fire_every']}th deadline fires",
        note=f"{res['x_no_deadline']:.3f}x the turns/s without deadlines, "
        f"{res['x_same_work']:.3f}x doing the same work without them",
        **res,
    )


@pytest.mark.parametrize("hogs", bench.HOGS_LEVELS, ids=[f"{h}-spinning" for h in bench.HOGS_LEVELS])
def test_contention_floor(benchmark: BenchmarkFixture, hogs: int) -> None:
    row = benchmark.pedantic(  # type: ignore[no-untyped-call]
        bench.run_floor, args=(hogs,), rounds=1, iterations=1
    )
    benchmark.extra_info.update(case=f"floor: next run of a pool thread, {hogs} spinning",
                                python=sys.version.split()[0], trials=row["samples"], **row)
    assert row["off_cpu_spans"] > 0  # it shared 2 cores with spinning threads
