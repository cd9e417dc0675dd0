"""From each trigger to the exception, per wait kind, in a worker thread with ``patch()``.

Group ``trigger``: each trial enters a 4 s scope (``soft_limit=0.05, soft_raise=True`` for the
soft trigger; a 0.05 s scope for the hard one), waits in ``<kind>``, and the trigger comes at
50 ms: the hard deadline, the soft limit, ``cancel()`` or ``reschedule(now)`` from another
thread. The figure is the moment the exception is caught minus the trigger's moment
(``p50_ms``/``p99_ms``); subprocess kinds include killing and reaping the child.

Group ``overhead``: a patched call outside any scope against the original, same run
(``Event.wait(0)``, ``select`` with timeout 0): what the one-rule waits add there (nothing
but the ``remaining() is None`` test, as before).

    python -m pytest benchmarks/bench_triggers.py --benchmark-only
"""

from __future__ import annotations

import select
import socket
import statistics
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import pytest
from conftest import record_per_op
from pytest_benchmark.fixture import BenchmarkFixture

import timeoutcore
from timeoutcore.blocking import original

TRIALS = 30
AT = 0.05


_PAIR = socket.socketpair()  # the peer stays open (and silent) for the whole run


def _kinds() -> dict[str, Callable[[], Any]]:
    a = _PAIR[0]
    return {
        "time.sleep": lambda: time.sleep(10),
        "Event.wait": lambda: threading.Event().wait(10),
        "socket.recv": lambda: a.recv(1),
        "select.select": lambda: select.select([a], [], [], 10),
        "Popen.wait": lambda: subprocess.Popen(["sleep", "10"]).wait(),
        "subprocess.run": lambda: subprocess.run(["sleep", "10"]),
        "timeoutcore.run": lambda: timeoutcore.run(["sleep", "10"], limit=10),
    }


def _trial(kind: Callable[[], Any], trigger: str) -> float:
    soft = {"soft_limit": AT, "soft_raise": True} if trigger == "soft" else {}
    scope = timeoutcore.thread_deadline(AT if trigger == "hard" else 4.0, **soft)
    start = time.monotonic()
    timer = None
    if trigger == "cancel":
        timer = threading.Timer(AT, scope.cancel)
    elif trigger == "reschedule":
        timer = threading.Timer(AT, lambda: scope.reschedule(time.monotonic()))
    try:
        with scope:
            if timer is not None:
                timer.start()
            try:
                kind()
            except timeoutcore.SoftDeadlineExceeded:
                pass
    except timeoutcore.DeadlineExceeded:
        pass
    return time.monotonic() - (start + AT)


def _quantiles(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    q = statistics.quantiles(xs, n=100)
    return {"p50_ms": round(statistics.median(xs) * 1e3, 3), "p90_ms": round(q[89] * 1e3, 3),
            "p99_ms": round(q[98] * 1e3, 3), "max_ms": round(xs[-1] * 1e3, 3),
            "trials": len(xs)}


@pytest.fixture(scope="module", autouse=True)
def _patched() -> Any:
    timeoutcore.patch()
    yield
    timeoutcore.unpatch()


@pytest.mark.benchmark(group="trigger")
@pytest.mark.parametrize("trigger", ["hard", "soft", "cancel", "reschedule"])
@pytest.mark.parametrize("name", list(_kinds()))
def test_trigger_latency(benchmark: BenchmarkFixture, name: str, trigger: str) -> None:
    kind = _kinds()[name]
    lat: list[float] = []
    with ThreadPoolExecutor(1) as pool:
        def run() -> None:
            lat.append(pool.submit(_trial, kind, trigger).result())
        benchmark.pedantic(run, rounds=TRIALS, iterations=1)
    benchmark.extra_info.update(_quantiles(lat), case=f"{name} <- {trigger}")


@pytest.mark.benchmark(group="overhead")
@pytest.mark.parametrize("which", ["original", "patched"])
@pytest.mark.parametrize("call", ["Event.wait(0)", "select(0)"])
def test_outside_scope_cost(benchmark: BenchmarkFixture, call: str, which: str) -> None:
    ev = threading.Event()
    a, _b = socket.socketpair()
    if call == "Event.wait(0)":
        cond = ev._cond  # type: ignore[attr-defined]
        wait = original(threading.Condition.wait) if which == "original" else type(cond).wait

        def once() -> None:
            with cond:
                wait(cond, 0)
    else:
        sel = original(select.select) if which == "original" else select.select

        def once() -> None:
            sel([a], [], [], 0)
    n = 1000

    def batch() -> None:
        for _ in range(n):
            once()
    benchmark.pedantic(batch, rounds=30, iterations=1)
    record_per_op(benchmark, f"{call} outside a scope, {which}", n,
                  baseline=which == "original")
