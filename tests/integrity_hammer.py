"""The integrity hammer: many short deadlines over code that uses the standard library's
locks, conditions, queues, futures and logging on objects shared by every worker.

Run as a program (``python tests/integrity_hammer.py --tasks 3000 --switch 200e-6``) it
prints one JSON line: what fired, where it was delivered, and every broken invariant it
found afterwards. tests/test_integrity.py runs it in a subprocess with a time limit, so a
deadlock is a failure with stacks, not a hung suite.

A deadline that lands inside ``logging.Handler.acquire`` right after the lock was taken,
in ``Condition.__enter__``, ``Queue`` accounting or ``Future.set_result`` leaves a lock
held or an invariant half-done; this workload goes through each of them all the time.

With the native core, a fifth of the tasks may also be cancelled "remotely", the way the Redis
registry's cancels arrive: a sender thread writes cancel messages for random live (and
just-ended) tokens to a socket, a listener waits on it with ``control=True``, and the core
fires the tasks off the socket without the GIL (csrc/accel_remote_relay.c).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures as cf
import faulthandler
import io
import itertools
import json
import logging
import queue
import random
import socket
import sys
import threading
import time
from typing import Any

import timeoutcore
from timeoutcore import DeadlineExceeded
from timeoutcore.errors import _DeadlineInterrupt


TIGHT = 64


class Shared:
    """Objects every worker uses at once."""

    def __init__(self) -> None:
        self.stream = io.StringIO()
        self.handler = logging.StreamHandler(self.stream)
        self.handler.setFormatter(logging.Formatter("%(threadName)s %(message)s"))
        self.log = logging.getLogger("hammer")
        self.log.propagate = False
        self.log.setLevel(logging.INFO)
        self.log.addHandler(self.handler)
        self.q: queue.Queue[int] = queue.Queue(maxsize=32)
        self.cond = threading.Condition()
        self.event = threading.Event()
        self.lock = threading.Lock()
        self.rlock = threading.RLock()
        self.sem = threading.Semaphore(3)
        self.bsem = threading.BoundedSemaphore(2)
        self.tight = threading.BoundedSemaphore(TIGHT)  # never blocks: one per worker at most
        self.counter = 0


def spin(seconds: float) -> None:
    """Plain user code: a CPU loop (its own frame: see cpython#130279)."""
    end = time.perf_counter() + seconds
    n = 0
    for _ in iter(int, 1):
        n += 1
        if time.perf_counter() > end:
            return


def spin_tight(s: Shared, seconds: float, shape: int) -> None:
    """A loop written in a with's block: on one line (no line event in the loop, only its
    back-edge's, and raising there must still run the with's exit: csrc/tc_compat.h, the
    JUMP bug), or a `for` whose body ends in `if ...: break`. The `while` and the `break`
    shapes have their closing jump outside the with's handler range (the compiler's
    layout), which the self-fire must not take for the loop's (tc_back_edge_test). Or no
    loop of bytecode at all: a loop in C calling a one-line lambda, which from 3.13 only
    its start can stop (csrc/tc_compat.h: TC_HOOK_PY_START)."""
    end = time.perf_counter() + seconds
    with s.tight:
        if shape == 0:
            for _ in range(int(seconds * 2e7)): pass  # noqa: E701
        elif shape == 1:
            while time.perf_counter() < end: pass  # noqa: E701
        elif shape == 3:
            collections.deque(itertools.takewhile(
                lambda _: time.perf_counter() < end, itertools.count()), maxlen=0)
        else:
            for _ in iter(int, 1):
                if time.perf_counter() > end:
                    break


def body(s: Shared, rnd: random.Random, i: int) -> None:
    for step in range(rnd.randint(3, 12)):
        kind = rnd.randrange(10)
        if kind == 0:
            s.log.info("task %d step %d", i, step)
        elif kind == 1:
            try:
                s.q.put_nowait(i)
            except queue.Full:
                pass
            try:
                s.q.get_nowait()
                s.q.task_done()
            except queue.Empty:
                pass
        elif kind == 2:
            with s.cond:
                s.counter += 1
                s.cond.notify_all()
        elif kind == 3:
            with s.sem:
                s.log.info("in semaphore %d", i)
        elif kind == 4:
            fut: cf.Future[int] = cf.Future()
            fut.add_done_callback(lambda f: None)
            fut.set_result(i)
            fut.result()
        elif kind == 5:
            logging.getLogger(f"hammer.child{i % 7}").setLevel(logging.INFO)
        elif kind == 6:
            s.event.set()
            s.event.wait(0)
            s.event.clear()
        elif kind == 7:
            with s.rlock:
                with s.bsem:
                    s.log.info("nested %d", i)
        elif kind == 8:
            with s.lock:
                s.counter += 1
        else:
            if rnd.random() < 0.5:
                spin(rnd.uniform(20e-6, 200e-6))
            else:
                spin_tight(s, rnd.uniform(20e-6, 200e-6), rnd.randrange(4))


class Remote:
    """Cancels read off a socket by the core, as the registry's subscriber gets them."""

    def __init__(self, seed: int) -> None:
        from timeoutcore import _native

        self.core = _native.core
        self.rnd = random.Random(seed)
        self.send_end, self.recv_end = socket.socketpair()
        self.send_end.setblocking(False)
        self.recv_end.setblocking(False)
        self.live: list[str] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=f, daemon=True) for f in (self._send, self._listen)]
        for t in self.threads:
            t.start()

    @staticmethod
    def message(token: str) -> bytes:
        payload = json.dumps({"op": "cancel", "job": "j", "token": token},
                             separators=(",", ":")).encode()
        return b"*3\r\n" + b"".join(b"$%d\r\n%s\r\n" % (len(x), x)
                                     for x in (b"message", b"hammer:control", payload))

    def _send(self) -> None:
        while not self.stop.is_set():
            time.sleep(self.rnd.uniform(20e-6, 300e-6))
            with self.lock:
                token = self.rnd.choice(self.live) if self.live else None
            if token is not None:
                try:
                    self.send_end.send(self.message(token))
                except BlockingIOError:
                    pass

    def _listen(self) -> None:
        while not self.stop.is_set():
            if self.core._wait_readable(self.recv_end.fileno(), 0.05, True):
                try:
                    self.recv_end.recv(1 << 16)
                except BlockingIOError:
                    pass

    def scope(self, rnd: random.Random) -> tuple[Any, str]:
        scope = timeoutcore.thread_deadline(rnd.uniform(0.3e-3, 2e-3))
        token = f"{rnd.getrandbits(128):032x}"
        self.core._remote_arm(scope, token.encode())
        with self.lock:
            self.live.append(token)
        return scope, token

    def done(self, scope: Any, token: str) -> None:
        self.core._remote_disarm(scope)
        with self.lock:
            self.live.remove(token)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()
        self.send_end.close()
        self.recv_end.close()


def run(tasks: int, workers: int, switch: float | None, seed: int) -> dict[str, Any]:
    if switch is not None:
        sys.setswitchinterval(switch)
    s = Shared()
    # "inside": the interrupt surfaced in the body; "at_exit": fired, claimed at the exit
    # before it surfaced; "expired_at_exit": nobody fired, the exit found the deadline passed
    # (the backstop: its expiry time is its exit time). "fired" counts the first two.
    counts = {"fired": 0, "inside": 0, "at_exit": 0, "expired_at_exit": 0, "completed": 0,
              "other_errors": 0}
    exit_late: list[float] = []  # how long after its deadline each backstop expiry exited
    counts_lock = threading.Lock()
    errors: list[str] = []

    remote = Remote(seed) if timeoutcore.ENGINE == "native" else None
    if remote is not None:
        counts["cancelled"] = 0

    def task(i: int) -> None:
        rnd = random.Random(seed * 1_000_003 + i)
        outcome = "completed"
        armed = remote.scope(rnd) if remote is not None and rnd.random() < 0.2 else None
        scope = armed[0] if armed else timeoutcore.thread_deadline(rnd.uniform(50e-6, 500e-6))
        try:
            with scope:
                body(s, rnd, i)
        except DeadlineExceeded as exc:
            # Delivered inside the body: the scope's exit saw the internal interrupt.
            if isinstance(exc.__context__, _DeadlineInterrupt):
                outcome = "inside"
            elif scope.expired_at is not None and scope.expired_at == scope.exited_at:
                outcome = "expired_at_exit"
                late = scope.exited_at - scope.when()  # type: ignore[operator]
                with counts_lock:
                    exit_late.append(late)
            else:
                outcome = "at_exit"
            if isinstance(exc, timeoutcore.DeadlineCancelled):
                with counts_lock:
                    counts["cancelled"] += 1
        except Exception as exc:  # noqa: BLE001 - reported as a broken invariant
            outcome = "other_errors"
            errors.append(f"task {i}: {type(exc).__name__}: {exc}")
        finally:
            if armed:
                remote.done(*armed)  # type: ignore[union-attr]
        with counts_lock:
            counts[outcome] += 1
            if outcome in ("inside", "at_exit"):
                counts["fired"] += 1

    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(workers) as pool:
        for f in [pool.submit(task, i) for i in range(tasks)]:
            f.result(timeout=60)
    elapsed = time.monotonic() - t0
    if remote is not None:
        remote.close()
    exit_late.sort()
    late_ms = {f"p{q}": round(exit_late[min(len(exit_late) - 1, len(exit_late) * q // 100)] * 1e3,
                              3) for q in (50, 99, 100)} if exit_late else {}
    return {"counts": counts, "broken": errors[:20] + check(s), "elapsed": round(elapsed, 3),
            "expired_at_exit_late_ms": late_ms}


def _free(lock: Any) -> bool:
    """True if nobody holds ``lock`` (taken and given back from this thread)."""
    if lock.acquire(blocking=False):
        lock.release()
        return True
    return False


def check(s: Shared) -> list[str]:
    broken = []
    for name, lock in [
        ("logging handler lock", s.handler.lock),
        ("logging module lock", getattr(logging, "_lock", None)),
        ("queue mutex", s.q.mutex),
        ("condition lock", s.cond._lock),  # type: ignore[attr-defined]
        ("lock", s.lock),
        ("rlock", s.rlock),
        ("semaphore's condition", s.sem._cond._lock),  # type: ignore[attr-defined]
        ("event's condition", s.event._cond._lock),  # type: ignore[attr-defined]
    ]:
        if lock is not None and not _free(lock):
            broken.append(f"{name} left held")
    if s.sem._value != 3:  # type: ignore[attr-defined]
        broken.append(f"semaphore value {s.sem._value} != 3")  # type: ignore[attr-defined]
    if s.bsem._value != 2:  # type: ignore[attr-defined]
        broken.append(f"bounded semaphore value {s.bsem._value} != 2")  # type: ignore[attr-defined]
    if s.tight._value != TIGHT:  # type: ignore[attr-defined]
        broken.append(f"tight loop's semaphore value {s.tight._value} != {TIGHT}")  # type: ignore[attr-defined]
    if s.q.unfinished_tasks < s.q.qsize():
        broken.append(f"queue unfinished_tasks {s.q.unfinished_tasks} < qsize {s.q.qsize()}")
    # The main thread must still be able to log, and logging's module lock must work.
    done = threading.Event()

    def log_once() -> None:
        s.log.warning("main thread still logs")
        logging.getLogger("hammer.after").setLevel(logging.DEBUG)
        done.set()

    t = threading.Thread(target=log_once, daemon=True)
    t.start()
    if not done.wait(5):
        broken.append("logging hangs after the run")
    return broken


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tasks", type=int, default=3000)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--switch", type=float, default=None, help="sys.setswitchinterval()")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--hang-after", type=float, default=100.0,
                   help="dump every thread's stack and exit (status 1) after this many "
                   "seconds")
    a = p.parse_args()
    faulthandler.enable()  # a crash prints every thread's stack: the test shows stderr
    faulthandler.dump_traceback_later(a.hang_after, exit=True)
    result = run(a.tasks, a.workers, a.switch, a.seed)
    faulthandler.cancel_dump_traceback_later()
    result.update(python=sys.version.split()[0], switch=sys.getswitchinterval(), seed=a.seed)
    if timeoutcore.ENGINE == "native":  # which delivery paths the run went through
        from timeoutcore import _native

        # The core's own invariant, not a mechanism: every change of a slot's state follows
        # the table of csrc/tc_slot.c, with or without accelerators.
        bad = _native.stats()["bad_moves"]
        if bad:
            result["broken"].append(f"{bad} slot state changes outside the core's table")

        # Every counter, under the core's own names: a report for the reader, never checked
        # (tests/test_integrity.py reads only the failures), so an accelerator's counter
        # renamed or gone, or switched off by TIMEOUTCORE_ACCEL, changes nothing here.
        result["paths"] = _native.stats()
    else:  # the pure-Python engine's delivery (timeoutcore/_fallback_deliver.py)
        from timeoutcore import _fallback_deliver

        result["paths"] = dict(_fallback_deliver.stats)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
