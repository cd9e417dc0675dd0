"""Stopping every running block: cancel_all(), the children of a stopped scope,
DeadlineExecutor.shutdown(cancel_after=), and handle_sigterm() in a real worker process.

A "tree" is ``sh`` with a background grandchild; both print nothing and wait. Every check of
"nothing survives" is by PID: the child is reaped (its Popen has a returncode) and the
grandchild is gone from /proc (not running, not a zombie).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import burn, in_thread

import timeoutcore
from timeoutcore import (
    DeadlineCancelled,
    DeadlineExceeded,
    DeadlineExecutor,
    active_scopes,
    cancel_all,
    handle_sigterm,
    thread_deadline,
)

WAIT = 10.0  # s: the most a check waits (a broken build fails, never hangs)
TREE = ["sh", "-c", "sleep 60 & echo $!; sleep 60"]


def _gone(pid: int) -> bool:
    """Not running and not a zombie -- but for one re-parented to PID 1: init's to reap
    (some container inits reap lazily)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return fields[0] == "X" or (fields[0] == "Z" and fields[1] == "1")


def _wait_gone(pid: int, timeout: float = WAIT) -> bool:
    end = time.monotonic() + timeout
    while not _gone(pid):
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def patched() -> Iterator[None]:
    timeoutcore.patch()
    try:
        yield
    finally:
        timeoutcore.unpatch()


def _start_tree() -> tuple[subprocess.Popen[bytes], int]:
    proc = subprocess.Popen(TREE, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    grandchild = int(proc.stdout.readline())
    return proc, grandchild


class _Blocks:
    """Threads that each run one block until it stops; ``outcome[name]`` is what ended it."""

    def __init__(self) -> None:
        self.outcome: dict[str, BaseException | str] = {}
        self.entered = threading.Semaphore(0)
        self.threads: list[threading.Thread] = []

    def start(self, name: str, body: Any, limit: float | None = 60.0) -> None:
        def run() -> None:
            try:
                with thread_deadline(limit, label=name):
                    self.entered.release()
                    body()
                self.outcome[name] = "returned"
            except BaseException as exc:  # noqa: BLE001 - recorded for the test
                self.outcome[name] = exc

        t = threading.Thread(target=run, daemon=True)
        self.threads.append(t)
        t.start()

    def wait_entered(self, n: int) -> None:
        for _ in range(n):
            assert self.entered.acquire(timeout=WAIT)

    def join(self) -> None:
        for t in self.threads:
            t.join(WAIT)
            assert not t.is_alive(), "a cancelled block did not stop"


def test_cancel_all_stops_every_block_of_every_thread(patched: None) -> None:
    blocks = _Blocks()
    blocks.start("spin", lambda: burn(60))
    blocks.start("sleep", lambda: time.sleep(60))
    blocks.start("wait", lambda: threading.Event().wait(60))
    blocks.start("unlimited", lambda: burn(60), limit=None)
    blocks.wait_entered(4)
    time.sleep(0.05)
    assert {s.label for s in active_scopes()} == {"spin", "sleep", "wait", "unlimited"}
    start = time.monotonic()
    cancelled = cancel_all("maintenance")
    blocks.join()
    assert time.monotonic() - start < 5.0
    assert {s.label for s in cancelled} == {"spin", "sleep", "wait", "unlimited"}
    assert len(blocks.outcome) == 4
    for name, exc in blocks.outcome.items():
        assert isinstance(exc, DeadlineCancelled), (name, exc)
        assert exc.reason == "maintenance" and "(maintenance)" in str(exc)
    assert all(s.cancelled() and s.cancel_reason == "maintenance" for s in cancelled)
    assert active_scopes() == []


def test_cancel_all_cancels_the_outermost_scope_and_spares_later_blocks() -> None:
    seen: dict[str, Any] = {}
    go = threading.Event()

    def nested() -> None:
        try:
            with thread_deadline(60, label="outer") as outer:
                with thread_deadline(30, label="inner") as inner:
                    seen["scopes"] = (outer, inner)
                    go.set()
                    burn(60)
        except DeadlineExceeded as exc:
            seen["exc"] = exc

    t = threading.Thread(target=nested)
    t.start()
    assert go.wait(WAIT)
    (outer, inner) = seen["scopes"]
    assert cancel_all() == [outer]
    t.join(WAIT)
    assert isinstance(seen["exc"], DeadlineCancelled) and seen["exc"].scope is outer
    assert seen["exc"].reason is None
    assert outer.cancelled() and not inner.expired()
    # a block entered after the call is not affected
    with thread_deadline(5) as later:
        time.sleep(0.01)
    assert not later.expired()
    assert cancel_all() == []


def test_cancel_all_refuses_a_reason_that_is_not_a_string() -> None:
    with pytest.raises(TypeError, match="reason must be a str"):
        cancel_all(42)  # type: ignore[arg-type]
    with thread_deadline(5) as scope, pytest.raises(TypeError, match="reason must be a str"):
        scope.cancel(b"x")  # type: ignore[arg-type]
    assert not scope.expired()


def test_a_stopped_scope_kills_and_reaps_the_children_started_in_it(patched: None) -> None:
    """A child the block started and never waited for: the deadline stops the block in
    Python code, and the child and its grandchild die with it."""
    with pytest.raises(DeadlineExceeded):
        with thread_deadline(WAIT) as scope:
            proc, grandchild = _start_tree()
            # The tree is up however slowly it started: the deadline now comes while burning.
            scope.reschedule(time.monotonic() + 0.05)
            burn(60)
    assert proc.returncode == -signal.SIGKILL  # killed and reaped at the scope's exit
    assert _wait_gone(grandchild)


def test_children_of_a_block_that_ends_normally_run_on(patched: None) -> None:
    with thread_deadline(5):
        proc, grandchild = _start_tree()
    try:
        assert proc.poll() is None and not _gone(grandchild)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_an_inner_scope_that_stops_kills_its_children_and_the_outer_one_goes_on(
        patched: None) -> None:
    with pytest.raises(DeadlineCancelled):
        with thread_deadline(30) as outer:
            with pytest.raises(DeadlineExceeded):
                with thread_deadline(WAIT) as inner:
                    proc, grandchild = _start_tree()
                    inner.reschedule(time.monotonic() + 0.05)  # the tree is up: stop soon
                    burn(60)
            assert proc.returncode == -signal.SIGKILL and _wait_gone(grandchild)
            later, later_grandchild = _start_tree()  # the outer scope owns this one
            outer.cancel("stop")
            burn(60)
    assert later.returncode == -signal.SIGKILL and _wait_gone(later_grandchild)


def test_executor_shutdown_cancel_after_stops_running_tasks_and_their_trees(
        patched: None) -> None:
    grandchildren: list[int] = []
    started = threading.Semaphore(0)

    def tree_then_wait() -> None:
        proc, grandchild = _start_tree()
        grandchildren.append(grandchild)
        started.release()
        proc.wait()

    def spin() -> None:
        started.release()
        burn(60)

    def sleeper() -> None:
        started.release()
        time.sleep(60)

    pool = DeadlineExecutor(3)  # no policy: the tasks have no limit of their own
    futures = [pool.submit(tree_then_wait), pool.submit(spin), pool.submit(sleeper)]
    ran: list[str] = []
    queued = pool.submit(lambda: time.sleep(60))  # starts once a worker is free
    quick = pool.submit_with(5, ran.append, "quick")  # so does this one
    for _ in futures:
        assert started.acquire(timeout=WAIT)
    start = time.monotonic()
    pool.shutdown(cancel_after=0.3)
    took = time.monotonic() - start
    assert 0.3 <= took < 5.0
    for fut in futures + [queued, quick]:
        exc = fut.exception(0)
        assert isinstance(exc, DeadlineCancelled) and exc.reason == "executor shutdown", exc
    assert ran == []  # a task that starts after the cancel never runs, however quick
    assert grandchildren and all(_wait_gone(g) for g in grandchildren)


def test_executor_shutdown_cancel_after_waits_no_longer_than_needed() -> None:
    pool = DeadlineExecutor(2, policy=10)
    fut = pool.submit(time.sleep, 0.1)
    start = time.monotonic()
    pool.shutdown(cancel_after=20)
    assert time.monotonic() - start < 5.0
    assert fut.result(0) is None


def test_executor_shutdown_without_waiting_cancels_from_a_helper_thread() -> None:
    pool = DeadlineExecutor(1)
    fut = pool.submit(burn, 60)
    time.sleep(0.05)
    start = time.monotonic()
    pool.shutdown(wait=False, cancel_after=1.0)
    # Returned before the grace ended (a shutdown that waited for it would take a second),
    # and the task still runs: the cancel is the helper thread's, at the end of the grace.
    assert time.monotonic() - start < 1.0
    assert not fut.done()
    assert isinstance(fut.exception(WAIT), DeadlineCancelled)


@pytest.mark.parametrize("value, error", [(-1, ValueError), ("1", TypeError),
                                          (True, TypeError), (float("nan"), ValueError)])
def test_executor_shutdown_refuses_a_bad_cancel_after(value: Any, error: type) -> None:
    pool = DeadlineExecutor(1)
    with pytest.raises(error, match="cancel_after"):
        pool.shutdown(cancel_after=value)
    assert pool.submit(lambda: 3).result(WAIT) == 3  # nothing was shut down
    pool.shutdown()


# --- handle_sigterm() in a worker process ---------------------------------------------------

WORKER = textwrap.dedent("""
    import subprocess, sys, threading, time
    import timeoutcore
    from timeoutcore import DeadlineExecutor

    timeoutcore.patch()
    grace, exit_code = float(sys.argv[1]), sys.argv[2]
    lock = threading.Lock()

    def say(*parts):  # one line, whole: the threads print concurrently
        with lock:
            sys.stdout.write(" ".join(str(p) for p in parts) + "\\n")
            sys.stdout.flush()

    handler = timeoutcore.handle_sigterm(
        grace, exit_code=None if exit_code == "none" else int(exit_code))

    def tree():
        proc = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; sleep 60"],
                                stdout=subprocess.PIPE)
        say("grandchild", int(proc.stdout.readline()))
        proc.communicate()

    def spin():
        while True:
            pass

    def short():
        time.sleep(0.2)
        return "short done"

    pool = DeadlineExecutor(4)
    futures = {"tree": pool.submit(tree), "spin": pool.submit(spin),
               "sleep": pool.submit(time.sleep, 60), "short": pool.submit(short)}
    # "ready" once the short task has ended and the three others run in their blocks (not
    # at some time that is usually enough): the signal must find exactly those three.
    futures["short"].result(10)
    while len(timeoutcore.active_scopes()) < 3:
        time.sleep(0.01)
    say("ready")
    try:
        # Woken now and then: CPython runs a signal's Python handler in the main thread,
        # at its next bytecode, and a signal that lands as the thread is about to sleep in
        # a wait (after its last check, before the system call) wakes nothing; its
        # handler waits for the next wake (seen on 3.14t under load).
        while not handler.requested.wait(0.1):
            pass
        say("requested")
        while not handler.done.wait(0.1):
            pass
    finally:
        for name, fut in futures.items():
            try:
                say(name, "result", fut.result(5))
            except BaseException as exc:
                say(name, type(exc).__name__, getattr(exc, "reason", None))
        say("cancelled", len(handler.cancelled))
""")


def _read_until(proc: subprocess.Popen[str], lines: list[str],
                done: Callable[[list[str]], bool], what: str) -> None:
    """Append the worker's lines to ``lines`` until ``done(lines)``; fails, never hangs,
    if it does not get there."""

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.strip())
            if done(lines):
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(WAIT)
    if reader.is_alive():
        proc.kill()
        raise AssertionError(f"the worker did not {what}: {lines}")


def _read_until_ready(proc: subprocess.Popen[str]) -> list[str]:
    """The worker's lines up to "ready" (its grandchild's pid among them)."""
    lines: list[str] = []
    # the two come from different threads, in either order
    _read_until(proc, lines, lambda seen: "ready" in seen and any(
        x.startswith("grandchild") for x in seen), "start")
    return lines


def _run_worker(tmp_path: Path, grace: float, signals: int = 1,
                exit_code: str = "143") -> tuple[int, list[str], float]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    proc = subprocess.Popen([sys.executable, str(script), str(grace), exit_code],
                            stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        lines = _read_until_ready(proc)  # the short task has ended; the others run
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        if signals > 1:
            # "Again" means after the first was taken: a signal sent while the same one is
            # still pending merges with it (the kernel's rule, and CPython's), and the
            # worker takes it at its next wake -- which under load can come after a second
            # signal sent a fixed time later (seen on 3.14t: one handler call for two).
            _read_until(proc, lines, lambda seen: "requested" in seen, "take the signal")
            for _ in range(signals - 1):
                proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        took = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, lines + out.splitlines(), took


def _grandchild(lines: list[str]) -> int:
    return int(next(x for x in lines if x.startswith("grandchild")).split()[1])


def test_sigterm_grace_then_cancel_all_then_exit(tmp_path: Path) -> None:
    code, lines, took = _run_worker(tmp_path, grace=1.0)
    assert code == 143, lines
    assert 1.0 <= took < 10.0, lines
    assert "requested" in lines
    for name in ("tree", "spin", "sleep"):
        assert f"{name} DeadlineCancelled shutdown: SIGTERM" in lines, lines
    assert "short result short done" in lines
    assert "cancelled 3" in lines
    assert _wait_gone(_grandchild(lines))


def test_sigterm_twice_skips_the_rest_of_the_grace_period(tmp_path: Path) -> None:
    code, lines, took = _run_worker(tmp_path, grace=60.0, signals=2)
    assert code == 143, lines
    assert took < 10.0, lines
    assert "spin DeadlineCancelled shutdown: SIGTERM" in lines
    assert _wait_gone(_grandchild(lines))


def test_sigterm_without_exit_code_leaves_the_exit_to_the_program(tmp_path: Path) -> None:
    code, lines, _ = _run_worker(tmp_path, grace=0.0, exit_code="none")
    assert code == 0, lines
    assert "cancelled 3" in lines and "sleep DeadlineCancelled shutdown: SIGTERM" in lines
    assert _wait_gone(_grandchild(lines))


def test_handle_sigterm_refuses_bad_arguments_and_other_threads() -> None:
    with pytest.raises(ValueError, match="grace"):
        handle_sigterm(-1)
    with pytest.raises(TypeError, match="signals"):
        handle_sigterm(1, signals=signal.SIGTERM)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="exit_code"):
        handle_sigterm(1, exit_code="143")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="main thread"):
        in_thread(lambda: handle_sigterm(1))
    assert signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, signal.default_int_handler)


def test_handler_uninstall_puts_the_previous_handler_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    handler = handle_sigterm(1)
    assert signal.getsignal(signal.SIGTERM) == handler._on_signal
    assert handler._thread.is_alive()  # waits for the signal
    handler.uninstall()
    assert signal.getsignal(signal.SIGTERM) == before
    assert not handler._thread.is_alive()  # nothing left behind


def test_a_block_with_a_far_limit_is_cancelled_in_any_patched_wait(patched: None) -> None:
    """The far limit of a task without one (years): poll() and the selectors take
    milliseconds as a C int, so the waits must not hand it on whole (OverflowError)."""
    import selectors
    import socket

    from timeoutcore.executor import NO_LIMIT

    a, b = socket.socketpair()

    def selector_wait() -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(a, selectors.EVENT_READ)
            sel.select()

    def communicate() -> None:
        subprocess.Popen(["sleep", "60"], stdout=subprocess.PIPE).communicate()

    try:
        for wait in (selector_wait, communicate, lambda: a.recv(1), lambda: time.sleep(60)):
            with pytest.raises(DeadlineCancelled):
                with thread_deadline(NO_LIMIT) as scope:
                    threading.Timer(0.1, scope.cancel).start()
                    wait()
    finally:
        a.close()
        b.close()


def test_cancel_all_from_a_signal_handler_in_a_guarded_thread_never_raises_there() -> None:
    """The handler runs in the main thread, inside its block: cancelling that block must
    not raise inside cancel_all (it would cut the loop short, and land wherever the signal
    interrupted the thread); every block is cancelled. The interrupt then comes through
    safe delivery: a handler that is protected code runs to its end first."""
    blocks = _Blocks()
    blocks.start("worker", lambda: burn(60))
    blocks.wait_entered(1)
    seen: dict[str, Any] = {}

    @timeoutcore.protected
    def handler(signum: int, frame: Any) -> None:
        seen["cancelled"] = {s.label for s in cancel_all("from a handler")}
        burn(0.1)  # long enough for the helper's cancel to be due inside the handler
        seen["handler finished"] = True

    previous = signal.signal(signal.SIGUSR2, handler)
    try:
        with pytest.raises(DeadlineCancelled) as info:
            with thread_deadline(60, label="main"):
                signal.pthread_kill(threading.get_ident(), signal.SIGUSR2)
                burn(60)
    finally:
        signal.signal(signal.SIGUSR2, previous)
    blocks.join()
    assert seen == {"cancelled": {"main", "worker"}, "handler finished": True}
    assert info.value.reason == "from a handler"
    assert isinstance(blocks.outcome["worker"], DeadlineCancelled)


def test_executor_shutdown_cancel_after_covers_the_queue_too() -> None:
    """One worker, tasks queued behind each other: between two of them no task runs, but
    the pool is not idle; the grace still ends with everything cancelled."""
    pool = DeadlineExecutor(1)
    futures = [pool.submit(burn, 60) for _ in range(4)]
    time.sleep(0.05)
    start = time.monotonic()
    pool.shutdown(cancel_after=0.2)
    assert time.monotonic() - start < 5.0
    assert all(isinstance(f.exception(0), DeadlineCancelled) for f in futures)


def _signal_self_and_raise_when_safe(body: Callable[[], object]) -> None:
    """Run ``body`` in the main thread with a SIGUSR1 handler that asks for SystemExit(143)
    through ``raise_when_safe``: it must come out of ``body``, and leave no tracer."""
    from timeoutcore._safe_raise import raise_when_safe

    before = sys.gettrace()
    old = signal.signal(signal.SIGUSR1,
                        lambda signum, frame: raise_when_safe(frame, SystemExit(143)))
    try:
        with pytest.raises(SystemExit) as info:
            body()
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert info.value.code == 143
    assert sys.gettrace() is before  # the tracer it used is gone


def test_an_exit_from_a_signal_handler_waits_for_protected_code() -> None:
    """The SIGTERM handler's SystemExit used to surface wherever the main thread was: in
    Condition.wait between the wait and re-taking its lock, the ``with`` around it then
    released a lock it did not hold (RuntimeError, 1 run in ~30 of the SIGTERM test on a
    loaded 3.14t). Raised through raise_when_safe, it waits until the protected call has run
    to its end, and comes out of that call, as if the call had raised it."""
    steps: list[str] = []

    @timeoutcore.protected
    def critical() -> str:
        steps.append("start")
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)  # handled in here
        steps.append("middle")
        steps.append("end")
        return "value"

    def body() -> None:
        steps.append(critical())
        steps.append("after")  # never: the call raises

    _signal_self_and_raise_when_safe(body)
    assert steps == ["start", "middle", "end"]


def test_an_exit_from_a_signal_handler_outside_protected_code_is_raised_at_once() -> None:
    steps: list[str] = []

    def body() -> None:
        steps.append("start")
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
        steps.append("after")  # never: raised at the next bytecode

    _signal_self_and_raise_when_safe(body)
    assert steps == ["start"]
