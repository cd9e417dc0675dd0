"""``python -m timeoutcore bench``: a compact comparison that ships with the package.

It answers, on the user's own machine and interpreter, the questions a user asks before
choosing: what does a block cost when it does not time out, how late does a deadline stop
the work, in the main thread and in a pool worker, next to the recipes people use today --
``signal.alarm`` and ``signal.setitimer`` (main thread only) and a ``threading.Timer`` that
raises into the thread with ``PyThreadState_SetAsyncExc`` -- and how late in a pool whose
every worker is busy. The full harness (more workloads, deadlines, peers, contention
sweeps) is ``benchmarks/harness.py`` of a source checkout (``bench --full``).

The yardstick is the same for every method: the overshoot is ``perf_counter()`` where the
method's exception was caught minus (``perf_counter()`` just before arming + the limit).
Every workload ends by itself ``SLACK`` after the method should have fired, so nothing can
hang: a run that ended only then was *not interrupted*.

:func:`run` returns plain values (``--json`` writes them); :func:`render` makes the text
tables, :func:`plot` a PNG (matplotlib, the ``plot`` extra).
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime as _dt
import functools
import importlib
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Optional, Sequence

from . import ENGINE, DeadlineExceeded, __version__, cli, thread_deadline
from . import sleep as tc_sleep

Work = Callable[[], object]
Progress = Callable[[str], None]

SCHEMA = "timeoutcore-bench-compact/1"
LIMIT = 0.05  # seconds: the deadline of every overshoot case
NEVER = 10.0  # seconds: a limit that never fires (overhead)
SLACK = 0.25  # seconds a workload runs on after its method should have fired
POOL_WORKERS = 4  # the busy pool: this many workers, every one running an overrunning task
_perf = time.perf_counter


@dataclass(frozen=True)
class Plan:
    """How many trials a run makes: ``QUICK`` (``--quick``: its budget is 15 s at most) or
    ``STANDARD`` (the default: under a minute)."""

    name: str
    trials: int  # per overshoot case that stops at the deadline ...
    slow_trials: int  # ... and per case that does not (not interrupted, alarm's whole second)
    overhead_rounds: int
    pool_rounds: int  # rounds of POOL_WORKERS tasks per method in the busy pool


QUICK = Plan("quick", trials=8, slow_trials=1, overhead_rounds=7, pool_rounds=3)
STANDARD = Plan("standard", trials=40, slow_trials=3, overhead_rounds=25, pool_rounds=15)


# --- the methods: each runs ``work`` under ``limit`` and says how the run ended ------------


class RecipeTimeout(Exception):
    """What the recipes (signal.alarm, setitimer, Timer+SetAsyncExc) raise at their deadline."""


def _raise_recipe_timeout(signum: int, frame: Optional[FrameType]) -> None:
    raise RecipeTimeout


# A prototype of our own: setting argtypes on ``ctypes.pythonapi``'s shared function object
# would change it for every other user in the process.
set_async_exc = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.py_object)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi)
)


@dataclass(frozen=True)
class Run:
    """One guarded run, in ``perf_counter()`` seconds."""

    deadline: float  # arming time + limit
    left_at: float  # the caller got control back
    raised: bool  # the method reported a timeout


@dataclass(frozen=True)
class Method:
    """A way to put a time limit on a block of code, and what the tables say about it."""

    key: str
    title: str
    guard: Callable[[float, Work], Run]
    empty_blocks: Callable[[int], None]  # n blocks with an empty body, a limit that never fires
    main_thread_only: bool = False
    fires_after: Callable[[float], float] = float  # when it really fires for a limit
    note: str = ""
    sleep: Callable[[float], None] = time.sleep  # the sleep a user of this method calls
    blocks_per_round: int = 1000  # overhead: fewer for methods that start a thread per block


def _timeoutcore_guard(limit: float, work: Work) -> Run:
    scope = thread_deadline(limit)
    t0 = _perf()
    try:
        with scope:
            work()
    except DeadlineExceeded:
        return Run(t0 + limit, _perf(), True)
    return Run(t0 + limit, _perf(), False)


def _timeoutcore_blocks(n: int) -> None:
    for _ in range(n):
        with thread_deadline(NEVER):
            pass


def _signal_guard(arm: Callable[[float], None], disarm: Callable[[], None]) -> Callable[
        [float, Work], Run]:
    def guard(limit: float, work: Work) -> Run:
        old = signal.signal(signal.SIGALRM, _raise_recipe_timeout)
        t0 = _perf()
        try:
            try:
                arm(limit)
                work()
            finally:  # a signal that comes while disarming is caught below, as a timeout
                disarm()
        except RecipeTimeout:
            return Run(t0 + limit, _perf(), True)
        finally:
            signal.signal(signal.SIGALRM, old)
        return Run(t0 + limit, _perf(), False)

    return guard


def _signal_blocks(arm: Callable[[float], None], disarm: Callable[[], None]) -> Callable[
        [int], None]:
    def blocks(n: int) -> None:
        for _ in range(n):
            old = signal.signal(signal.SIGALRM, _raise_recipe_timeout)
            arm(NEVER)
            try:
                pass
            finally:
                disarm()
                signal.signal(signal.SIGALRM, old)

    return blocks


def _alarm_arm(limit: float) -> None:
    signal.alarm(math.ceil(limit))  # the classic recipe: alarm() takes whole seconds


def _alarm_disarm() -> None:
    signal.alarm(0)


def _itimer_arm(limit: float) -> None:
    signal.setitimer(signal.ITIMER_REAL, limit)


def _itimer_disarm() -> None:
    signal.setitimer(signal.ITIMER_REAL, 0)


def _tick() -> None:
    """A function call: where a pending asynchronous exception surfaces at the latest."""


def _timer_guard(limit: float, work: Work) -> Run:
    ident = threading.get_ident()
    timer = threading.Timer(limit, set_async_exc, args=(ident, RecipeTimeout))
    t0 = _perf()
    try:
        try:
            timer.start()  # inside: on a busy machine it can fire before start() returns
            work()
        finally:
            # The recipe's race: the timer may have raised into this thread just after the
            # work ended. Joined, its exception is pending and surfaces at the next call,
            # inside this try, and counts as the timeout it is.
            timer.cancel()
            timer.join()
            _tick()
    except RecipeTimeout:
        return Run(t0 + limit, _perf(), True)
    return Run(t0 + limit, _perf(), False)


def _timer_blocks(n: int) -> None:
    ident = threading.get_ident()
    started = []
    for _ in range(n):
        timer = threading.Timer(NEVER, set_async_exc, args=(ident, RecipeTimeout))
        timer.start()
        try:
            pass
        finally:
            timer.cancel()
        started.append(timer)
    for timer in started:  # counted: a recipe's block is not over while its thread lives
        timer.join()


def _noop_blocks(n: int) -> None:
    for _ in range(n):
        with contextlib.nullcontext():
            pass


TIMEOUTCORE = Method("timeoutcore", "timeoutcore", _timeoutcore_guard, _timeoutcore_blocks,
                     sleep=tc_sleep)
ALARM = Method("signal.alarm", "signal.alarm", _signal_guard(_alarm_arm, _alarm_disarm),
               _signal_blocks(_alarm_arm, _alarm_disarm), main_thread_only=True,
               fires_after=lambda limit: float(math.ceil(limit)),
               note=f"signal.alarm takes whole seconds: a {LIMIT * 1e3:g} ms deadline fires "
               f"after {math.ceil(LIMIT)} s")
SETITIMER = Method("signal.setitimer", "signal.setitimer",
                   _signal_guard(_itimer_arm, _itimer_disarm),
                   _signal_blocks(_itimer_arm, _itimer_disarm), main_thread_only=True)
TIMER = Method("timer_async_exc", "Timer+SetAsyncExc", _timer_guard, _timer_blocks,
               blocks_per_round=50)
METHODS: tuple[Method, ...] = (TIMEOUTCORE, ALARM, SETITIMER, TIMER)


# --- workloads: each ends by itself ``seconds`` after it started ------------------------
#
# The workload functions live in timeoutcore.cli, the one module of the package that is not
# protected code (timeoutcore.protect.DEFAULT_EXEMPT): they stand for the user's code, and a
# deadline must reach them as it reaches that. A frame of this module between the work and
# the scope's ``with`` would hold the interrupt back to the work's end; so the work is a
# functools.partial (no Python frame of its own), never a lambda or closure defined here.


@dataclass(frozen=True)
class Workload:
    """Work that ends by itself: ``work(method, seconds)`` makes it for one run."""

    key: str
    title: str
    work: Callable[[Method, float], Work]  # (method, seconds) -> the work


WORKLOADS: tuple[Workload, ...] = (
    Workload("cpu", "CPU loop", lambda m, seconds: functools.partial(cli.cpu_loop, seconds)),
    Workload("sleep", "sleep",  # timeoutcore.sleep under timeoutcore, else time.sleep
             lambda m, seconds: functools.partial(m.sleep, seconds)),
    Workload("c_call", "blocking read()",
             lambda m, seconds: functools.partial(cli.blocking_read, seconds)),
)


# --- running --------------------------------------------------------------------------------


def _trial(m: Method, w: Workload) -> tuple[float, str]:
    """One guarded run of ``w`` under ``m``: (overshoot in ms, outcome)."""
    seconds = m.fires_after(LIMIT) + SLACK
    ends_at = _perf() + seconds
    r = m.guard(LIMIT, w.work(m, seconds))
    if r.left_at >= ends_at:
        outcome = "not_interrupted"
    else:
        outcome = "stopped" if r.raised else "returned"
    return round((r.left_at - r.deadline) * 1e3, 4), outcome


def _trials(m: Method, w: Workload, plan: Plan) -> list[tuple[float, str]]:
    """``plan.trials`` runs where the first one stopped at the deadline, else (a run that
    lasts the whole work, or alarm's whole second) ``plan.slow_trials``."""
    first = _trial(m, w)
    quick = first[1] == "stopped" and m.fires_after(LIMIT) == LIMIT
    n = plan.trials if quick else plan.slow_trials
    return [first] + [_trial(m, w) for _ in range(n - 1)]


def figures(samples_ms: Sequence[float]) -> dict[str, float]:
    """p50, p90 and the maximum of ``samples_ms`` (inclusive quantiles)."""
    ms = sorted(samples_ms)
    if len(ms) == 1:
        p50 = p90 = ms[0]
    else:
        q = statistics.quantiles(ms, n=10, method="inclusive")
        p50, p90 = q[4], q[8]
    return {"p50_ms": round(p50, 4), "p90_ms": round(p90, 4), "max_ms": round(ms[-1], 4)}


def _row(results: list[tuple[float, str]]) -> dict[str, Any]:
    samples = [s for s, _ in results]
    outcomes = [o for _, o in results]
    row: dict[str, Any] = {"trials": len(results)}
    for name in ("stopped", "not_interrupted", "returned"):
        row[name] = outcomes.count(name)
    row.update(samples_ms=samples, outcomes=outcomes, **figures(samples))
    return row


def run_overshoot(plan: Plan, progress: Optional[Progress] = None) -> list[dict[str, Any]]:
    """Every workload under every method, in the main thread and in a pool worker."""
    rows = []
    in_main = threading.current_thread() is threading.main_thread()
    for w in WORKLOADS:
        for m in METHODS:
            for where in ("main", "worker"):
                row: dict[str, Any] = {"method": m.key, "title": m.title, "workload": w.key,
                                       "workload_title": w.title, "thread": where,
                                       "limit_s": LIMIT, "note": m.note or None}
                rows.append(row)
                if progress:
                    progress(f"overshoot: {w.title}, {m.title}, {where}")
                if where == "main":
                    if not in_main:
                        row["skipped"] = "not run from the main thread"
                        continue
                    row.update(_row(_trials(m, w, plan)))
                    continue
                with ThreadPoolExecutor(1, thread_name_prefix="bench") as pool:
                    try:
                        row.update(_row(pool.submit(_trials, m, w, plan).result()))
                    except ValueError as exc:  # a signal recipe outside the main thread
                        if not m.main_thread_only:
                            raise
                        row["error"] = f"ValueError: {exc}"
    return rows


def run_busy_pool(plan: Plan, progress: Optional[Progress] = None) -> list[dict[str, Any]]:
    """A pool of POOL_WORKERS threads, every one running a CPU loop past its deadline at the
    same time: how late each task is stopped when every worker competes for the CPU (and,
    with a GIL, for the GIL). The methods that work in a pool thread only."""
    rows = []
    cpu = WORKLOADS[0]
    for m in METHODS:
        if m.main_thread_only:
            continue
        if progress:
            progress(f"busy pool: {m.title}")
        with ThreadPoolExecutor(POOL_WORKERS, thread_name_prefix="bench") as pool:
            results = [f.result() for f in [pool.submit(_trial, m, cpu)
                                            for _ in range(POOL_WORKERS * plan.pool_rounds)]]
        rows.append({"method": m.key, "title": m.title, "workers": POOL_WORKERS,
                     "limit_s": LIMIT, **_row(results)})
    return rows


def run_overhead(plan: Plan, progress: Optional[Progress] = None) -> list[dict[str, Any]]:
    """ns per block that does not time out, in this thread: the median of ``overhead_rounds``
    rounds, each of a method's ``blocks_per_round`` blocks (loop included, the same for every
    method); the no-op ``with`` is the baseline."""
    cases: list[tuple[str, str, Callable[[int], None], int, bool]] = [
        ("none", "no-op `with` (baseline)", _noop_blocks, 1000, False),
        *((m.key, m.title, m.empty_blocks, m.blocks_per_round, m.main_thread_only)
          for m in METHODS),
    ]
    in_main = threading.current_thread() is threading.main_thread()
    rows = []
    baseline = None
    for key, title, blocks, n, main_only in cases:
        row: dict[str, Any] = {"method": key, "title": title}
        rows.append(row)
        if main_only and not in_main:
            row["skipped"] = "not run from the main thread"
            continue
        if progress:
            progress(f"overhead: {title}")
        blocks(n)  # warm-up
        times = []
        for _ in range(plan.overhead_rounds):
            t0 = _perf()
            blocks(n)
            times.append(_perf() - t0)
        row["per_block_ns"] = round(statistics.median(times) / n * 1e9, 1)
        row["blocks"] = n
        row["rounds"] = plan.overhead_rounds
        if baseline is None:
            baseline = row["per_block_ns"]
        row["x_baseline"] = round(row["per_block_ns"] / baseline, 2)
    return rows


def cpu_model() -> Optional[str]:
    """The CPU's model name (/proc/cpuinfo, else the platform module), or None."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _commit() -> Optional[str]:
    """The git commit of the source checkout this package runs from, if it does (an
    editable install, ``python -m`` in a checkout); None for an installed wheel."""
    checkout = Path(__file__).resolve().parent.parent
    if not (checkout / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"],
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and len(commit) == 40 else None


def environment() -> dict[str, Any]:
    """Where the figures come from: date, host, CPUs, interpreter, engine, version, commit."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no sched_getaffinity (macOS)
        cpus = os.cpu_count() or 0
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": cpus,
        "cpu_model": cpu_model(),
        "system": platform.system(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "implementation": platform.python_implementation(),
        "python": platform.python_version(),
        "gil": bool(getattr(sys, "_is_gil_enabled", lambda: True)()),
        "switch_interval_s": sys.getswitchinterval(),
        "engine": ENGINE,
        "timeoutcore": __version__,
        "commit": _commit(),
        "loadavg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }


def run(plan: Plan, progress: Optional[Progress] = None) -> dict[str, Any]:
    """Every figure, as plain values (``--json``); signal recipes measured only when called
    from the main thread."""
    t0 = _perf()
    env = environment()
    overhead = run_overhead(plan, progress)
    overshoot = run_overshoot(plan, progress)
    pool = run_busy_pool(plan, progress)
    return {
        "schema": SCHEMA,
        "mode": plan.name,
        "environment": env,
        "slack_s": SLACK,
        "overhead": overhead,
        "overshoot": overshoot,
        "busy_pool": pool,
        "elapsed_s": round(_perf() - t0, 1),
    }


# --- the tables -----------------------------------------------------------------------------


def _num(ms: float) -> str:
    for bound, fmt in ((100, "{:.0f}"), (10, "{:.1f}"), (1, "{:.2f}")):
        if abs(ms) >= bound:
            return fmt.format(ms)
    return f"{ms:.3f}"


class _Notes:
    """Footnotes: a text gets a number the first time a cell refers to it."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def mark(self, text: str) -> str:
        if text not in self.texts:
            self.texts.append(text)
        return f"[{self.texts.index(text) + 1}]"


def _cell(row: Optional[dict[str, Any]], notes: _Notes, slack_s: float) -> str:
    if row is None:
        return "-"
    if "skipped" in row:
        return str(row["skipped"])
    if "error" in row:
        return f"n/a: raises {str(row['error']).split(':')[0]} {notes.mark(row['error'])}"
    if row["not_interrupted"] == row["trials"]:
        return "not interrupted " + notes.mark(
            "not interrupted: the block ended only when the work did, "
            f"{slack_s * 1e3:g} ms after the deadline")
    text = " / ".join(_num(row[k]) for k in ("p50_ms", "p90_ms", "max_ms"))
    text += f" ({row['trials']})"
    if row.get("note"):
        text += " " + notes.mark(row["note"])
    if row["not_interrupted"]:
        text += " " + notes.mark("some trials were not interrupted")
    return text


def _table(header: Sequence[str], rows: Sequence[Sequence[str]],
           right: Sequence[bool]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if r else c.ljust(w)
                         for c, w, r in zip(cells, widths, right)).rstrip()

    return [line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def describe(env: dict[str, Any]) -> str:
    """One line: interpreter, platform, CPUs, engine, date."""
    gil = "" if env.get("gil", True) else " (free-threaded)"
    return (f"{env['implementation']} {env['python']}{gil}, {env['system']} {env['machine']}, "
            f"{env['cpus']} CPUs, engine {env['engine']}, {env['date']}")


def render(results: dict[str, Any]) -> str:
    """The tables as plain text."""
    notes = _Notes()
    slack = float(results.get("slack_s", SLACK))
    limit_ms = f"{LIMIT * 1e3:g} ms"
    out = [f"timeoutcore bench ({results['mode']}): {describe(results['environment'])}; "
           f"{results['elapsed_s']:g} s", ""]

    rows = []
    for r in results["overhead"]:
        if "per_block_ns" in r:
            rows.append([r["title"], f"{r['per_block_ns']:,.0f}", f"{r['x_baseline']:,.1f}"])
        else:
            rows.append([r["title"], str(r.get("skipped", "-")), ""])
    out += ["Overhead of a block that does not time out (main thread)"]
    out += _table(["method", "ns/block", "x no-op"], rows, [False, True, True])

    rows = []
    for w in dict.fromkeys(r["workload_title"] for r in results["overshoot"]):
        members = [r for r in results["overshoot"] if r["workload_title"] == w]
        for i, title in enumerate(dict.fromkeys(r["title"] for r in members)):
            cells = {r["thread"]: r for r in members if r["title"] == title}
            rows.append([w if i == 0 else "", title, _cell(cells.get("main"), notes, slack),
                         _cell(cells.get("worker"), notes, slack)])
    out += ["", f"Overshoot past a {limit_ms} deadline, ms: p50 / p90 / max (trials)"]
    out += _table(["workload", "method", "main thread", "pool worker"], rows, [False] * 4)
    out += ["(sleep: timeoutcore.sleep under timeoutcore, time.sleep under the recipes)"]

    rows = [[r["title"], _cell(r, notes, slack)] for r in results["busy_pool"]]
    workers = results["busy_pool"][0]["workers"] if results["busy_pool"] else POOL_WORKERS
    out += ["", f"Busy pool: {workers} workers, each running a CPU loop past its {limit_ms} "
            "deadline at the same time; ms late: p50 / p90 / max (tasks)"]
    out += _table(["method", "overshoot"], rows, [False, False])
    if notes.texts:
        out += [""] + [f"[{i}] {t}" for i, t in enumerate(notes.texts, 1)]
    return "\n".join(out) + "\n"


# --- the plot -------------------------------------------------------------------------------


def plot(results: dict[str, Any], path: str) -> None:
    """A PNG: every overshoot sample per method and thread, one panel per workload and one
    for the busy pool (log scale; x: not interrupted). Needs matplotlib (ImportError)."""
    matplotlib: Any = importlib.import_module("matplotlib")
    matplotlib.use("Agg")  # no display needed; a file only
    plt: Any = importlib.import_module("matplotlib.pyplot")

    panels: list[tuple[str, list[tuple[str, dict[str, Any]]]]] = []
    for w in dict.fromkeys(r["workload_title"] for r in results["overshoot"]):
        panels.append((w, [(f"{r['title']}, {'main' if r['thread'] == 'main' else 'worker'}", r)
                           for r in results["overshoot"]
                           if r["workload_title"] == w and r.get("samples_ms")]))
    panels.append(("busy pool (every worker overruns)",
                   [(r["title"], r) for r in results["busy_pool"] if r.get("samples_ms")]))
    panels = [p for p in panels if p[1]]
    floor = 1e-2  # ms: the axis starts here; smaller values (and early exits) sit on it
    top = max((max(r["samples_ms"]) for _, rows in panels for _, r in rows), default=1.0)
    heights = [len(rows) + 1.5 for _, rows in panels]  # a row is a row's height everywhere
    fig, axes = plt.subplots(len(panels), 1, figsize=(8.0, 0.8 + 0.36 * sum(heights)),
                             squeeze=False, gridspec_kw={"height_ratios": heights})
    for ax, (title, rows) in zip(axes[:, 0], panels):
        for y, (_, r) in enumerate(rows):
            outcomes = r.get("outcomes") or ["stopped"] * len(r["samples_ms"])
            for stopped, marker in ((True, "o"), (False, "x")):
                xs = [max(v, floor) for v, o in zip(r["samples_ms"], outcomes)
                      if (o == "stopped") is stopped]
                jitter = [y + 0.3 * ((i * 0.618) % 1 - 0.5) for i in range(len(xs))]
                if xs:
                    ax.scatter(xs, jitter, s=10, alpha=0.6, marker=marker,
                               color="tab:blue" if stopped else "tab:red")
            ax.plot([max(r["p50_ms"], floor)] * 2, [y - 0.3, y + 0.3], color="black", lw=1.2)
        ax.set_xscale("log")
        ax.set_xlim(floor, top * 2)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([label for label, _ in rows], fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.grid(True, axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel(f"overshoot past a {LIMIT * 1e3:g} ms deadline, ms (log); "
                           "black: p50; red x: not interrupted", fontsize=8)
    fig.suptitle(f"timeoutcore bench ({results['mode']}): {describe(results['environment'])}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)


__all__ = ["QUICK", "STANDARD", "Plan", "RecipeTimeout", "cpu_model", "environment", "plot",
           "render", "run", "set_async_exc"]
