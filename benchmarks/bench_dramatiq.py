"""What ``timeoutcore.contrib.dramatiq.TimeLimit`` does against dramatiq's own TimeLimit,
measured in real ``python -m dramatiq`` workers (1 process, 1 thread, Redis broker; the
actors of tests/dramatiq_app.py) in the same run.

    python benchmarks/bench_dramatiq.py [--trials 100] [--stock-trials 40] [--rounds 7]
                                        [--messages 300] [--json PATH]

* **Limit -> message failed**: messages that overrun a 200 ms ``time_limit`` (a CPU loop,
  ``time.sleep(60)``, ``requests.get`` to a loopback peer that never answers), one at a
  time (for the stock middleware after a random pause of up to its poll interval); how late past the limit the worker had finished with the message, p50/p99. Measured
  in the worker by a first-in/last-out middleware (``Stopwatch``): from the first
  ``before_process_message`` to the last ``after_process_message``, minus the limit. The
  stock middleware polls every ``interval`` (1,000 ms by default) and cannot stop a blocking
  call: its sleep trials use ``time.sleep(2)`` (it fails when the sleep returns), and the
  silent peer is left out for it (it would wait for requests' own 60 s timeout).
* **Abort -> message done**: a message running under a 30 s limit (``time.sleep(60)``, a CPU
  loop) on a worker with a registry: ms from the call to
  :func:`~timeoutcore.contrib.dramatiq.abort` to the worker's end of the message (the
  ``Stopwatch``'s end; ``perf_counter`` is the same clock in both processes on Linux),
  p50/p99. The stock middleware has no abort.
* **Per-message cost on 1 ms messages**: three workers -- no time limit, the stock
  middleware, timeoutcore's (``patch=True``) -- each sent ``--messages`` 1 ms CPU messages
  per round, rounds alternated; the median over rounds of the in-worker time per message
  (the same ``Stopwatch`` span: middleware path + actor) and of the throughput (messages per
  second between the first and the last message's end), and the ratios.
* **Hooks in process**: the middleware's path alone (``before_process_message``, the actor
  call, ``after_process_message``; an empty actor, a StubBroker), stock against
  timeoutcore against a bare call, rounds alternated: microseconds per message.

Redis: ``$TIMEOUTCORE_TEST_REDIS_URL``, else a ``redis-server`` started for the run.
Writes ``benchmarks/results/dramatiq.json`` (``--json`` elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"
RESULTS = HERE / "results" / "dramatiq.json"
sys.path.insert(0, str(TESTS))

import harness as bench  # noqa: E402

LIMIT_MS = 200
WAIT_MS = 30_000


@contextmanager
def _redis_url() -> Iterator[str]:
    url = os.environ.get("TIMEOUTCORE_TEST_REDIS_URL")
    if url:
        yield url
        return
    from redis_server import RedisServer

    with tempfile.TemporaryDirectory() as folder:
        server = RedisServer(Path(folder)).start()
        try:
            yield server.url
        finally:
            server.stop()


def _stopwatch(worker: Any) -> dict[str, tuple[float, float]]:
    """message id -> (ms in the worker, end time) of what the worker has finished."""
    raw = worker.broker.client.hgetall(f"{worker.namespace}:stopwatch")
    out = {}
    for key, value in raw.items():
        took, end = value.split()
        out[key.decode()] = (float(took), float(end))
    return out


def _late_ms(worker: Any, actor: str, arg: Any, trials: int,
             jitter: float = 0.0) -> list[float]:
    """Each message overruns LIMIT_MS; how late past it the worker was done with it.
    ``jitter``: wait up to that many seconds before each message, at random -- for the stock
    middleware, whose poll would otherwise keep one phase against messages sent back to back
    (each sent right after the previous one failed, at a poll)."""
    late = []
    rng = random.Random(39)
    for _ in range(trials):
        time.sleep(rng.uniform(0, jitter))
        message = worker.send(actor, arg, time_limit=LIMIT_MS)
        try:
            message.get_result(backend=worker.backend, block=True, timeout=WAIT_MS)
        except Exception as exc:  # noqa: BLE001 - the failure is the expected outcome
            if type(exc).__name__ != "ResultFailure":
                raise
        took = _stopwatch_entry(worker, message.message_id)  # written after the result
        late.append(took[0] - LIMIT_MS)
    return late


def _stopwatch_entry(worker: Any, message_id: str, within: float = 5.0) -> Any:
    """The worker's stopwatch entry for ``message_id``, polled for up to ``within`` s."""
    end = time.monotonic() + within
    while True:
        entry = _stopwatch(worker).get(message_id)
        if entry is not None:
            return entry
        if time.monotonic() > end:
            raise RuntimeError(f"no stopwatch entry for {message_id}")
        time.sleep(0.005)


def _abort_ms(worker: Any, registry: Any, actor: str, arg: Any, trials: int) -> list[float]:
    """Each message runs (30 s limit) until abort(); ms from the call to abort() to the
    worker's end of the message (the Stopwatch's end: perf_counter is the system-wide
    monotonic clock, the same in both processes on Linux)."""
    from redis_server import wait_for_job

    from timeoutcore.contrib.dramatiq import abort

    out = []
    for _ in range(trials):
        message = worker.send(actor, arg, time_limit=30_000)
        wait_for_job(registry, message.message_id)
        t0 = time.perf_counter()
        if not abort(message, registry=registry):
            raise RuntimeError(f"{message.message_id} was not running")
        done = _stopwatch_entry(worker, message.message_id)
        out.append((done[1] - t0) * 1000)
    return out


def _round(worker: Any, messages: int) -> tuple[float, float]:
    """Send ``messages`` 1 ms messages; (median ms per message in the worker, messages/s)."""
    key = f"{worker.namespace}:stopwatch"
    worker.broker.client.delete(key)
    actor = worker.actor("one_ms")
    for _ in range(messages):
        actor.send()
    end = time.monotonic() + 120
    while worker.broker.client.hlen(key) < messages:
        if time.monotonic() > end:
            raise RuntimeError("the worker did not finish the round")
        time.sleep(0.02)
    spans = list(_stopwatch(worker).values())
    ends = sorted(e for _, e in spans)
    return statistics.median(t for t, _ in spans), (len(ends) - 1) / (ends[-1] - ends[0])


def _hooks_cost(rounds: int, ops: int = 20_000) -> dict[str, float]:
    """µs per message of the middleware's path in process (StubBroker, empty actor)."""
    import dramatiq
    from dramatiq.broker import MessageProxy
    from dramatiq.brokers.stub import StubBroker
    from dramatiq.middleware import TimeLimit as StockTimeLimit

    from timeoutcore.contrib.dramatiq import TimeLimit

    def path(middleware: Any) -> Callable[[], float]:
        broker = StubBroker(middleware=[middleware] if middleware else [])
        actor = dramatiq.actor(broker=broker, actor_name="noop")(lambda: None)
        proxy = MessageProxy(actor.message())
        perf = time.perf_counter

        def run() -> float:
            t0 = perf()
            if middleware is None:
                for _ in range(ops):
                    actor()
            else:
                before, after = middleware.before_process_message, middleware.after_process_message
                for _ in range(ops):
                    before(broker, proxy)
                    actor()
                    after(broker, proxy)
            return (perf() - t0) / ops * 1e6

        return run

    runs = {"none": path(None), "stock": path(StockTimeLimit()),
            "timeoutcore": path(TimeLimit())}
    seen: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            seen[name].append(run())
    return {name: round(statistics.median(v), 3) for name, v in seen.items()}


def _pcts(values: list[float]) -> dict[str, Any]:
    return {**bench.percentiles(values), "trials": len(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=100,
                        help="overrunning messages per case, timeoutcore")
    parser.add_argument("--stock-trials", type=int, default=40,
                        help="overrunning CPU-loop messages, stock middleware (~1 s each)")
    parser.add_argument("--rounds", type=int, default=7, help="overhead rounds per worker")
    parser.add_argument("--messages", type=int, default=300, help="1 ms messages per round")
    parser.add_argument("--json", type=Path, default=RESULTS, help="where to write the results")
    args = parser.parse_args()

    from dramatiq_harness import DramatiqWorker
    from silent_peer import SilentPeer

    with ExitStack() as stack:
        url = stack.enter_context(_redis_url())
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        peer = stack.enter_context(SilentPeer())
        workers = {name: stack.enter_context(DramatiqWorker(url, folder, limits=name,
                                                            stopwatch=True))
                   for name in ("none", "stock", "timeoutcore")}
        prefix = f"bench-dramatiq-{os.getpid()}"
        aborting = stack.enter_context(DramatiqWorker(url, folder, registry_prefix=prefix,
                                                      stopwatch=True))
        from timeoutcore.contrib.redis import DeadlineRegistry

        registry = DeadlineRegistry.from_url(url, prefix=prefix)
        stack.callback(registry.close)
        ours, stock = workers["timeoutcore"], workers["stock"]
        late = {
            "cpu_loop_timeoutcore": _pcts(_late_ms(ours, "spin", 60, args.trials)),
            "cpu_loop_stock": _pcts(_late_ms(stock, "spin", 60, args.stock_trials,
                                             jitter=1.0)),
            "time_sleep_timeoutcore": _pcts(_late_ms(ours, "sleep", 60, args.trials)),
            # the stock middleware fails it when the sleep returns: a 2 s sleep, 5 trials
            "time_sleep_2s_stock": _pcts(_late_ms(stock, "sleep", 2, 5)),
            "requests_silent_peer_timeoutcore": _pcts(_late_ms(ours, "http", peer.url,
                                                               args.trials)),
        }
        aborts = {
            "time_sleep": _pcts(_abort_ms(aborting, registry, "sleep", 60, args.trials)),
            "cpu_loop": _pcts(_abort_ms(aborting, registry, "spin", 60, args.trials)),
            "requests_silent_peer": _pcts(_abort_ms(aborting, registry, "http", peer.url,
                                                    args.trials)),
        }
        for worker in workers.values():
            _round(worker, 50)  # warm-up
        per_message: dict[str, list[float]] = {k: [] for k in workers}
        rate: dict[str, list[float]] = {k: [] for k in workers}
        for _ in range(args.rounds):
            for name, worker in workers.items():
                ms, rps = _round(worker, args.messages)
                per_message[name].append(ms * 1000)
                rate[name].append(rps)

    us = {k: statistics.median(v) for k, v in per_message.items()}
    rps = {k: statistics.median(v) for k, v in rate.items()}
    results: dict[str, Any] = {
        "command": "python benchmarks/bench_dramatiq.py",
        "environment": {**bench.environment(), "peers": None},
        "worker": "python -m dramatiq dramatiq_app --processes 1 --threads 1, RedisBroker",
        "limit_ms": LIMIT_MS,
        "stock_interval_ms": 1000,
        "stock_requests_silent_peer": "not measured: stopped only by requests' own timeout",
        **{f"late_{name}": row for name, row in late.items()},
        **{f"abort_to_done_{name}": row for name, row in aborts.items()},
        "one_ms_messages_per_round": args.messages,
        "one_ms_rounds": args.rounds,
        **{f"one_ms_{name}": {
            "in_worker_us_per_message": round(us[name], 1),
            "messages_per_s": round(rps[name], 1),
            "rounds_in_worker_us": [round(x, 1) for x in per_message[name]],
            "rounds_messages_per_s": [round(x, 1) for x in rate[name]],
        } for name in workers},
        # the span in the worker is the overhead figure; the throughput also carries the
        # broker's polling and the machine's other load (rounds vary by tens of %)
        "in_worker_ratio_timeoutcore_vs_stock": round(us["timeoutcore"] / us["stock"], 4),
        "in_worker_ratio_timeoutcore_vs_none": round(us["timeoutcore"] / us["none"], 4),
        "throughput_ratio_timeoutcore_vs_stock": round(rps["timeoutcore"] / rps["stock"], 3),
        "throughput_ratio_timeoutcore_vs_none": round(rps["timeoutcore"] / rps["none"], 3),
        "hooks_in_process_us_per_message": _hooks_cost(args.rounds + 2),
    }
    text = json.dumps(results, indent=2)
    print(text)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
