"""Where an interrupt may surface: after a C call, in wrapper scopes, never in finalizers.

Native engine (the pure-Python engine's delivery has tests of its own, test_fallback.py).
Each test is a race run many times: it fails when the feature is broken, whatever the
machine's load, because it counts outcomes, not milliseconds.
"""

from __future__ import annotations

import contextlib
import gc
import random
import sys
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import pytest
from conftest import burn, spinning_threads

import timeoutcore
from timeoutcore import DeadlineExceeded, thread_deadline
from timeoutcore._unraisable import _QuietInterrupts
from timeoutcore.errors import _DeadlineInterrupt

pytestmark = pytest.mark.skipif(timeoutcore.ENGINE != "native", reason="native engine")


# -- 1. a C call that holds the GIL past the deadline ------------------------------------


@pytest.mark.parametrize("spinners", [0, 1, 3])
def test_the_code_after_a_long_c_call_is_stopped_not_run_to_the_exit(spinners: int) -> None:
    """The interrupt surfaces in the Python code that follows the call: the block never
    reaches its end (a 1 s loop after the call), next to 0, 1 or 3 busy threads. The loop
    is the margin: delivered as designed, it surfaces within milliseconds of the call's
    return (at its first line on 3.12+); a fire lost to the exit would let it finish."""

    def block() -> tuple[bool, bool]:
        finished = False
        scope = thread_deadline(0.005)
        try:
            with scope:
                sum(range(1_000_000))  # 10-20 ms in C, holding the GIL
                burn(1.0)
                finished = True
        except DeadlineExceeded:
            pass
        return finished, scope.expired()

    with spinning_threads(spinners), ThreadPoolExecutor(1) as pool:
        outcomes = [pool.submit(block).result() for _ in range(100 if spinners else 20)]
    assert outcomes == [(False, True)] * len(outcomes)


# -- 4. scopes entered and exited by wrappers --------------------------------------------


class _Guard:
    """A framework hook's shape: the scope is opened in __enter__, closed in __exit__."""

    def __init__(self, limit: float) -> None:
        self.limit = limit

    def __enter__(self) -> "_Guard":
        self.scope = thread_deadline(self.limit)
        self.scope.__enter__()
        self.after_enter = True  # code of the wrapper's own, after the scope's entry
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> Any:
        scope = self.scope  # an interrupt here would skip the scope's exit
        return scope.__exit__(et, ev, tb)


class _Split:
    """The same, with the exit's work in a helper the wrapper's __exit__ calls."""

    def __init__(self, limit: float) -> None:
        self.limit = limit

    def __enter__(self) -> "_Split":
        self.scope = thread_deadline(self.limit)
        self.scope.__enter__()
        return self

    def close(self, et: Any, ev: Any, tb: Any) -> Any:
        scope = self.scope
        return scope.__exit__(et, ev, tb)

    def __exit__(self, et: Any, ev: Any, tb: Any) -> Any:
        return self.close(et, ev, tb)


@contextlib.contextmanager
def _generator_guard(limit: float) -> Iterator[None]:
    with thread_deadline(limit):
        yield


def _enter(shape: str, limit: float, stack: contextlib.ExitStack) -> None:
    if shape == "class":
        stack.enter_context(_Guard(limit))
    elif shape == "helper":
        stack.enter_context(_Split(limit))
    elif shape == "exitstack":
        stack.enter_context(thread_deadline(limit))
    else:
        stack.enter_context(_generator_guard(limit))


@pytest.mark.parametrize("shape", ["class", "helper", "exitstack", "contextmanager"])
def test_a_wrapper_scope_never_lets_the_internal_interrupt_escape(shape: str) -> None:
    """2 ms limits, work of 1-3 ms: every block ends normally or with DeadlineExceeded,
    the scope is always exited (none left current), and the deadline still stops work."""
    rng = random.Random(36)
    outcomes = {"ok": 0, "exceeded": 0}
    escaped: list[BaseException] = []

    def blocks() -> None:
        for _ in range(400):
            try:
                with contextlib.ExitStack() as stack:
                    _enter(shape, 0.002, stack)
                    burn(rng.uniform(0.001, 0.003))
                outcomes["ok"] += 1
            except DeadlineExceeded:
                outcomes["exceeded"] += 1
            except BaseException as exc:  # noqa: BLE001 - what the test looks for
                escaped.append(exc)
            if timeoutcore.current_scope() is not None:
                escaped.append(RuntimeError("a scope was left current"))
                return

    t = threading.Thread(target=blocks)
    t.start()
    t.join(120)
    assert not t.is_alive()
    assert escaped == []
    assert outcomes["exceeded"] > 0  # the deadlines did stop work (races both ways)


def test_a_wrapper_scope_stops_a_cpu_loop_in_the_guarded_block() -> None:
    """The owner's block is what the scope guards: a loop there is stopped."""
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        with _Guard(0.05):
            burn(10.0)
    assert time.monotonic() - t0 < 5.0


def test_a_scope_opened_and_closed_inside_an_enter_still_stops_its_block() -> None:
    """__enter__ is protected code, but a scope of its own still interrupts its block."""

    class Connects:
        def __enter__(self) -> "Connects":
            with thread_deadline(0.05):
                burn(10.0)  # a slow connect
            return self

        def __exit__(self, *exc: Any) -> None:
            return None

    t0 = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        with Connects():
            pass
    assert time.monotonic() - t0 < 5.0


def test_an_exit_is_never_interrupted_half_way() -> None:
    """A user's __exit__ that outlives the deadline of an enclosing scope runs to its end;
    the deadline surfaces after it, and the block still ends with DeadlineExceeded."""
    done: list[str] = []

    class Cleanup:
        def __enter__(self) -> "Cleanup":
            return self

        def __exit__(self, *exc: Any) -> None:
            burn(0.1)  # past the deadline, in cleanup
            done.append("cleanup")

    with pytest.raises(DeadlineExceeded):
        with thread_deadline(0.02):
            with Cleanup():
                pass
            burn(5.0)
    assert done == ["cleanup"]


# -- 2. finalizers and weakref callbacks -------------------------------------------------


class _Finalized:
    def __del__(self) -> None:
        for _ in range(300):
            pass


class _Referent:
    pass


def _drop_finalized(stop: list[bool]) -> None:
    while not stop:
        _Finalized()


def _drop_with_callback(stop: list[bool]) -> None:
    def callback(ref: Any) -> None:
        for _ in range(300):
            pass

    refs: set[Any] = set()
    while not stop:
        obj = _Referent()
        ref = weakref.ref(obj, callback)
        refs.add(ref)
        del obj  # the callback runs here, by reference counting
        refs.discard(ref)


@pytest.mark.parametrize("loop", [_drop_finalized, _drop_with_callback])
def test_a_loop_that_drops_objects_with_finalizers_stops_at_its_deadline(loop: Any) -> None:
    """The interrupt is never lost in a __del__ or a weakref callback (CPython drops what
    is raised there): the loop stops at its 0.3 s deadline, not when it ends by itself
    (10 s later), and no report of the interrupt reaches sys.unraisablehook."""
    seen: list[Any] = []
    before = sys.unraisablehook
    sys.unraisablehook = _QuietInterrupts(seen.append)  # what timeoutcore installs
    gc.collect()
    stop: list[bool] = []
    timer = threading.Timer(10.0, stop.append, (True,))
    timer.start()
    try:
        took = []
        for _ in range(3):
            t0 = time.monotonic()
            with pytest.raises(DeadlineExceeded):
                with thread_deadline(0.3):
                    loop(stop)
            took.append(time.monotonic() - t0)
    finally:
        timer.cancel()
        sys.unraisablehook = before
    assert not stop
    assert max(took) < 5.0, took
    assert [u for u in seen if issubclass(u.exc_type, _DeadlineInterrupt)] == []


def test_an_interrupt_dropped_in_a_callback_is_reported_once_then_never_lands_there() -> None:
    """With a foreign sys.unraisablehook in place (say pytest's), a callback that CPython
    dropped the interrupt in is learned: at most one report for it, however many blocks."""
    seen: list[Any] = []

    def callback(ref: Any) -> None:
        for _ in range(2000):
            pass

    def loop(stop: list[bool]) -> None:
        refs: set[Any] = set()
        while not stop:
            obj = _Referent()
            ref = weakref.ref(obj, callback)
            refs.add(ref)
            del obj
            refs.discard(ref)

    before = sys.unraisablehook
    sys.unraisablehook = seen.append
    stop: list[bool] = []
    timer = threading.Timer(10.0, stop.append, (True,))
    timer.start()
    try:
        for _ in range(5):
            with pytest.raises(DeadlineExceeded):
                with thread_deadline(0.05):
                    loop(stop)
    finally:
        timer.cancel()
        sys.unraisablehook = before
    assert not stop
    assert len([u for u in seen if issubclass(u.exc_type, _DeadlineInterrupt)]) <= 1


_SLOW_CALLBACK = """
def callback(ref):
    for _ in range(20000 + {n}):  # nearly all of the loop's time: the exception lands here
        pass
"""


def _fresh_callback(n: int) -> Any:
    """A weakref callback the core has not learned: code objects that compare equal count
    as one (the constant makes each trial's differ)."""
    ns: dict[str, Any] = {}
    exec(compile(_SLOW_CALLBACK.format(n=n), f"<callback {n}>", "exec"), ns)
    return ns["callback"]


def test_a_soft_exception_dropped_in_a_weakref_callback_is_sent_again() -> None:
    """``soft_raise``'s exception surfacing in a weakref callback the core has not learned
    is dropped by CPython there; the core learns the callback and sends it again, so it
    reaches the ``except`` around the loop -- not the hard limit, 2 s on. Each trial's
    callback is new (a learned one is never delivered into); the reports show that drops
    did happen. Nothing surfaces after the block."""
    seen: list[Any] = []
    before = sys.unraisablehook
    sys.unraisablehook = seen.append
    outcomes = []
    try:
        for n in range(4):
            callback, caught = _fresh_callback(n), False
            with thread_deadline(2.0, soft_limit=0.03, soft_raise=True):
                try:
                    while True:
                        obj = _Referent()
                        ref = weakref.ref(obj, callback)
                        del obj  # the callback runs here, by reference counting
                        del ref
                except timeoutcore.SoftDeadlineExceeded:
                    caught = True
            outcomes.append(caught)
            burn(0.05)  # nothing sent again lands after the block
    finally:
        sys.unraisablehook = before
    soft_drops = [u for u in seen if u.exc_type is timeoutcore.SoftDeadlineExceeded]
    assert outcomes == [True] * 4, (outcomes, seen)
    assert len(soft_drops) >= 2, "few trials dropped it in their callback: nothing tested"


def test_a_soft_exception_class_the_program_drops_itself_is_not_sent_again() -> None:
    """The same class raised by the program in a callback after the block's own soft
    exception was caught is the program's: reported as usual, never sent again."""
    seen: list[Any] = []

    def raises(ref: Any) -> None:
        raise timeoutcore.SoftDeadlineExceeded("the program's own")

    before = sys.unraisablehook
    sys.unraisablehook = seen.append
    try:
        with thread_deadline(2.0, soft_limit=0.02, soft_raise=True) as scope:
            with pytest.raises(timeoutcore.SoftDeadlineExceeded):
                burn(1.0)
            obj = _Referent()
            ref = weakref.ref(obj, raises)
            del obj  # dropped by CPython: reported
            burn(0.1)  # nothing sent again surfaces here
        del ref
    finally:
        sys.unraisablehook = before
    assert [str(u.exc_value) for u in seen] == ["the program's own"], seen
    assert scope.overshoot is None
