"""What each Celery pool leaves behind, with and without ``contrib.celery.install``'s
options: prints the table (docs/celery.md, "No process outlives its task", explains it).

    python benchmarks/celery_cleanup.py [--redis redis://127.0.0.1:6379/0] [--pools ...]

Real ``celery worker`` processes (tests/celery_harness.py) over a real Redis; the tasks are
tests/celery_app.py's ``p.*``, each recording the pid of every process it starts. For each
pool, configuration and scenario it prints what the task ended with and how many recorded
processes were still running, or zombies nobody reaps, a second later; then it kills them. Without
``install``, the threads and solo pools ignore limits: a task is then given 4 s and counted
as "runs on". Needs a Redis: ``--redis``, else TIMEOUTCORE_TEST_REDIS_URL, else a
redis-server started for the run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Optional

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

from celery_harness import Worker  # noqa: E402

CONFIGS = {  # name -> Worker options
    "no install": {"install": False},
    "install(patch=True)": {"install": True, "patch": True},
    "+ reap, shutdown_grace=1": {"install": True, "patch": True, "reap": True,
                                 "shutdown_grace": 1.0},
}
# p.left_running last: where nothing stops it, it keeps its thread (under solo, the worker)
TASKS = ["p.run", "p.communicate", "p.soft", "p.escape", "p.zombie", "p.left_running"]
SHUTDOWNS = ["revoke", "warm", "cold"]
RUNS_ON = 4.0  # s a task is given where nothing enforces its limit


def _pids(path: Path) -> list[int]:
    try:
        return [int(x) for x in path.read_text().split()]
    except FileNotFoundError:
        return []


def _state(pid: int) -> Optional[tuple[str, int]]:
    """(state, ppid) of ``pid``, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return fields[0], int(fields[1])
    except (FileNotFoundError, ProcessLookupError):
        return None


def _left(path: Path) -> str:
    """How many recorded processes run, and how many are zombies that no init will reap
    (a zombie re-parented to PID 1 is init's to reap, and goes when it does)."""
    time.sleep(1.0)
    running = zombies = 0
    for pid in set(_pids(path)):
        state = _state(pid)
        if state is None or (state[0] == "Z" and state[1] == 1):
            continue
        if state[0] == "Z":
            zombies += 1
        else:
            running += 1
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    out = f"{running} running"
    return out + (f", {zombies} zombie" if zombies else "")


def _outcome(result: Any, timeout: float) -> str:
    try:
        value = result.get(timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - reported
        name = type(exc).__name__
        return "runs on" if name == "TimeoutError" else name
    return "ok" if value != "ran to the end" else "ran to the end"


def _wait_started(path: Path, n: int = 2) -> None:
    end = time.monotonic() + 20
    while len(_pids(path)) < n and time.monotonic() < end:
        time.sleep(0.02)


def _slug(config: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in config)


def _worker(url: str, pool: str, folder: Path, options: dict[str, Any]) -> Worker:
    return Worker(url, pool, folder, concurrency=1 if pool == "prefork" else 2,
                  **options)


def limits(url: str, pool: str, config: str, folder: Path) -> Iterator[tuple[str, str, str]]:
    with _worker(url, pool, folder, CONFIGS[config]) as worker:
        for task in TASKS:
            path = folder / f"{pool}-{_slug(config)}-{task}.pids"
            result = worker.app.tasks[task].delay(str(path))
            yield task, _outcome(result, RUNS_ON + 2), _left(path)


def shutdown(url: str, pool: str, config: str, folder: Path,
             how: str) -> tuple[str, str, str, Optional[float]]:
    worker = _worker(url, pool, folder, CONFIGS[config])
    path = folder / f"{pool}-{_slug(config)}-{how}.pids"
    took: Optional[float] = None
    try:
        result = worker.app.tasks["p.long"].delay(str(path))
        _wait_started(path)
        start = time.monotonic()
        if how == "revoke":
            worker.app.control.revoke(result.id, terminate=True)
            outcome = _outcome(result, RUNS_ON)
        else:
            worker.proc.send_signal(signal.SIGTERM if how == "warm" else signal.SIGQUIT)
            try:
                worker.proc.wait(10)
                took = time.monotonic() - start
            except Exception:  # noqa: BLE001 - still running: reported as such
                pass
            outcome = result.state
    finally:
        if worker.proc.poll() is None:
            worker.proc.kill()
            worker.proc.wait()
    return how, outcome, _left(path), took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis", default=os.environ.get("TIMEOUTCORE_TEST_REDIS_URL"))
    parser.add_argument("--pools", nargs="*", default=["prefork", "threads", "solo"])
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        url = args.redis
        if not url:
            from redis_server import session_redis

            url = stack.enter_context(session_redis(lambda: Path(tempfile.mkdtemp())))
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        print("| pool | configuration | " + " | ".join(TASKS + SHUTDOWNS) + " |")
        print("|---" * (2 + len(TASKS) + len(SHUTDOWNS)) + "|")
        for pool in args.pools:
            for config in CONFIGS:
                cells = [f"{outcome}, {left}" for _, outcome, left in
                         limits(url, pool, config, folder)]
                for how in SHUTDOWNS:
                    _, outcome, left, took = shutdown(url, pool, config, folder, how)
                    exit_ = "" if how == "revoke" else (
                        f", exit {took:.1f} s" if took is not None else ", no exit in 10 s")
                    cells.append(f"{outcome}, {left}{exit_}")
                print(f"| {pool} | {config} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
