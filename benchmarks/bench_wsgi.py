"""What ``timeoutcore.contrib.wsgi.DeadlineMiddleware`` costs and how fast it stops,
through a real gunicorn (``-k gthread --threads 4``, one worker, ``patch()`` in post_fork).

    python benchmarks/bench_wsgi.py [--json benchmarks/results/wsgi.json] [--rounds 7]

* **Throughput**: requests/s of a fast endpoint (a generator response: the middleware's
  full path, a scope for the call and one per chunk) served without and with the
  middleware -- two gunicorn processes of the same application, driven in alternating
  rounds by the same keep-alive clients in this process, so drift hits both alike; the
  medians and their ratio.
* **Cost per request in process**: the same endpoint called directly, without and with the
  middleware (microseconds; the server's part left out).
* **Deadline -> 504**: 100 slow requests (half ``time.sleep(60)``, half a CPU loop), 25
  sent at a time to the 4 threads, under a 0.1 s limit; the lateness of each 504, measured
  in the server as the time from the middleware's call to its return past the limit, p50
  and p99.
* **Fast latency meanwhile**: a client sends the fast endpoint one request after another
  while the slow ones are being stopped, against the same client on the idle server.

Not a pytest-benchmark file: it drives server processes and writes its own JSON.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"

LIMIT = 0.1  # the slow requests' limit in the benchmark app
THREADS = 4
CLIENTS = 4  # keep-alive clients for the throughput rounds
ROUND_S = 2.0
SLOW = 100
SLOW_CONCURRENCY = 25

# --- the application (imported by gunicorn in its worker) ---------------------------------

_lock = threading.Lock()
_late: list[float] = []  # seconds past the limit, one per 504


def _plain(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    path = environ.get("PATH_INFO", "")
    if path == "/sleep":
        time.sleep(60)
    elif path == "/cpu":
        n = 0
        while n >= 0:
            n += 1
    elif path == "/late":
        with _lock:
            body = json.dumps(_late).encode()
            _late.clear()
        start_response("200 OK", [("Content-Type", "application/json")])
        return [body]
    start_response("200 OK", [("Content-Type", "text/plain")])

    def body_chunks() -> Iterator[bytes]:
        yield b"ok\n"

    return body_chunks()


def _measured(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    """Outside the middleware: how late past LIMIT each 504 came back from it."""

    def layer(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        start = time.monotonic()
        status: list[str] = []

        def sr(s: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            status.append(s)
            return start_response(s, headers, exc_info) if exc_info else start_response(s, headers)

        result = app(environ, sr)
        if status and status[0].startswith("504"):
            with _lock:
                _late.append(time.monotonic() - start - LIMIT)
        return result

    return layer


def _guarded_app() -> Callable[..., Iterable[bytes]]:
    from timeoutcore.contrib.wsgi import DeadlineMiddleware

    return _measured(DeadlineMiddleware(_plain, LIMIT))


if os.environ.get("BENCH_WSGI_ROLE") == "guarded":
    app = _guarded_app()
else:
    app = _plain

# --- the driver ---------------------------------------------------------------------------


class _Client:
    """One keep-alive connection; reconnects when the server closed it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def get(self, path: str) -> tuple[int, bytes]:
        for attempt in (1, 2):
            try:
                self.conn.request("GET", path)
                resp = self.conn.getresponse()
                return resp.status, resp.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.conn.close()


def _throughput(port: int, seconds: float) -> float:
    """Requests/s of /fast from CLIENTS keep-alive clients for ``seconds``."""
    counts = [0] * CLIENTS
    stop = time.monotonic() + seconds

    def run(i: int) -> None:
        client = _Client(port)
        try:
            while time.monotonic() < stop:
                status, _ = client.get("/fast")
                assert status == 200
                counts[i] += 1
        finally:
            client.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(CLIENTS)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.monotonic() - start)


def _pcts(values: list[float]) -> dict[str, float]:
    ms = sorted(v * 1e3 for v in values)
    q = statistics.quantiles(ms, n=100, method="inclusive")
    return {"p50_ms": round(q[49], 3), "p99_ms": round(q[98], 3), "max_ms": round(ms[-1], 3),
            "n": len(ms)}


def _fast_latency(port: int, until: threading.Event) -> list[float]:
    client = _Client(port)
    out: list[float] = []
    try:
        while not until.is_set():
            t0 = time.monotonic()
            status, _ = client.get("/fast")
            out.append(time.monotonic() - t0)
            assert status == 200
    finally:
        client.close()
    return out


def _slow_phase(port: int) -> tuple[list[float], list[float]]:
    """SLOW slow requests, SLOW_CONCURRENCY at a time, and the fast client meanwhile:
    (each 504's lateness, the fast requests' latencies)."""
    todo = [("/sleep" if i % 2 else "/cpu") for i in range(SLOW)]
    lock = threading.Lock()
    statuses: list[int] = []

    def slow_client() -> None:
        while True:
            with lock:
                if not todo:
                    return
                path = todo.pop()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            try:
                conn.request("GET", path, headers={"Connection": "close"})
                resp = conn.getresponse()
                resp.read()
                with lock:
                    statuses.append(resp.status)
            finally:
                conn.close()

    done = threading.Event()
    fast: list[float] = []
    fast_thread = threading.Thread(target=lambda: fast.extend(_fast_latency(port, done)))
    fast_thread.start()
    slow = [threading.Thread(target=slow_client) for _ in range(SLOW_CONCURRENCY)]
    for t in slow:
        t.start()
    for t in slow:
        t.join()
    done.set()
    fast_thread.join()
    assert statuses == [504] * SLOW, statuses
    client = _Client(port)
    try:
        late = json.loads(client.get("/late")[1])
    finally:
        client.close()
    return late, fast


def _in_process_cost(calls: int = 20000, repeats: int = 7) -> dict[str, float]:
    """Microseconds per request of the fast endpoint called directly (the server's part
    left out): the application alone and through the middleware; medians of ``repeats``
    alternating batches."""
    from timeoutcore.contrib.wsgi import DeadlineMiddleware

    guarded = DeadlineMiddleware(_plain, 30.0)
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/fast"}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) \
            -> Callable[[bytes], None]:
        return lambda data: None

    def batch(wsgi: Callable[..., Iterable[bytes]]) -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            result = wsgi(environ, start_response)
            for _chunk in result:
                pass
            close = getattr(result, "close", None)
            if close is not None:
                close()
        return (time.perf_counter() - t0) / calls * 1e6

    plain_us: list[float] = []
    guarded_us: list[float] = []
    for _ in range(repeats):
        plain_us.append(batch(_plain))
        guarded_us.append(batch(guarded))
    p, g = statistics.median(plain_us), statistics.median(guarded_us)
    return {"plain_us": round(p, 2), "guarded_us": round(g, 2), "cost_us": round(g - p, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--rounds", type=int, default=7, help="throughput rounds per server")
    args = parser.parse_args()

    sys.path.insert(0, str(TESTS))
    from wsgi_servers import serve

    env = {"PYTHONPATH": str(HERE)}
    with tempfile.TemporaryDirectory() as folder, \
            serve("gunicorn", "bench_wsgi:app", {**env, "BENCH_WSGI_ROLE": "plain"},
                  Path(folder), threads=THREADS) as plain, \
            serve("gunicorn", "bench_wsgi:app", {**env, "BENCH_WSGI_ROLE": "guarded"},
                  Path(folder), threads=THREADS) as guarded:
        _throughput(plain.port, 0.5)  # warm both up
        _throughput(guarded.port, 0.5)
        rates: dict[str, list[float]] = {"plain": [], "guarded": []}
        for _ in range(args.rounds):
            rates["plain"].append(_throughput(plain.port, ROUND_S))
            rates["guarded"].append(_throughput(guarded.port, ROUND_S))
        idle_done = threading.Event()
        timer = threading.Timer(2.0, idle_done.set)
        timer.start()
        idle = _fast_latency(guarded.port, idle_done)
        late, fast = _slow_phase(guarded.port)

    cost = _in_process_cost()
    p, g = statistics.median(rates["plain"]), statistics.median(rates["guarded"])
    results = {
        "command": "python benchmarks/bench_wsgi.py",
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, load "
                   f"{os.getloadavg()[0]:.2f}",
        "server": f"gunicorn -k gthread --threads {THREADS}, 1 worker",
        "throughput": {
            "endpoint": "/fast (a one-chunk generator response)",
            "clients": CLIENTS, "round_s": ROUND_S, "rounds": args.rounds,
            "plain_rps": [round(r) for r in rates["plain"]],
            "guarded_rps": [round(r) for r in rates["guarded"]],
            "plain_median_rps": round(p), "guarded_median_rps": round(g),
            "ratio": round(g / p, 3),
        },
        "in_process_us_per_request": cost,
        "deadline_to_504": {"limit_s": LIMIT, "requests": SLOW,
                            "concurrency": SLOW_CONCURRENCY, "kinds": "time.sleep / CPU loop",
                            **_pcts(late)},
        "fast_latency_idle": _pcts(idle),
        "fast_latency_during_stops": _pcts(fast),
    }
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
