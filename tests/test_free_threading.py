"""Scopes under real parallelism: the GIL stays off on free-threaded CPython, and a stress
test in which 8 threads enter and exit scopes while 3 others cancel and reschedule them at
random, some before they are entered. The stress test runs on every interpreter (with a GIL
it exercises the same interleavings at switch-interval granularity); on a free-threaded
build the threads really run at once and the locks of csrc/tc_lock.h are what keep it
correct: the core lock, and the scope's and its slot's on a plain entry and exit."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from conftest import FREE_THREADED

import timeoutcore
from timeoutcore import DeadlineCancelled, DeadlineExceeded
from timeoutcore.errors import _DeadlineInterrupt

native_only = pytest.mark.skipif(timeoutcore.ENGINE != "native",
                                 reason="the fallback engine documents rare escapes")


@pytest.mark.skipif(not FREE_THREADED, reason="a free-threaded CPython only")
def test_the_gil_stays_off_through_import_blocks_and_every_feature(tmp_path: Any) -> None:
    code = (
        "import sys, time, timeoutcore\n"
        "from concurrent.futures import wait\n"
        "assert timeoutcore.ENGINE == 'native', timeoutcore.ENGINE\n"
        "def spin():  # its own frame: CPython 3.13.0 skips the with-exit of a frame\n"
        "    while True:  # whose while loop is interrupted (cpython#130279)\n"
        "        pass\n"
        "with timeoutcore.thread_deadline(0.02, raise_on_timeout=False) as s:\n"
        "    spin()\n"
        "assert s.expired() and s.result.status == 'timed_out'\n"
        "import threading\n"
        "seen = []\n"
        "soft_ran = threading.Event()\n"
        "def on_soft(s):  # the block lasts until the callback ran (capped below the hard limit)\n"
        "    seen.append(s)\n"
        "    soft_ran.set()\n"
        "with timeoutcore.thread_deadline(5, soft=0.01, on_soft=on_soft):\n"
        "    soft_ran.wait(4)\n"
        "assert len(seen) == 1, seen\n"
        "m = timeoutcore.metrics.enable()\n"
        "with timeoutcore.DeadlineExecutor(max_workers=2) as ex:\n"
        "    f = ex.submit_with(0.05, time.sleep, 5)\n"
        "    wait([f])\n"
        "assert isinstance(f.exception(), timeoutcore.DeadlineExceeded)\n"
        "assert timeoutcore.run(['sleep', '5'], limit=0.05).status == 'timed_out'\n"
        "timeoutcore.patch()\n"
        "with timeoutcore.thread_deadline(0.02, raise_on_timeout=False) as s:\n"
        "    time.sleep(5)\n"
        "assert s.expired()\n"
        "timeoutcore.unpatch()\n"
        "assert m.snapshot()['total'] >= 2, m.snapshot()\n"
        "import timeoutcore.contrib.redis, timeoutcore.contrib.celery\n"
        "assert sys._is_gil_enabled() is False\n"
        "print(timeoutcore.JSON_ENGINE)\n"
    )
    proc = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", code],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "GIL" not in proc.stderr, proc.stderr
    assert proc.stdout.strip() in ("json", "orjson")


class Board:
    """The scopes active right now, for the chaos threads to pick from."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active: list[Any] = []
        self.early: set[int] = set()  # ids of scopes put here before their entry

    def add(self, scope: Any, early: bool = False) -> None:
        with self.lock:
            self.active.append(scope)
            if early:
                self.early.add(id(scope))

    def remove(self, scope: Any) -> None:
        with self.lock:
            self.active.remove(scope)
            self.early.discard(id(scope))

    def pick(self, rnd: random.Random) -> tuple[Any, bool]:
        with self.lock:
            if not self.active:
                return None, False
            scope = rnd.choice(self.active)
            return scope, id(scope) in self.early


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _worker(board: Board, seed: int, blocks: int, out: list, errors: list,
            started: threading.Barrier) -> None:
    rnd = random.Random(seed)
    counts = {"blocks": 0, "timeouts": 0, "cancelled": 0, "escapes": 0, "wrong": 0}
    with timeoutcore.thread_deadline(None):  # this thread's slot and kernel timer exist now
        pass
    started.wait()
    try:
        for i in range(blocks):
            limit = rnd.choice([0.0005, 0.002, 0.01, 0.5])
            body = rnd.uniform(0, 0.004)
            # Every 4th scope is on the board before it is entered: the chaos threads may
            # cancel or reschedule it before and while its entry runs (a plain entry holds
            # the scope's own lock and its slot's, not the core lock: csrc/tc_lock.h).
            scope = timeoutcore.thread_deadline(limit)
            early = i % 4 == 3
            if early:
                board.add(scope, early=True)
            try:
                try:
                    with scope:
                        if not early:
                            board.add(scope)
                        try:
                            if i % 3 == 0:
                                timeoutcore.sleep(body)
                            elif i % 3 == 1:
                                time.sleep(body)
                            else:
                                _spin(body)
                            if i % 5 == 0:  # a nested scope, exited normally or by its own limit
                                with timeoutcore.thread_deadline(0.5):
                                    _spin(body / 4)
                        finally:
                            board.remove(scope)
                except DeadlineCancelled:
                    counts["cancelled"] += 1
                    if not scope.cancelled():
                        counts["wrong"] += 1
                except DeadlineExceeded as exc:
                    counts["timeouts"] += 1
                    if exc.scope is not scope or not scope.expired():
                        counts["wrong"] += 1
                if timeoutcore.current_scope() is not None or scope.active:
                    counts["wrong"] += 1
                x = 0
                for _ in range(32):  # bytecode after the exit, where a stray interrupt lands
                    x += 1
            except _DeadlineInterrupt:
                counts["escapes"] += 1
            counts["blocks"] += 1
    except BaseException as exc:  # noqa: BLE001 - reported by the test, not lost in a thread
        errors.append(repr(exc))
    out.append(counts)


def _chaos(board: Board, seed: int, stop: threading.Event, out: list, errors: list,
           must_stop: list) -> None:
    rnd = random.Random(seed)
    n = 0
    try:
        while not stop.is_set():
            scope, early = board.pick(rnd)
            if scope is None:
                time.sleep(0)
                continue
            what = rnd.random()
            try:
                if early and what < 0.8:
                    # A scope not yet (or just) entered is only cancelled: a reschedule
                    # after the cancel would take it back before the entry fires it. A
                    # cancel that took effect before the exit began (before the entry, or
                    # racing it) must stop the block: it cannot end without firing.
                    scope.cancel()
                    if getattr(scope, "_cancelled", False) and scope.exited_at is None:
                        must_stop.append(scope)
                elif what < 0.3:
                    scope.cancel()
                elif what < 0.6:
                    scope.reschedule(time.monotonic() + rnd.uniform(0, 0.003))
                elif what < 0.8:
                    scope.reschedule(None)
                else:
                    scope.remaining(), scope.expired(), scope.deferred, scope.overshoot
            except RuntimeError:  # it exited meanwhile: reschedule() refuses, as documented
                pass
            n += 1
    except BaseException as exc:  # noqa: BLE001
        errors.append(repr(exc))
    out.append(n)


@native_only
def test_stress_parallel_scopes_with_random_cancel_and_reschedule() -> None:
    blocks, workers, chaos = 1500, 8, 3
    board = Board()
    results: list = []
    chaos_results: list = []
    errors: list = []
    must_stop: list = []
    stop = threading.Event()
    from timeoutcore import _native

    started = threading.Barrier(workers + 1)
    ws = [threading.Thread(target=_worker, args=(board, s, blocks, results, errors, started))
          for s in range(workers)]
    cs = [threading.Thread(target=_chaos,
                           args=(board, 100 + s, stop, chaos_results, errors, must_stop))
          for s in range(chaos)]
    for t in ws + cs:
        t.start()
    started.wait(timeout=60)
    during = _native.stats()  # every worker owns a slot and a timer now
    for t in ws:
        t.join(timeout=240)
    stop.set()
    for t in cs:
        t.join(timeout=30)
    assert not [t for t in ws + cs if t.is_alive()], "a thread hung"
    assert errors == []
    total = {k: sum(r[k] for r in results) for k in results[0]}
    assert total["blocks"] == blocks * workers
    assert total["escapes"] == 0, total
    assert total["wrong"] == 0, total
    # the test only means something if every kind of stop really happened, many times
    assert total["timeouts"] > 100 and total["cancelled"] > 100, total
    assert sum(chaos_results) > 1000, chaos_results
    # no cancel is lost: not one issued before its block's entry, nor one racing it
    lost = [sc for sc in must_stop if not sc.expired()]
    assert len(must_stop) > 100 and lost == [], (len(must_stop), lost[:3])
    # every worker's slot and kernel timer went with its thread (slot_release at thread exit);
    # counted against the moment they all existed, not the test's start: a thread of an
    # earlier test may end meanwhile (a CI run saw 2 -> 1 live slots with the workers gone)
    def released() -> int:
        now = _native.stats()
        return min(during["timers_live"] - now["timers_live"],
                   during["slots_live"] - now["slots_live"])

    end = time.monotonic() + 10
    while released() < workers and time.monotonic() < end:
        time.sleep(0.01)
    assert released() >= workers, (during, _native.stats())


@pytest.mark.skipif(not FREE_THREADED, reason="a free-threaded CPython only")
def test_the_fallback_engine_is_refused_without_a_gil(tmp_path: Any) -> None:
    env = dict(os.environ, TIMEOUTCORE_ENGINE="fallback")
    proc = subprocess.run([sys.executable, "-c", "import timeoutcore"], env=env,
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode != 0
    assert "needs a GIL" in proc.stderr, proc.stderr
