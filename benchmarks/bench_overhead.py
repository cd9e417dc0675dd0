"""What does a block that does NOT time out cost?

All cases run in one session so their ratios mean something. Each round runs a loop of
``OPS`` blocks with an empty body; ``per_op_ns`` in ``extra_info`` is the median round divided
by the blocks per round (loop overhead included, identical in every case). The no-op Python
context manager is the baseline the table divides by.

The classic recipes are written inline with ``try/finally`` -- their cheapest form; wrapping
them in a context manager class would add about the baseline on top.
"""

from __future__ import annotations

import ctypes
import math
import signal
import threading
from types import FrameType, TracebackType
from typing import Callable, Optional

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from timeoutcore import ENGINE, thread_deadline

OPS = 1000  # blocks per round
ROUNDS = 100
TIMER_OPS = 50  # threading.Timer costs ~0.1-2 ms a block: fewer per round
TIMER_ROUNDS = 20
LIMIT = 10.0  # never reached

pytestmark = pytest.mark.benchmark(group="overhead")


class RecipeTimeout(Exception):
    """What the classic recipes raise when their deadline fires (never here)."""


class NoOp:
    """The cheapest Python-level context manager: the baseline."""

    __slots__ = ()

    def __enter__(self) -> NoOp:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        return None


def _raise_timeout(signum: int, frame: Optional[FrameType]) -> None:
    raise RecipeTimeout


_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc


def _inject(ident: int) -> None:
    _set_async_exc(ctypes.c_ulong(ident), ctypes.py_object(RecipeTimeout))


def _noop_blocks(n: int) -> None:
    for _ in range(n):
        with NoOp():
            pass


def _deadline_blocks(n: int) -> None:
    for _ in range(n):
        with thread_deadline(LIMIT):
            pass


def _unbounded_blocks(n: int) -> None:
    for _ in range(n):
        with thread_deadline(None):
            pass


def _setitimer_blocks(n: int) -> None:
    for _ in range(n):
        old = signal.signal(signal.SIGALRM, _raise_timeout)
        signal.setitimer(signal.ITIMER_REAL, LIMIT)
        try:
            pass
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)


def _alarm_blocks(n: int) -> None:
    for _ in range(n):
        old = signal.signal(signal.SIGALRM, _raise_timeout)
        signal.alarm(math.ceil(LIMIT))
        try:
            pass
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)


def _timer_blocks(n: int, started: list[threading.Timer]) -> None:
    ident = threading.get_ident()
    for _ in range(n):
        timer = threading.Timer(LIMIT, _inject, args=(ident,))
        timer.start()
        try:
            pass
        finally:
            timer.cancel()
        started.append(timer)


def _record(benchmark: BenchmarkFixture, case: str, ops: int, baseline: bool = False) -> None:
    assert benchmark.stats is not None
    stats = benchmark.stats.stats
    benchmark.extra_info.update(
        case=case,
        ops_per_round=ops,
        per_op_ns=round(stats.median / ops * 1e9, 1),
        per_op_ns_min=round(stats.min / ops * 1e9, 1),
        baseline=baseline,
    )


def _require_main_thread() -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal-based recipes need the main thread")


def _run(benchmark: BenchmarkFixture, fn: Callable[[int], None]) -> None:
    benchmark.pedantic(fn, args=(OPS,), rounds=ROUNDS, warmup_rounds=3)  # type: ignore[no-untyped-call]


def test_noop_context_manager(benchmark: BenchmarkFixture) -> None:
    _run(benchmark, _noop_blocks)
    _record(benchmark, "no-op Python `with` (baseline)", OPS, baseline=True)


def test_thread_deadline(benchmark: BenchmarkFixture) -> None:
    from timeoutcore import _native

    before = _native.stats() if ENGINE == "native" else None
    _run(benchmark, _deadline_blocks)
    _record(benchmark, f"`with thread_deadline(10.0)` [{ENGINE}]", OPS)
    if before is not None:
        after = _native.stats()
        blocks = (ROUNDS + 3) * OPS
        wakeups = after["watchdog_wakeups"] - before["watchdog_wakeups"]
        benchmark.extra_info["watchdog_wakeups_per_block"] = round(wakeups / blocks, 4)


def test_thread_deadline_none(benchmark: BenchmarkFixture) -> None:
    _run(benchmark, _unbounded_blocks)
    _record(benchmark, f"`with thread_deadline(None)` [{ENGINE}]", OPS)


def test_signal_setitimer_pair(benchmark: BenchmarkFixture) -> None:
    _require_main_thread()
    _run(benchmark, _setitimer_blocks)
    _record(benchmark, "signal.signal + setitimer arm/disarm (main thread)", OPS)


def test_signal_alarm_pair(benchmark: BenchmarkFixture) -> None:
    _require_main_thread()
    _run(benchmark, _alarm_blocks)
    _record(benchmark, "signal.signal + alarm(ceil(10)) / alarm(0) (main)", OPS)


def test_threading_timer_recipe(benchmark: BenchmarkFixture) -> None:
    started: list[threading.Timer] = []

    def join_previous() -> None:
        # Not timed: let the cancelled timer threads of the last round exit first.
        for timer in started:
            timer.join()
        started.clear()

    benchmark.pedantic(  # type: ignore[no-untyped-call]
        _timer_blocks,
        args=(TIMER_OPS, started),
        setup=join_previous,
        rounds=TIMER_ROUNDS,
        warmup_rounds=1,
    )
    join_previous()
    _record(benchmark, "threading.Timer create+start+cancel (SetAsyncExc)", TIMER_OPS)


@pytest.mark.skipif(ENGINE != "native", reason="needs the native engine's kernel timer")
def test_kernel_timer_pair_per_1000(benchmark: BenchmarkFixture) -> None:
    from timeoutcore import _native

    with thread_deadline(None):  # gives this thread its slot and kernel timer
        pass
    benchmark.pedantic(_native.bench_timer_pair, args=(OPS,), rounds=ROUNDS, warmup_rounds=3)  # type: ignore[no-untyped-call]
    _record(benchmark, f"kernel timer arm+disarm pair (bench_timer_pair({OPS}) / {OPS})", OPS)
