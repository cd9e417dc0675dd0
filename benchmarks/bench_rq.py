"""RQ job limits: timeoutcore.contrib.rq against RQ's own death penalties, real ``rq worker``
processes over a real Redis, in one run.

    python benchmarks/bench_rq.py [--json benchmarks/results/rq.json] [--trials 20]
        [--rounds 21] [--jobs 200] [--parts latency,stop,overhead,penalty] [--quick]

(``--parts``: what to measure; the JSON file keeps the other parts of an earlier run.)

* **Limit -> job failed**: jobs that overrun a 1 s ``job_timeout`` (a whole second, so every
  mechanism can take it), blocked in ``time.sleep`` or in a pure-Python CPU loop; how late
  the job ended, from RQ's own record (``ended_at - started_at - limit``), p50/p99, and how
  each failed. Workers: ``timeoutcore.contrib.rq.SimpleWorker``; RQ's ``SimpleWorker`` with
  ``TimerDeathPenalty`` (what a worker whose jobs are not in the main thread uses);
  RQ's ``SimpleWorker`` as it comes (``UnixSignalDeathPenalty``, which works there only
  because the CLI runs it in the main thread); RQ's forking ``Worker`` (``SIGALRM`` in the
  horse) and ``timeoutcore.contrib.rq.Worker``. Plus a 0.2 s limit, which only timeoutcore
  can give (RQ 3 truncates ``job_timeout`` to whole seconds).
* **Stop-job**: ``send_stop_job_command`` to a job blocked in ``time.sleep`` without a
  limit on timeoutcore's ``SimpleWorker`` (RQ's own does nothing there): from the command
  to the job's end, p50/p99.
* **Per-job overhead**: rounds of 1 ms CPU jobs (enqueued in one pipeline, then drained by
  the worker), alternated between the three ``SimpleWorker`` variants so that drift hits
  them alike; per job, from the first job's start to the last one's end (RQ's record): the
  median and the best round of each, and the median over rounds of the ratio within a
  round (the load of that moment on both sides). On a shared machine the rounds vary far
  more than the integration costs: the in-process figure below is the precise one.
* **Enter + exit of the penalty in process** (no RQ around it), in microseconds: what the
  integration itself adds to a job.

The workers run from tests/ (tests/rq_harness.py, tests/rq_jobs.py). Redis:
``$TIMEOUTCORE_TEST_REDIS_URL``, else a ``redis-server`` started for the run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"
RESULTS = HERE / "results" / "rq.json"

OURS = "timeoutcore.contrib.rq.SimpleWorker"
TIMER = "rq_jobs.TimerSimpleWorker"
STOCK = "rq.SimpleWorker"
FORK_STOCK = "rq.Worker"
FORK_OURS = "timeoutcore.contrib.rq.Worker"
TITLES = {
    OURS: "timeoutcore SimpleWorker",
    TIMER: "RQ SimpleWorker + TimerDeathPenalty",
    STOCK: "RQ SimpleWorker (UnixSignalDeathPenalty, main thread)",
    FORK_STOCK: "RQ Worker, forking (UnixSignalDeathPenalty in the horse)",
    FORK_OURS: "timeoutcore Worker, forking",
}
LIMIT = 1  # s: a whole second, which every mechanism accepts
BLOCK_FOR = 3.0  # s a job blocks if nothing stops it (a mechanism that cannot: +2 s late)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _summary(late_s: list[float], outcomes: list[str]) -> dict[str, Any]:
    kinds = sorted(set(outcomes))
    return {"p50_ms": round(_pct(late_s, 0.5) * 1e3, 2),
            "p99_ms": round(_pct(late_s, 0.99) * 1e3, 2),
            "max_ms": round(max(late_s) * 1e3, 2), "trials": len(late_s),
            "outcome": {k: outcomes.count(k) for k in kinds}}


def _outcome(job: Any) -> str:
    from rq_harness import wait_ended

    status = wait_ended(job, timeout=60)
    if status != "failed":
        return status
    result = job.latest_result()
    text = (result.exc_string if result is not None else None) or ""
    return text.strip().splitlines()[-1].split(":")[0] if text.strip() else "failed"


def limit_to_failed(url: str, folder: Path, worker_class: str, kinds: dict[str, Any],
                    trials: int, limit: float = LIMIT) -> dict[str, Any]:
    """One worker of ``worker_class``; ``trials`` overrunning jobs of each kind, one at a
    time; how late each ended."""
    from rq_harness import RQWorker

    from timeoutcore.contrib.rq import Queue

    out: dict[str, Any] = {}
    with RQWorker(url, worker_class, folder) as worker:
        queue = Queue(worker.queue, connection=worker.redis)
        for kind, fn in kinds.items():
            late, outcomes = [], []
            for _ in range(trials):
                job = queue.enqueue(fn, BLOCK_FOR, job_timeout=limit)
                outcomes.append(_outcome(job))
                job.refresh()
                late.append((job.ended_at - job.started_at).total_seconds() - limit)
            out[kind] = _summary(late, outcomes)
            print(f"  {TITLES[worker_class]:<58} {kind:<6} limit {limit} s: "
                  f"p50 {out[kind]['p50_ms']:8.1f} ms  p99 {out[kind]['p99_ms']:8.1f} ms  "
                  f"{out[kind]['outcome']}", flush=True)
    return out


def stop_job(url: str, folder: Path, trials: int) -> dict[str, Any]:
    """``send_stop_job_command`` to a job blocked in ``time.sleep`` with no limit, on
    timeoutcore's SimpleWorker: from the command to the job's end (RQ's ``ended_at``)."""
    from datetime import datetime, timezone

    import rq_jobs
    from rq.command import send_stop_job_command
    from rq_harness import RQWorker, wait_status

    from timeoutcore.contrib.rq import Queue

    late, outcomes = [], []
    with RQWorker(url, OURS, folder) as worker:
        queue = Queue(worker.queue, connection=worker.redis)
        for _ in range(trials):
            job = queue.enqueue(rq_jobs.sleep, 60, job_timeout=-1)
            wait_status(job, "started")
            time.sleep(0.05)
            sent = datetime.now(timezone.utc)
            send_stop_job_command(worker.redis, job.id)
            outcomes.append(_outcome(job))
            job.refresh()
            late.append((job.ended_at - sent).total_seconds())
    out = _summary(late, outcomes)
    print(f"  {TITLES[OURS]:<58} stop-job -> ended: p50 {out['p50_ms']:8.1f} ms  "
          f"p99 {out['p99_ms']:8.1f} ms  {out['outcome']}", flush=True)
    return out


def overhead(url: str, folder: Path, rounds: int, jobs: int) -> dict[str, Any]:
    """Alternated rounds of ``jobs`` 1 ms CPU jobs through each SimpleWorker variant."""
    import rq_jobs
    from rq_harness import RQWorker, wait_ended

    from timeoutcore.contrib.rq import Queue

    variants = (OURS, TIMER, STOCK)
    workers = {v: RQWorker(url, v, folder) for v in variants}
    per_job: dict[str, list[float]] = {v: [] for v in variants}
    try:
        for r in range(rounds):
            order = variants if r % 2 == 0 else tuple(reversed(variants))
            for variant in order:
                worker = workers[variant]
                queue = Queue(worker.queue, connection=worker.redis)
                batch = queue.enqueue_many([
                    Queue.prepare_data(rq_jobs.cpu, (0.001,), timeout=60, result_ttl=60)
                    for _ in range(jobs)])
                wait_ended(batch[-1], timeout=120)
                first, last = batch[0], batch[-1]
                first.refresh()
                last.refresh()
                span = (last.ended_at - first.started_at).total_seconds()
                per_job[variant].append(span / (jobs - 1) * 1e3)
                for job in batch:
                    job.delete()
    finally:
        for worker in workers.values():
            worker.stop()
    med = {v: statistics.median(per_job[v]) for v in variants}
    best = {v: min(per_job[v]) for v in variants}

    def paired(other: str) -> float:
        """The median over rounds of (ours / other) within the same round: what the two
        cost next to each other, with the load of that moment on both."""
        return round(statistics.median(a / b for a, b in zip(per_job[OURS], per_job[other])),
                     4)

    result = {
        "rounds": rounds, "jobs_per_round": jobs, "job": "cpu(0.001)",
        "per_job_ms_median": {TITLES[v]: round(med[v], 3) for v in variants},
        "per_job_ms_min": {TITLES[v]: round(best[v], 3) for v in variants},
        "per_job_ms_rounds": {TITLES[v]: [round(x, 3) for x in per_job[v]] for v in variants},
        "ratio_timeoutcore_to_rq_simpleworker_paired": paired(STOCK),
        "ratio_timeoutcore_to_timer_paired": paired(TIMER),
        "ratio_timeoutcore_to_rq_simpleworker_min": round(best[OURS] / best[STOCK], 4),
    }
    for v in variants:
        print(f"  {TITLES[v]:<58} median {med[v]:.3f} ms, best {best[v]:.3f} ms per 1 ms job",
              flush=True)
    print(f"  ours / RQ SimpleWorker, paired rounds: "
          f"{result['ratio_timeoutcore_to_rq_simpleworker_paired']}", flush=True)
    return result


def in_process(repeat: int = 20000) -> dict[str, Any]:
    """Enter + exit of each penalty (construction included, as RQ makes one per job) around
    an empty body, main thread: the best of 7 rounds, in microseconds."""
    from rq.timeouts import JobTimeoutException, TimerDeathPenalty, UnixSignalDeathPenalty

    from timeoutcore.contrib.rq import DeathPenalty

    def per_op(make: Callable[[], Any], n: int) -> float:
        rounds = []
        for _ in range(7):
            t0 = time.perf_counter()
            for _ in range(n):
                with make():
                    pass
            rounds.append((time.perf_counter() - t0) / n * 1e6)
        return round(min(rounds), 2)  # the best round: others are slowed by other work

    out = {
        "timeoutcore DeathPenalty": per_op(lambda: DeathPenalty(60, JobTimeoutException,
                                                                job_id="j"), repeat),
        "RQ UnixSignalDeathPenalty": per_op(lambda: UnixSignalDeathPenalty(60, JobTimeoutException),
                                            repeat),
        "RQ TimerDeathPenalty": per_op(lambda: TimerDeathPenalty(60, JobTimeoutException),
                                       max(200, repeat // 50)),
    }
    for name, us in out.items():
        print(f"  {name:<58} {us:8.2f} us per job", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=RESULTS)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="few trials (a smoke run)")
    parser.add_argument("--parts", default="latency,stop,overhead,penalty",
                        help="comma-separated subset of latency,stop,overhead,penalty; the "
                             "JSON file keeps the parts not run")
    args = parser.parse_args()
    if args.quick:
        args.trials, args.rounds, args.jobs = 3, 3, 60
    parts = set(args.parts.split(","))
    results: dict[str, Any] = (json.loads(args.json.read_text()) if args.json.exists()
                               else {})
    sys.path.insert(0, str(TESTS))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
    import rq_jobs
    from redis_server import ENV, RedisServer

    import timeoutcore

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        server = None
        url = os.environ.get(ENV)
        if not url:
            server = RedisServer(folder / "redis").start()
            url = server.url
        try:
            kinds = {"sleep": rq_jobs.sleep, "cpu": rq_jobs.cpu}
            if "latency" in parts:
                print(f"limit -> job failed ({args.trials} trials per kind)", flush=True)
                latency: dict[str, Any] = {"limit_s": LIMIT, "job_blocks_for_s": BLOCK_FOR}
                for worker_class in (OURS, TIMER, STOCK, FORK_OURS, FORK_STOCK):
                    latency[TITLES[worker_class]] = limit_to_failed(
                        url, folder, worker_class, kinds, args.trials)
                results["limit_to_failed"] = latency
                results["sub_second_limit"] = {
                    "limit_s": 0.2,
                    TITLES[OURS]: limit_to_failed(url, folder, OURS, kinds, args.trials,
                                                  limit=0.2)}
            if "stop" in parts:
                print(f"stop-job ({args.trials} trials)", flush=True)
                results["stop_job"] = stop_job(url, folder, args.trials)
            if "overhead" in parts:
                print(f"per-job overhead, {args.rounds} rounds of {args.jobs} jobs",
                      flush=True)
                results["overhead"] = overhead(url, folder, args.rounds, args.jobs)
        finally:
            if server is not None:
                server.stop()
    if "penalty" in parts:
        print("penalty enter + exit, in process", flush=True)
        results["penalty_enter_exit_us"] = in_process()
    environment = {
        "command": f"python benchmarks/bench_rq.py --parts {args.parts}"
                   + (" --quick" if args.quick else ""),
        "python": platform.python_version(), "machine": platform.machine(),
        "cpus": os.cpu_count(), "load": round(os.getloadavg()[0], 2),
        "engine": timeoutcore.ENGINE, "rq": __import__("rq").__version__,
        "date": time.strftime("%Y-%m-%d"),
    }
    runs = results.get("environment")
    if not isinstance(runs, dict) or "command" in runs:  # one entry per part measured
        runs = {}
    runs.update({part: environment for part in sorted(parts)})
    results["environment"] = runs
    args.json.parent.mkdir(exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(f"written to {args.json}")


if __name__ == "__main__":
    main()
