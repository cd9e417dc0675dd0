"""Cancel means stop: how soon a cancelled task's thread is free, what the deadline-aware
executor costs per task, and what DeadlineMiddleware costs a FastAPI app.

- ``test_cancel_to_free``: a ``DeadlineExecutor`` task blocked in a CPU loop, ``time.sleep``,
  a socket read from a silent peer or ``Queue.get`` (``patch()`` on); ms from
  ``future.cancel()`` until no thread runs the task (``wait_stopped()``), p50/p90/p99.
- ``test_executor_cost``: a pool of 4 running 2,000 tasks, empty or 1 ms of CPU each, with a
  plain ``ThreadPoolExecutor`` and with ``DeadlineExecutor`` (no limit), ABBA rounds; the
  median round per task, and the median of the per-round ratios (a second plain pool gives
  their noise floor).
- ``test_fastapi_throughput``: requests/s of a fast sync endpoint through uvicorn, with and
  without ``DeadlineMiddleware`` (servers side by side, ABBA rounds, 4 keep-alive clients;
  a second server without it gives the noise floor of the ratio); and the servers' CPU
  time per request, whose ratio is the capacity a CPU-bound server keeps with it.
- ``test_fastapi_cost_in_process``: the CPU time the middleware adds to a request, the app
  called directly through ASGI (no server, no client).
- ``test_fastapi_504_latency``: 50 concurrent requests to a sync endpoint blocked in
  ``time.sleep``, 0.5 s deadline: ms from the deadline to the 504, p50/p99.

Run: ``python -m pytest benchmarks/bench_cancel.py --benchmark-only``; the figures go to
``benchmarks/results/cancel.json`` too (merged: a partial run keeps the other parts).
"""

from __future__ import annotations

import functools
import http.client
import json
import os
import platform
import queue
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

import harness as bench

import timeoutcore
from timeoutcore import DeadlineExecutor

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "cancel.json"
TRIALS = 200

_results: dict[str, Any] = {}


@pytest.fixture(scope="module", autouse=True)
def results_file() -> Iterator[None]:
    """Write what this module measured to RESULTS, over the parts of an earlier run."""
    yield
    if not _results:
        return
    old = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    old.update(_results)
    old["environment"] = {
        "command": "python -m pytest benchmarks/bench_cancel.py --benchmark-only",
        "python": platform.python_version(), "machine": platform.machine(),
        "cpus": os.cpu_count(), "load": round(os.getloadavg()[0], 2),
        "engine": timeoutcore.ENGINE,
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(old, indent=2, sort_keys=True) + "\n")


@pytest.fixture(scope="module", autouse=True)
def patched() -> Iterator[None]:
    timeoutcore.patch()
    yield
    timeoutcore.unpatch()


def _spin() -> None:
    while True:
        pass


@pytest.mark.benchmark(group="future-cancel")
@pytest.mark.parametrize("kind", ["cpu", "sleep", "socket", "queue"])
def test_cancel_to_free(benchmark: BenchmarkFixture, kind: str) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(TRIALS)
    q: queue.Queue[int] = queue.Queue()
    peers: list[socket.socket] = []

    def blocker() -> Callable[[], Any]:
        if kind == "cpu":
            return _spin
        if kind == "sleep":
            return lambda: time.sleep(60)
        if kind == "queue":
            return q.get
        peer = socket.create_connection(listener.getsockname())
        peers.append(peer)
        return lambda: peer.recv(10)

    took: list[float] = []

    def run() -> None:
        with DeadlineExecutor(1) as pool:
            for _ in range(TRIALS):
                started = threading.Event()
                block = blocker()

                def task(block: Callable[[], Any] = block, started: threading.Event = started
                         ) -> None:
                    started.set()
                    block()

                future = pool.submit(task)
                started.wait(10)
                time.sleep(0.001)  # into the blocking call
                t0 = time.perf_counter()
                assert future.cancel()
                assert future.wait_stopped(10)
                took.append((time.perf_counter() - t0) * 1e3)

    try:
        benchmark.pedantic(run, rounds=1, iterations=1)
    finally:
        for s in peers + [listener]:
            s.close()
    figures = dict(trials=len(took), **bench.percentiles(took))
    _results[f"cancel_to_free_{kind}"] = figures
    benchmark.extra_info.update(case=f"cancel -> thread free, {kind}", **figures)


def _work(n: int) -> int:
    """A fixed amount of Python work (not a time-bounded spin: with four threads sharing
    the GIL, a spin that watches the clock finishes while it waits for the GIL)."""
    total = 0
    for i in range(n):
        total += i
    return total


def _iterations_for(seconds: float) -> int:
    n = 10_000
    while True:
        t0 = time.perf_counter()
        _work(n)
        took = time.perf_counter() - t0
        if took > 0.05:
            return max(1, int(n * seconds / took))
        n *= 2


def _alternated(rounds: int, measure: dict[str, Callable[[], float]]) -> dict[str, list[float]]:
    """``rounds`` rounds of every measurement, the order reversed every other round (ABBA),
    so that a drift of the machine's speed during the run weighs on each alike."""
    out: dict[str, list[float]] = {name: [] for name in measure}
    order = list(measure)
    for i in range(rounds):
        for name in order if i % 2 == 0 else reversed(order):
            out[name].append(measure[name]())
    return out


def _paired_ratio(measured: dict[str, list[float]], num: str, den: str) -> float:
    """The median over rounds of ``num``'s figure over ``den``'s in the same round: each
    ratio compares two measurements taken next to each other, so a drift of the machine
    between rounds cancels out (a ratio of the two medians would keep it)."""
    return statistics.median(a / b for a, b in zip(measured[num], measured[den]))


@pytest.mark.benchmark(group="executor")
@pytest.mark.parametrize("work_ms", [0, 1])
def test_executor_cost(benchmark: BenchmarkFixture, work_ms: int) -> None:
    """Per task, ``DeadlineExecutor`` against ``ThreadPoolExecutor``; a second plain pool
    in the same rotation gives the noise floor of the ratio (plain vs plain)."""
    tasks = 2000 if work_ms == 0 else 400
    rounds = 15
    n = _iterations_for(work_ms / 1e3) if work_ms else 0

    walls: dict[str, list[float]] = {}

    def one_round(name: str, pool: ThreadPoolExecutor) -> float:
        """CPU time of the process per task (the pool's cost, which other processes on the
        machine do not blur); the wall time per task is kept beside it."""
        c0, t0 = time.process_time(), time.perf_counter()
        futures = [pool.submit(_work, n) for _ in range(tasks)]
        for f in futures:
            f.result()
        walls.setdefault(name, []).append((time.perf_counter() - t0) / tasks * 1e6)
        return (time.process_time() - c0) / tasks * 1e6

    measured: dict[str, list[float]] = {}

    def run() -> None:
        with ThreadPoolExecutor(4) as plain, ThreadPoolExecutor(4) as control, \
                DeadlineExecutor(4) as guarded:
            pools = {"ThreadPoolExecutor": plain, "ThreadPoolExecutor (control)": control,
                     "DeadlineExecutor": guarded}
            for pool in pools.values():
                one_round("warm-up", pool)  # threads started
            measured.update(_alternated(rounds, {
                name: functools.partial(one_round, name, pool) for name, pool in pools.items()}))

    benchmark.pedantic(run, rounds=1, iterations=1)
    plain, control, guarded = "ThreadPoolExecutor", "ThreadPoolExecutor (control)", \
        "DeadlineExecutor"
    ratio = _paired_ratio(measured, guarded, plain)
    control_ratio = _paired_ratio(measured, control, plain)
    wall_ratio = _paired_ratio(walls, guarded, plain)
    wall_control = _paired_ratio(walls, control, plain)
    cpu = {name: statistics.median(measured[name]) for name in measured}
    wall = {name: statistics.median(walls[name]) for name in measured}
    _results[f"executor_{work_ms}ms_tasks"] = {
        "pool": 4, "tasks_per_round": tasks, "rounds": rounds,
        "plain_cpu_us_per_task": round(cpu[plain], 2),
        "deadline_cpu_us_per_task": round(cpu[guarded], 2),
        "control_cpu_us_per_task": round(cpu[control], 2),
        "ratio": round(ratio, 4), "control_ratio": round(control_ratio, 4),
        "round_ratios": [round(a / b, 4) for a, b in zip(measured[guarded], measured[plain])],
        "plain_wall_us_per_task": round(wall[plain], 2),
        "deadline_wall_us_per_task": round(wall[guarded], 2),
        "wall_ratio": round(wall_ratio, 4), "wall_control_ratio": round(wall_control, 4)}
    benchmark.extra_info.update(
        case=f"pool of 4, {work_ms} ms tasks",
        note=(f"CPU per task: ThreadPoolExecutor {cpu[plain]:.1f} us, DeadlineExecutor "
              f"{cpu[guarded]:.1f} us, ratio {ratio:.3f}, plain vs plain {control_ratio:.3f}; "
              f"wall ratio {wall_ratio:.3f}, plain vs plain {wall_control:.3f} (medians of "
              f"the ratios within each of {rounds} ABBA rounds)"),
        ratio=round(ratio, 4), control_ratio=round(control_ratio, 4),
        wall_ratio=round(wall_ratio, 4))


class _Uvicorn:
    def __init__(self, deadline: float) -> None:
        # A port, not a bound socket passed by --fd as the tests do: uvicorn takes such a
        # descriptor for a Unix socket and leaves Nagle's algorithm on, which holds every
        # keep-alive response for the client's delayed ACK (40 ms).
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        env = dict(os.environ, TC_BENCH_DEADLINE=str(deadline))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "asgi_bench_app:app", "--app-dir", str(HERE),
             "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "error",
             "--no-access-log"], env=env, cwd=str(HERE))  # not the source tree's package
        end = time.monotonic() + 60
        while True:
            try:
                self.get("/fast")
                return
            except OSError:
                assert time.monotonic() < end and self.proc.poll() is None
                time.sleep(0.1)

    def get(self, path: str) -> int:
        conn = _connect(self.port)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            r.read()
            return r.status
        finally:
            conn.close()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, _Uvicorn]]:
    # Two servers without the middleware: the second one's ratio to the first is the noise
    # floor of the comparison.
    started = {"without": _Uvicorn(0), "without (control)": _Uvicorn(0),
               "with DeadlineMiddleware": _Uvicorn(0.5)}
    yield started
    for s in started.values():
        s.stop()


def _connect(port: int) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.connect()
    assert conn.sock is not None
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as a real client does
    return conn


def _hammer(port: int, seconds: float, clients: int = 4) -> float:
    """Requests/s of ``clients`` threads, each on one keep-alive connection."""
    requests, took = _hammer_count(port, seconds, clients)
    return requests / took


def _hammer_count(port: int, seconds: float, clients: int = 4) -> tuple[int, float]:
    """``_hammer``'s requests and the seconds they took."""
    counts = [0] * clients
    end = time.perf_counter() + seconds

    def client(i: int) -> None:
        conn = _connect(port)
        try:
            while time.perf_counter() < end:
                conn.request("GET", "/fast")
                r = conn.getresponse()
                r.read()
                assert r.status == 200
                counts[i] += 1
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts), time.perf_counter() - t0


def _cpu_ns(pid: int) -> int:
    """CPU time the threads of process ``pid`` have run so far, in ns (Linux schedstat)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):  # a thread that ended meanwhile
            pass
    return total


@pytest.mark.benchmark(group="asgi")
def test_fastapi_throughput(benchmark: BenchmarkFixture, servers: dict[str, _Uvicorn]) -> None:
    # Many short rounds: a round's ratio varies by 10 % and more on a shared machine, and
    # the median of many pairs is what narrows the figure down.
    rounds, seconds = 40, 0.5
    rates: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {name: [] for name in servers}

    def measure(name: str, server: _Uvicorn) -> float:
        """Requests/s; the server's CPU time per request goes to ``cpu``."""
        before = _cpu_ns(server.proc.pid)
        requests, took = _hammer_count(server.port, seconds)
        cpu[name].append((_cpu_ns(server.proc.pid) - before) / 1e3 / requests)
        return requests / took

    def run() -> None:
        for s in servers.values():
            _hammer(s.port, 0.5)  # warm-up
        rates.update(_alternated(rounds, {
            name: functools.partial(measure, name, s) for name, s in servers.items()}))

    benchmark.pedantic(run, rounds=1, iterations=1)
    plain = statistics.median(rates["without"])
    control = statistics.median(rates["without (control)"])
    guarded = statistics.median(rates["with DeadlineMiddleware"])
    ratio = _paired_ratio(rates, "with DeadlineMiddleware", "without")
    control_ratio = _paired_ratio(rates, "without (control)", "without")
    # The server's capacity: its CPU per request without over with (a CPU-bound server
    # serves that much less at saturation), paired the same way.
    capacity = _paired_ratio(cpu, "without", "with DeadlineMiddleware")
    capacity_control = _paired_ratio(cpu, "without", "without (control)")
    _results["fastapi_throughput"] = {
        "clients": 4, "round_s": seconds, "rounds": rounds,
        "without_rps": [round(r) for r in rates["without"]],
        "control_rps": [round(r) for r in rates["without (control)"]],
        "with_rps": [round(r) for r in rates["with DeadlineMiddleware"]],
        "without_median_rps": round(plain), "control_median_rps": round(control),
        "with_median_rps": round(guarded), "ratio": round(ratio, 4),
        "control_ratio": round(control_ratio, 4),
        "without_server_cpu_us": round(statistics.median(cpu["without"]), 1),
        "with_server_cpu_us": round(statistics.median(cpu["with DeadlineMiddleware"]), 1),
        "capacity_ratio": round(capacity, 4), "capacity_control_ratio": round(capacity_control, 4)}
    benchmark.extra_info.update(
        case="FastAPI fast sync endpoint, uvicorn, 4 keep-alive clients",
        note=(f"req/s without {plain:.0f}, with DeadlineMiddleware {guarded:.0f}, ratio "
              f"{ratio:.3f}; without vs without {control_ratio:.3f}; server CPU per request "
              f"ratio {capacity:.3f}, control {capacity_control:.3f} (medians of the ratios "
              f"within each of {rounds} ABBA rounds)"),
        without_rps=round(plain), with_rps=round(guarded), ratio=round(ratio, 4),
        control_ratio=round(control_ratio, 4), capacity_ratio=round(capacity, 4))


@pytest.mark.benchmark(group="asgi")
def test_fastapi_cost_in_process(benchmark: BenchmarkFixture) -> None:
    """What the middleware adds to one request, with no server or client around it: a
    FastAPI app called directly through ASGI, CPU time of the process per request (the
    loop's and the worker thread's), with and without the middleware, ABBA rounds."""
    import asyncio

    from fastapi import FastAPI

    from timeoutcore.contrib.asgi import DeadlineMiddleware

    def app(deadline: float) -> Any:
        made = FastAPI()
        if deadline:
            made.add_middleware(DeadlineMiddleware, seconds=deadline)

        @made.get("/fast")
        def fast() -> dict[str, Any]:
            return {"ok": True}

        return made

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "GET", "scheme": "http", "path": "/fast", "raw_path": b"/fast",
             "query_string": b"", "root_path": "", "headers": [],
             "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1)}
    requests, rounds = 1000, 15

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            assert message["status"] == 200

    async def one_round(asgi: Any) -> float:
        t0 = time.process_time()
        for _ in range(requests):
            await asgi(dict(scope), receive, send)
        return (time.process_time() - t0) / requests * 1e6

    measured: dict[str, list[float]] = {"without": [], "with DeadlineMiddleware": []}

    async def main() -> None:
        apps = {"without": app(0), "with DeadlineMiddleware": app(0.5)}
        for asgi in apps.values():
            await one_round(asgi)
        order = list(apps)
        for i in range(rounds):
            for name in order if i % 2 == 0 else reversed(order):
                measured[name].append(await one_round(apps[name]))

    benchmark.pedantic(lambda: asyncio.run(main()), rounds=1, iterations=1)
    plain = statistics.median(measured["without"])
    guarded = statistics.median(measured["with DeadlineMiddleware"])
    _results["fastapi_cost_in_process"] = {
        "requests_per_round": requests, "rounds": rounds, "without_cpu_us": round(plain, 2),
        "with_cpu_us": round(guarded, 2), "added_cpu_us": round(guarded - plain, 2)}
    benchmark.extra_info.update(
        case="FastAPI app called in process: CPU per request",
        note=f"without {plain:.1f} us, with DeadlineMiddleware {guarded:.1f} us (median of "
             f"{rounds} ABBA rounds)", added_us=round(guarded - plain, 2))


@pytest.mark.benchmark(group="asgi")
def test_fastapi_504_latency(benchmark: BenchmarkFixture, servers: dict[str, _Uvicorn]) -> None:
    server = servers["with DeadlineMiddleware"]
    late: list[float] = []

    def one(_: int) -> float:
        t0 = time.perf_counter()
        assert server.get("/slow") == 504
        return (time.perf_counter() - t0 - 0.5) * 1e3

    def run() -> None:
        with ThreadPoolExecutor(50) as clients:
            for _ in range(4):
                late.extend(clients.map(one, range(50)))

    benchmark.pedantic(run, rounds=1, iterations=1)
    figures = dict(trials=len(late), **bench.percentiles(late))
    _results["fastapi_504_late"] = dict(concurrent=50, deadline_s=0.5, **figures)
    benchmark.extra_info.update(case="50 concurrent slow requests, 0.5 s deadline: 504 late by",
                                **figures)
