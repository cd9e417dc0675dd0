"""Shared helpers for the tests: both engines, and small bounded workloads."""

from __future__ import annotations

import gc
import os
import sys
import sysconfig
import contextlib
import textwrap
import threading
import time
import types
from collections.abc import Iterator
from typing import Any, Callable

import pytest

import timeoutcore
from timeoutcore import _fallback
from timeoutcore.scope import EXTRA_SLOTS, _ScopeMixin

# Generous correctness bounds (these machines are shared and noisy); timing figures
# belong in benchmarks/.
LATE = 0.25


def _fallback_api() -> types.SimpleNamespace:
    class FallbackScope(_ScopeMixin, _fallback.Scope):
        __slots__ = EXTRA_SLOTS

    return types.SimpleNamespace(
        name="fallback",
        thread_deadline=FallbackScope,
        thread_deadline_at=lambda when, **kw: FallbackScope(None, deadline=when, **kw),
        sleep=_fallback.sleep,
        shield=_fallback.shield,
        remaining=_fallback.remaining,
        current_deadline=_fallback.current_deadline,
        current_scope=_fallback.current_scope,
    )


def _native_api() -> types.SimpleNamespace:
    return types.SimpleNamespace(
        name=timeoutcore.ENGINE,
        thread_deadline=timeoutcore.thread_deadline,
        thread_deadline_at=timeoutcore.thread_deadline_at,
        sleep=timeoutcore.sleep,
        shield=timeoutcore.shield,
        remaining=timeoutcore.remaining,
        current_deadline=timeoutcore.current_deadline,
        current_scope=timeoutcore.current_scope,
    )


#: Source that a test's child-process script starts with: ``stopped_after(make, step)``
#: runs ``step()`` in a block ``make()`` enters until the block is stopped, and returns
#: ``[exception name, seconds]`` -- a lost delivery shows as ``["ran to the end", ~30]``;
#: ``cancelled_soon`` is a block another thread cancels 0.1 s in.
CHILD_BLOCKS = textwrap.dedent("""
    import threading, time
    from timeoutcore import DeadlineCancelled, DeadlineExceeded, thread_deadline

    def stopped_after(make, step, seconds=30.0):
        t0 = time.monotonic()
        try:
            with make():
                while time.monotonic() - t0 < seconds:
                    step()
        except (DeadlineExceeded, DeadlineCancelled) as exc:
            return [type(exc).__name__, time.monotonic() - t0]
        return ["ran to the end", time.monotonic() - t0]

    class cancelled_soon:
        def __enter__(self):
            self.scope = thread_deadline(60).__enter__()
            threading.Timer(0.1, self.scope.cancel).start()
            return self.scope
        def __exit__(self, *exc):
            return self.scope.__exit__(*exc)
""")

FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
#: the pure-Python engine needs a GIL (timeoutcore/_engine.py)
needs_gil = pytest.mark.skipif(FREE_THREADED, reason="the fallback engine needs a GIL")


#: The interpreter's switch interval before any test ran.
_SWITCH_INTERVAL = sys.getswitchinterval()


def settled_interval(want: float, give_up_after: float = 2.0) -> float:
    """The switch interval once it is ``want``, or after ``give_up_after`` seconds: the
    watchdog closes a fast window asynchronously (at the latest 20 ms after a fire), so one
    may still be open when a block or a test has ended."""
    end = time.monotonic() + give_up_after
    while abs(sys.getswitchinterval() - want) > 1e-9 and time.monotonic() < end:
        time.sleep(0.001)
    return sys.getswitchinterval()


@pytest.fixture(autouse=True)
def _switch_interval_isolated() -> Iterator[None]:
    """Every test starts and ends with the interpreter's own switch interval. A test that
    saved sys.getswitchinterval() to restore it later, while an earlier test's window was
    still closing, saved the window's 200 us and restored it as 199 us (sys truncates): no
    window opened for the rest of the run, and a test of the lead failed two test files
    later (CI, 3.11.7 and 3.12.1). A window left open, or an interval not put back, fails
    the test that left it."""
    settled_interval(_SWITCH_INTERVAL)
    yield
    found = settled_interval(_SWITCH_INTERVAL)
    if abs(found - _SWITCH_INTERVAL) > 1e-9:
        sys.setswitchinterval(_SWITCH_INTERVAL)  # the next tests start clean
        pytest.fail(f"the switch interval is {found} s two seconds after the test, "
                    f"not the interpreter's {_SWITCH_INTERVAL} s")


def _bad_moves() -> int:
    """The C core's count of slot state changes outside its table (csrc/tc_slot.c), or 0
    on the pure-Python engine."""
    if timeoutcore.ENGINE != "native":
        return 0
    from timeoutcore import _native

    return _native.stats()["bad_moves"]


@pytest.fixture(autouse=True)
def _core_states_follow_their_table() -> Iterator[None]:
    """Every test, whatever it drives, moves the C core's slots only along the table of
    their states: a move outside it is a core defect, and fails the test that made it.
    (The core's own invariant, the same with every accelerator off -- not a mechanism's
    counter.)"""
    before = _bad_moves()
    yield
    if _bad_moves() != before:
        pytest.fail(f"{_bad_moves() - before} slot state change(s) outside the core's table "
                    "(csrc/tc_slot.c)")


@pytest.fixture(params=["native", pytest.param("fallback", marks=needs_gil)])
def api(request: Any) -> types.SimpleNamespace:
    """The public API, once per engine."""
    return _native_api() if request.param == "native" else _fallback_api()


def burn(seconds: float) -> int:
    """Spin in Python for `seconds` (the loop lives in its own frame on purpose:
    CPython 3.13.0 skips a frame's handlers when an exception is raised at the
    back-edge of a `while <cond>:` loop in that frame, cpython#130279)."""
    import time

    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
    return n


@contextlib.contextmanager
def spinning_threads(n: int) -> Iterator[None]:
    """``n`` daemon threads spinning in Python code (busy neighbours) for the block."""
    stop: list[bool] = []

    def spin() -> None:
        while not stop:
            pass

    threads = [threading.Thread(target=spin, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        stop.append(True)
        for t in threads:
            t.join(5)


def spin_forever() -> None:
    """A CPU loop that only an interrupt ends."""
    for _ in range(10**15):
        pass


def in_thread(fn: Callable[[], Any]) -> Any:
    """Run `fn` in a fresh thread and return its result (or raise its exception)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)  # a stuck worker fails, never hangs
    t.start()
    t.join(30)
    assert not t.is_alive(), "worker thread did not finish"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def expect_deadline(work: Callable[[], Any], limit: float = 0.05) -> float:
    """Run ``work`` under ``thread_deadline(limit)`` in a worker thread: it must be stopped
    by the deadline, promptly (generous bound). Returns the overshoot in seconds."""

    def body() -> Any:
        scope = timeoutcore.thread_deadline(limit)
        t0 = time.monotonic()
        with pytest.raises(timeoutcore.DeadlineExceeded):
            with scope:
                work()
        return time.monotonic() - t0, scope

    took, scope = in_thread(body)
    assert scope.expired()
    assert limit <= took < limit + LATE, took
    assert scope.overshoot is not None and 0 <= scope.overshoot < LATE
    return float(scope.overshoot)


@pytest.fixture(params=["main", "worker"])
def where(request: Any) -> Callable[[Callable[[], Any]], Any]:
    """Run a callable in the main thread or in a worker thread."""
    if request.param == "main":
        return lambda fn: fn()
    return in_thread


def pytest_report_header(config: Any) -> str:
    return f"timeoutcore engine: {timeoutcore.ENGINE}"


@pytest.fixture
def no_leftover() -> Iterator[None]:
    """After the test, the calling thread has no active scope."""
    yield
    assert timeoutcore.current_scope() is None


@pytest.fixture
def patched_for_test() -> Iterator[None]:
    """``timeoutcore.patch()`` for the test; undone after it unless it was on before."""
    already = timeoutcore.is_patched()
    timeoutcore.patch()
    yield
    if not already:
        timeoutcore.unpatch()


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    """A pipe (read end, write end), closed after the test."""
    r, w = os.pipe()
    yield r, w
    os.close(r)
    os.close(w)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: Any) -> Iterator[str]:
    """A live Redis: TIMEOUTCORE_TEST_REDIS_URL (set by .ci/run; it must answer), else a
    ``redis-server`` started for this session; skipped only where neither exists."""
    from redis_server import session_redis

    with session_redis(lambda: tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture(scope="session")
def silent_peer() -> Iterator[Any]:
    """A loopback peer that accepts every connection and never answers
    (:class:`silent_peer.SilentPeer`: ``.url``, ``.host``, ``.port``)."""
    from silent_peer import SilentPeer

    with SilentPeer() as peer:
        yield peer


@pytest.fixture(scope="session")
def postgres_dsn(tmp_path_factory: Any) -> Iterator[str]:
    """A live PostgreSQL: $TIMEOUTCORE_TEST_POSTGRES_DSN, else a throw-away cluster started
    for this session; skipped only where neither exists."""
    from postgres_server import session_postgres

    with session_postgres() as dsn:
        yield dsn


def run_under_trigger(trigger: str, body: Callable[[], Any], at: float,
                      later: float = 0.0) -> tuple[str, float, float]:
    """Run ``body`` in this thread under a scope stopped by ``trigger`` at ``at`` s after
    entry: "hard" (its deadline), "soft" (a ``soft_raise`` soft limit on a 4 s scope),
    "cancel" (``cancel()`` from another thread), "earlier" (``reschedule`` to ``at`` from
    another thread at 0.1 s), "later" (a deadline at ``at`` moved to ``later`` from another
    thread at 0.05 s: give ``at`` a margin of a second or so over that, or a thread that
    starts late on a loaded machine finds the deadline already passed).
    Returns how the block ended ("hard", "soft", "cancelled" or "returned"), the seconds
    since entry, and the seconds after entry at which the stop was due: ``at`` (``later``
    for "later"), or later than that when the test's own trigger thread acted late (a
    loaded machine starts a thread when it can; that delay is not the stop's)."""
    # Collect earlier tests' garbage first: a cyclic collection run inside the block would
    # execute its weakref callbacks (threading's WeakSets) in this thread, where today's
    # asynchronous interrupt may surface and be reported as unraisable (the docs' "Known
    # limits" page: the standard library's critical sections). This test is about the waits.
    gc.collect()
    hard = at if trigger in ("hard", "later") else 4.0
    extra: dict[str, Any] = {"soft_limit": at, "soft_raise": True} if trigger == "soft" else {}
    scope = timeoutcore.thread_deadline(hard, **extra)
    start = time.monotonic()
    acted: list[float] = []  # when the trigger thread acted, seconds after entry

    def act(fn: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            acted.append(time.monotonic() - start)
            fn()

        return run

    timer = None
    if trigger == "cancel":
        timer = threading.Timer(at, act(scope.cancel))
    elif trigger == "earlier":
        timer = threading.Timer(0.1, act(lambda: scope.reschedule(start + at)))
    elif trigger == "later":
        timer = threading.Timer(0.05, act(lambda: scope.reschedule(start + later)))
    outcome = "returned"
    try:
        with scope:
            if timer is not None:
                timer.start()
            try:
                body()
            except timeoutcore.SoftDeadlineExceeded:
                outcome = "soft"
    except timeoutcore.DeadlineCancelled:
        outcome = "cancelled"
    except timeoutcore.DeadlineExceeded:
        outcome = "hard"
    finally:
        if timer is not None:
            timer.cancel()
    elapsed = time.monotonic() - start
    due = later if trigger == "later" else at
    if trigger in ("cancel", "earlier") and acted:
        due = max(due, acted[0])  # a cancel, or a move to a time already past, stops now
    return outcome, elapsed, due


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A throw-away self-signed certificate for 127.0.0.1 (needs the openssl command)."""
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    d = tmp_path_factory.mktemp("tls")
    cert, key = str(d / "cert.pem"), str(d / "key.pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )
    return cert, key
