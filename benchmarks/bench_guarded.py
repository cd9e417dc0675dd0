"""How late is a deadline that passes during a C call, or in code full of finalizers?

- ``test_c_call_overshoot``: a pool worker runs a C call that holds the GIL past its 20 ms
  deadline (``sum(range(n))``, ``json.loads`` of a large document, a backtracking regex),
  then a Python loop that stamps the time at each turn; 0 or 3 busy threads beside it.
  p50/p99 ms: how long that loop ran before the interrupt surfaced (0 when it surfaced at
  the first line after the call) -- the lateness beyond the call's own remaining time.
  ``at_exit`` counts blocks that reached their exit without the interrupt (the exit still
  raised): the goal is 0.
- ``test_finalizer_overshoot``: a loop that drops objects with a ``__del__`` or a weakref
  callback under a 50 ms deadline; p50/p99 ms late, and ``dropped``: the interrupts CPython
  swallowed in a callback (the core learns the callback and sends them again; the first
  landing in each callback is the only one expected).

Run: ``python -m pytest benchmarks/bench_guarded.py --benchmark-only``.
"""

from __future__ import annotations

import json
import re
import sys
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

import harness as bench

from timeoutcore import ENGINE, DeadlineExceeded, thread_deadline

pytestmark = [
    pytest.mark.benchmark(group="overshoot"),
    pytest.mark.skipif(ENGINE != "native", reason="the native engine's delivery"),
]

LIMIT = 0.02
TRIALS = 40
_DOC = json.dumps([{"id": i, "name": "x" * 20, "tags": list(range(10))} for i in range(40_000)])
_EVIL = re.compile(r"(a+)+$")
_EVIL_INPUT = "a" * 21 + "b"

CALLS: dict[str, Callable[[], Any]] = {
    "sum": lambda: sum(range(3_000_000)),
    "json": lambda: json.loads(_DOC),
    "regex": lambda: _EVIL.match(_EVIL_INPUT),
}


def _trial(call: Callable[[], Any]) -> tuple[float, bool]:
    """(ms the code after the call ran before the interrupt surfaced, reached the exit)."""
    stamps = [0.0, 0.0]  # the first and the last turn of the loop after the call
    clock = time.perf_counter
    scope = thread_deadline(LIMIT)
    try:
        with scope:
            call()
            stamps[0] = clock()
            for _ in bench._forever():
                stamps[1] = clock()
                if stamps[1] - stamps[0] > 0.2:
                    break
    except DeadlineExceeded:
        pass
    at_exit = scope.expired_at is not None and scope.expired_at == scope.exited_at
    ran = stamps[1] - stamps[0] if stamps[0] else 0.0
    return max(0.0, ran) * 1e3, at_exit


@pytest.mark.parametrize("spinners", [0, 3])
@pytest.mark.parametrize("call", sorted(CALLS))
def test_c_call_overshoot(benchmark: BenchmarkFixture, call: str, spinners: int) -> None:
    def run() -> tuple[list[float], int]:
        with bench.cpu_hogs(spinners) if spinners else _nothing(), ThreadPoolExecutor(1) as pool:
            out = [pool.submit(_trial, CALLS[call]).result() for _ in range(TRIALS)]
        return [o[0] for o in out], sum(o[1] for o in out)

    late, at_exit = benchmark.pedantic(run, rounds=1, iterations=1)  # type: ignore[no-untyped-call]
    benchmark.extra_info.update(case=f"{call}, {spinners} busy", trials=TRIALS, at_exit=at_exit,
                                **bench.percentiles(late))


class _Finalized:
    def __del__(self) -> None:
        for _ in range(300):
            pass


class _Referent:
    pass


def _callback(ref: Any) -> None:
    for _ in range(300):
        pass


def _drop(kind: str, stop: float) -> None:
    refs: set[Any] = set()
    while time.monotonic() < stop:
        if kind == "del":
            _Finalized()
        else:
            obj = _Referent()
            ref = weakref.ref(obj, _callback)
            refs.add(ref)
            del obj
            refs.discard(ref)


@pytest.mark.parametrize("kind", ["del", "weakref"])
def test_finalizer_overshoot(benchmark: BenchmarkFixture, kind: str) -> None:
    def run() -> list[float]:
        late = []
        for _ in range(TRIALS // 2):
            t0 = time.monotonic()
            try:
                with thread_deadline(0.05):
                    _drop(kind, t0 + 2.0)
            except DeadlineExceeded:
                pass
            late.append((time.monotonic() - t0 - 0.05) * 1e3)
        return late

    before = bench.core_stats()
    late = benchmark.pedantic(run, rounds=1, iterations=1)  # type: ignore[no-untyped-call]
    after = bench.core_stats()
    # dropped: interrupts CPython swallowed in a callback (each sent again at once)
    benchmark.extra_info.update(case=f"dropping objects with {kind}", trials=len(late),
                                dropped=after["dropped"] - before["dropped"],
                                **bench.percentiles(late))


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "--benchmark-only", *sys.argv[1:]]))
