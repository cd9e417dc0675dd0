"""Blocking calls in a worker thread with ``timeoutcore.patch()``: how late does a 50 ms
deadline stop them, and what does a patched call cost outside any scope?

Overshoot (group ``overshoot``): each trial runs ``with thread_deadline(0.05): <call>`` in a
worker thread, where ``<call>`` would block for much longer (a silent socket, an empty pipe,
an unset event, ``sleep 30`` ...); the figure is ``scope.overshoot`` (the moment the block is
left minus the deadline), measured by the core. For subprocess calls it includes killing and
reaping the scope-owned child. Where the classic recipes are installed (``stopit``,
``func_timeout``) a few rows show them on the same calls; a call they cannot interrupt is
released by a rescue after ``RESCUE_AFTER`` seconds, so their rows read about 450 ms.

Overhead (group ``overhead``): per-call cost outside any scope, original vs patched, in the
main thread, on calls that return at once (``time.sleep(0)``, ``select`` with timeout 0,
``Event.wait(0)`` ...). ``added_ns`` is the patched median minus the original's.

    python -m pytest benchmarks/bench_blocking.py --benchmark-only
"""

from __future__ import annotations

import contextlib
import errno
import os
import queue
import select
import selectors
import socket
import statistics
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, ContextManager, Optional, Sequence

import pytest
from conftest import record_per_op
from pytest_benchmark.fixture import BenchmarkFixture

import timeoutcore
from timeoutcore import DeadlineExceeded, thread_deadline
from timeoutcore.blocking import acquire, wait_readable
from timeoutcore.patch import patch, unpatch
from timeoutcore.subprocess import run as tc_run

LIMIT = 0.05
TRIALS = 60
PROC_TRIALS = 30  # cases that start a process per trial
SLOW_TRIALS = 3  # recipes that cannot interrupt the call: ~0.5 s per trial
RESCUE_AFTER = 0.5
OPS = 2000
ROUNDS = 40

Work = Callable[[], object]
Workload = Callable[[], ContextManager[Work]]


# --- workloads: each yields a call that blocks far past the deadline -------------------------


@contextlib.contextmanager
def _sockpair(timeout: Optional[float] = None) -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    a.settimeout(timeout)
    with a, b:
        yield a, b


@contextlib.contextmanager
def w_time_sleep() -> Iterator[Work]:
    yield lambda: time.sleep(1.0)


@contextlib.contextmanager
def w_recv() -> Iterator[Work]:
    with _sockpair() as (a, _):
        yield lambda: a.recv(1)


@contextlib.contextmanager
def w_recv_timeout() -> Iterator[Work]:
    with _sockpair(30.0) as (a, _):
        yield lambda: a.recv(1)


_PAYLOAD = b"x" * 8_000_000  # far more than a socket buffer; allocated once, outside scopes


@contextlib.contextmanager
def w_sendall() -> Iterator[Work]:
    with _sockpair() as (a, b):
        yield lambda: a.sendall(_PAYLOAD)


@contextlib.contextmanager
def w_accept() -> Iterator[Work]:
    srv = socket.create_server(("127.0.0.1", 0))
    with srv:
        yield srv.accept


@contextlib.contextmanager
def w_connect() -> Iterator[Work]:
    """A listener with a full backlog: the kernel does not complete new handshakes."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    addr = srv.getsockname()
    fillers = []
    for _ in range(8):
        s = socket.socket()
        s.setblocking(False)
        if s.connect_ex(addr) not in (0, errno.EINPROGRESS):
            s.close()
            break
        fillers.append(s)

    def connect() -> None:
        with socket.socket() as c:
            c.connect(addr)

    try:
        yield connect
    finally:
        for s in fillers:
            s.close()
        srv.close()


@contextlib.contextmanager
def _pipe() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    try:
        yield r, w
    finally:
        os.close(r)
        os.close(w)


@contextlib.contextmanager
def w_select() -> Iterator[Work]:
    with _pipe() as (r, _):
        yield lambda: select.select([r], [], [])


@contextlib.contextmanager
def w_poll() -> Iterator[Work]:
    with _pipe() as (r, _):
        p = select.poll()
        p.register(r, select.POLLIN)
        yield p.poll


@contextlib.contextmanager
def w_selector() -> Iterator[Work]:
    with _pipe() as (r, _), selectors.DefaultSelector() as sel:
        sel.register(r, selectors.EVENT_READ)
        yield sel.select


@contextlib.contextmanager
def w_event() -> Iterator[Work]:
    yield threading.Event().wait


@contextlib.contextmanager
def w_condition() -> Iterator[Work]:
    cond = threading.Condition()

    def wait() -> None:
        with cond:
            cond.wait()

    yield wait


@contextlib.contextmanager
def w_queue_get() -> Iterator[Work]:
    q: queue.Queue[int] = queue.Queue()
    yield q.get


@contextlib.contextmanager
def w_semaphore() -> Iterator[Work]:
    yield threading.Semaphore(0).acquire


@contextlib.contextmanager
def w_join() -> Iterator[Work]:
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, args=(30,))
    t.start()
    try:
        yield t.join
    finally:
        stop.set()
        t.join()


@contextlib.contextmanager
def w_popen_wait() -> Iterator[Work]:
    yield lambda: subprocess.Popen(["sleep", "30"]).wait()


@contextlib.contextmanager
def w_subprocess_run() -> Iterator[Work]:
    yield lambda: subprocess.run(["sleep", "30"])


@contextlib.contextmanager
def w_tc_run() -> Iterator[Work]:
    yield lambda: tc_run(["sleep", "30"], hard=30)


@contextlib.contextmanager
def w_urlopen() -> Iterator[Work]:
    srv = socket.create_server(("127.0.0.1", 0), backlog=64)
    url = "http://127.0.0.1:%d/" % srv.getsockname()[1]
    with srv:
        yield lambda: urllib.request.urlopen(url)


@contextlib.contextmanager
def w_wait_readable() -> Iterator[Work]:
    with _pipe() as (r, _):
        yield lambda: wait_readable(r)


@contextlib.contextmanager
def w_acquire() -> Iterator[Work]:
    lock = threading.Lock()
    lock.acquire()
    yield lambda: acquire(lock)


CASES: list[tuple[str, Workload, int]] = [
    ("time.sleep(1)", w_time_sleep, TRIALS),
    ("socket.recv, blocking socket", w_recv, TRIALS),
    ("socket.recv, socket timeout 30 s", w_recv_timeout, TRIALS),
    ("socket.sendall 8 MB, peer not reading", w_sendall, TRIALS),
    ("socket.accept, no client", w_accept, TRIALS),
    ("socket.connect, backlog full", w_connect, TRIALS),
    ("select.select on an empty pipe", w_select, TRIALS),
    ("select.poll().poll() on an empty pipe", w_poll, TRIALS),
    ("selectors.DefaultSelector().select()", w_selector, TRIALS),
    ("threading.Event().wait()", w_event, TRIALS),
    ("threading.Condition.wait()", w_condition, TRIALS),
    ("queue.Queue().get()", w_queue_get, TRIALS),
    ("threading.Semaphore(0).acquire()", w_semaphore, TRIALS),
    ("threading.Thread.join()", w_join, TRIALS),
    ("Popen(['sleep','30']).wait() (+ kill, reap)", w_popen_wait, PROC_TRIALS),
    ("subprocess.run(['sleep','30']) (+ kill, reap)", w_subprocess_run, PROC_TRIALS),
    ("timeoutcore.run(['sleep','30']) (+ kill, reap)", w_tc_run, PROC_TRIALS),
    ("urllib.request.urlopen, silent server", w_urlopen, TRIALS),
    ("blocking.wait_readable (no patch needed)", w_wait_readable, TRIALS),
    ("blocking.acquire(Lock) (no patch needed)", w_acquire, TRIALS),
]


def percentiles(seconds: Sequence[float]) -> dict[str, float]:
    ms = sorted(s * 1e3 for s in seconds)
    if len(ms) == 1:
        p50 = p90 = p99 = ms[0]
    else:
        q = statistics.quantiles(ms, n=100, method="inclusive")
        p50, p90, p99 = q[49], q[89], q[98]
    return {"p50_ms": round(p50, 3), "p90_ms": round(p90, 3), "p99_ms": round(p99, 3),
            "max_ms": round(ms[-1], 3)}


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


def _in_worker(fn: Callable[[], Any]) -> Any:
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(fn).result()


def _measure_in_worker(
    benchmark: BenchmarkFixture, run_trials: Callable[[], list[Optional[float]]]
) -> tuple[list[Optional[float]], list[float]]:
    """Run the trials once in a pool thread; record trials, not_interrupted, percentiles."""
    results = benchmark.pedantic(lambda: _in_worker(run_trials), rounds=1, iterations=1)  # type: ignore[no-untyped-call]
    overshoots = [r for r in results if r is not None]
    info = benchmark.extra_info
    info["trials"] = len(overshoots)
    info["not_interrupted"] = len(results) - len(overshoots)
    if overshoots:
        info.update(percentiles(overshoots))
    return results, overshoots


@pytest.fixture
def patched() -> Iterator[None]:
    patch()
    try:
        yield
    finally:
        unpatch()


@pytest.mark.benchmark(group="overshoot")
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_overshoot_patched(benchmark: BenchmarkFixture, patched: None,
                           case: tuple[str, Workload, int]) -> None:
    label, workload, trials = case
    info = benchmark.extra_info
    info.update(case=f"timeoutcore+patch, worker, {label}", recipe="timeoutcore.patch",
                thread="worker", limit_s=LIMIT, engine=timeoutcore.ENGINE)

    def run_trials() -> list[Optional[float]]:
        trial_timeoutcore(workload)  # warm-up
        return [trial_timeoutcore(workload) for _ in range(trials)]

    results, overshoots = _measure_in_worker(benchmark, run_trials)
    assert len(overshoots) == len(results)


# --- the classic recipes on the same calls --------------------------------------------------


@contextlib.contextmanager
def r_sleep() -> Iterator[Work]:
    yield lambda: time.sleep(RESCUE_AFTER)


@contextlib.contextmanager
def r_recv() -> Iterator[Work]:
    with _sockpair() as (a, b):
        rescue = threading.Timer(RESCUE_AFTER, b.send, args=(b"x",))
        rescue.start()
        try:
            yield lambda: a.recv(1)
        finally:
            rescue.cancel()


@contextlib.contextmanager
def r_event() -> Iterator[Work]:
    ev = threading.Event()
    rescue = threading.Timer(RESCUE_AFTER, ev.set)
    rescue.start()
    try:
        yield ev.wait
    finally:
        rescue.cancel()


RECIPE_CALLS = [("time.sleep", r_sleep), ("socket.recv", r_recv), ("Event.wait", r_event)]


def trial_stopit(workload: Workload) -> Optional[float]:
    import stopit

    with workload() as work:
        deadline = time.perf_counter() + LIMIT
        with stopit.ThreadingTimeout(LIMIT, swallow_exc=True) as ctx:
            work()
        left = time.perf_counter()
    return left - deadline if ctx.state == ctx.TIMED_OUT else None


def trial_func_timeout(workload: Workload) -> Optional[float]:
    from func_timeout import FunctionTimedOut, func_timeout

    with workload() as work:
        deadline = time.perf_counter() + LIMIT
        try:
            func_timeout(LIMIT, work)
        except FunctionTimedOut:
            return time.perf_counter() - deadline
    return None


RECIPES = {"stopit.ThreadingTimeout": ("stopit", trial_stopit),
           "func_timeout": ("func_timeout", trial_func_timeout)}


@pytest.mark.benchmark(group="overshoot")
@pytest.mark.parametrize("call", RECIPE_CALLS, ids=[c[0] for c in RECIPE_CALLS])
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_overshoot_recipes(benchmark: BenchmarkFixture, recipe: str,
                           call: tuple[str, Workload]) -> None:
    module, trial = RECIPES[recipe]
    pytest.importorskip(module)
    label, workload = call
    info = benchmark.extra_info
    info.update(case=f"{recipe}, worker, {label}", recipe=recipe, thread="worker",
                limit_s=LIMIT)

    def run_trials() -> list[Optional[float]]:
        return [trial(workload) for _ in range(SLOW_TRIALS)]

    _, overshoots = _measure_in_worker(benchmark, run_trials)
    if recipe == "func_timeout":
        info["note"] = "the caller is released; the call runs on in an abandoned thread"
    elif overshoots and min(overshoots) > RESCUE_AFTER / 2:
        info["note"] = f"not interrupted: left when the rescue ended the call at {RESCUE_AFTER} s"


# --- cost outside a scope ---------------------------------------------------------------------


def _setup_calls() -> dict[str, Callable[[], Callable[[], object]]]:
    """name -> make(): builds the state and returns the call to time (made after patch()
    or unpatch(), so objects like poll() are the ones of that mode)."""

    def sleep0() -> Callable[[], object]:
        return lambda: time.sleep(0)

    def select0() -> Callable[[], object]:
        r, _ = _keep(os.pipe())
        return lambda: select.select([r], [], [], 0)

    def poll0() -> Callable[[], object]:
        r, _ = _keep(os.pipe())
        p = select.poll()
        p.register(r, select.POLLIN)
        return lambda: p.poll(0)

    def selector0() -> Callable[[], object]:
        r, _ = _keep(os.pipe())
        sel = selectors.DefaultSelector()
        sel.register(r, selectors.EVENT_READ)
        _KEEP.append(sel)
        return lambda: sel.select(0)

    def send_recv() -> Callable[[], object]:
        a, b = socket.socketpair()
        _KEEP.extend((a, b))

        def call() -> object:
            b.send(b"x")
            return a.recv(1)

        return call

    def event0() -> Callable[[], object]:
        ev = threading.Event()
        return lambda: ev.wait(0)

    def cond0() -> Callable[[], object]:
        cond = threading.Condition()
        cond.acquire()
        return lambda: cond.wait(0)

    def join_done() -> Callable[[], object]:
        t = threading.Thread(target=int)
        t.start()
        t.join()
        return t.join

    def popen_done() -> Callable[[], object]:
        p = subprocess.Popen(["true"])
        p.wait()
        return p.wait

    def remaining() -> Callable[[], object]:
        return timeoutcore.remaining

    return {
        "timeoutcore.remaining() (the look-up itself)": remaining,
        "time.sleep(0)": sleep0,
        "select.select([fd], [], [], 0)": select0,
        "poll.poll(0)": poll0,
        "DefaultSelector.select(0)": selector0,
        "socket send(1 byte) + recv(1)": send_recv,
        "Event().wait(0) (unset: Condition.wait)": event0,
        "Condition.wait(0)": cond0,
        "Thread.join() (finished)": join_done,
        "Popen.wait() (reaped)": popen_done,
    }


_KEEP: list[Any] = []


def _keep(fds: tuple[int, int]) -> tuple[int, int]:
    _KEEP.extend(fds)
    return fds


@pytest.fixture(autouse=True, scope="module")
def _release() -> Iterator[None]:
    yield
    for obj in _KEEP:
        if isinstance(obj, int):
            os.close(obj)
        else:
            obj.close()
    _KEEP.clear()


CALLS = _setup_calls()
_ORIGINAL_NS: dict[str, float] = {}


def _loop(call: Callable[[], object], n: int) -> None:
    for _ in range(n):
        call()


@pytest.mark.benchmark(group="overhead")
@pytest.mark.parametrize("mode", ["original", "patched"])
@pytest.mark.parametrize("name", list(CALLS))
def test_cost_outside_a_scope(benchmark: BenchmarkFixture, name: str, mode: str) -> None:
    if name.startswith("timeoutcore.remaining") and mode == "patched":
        pytest.skip("not a patched call")
    if mode == "patched":
        patch()
    try:
        assert timeoutcore.remaining() is None
        call = CALLS[name]()
        ops = OPS // 10 if name.startswith(("Popen", "socket")) else OPS
        benchmark.pedantic(_loop, args=(call, ops), rounds=ROUNDS, warmup_rounds=2)  # type: ignore[no-untyped-call]
    finally:
        unpatch()
    record_per_op(benchmark, f"{mode:8s} {name}", ops)
    per_op = benchmark.stats.stats.median / ops * 1e9
    info = benchmark.extra_info
    info["mode"] = mode
    if mode == "original":
        _ORIGINAL_NS[name] = per_op
    elif name in _ORIGINAL_NS:
        info["added_ns"] = round(per_op - _ORIGINAL_NS[name], 1)
        info["vs_original"] = round(per_op / _ORIGINAL_NS[name], 3)

