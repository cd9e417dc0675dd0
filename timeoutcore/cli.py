"""``python -m timeoutcore`` (also the ``timeoutcore`` console script).

``demo``: a thread pool in which some tasks overrun ``thread_deadline(0.25)``; prints each
task's outcome as a JSON line, then a summary. Errors go to stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional, Sequence

from . import ENGINE, DeadlineExceeded, sleep, thread_deadline


def _cpu(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def _blocking_read(seconds: float) -> None:
    """A C call that blocks (read on a pipe nobody writes to within `seconds`)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.read.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)
    r, w = os.pipe()
    writer = threading.Timer(seconds, os.write, (w, b"x"))
    writer.start()
    try:
        buf = ctypes.create_string_buffer(1)
        libc.read(r, buf, 1)
    finally:
        writer.cancel()
        os.close(r)
        os.close(w)


_KINDS: dict[str, Callable[[float], None]] = {
    "cpu-loop": _cpu,
    "timeoutcore.sleep": sleep,
    "blocking-read": _blocking_read,
}


def _task(i: int, kind: str, seconds: float, limit: float) -> dict[str, Any]:
    scope = thread_deadline(limit, label=f"task-{i}")
    status = "completed"
    try:
        with scope:
            _KINDS[kind](seconds)
    except DeadlineExceeded:
        status = "timed_out"
    over = scope.overshoot
    return {
        "task": i,
        "kind": kind,
        "thread": threading.current_thread().name,
        "work_s": seconds,
        "limit_s": limit,
        "status": status,
        "elapsed_s": round(scope.elapsed(), 6),
        "overshoot_ms": None if over is None else round(over * 1e3, 3),
    }


def _alarm_in_worker() -> str:
    def attempt() -> str:
        try:
            signal.signal(signal.SIGALRM, lambda *a: None)
            signal.alarm(1)
            signal.alarm(0)
            return "worked"
        except ValueError as exc:
            return f"ValueError: {exc}"

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(attempt).result()


def demo(args: argparse.Namespace) -> int:
    limit = args.limit
    plan = []
    kinds = list(_KINDS)
    for i in range(args.tasks):
        kind = kinds[i % len(kinds)]
        overrun = i % 4 == 0
        plan.append((i, kind, limit * (4.0 if overrun else 0.2)))
    print(
        f"# engine={ENGINE}: {len(plan)} tasks on {args.workers} pool threads, "
        f"each under thread_deadline({limit:g}); every fourth task overruns",
        flush=True,
    )
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=args.workers, thread_name_prefix="worker") as pool:
        futures = [pool.submit(_task, i, kind, secs, limit) for i, kind, secs in plan]
        results = []
        for fut in futures:
            res = fut.result()
            results.append(res)
            print(json.dumps(res), flush=True)
    wall = time.monotonic() - t0
    timed_out = [r for r in results if r["status"] == "timed_out"]
    overs = sorted(r["overshoot_ms"] for r in timed_out if r["overshoot_ms"] is not None)
    print(f"# {len(results) - len(timed_out)} completed, {len(timed_out)} stopped at their "
          f"deadline, wall {wall:.2f} s")
    if overs:
        print(f"# overshoot after the deadline: median {overs[len(overs) // 2]:.3f} ms, "
              f"max {overs[-1]:.3f} ms")
    print(f"# for comparison, signal.alarm in a pool thread: {_alarm_in_worker()}")
    expected = sum(1 for i, _, _ in plan if i % 4 == 0)
    return 0 if len(timed_out) == expected else 1


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive finite number: {text!r}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="timeoutcore", description="Hard time limits for any Python thread."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("demo", help="a thread pool where some tasks overrun their deadline")
    p.add_argument("--tasks", type=_count, default=12, help="number of tasks (default 12)")
    p.add_argument("--workers", type=_count, default=4, help="pool threads (default 4)")
    p.add_argument("--limit", type=_positive, default=0.25, help="deadline in s (default 0.25)")
    p.set_defaults(func=demo)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    result: int = args.func(args)
    return result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
