"""The self-fire (csrc/accel_self_fire.c; 3.12+): a thread fires its deadline itself, at
its own eval-breaker check. With a GIL (wd_watch, pc_fire) a thread that holds the GIL at
its deadline fires it through a pending call, and one off the GIL is left to fire it once
back; free-threaded (csrc/accel_self_fire_trigger.c) the watchdog hands the thread a
trigger object it owns, which starts the thread's own rounds: no other thread is involved. Reads its counters;
skipped where it is off (3.11 runs pending calls in the main thread only)."""

from __future__ import annotations

import dis
import gc
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import FREE_THREADED, LATE, burn, in_thread, spinning_threads
from test_integrity import _protected_spin_noted
from test_watchdog import _Exits, _hooks_armed_now, _loop_inline

import timeoutcore
from timeoutcore import DeadlineExceeded

from . import accelerated, native_only, running_watchdog, spin_for, stats

pytestmark = [native_only, accelerated("self_fire")]

#: the pending call's path (with a GIL) and the trigger's (free-threaded)
with_gil = pytest.mark.skipif(FREE_THREADED, reason="the pending call: builds with a GIL")
free_threaded = pytest.mark.skipif(not FREE_THREADED, reason="the trigger: free-threaded builds")

@accelerated("prepare")  # the exception it raises was prepared ahead (wd_prepare)
def test_a_thread_holding_the_gil_at_its_deadline_fires_it_itself() -> None:
    """A thread that holds the GIL when its deadline comes is stopped without the GIL
    changing hands: the watchdog queues a pending call, which the thread runs at its next
    eval-breaker check and which raises at its loop's back-edge (csrc/accel_self_fire.c:
    pc_fire). The exception was built in the thread ahead of the deadline, by another such
    call. (A trial that lost the GIL before its deadline, on a loaded machine, is fired the
    usual way: one in twenty shows the path.)"""
    before = stats()
    for _ in range(20):
        scope = timeoutcore.thread_deadline(0.03)
        with pytest.raises(DeadlineExceeded):
            with scope:
                burn(5)
        assert scope.overshoot is not None and scope.overshoot < LATE
    after = stats()
    assert after["pending_raises"] > before["pending_raises"], (before, after)
    assert after["pending_calls"] >= after["pending_raises"] - before["pending_raises"]
    assert after["prepared"] > before["prepared"], (before, after)
    assert after["hooked_now"] == 0


@with_gil
def test_the_watchdog_never_spins_on_the_watched_threads_cpu() -> None:
    """Before a deadline of a thread that holds the GIL, the watchdog spins its last
    0.1 ms to queue the self-fire on time -- on another CPU. On the thread's own CPU the
    spin would keep the thread off it (in a busy pool it preempted the GIL's holder),
    so there it sleeps to the deadline instead (watch_sleeps), and the deadline still
    lands. Both pinned to one CPU here."""
    wd = running_watchdog()
    cpu = min(os.sched_getaffinity(0))
    wd_cpus = os.sched_getaffinity(wd)

    def pinned() -> list[float]:
        os.sched_setaffinity(0, {cpu})
        lates = []
        # A trial whose watchdog was not on this CPU at its deadline (it ran elsewhere
        # before the pin took, or the thread was off the GIL: a loaded machine) shows
        # nothing: the trials go on until one slept. The cap: a watchdog that never
        # sleeps there fails, never hangs.
        while len(lates) < 10 or (stats()["watch_sleeps"] == before["watch_sleeps"]
                                  and len(lates) < 60):
            scope = timeoutcore.thread_deadline(0.02)
            with pytest.raises(DeadlineExceeded):
                with scope:
                    spin_for(5)
            assert scope.overshoot is not None
            lates.append(scope.overshoot)
        return lates

    before = stats()
    os.sched_setaffinity(wd, {cpu})
    try:
        lates = in_thread(pinned)
    finally:
        os.sched_setaffinity(wd, wd_cpus)
    after = stats()
    assert max(lates) < LATE, lates
    assert after["watch_sleeps"] > before["watch_sleeps"], (before, after)


@with_gil
def test_a_crowded_process_leaves_a_thread_off_the_gil_to_fire_itself() -> None:
    """3.12+ with a GIL: next to 3 spinning threads the guarded thread is mostly off the
    GIL when its deadline comes. The watchdog does not queue for the GIL to fire it from
    outside -- which held the GIL up to the deadline, and from 3.13 armed the hook, whose
    events slow every thread while the fired one waits for its turn: it kicks the thread,
    opens the fast window for it and waits for it to hold the GIL again, and the thread
    fires itself (csrc/accel_self_fire.c: wd_watch, "Off the GIL"). A thread not back within
    5 ms is fired the usual way (csrc/tc_tuning.h: TC_WATCH_BACK_NS), as it should: on
    a loaded machine many are, so only the trials that ended within those 5 ms of their
    deadline are judged, and the trials go on until enough did."""
    outside_keys = ("gil_holds", "hook_raises", "direct_raises")
    wanted, back_in_time, fired_outside, trials = 20, 0, 0, 0
    with spinning_threads(3):
        before = stats()
        # The cap: a watchdog that never leaves the thread to fire itself fails, never hangs.
        while back_in_time < wanted and trials < 300:
            trials += 1
            was = stats()
            scope = timeoutcore.thread_deadline(0.02)
            with pytest.raises(DeadlineExceeded):
                with scope:
                    burn(5)
            now = stats()
            assert now["fires"] > was["fires"]
            assert scope.overshoot is not None
            if scope.overshoot >= 0.005:  # not back in time: the usual way is right here
                continue
            back_in_time += 1
            fired_outside += any(now[k] > was[k] for k in outside_keys)
        after = stats()
    assert back_in_time >= wanted, (trials, back_in_time)
    assert after["back_waits"] > before["back_waits"], (before, after)
    assert after["pending_raises"] > before["pending_raises"], (before, after)
    # broken: ~3 in 4 fired from outside, at once (the watchdog took the GIL ahead)
    assert fired_outside < back_in_time / 2, (trials, back_in_time, fired_outside)


@pytest.mark.parametrize("shape", ["while", "for-break"])
def test_a_loop_written_in_the_block_itself_is_stopped_by_the_self_fire(shape: str) -> None:
    """The inline loop of test_watchdog.py's exits test, on the self-fire's path: 3.12 raises
    at its back-edge all the same (the exception is CPython's at the jump's target there:
    csrc/tc_compat.h, tc_back_edge_test); 3.13+, where it would be the jump's own and skip
    the exits (cpython#130279), the self-fire hands the loop to the hook at once
    (pending_handovers) instead of declining check after check first (0.1-0.5 ms). One
    trial on the path shows it: a trial that lost the GIL before its deadline (a loaded
    machine) is fired the usual way, so the trials go on until one took the path. (3.14+
    a `while` loop's back-edge goes through the hook: nothing to wait for.)"""
    if sys.version_info < (3, 13):
        path = "pending_raises"
    elif shape == "for-break" or sys.version_info < (3, 14):
        path = "pending_handovers"
    else:
        pytest.skip("3.14+: a `while` loop's back-edge is the hook's")
    before = stats()
    trials = 0
    # The cap: a loop never stopped on the path fails, never hangs.
    while trials < 10 or (stats()[path] == before[path] and trials < 100):
        trials += 1
        scope, exits = timeoutcore.thread_deadline(0.03), _Exits()
        with pytest.raises(DeadlineExceeded):
            _loop_inline(scope, exits, shape)
        assert exits.count == 1
        assert scope.overshoot is not None and scope.overshoot < LATE
    after = stats()
    assert after[path] > before[path], (trials, before, after)
    assert _hooks_armed_now() == 0


def test_a_thread_that_fires_itself_hands_a_protected_wait_to_the_hook() -> None:
    """A thread that holds the GIL at its deadline runs the watchdog's pending call at its
    next eval-breaker check, wherever that is (csrc/accel_self_fire.c: pc_fire). Inside a
    protected call it notes the deferral and fires for the hook, which waits for the call
    to return: the interrupt surfaces after it, never inside. The pending call is queued
    once, not again at every back-edge of the protected code (which ran it at each and
    slowed that code down, and whose calls, each queueing itself again, once filled 3.12's
    queue of 32). (A trial whose thread lost the GIL meanwhile, to another test's leftover
    thread on a loaded machine, is delivered by the hook alone -- also after the call:
    every trial checks that.)"""
    handed = []
    for _ in range(5):
        before = stats()
        calls: list[int] = []
        returned: list[int] = []
        with pytest.raises(DeadlineExceeded):
            with timeoutcore.thread_deadline(0.02):
                for _ in itertools.count():
                    _protected_spin_noted(0.1, calls, returned)
        after = stats()
        # never inside it (a watchdog a loaded machine runs late may fire in a later call)
        assert calls and len(calls) == len(returned), (calls, returned)
        if after["pending_handovers"] > before["pending_handovers"]:  # the thread kept the GIL
            handed.append(after["pending_calls"] - before["pending_calls"])
            break
    assert handed, "no trial's pending call handed the protected wait to the hook"
    # A stray second call (another thread ran it: it only clears the flag) is allowed; a
    # call per back-edge of the protected loop would be thousands.
    assert handed[0] <= 3, handed


# -- Free-threaded: the trigger (csrc/accel_self_fire_trigger.c) ------------------------------


def _spin_in_block(seconds: float) -> None:
    """A CPU loop with a deadline, in its own function (the raise's frame)."""
    with timeoutcore.thread_deadline(seconds):
        for _ in itertools.count():
            pass


@free_threaded
def test_a_spinning_thread_is_stopped_by_its_own_round_of_triggers() -> None:
    """Free-threaded: a thread spinning at its deadline is stopped by a round of its own
    triggers -- the watchdog drops an object the thread made, the thread deallocates it at
    its next eval-breaker check and queues a second one to itself, deallocated at the check
    after, where it raises at its loop's back-edge -- without the hook, whose events would
    slow every thread. A trial the OS did not run for a while
    (a loaded machine) may be handed to the hook: the trials go on until enough were the
    triggers'."""
    before, trials = stats(), 0
    # The cap: a round that never raises fails, never hangs.
    while stats()["pending_raises"] - before["pending_raises"] < 10 and trials < 200:
        trials += 1
        scope = timeoutcore.thread_deadline(0.02)
        with pytest.raises(DeadlineExceeded):
            with scope:
                for _ in itertools.count():
                    pass
        assert scope.overshoot is not None and scope.overshoot < LATE
    after = stats()
    assert after["pending_raises"] - before["pending_raises"] >= 10, (trials, before, after)
    # broken (every fire through the hook): one hook raise per trial
    assert after["hook_raises"] - before["hook_raises"] < trials / 2, (trials, before, after)
    assert after["pending_calls"] - before["pending_calls"] >= 10
    assert after["hooked_now"] == 0


@free_threaded
def test_a_loop_that_calls_a_function_every_turn_is_stopped_by_its_own_rounds() -> None:
    """Free-threaded: a loop whose breaker checks alternate between a call's return and
    its back-edge. A round that declines at the call starts the next one itself, and the
    thread's rounds take 3 checks and 2 in turn: one of them meets the back-edge. (Rounds
    of 2 checks met the call every time in about 1 trial of 3, which ran on to the hook.)
    A trial the OS did not run for a while may still be handed to the hook."""
    before, trials = stats(), 40
    for _ in range(trials):
        t0 = time.perf_counter()
        with pytest.raises(DeadlineExceeded):
            with timeoutcore.thread_deadline(0.02):
                while time.perf_counter() < t0 + 60.0:  # checks: the call's return, the jump
                    pass
    after = stats()
    raises = after["pending_raises"] - before["pending_raises"]
    assert raises >= trials - 4, (before, after)
    assert after["hook_raises"] - before["hook_raises"] <= 4, (before, after)


@free_threaded
@accelerated("prepare")  # its look ahead of the deadline is the one held up
def test_a_watchdog_held_up_past_the_deadline_still_starts_the_threads_rounds() -> None:
    """Free-threaded: a watchdog that comes milliseconds late -- held up here by a
    collection, which stops the world across the deadline; next to threads that keep every
    CPU busy, by the scheduler -- still starts the thread's rounds, rather than handing the
    deadline to the hook, whose interpreter-wide events slow every thread of a pool. The
    watch gives up TC_WATCH_MAX_NS after its first round, not after the deadline; and the
    rounds go on beside the collection: a round whose A the collection took is followed by
    one with the spare A, and a thread parked by the world's stop (in futex) is not asleep.
    Only trials whose collection covered the watch's look ahead and ended 3 ms or more past
    the deadline count (broken: each of those is one hook raise). On a loaded machine a
    world's stop may be asked for longer than the watch waits for a parked thread: one
    trial may still be handed to the hook."""
    junk: list[list[int]] = [[] for _ in range(250_000)]
    took = 0.0
    while took < 0.008 and len(junk) < 1_000_000:  # a collection that lasts 8 ms or more
        junk.extend([] for _ in range(len(junk)))
        t = time.perf_counter()
        gc.collect()
        took = time.perf_counter() - t
    counted = hooked = raised = 0
    for _ in range(30):
        ready, out = threading.Event(), {}

        def guarded() -> None:
            with pytest.raises(DeadlineExceeded):
                with timeoutcore.thread_deadline(0.1):
                    out["deadline"] = time.perf_counter() + 0.1
                    ready.set()
                    for _ in itertools.count():
                        pass

        before = stats()
        worker = threading.Thread(target=guarded, daemon=True)  # broken: fails, never hangs
        worker.start()
        ready.wait()
        time.sleep(max(0.0, out["deadline"] - took / 2 - time.perf_counter()))
        start = time.perf_counter()
        gc.collect()
        end = time.perf_counter()
        worker.join(timeout=30)
        assert not worker.is_alive(), "the deadline never landed"
        after = stats()
        if start < out["deadline"] - 0.001 and end > out["deadline"] + 0.003:
            counted += 1
            hooked += after["hook_raises"] - before["hook_raises"]
            raised += after["pending_raises"] - before["pending_raises"]
            if counted == 5:
                break
    assert counted >= 3, (counted, took)
    assert hooked <= 1 and raised >= counted - 1, (counted, hooked, raised)


@free_threaded
def test_the_trigger_raises_at_the_back_edge_of_the_loop_in_the_block() -> None:
    """Where the trigger's round raises: at a JUMP_BACKWARD of the loop's own frame, inside
    the block (the innermost entry of the interrupt's traceback; DeadlineExceeded, raised
    by the block's exit, has the interrupt as its context)."""
    before, seen = stats(), []
    for _ in range(20):
        with pytest.raises(DeadlineExceeded) as info:
            _spin_in_block(0.02)
        # the interrupt, raised in the loop; DeadlineExceeded is the block's exit's
        tb = info.value.__context__.__traceback__ if info.value.__context__ else None
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        assert tb is not None and tb.tb_frame.f_code is _spin_in_block.__code__
        ops = {i.offset: i.opname for i in dis.get_instructions(_spin_in_block)}
        seen.append(ops.get(tb.tb_lasti))
        if stats()["pending_raises"] > before["pending_raises"]:
            break
    assert stats()["pending_raises"] > before["pending_raises"], seen
    assert "JUMP_BACKWARD" in seen, seen


@free_threaded
def test_code_without_a_usable_back_edge_is_handed_to_the_hook() -> None:
    """A body whose breaker checks are never a loop's back-edge of its own -- calls made
    from C (`sum(map(...))`) -- declines round after round (each check a function's entry),
    then hands the deadline to the hook, which raises at a line. Never lost. (`step` has
    a line of its own: the hook raises at a line boundary, and a function written on its
    `def` line has none that sys.monitoring reports.)"""
    def step(x: int) -> int:
        y = x + 1  # two lines: a line boundary inside, where the hook raises
        return y

    before = stats()
    scope = timeoutcore.thread_deadline(0.02)
    with pytest.raises(DeadlineExceeded):
        with scope:
            sum(map(step, itertools.count()))
    assert scope.overshoot is not None and scope.overshoot < LATE
    after = stats()
    assert after["pending_calls"] > before["pending_calls"], (before, after)
    assert after["hook_raises"] > before["hook_raises"], (before, after)
    assert after["hooked_now"] == 0


@free_threaded
def test_collections_in_the_block_never_lose_the_deadline() -> None:
    """A free-threaded collection merges every thread's queued objects with the world
    stopped, in the collecting thread: a trigger may be deallocated there (the round ends,
    and the next one starts with the spare A), or in its own thread inside the collection
    -- outside any breaker check (its B then waits for the thread's next check). The
    deadline still lands."""
    for _ in range(10):
        scope = timeoutcore.thread_deadline(0.02)
        with pytest.raises(DeadlineExceeded):
            with scope:
                for _ in itertools.count():
                    gc.collect(0)
        assert scope.overshoot is not None and scope.overshoot < LATE
    assert stats()["hooked_now"] == 0


class _SlowFinalizer:
    """Cyclic garbage whose finalizer takes a while: a collection that runs its finalizers
    -- with the world running, gc.collecting set -- for about 50 ms each."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        time.sleep(0.05)


@free_threaded
def test_a_deadline_beside_another_threads_finalizers_lands_once_they_are_done() -> None:
    """A deadline that passes while another thread's collection runs finalizers: the
    thread's rounds wait at its loop's one check (gc.collecting is the interpreter's), then
    decide afresh there once the collection is over -- never through the hook. (Broken, the
    wait was noted as that place's answer, and the loop ran on for ever: the join's bound
    fails.)"""
    counted = 0
    for _ in range(5):
        before, out = stats(), {}

        def guarded() -> None:
            try:
                with timeoutcore.thread_deadline(0.1):
                    out["deadline"] = time.perf_counter() + 0.1
                    for _ in itertools.count():
                        pass
            except DeadlineExceeded:
                out["raised"] = time.perf_counter()

        worker = threading.Thread(target=guarded, daemon=True)  # broken: fails, never hangs
        worker.start()
        time.sleep(0.05)
        for _ in range(4):
            _SlowFinalizer()
        start = time.perf_counter()
        gc.collect()  # its finalizers: 4 x 50 ms, across the deadline
        end = time.perf_counter()
        worker.join(timeout=30)
        assert not worker.is_alive(), "the deadline never landed"
        assert "raised" in out, out
        if start < out["deadline"] - 0.005 and end > out["deadline"] + 0.005:
            counted += 1
            after = stats()
            assert after["hook_raises"] == before["hook_raises"], (before, after)
            if counted == 3:
                break
    assert counted >= 1
    assert stats()["hooked_now"] == 0


@free_threaded
def test_a_wrong_breaker_bit_is_refused_and_deadlines_still_land(tmp_path: Path) -> None:
    """The import check (trigger_check) confirms the eval breaker's async-exception bit
    from PyThreadState_SetAsyncExc's effect, then runs whole rounds; told to take the next
    bit instead (the test hook), it refuses: self_fire is off, saying why, the pre-arm
    (named too) is on, and a deadline still stops a CPU loop."""
    child = (
        "import json, timeoutcore\n"
        "from timeoutcore import DeadlineExceeded, thread_deadline\n"
        "why = timeoutcore.accelerators(explain=True)\n"
        "try:\n"
        "    with thread_deadline(0.05):\n"
        "        while True:\n"
        "            pass\n"
        "    ended = 'ran on'\n"
        "except DeadlineExceeded:\n"
        "    ended = 'DeadlineExceeded'\n"
        "print(json.dumps({'why': why, 'ended': ended}))\n"
    )
    env = dict(os.environ, TIMEOUTCORE_TEST_CORRUPT_BREAKER_BIT="1",
               TIMEOUTCORE_ACCEL="self_fire,prearm,rescue,remote_relay")
    out = subprocess.run([sys.executable, "-c", child], env=env, cwd=tmp_path, timeout=60,
                         capture_output=True, text=True, check=True)
    got = json.loads(out.stdout)
    assert got["why"]["self_fire"].startswith("failed its import check:"), got
    assert "breaker bit" in got["why"]["self_fire"], got
    assert got["why"]["prearm"] is None, got
    assert got["ended"] == "DeadlineExceeded", got
