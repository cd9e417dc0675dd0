"""Resources have owners: kernel timers, the watchdog, fork, signals, limits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from typing import Any

import pytest
from conftest import LATE, spin_forever

import timeoutcore
from timeoutcore import DeadlineExceeded

pytestmark = pytest.mark.skipif(timeoutcore.ENGINE != "native", reason="native engine only")

from timeoutcore import _native  # noqa: E402


def kernel_timers() -> int:
    with open("/proc/self/timers") as f:
        return sum(1 for line in f if line.startswith("ID:"))


def quiet_timers() -> int:
    """Kernel timers once the count has stopped changing (50 ms alike, at most 2 s): a
    thread an earlier test joined may still be deleting its timer, and counted in a
    "before" it made the next test's count one short (3.12.1, one run in several)."""
    deadline = time.monotonic() + 2
    n, same = kernel_timers(), 0
    while same < 10 and time.monotonic() < deadline:
        time.sleep(0.005)
        m = kernel_timers()
        same = same + 1 if m == n else 0
        n = m
    return n


def settled_timers(expected: int) -> int:
    """Kernel timers once exiting threads are fully gone: Thread.join() returns before
    the thread's pthread destructors (which delete its timer) have run."""
    deadline = time.monotonic() + 2
    n = kernel_timers()
    while n != expected and time.monotonic() < deadline:
        time.sleep(0.005)
        n = kernel_timers()
    return n


def run_python(code: str, env: Any = None, timeout: float = 60) -> subprocess.CompletedProcess:
    full_env = dict(os.environ)
    full_env.update(env or {})
    # a neutral working directory: `python -c` puts it first on sys.path, and the
    # source folder must not shadow the installed package
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=tempfile.gettempdir(),
    )


def test_short_lived_threads_leave_no_kernel_timers() -> None:
    with timeoutcore.thread_deadline(5):  # this thread's own timer exists from here on
        pass
    before = quiet_timers()
    fired = []

    def worker(i: int) -> None:
        try:
            with timeoutcore.thread_deadline(0.001 if i % 100 == 0 else 5):
                if i % 100 == 0:
                    spin_forever()
        except DeadlineExceeded:
            fired.append(i)

    for batch in range(0, 2000, 16):
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(batch, batch + 16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(fired) == 20
    assert settled_timers(before) == before
    assert _native.stats()["timers_live"] == before


def test_kernel_timer_exists_while_thread_lives() -> None:
    started, stop = threading.Event(), threading.Event()

    def worker() -> None:
        with timeoutcore.thread_deadline(10):
            started.set()
            stop.wait()

    before = quiet_timers()
    t = threading.Thread(target=worker)
    t.start()
    started.wait()
    during = kernel_timers()
    stop.set()
    t.join()
    assert during == before + 1 and settled_timers(before) == before


def test_signal_blocked_in_the_thread_still_fires() -> None:
    with timeoutcore.thread_deadline(5):
        pass
    signo = _native.signal_number()
    assert signo >= signal.SIGRTMIN

    def body() -> float:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signo})
        t0 = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            with timeoutcore.thread_deadline(0.05):
                spin_forever()
        return time.monotonic() - t0

    from conftest import in_thread

    took = in_thread(body)
    assert 0.05 <= took < 0.05 + LATE


def test_fork_child_enforces_deadlines_without_any_call() -> None:
    code = """
        import os, sys, time
        import timeoutcore
        from timeoutcore import DeadlineExceeded, thread_deadline

        def spin():
            for _ in range(10**15):
                pass

        with thread_deadline(5):          # watchdog and timer exist in the parent
            pass
        # fork from inside an armed block: the child keeps the deadline
        try:
            with thread_deadline(0.3) as scope:
                pid = os.fork()
                if pid == 0:
                    try:
                        spin()
                    except BaseException:
                        raise
                spin()
        except DeadlineExceeded:
            if pid == 0:
                # and a fresh block in the child works too
                try:
                    with thread_deadline(0.05):
                        spin()
                except DeadlineExceeded:
                    os._exit(42)
                os._exit(3)
        if pid == 0:
            os._exit(4)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else status >> 8)
    """
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert "child 42" in proc.stdout


def test_fork_warning_does_not_count_the_watchdog() -> None:
    code = """
        import os, warnings
        import timeoutcore
        with timeoutcore.thread_deadline(5):
            pass
        # the watchdog runs: a second kernel thread, which threading does not list
        assert len(os.listdir("/proc/self/task")) >= 2
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        print("ok")
    """
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert "ok" in proc.stdout


def test_someone_elses_handler_is_never_clobbered() -> None:
    code = """
        import signal, timeoutcore
        signal.signal(signal.SIGRTMIN + 3, lambda *a: None)
        try:
            with timeoutcore.thread_deadline(1):
                pass
        except RuntimeError as e:
            print("refused:", e)
        assert signal.getsignal(signal.SIGRTMIN + 3) is not signal.SIG_DFL
    """
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert "refused:" in proc.stdout and "TIMEOUTCORE_SIGNAL" in proc.stdout


def test_signal_is_configurable() -> None:
    code = """
        import signal, timeoutcore
        from timeoutcore import _native
        signal.signal(signal.SIGRTMIN + 3, lambda *a: None)
        try:
            with timeoutcore.thread_deadline(0.05):
                for _ in range(10**15):
                    pass
        except timeoutcore.DeadlineExceeded:
            print("fired on", _native.signal_number() - signal.SIGRTMIN)
    """
    proc = run_python(code, env={"TIMEOUTCORE_SIGNAL": "SIGRTMIN+5"})
    assert proc.returncode == 0, proc.stderr
    assert "fired on 5" in proc.stdout


@pytest.mark.parametrize("value", ["banana", "SIGRTMIN+x", "9", "0", "100000"])
def test_bad_signal_setting_is_a_clear_error(value: str) -> None:
    code = """
        import timeoutcore
        try:
            with timeoutcore.thread_deadline(1):
                pass
        except ValueError as e:
            print("error:", e)
        assert timeoutcore.current_scope() is None
    """
    proc = run_python(code, env={"TIMEOUTCORE_SIGNAL": value})
    assert proc.returncode == 0, proc.stderr
    assert "error:" in proc.stdout and "TIMEOUTCORE_SIGNAL" in proc.stdout


def test_timer_exhaustion_is_an_oserror_and_leaves_nothing_armed() -> None:
    code = """
        import errno, resource, threading, timeoutcore
        soft, hard = resource.getrlimit(resource.RLIMIT_SIGPENDING)
        resource.setrlimit(resource.RLIMIT_SIGPENDING, (0, hard))
        out = []
        def worker():
            try:
                with timeoutcore.thread_deadline(1):
                    out.append("entered")
            except OSError as e:
                out.append(("oserror", e.errno, str(e)))
            out.append(timeoutcore.current_scope())
        t = threading.Thread(target=worker); t.start(); t.join()
        print(out)
        resource.setrlimit(resource.RLIMIT_SIGPENDING, (soft, hard))
        try:
            with timeoutcore.thread_deadline(0.05):
                for _ in range(10**15):
                    pass
        except timeoutcore.DeadlineExceeded:
            print("works again")
    """
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert "'oserror', 11" in proc.stdout and "RLIMIT_SIGPENDING" in proc.stdout
    assert "None]" in proc.stdout and "works again" in proc.stdout


def test_interpreter_exits_promptly_with_armed_daemon_threads() -> None:
    code = """
        import threading, time, timeoutcore
        def spin():
            with timeoutcore.thread_deadline(30):
                for _ in range(10**15):
                    pass
        for _ in range(3):
            threading.Thread(target=spin, daemon=True).start()
        time.sleep(0.1)
        print("bye")
    """
    t0 = time.monotonic()
    proc = run_python(code, timeout=20)
    assert proc.returncode == 0, proc.stderr
    assert "bye" in proc.stdout and time.monotonic() - t0 < 15
