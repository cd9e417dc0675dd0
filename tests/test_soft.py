"""Soft limits and cleanup handlers."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from conftest import LATE, burn, spin_forever

import timeoutcore
from timeoutcore import DeadlineExceeded, SoftDeadlineExceeded


def wait_until(cond: Any, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while not cond() and time.monotonic() < end:
        time.sleep(0.005)
    return bool(cond())


def test_soft_callback_once_off_the_enforcing_threads(
    api: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # Thread objects, not idents: the guarded thread may have ended before the callback's
    # pool thread starts, and a new thread can reuse an ended one's ident.
    calls: list[tuple[str, threading.Thread, int]] = []
    guarded = []

    def on_soft(scope: Any) -> None:
        calls.append((scope.label, threading.current_thread(), threading.get_native_id()))

    def body() -> Any:
        guarded.append(threading.current_thread())
        with pytest.raises(DeadlineExceeded):
            with api.thread_deadline(5, soft=0.05, on_soft=on_soft, label="job") as scope:
                # The soft limit must pass while the block runs, however slow the machine:
                # run until it has (the hard limit caps a soft timer that never fires),
                # then end the block by its hard limit, moved to now.
                _until_soft_then_hard(scope)
        return scope

    with caplog.at_level(logging.WARNING, logger="timeoutcore"):
        from conftest import in_thread

        scope = in_thread(body)
        assert wait_until(lambda: len(calls) == 1)
    time.sleep(0.05)
    assert len(calls) == 1 and calls[0][0] == "job"
    assert calls[0][1] is not guarded[0]
    assert calls[0][1].name.startswith("timeoutcore-on-soft")
    if api.name == "native":
        from timeoutcore import _native

        assert calls[0][2] != _native.watchdog_native_id()
    assert scope.soft_expired() and scope.expired()
    assert any("soft limit passed" in r.getMessage() and "'job'" in r.getMessage()
               for r in caplog.records)


def _until_soft_then_hard(scope: Any) -> None:
    """Run until the soft limit of ``scope`` has passed, then stop the block by its hard
    limit (moved to now). Its own frame (cpython#130279, see conftest.burn)."""
    while not scope.soft_expired():
        burn(0.001)
    scope.reschedule(time.monotonic())
    spin_forever()


def test_soft_limit_not_reached_calls_nothing(api: Any) -> None:
    calls = []
    # a soft limit far beyond the block's work; then wait until it has passed (after the
    # exit), so that a soft timer firing for an exited block would be seen
    with api.thread_deadline(2, soft=1.0, on_soft=calls.append) as scope:
        burn(0.01)
    time.sleep(max(scope.entered_at + 1.0 + 0.1 - time.monotonic(), 0))
    assert calls == [] and not scope.soft_expired()
    assert scope.result.status == "completed"


def test_the_soft_warning_gives_the_hard_limit_in_force(
        api: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="timeoutcore")
    fired = threading.Event()
    with api.thread_deadline(5, soft=0.05, label="moved", on_soft=lambda s: fired.set()) as scope:
        scope.reschedule(scope.entered_at + 7)
        assert fired.wait(10)  # the callback runs after the warning is logged
    assert "label='moved'" in caplog.text and "hard=7.000s" in caplog.text


def test_soft_raise_is_catchable_and_the_hard_limit_follows(api: Any, where: Any) -> None:
    def body() -> Any:
        seen = []
        moved = []
        with pytest.raises(DeadlineExceeded):
            # A hard limit far enough for the soft one to come first on any machine (it
            # also caps a soft limit that never fires); once the soft exception is caught,
            # the hard deadline is brought near so the test does not wait it out.
            with api.thread_deadline(5, soft=0.05, soft_raise=True) as scope:
                try:
                    spin_forever()
                except SoftDeadlineExceeded:
                    seen.append(scope.elapsed())
                # the soft exception left the hard deadline where it was
                seen.append(scope.when() - scope.entered_at)
                moved.append(scope.elapsed() + 0.05)
                scope.reschedule(time.monotonic() + 0.05)
                spin_forever()  # clean-up that overruns: the hard limit stops it
        return seen, moved, scope.elapsed(), scope.expired()

    seen, moved, elapsed, expired = where(body)
    assert len(seen) == 2 and 0.05 <= seen[0] < 0.05 + LATE
    assert 4 < seen[1] < 6  # still the hard limit set at entry
    assert expired and moved[0] <= elapsed < moved[0] + LATE


def test_soft_raise_never_lands_after_the_block(api: Any) -> None:
    # blocks that end right around their soft limit, many times
    for _ in range(50):
        with api.thread_deadline(1, soft=0.002, soft_raise=True):
            try:
                burn(0.002)
            except SoftDeadlineExceeded:
                pass
        burn(0.003)  # a late soft exception would surface here


def test_a_soft_exception_refused_by_a_waiting_step_is_delivered_by_the_wait() -> None:
    """The soft timer can find the thread inside a wait's shielded step (a patched
    Condition.wait) after the soft limit passed, and the core refuses it there: the refusal
    must wake the wait, which then delivers the soft exception itself between two steps.
    Broken, the step sleeps on to the hard deadline (the stop time no longer counts a passed
    soft limit; on a free-threaded build the soft timer and a step's own timeout met there
    about once in 300 waits)."""
    from timeoutcore import _stop

    box: dict[str, Any] = {}
    in_block = threading.Event()

    def body() -> None:
        with timeoutcore.thread_deadline(4.0, soft=0.05, soft_raise=True) as scope:
            box["scope"], box["rec"] = scope, _stop.record()
            # As if the soft timer were delivering it already: the timer leaves it be.
            box["rec"].soft_claimed.add(scope)
            in_block.set()
            try:
                threading.Event().wait(10)
            except SoftDeadlineExceeded:
                box["soft_at"] = time.monotonic()

    timeoutcore.patch()
    try:
        worker = threading.Thread(target=lambda: box.update(error=_catch(body)), daemon=True)
        worker.start()
        assert in_block.wait(5)
        rec, scope = box["rec"], box["scope"]
        # past the soft limit, asleep in the step (its waker is registered)
        assert wait_until(lambda: scope.elapsed() > 0.25 and bool(rec.wakers), 5)
        time.sleep(0.02)
        rec.soft_claimed.discard(scope)
        sent = time.monotonic()
        refused = not _stop.deliver_soft(scope)
        worker.join(10)
    finally:
        timeoutcore.unpatch()
    assert not worker.is_alive() and box["error"] is None, box
    assert refused, "the step was not shielded: the test did not reach the refusal"
    assert "soft_at" in box, "the wait slept on to the hard deadline"
    assert box["soft_at"] - sent < 1.0


def _catch(fn: Any) -> Any:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - handed back to the test
        return exc
    return None


def test_a_wait_does_not_end_early_when_its_soft_limit_falls_due_between_two_readings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thread switch between a wait's reading of its stop time and its reading of the
    clock can put the soft limit between the two. The wait must then raise the soft
    exception, not return as if it were done: broken, it took the negative time left for
    a passed deadline, found nothing to raise and returned after one step (a patched
    Thread.join under soft_raise returned with the thread still running, about 1 in 3000
    next to a busy thread and the collector)."""
    from timeoutcore import _stop, blocking

    steps: list[Any] = []

    def step(t: Any) -> tuple[bool, str]:
        steps.append(t)
        return False, "returned early"

    with timeoutcore.thread_deadline(30, soft=10, soft_raise=True) as scope:
        soft_at = _stop.record().soft[scope]
        # The first reading just before the soft limit, every later one just after it.
        readings = iter([soft_at - 1e-3])
        monkeypatch.setattr(_stop, "_monotonic", lambda: next(readings, soft_at + 1e-3))
        try:
            with pytest.raises(SoftDeadlineExceeded):
                blocking.bounded_wait(step, None)
        finally:
            monkeypatch.undo()
    assert steps == [], steps


def test_soft_must_be_below_hard(api: Any) -> None:
    with pytest.raises(ValueError, match="less than"):
        api.thread_deadline(1, soft=1)
    with pytest.raises(ValueError, match="soft"):
        api.thread_deadline(1, soft=-1)
    with pytest.raises(TypeError, match="soft"):
        api.thread_deadline(1, soft="x")
    with pytest.raises(ValueError, match="need soft"):
        api.thread_deadline(1, soft_raise=True)
    with pytest.raises(TypeError, match="unexpected keyword"):
        api.thread_deadline(1, sfot=0.5)
    assert api.current_scope() is None


def test_cleanup_handlers_run_in_the_thread_last_first(api: Any, where: Any) -> None:
    def body() -> Any:
        order: list[Any] = []
        me = threading.get_ident()
        with pytest.raises(DeadlineExceeded):
            with api.thread_deadline(0.03) as scope:
                scope.on_timeout(order.append, "first")
                scope.on_timeout(lambda: order.append(("second", threading.get_ident() == me)))
                spin_forever()
        return order

    assert where(body) == [("second", True), "first"]


def test_failing_cleanup_is_logged_and_the_others_run(
    api: Any, caplog: pytest.LogCaptureFixture
) -> None:
    ran = []

    def broken() -> None:
        raise RuntimeError("cleanup broke")

    with caplog.at_level(logging.ERROR, logger="timeoutcore"):
        with pytest.raises(DeadlineExceeded):
            with api.thread_deadline(0.03) as scope:
                scope.on_timeout(ran.append, 1)
                scope.on_timeout(broken)
                scope.on_timeout(ran.append, 3)
                spin_forever()
    assert ran == [3, 1]
    assert any("cleanup broke" in (r.exc_text or "") or "failed" in r.getMessage()
               for r in caplog.records)


def test_cleanups_do_not_run_when_the_block_finishes(api: Any) -> None:
    ran = []
    with api.thread_deadline(1) as scope:
        scope.on_timeout(ran.append, 1)
    assert ran == []


def test_decorator_keeps_soft_settings() -> None:
    calls = []

    @timeoutcore.thread_deadline(5, soft=0.03, on_soft=calls.append)
    def work() -> None:
        # the soft limit passes in the block whatever the load; then its hard limit ends it
        scope = timeoutcore.current_scope()
        assert scope is not None and scope.limit == 5
        _until_soft_then_hard(scope)

    for _ in range(2):
        with pytest.raises(DeadlineExceeded):
            work()
    assert wait_until(lambda: len(calls) == 2)
    assert calls[0] is not calls[1]  # a fresh scope per call, each with the soft limit


def test_a_soft_limit_due_before_its_block_is_entered_is_not_lost() -> None:
    """The enter hook registers the soft limit before the scope stamps its entry. When the
    hook takes longer than the soft limit (an observer here; the first hook of a process
    imports and starts the soft timer), the timer finds the limit due and the scope not
    entered yet: it must look again once it is, never drop it."""

    class SlowEnter:
        def on_enter(self, scope: Any) -> None:
            time.sleep(0.1)  # the soft timer runs meanwhile, the limit long due

        def on_exit(self, scope: Any) -> None:
            pass

    seen: list[float] = []
    ran = threading.Event()

    def on_soft(scope: Any) -> None:
        seen.append(scope.elapsed())
        ran.set()

    with timeoutcore.thread_deadline(5, soft=0.01, on_soft=on_soft, observer=SlowEnter()):
        assert ran.wait(4), "the soft limit never fired"
    assert len(seen) == 1 and seen[0] >= 0.01, seen


def test_the_first_soft_limit_of_a_process_never_fires_early(tmp_path: Any) -> None:
    """The soft timer is registered in the enter hook, before the scope stamps its entry;
    the first time that hook imports the timer and starts its thread (milliseconds), and
    the soft limit fired that much before `soft` had passed in the block. The block lasts
    until the callback has run (an event, capped well below the hard limit), so that the
    soft limit always passes while it is active."""
    code = (
        "import threading, timeoutcore\n"
        "seen = []\n"
        "ran = threading.Event()\n"
        "def on_soft(s):\n"
        "    seen.append(s.elapsed())\n"
        "    ran.set()\n"
        "with timeoutcore.thread_deadline(5, soft=0.01, on_soft=on_soft):\n"
        "    ran.wait(4)\n"
        "assert len(seen) == 1 and seen[0] >= 0.01, seen\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
