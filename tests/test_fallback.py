"""The pure-Python engine (``TIMEOUTCORE_ENGINE=fallback``) is as safe as the native one.

Each workload runs in a subprocess that selects the fallback engine, with a time limit and
a stack dump on a hang (``faulthandler``), so a deadlock is a failure with stacks, not a
hung suite. What is proved: the engine's own lock is never leaked (deadlines landing at
the end of CPU loops in 4 threads: the old engine hung there), the internal interrupt never
reaches user code or a pool's future, a scope entered by hand from a wrapper never leaks
it, exactly one watchdog thread starts however many threads enter their first scope at
once, and a fork's child gets its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from typing import Any

import pytest
from conftest import FREE_THREADED

pytestmark = pytest.mark.skipif(FREE_THREADED, reason="the fallback engine needs a GIL")

_PRELUDE = """\
import faulthandler, json, os, random, sys, threading, time
faulthandler.dump_traceback_later({hang}, exit=True)
import timeoutcore
from timeoutcore import DeadlineExceeded, _fallback
from timeoutcore.errors import _DeadlineInterrupt
assert timeoutcore.ENGINE == "fallback", timeoutcore.ENGINE

def burn(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass

def lock_free():
    # the engine's own lock is free: nobody leaked it
    if not _fallback._wd.lock.acquire(timeout=10):
        return False
    _fallback._wd.lock.release()
    return True
"""


def _run(body: str, hang: float = 90.0) -> dict[str, Any]:
    """Run ``body`` under the fallback engine; it prints one JSON line last."""
    code = _PRELUDE.format(hang=hang) + textwrap.dedent(body)
    env = dict(os.environ, TIMEOUTCORE_ENGINE="fallback")
    env.pop("PYTHONPATH", None)
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=hang + 30, env=env, cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired as exc:  # pragma: no cover - a hang past faulthandler
        pytest.fail(f"hung: {exc.stderr!r}"[-4000:])
    assert p.returncode == 0, f"exit {p.returncode} (1 with stacks: a hang)\n{p.stderr[-6000:]}"
    result: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("switch", [None, 200e-6], ids=["default-switch", "switch-200us"])
def test_deadlines_at_the_end_of_cpu_loops_never_deadlock(switch: float | None) -> None:
    """4 threads x 1,000 blocks whose 0.5-2 ms deadlines land around the end of a CPU
    loop: the old engine's re-injection landed inside its own ``with lock:`` and leaked
    the lock, and every thread hung on it (3 runs of 3)."""
    r = _run(f"""
        if {switch!r} is not None:
            sys.setswitchinterval({switch!r})
        counts = {{"expired": 0, "inside": 0, "completed": 0, "escapes": 0, "other": 0}}
        mu = threading.Lock()

        def worker(seed):
            rnd = random.Random(seed)
            for _ in range(1000):
                limit = rnd.uniform(0.5e-3, 2e-3)
                try:
                    try:
                        with timeoutcore.thread_deadline(limit) as scope:
                            burn(limit * rnd.uniform(0.8, 1.2))
                        kind = "completed"
                    except DeadlineExceeded:
                        kind = "inside" if scope.delivered_at is not None else "expired"
                    x = 0
                    for _ in range(16):  # bytecode after the exit, where a stray one lands
                        x += 1
                except _DeadlineInterrupt:
                    kind = "escapes"
                except BaseException:
                    kind = "other"
                with mu:
                    counts[kind] += 1

        threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        counts["lock_free"] = lock_free()
        print(json.dumps(counts))
    """)
    assert r["escapes"] == 0 and r["other"] == 0, r
    assert r["lock_free"], r
    assert r["expired"] + r["inside"] + r["completed"] == 4000, r
    assert r["expired"] + r["inside"] > 0, r  # deadlines did pass in blocks
    if switch is not None:  # the watchdog gets the GIL in time: interrupts land inside
        assert r["inside"] > 0, r


def test_cancel_hammer_in_a_pool_never_leaks_the_interrupt() -> None:
    """Pool jobs cancelled from another thread in every phase of entry, body and exit:
    every future ends with its result or DeadlineCancelled -- never the private
    _DeadlineInterrupt -- and no pool thread dies (the old engine lost one in
    concurrent/futures/thread.py's work_queue.get)."""
    r = _run("""
        from concurrent.futures import ThreadPoolExecutor
        from timeoutcore import DeadlineCancelled
        sys.setswitchinterval(200e-6)
        live = []
        done = threading.Event()
        cancels = [0]

        def job(seed):
            rnd = random.Random(seed)
            scope = timeoutcore.thread_deadline(30)
            live.append(scope)
            try:
                with scope:
                    burn(rnd.uniform(50e-6, 300e-6))
                    x = 0
                    for _ in range(50):
                        x += 1
            finally:
                live.remove(scope)
            return seed

        def canceller():
            rnd = random.Random(7)
            while not done.is_set():
                if live:
                    try:
                        rnd.choice(live).cancel("hammer")
                        cancels[0] += 1
                    except IndexError:
                        pass
                burn(rnd.uniform(0, 200e-6))

        c = threading.Thread(target=canceller)
        c.start()
        outcomes = {"ok": 0, "cancelled": 0, "interrupt": 0, "other": []}
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(job, i) for i in range(3000)]
            for i, f in enumerate(futures):
                exc = f.exception()
                if exc is None:
                    assert f.result() == i
                    outcomes["ok"] += 1
                elif isinstance(exc, DeadlineCancelled):
                    outcomes["cancelled"] += 1
                elif isinstance(exc, _DeadlineInterrupt):
                    outcomes["interrupt"] += 1
                else:
                    outcomes["other"].append(repr(exc))
            done.set()
            c.join()
            # every pool thread still serves: 4 jobs that wait for each other
            barrier = threading.Barrier(4, timeout=20)
            served = [pool.submit(barrier.wait) for _ in range(4)]
            outcomes["served"] = sorted(f.result(timeout=30) for f in served)
            outcomes["pool_threads"] = len(pool._threads)
        outcomes["cancels"] = cancels[0]
        outcomes["lock_free"] = lock_free()
        print(json.dumps(outcomes))
    """)
    assert r["interrupt"] == 0 and r["other"] == [], r
    assert r["ok"] + r["cancelled"] == 3000, r
    assert 0 < r["cancelled"] <= r["cancels"], r
    assert r["served"] == [0, 1, 2, 3] and r["pool_threads"] == 4, r
    assert r["lock_free"], r


def test_a_scope_entered_by_hand_from_a_wrapper_never_leaks_the_interrupt() -> None:
    """The shape framework hooks push users into (a death-penalty class, ExitStack): the
    interrupt is held in the wrapper's __exit__ until the scope's own exit claims it."""
    r = _run("""
        import contextlib
        sys.setswitchinterval(200e-6)

        class Guard:
            def __enter__(self):
                self.scope = timeoutcore.thread_deadline(0.002)
                self.scope.__enter__()
                return self.scope

            def __exit__(self, et, ev, tb):
                scope = self.scope
                return scope.__exit__(et, ev, tb)

        counts = {"raised": 0, "inside": 0, "completed": 0, "escapes": 0}
        rnd = random.Random(3)
        for i in range(3000):
            try:
                try:
                    if i % 2:
                        with Guard() as scope:
                            burn(0.002 * rnd.uniform(0.7, 1.3))
                    else:
                        with contextlib.ExitStack() as stack:
                            scope = stack.enter_context(timeoutcore.thread_deadline(0.002))
                            burn(0.002 * rnd.uniform(0.7, 1.3))
                    counts["completed"] += 1
                except DeadlineExceeded:
                    counts["raised"] += 1
                    counts["inside"] += scope.delivered_at is not None
                x = 0
                for _ in range(16):
                    x += 1
            except _DeadlineInterrupt:
                counts["escapes"] += 1
        counts["lock_free"] = lock_free()
        print(json.dumps(counts))
    """)
    assert r["escapes"] == 0 and r["lock_free"], r
    assert r["inside"] > 0, r  # interrupts did land in the guarded code


def test_exactly_one_watchdog_however_many_threads_start_at_once() -> None:
    """8 threads entering their first scope at the same moment start one watchdog
    (the old check-then-start, outside any lock, started 2-8), 40 times over, each time
    with a fresh engine state."""
    r = _run("""
        sys.setswitchinterval(1e-6)  # switch as often as possible: races show
        started = []

        def watchdogs():
            return {t for t in threading.enumerate() if t.name == "timeoutcore-watchdog"}

        for rep in range(40):
            before = watchdogs()
            _fallback._wd = _fallback._Watchdog()
            gate = threading.Barrier(8)

            def first_scope():
                gate.wait()
                with timeoutcore.thread_deadline(10):
                    pass

            threads = [threading.Thread(target=first_scope) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            started.append(len(watchdogs() - before))
        print(json.dumps({"started": started}))
    """)
    assert r["started"] == [1] * 40, r


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forks_child_gets_its_own_watchdog_and_deadlines() -> None:
    """The child of a fork made inside a scope has no watchdog thread: it starts exactly
    one, and a deadline in the child stops a CPU loop there."""
    r = _run("""
        import warnings
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
        with timeoutcore.thread_deadline(60):
            burn(0.001)
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                out = {}
                try:
                    t0 = time.monotonic()
                    try:
                        with timeoutcore.thread_deadline(0.05):
                            burn(10)
                        out["stopped"] = False
                    except DeadlineExceeded:
                        out["stopped"] = True
                    out["took"] = time.monotonic() - t0
                    out["watchdogs"] = sum(t.name == "timeoutcore-watchdog"
                                           for t in threading.enumerate())
                    out["lock_free"] = lock_free()
                finally:
                    os.write(w, json.dumps(out).encode())
                    os._exit(0)
            os.close(w)
            data = b""
            while chunk := os.read(r, 4096):
                data += chunk
            os.close(r)
            _, status = os.waitpid(pid, 0)
        child = json.loads(data)
        child["status"] = status
        print(json.dumps(child))
    """)
    assert r["status"] == 0 and r["stopped"] and r["took"] < 5, r
    assert r["watchdogs"] == 1 and r["lock_free"], r


def test_a_logging_loop_stopped_by_its_deadline_never_leaves_the_handler_lock_held() -> None:
    """Deadlines landing in logging (handler lock, module lock) are delivered outside it:
    after hundreds of stopped blocks every lock is free and logging still works."""
    r = _run("""
        import io, logging
        sys.setswitchinterval(200e-6)
        stream = io.StringIO()
        handler = logging.StreamHandler(stream)
        log = logging.getLogger("fb")
        log.propagate = False
        log.addHandler(handler)
        stopped = deferred = 0

        def worker(n):
            global stopped, deferred
            for i in range(n):
                try:
                    with timeoutcore.thread_deadline(0.001) as scope:
                        while True:
                            log.warning("line %d", i)
                            logging.getLogger(f"fb.child{i % 5}").setLevel(logging.INFO)
                except DeadlineExceeded:
                    stopped += 1
                    deferred += bool(scope.deferred)

        threads = [threading.Thread(target=worker, args=(150,)) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        free = handler.lock.acquire(timeout=10)
        if free:
            handler.lock.release()
        log.warning("after")
        print(json.dumps({"stopped": stopped, "deferred": deferred, "handler_free": free,
                          "lock_free": lock_free(),
                          "last": stream.getvalue().splitlines()[-1]}))
    """)
    assert r["stopped"] == 450 and r["handler_free"] and r["lock_free"], r
    assert r["last"] == "after", r


def test_a_loop_whose_time_goes_to_weakref_callbacks_ends_at_its_deadline() -> None:
    """CPython drops an exception raised in a weakref callback. A loop that spends nearly
    all its time in such callbacks got every re-send of the interrupt in another one and
    never ended (the soft exception, sent once, was simply lost). The engine now learns the
    callback and sends again: the hard limit ends each block, the soft exception reaches
    the ``except`` around its loop (the report of the program's soft exception reaches its
    hook; the internal interrupt's does not). Each block's callback is one the engine has not learned
    (code objects that compare equal count as one: the constant differs)."""
    r = _run("""
        import weakref
        SRC = "def callback(ref):\\n    for _ in range(20000 + {n}):\\n        pass\\n"
        class O:
            pass
        seen = []
        sys.unraisablehook = seen.append

        def fresh(n):
            ns = {}
            exec(compile(SRC.format(n=n), f"<callback {n}>", "exec"), ns)
            return ns["callback"]

        def loop(cb):
            while True:
                o = O(); ref = weakref.ref(o, cb); del o; del ref

        hard, soft = [], []
        for n in range(4):
            t0 = time.monotonic()
            try:
                with timeoutcore.thread_deadline(0.1):
                    loop(fresh(n))
            except DeadlineExceeded:
                hard.append(time.monotonic() - t0)
        for n in range(4, 8):
            with timeoutcore.thread_deadline(20.0, soft_limit=0.05, soft_raise=True):
                try:
                    loop(fresh(n))
                except timeoutcore.SoftDeadlineExceeded:
                    soft.append(True)
            burn(0.05)  # nothing sent again lands after the block
        kinds = [u.exc_type.__name__ for u in seen]
        dropped = _fallback._dl.stats["dropped"]
        print(json.dumps({"hard": hard, "soft": soft, "kinds": kinds, "dropped": dropped,
                          "lock": lock_free()}))
    """, hang=60.0)
    assert len(r["hard"]) == 4 and max(r["hard"]) < 10.0, r
    assert r["soft"] == [True] * 4, r
    # drops did happen, of both: the soft exception's are reported, the interrupt's not
    assert r["kinds"] and set(r["kinds"]) == {"SoftDeadlineExceeded"}, r
    assert r["dropped"] > len(r["kinds"]), r
    assert r["lock"], r
