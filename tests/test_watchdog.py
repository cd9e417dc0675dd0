"""The native watchdog: how many threads it serves, that a deadline lands whatever the
shape of the loop it stops, that the user's switch interval stays theirs, and the watchdog's
own scheduling. What each latency accelerator does inside the watchdog is tested beside it
(tests/accelerators/); these hold with every accelerator off (TIMEOUTCORE_ACCEL=none)."""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from typing import Any

import pytest
from conftest import FREE_THREADED, LATE, burn, settled_interval

import timeoutcore
from timeoutcore import DeadlineExceeded

pytestmark = pytest.mark.skipif(timeoutcore.ENGINE != "native", reason="native core only")


def _hooks_armed_now() -> int:
    """How many threads have their delivery hook armed now: a count of live resources (a
    hook left armed slows its thread, and on 3.12+ every thread), not of the path a deadline
    took, so a behaviour test may read it."""
    from timeoutcore import _native

    return _native.stats()["hooked_now"]


def test_every_thread_due_at_once_is_stopped() -> None:
    """More threads reach their deadline in the same instant than the watchdog once
    pruned per round (64): each one is stopped."""
    n = 80
    barrier = threading.Barrier(n)
    outcome: dict[int, str] = {}

    def worker(i: int) -> None:
        barrier.wait()
        t0 = time.monotonic()
        try:
            with timeoutcore.thread_deadline_at(deadline):
                timeoutcore.sleep(30)
            outcome[i] = "ran to the end"
        except DeadlineExceeded:
            outcome[i] = "stopped" if time.monotonic() - t0 < 10 else "late"

    deadline = time.monotonic() + 0.5
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert [outcome.get(i) for i in range(n)] == ["stopped"] * n


# -- the user's switch interval (the fast window lowers it only while a deadline is due) -------


def test_no_window_stays_open_without_deadlines() -> None:
    """A block that ends before its deadline leaves the interval alone, and so does a
    thread that is blocked in protected code after its deadline fired: the window closes
    TC_FAST_HOLD_NS (20 ms) after the fire."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    lock = threading.Lock()
    try:
        with timeoutcore.thread_deadline(10):
            pass
        assert sys.getswitchinterval() == pytest.approx(0.005)

        @timeoutcore.protected
        def stuck() -> None:
            with lock:  # held by this test until it has looked: the interrupt waits
                pass

        lock.acquire()
        scope = timeoutcore.thread_deadline(0.01)

        def body() -> None:
            with pytest.raises(DeadlineExceeded):
                with scope:
                    stuck()
                    while True:
                        pass

        t = threading.Thread(target=body, daemon=True)
        t.start()
        give_up = time.monotonic() + 10
        while not scope.expired() and time.monotonic() < give_up:
            time.sleep(0.001)
        assert scope.expired()  # fired, and the thread still blocked in protected code
        # The window closes 20 ms after the fire; settled_interval waits up to 2 s for it.
        after_fire = settled_interval(0.005)
        lock.release()
        t.join(5)
        assert not t.is_alive()
        assert after_fire == pytest.approx(0.005)  # broken: 200 us while the thread is blocked
    finally:
        if lock.locked():
            lock.release()
        sys.setswitchinterval(before)


class _Exits:
    """A context manager that counts its exits."""

    def __init__(self) -> None:
        self.count = 0

    def __enter__(self) -> _Exits:
        return self

    def __exit__(self, *exc: object) -> None:
        self.count += 1


def _loop_inline(scope: timeoutcore.DeadlineScope, exits: _Exits, shape: str) -> None:
    # The loops are written in the blocks themselves, on purpose: the compiler leaves
    # their closing jump outside every handler range (a `while <cond>:`, and a `for`
    # whose body ends in `if ...: break`), unlike a loop alone in a function.
    with scope, exits:
        t0 = time.monotonic()
        if shape == "while":
            while time.monotonic() - t0 < 5:
                pass
        else:
            for _ in itertools.count():
                if time.monotonic() - t0 > 5:
                    break


@pytest.mark.parametrize("shape", ["while", "for-break"])
def test_a_loop_written_in_the_block_itself_is_stopped_and_its_exits_run(shape: str) -> None:
    """A CPU loop written inline in the `with` block -- the closing jump of which CPython's
    compiler leaves outside the block's handler range -- is stopped promptly and every
    `with` around it exits (3.13+ would raise at the jump itself and skip the exits,
    cpython#130279, were the interrupt delivered there), and no hook stays armed. Whichever
    path delivers it: the self-fire's handling of this loop is tests/accelerators/
    test_self_fire.py's."""
    for _ in range(10):
        scope, exits = timeoutcore.thread_deadline(0.03), _Exits()
        with pytest.raises(DeadlineExceeded):
            _loop_inline(scope, exits, shape)
        assert exits.count == 1  # broken: the interrupt raised at the jump skips the exit
        assert scope.overshoot is not None and scope.overshoot < LATE
    assert _hooks_armed_now() == 0


#: 3.11's pre-armed tracer sleeps until its deadline, when the thread's own timer signal
#: wakes it (csrc/tc_hook_trace.c: the sleeping tracer); a deadline nearer than the lead is
#: pre-armed by the block's own thread at its entry (tc_watchdog.c: slot_self_prearm).
TRACER_SLEEPS = sys.version_info < (3, 12)
#: A deadline well inside the lead (at least 1 ms on 3.11, PREARM_LEAD).
NEAR = 0.0008


def _cancel_once_entered(scope: timeoutcore.DeadlineScope, entered: threading.Event,
                         skip: list[bool], cancelled_at: list[float]) -> None:
    """Cancel ``scope`` once its block says it is in (unless told to ``skip``), noting when."""
    if entered.wait(10) and not skip[0]:
        cancelled_at.append(time.monotonic())
        scope.cancel("stop")


@pytest.mark.skipif(not TRACER_SLEEPS, reason="3.11's per-thread tracer")
def test_a_sleeping_tracers_alarm_follows_a_reschedule_and_a_cancel() -> None:
    """A block pre-armed at its entry and moved later goes on at full speed past its first
    deadline and stops at the new one; one cancelled from another thread while its tracer
    sleeps stops at once (the alarm follows the slot's deadline: tc_slot.c slot_deadline_set).
    Only a trial whose reschedule returned before the first deadline shows either (one
    descheduled in between, on a loaded machine, fires at the first deadline): the others
    are not counted, and the trials go on (capped) until one does."""
    done = False
    for _ in range(50):
        scope = timeoutcore.thread_deadline(NEAR)
        t0 = time.monotonic()
        first = moved_at = None
        with pytest.raises(DeadlineExceeded):
            with scope:
                first = scope.when()
                scope.reschedule(t0 + 0.05)
                moved_at = time.monotonic()
                burn(2)
        if first is None or moved_at is None or moved_at >= first:
            continue  # the first deadline came before the reschedule had returned
        assert scope.overshoot is not None and scope.overshoot < LATE
        assert time.monotonic() - t0 >= 0.05  # broken: stopped at the first deadline
        done = True
        break
    assert done, "no reschedule returned before its block's first deadline"

    done = False
    for _ in range(50):
        scope = timeoutcore.thread_deadline(0.0009)
        entered = threading.Event()
        skip: list[bool] = [False]
        cancelled_at: list[float] = []
        canceller = threading.Thread(target=_cancel_once_entered, daemon=True,
                                     args=(scope, entered, skip, cancelled_at))
        canceller.start()
        first = moved_at = None
        stopped_by: "BaseException | None" = None
        try:
            with scope:
                first = scope.when()
                # asleep, far away: only the cancel can stop it
                scope.reschedule(time.monotonic() + 5.0)
                moved_at = time.monotonic()
                entered.set()
                burn(5)
        except DeadlineExceeded as e:
            stopped_by = e
        finally:
            stopped = time.monotonic()
            if not entered.is_set():  # the block ended before it asked for the cancel
                skip[0] = True
                entered.set()
            canceller.join(10)
        assert not canceller.is_alive()
        if first is None or moved_at is None or moved_at >= first:
            continue  # the first deadline came before the reschedule had returned
        assert type(stopped_by) is timeoutcore.DeadlineCancelled, repr(stopped_by)
        assert len(cancelled_at) == 1
        # broken: the tracer sleeps on to the rescheduled deadline, 5 s away
        assert stopped - cancelled_at[0] < LATE
        done = True
        break
    assert done, "no reschedule returned before its block's first deadline"
    assert _hooks_armed_now() == 0


def _slice_ns(tid: int) -> int | None:
    """A thread's time slice from /proc (Linux 6.12+ with scheduler statistics), or None."""
    try:
        with open(f"/proc/{os.getpid()}/task/{tid}/sched", encoding="ascii") as f:
            for line in f:
                if line.startswith("se.slice"):
                    return int(line.split(":")[1])
    except OSError:
        pass
    return None


def test_the_watchdog_runs_with_a_short_time_slice() -> None:
    """Woken at a deadline, the watchdog preempts a busy thread rather than waiting for a
    CPU behind it: its slice is 100 us (csrc/tc_tuning.h: TC_WD_SLICE_NS), shorter than
    the default that the other threads keep."""
    from timeoutcore import _native

    if _slice_ns(threading.get_native_id()) is None:
        pytest.skip("this kernel does not report time slices")
    with timeoutcore.thread_deadline(10):
        pass
    give_up = time.monotonic() + 5  # the watchdog says who it is once it runs
    while (wd := _native.watchdog_native_id()) == 0 or _slice_ns(wd) != 100_000:
        if time.monotonic() > give_up:
            break
        time.sleep(0.001)
    assert wd != 0 and _slice_ns(wd) == 100_000, (wd, _slice_ns(wd) if wd else None)
    assert (_slice_ns(threading.get_native_id()) or 0) > 100_000


_WATCHDOG_FAULT = """
import ctypes, faulthandler, os, time
import timeoutcore
from timeoutcore import _native
faulthandler.enable()
with timeoutcore.thread_deadline(10):
    pass
give_up = time.monotonic() + 10
while _native.watchdog_native_id() == 0 and time.monotonic() < give_up:
    time.sleep(0.001)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall(234, os.getpid(), _native.watchdog_native_id(), 11)  # tgkill(.., SIGSEGV)
time.sleep(10)
print("still alive")
"""


@pytest.mark.skipif(timeoutcore.ENGINE != "native", reason="the C core's watchdog")
def test_a_fault_in_the_watchdog_is_reported_by_faulthandler(tmp_path: Any) -> None:
    """The watchdog blocks every signal but its own faults: a crash there gets
    faulthandler's report (blocked, the kernel killed the process without a word)."""
    import subprocess

    if os.uname().machine != "x86_64":
        pytest.skip("the test names tgkill by its x86-64 system call number")
    r = subprocess.run([sys.executable, "-c", _WATCHDOG_FAULT], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode != 0 and "still alive" not in r.stdout, (r.returncode, r.stdout)
    assert "Fatal Python error: Segmentation fault" in r.stderr, r.stderr[-2000:]


#: A child: a collection starts in the watchdog while it delivers to a spinning thread, and
#: its finalizer lets the GIL go long enough for that thread to leave its block and end.
_FINALIZER_LETS_GIL_GO = r"""
import faulthandler, gc, sys, threading, time
faulthandler.enable()
import timeoutcore
from timeoutcore import _native

stop = [False]
in_watchdog = []


class Garbage:
    def __init__(self):
        self.me = self  # a cycle: only a collection frees it

    def __del__(self):
        if threading.get_native_id() != _native.watchdog_native_id():
            Garbage()  # collected elsewhere: leave one for the watchdog's next collection
            return
        in_watchdog.append(1)
        stop[0] = True
        time.sleep(0.2)  # the GIL goes: the thread leaves its loop and its block, and ends


def spin():
    try:
        with timeoutcore.thread_deadline(0.05):
            while not stop[0]:
                pass
    except timeoutcore.DeadlineExceeded:
        pass


for _ in range(int(sys.argv[1])):
    stop[0] = False
    t = threading.Thread(target=spin)
    t.start()
    time.sleep(0.01)
    Garbage()
    was = gc.get_threshold()
    gc.set_threshold(1)  # the next allocation collects: in the watchdog, as it delivers
    t.join()  # no timeout: a timed join allocates, and would collect here first
    gc.set_threshold(*was)
    time.sleep(0.2)
gc.collect()
print("in_watchdog", len(in_watchdog), "hooked_now", _native.stats()["hooked_now"])
"""


@pytest.mark.skipif(timeoutcore.ENGINE != "native", reason="the C core's watchdog")
@pytest.mark.skipif(FREE_THREADED, reason="no GIL to let go: the watchdog never looks at "
                    "another thread's frames there")
@pytest.mark.parametrize("accel", ["all", "none", "direct_delivery"])
def test_a_finalizer_that_lets_the_gil_go_while_the_watchdog_delivers(
        tmp_path: Any, accel: str) -> None:
    """The watchdog looks at the stopped thread's frames (is it at a loop's back-edge? in
    protected code?); the frame objects it makes there may start a collection, and a
    finalizer that lets the GIL go lets the thread run on and end. The watchdog never
    touches that thread's frames or state afterwards: before, it crashed reading a frame
    freed with the thread (direct_delivery, in CPython's frame object creation)."""
    import subprocess

    env = dict(os.environ, TIMEOUTCORE_ACCEL=accel)
    r = subprocess.run([sys.executable, "-c", _FINALIZER_LETS_GIL_GO, "4"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])  # broken: a segfault
    words = r.stdout.split()  # where the watchdog collects depends on the accelerators on
    assert int(words[words.index("hooked_now") + 1]) == 0, r.stdout  # no hook stayed armed


# --- _wait_readable: the registry's subscriber's wait --------------------------------------


@pytest.mark.parametrize("engine", ["native", pytest.param("fallback", marks=pytest.mark.skipif(
    FREE_THREADED, reason="the fallback engine needs a GIL"))])
def test_wait_readable_says_whether_the_fd_is_ready(engine: str) -> None:
    from timeoutcore import _fallback, _native

    wait = _native.wait_readable if engine == "native" else _fallback.wait_readable
    r, w = os.pipe()
    try:
        start = time.monotonic()
        assert wait(r, 0.05) is False
        assert time.monotonic() - start >= 0.045
        os.write(w, b"x")
        assert wait(r, 5.0) is True
        with pytest.raises(ValueError, match="fd must be >= 0"):
            wait(-1, 1.0)
        for bad in (-1.0, float("nan"), 1e9):
            with pytest.raises(ValueError, match="timeout must be 0 to 86400"):
                wait(r, bad)
        with pytest.raises(TypeError):
            wait(r, "1")  # type: ignore[arg-type]
    finally:
        os.close(r)
        os.close(w)
