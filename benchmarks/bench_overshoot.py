"""How late does a 50 ms deadline stop the block, by method, thread and workload?

The measured code is ``benchmarks/harness.py`` (what ``python -m timeoutcore bench --full`` runs; its
docstring defines the methods, workloads and the yardstick). Overshoot = the moment the caller
gets control back (the timeout exception caught) minus (the moment of arming + 50 ms), the
same yardstick for every method. Every workload ends by itself 0.25 s after the method should
have fired, so nothing hangs: a block left only then was *not interrupted*.

Each case runs inside one ``benchmark.pedantic(rounds=1)``; the figures that matter are the
percentiles in ``extra_info``. Cases whose trials last long (not interrupted, or alarm's whole
second) run a few trials only. Optional peers are skipped when not installed.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

import harness as bench

from timeoutcore import ENGINE

LIMIT = 0.05  # seconds: the deadline under test
PLAN = replace(bench.FULL, limits=(LIMIT,), trials=60, slow_trials=3)

pytestmark = pytest.mark.benchmark(group="overshoot")

CASES = bench.overshoot_cases(PLAN)

# (method, workload) pairs that must stop every trial: a regression there fails the run.
MUST_STOP = {
    ("timeoutcore", "cpu"),
    ("timeoutcore", "c_call"),
    ("timeoutcore", "sleep"),
    ("signal.setitimer", "cpu"),
}


def _core_counters() -> dict[str, int]:
    if ENGINE != "native":
        return {}
    from timeoutcore import _native

    return _native.stats()


def _note(row: dict[str, Any]) -> str:
    notes = [row["note"]] if row.get("note") else []
    if row["not_interrupted"]:
        notes.append(f"{row['not_interrupted']} of {row['trials']} not interrupted: left "
                     "when the work ended by itself")
    if row["abandoned"]:
        notes.append(f"caller released; the call ran on in an abandoned thread "
                     f"(p50 {row['work_ran_on_p50_ms']:.0f} ms past the deadline)")
    return "; ".join(notes)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_overshoot(benchmark: BenchmarkFixture, case: bench.Case) -> None:
    if case.thread == "main" and threading.current_thread() is not threading.main_thread():
        pytest.skip("main-thread case, but pytest runs this test elsewhere")
    missing = case.method.missing()
    if missing is not None:
        pytest.skip(missing)
    info = benchmark.extra_info
    info.update(case=case.title, recipe=case.method.title, thread=case.thread, limit_s=LIMIT)
    if case.method is bench.TIMEOUTCORE:
        info["engine"] = ENGINE
    before = _core_counters()
    row = benchmark.pedantic(  # type: ignore[no-untyped-call]
        bench.run_case, args=(case, PLAN), rounds=1, iterations=1
    )
    if "error" in row:
        info.update(note=f"n/a: raises {row['error']}", error=row["error"])
        return
    after = _core_counters()
    if case.method is bench.TIMEOUTCORE and before:
        keys = ("fires", "kicks", "reinjections", "gil_takes", "requeues")
        info["core_counters"] = {k: after[k] - before[k] for k in keys}
    info["trials"] = row["trials"]
    info["not_interrupted"] = row["not_interrupted"]
    for key in ("p50_ms", "p90_ms", "p99_ms", "max_ms"):
        info[key] = row[key]
    note = _note(row)
    if note:
        info["note"] = note
    figures = ", ".join(f"{k}={info.get(k)}" for k in ("p50_ms", "p90_ms", "p99_ms"))
    print(f"\n{case.title}: {figures}")
    if (case.method.key, case.workload.key) in MUST_STOP and not case.hogs and ENGINE == "native":
        assert row["stopped"] == row["trials"], f"{row['trials'] - row['stopped']} not stopped"
