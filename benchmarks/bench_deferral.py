"""What does safe delivery cost, and how late does it make a deadline?

- ``test_deferral_overshoot``: how late a 50 ms deadline stops a pool worker whose loop logs
  on every turn through a real ``StreamHandler`` (most of its time inside ``logging``,
  protected code) or does queue traffic with a partner thread, side by side with the plain
  CPU loop, in one run (the harness's ``cpu`` section; ``python -m timeoutcore bench --full``
  shows the same rows). ``extra_info``: p50/p90/p99 ms, and ``vs_plain_p50_ms``, the
  difference from the plain loop's p50 measured in the same session.
- ``test_frame_check_cost``: the price of the check the delivery hook makes at every line
  while an interrupt waits for protected code: the same protected loop timed with nothing
  pending and with a fired deadline deferred for its whole run; ``extra_info`` has both
  rates, the slowdown, and the cost per line in ns.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

import harness as bench

import timeoutcore
from timeoutcore import ENGINE, DeadlineExceeded

pytestmark = [
    pytest.mark.benchmark(group="deferral"),
    pytest.mark.skipif(ENGINE != "native", reason="safe delivery is the native engine's"),
]

LIMIT = 0.05
PLAN = replace(bench.FULL, limits=(LIMIT,), trials=60, slow_trials=3)
_rows: dict[str, dict[str, Any]] = {}


@pytest.mark.parametrize("workload", [bench.CPU, bench.CPU_LOGGING, bench.QUEUE_TRAFFIC],
                         ids=lambda w: w.key)
def test_deferral_overshoot(benchmark: BenchmarkFixture, workload: bench.Workload) -> None:
    case = bench.Case(bench.TIMEOUTCORE, workload, "worker", LIMIT)
    row = benchmark.pedantic(  # type: ignore[no-untyped-call]
        bench.run_case, args=(case, PLAN), rounds=1, iterations=1
    )
    _rows[workload.key] = row
    info = benchmark.extra_info
    info.update(case=case.title, trials=row["trials"], stopped=row["stopped"],
                **{k: row[k] for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms")})
    plain = _rows.get("cpu")
    if plain is not None:
        info["vs_plain_p50_ms"] = round(row["p50_ms"] - plain["p50_ms"], 4)
    assert row["stopped"] == row["trials"], row  # every trial stopped, none hung or ran out


LINES = 200_000  # lines the protected loop runs (each iteration: 2 lines)


@timeoutcore.protected
def _protected_loop(n: int, scope: Any = None) -> float:
    """Seconds for ``n`` turns of a two-line loop; with ``scope``, first wait (protected, so
    nothing surfaces) until its deadline has fired: every line below then runs the check."""
    if scope is not None:
        while not scope.expired():
            pass
    clock = time.perf_counter
    t0 = clock()
    total = 0
    for i in range(n):
        total += i
    return clock() - t0


def _timed(pending: bool) -> float:
    if not pending:
        with timeoutcore.thread_deadline(10.0):
            return _protected_loop(LINES // 2)
    scope = timeoutcore.thread_deadline(0.002)
    dt = 0.0
    with pytest.raises(DeadlineExceeded):
        with scope:
            dt = _protected_loop(LINES // 2, scope)
            for _ in range(10**9):  # the interrupt surfaces here, after the protected call
                pass
    return dt


def test_frame_check_cost(benchmark: BenchmarkFixture) -> None:
    def measure() -> tuple[float, float]:
        base = min(_timed(False) for _ in range(5))
        deferred = min(_timed(True) for _ in range(5))
        return base, deferred

    base, deferred = benchmark.pedantic(measure, rounds=1, iterations=1)  # type: ignore[no-untyped-call]
    per_line = round((deferred - base) / LINES * 1e9, 1)
    benchmark.extra_info.update(
        case="delivery hook's check while deferred, per line",
        note=f"{per_line} ns a line ({deferred / base:.1f}x a plain line)",
        lines=LINES,
        plain_lines_per_s=round(LINES / base),
        deferred_lines_per_s=round(LINES / deferred),
        slowdown=round(deferred / base, 2),
        check_ns_per_line=per_line,
    )
