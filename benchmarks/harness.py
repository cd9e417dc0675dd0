"""Side by side, in one run: timeoutcore and the ways Python code is time-limited today.

``python -m timeoutcore bench --full`` prints what this module measures (it loads this file from the
source checkout); the ``bench_*.py`` files beside it (pytest-benchmark) run the same code.
Nothing here needs pytest. Not part of the installed package.

Methods compared (``METHODS``):

- ``timeoutcore``: ``with thread_deadline(limit)``;
- ``signal.alarm``: the classic recipe, ``signal.signal(SIGALRM, raising_handler)`` +
  ``signal.alarm(math.ceil(limit))``, main thread only;
- ``signal.setitimer``: the same with ``setitimer(ITIMER_REAL, limit)``;
- ``Timer+SetAsyncExc``: ``threading.Timer(limit, inject)`` where ``inject`` raises in the
  guarded thread with ``PyThreadState_SetAsyncExc`` (the recipe behind most peers);
- ``stopit.ThreadingTimeout`` and ``func_timeout.func_timeout``, when installed
  (``pip install stopit func_timeout``, or the package's ``bench`` extra); skipped otherwise.

Figures:

- **overhead**: the cost of a block that does not time out, in the main thread: rounds of
  empty blocks, the median round divided by the blocks per round (loop included, the same for
  every method); the no-op Python ``with`` is the baseline.
- **overshoot**: how long after the deadline the caller gets control back, p50/p90/p99, for a
  CPU loop, a blocking C call (libc ``read()`` through ctypes on an empty pipe) and a sleep
  (``timeoutcore.sleep`` for timeoutcore, ``time.sleep`` for the others; plus plain
  ``time.sleep`` under timeoutcore), in the main thread and in a pool worker. The yardstick is
  the same for every method: ``perf_counter()`` where the timeout exception is caught minus
  ``perf_counter()`` just before arming plus the limit. Every workload ends by itself a little
  after the method should have fired (the CPU loop checks the clock, a rescue timer writes a
  byte to the pipe, the sleep is bounded), so nothing can hang; a block left only then was
  *not interrupted*, and one whose caller was released while the work ran on in another thread
  (func_timeout) was *abandoned*.
- **throughput**: tasks per second of a thread pool running 1 ms tasks, each under a limit
  that never fires, against the same pool without limits.

``run(QUICK)`` / ``run(FULL)`` return everything as a dict (for orjson); ``render`` makes
the side-by-side tables, ``plot`` the overshoot distributions (needs matplotlib).
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import importlib
import itertools
import math
import os
import platform
import random
import signal
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Callable, ContextManager, Iterator, Optional, Sequence

from timeoutcore import ENGINE, DeadlineExceeded, __version__, thread_deadline
from timeoutcore import sleep as tc_sleep
# The recipes' exception, their SIGALRM handler and the SetAsyncExc prototype are the
# packaged bench's (python -m timeoutcore bench): one definition for both.
from timeoutcore._bench import RecipeTimeout, _raise_recipe_timeout
from timeoutcore._bench import cpu_model as _cpu_model
from timeoutcore._bench import set_async_exc as _set_async_exc

Work = Callable[[], object]
Progress = Callable[[str], None]

NEVER = 10.0  # seconds: a limit that never fires (overhead, throughput)
SLACK = 0.25  # seconds a workload runs on after its method should have fired
HOGS = 3  # CPU-bound threads in the contention case
HOGS_LEVELS = (1, 3, 7)  # ... and in the full plan's contention sweep
POOL_WORKERS = 4
TASK_S = 0.001  # the throughput task: time.sleep(1 ms)
CHEAP_OPS = 1000  # empty blocks per overhead round
THREAD_OPS = 50  # for methods that start a thread per block (~0.1-1 ms each)

_perf = time.perf_counter


def _forever() -> Iterator[int]:
    """A fresh endless counter for one loop. Never one shared by every loop: on a
    free-threaded build each ``next()`` of a shared counter takes that object's lock, so the
    busy threads and the guarded loop of the contention case all took turns at one lock --
    not the independent busy threads the case stands for."""
    return itertools.count()


def _inject(ident: int) -> None:
    _set_async_exc(ident, RecipeTimeout)


# --- how one guarded run ended --------------------------------------------------------------


@dataclass(frozen=True)
class Exit:
    """One guarded run, in ``perf_counter()`` seconds."""

    deadline: float  # arming time + limit
    left_at: float  # the caller got control back
    raised: bool  # the method reported a timeout
    work_ended_at: float  # the work stopped running (later than left_at when abandoned)


def _exit(t0: float, limit: float, raised: bool, left: float) -> Exit:
    return Exit(deadline=t0 + limit, left_at=left, raised=raised, work_ended_at=left)


# --- the methods ----------------------------------------------------------------------------


class Method:
    """A way to put a time limit on a block of code."""

    key = ""
    title = ""
    requires: Optional[str] = None  # an optional peer's module (= its pip name)
    main_thread_only = False
    ops = CHEAP_OPS  # empty blocks per overhead round

    def missing(self) -> Optional[str]:
        """Why this method cannot run here, or None."""
        if self.requires is None:
            return None
        try:
            importlib.import_module(self.requires)
        except ImportError:
            return f"not installed (pip install {self.requires})"
        return None

    def peer(self) -> Any:
        assert self.requires is not None
        return importlib.import_module(self.requires)

    def fires_after(self, limit: float) -> float:
        """When the method actually fires for ``limit``."""
        return limit

    def note(self, limit: float) -> str:
        return ""

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def guard(self, limit: float, work: Work) -> Exit:
        """Run ``work`` under ``limit``; catch the method's timeout."""
        raise NotImplementedError

    def empty_blocks(self, n: int) -> None:
        """``n`` blocks with an empty body under a limit that never fires."""
        raise NotImplementedError

    def cleanup(self) -> None:
        """Untimed, between overhead rounds: let threads the blocks started finish."""


class NoOp:
    """The cheapest Python-level context manager."""

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


class NoDeadline(Method):
    key = "none"
    title = "no deadline"

    def guard(self, limit: float, work: Work) -> Exit:
        t0 = _perf()
        work()
        return _exit(t0, limit, False, _perf())

    def empty_blocks(self, n: int) -> None:
        for _ in range(n):
            with NoOp():
                pass


class Timeoutcore(Method):
    key = "timeoutcore"
    title = "timeoutcore"

    def sleep(self, seconds: float) -> None:
        tc_sleep(seconds)

    def guard(self, limit: float, work: Work) -> Exit:
        scope = thread_deadline(limit)
        raised = False
        t0 = _perf()
        try:
            with scope:
                work()
        except DeadlineExceeded:
            raised = True
        return _exit(t0, limit, raised, _perf())

    def empty_blocks(self, n: int) -> None:
        for _ in range(n):
            with thread_deadline(NEVER):
                pass


class _SignalRecipe(Method):
    main_thread_only = True

    def arm(self, limit: float) -> None:
        raise NotImplementedError

    def disarm(self) -> None:
        raise NotImplementedError

    def guard(self, limit: float, work: Work) -> Exit:
        old = signal.signal(signal.SIGALRM, _raise_recipe_timeout)
        t0 = _perf()
        self.arm(limit)
        try:
            work()
        except RecipeTimeout:
            return _exit(t0, limit, True, _perf())
        finally:
            self.disarm()
            signal.signal(signal.SIGALRM, old)
        return _exit(t0, limit, False, _perf())


class SignalAlarm(_SignalRecipe):
    key = "signal.alarm"
    title = "signal.alarm"

    def fires_after(self, limit: float) -> float:
        return float(math.ceil(limit))

    def note(self, limit: float) -> str:
        return f"alarm() takes whole seconds: ceil({limit:g}) = {math.ceil(limit)} s"

    def arm(self, limit: float) -> None:
        signal.alarm(math.ceil(limit))

    def disarm(self) -> None:
        signal.alarm(0)

    def empty_blocks(self, n: int) -> None:
        for _ in range(n):
            old = signal.signal(signal.SIGALRM, _raise_recipe_timeout)
            signal.alarm(math.ceil(NEVER))
            try:
                pass
            finally:
                signal.alarm(0)
                signal.signal(signal.SIGALRM, old)


class SignalSetitimer(_SignalRecipe):
    key = "signal.setitimer"
    title = "signal.setitimer"

    def arm(self, limit: float) -> None:
        signal.setitimer(signal.ITIMER_REAL, limit)

    def disarm(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)

    def empty_blocks(self, n: int) -> None:
        for _ in range(n):
            old = signal.signal(signal.SIGALRM, _raise_recipe_timeout)
            signal.setitimer(signal.ITIMER_REAL, NEVER)
            try:
                pass
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)


class TimerAsyncExc(Method):
    key = "timer_async_exc"
    title = "Timer+SetAsyncExc"
    ops = THREAD_OPS

    def __init__(self) -> None:
        self._started: list[threading.Thread] = []

    def guard(self, limit: float, work: Work) -> Exit:
        timer = threading.Timer(limit, _inject, args=(threading.get_ident(),))
        t0 = _perf()
        try:
            timer.start()  # inside: under contention it can fire before start() returns
            work()
        except RecipeTimeout:
            return _exit(t0, limit, True, _perf())
        finally:
            timer.cancel()
        return _exit(t0, limit, False, _perf())

    def empty_blocks(self, n: int) -> None:
        ident = threading.get_ident()
        started = self._started
        for _ in range(n):
            timer = threading.Timer(NEVER, _inject, args=(ident,))
            timer.start()
            try:
                pass
            finally:
                timer.cancel()
            started.append(timer)

    def cleanup(self) -> None:
        for t in self._started:
            t.join()
        self._started.clear()


class StopitThreadingTimeout(Method):
    key = "stopit"
    title = "stopit.ThreadingTimeout"
    requires = "stopit"
    ops = THREAD_OPS

    def __init__(self) -> None:
        self._started: list[threading.Thread] = []

    def guard(self, limit: float, work: Work) -> Exit:
        stopit = self.peer()
        raised = False
        t0 = _perf()
        try:
            with stopit.ThreadingTimeout(limit, swallow_exc=False):
                work()
        except stopit.TimeoutException:
            raised = True
        return _exit(t0, limit, raised, _perf())

    def empty_blocks(self, n: int) -> None:
        timeout = self.peer().ThreadingTimeout
        started = self._started
        for _ in range(n):
            with timeout(NEVER, swallow_exc=False) as ctx:
                pass
            started.append(ctx.timer)

    def cleanup(self) -> None:
        for t in self._started:
            t.join()
        self._started.clear()


class FuncTimeout(Method):
    key = "func_timeout"
    title = "func_timeout"
    requires = "func_timeout"
    ops = THREAD_OPS

    def guard(self, limit: float, work: Work) -> Exit:
        ft = self.peer()
        before = set(threading.enumerate())
        t0 = _perf()
        try:
            ft.func_timeout(limit, work)
        except ft.FunctionTimedOut:
            left = _perf()
            ended = self._join_abandoned(before)
            return Exit(deadline=t0 + limit, left_at=left, raised=True, work_ended_at=ended)
        return _exit(t0, limit, False, _perf())

    def _join_abandoned(self, before: set[threading.Thread]) -> float:
        """Wait (untimed for the caller) for the thread func_timeout left running."""
        stoppable = importlib.import_module("func_timeout.StoppableThread").StoppableThread
        new = [t for t in threading.enumerate() if t not in before]
        ended = _perf()
        for t in new:
            if isinstance(t, stoppable):
                t.join(SLACK + 5.0)
                ended = _perf()
        for t in new:
            t.join(5.0)
        return ended

    def empty_blocks(self, n: int) -> None:
        call = self.peer().func_timeout
        for _ in range(n):
            call(NEVER, _nothing)


def _nothing() -> None:
    return None


NO_DEADLINE = NoDeadline()
TIMEOUTCORE = Timeoutcore()
METHODS: tuple[Method, ...] = (
    TIMEOUTCORE,
    SignalAlarm(),
    SignalSetitimer(),
    TimerAsyncExc(),
    StopitThreadingTimeout(),
    FuncTimeout(),
)


def method(key: str) -> Method:
    for m in (NO_DEADLINE, *METHODS):
        if m.key == key:
            return m
    raise KeyError(key)


# --- workloads: each ends by itself at ``ends_at`` ------------------------------------------


def _spin_until(end: float) -> None:
    # A ``for`` loop on purpose: CPython 3.13.0 skips a frame's handlers when an exception is
    # raised at the back-edge of a ``while <cond>:`` loop in that frame (cpython#130279).
    clock = _perf
    for _ in _forever():
        if clock() >= end:
            return


_libc = ctypes.CDLL(None, use_errno=True)
_libc_read = _libc.read
_libc_read.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)
_libc_read.restype = ctypes.c_ssize_t


def _write_byte(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.write(fd, b"x")


@dataclass(frozen=True)
class Workload:
    key: str
    title: str
    prepare: Callable[[Method, float], ContextManager[Work]]
    only: Optional[str] = None  # run for this method key only
    section: str = ""  # shown with this workload's rows (default: its own key)
    variant: str = ""  # added to the method's name in that section


@contextlib.contextmanager
def _cpu(m: Method, ends_at: float) -> Iterator[Work]:
    yield lambda: _spin_until(ends_at)


@contextlib.contextmanager
def _c_call(m: Method, ends_at: float) -> Iterator[Work]:
    """libc ``read()`` on an empty pipe; a rescue timer writes a byte at ``ends_at``."""
    rfd, wfd = os.pipe()
    buf = ctypes.create_string_buffer(1)

    def read() -> None:
        # Returns on EINTR like a C library would; loops so that an EINTR nobody turned into
        # an exception does not end the work early.
        for _ in _forever():
            if _libc_read(rfd, buf, 1) >= 0 or _perf() >= ends_at:
                return

    rescue = threading.Timer(max(0.0, ends_at - _perf()), _write_byte, args=(wfd,))
    rescue.start()
    try:
        yield read
    finally:
        rescue.cancel()
        rescue.join()
        _write_byte(wfd)  # a reader left blocked in another thread is released too
        os.close(rfd)
        os.close(wfd)


@contextlib.contextmanager
def _own_sleep(m: Method, ends_at: float) -> Iterator[Work]:
    yield lambda: m.sleep(max(0.0, ends_at - _perf()))


@contextlib.contextmanager
def _time_sleep(m: Method, ends_at: float) -> Iterator[Work]:
    yield lambda: time.sleep(max(0.0, ends_at - _perf()))


@contextlib.contextmanager
def _cpu_logging(m: Method, ends_at: float) -> Iterator[Work]:
    """A CPU loop that logs on every turn through a real StreamHandler (to /dev/null, with
    a formatter): most of its time is inside logging, protected code, so the interrupt is
    deferred to the loop's own line after the log call."""
    import logging

    with open(os.devnull, "w") as sink:  # noqa: PTH123
        handler = logging.StreamHandler(sink)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        log = logging.getLogger("timeoutcore.bench.deferral")
        log.propagate = False
        log.setLevel(logging.INFO)
        log.addHandler(handler)

        def work() -> None:
            clock = _perf
            for n in _forever():
                log.info("turn %d", n)
                if clock() >= ends_at:
                    return

        try:
            yield work
        finally:
            log.removeHandler(handler)
            handler.close()


@contextlib.contextmanager
def _queue_traffic(m: Method, ends_at: float) -> Iterator[Work]:
    """Queue traffic shared with a partner thread: the guarded loop puts and gets on two
    ``queue.Queue`` objects the partner also uses (locks, conditions, task accounting),
    so a deadline often passes inside ``queue``/``threading`` code."""
    import queue

    jobs: queue.Queue[int] = queue.Queue()
    done: queue.Queue[int] = queue.Queue()
    stop = threading.Event()

    def partner() -> None:
        while not stop.is_set():
            try:
                n = jobs.get(timeout=0.01)
            except queue.Empty:
                continue
            done.put(n)
            jobs.task_done()

    t = threading.Thread(target=partner, daemon=True)
    t.start()

    def work() -> None:
        clock = _perf
        for n in _forever():
            jobs.put(n)
            try:
                done.get(timeout=0.01)
            except queue.Empty:
                pass
            if clock() >= ends_at:
                return

    try:
        yield work
    finally:
        stop.set()
        t.join()


CPU = Workload("cpu", "CPU loop", _cpu)
CPU_LOGGING = Workload("cpu_logging", "CPU loop logging every turn", _cpu_logging,
                       only="timeoutcore", section="cpu", variant="logging every turn")
QUEUE_TRAFFIC = Workload("queue_traffic", "queue traffic with a partner thread",
                         _queue_traffic, only="timeoutcore", section="cpu",
                         variant="queue traffic")
C_CALL = Workload("c_call", "blocking C call (ctypes read)", _c_call)
SLEEP = Workload("sleep", "sleep (timeoutcore.sleep / time.sleep)", _own_sleep)
TIME_SLEEP = Workload("time_sleep", "plain time.sleep", _time_sleep, only="timeoutcore",
                      section="sleep", variant="plain time.sleep")
# The deferral workloads run timeoutcore only: the peers' interrupts land inside logging
# and queue code and leave their locks held (the very hazard), which would hang the run.
WORKLOADS: tuple[Workload, ...] = (CPU, C_CALL, SLEEP, TIME_SLEEP, CPU_LOGGING, QUEUE_TRAFFIC)


@contextlib.contextmanager
def cpu_hogs(n: int) -> Iterator[None]:
    """``n`` threads spinning in Python code until the block ends."""
    stop = threading.Event()

    def spin() -> None:
        for _ in _forever():
            if stop.is_set():
                return

    threads = [threading.Thread(target=spin, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join()


# --- plans and cases ------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    name: str
    limits: tuple[float, ...]
    trials: int  # per overshoot case whose trials are quick ...
    case_budget_s: float  # ... at most this many seconds of deadlines per case
    slow_trials: int  # per case whose trials are slow (not interrupted, or alarm's 1 s) ...
    slow_budget_s: float  # ... within this budget, at least one
    overhead_rounds: int
    overhead_thread_rounds: int  # rounds for methods that start a thread per block
    throughput_tasks: int  # in all, per method ...
    throughput_reps: int  # ... in this many runs
    contention: bool  # add the CPU loop with HOGS busy threads (50 ms, pool worker)

    def trials_for(self, limit: float) -> int:
        return max(5, min(self.trials, int(self.case_budget_s / limit)))


QUICK = Plan(
    name="quick",
    limits=(0.05,),
    trials=8,
    case_budget_s=0.5,
    slow_trials=2,
    slow_budget_s=0.4,
    overhead_rounds=10,
    overhead_thread_rounds=3,
    throughput_tasks=400,
    throughput_reps=2,
    contention=False,
)
FULL = Plan(
    name="full",
    limits=(0.05, 0.25),
    trials=100,
    case_budget_s=8.0,
    slow_trials=5,
    slow_budget_s=4.0,
    overhead_rounds=100,
    overhead_thread_rounds=20,
    throughput_tasks=4000,
    throughput_reps=5,
    contention=True,
)


@dataclass(frozen=True)
class Case:
    method: Method
    workload: Workload
    thread: str  # "main" or "worker"
    limit: float
    hogs: int = 0

    @property
    def title(self) -> str:
        hogs = f" +{self.hogs} CPU threads" if self.hogs else ""
        where = "main thread" if self.thread == "main" else "pool worker"
        return f"{self.method.title}, {where}, {self.workload.title}{hogs}, {self.limit * 1e3:g} ms"

    @property
    def id(self) -> str:
        hogs = f"-{self.hogs}hogs" if self.hogs else ""
        method = self.method.key.replace(".", "-").replace("_", "-")
        return f"{method}-{self.thread}-{self.workload.key.replace('_', '-')}{hogs}"


def overshoot_cases(plan: Plan) -> list[Case]:
    cases = []
    for limit in plan.limits:
        for w in WORKLOADS:
            for m in METHODS:
                if w.only is not None and m.key != w.only:
                    continue
                for thread in ("main", "worker"):
                    if w.only is not None and thread == "main":
                        continue  # the point (PEP 475) is made in a worker
                    cases.append(Case(m, w, thread, limit))
        if plan.contention and limit == plan.limits[0]:
            for hogs in HOGS_LEVELS:
                for m in METHODS:
                    if not m.main_thread_only:
                        cases.append(Case(m, CPU, "worker", limit, hogs=hogs))
    return cases


# --- running --------------------------------------------------------------------------------


@dataclass
class Trial:
    exit: Exit
    ends_at: float  # when the work would have ended by itself

    @property
    def outcome(self) -> str:
        e = self.exit
        if e.left_at >= self.ends_at:
            return "not_interrupted"
        if not e.raised:
            return "returned"  # the work ended early without a timeout (should not happen)
        if e.work_ended_at >= self.ends_at:
            return "abandoned"
        return "stopped"


# With busy threads, when a thread gets the CPU (and, with a GIL, the GIL) follows a pattern:
# the OS's time slices, the switch interval. Trials ran back to back, each starting just after
# the previous one got control back, so a fixed limit put every deadline at about the same
# point of that pattern, and the case measured where 50 ms falls in it rather than a deadline
# at an unknown moment. So before each trial of a case with busy threads the worker spins for
# a random time up to this long (more than one round of turns among 8 threads): its deadline
# comes at a random instant of the pattern, as the floor's instants do (run_floor).
PHASE_SPREAD_S = 0.02


def run_trial(case: Case, phase: Optional[random.Random] = None) -> Trial:
    """One trial of ``case``; with ``phase``, after a random spin of up to PHASE_SPREAD_S."""
    if phase is not None:
        _spin_until(_perf() + phase.uniform(0.0, PHASE_SPREAD_S))
    ends_at = _perf() + case.method.fires_after(case.limit) + SLACK
    with case.workload.prepare(case.method, ends_at) as work:
        result = case.method.guard(case.limit, work)
    return Trial(result, ends_at)


def _run_trials(case: Case, plan: Plan) -> list[Trial]:
    phase = random.Random(case.id) if case.hogs else None  # the same instants every run
    t0 = _perf()
    probe = run_trial(case, phase)
    wall = _perf() - t0
    if probe.outcome != "stopped" or wall > case.limit + PHASE_SPREAD_S + 0.2:
        n = max(1, min(plan.slow_trials, int(plan.slow_budget_s / wall)))
        return [probe] + [run_trial(case, phase) for _ in range(n - 1)]
    return [run_trial(case, phase) for _ in range(plan.trials_for(case.limit))]  # probe = warm-up


def percentiles(values_ms: Sequence[float]) -> dict[str, float]:
    ms = sorted(values_ms)
    if len(ms) == 1:
        p50 = p90 = p99 = ms[0]
    else:
        q = statistics.quantiles(ms, n=100, method="inclusive")
        p50, p90, p99 = q[49], q[89], q[98]
    return {
        "p50_ms": round(p50, 4),
        "p90_ms": round(p90, 4),
        "p99_ms": round(p99, 4),
        "max_ms": round(ms[-1], 4),
    }


def _case_row(case: Case) -> dict[str, Any]:
    return {
        "method": case.method.key,
        "method_title": case.method.title,
        "workload": case.workload.key,
        "workload_title": case.workload.title,
        "section": case.workload.section or case.workload.key,
        "row": case.method.title + (f" ({case.workload.variant})" if case.workload.variant else ""),
        "thread": case.thread,
        "limit_s": case.limit,
        "hogs": case.hogs,
        "note": case.method.note(case.limit) or None,
    }


def run_case(case: Case, plan: Plan) -> dict[str, Any]:
    """One overshoot case: its trials' figures, or why it could not run."""
    row = _case_row(case)
    missing = case.method.missing()
    if missing is not None:
        row["skipped"] = missing
        return row
    if case.thread == "main" and threading.current_thread() is not threading.main_thread():
        row["skipped"] = "not run from the main thread"
        return row
    with cpu_hogs(case.hogs):
        if case.thread == "main":
            trials = _run_trials(case, plan)
        else:
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="bench") as pool:
                try:
                    trials = pool.submit(_run_trials, case, plan).result()
                except ValueError as exc:
                    if not case.method.main_thread_only:
                        raise
                    row["error"] = f"ValueError: {exc}"
                    return row
    outcomes = [t.outcome for t in trials]
    row["trials"] = len(trials)
    for name in ("stopped", "abandoned", "not_interrupted", "returned"):
        row[name] = outcomes.count(name)
    samples = [round((t.exit.left_at - t.exit.deadline) * 1e3, 4) for t in trials]
    row["samples_ms"] = samples
    row["outcomes"] = outcomes
    row.update(percentiles(samples))
    ran_on = [(t.exit.work_ended_at - t.exit.deadline) * 1e3 for t in trials]
    if row["abandoned"]:
        row["work_ran_on_p50_ms"] = percentiles(ran_on)["p50_ms"]
    return row


def _ops_and_rounds(m: Method, plan: Plan) -> tuple[int, int]:
    if m.ops == CHEAP_OPS:
        return m.ops, plan.overhead_rounds
    return m.ops, plan.overhead_thread_rounds


def _time_rounds(blocks: Callable[[int], None], cleanup: Callable[[], None], ops: int,
                 rounds: int) -> dict[str, Any]:
    blocks(ops)  # warm-up
    cleanup()
    times = []
    for _ in range(rounds):
        t0 = _perf()
        blocks(ops)
        times.append(_perf() - t0)
        cleanup()
    return {
        "per_block_ns": round(statistics.median(times) / ops * 1e9, 1),
        "per_block_ns_min": round(min(times) / ops * 1e9, 1),
        "blocks_per_round": ops,
        "rounds": rounds,
    }


def _kernel_timer_pairs(n: int) -> None:
    from timeoutcore import _native

    _native.bench_timer_pair(n)


def overhead_cases() -> list[tuple[str, str, Method, Callable[[int], None]]]:
    """(key, title, method, run n blocks) for every overhead row, the baseline first."""
    rows: list[tuple[str, str, Method, Callable[[int], None]]] = [
        ("none", "no-op Python `with` (baseline)", NO_DEADLINE, NO_DEADLINE.empty_blocks),
        ("timeoutcore", f"timeoutcore `thread_deadline({NEVER:g})`", TIMEOUTCORE,
         TIMEOUTCORE.empty_blocks),
    ]

    def unbounded(n: int) -> None:
        for _ in range(n):
            with thread_deadline(None):
                pass

    rows.append(("timeoutcore_none", "timeoutcore `thread_deadline(None)`", TIMEOUTCORE,
                 unbounded))
    if ENGINE == "native":
        rows.append(("kernel_timer_pair",
                     "kernel timer arm+disarm (what arming at every entry would cost)",
                     TIMEOUTCORE, _kernel_timer_pairs))
    titles = {
        "signal.alarm": "signal.alarm recipe (signal + alarm + alarm(0) + restore)",
        "signal.setitimer": "signal.setitimer recipe (signal + setitimer x2 + restore)",
        "timer_async_exc": "threading.Timer + SetAsyncExc (create, start, cancel)",
        "stopit": "stopit.ThreadingTimeout",
        "func_timeout": "func_timeout (a thread per call)",
    }
    for m in METHODS[1:]:
        rows.append((m.key, titles.get(m.key, m.title), m, m.empty_blocks))
    return rows


def core_stats() -> dict[str, int]:
    """The native core's counters (timeoutcore._native.stats), or {} on the fallback engine."""
    if ENGINE != "native":
        return {}
    from timeoutcore import _native

    return _native.stats()


def run_overhead(plan: Plan, progress: Optional[Progress] = None) -> list[dict[str, Any]]:
    rows = []
    baseline: Optional[float] = None
    if ENGINE == "native":
        with thread_deadline(None):  # this thread's slot and kernel timer exist from here on
            pass
    for key, title, m, blocks in overhead_cases():
        row: dict[str, Any] = {"case": key, "method": m.key, "title": title}
        rows.append(row)
        missing = m.missing()
        if missing is not None:
            row["skipped"] = missing
            continue
        if progress:
            progress(f"overhead: {title}")
        ops, rounds = _ops_and_rounds(m, plan)
        try:
            row.update(_time_rounds(blocks, m.cleanup, ops, rounds))
        except ValueError as exc:  # a signal recipe outside the main thread
            row["error"] = f"ValueError: {exc}"
            continue
        if key == "none":
            baseline = row["per_block_ns"]
        if baseline:
            row["x_baseline"] = round(row["per_block_ns"] / baseline, 2)
    return rows


def _pool_rate(m: Method, tasks: int) -> float:
    """Tasks per second of a pool of POOL_WORKERS running ``tasks`` 1 ms tasks under ``m``."""

    def task() -> None:
        m.guard(NEVER, lambda: time.sleep(TASK_S))

    with ThreadPoolExecutor(max_workers=POOL_WORKERS, thread_name_prefix="bench") as pool:
        for f in [pool.submit(task) for _ in range(POOL_WORKERS * 2)]:  # warm-up
            f.result()
        t0 = _perf()
        for f in [pool.submit(task) for _ in range(tasks)]:
            f.result()
        return tasks / (_perf() - t0)


CPU_TASK_S = 0.002  # the CPU pool's task: a CPU loop this long ...
CPU_FIRE_EVERY = 4  # ... and every this many tasks runs under a deadline half as long
CPU_POOL_TASKS = 400  # a mode's tasks per throughput_reps


def _spin_counting(seconds: float, cell: list[int]) -> None:
    clock = _perf
    end = clock() + seconds
    for i in itertools.count():  # its own counter: cell gets this task's turns
        if not i & 63:
            cell[0] = i
            if clock() >= end:
                return


def _next_turn(n: int) -> int:
    # Two lines on purpose: a body on the def line runs no line event from 3.13, and this
    # stands for the usual function, which pays for its start and for its lines.
    m = n + 1
    return m


def _spin_calling(seconds: float, cell: list[int]) -> None:
    """_spin_counting with a call of a small Python function every turn: work made of
    calls, which pays for each function start the delivery hook watches while its events
    are on (every thread's, on 3.12+)."""
    clock = _perf
    end = clock() + seconds
    n = 0
    while True:
        n = _next_turn(n)
        if not n & 63:
            cell[0] = n
            if clock() >= end:
                return


POOL_PLAIN = "plain"  # the CPU pool's runs: every task its whole CPU_TASK_S, no deadline
POOL_SAME_WORK = "same work"  # no deadline; every CPU_FIRE_EVERY-th task stops itself half-way
POOL_DEADLINES = "deadlines"  # every task under a deadline; every CPU_FIRE_EVERY-th one fires


def _cpu_pool_task(mode: str, k: int, calls: bool = False) -> int:
    """Task ``k`` of the CPU pool in one of the modes above: its loop turns. POOL_DEADLINES
    puts it under a deadline, and every CPU_FIRE_EVERY-th one's fires half-way (the task
    stops there; the turns it did count); POOL_SAME_WORK stops those same tasks half-way
    without any deadline, so that it does the same work in the same task lengths. With
    ``calls``, the loop calls a Python function every turn (_spin_calling)."""
    cell = [0]
    short = k % CPU_FIRE_EVERY == 0
    spin = _spin_calling if calls else _spin_counting
    if mode == POOL_PLAIN:
        spin(CPU_TASK_S, cell)
    elif mode == POOL_SAME_WORK:
        spin(CPU_TASK_S / 2 if short else CPU_TASK_S, cell)
    else:
        try:
            with thread_deadline(CPU_TASK_S / 2 if short else NEVER):
                spin(CPU_TASK_S, cell)
        except DeadlineExceeded:
            pass
    return cell[0]


CPU_POOL_BATCH = 40  # tasks a mode runs in turn with the others (~70 ms)


def run_cpu_pool(plan: Plan, progress: Optional[Progress] = None,
                 calls: bool = False) -> dict[str, Any]:
    """The pool-throughput case under frequent deadlines: CPU work per second of 4
    CPU-bound workers without deadlines, with every 4th task's deadline firing, and doing
    that same work without deadlines (those tasks stop themselves half-way). One pool runs
    the modes in turn, CPU_POOL_BATCH tasks at a time (each mode first, second and third
    in turn), ``throughput_reps`` x CPU_POOL_TASKS tasks a mode in all; a mode's rate is
    its turns over its time. (Whole runs of CPU_POOL_TASKS a mode, alternated, measured the
    host's drift: this machine's interpreter speed swings +-10 % from one second to the
    next, and two runs without deadlines ranged 0.86-1.03x of each other.) ``x_no_deadline``
    compares with whole tasks; ``x_same_work`` with the same work, which tells the
    deadlines' own cost apart from that of shorter tasks (more task hand-offs a second in a
    pool that shares one GIL); ``x_same_work_q1``/``_q3``: the quartiles of that ratio
    over the rounds. ``calls``: the tasks' loop calls a Python function every turn."""
    modes = (POOL_PLAIN, POOL_DEADLINES, POOL_SAME_WORK)
    turns = dict.fromkeys(modes, 0)
    secs = dict.fromkeys(modes, 0.0)
    per_round: dict[str, list[float]] = {m: [] for m in modes}
    rounds = max(1, plan.throughput_reps * CPU_POOL_TASKS // CPU_POOL_BATCH)
    with ThreadPoolExecutor(max_workers=POOL_WORKERS, thread_name_prefix="bench") as pool:
        for f in [pool.submit(_cpu_pool_task, POOL_PLAIN, 1, calls)
                  for _ in range(POOL_WORKERS)]:
            f.result()  # warm-up
        for r in range(rounds):
            if progress and r % 10 == 0:
                progress(f"CPU pool under deadlines: round {r + 1} of {rounds}")
            for m in modes[r % 3:] + modes[:r % 3]:
                t0 = _perf()
                n = sum(f.result() for f in [pool.submit(_cpu_pool_task, m, k, calls)
                                             for k in range(CPU_POOL_BATCH)])
                dt = _perf() - t0
                turns[m] += n
                secs[m] += dt
                per_round[m].append(n / dt)
    base, same, with_deadlines = (turns[m] / secs[m] for m in
                                  (POOL_PLAIN, POOL_SAME_WORK, POOL_DEADLINES))
    ratios = sorted(d / w for d, w in zip(per_round[POOL_DEADLINES], per_round[POOL_SAME_WORK]))
    return {
        "workers": POOL_WORKERS,
        "task_s": CPU_TASK_S,
        "fire_every": CPU_FIRE_EVERY,
        "tasks_per_round": CPU_POOL_BATCH,
        "rounds": rounds,
        "plain_turns_per_s": round(base),
        "same_work_turns_per_s": round(same),
        "deadlines_turns_per_s": round(with_deadlines),
        "x_no_deadline": round(with_deadlines / base, 3),
        "x_same_work": round(with_deadlines / same, 3),
        "x_same_work_q1": round(ratios[len(ratios) // 4], 3),
        "x_same_work_q3": round(ratios[len(ratios) * 3 // 4], 3),
    }


PARALLEL_BLOCKS = 50_000  # blocks each thread runs in one parallel round


def never_firing_scope() -> ContextManager[Any]:
    """``thread_deadline(10)`` (NEVER): the parallel rounds' block. A module-level function
    with an int limit on purpose: on a free-threaded CPython a function made at run time (a
    lambda inside a function) and a float this module passes (NEVER, or a literal 10.0)
    have reference counts that every thread using them writes, and the threads would wait
    for those, not for the block (a small int is immortal)."""
    return thread_deadline(10)


def parallel_round(threads: int, make: Callable[[], ContextManager[Any]],
                   blocks: int = PARALLEL_BLOCKS) -> float:
    """Seconds of wall time for ``threads`` threads, started before the clock and released
    together, to run ``blocks`` empty ``with make():`` blocks each (``make``: a class or a
    module-level function, see never_firing_scope). Each thread enters one
    block of its own first (timeoutcore: its slot and kernel timer are made before the
    clock starts). On a free-threaded CPython the threads really run at once: with 2
    cores, perfect scaling halves the time per block from 1 to 2 threads."""
    start = threading.Barrier(threads + 1)

    def work() -> None:
        with thread_deadline(None):
            pass
        start.wait()
        for _ in range(blocks):
            with make():
                pass

    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    start.wait()
    t0 = _perf()
    for t in ts:
        t.join()
    return _perf() - t0


FLOOR_RUN_S = 2.0  # the floor case: how long the probe thread runs per hog level ...
FLOOR_SAMPLES = 4000  # ... and how many instants it is asked about
FLOOR_GAP_S = 50e-6  # a pause longer than this between two turns: the thread was not running


def _off_cpu_spans(seconds: float) -> list[tuple[float, float]]:
    """Spin for ``seconds`` in Python; the spans in which this thread ran no bytecode."""
    clock = time.monotonic
    spans: list[tuple[float, float]] = []
    end = clock() + seconds
    last = clock()
    while last < end:
        t = clock()
        if t - last > FLOOR_GAP_S:
            spans.append((last, t))
        last = t
    return spans


def run_floor(hogs: int, seconds: float = FLOOR_RUN_S, samples: int = FLOOR_SAMPLES,
              seed: int = 1) -> dict[str, Any]:
    """The physical limit of the contention case: a pool thread spins in Python next to
    ``hogs`` spinning threads and records when it was off the CPU (descheduled, or waiting
    for the GIL); for ``samples`` random instants, how long until it ran bytecode again
    (0 when it was running). No deadline can land before that moment, so the contention
    rows are read against this one. (With a GIL it depends on the switch interval, which
    the fast window lowers to 200 us: the probe runs at 200 us there too.)"""
    saved = sys.getswitchinterval()
    gil = bool(getattr(sys, "_is_gil_enabled", lambda: True)())
    if gil:
        sys.setswitchinterval(200e-6)
    try:
        with cpu_hogs(hogs), ThreadPoolExecutor(max_workers=1, thread_name_prefix="bench") as pool:
            spans = pool.submit(_off_cpu_spans, seconds).result()
    finally:
        sys.setswitchinterval(saved)
    rng = random.Random(seed)
    starts = [s for s, _ in spans]
    t0 = spans[0][0] if spans else 0.0
    t1 = spans[-1][1] if spans else 0.0
    waits = []
    for _ in range(samples):
        at = rng.uniform(t0, t1) if spans else 0.0
        i = bisect.bisect_right(starts, at) - 1
        inside = i >= 0 and spans[i][0] <= at < spans[i][1]
        waits.append(round((spans[i][1] - at) * 1e3, 4) if inside else 0.0)
    return {"hogs": hogs, "samples": samples, "off_cpu_spans": len(spans),
            "switch_interval_s": 200e-6 if gil else None, **percentiles(waits)}


def _settle_threads(timeout: float = 2.0) -> None:
    """Wait (briefly) for threads that are on their way out, e.g. cancelled timers."""
    end = _perf() + timeout
    for t in threading.enumerate():
        if isinstance(t, threading.Timer) or type(t).__module__.startswith("func_timeout"):
            t.join(max(0.0, end - _perf()))


def run_throughput(plan: Plan, progress: Optional[Progress] = None) -> list[dict[str, Any]]:
    """Pool throughput per method: the median of ``throughput_reps`` runs taken round-robin,
    so that a slow moment of a shared machine does not land on one method only."""
    rows: dict[str, dict[str, Any]] = {}
    runnable = []
    for m in (NO_DEADLINE, *METHODS):
        row: dict[str, Any] = {
            "method": m.key,
            "title": m.title,
            "workers": POOL_WORKERS,
            "task_s": TASK_S,
        }
        rows[m.key] = row
        missing = m.missing()
        if missing is not None:
            row["skipped"] = missing
        else:
            runnable.append(m)
    per_rep = max(POOL_WORKERS, plan.throughput_tasks // plan.throughput_reps)
    for rep in range(plan.throughput_reps):
        if progress:
            progress(f"throughput: run {rep + 1} of {plan.throughput_reps}")
        # Each run starts with another method, and threads the previous method left behind
        # (cancelled timers) are let go first: no method always follows the same one.
        shift = rep % len(runnable)
        for m in runnable[shift:] + runnable[:shift]:
            _settle_threads()
            row = rows[m.key]
            if "error" in row:
                continue
            try:
                rate = _pool_rate(m, per_rep)
            except ValueError as exc:  # a signal recipe in a pool worker
                row["error"] = f"ValueError: {exc}"
                continue
            row.setdefault("runs_tasks_per_s", []).append(round(rate, 1))
    base: Optional[float] = None
    for row in rows.values():
        runs = row.get("runs_tasks_per_s")
        if not runs or "error" in row:
            row.pop("runs_tasks_per_s", None)
            continue
        row["tasks"] = per_rep * len(runs)
        row["tasks_per_s"] = round(statistics.median(runs), 1)
        if base is None:
            base = row["tasks_per_s"]
        row["x_no_deadline"] = round(row["tasks_per_s"] / base, 3)
    return list(rows.values())


def _version_of(dist: str) -> Optional[str]:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 0
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "system": platform.system(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        "cpus": cpus,
        "loadavg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "engine": ENGINE,
        "switch_interval_s": sys.getswitchinterval(),
        "timeoutcore": __version__,
        "peers": {name: _version_of(name) for name in ("stopit", "func_timeout")},
    }


@dataclass
class _Counter:
    total: int
    done: int = 0
    progress: Optional[Progress] = None

    def step(self, what: str) -> None:
        self.done += 1
        if self.progress:
            self.progress(f"[{self.done}/{self.total}] overshoot: {what}")


def run(plan: Plan, progress: Optional[Progress] = None) -> dict[str, Any]:
    """Every figure of the comparison, as a dict of plain values (for orjson)."""
    t0 = _perf()
    env = environment()
    overhead = run_overhead(plan, progress)
    cases = overshoot_cases(plan)
    counter = _Counter(len(cases), progress=progress)
    overshoot = []
    for case in cases:
        counter.step(case.title)
        overshoot.append(run_case(case, plan))
    throughput = run_throughput(plan, progress)
    cpu_pool = run_cpu_pool(plan, progress)
    return {
        "schema": "timeoutcore-bench/1",
        "mode": plan.name,
        "environment": env,
        "methods": [
            {
                "key": m.key,
                "title": m.title,
                "optional": m.requires is not None,
                "available": m.missing() is None,
                "main_thread_only": m.main_thread_only,
            }
            for m in METHODS
        ],
        "overhead": overhead,
        "overshoot": overshoot,
        "throughput": throughput,
        "cpu_pool": cpu_pool,
        "elapsed_s": round(_perf() - t0, 1),
    }


# --- rendering ------------------------------------------------------------------------------


def _num(ms: float) -> str:
    if ms >= 100:
        return f"{ms:.0f}"
    if ms >= 10:
        return f"{ms:.1f}"
    if ms >= 1:
        return f"{ms:.2f}"
    return f"{ms:.3f}"


@dataclass
class _Notes:
    texts: list[str] = field(default_factory=list)

    def mark(self, text: str) -> str:
        if text not in self.texts:
            self.texts.append(text)
        return f"[{self.texts.index(text) + 1}]"

    def lines(self) -> list[str]:
        return [f"[{i}] {t}" for i, t in enumerate(self.texts, 1)]


_NOT_INTERRUPTED = (
    "not interrupted: the block was left only when the work ended by itself "
    f"({SLACK * 1e3:g} ms after the method should have fired)"
)
_ABANDONED = (
    "the caller is released at the deadline, but the call keeps running in an abandoned "
    "thread until it returns by itself"
)


def _cell(row: Optional[dict[str, Any]], notes: _Notes) -> str:
    if row is None:
        return "-"
    if "skipped" in row:
        return str(row["skipped"])
    if "error" in row:
        kind = str(row["error"]).split(":", 1)[0]
        return f"n/a: raises {kind} {notes.mark(str(row['error']))}"
    if row["not_interrupted"] == row["trials"]:
        return f"not interrupted {notes.mark(_NOT_INTERRUPTED)}"
    figures = " / ".join(_num(row[k]) for k in ("p50_ms", "p90_ms", "p99_ms"))
    text = f"{figures} ({row['trials']})"
    marks = []
    if row.get("note"):
        marks.append(notes.mark(row["note"]))
    if row["abandoned"]:
        marks.append(notes.mark(_ABANDONED))
    if row["not_interrupted"]:
        marks.append(notes.mark(f"{row['not_interrupted']} of {row['trials']} trials "
                                "not interrupted"))
    return " ".join([text, *marks])


def _table(
    header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]
) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        out = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)]
        return "| " + " | ".join(out) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if r else ("-" * (w + 2))
                          for w, r in zip(widths, right)) + "|"
    return [line(header), rule, *(line(r) for r in rows)]


Sections = dict[float, dict[tuple[str, int], list[dict[str, Any]]]]


def _sections(overshoot: Sequence[dict[str, Any]]) -> Sections:
    """Overshoot rows by deadline, then by (section, hogs), in the order they were run."""
    out: Sections = {}
    for r in overshoot:
        key = (r.get("section", r["workload"]), r["hogs"])
        out.setdefault(r["limit_s"], {}).setdefault(key, []).append(r)
    return dict(sorted(out.items()))


def _section_title(members: Sequence[dict[str, Any]], hogs: int) -> str:
    first = next((r for r in members if r["workload"] == r.get("section")), members[0])
    title = str(first["workload_title"])
    return title + (f", {hogs} other threads spinning" if hogs else "")


def describe_environment(env: dict[str, Any]) -> str:
    return (
        f"{env['implementation']} {env['python']}, {env['system']} {env['kernel']} "
        f"{env['machine']}, {env['cpus']} CPUs ({env['cpu_model']}), engine {env['engine']}, "
        f"switch interval {env['switch_interval_s'] * 1e3:g} ms"
    )


def render(results: dict[str, Any]) -> str:
    """The side-by-side tables (Markdown, readable as plain text)."""
    notes = _Notes()
    env = results["environment"]
    out = [
        f"timeoutcore bench ({results['mode']}): {describe_environment(env)}; "
        f"load {env['loadavg_1m']}; {results['elapsed_s']:g} s",
        "",
    ]
    rows = []
    for r in results["overhead"]:
        if "per_block_ns" in r:
            x = r.get("x_baseline")
            ratio = "-" if x is None else (f"{x:.2f}" if x < 10 else f"{x:,.0f}")
            rows.append([r["title"], f"{r['per_block_ns']:,.0f}", ratio])
        else:
            rows.append([r["title"], _cell(r, notes), ""])
    out += _table(["overhead of a block that does not time out (main thread)", "ns per block",
                   "x no-op with"], rows, [False, True, True])

    for limit, panels in _sections(results["overshoot"]).items():
        rows = []
        for (section, hogs), members in panels.items():
            title = _section_title(members, hogs)
            by_row: dict[str, dict[str, dict[str, Any]]] = {}
            for r in members:
                by_row.setdefault(r["row"], {})[r["thread"]] = r
            for i, (name, cells) in enumerate(by_row.items()):
                rows.append([
                    title if i == 0 else "",
                    name,
                    _cell(cells.get("main"), notes),
                    _cell(cells.get("worker"), notes),
                ])
        out += ["", f"overshoot past a {limit * 1e3:g} ms deadline, ms: p50 / p90 / p99 (trials)"]
        out += _table(["workload", "method", "main thread", "pool worker"], rows,
                      [False, False, False, False])

    rows = []
    for r in results["throughput"]:
        if "tasks_per_s" in r:
            rows.append([r["title"], f"{r['tasks_per_s']:,.0f}", f"{r['x_no_deadline']:.2f}"])
        else:
            rows.append([r["title"], _cell(r, notes), ""])
    out += [""]
    out += _table([f"thread pool, {POOL_WORKERS} workers, {TASK_S * 1e3:g} ms tasks (time.sleep)",
                   "tasks/s", "x no deadline"], rows, [False, True, True])
    cp = results.get("cpu_pool")
    if cp:
        out += ["", f"CPU-bound pool, {cp['workers']} workers, {cp['task_s'] * 1e3:g} ms tasks, "
                f"every {cp['fire_every']}th task's deadline fires: "
                f"{cp['deadlines_turns_per_s']:,} loop turns/s against {cp['plain_turns_per_s']:,} "
                f"without deadlines ({cp['x_no_deadline']:.3f}x); "
                f"{cp['same_work_turns_per_s']:,} doing the same work without deadlines "
                f"(those tasks stop themselves half-way: {cp['x_same_work']:.3f}x)"]
    if notes.texts:
        out += ["", *notes.lines()]
    return "\n".join(out) + "\n"


def plot(results: dict[str, Any], path: str) -> None:
    """A PNG of the overshoot distributions per method (log scale). Needs matplotlib."""
    matplotlib: Any = importlib.import_module("matplotlib")
    matplotlib.use("Agg")
    plt: Any = importlib.import_module("matplotlib.pyplot")

    panels = [
        (limit, key, [r for r in members if r.get("samples_ms")])
        for limit, sections in _sections(results["overshoot"]).items()
        for key, members in sections.items()
    ]
    panels = [p for p in panels if p[2]]
    ncols = min(3, max(1, len(panels)))
    nrows = max(1, math.ceil(len(panels) / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.0 * ncols, 3.6 * nrows), squeeze=False)
    colors = {"main": "tab:blue", "worker": "tab:orange"}
    floor = 1e-2  # ms: the axis starts here; smaller values are drawn on it
    top = max(max(r["samples_ms"]) for _, _, rows in panels for r in rows) if panels else 1.0
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (limit, (_, hogs), rows) in zip(axes.flat, panels):
        labels = list(dict.fromkeys(r["row"] for r in rows))
        for r in rows:
            y = labels.index(r["row"]) + (-0.15 if r["thread"] == "main" else 0.15)
            outcomes = r.get("outcomes") or ["stopped"] * len(r["samples_ms"])
            points = [(max(v, floor), y + 0.16 * ((i * 0.618) % 1 - 0.5), o == "stopped")
                      for i, (v, o) in enumerate(zip(r["samples_ms"], outcomes))]
            for stopped in (True, False):
                xy = [(x, yy) for x, yy, s in points if s is stopped]
                if xy:
                    ax.scatter([p[0] for p in xy], [p[1] for p in xy], s=9, alpha=0.6,
                               color=colors[r["thread"]], marker="o" if stopped else "x")
            ax.plot([max(r["p50_ms"], floor)] * 2, [y - 0.13, y + 0.13], color="black", lw=1.2)
        ax.set_xscale("log")
        ax.set_xlim(floor, top * 2)
        ax.set_ylim(len(labels) - 0.5, -0.5)
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels, fontsize=8)
        ax.set_title(f"{limit * 1e3:g} ms deadline: {_section_title(rows, hogs)}", fontsize=9)
        ax.set_xlabel("overshoot past the deadline, ms (log)", fontsize=8)
        ax.grid(True, axis="x", which="major", alpha=0.3)
    handles = [plt.Line2D([], [], color=c, marker="o", ls="", label=f"{t} thread" if t == "main"
                          else "pool worker") for t, c in colors.items()]
    handles.append(plt.Line2D([], [], color="gray", marker="x", ls="",
                              label="not stopped: ran to its end, or left running"))
    handles.append(plt.Line2D([], [], color="black", lw=1.2, label="p50"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8)
    fig.suptitle(f"timeoutcore bench ({results['mode']}): "
                 f"{describe_environment(results['environment'])}", fontsize=9)
    fig.tight_layout(rect=(0, 0.05, 1, 0.96))
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)
