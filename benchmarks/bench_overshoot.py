"""How late does a 50 ms deadline stop the block, by recipe, thread and workload?

Overshoot = the moment the block is left (the timeout exception caught) minus the deadline.
For timeoutcore it is ``scope.overshoot``, measured by the core; for the classic recipes it
is ``perf_counter()`` at the ``except`` minus (``perf_counter()`` at arming + 50 ms).

Recipes:
- ``timeoutcore``: ``with thread_deadline(0.05)``;
- ``Timer+SetAsyncExc``: ``threading.Timer(0.05, inject)`` where ``inject`` calls
  ``PyThreadState_SetAsyncExc`` on the guarded thread (works in any thread, only between
  bytecodes);
- ``setitimer``: ``signal.signal`` + ``signal.setitimer(ITIMER_REAL)`` with a raising handler,
  main thread only (the reference for what a signal can do);
- ``alarm``: the same with ``signal.alarm(ceil(seconds))``.

Workloads: a CPU loop (a ``for`` loop: CPython 3.13.0 skips handlers for an exception raised
at a ``while`` back-edge in the handler's own frame), libc ``read()`` through ctypes on an
empty pipe, ``timeoutcore.sleep(1)`` and ``time.sleep(1)``. A blocking call that nothing
knocks loose would hang, so each read trial arms a rescue that writes a byte to the pipe.

Each case runs inside one ``benchmark.pedantic(rounds=1)``; the figures that matter are the
percentiles in ``extra_info`` (p99 of 60 trials is close to the maximum).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import re
import signal
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import FrameType
from typing import Callable, ContextManager, Iterator, Optional, Sequence

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from timeoutcore import ENGINE, DeadlineExceeded, thread_deadline
from timeoutcore import sleep as tc_sleep

LIMIT = 0.05  # seconds: the deadline under test
TRIALS = 60
SLOW_TRIALS = 3  # cases that run ~1 s per trial
RESCUE_AFTER = 0.5  # seconds: a blocking read nothing interrupts is released then
HOGS = 3  # CPU-bound threads in the contention cases

pytestmark = pytest.mark.benchmark(group="overshoot")

Work = Callable[[], object]
Workload = Callable[[], ContextManager[Work]]
Trial = Callable[[Workload], Optional[float]]


class RecipeTimeout(Exception):
    """What the classic recipes raise when their deadline fires."""


# --- workloads ------------------------------------------------------------------------------


def _cpu_loop() -> None:
    for _ in range(10**12):
        pass


_libc = ctypes.CDLL(None, use_errno=True)
_libc.read.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)
_libc.read.restype = ctypes.c_ssize_t


@contextlib.contextmanager
def cpu() -> Iterator[Work]:
    yield _cpu_loop


@contextlib.contextmanager
def ctypes_read() -> Iterator[Work]:
    """libc ``read()`` on an empty pipe; a rescue timer writes a byte after RESCUE_AFTER."""
    rfd, wfd = os.pipe()
    buf = ctypes.create_string_buffer(1)
    rescue = threading.Timer(RESCUE_AFTER, os.write, args=(wfd, b"x"))
    rescue.start()
    try:
        yield lambda: _libc.read(rfd, buf, 1)
    finally:
        rescue.cancel()
        rescue.join()
        os.close(rfd)
        os.close(wfd)


@contextlib.contextmanager
def core_sleep() -> Iterator[Work]:
    yield lambda: tc_sleep(1.0)


@contextlib.contextmanager
def time_sleep() -> Iterator[Work]:
    yield lambda: time.sleep(1.0)


# --- recipes: one trial each, returning the overshoot in seconds (None: not interrupted) ----


def trial_timeoutcore(workload: Workload) -> Optional[float]:
    with workload() as work:
        scope = thread_deadline(LIMIT)
        try:
            with scope:
                work()
        except DeadlineExceeded:
            pass
    overshoot: Optional[float] = scope.overshoot
    return overshoot


_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc


def _inject(ident: int) -> None:
    _set_async_exc(ctypes.c_ulong(ident), ctypes.py_object(RecipeTimeout))


def trial_timer(workload: Workload) -> Optional[float]:
    with workload() as work:
        timer = threading.Timer(LIMIT, _inject, args=(threading.get_ident(),))
        deadline = time.perf_counter() + LIMIT
        try:
            # start() is inside: under contention the timer can fire before start() returns.
            timer.start()
            work()
        except RecipeTimeout:
            return time.perf_counter() - deadline
        finally:
            timer.cancel()
    return None


def _raise_timeout(signum: int, frame: Optional[FrameType]) -> None:
    raise RecipeTimeout


def _signal_trial(arm: Callable[[], object], disarm: Callable[[], object]) -> Trial:
    def trial(workload: Workload) -> Optional[float]:
        with workload() as work:
            old = signal.signal(signal.SIGALRM, _raise_timeout)
            deadline = time.perf_counter() + LIMIT
            arm()
            try:
                work()
            except RecipeTimeout:
                return time.perf_counter() - deadline
            finally:
                disarm()
                signal.signal(signal.SIGALRM, old)
        return None

    return trial


trial_setitimer = _signal_trial(
    lambda: signal.setitimer(signal.ITIMER_REAL, LIMIT),
    lambda: signal.setitimer(signal.ITIMER_REAL, 0),
)
trial_alarm = _signal_trial(lambda: signal.alarm(math.ceil(LIMIT)), lambda: signal.alarm(0))


# --- running a case -------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    recipe: str
    trial: Trial
    workload: Workload
    label: str  # the workload as shown in the table
    thread: str = "worker"  # or "main"
    trials: int = TRIALS
    hogs: int = 0
    note: str = ""

    @property
    def title(self) -> str:
        hogs = f" +{self.hogs} CPU threads" if self.hogs else ""
        return f"{self.recipe}, {self.thread}, {self.label}{hogs}"

    @property
    def id(self) -> str:
        words = re.findall(r"[a-z0-9]+", f"{self.recipe} {self.thread} {self.label}".lower())
        return "-".join(words) + (f"-{self.hogs}hogs" if self.hogs else "")


CASES = [
    Case("timeoutcore", trial_timeoutcore, cpu, "CPU loop"),
    Case("timeoutcore", trial_timeoutcore, ctypes_read, "ctypes read()"),
    Case("timeoutcore", trial_timeoutcore, core_sleep, "timeoutcore.sleep(1)"),
    Case(
        "timeoutcore",
        trial_timeoutcore,
        time_sleep,
        "time.sleep(1)",
        trials=SLOW_TRIALS,
        note="PEP 475: CPython < 3.15 retries the sleep after EINTR",
    ),
    Case("timeoutcore", trial_timeoutcore, cpu, "CPU loop", hogs=HOGS),
    Case("timeoutcore", trial_timeoutcore, cpu, "CPU loop", thread="main"),
    Case("Timer+SetAsyncExc", trial_timer, cpu, "CPU loop"),
    Case(
        "Timer+SetAsyncExc",
        trial_timer,
        ctypes_read,
        "ctypes read()",
        trials=SLOW_TRIALS,
        note=f"not interrupted: left when the rescue ended the read at {RESCUE_AFTER:g} s",
    ),
    Case(
        "Timer+SetAsyncExc",
        trial_timer,
        time_sleep,
        "time.sleep(1)",
        trials=SLOW_TRIALS,
        note="not interrupted: left when the sleep ended",
    ),
    Case("Timer+SetAsyncExc", trial_timer, cpu, "CPU loop", hogs=HOGS),
    Case("setitimer", trial_setitimer, cpu, "CPU loop", thread="main"),
    Case("setitimer", trial_setitimer, ctypes_read, "ctypes read()", thread="main"),
    Case("setitimer", trial_setitimer, time_sleep, "time.sleep(1)", thread="main"),
    Case(
        "alarm",
        trial_alarm,
        cpu,
        "CPU loop",
        thread="main",
        trials=1,
        note="alarm() takes whole seconds: 0.05 s rounds up to 1 s",
    ),
    Case("setitimer", trial_setitimer, cpu, "CPU loop"),
    Case("alarm", trial_alarm, cpu, "CPU loop"),
]


@contextlib.contextmanager
def cpu_hogs(n: int) -> Iterator[None]:
    """``n`` daemon threads spinning in Python code until the block ends."""
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    threads = [threading.Thread(target=spin, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join()


def run_trials(case: Case) -> list[Optional[float]]:
    """Run the case's trials in this thread (after a warm-up trial unless they are slow)."""
    if case.trials > SLOW_TRIALS:
        case.trial(case.workload)
    return [case.trial(case.workload) for _ in range(case.trials)]


def run_case(case: Case) -> tuple[list[Optional[float]], Optional[str]]:
    """The overshoots of the case's trials, or the error a signal recipe raises in a worker."""
    with cpu_hogs(case.hogs):
        if case.thread == "main":
            return run_trials(case), None
        with ThreadPoolExecutor(max_workers=1) as pool:
            try:
                return pool.submit(run_trials, case).result(), None
            except ValueError as exc:
                if case.trial not in (trial_setitimer, trial_alarm):
                    raise
                return [], f"ValueError: {exc}"


def percentiles(seconds: Sequence[float]) -> dict[str, float]:
    ms = sorted(s * 1e3 for s in seconds)
    if len(ms) == 1:
        p50 = p90 = p99 = ms[0]
    else:
        q = statistics.quantiles(ms, n=100, method="inclusive")
        p50, p90, p99 = q[49], q[89], q[98]
    return {
        "p50_ms": round(p50, 3),
        "p90_ms": round(p90, 3),
        "p99_ms": round(p99, 3),
        "max_ms": round(ms[-1], 3),
    }


def _core_counters() -> dict[str, int]:
    if ENGINE != "native":
        return {}
    from timeoutcore import _native

    return _native.stats()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_overshoot(benchmark: BenchmarkFixture, case: Case) -> None:
    if case.thread == "main" and threading.current_thread() is not threading.main_thread():
        pytest.skip("main-thread case, but pytest runs this test elsewhere")
    info = benchmark.extra_info
    info.update(case=case.title, recipe=case.recipe, thread=case.thread, limit_s=LIMIT)
    if case.recipe == "timeoutcore":
        info["engine"] = ENGINE
    before = _core_counters()
    results, error = benchmark.pedantic(run_case, args=(case,), rounds=1, iterations=1)  # type: ignore[no-untyped-call]
    if error is not None:
        info.update(note=f"n/a: raises {error}", error=error)
        return
    after = _core_counters()
    if case.recipe == "timeoutcore" and before:
        keys = ("fires", "kicks", "reinjections", "gil_takes", "requeues")
        info["core_counters"] = {k: after[k] - before[k] for k in keys}
    overshoots = [r for r in results if r is not None]
    info["trials"] = len(overshoots)
    info["not_interrupted"] = len(results) - len(overshoots)
    if overshoots:
        info.update(percentiles(overshoots))
    if case.note:
        info["note"] = case.note
    print(
        f"\n{case.title}: "
        + ", ".join(f"{k}={info.get(k)}" for k in ("p50_ms", "p90_ms", "p99_ms"))
    )
    assert len(overshoots) == len(results), (
        f"{len(results) - len(overshoots)} trials not interrupted"
    )
