"""Behaviour of thread_deadline, in the main thread and in workers, on both engines."""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import LATE, burn, in_thread, spin_forever, spinning_threads

import timeoutcore
from timeoutcore import DeadlineExceeded
from timeoutcore.errors import _DeadlineInterrupt


def test_native_engine_is_active_on_linux() -> None:
    if os.environ.get("TIMEOUTCORE_ENGINE", "").strip().lower() == "fallback":
        pytest.skip("TIMEOUTCORE_ENGINE=fallback chose the pure-Python engine (nox -s fallback)")
    assert timeoutcore.ENGINE == "native"


def test_cpu_loop_is_interrupted(api: Any, where: Any) -> None:
    def body() -> Any:
        t0 = time.monotonic()
        with pytest.raises(DeadlineExceeded) as info:
            with api.thread_deadline(0.05, label="cpu") as scope:
                spin_forever()
        return time.monotonic() - t0, scope, info.value

    took, scope, exc = where(body)
    assert 0.05 <= took < 0.05 + LATE
    assert scope.expired()
    assert exc.scope is scope and exc.label == "cpu" and exc.limit == 0.05
    assert exc.overshoot is not None and 0 <= exc.overshoot < LATE
    assert exc.elapsed >= 0.05


def test_block_that_finishes_in_time_is_untouched(api: Any, where: Any) -> None:
    def body() -> Any:
        with api.thread_deadline(5.0) as scope:
            value = sum(range(1000))
        return value, scope

    value, scope = where(body)
    assert value == 499500
    assert not scope.expired() and scope.overshoot is None
    assert 0 <= scope.elapsed() < 5.0


@pytest.mark.skipif(timeoutcore.ENGINE == "fallback",
                    reason="the fallback engine has no signal: a blocking C call is not knocked loose")
def test_blocking_libc_read_is_knocked_loose(where: Any) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.read.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)
    libc.read.restype = ctypes.c_ssize_t

    def body() -> Any:
        r, w = os.pipe()
        buf = ctypes.create_string_buffer(16)
        try:
            t0 = time.monotonic()
            with pytest.raises(DeadlineExceeded):
                with timeoutcore.thread_deadline(0.05):
                    libc.read(r, buf, 16)  # blocks: nothing is ever written
                    spin_forever()  # not reached in practice; keeps the test honest
            return time.monotonic() - t0
        finally:
            os.close(r)
            os.close(w)

    took = where(body)
    assert 0.05 <= took < 0.05 + LATE


def test_timeoutcore_sleep_ends_at_the_deadline(api: Any, where: Any) -> None:
    def body() -> float:
        t0 = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            with api.thread_deadline(0.05):
                api.sleep(5)
        return time.monotonic() - t0

    took = where(body)
    assert 0.05 <= took < 0.05 + LATE


def test_sleep_outside_a_scope_sleeps(api: Any) -> None:
    t0 = time.monotonic()
    api.sleep(0.02)
    assert time.monotonic() - t0 >= 0.02


def test_sleep_shorter_than_the_deadline_returns(api: Any) -> None:
    with api.thread_deadline(5) as scope:
        api.sleep(0.01)
    assert not scope.expired()


def test_except_exception_cannot_swallow_it(api: Any, where: Any) -> None:
    def body() -> int:
        caught = 0
        with pytest.raises(DeadlineExceeded):
            with api.thread_deadline(0.05):
                try:
                    spin_forever()
                except Exception:  # noqa: BLE001 - the point of the test
                    caught += 1
        return caught

    assert where(body) == 0


def test_swallowed_interrupt_is_raised_again(api: Any, where: Any) -> None:
    """A body that swallows the interrupt gets it again, and the block ends with
    DeadlineExceeded (were it not raised again, the last spin would never end). A re-sent
    interrupt lands at the next safe place: mostly inside the spin, but one that comes
    while the handler runs waits for it to end and lands on the loop's next line, outside
    the ``try`` -- so the body swallows one to three."""

    def body() -> int:
        swallowed = 0
        with pytest.raises(DeadlineExceeded):
            with api.thread_deadline(0.05):
                for _ in range(1000):
                    try:
                        spin_forever()
                    except BaseException:  # noqa: BLE001 - a body that swallows everything
                        swallowed += 1
                        if swallowed >= 3:
                            break
                spin_forever()
        return swallowed

    assert 1 <= where(body) <= 3


def _spin(seconds: float) -> int:
    """Spin in Python for `seconds`; the number of interrupts that landed meanwhile
    (each swallowed, so that a test can count them)."""
    end = time.monotonic() + seconds
    landed = 0
    while time.monotonic() < end:
        try:
            burn(end - time.monotonic())
        except _DeadlineInterrupt:
            landed += 1
    return landed


@pytest.mark.parametrize("shape", ["except", "finally"])
def test_a_handler_cleaning_up_after_the_interrupt_is_not_interrupted_again(
        api: Any, where: Any, shape: str) -> None:
    """While the interrupt is being handled -- an ``except`` or a ``finally`` that cleans
    up -- it is on its way out, not swallowed: the cleanup runs to its end with no second
    interrupt, longer than a held interrupt holds the re-send back (about a second), and
    the block ends with DeadlineExceeded."""

    def body() -> int:
        landed = -1
        with pytest.raises(DeadlineExceeded):
            with api.thread_deadline(0.02):
                if shape == "finally":
                    try:
                        spin_forever()
                    finally:
                        landed = _spin(1.3)
                else:
                    try:
                        spin_forever()
                    except BaseException:
                        landed = _spin(1.3)
                        raise
        return landed

    assert where(body) == 0


def test_a_block_entered_while_handling_an_expiry_gets_its_own(api: Any, where: Any) -> None:
    """A fallback in ``except DeadlineExceeded:`` is a block of its own: the handled
    exception's chain still holds the first block's interrupt, but that one is over, and
    the new block is stopped inside at its own deadline (broken: only its exit, 10 s
    on, raised)."""

    def body() -> float:
        try:
            with api.thread_deadline(0.02):
                spin_forever()
        except DeadlineExceeded:
            t0 = time.monotonic()
            with pytest.raises(DeadlineExceeded):
                with api.thread_deadline(0.05):
                    burn(10.0)
            return time.monotonic() - t0
        return -1.0

    took = where(body)
    assert 0.0 <= took < 5.0, took


def test_an_interrupt_kept_to_raise_later_is_not_sent_again_meanwhile(
        api: Any, where: Any) -> None:
    """A body that catches the interrupt, keeps it, works on and then raises it -- as a
    hook caller hands it on (pluggy's loop keeps it in a local while it ends its other
    wrappers) -- gets no second interrupt while it keeps it: it is held, as one being
    handled is, and the block ends with the one interrupt."""

    def body() -> tuple[int, bool]:
        with pytest.raises(DeadlineExceeded) as info:
            with api.thread_deadline(0.02):
                kept: BaseException | None = None
                try:
                    spin_forever()
                except BaseException as exc:  # noqa: BLE001 - kept, raised below
                    kept = exc
                landed = _spin(0.3)  # the re-send used to come 2 ms after the fire
                assert kept is not None
                raise kept
        return landed, info.value.__context__ is kept

    assert where(body) == (0, True)


def test_a_scope_in_a_hook_wrapper_is_left_when_its_caller_hands_the_interrupt_on(
        api: Any) -> None:
    """The pytest plugin's shape: a scope entered in a generator (a pluggy wrapper),
    suspended at its yield while the caller runs the body; the caller catches the
    interrupt, does work of its own (the rest of its loop, slowed by a loaded machine),
    then throws it into the generator. The scope is left with DeadlineExceeded, and no
    interrupt ever surfaces in the caller, before or after."""

    def wrapper() -> Any:
        with api.thread_deadline(0.02):
            yield

    def caller() -> tuple[int, type[BaseException] | None, int]:
        gen = wrapper()
        next(gen)
        kept: BaseException | None = None
        try:
            spin_forever()
        except BaseException as exc:  # noqa: BLE001 - handed on below, as pluggy does
            kept = exc
        before = _spin(0.3)
        outcome: type[BaseException] | None = None
        try:
            assert kept is not None
            gen.throw(kept)
        except BaseException as exc:  # noqa: BLE001 - what the wrapper raised, compared
            outcome = type(exc)
        return before, outcome, _spin(0.3)

    before, outcome, after = in_thread(caller)
    assert (before, outcome, after) == (0, DeadlineExceeded, 0)
    assert api.current_scope() is None


def test_an_interrupt_kept_for_good_is_still_sent_again(api: Any, where: Any) -> None:
    """A body that keeps every interrupt and goes on (a log handler that holds its
    records) does not run for ever: the interrupt is sent again once it has been held
    for a while (a bound of about a second), and the block ends."""

    def body() -> int:
        kept: list[BaseException] = []
        with pytest.raises(DeadlineExceeded):
            with api.thread_deadline(0.02):
                for _ in range(3):  # each turn until an interrupt lands (broken: 10 s)
                    try:
                        burn(10.0)
                    except BaseException as exc:  # noqa: BLE001 - kept for good
                        kept.append(exc)
                    if len(kept) == 2:
                        break
                burn(10.0)  # ends with the next one (broken: the exit raises)
        return len(kept)

    assert where(body) == 2


def test_raise_on_timeout_false_abandons_silently(api: Any, where: Any) -> None:
    def body() -> Any:
        reached_after = False
        with api.thread_deadline(0.05, raise_on_timeout=False) as scope:
            spin_forever()
        reached_after = True
        return scope, reached_after

    scope, reached_after = where(body)
    assert reached_after and scope.expired()
    assert scope.overshoot is not None


# A C call that holds the GIL from before the deadline to the block's end: the watchdog
# (3.11) or the self-fire's pending call (3.12+) can act only once the thread lets the GIL
# go, and a busy neighbour may take it first and hand it back to the guarded thread, which
# then reaches its exit before anybody fired. The exit itself then decides (the backstop).
_C_CALL = 1_000_000  # sum(range(_C_CALL)): 10-20 ms in C, holding the GIL
_C_LIMIT = 0.005


@pytest.mark.parametrize("spinners", [0, 1, 3])
def test_a_c_call_holding_the_gil_past_the_deadline_never_ends_normally(
        api: Any, spinners: int) -> None:
    """A block still running when its deadline passes ends with DeadlineExceeded, and
    expired() says so -- also when nobody fired before its exit (next to a busy thread,
    such blocks used to end normally now and then)."""

    def block() -> tuple[str, bool, float]:
        scope = api.thread_deadline(_C_LIMIT)
        try:
            with scope:
                sum(range(_C_CALL))
        except DeadlineExceeded:
            return "raised", scope.expired(), scope.elapsed()
        return "returned", scope.expired(), scope.elapsed()

    with spinning_threads(spinners), ThreadPoolExecutor(1) as pool:
        outcomes = [pool.submit(block).result() for _ in range(40 if spinners else 10)]
    past = [o for o in outcomes if o[2] > _C_LIMIT]
    # the call outlasts the deadline (else the block proves nothing)
    assert len(past) >= 0.75 * len(outcomes), outcomes
    assert [o for o in past if o[:2] != ("raised", True)] == []


@pytest.mark.skipif(timeoutcore.ENGINE != "native", reason="the C core's exit")
def test_an_exit_that_drops_a_fired_inner_scope_still_expires_its_own() -> None:
    """An inner scope left on the stack (entered, never exited) fires; its interrupt is
    swallowed, then held back by a shield while the outer deadline passes, so nobody fires
    the outer one. The outer exit drops the inner scope and still ends with its own
    DeadlineExceeded, expired -- the exit's backstop, reached from a slot that had just
    dropped its fired scope (the autouse fixture checks the core's states meanwhile)."""
    outer = timeoutcore.thread_deadline(0.05)
    inner = timeoutcore.thread_deadline(0.005)
    with pytest.raises(DeadlineExceeded) as info:
        with outer:
            inner.__enter__()  # never exited: the outer exit drops it
            try:
                burn(5.0)  # the inner deadline's interrupt lands here
            except BaseException:  # noqa: BLE001 - the internal interrupt, swallowed on purpose
                pass
            with timeoutcore.shield():  # nothing surfaces until it ends
                time.sleep(0.1)
    assert info.value.scope is outer
    assert outer.expired() and inner.expired()


def test_abandoning_silently_never_swallows_the_blocks_own_error(api: Any) -> None:
    """raise_on_timeout=False swallows the deadline's interrupt, not an error the block
    raised after its deadline passed: that error propagates, and expired() is true."""
    for _ in range(20):
        raised_own: list[bool] = []
        scope = api.thread_deadline(_C_LIMIT, raise_on_timeout=False)
        try:
            with scope:
                sum(range(_C_CALL))  # past the deadline; an interrupt may surface here
                raised_own.append(True)
                raise KeyError("the block's own")
        except KeyError:
            assert raised_own and scope.expired()
        else:
            assert not raised_own and scope.expired()  # the interrupt came first


def test_decorator_makes_a_fresh_scope_per_call(api: Any, where: Any) -> None:
    scopes: list[Any] = []

    @api.thread_deadline(1.0, label="deco")
    def work(overrun: bool) -> str:
        scope = api.current_scope()
        scopes.append(scope)
        if overrun:
            # overruns: its deadline, brought near so the test does not wait out the limit
            scope.reschedule(time.monotonic() + 0.02)
            spin_forever()
        burn(0.001)
        return "done"

    def body() -> Any:
        first = work(False)
        with pytest.raises(DeadlineExceeded) as info:
            work(True)
        third = work(False)
        return first, info.value.label, third

    assert where(body) == ("done", "deco", "done")
    assert work.__name__ == "work"
    assert len(scopes) == 3 and len({id(s) for s in scopes}) == 3
    assert all(s.limit == 1.0 and s.label == "deco" for s in scopes)
    assert [s.expired() for s in scopes] == [False, True, False]


def test_nested_outer_deadline_wins(api: Any, where: Any) -> None:
    def body() -> Any:
        with pytest.raises(DeadlineExceeded) as info:
            with api.thread_deadline(0.05, label="outer") as outer:
                with api.thread_deadline(5, label="inner") as inner:
                    spin_forever()
        return info.value.label, outer.expired(), inner.expired()

    assert where(body) == ("outer", True, False)


def test_nested_inner_wins_then_outer_still_fires(api: Any, where: Any) -> None:
    # The outer deadline is armed at entry and never moved (what is tested is that it is
    # re-armed when the inner scope ends), so it must come later than the inner one's
    # delivery on a loaded machine: a margin of about a second.
    def body() -> Any:
        events = []
        with pytest.raises(DeadlineExceeded) as info:
            with api.thread_deadline(1.0, label="outer") as outer:
                try:
                    with api.thread_deadline(0.03, label="inner"):
                        spin_forever()
                except DeadlineExceeded as exc:
                    events.append((exc.label, round(time.monotonic() - outer.entered_at, 2)))
                spin_forever()  # the outer deadline is re-armed: this ends too
        return events, info.value.label, outer.elapsed()

    events, label, elapsed = where(body)
    assert events and events[0][0] == "inner" and events[0][1] < 1.0
    assert label == "outer" and 1.0 <= elapsed < 1.0 + LATE


def test_inner_scope_never_swallows_an_outer_expiry(api: Any, where: Any) -> None:
    def body() -> Any:
        with pytest.raises(DeadlineExceeded) as info:
            with api.thread_deadline(0.05, label="outer"):
                # the inner scope does not raise on its own timeout: it must still
                # let the outer one's interrupt through
                with api.thread_deadline(5, label="inner", raise_on_timeout=False):
                    spin_forever()
                spin_forever()
        return info.value.label

    assert where(body) == "outer"


def test_reschedule_moves_the_deadline(api: Any, where: Any) -> None:
    def body() -> Any:
        t0 = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            with api.thread_deadline(10) as scope:
                scope.reschedule(time.monotonic() + 0.05)
                spin_forever()
        earlier = time.monotonic() - t0
        # moved later well before the first deadline, then run past that first deadline
        with api.thread_deadline(0.5) as scope2:
            scope2.reschedule(time.monotonic() + 5)
            burn(max(scope2.entered_at + 0.5 + 0.1 - time.monotonic(), 0))
        return earlier, scope2.expired(), scope2.when()

    earlier, expired, when = where(body)
    assert earlier < 0.05 + LATE and not expired and when is not None


def test_reschedule_to_the_past_fires_at_once(api: Any) -> None:
    with pytest.raises(DeadlineExceeded):
        with api.thread_deadline(10) as scope:
            scope.reschedule(time.monotonic() - 1)
            spin_forever()


def test_scope_introspection(api: Any) -> None:
    scope = api.thread_deadline(2.0, label="x")
    assert scope.when() is None and scope.remaining() == 2.0 and scope.elapsed() == 0.0
    assert not scope.expired() and scope.label == "x" and scope.limit == 2.0
    before = time.monotonic()
    with scope:
        assert scope.active and api.current_scope() is scope
        assert before + 2.0 <= scope.when() <= time.monotonic() + 2.0
        assert 0 < scope.remaining() <= 2.0
        assert 0 < api.remaining() <= 2.0
    assert not scope.active and api.current_scope() is None and api.remaining() is None
    assert scope.exited_at is not None and scope.thread_ident == threading.get_ident()


def test_absolute_deadline(api: Any, where: Any) -> None:
    def body() -> float:
        when = time.monotonic() + 0.05
        with pytest.raises(DeadlineExceeded):
            with api.thread_deadline_at(when) as scope:
                assert scope.when() == pytest.approx(when, abs=1e-6)
                spin_forever()
        return time.monotonic() - when

    assert 0 <= where(body) < LATE


def test_none_means_no_deadline(api: Any) -> None:
    with api.thread_deadline(None) as scope:
        assert scope.when() is None and scope.remaining() is None
        assert api.remaining() is None
        burn(0.01)
    assert not scope.expired()


def test_scope_is_not_reusable_or_reentrant(api: Any) -> None:
    scope = api.thread_deadline(1)
    with scope:
        with pytest.raises(RuntimeError, match="re-entrant"):
            with scope:
                pass
    with pytest.raises(RuntimeError, match="not reusable"):
        with scope:
            pass


def test_exit_in_another_thread_is_refused(api: Any) -> None:
    scope = api.thread_deadline(5)
    scope.__enter__()
    try:
        err: list[BaseException] = []

        def other() -> None:
            try:
                scope.__exit__(None, None, None)
            except RuntimeError as exc:
                err.append(exc)

        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert err and "thread that entered" in str(err[0])
    finally:
        scope.__exit__(None, None, None)


def test_shield_holds_the_interrupt_until_it_exits(api: Any, where: Any) -> None:
    def body() -> Any:
        finished_cleanup = False
        with pytest.raises(DeadlineExceeded):
            with api.thread_deadline(0.03) as scope:
                with api.shield():
                    burn(0.1)  # past the deadline, not interrupted
                    finished_cleanup = True
                spin_forever()
        return finished_cleanup, scope.elapsed()

    finished, elapsed = where(body)
    assert finished and 0.1 <= elapsed < 0.1 + LATE


def test_shield_sleep_is_not_cut(api: Any) -> None:
    with pytest.raises(DeadlineExceeded):
        with api.thread_deadline(0.02):
            t0 = time.monotonic()
            with api.shield():
                api.sleep(0.06)
                slept = time.monotonic() - t0
            spin_forever()  # the held-back interrupt lands at the shield's exit
    assert slept >= 0.06


def test_shield_outside_scope_is_harmless(api: Any) -> None:
    with api.shield():
        pass


def test_interrupt_never_reaches_another_thread(api: Any) -> None:
    stop = threading.Event()
    bystander_errors: list[BaseException] = []

    def bystander() -> None:
        try:
            while not stop.is_set():
                burn(0.001)
        except BaseException as exc:  # noqa: BLE001 - recorded, then asserted empty
            bystander_errors.append(exc)

    t = threading.Thread(target=bystander)
    t.start()
    try:
        for _ in range(5):
            with pytest.raises(DeadlineExceeded):
                with api.thread_deadline(0.02):
                    spin_forever()
    finally:
        stop.set()
        t.join()
    assert bystander_errors == []


def test_thread_pool_only_overrunning_tasks_fail(api: Any) -> None:
    # Every task gets a limit no quick task can reach on a loaded machine; an overrunning
    # one brings its own deadline near (fired by the watchdog while the others run) so the
    # test does not wait out the limit. Only a deadline can stop spin_forever().
    def task(i: int) -> int:
        with api.thread_deadline(10, label=f"task-{i}") as scope:
            if i % 5 == 0:
                scope.reschedule(time.monotonic() + 0.02)
                spin_forever()
            burn(0.001)
        return i

    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [pool.submit(task, i) for i in range(40)]
        failed = {i for i, f in enumerate(futures) if f.exception(timeout=60) is not None}
        for i, f in enumerate(futures):
            if i in failed:
                assert isinstance(f.exception(), DeadlineExceeded)
            else:
                assert f.result() == i
        # the workers are reusable afterwards
        assert list(pool.map(lambda x: x * 2, range(8))) == [x * 2 for x in range(8)]
    assert failed == {i for i in range(40) if i % 5 == 0}


def test_internal_interrupt_is_a_base_exception() -> None:
    assert issubclass(_DeadlineInterrupt, BaseException)
    assert not issubclass(_DeadlineInterrupt, Exception)
    assert issubclass(DeadlineExceeded, TimeoutError)


def test_deadline_exceeded_pickles() -> None:
    import pickle

    with pytest.raises(DeadlineExceeded) as info:
        with timeoutcore.thread_deadline(0.01, label="p"):
            spin_forever()
    clone = pickle.loads(pickle.dumps(info.value))
    assert clone.label == "p" and clone.limit == 0.01 and str(clone) == str(info.value)


def _guarded_while_loop() -> None:
    with timeoutcore.thread_deadline(0.05):
        i = 0
        while i < 10**12:  # noqa: SIM113 - CPython 3.13.0 may skip this frame's with-exit
            i += 1


def test_scope_whose_exit_was_skipped_never_fires_again() -> None:
    # cpython#130279: on 3.13.0 an exception raised at the back-edge of a `while <cond>:`
    # loop leaves the frame without running its with-exits. The core must drop such a
    # stale scope instead of raising its interrupt again into unrelated code.
    def worker() -> Any:
        outcomes = []
        for _ in range(5):
            try:
                _guarded_while_loop()
            except BaseException as exc:  # noqa: BLE001 - what escaped is the result
                outcomes.append(type(exc).__name__)
            burn(0.02)  # a stale scope would be re-raised into this
        with timeoutcore.thread_deadline(5) as scope:
            burn(0.1)
        return outcomes, scope.expired(), timeoutcore.current_scope()

    from conftest import in_thread

    outcomes, expired, left = in_thread(worker)
    allowed = {"DeadlineExceeded", "_DeadlineInterrupt"}
    if sys.version_info[:2] != (3, 13):
        allowed = {"DeadlineExceeded"}
    assert len(outcomes) == 5 and set(outcomes) <= allowed
    assert not expired and left is None


def test_checkpoint_raises_only_past_the_deadline(api: Any, where: Any) -> None:
    import timeoutcore._fallback as fb

    checkpoint = timeoutcore.checkpoint if api.name != "fallback" else fb.checkpoint

    def body() -> Any:
        checkpoint()  # unguarded: nothing
        with api.thread_deadline(5):
            checkpoint()  # in time: nothing
        with pytest.raises(DeadlineExceeded):
            with api.thread_deadline(0.02):
                with api.shield():
                    time.sleep(0.03)  # the deadline passes while shielded
                    checkpoint()  # held back inside a shield
                checkpoint()  # never reached: the shield's exit delivers it
        return True

    assert where(body)


def test_users_switch_interval_is_left_as_it_was() -> None:
    # the watchdog lowers the switch interval while a deadline is due (the fast window);
    # the user's setting must be back afterwards
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.002)
    try:
        for _ in range(5):
            with pytest.raises(DeadlineExceeded):
                with timeoutcore.thread_deadline(0.01):
                    spin_forever()
        burn(0.01)
        assert sys.getswitchinterval() == pytest.approx(0.002)
    finally:
        sys.setswitchinterval(before)


def test_enclosing_deadline_passing_in_an_inner_exit_hook_is_claimed_by_its_scope(
    api: Any,
) -> None:
    """An inner scope's exit hook runs shielded; an outer deadline passing meanwhile must
    come out as the outer scope's DeadlineExceeded, never as the raw internal interrupt."""

    class SlowExit:
        def on_enter(self, scope: Any) -> None:
            pass

        def on_exit(self, scope: Any) -> None:
            burn(0.3)

    outer = api.thread_deadline(0.15, label="outer")
    with pytest.raises(DeadlineExceeded) as info:
        with outer:
            with api.thread_deadline(5, label="inner", observer=SlowExit()):
                pass
            spin_forever()
    assert info.value.label == "outer" and outer.expired()


# --- current_deadline() -----------------------------------------------------------------------


def test_current_deadline_is_none_outside_any_scope(api: Any) -> None:
    assert api.current_deadline() is None
    with api.thread_deadline(None):
        assert api.current_deadline() is None  # a scope without a deadline
    assert api.current_deadline() is None


def test_current_deadline_is_the_scopes_absolute_deadline(api: Any) -> None:
    with api.thread_deadline(5) as scope:
        first = api.current_deadline()
        assert first is not None and first == pytest.approx(scope.when(), abs=1e-6)
        time.sleep(0.01)
        assert api.current_deadline() == first  # absolute: it does not shrink
    assert api.current_deadline() is None


def test_current_deadline_is_the_earliest_of_nested_scopes(api: Any) -> None:
    when = time.monotonic() + 5
    with api.thread_deadline_at(when):
        with api.thread_deadline(30):
            assert api.current_deadline() == pytest.approx(when, abs=1e-6)
        with api.thread_deadline(1) as inner:
            assert api.current_deadline() == pytest.approx(inner.when(), abs=1e-6)
        assert api.current_deadline() == pytest.approx(when, abs=1e-6)


def test_current_deadline_follows_reschedule(api: Any) -> None:
    with api.thread_deadline(5) as scope:
        later = time.monotonic() + 60
        scope.reschedule(later)
        assert api.current_deadline() == pytest.approx(later, abs=1e-6)
        scope.reschedule(None)
        assert api.current_deadline() is None


def test_current_deadline_is_per_thread(api: Any) -> None:
    with api.thread_deadline(5):
        assert in_thread(api.current_deadline) is None
