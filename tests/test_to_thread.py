"""asyncio and anyio cancels that stop the thread: the loop's DeadlineExecutor,
timeoutcore.to_thread and contrib.anyio.run_sync."""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
import time
from typing import Any

import pytest
from pydantic import ValidationError

import timeoutcore
from timeoutcore import DeadlineExceeded, DeadlineExecutor, to_thread
from timeoutcore import aio as tc_aio

anyio = pytest.importorskip("anyio")
from timeoutcore.contrib import anyio as tc_anyio  # noqa: E402

def _backends() -> list[str]:
    try:
        import trio  # noqa: F401
    except ImportError:
        return ["asyncio"]
    return ["asyncio", "trio"]


class Blocked:
    """A call that blocks in ``Queue.get`` and records, in its finally block, that its
    thread left it."""

    def __init__(self) -> None:
        self.q: queue.Queue[int] = queue.Queue()
        self.started = threading.Event()
        self.left = threading.Event()

    def __call__(self) -> int:
        self.started.set()
        try:
            return self.q.get()
        finally:
            self.left.set()


async def _once_started(call: Blocked, stop: Any) -> None:
    """Call ``stop()`` once ``call`` runs in its thread (a cancel that comes while the call
    still waits for a thread is a different case: the call then never starts)."""
    while not call.started.is_set():
        await anyio.sleep(0.002)
    stop()


async def _timed_out_to_thread(call: Blocked) -> None:
    """``asyncio.timeout`` around ``to_thread(call)``, expiring once the call runs."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(None) as timeout:
        expire = asyncio.ensure_future(_once_started(call, lambda: timeout.reschedule(
            loop.time())))
        try:
            await to_thread(call)
        finally:
            expire.cancel()


def test_a_thousand_timed_out_to_thread_calls_leave_no_thread_blocked(patched_for_test: None) -> None:
    """asyncio.to_thread(q.get) under asyncio.timeout, with a 4-thread DeadlineExecutor as
    the loop's default: every round's thread is stopped, so the pool never fills up with
    blocked getters (the stock executor is left with every worker stuck in q.get)."""
    q: queue.Queue[int] = queue.Queue()

    async def main() -> list[int]:
        asyncio.get_running_loop().set_default_executor(DeadlineExecutor(4))
        timeouts = 0
        for _ in range(1000):
            try:
                async with asyncio.timeout(0.001):
                    await asyncio.to_thread(q.get)
            except TimeoutError:
                timeouts += 1
        assert timeouts == 1000
        # No stale getter is left to steal these: each comes back to the call that asked.
        for i in range(8):
            q.put(i)
        return [await asyncio.wait_for(asyncio.to_thread(q.get), 30) for _ in range(8)]

    assert asyncio.run(main()) == list(range(8))
    assert q.empty()


def test_cancel_returns_once_the_thread_has_left(patched_for_test: None) -> None:
    call = Blocked()

    async def main() -> None:
        with pytest.raises(TimeoutError):
            await _timed_out_to_thread(call)
        assert call.left.is_set()  # the thread was out before the caller went on

    asyncio.run(main())
    assert call.started.is_set()


def test_task_cancel_and_a_failing_task_group_stop_the_thread(patched_for_test: None) -> None:
    first, second = Blocked(), Blocked()

    async def fail_soon() -> None:
        await asyncio.to_thread(second.started.wait, 30)
        raise ValueError("sibling failed")

    async def main() -> None:
        asyncio.get_running_loop().set_default_executor(DeadlineExecutor(2))
        task = asyncio.ensure_future(to_thread(first))
        await asyncio.to_thread(first.started.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert first.left.is_set()
        with pytest.raises(ExceptionGroup) as info:
            async with asyncio.TaskGroup() as group:
                group.create_task(asyncio.to_thread(second))  # plain asyncio.to_thread
                group.create_task(fail_soon())
        assert info.group_contains(ValueError)
        await asyncio.to_thread(second.left.wait, 30)
        assert second.left.is_set()

    asyncio.run(main())


def test_a_per_call_limit_the_context_and_the_result() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var")

    def work(a: int, b: int = 0) -> tuple[int, str]:
        return a + b, var.get()

    async def main() -> None:
        var.set("from the caller")
        assert await to_thread(work, 1, b=2) == (3, "from the caller")
        assert await to_thread(work, 1, b=2, limit=5) == (3, "from the caller")
        t0 = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            await to_thread(time.sleep, 60, limit=0.05)
        assert time.monotonic() - t0 < 10

    timeoutcore.patch()
    try:
        asyncio.run(main())
    finally:
        timeoutcore.unpatch()


def test_bad_limits_are_refused_before_anything_runs() -> None:
    ran: list[int] = []

    async def main() -> None:
        with pytest.raises(TypeError, match="limits must be seconds"):
            await to_thread(ran.append, 1, limit="soon")
        with pytest.raises(ValidationError):
            await to_thread(ran.append, 1, limit=-1)
        with pytest.raises(TypeError, match="limits must be seconds"):
            await tc_anyio.run_sync(ran.append, 1, limit="soon")

    asyncio.run(main())
    assert ran == []


def test_the_loop_gets_a_deadline_executor_that_asyncio_run_shuts_down() -> None:
    before = set(threading.enumerate())

    async def main() -> Any:
        assert await to_thread(lambda: 5) == 5
        return tc_aio.loop_executor()

    executor = asyncio.run(main())
    assert isinstance(executor, DeadlineExecutor)
    end = time.monotonic() + 10
    while set(threading.enumerate()) - before and time.monotonic() < end:
        time.sleep(0.01)
    assert not set(threading.enumerate()) - before  # asyncio.run shut its threads down


def test_a_loop_with_another_default_executor_keeps_it(patched_for_test: None) -> None:
    from concurrent.futures import ThreadPoolExecutor

    call = Blocked()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        plain = ThreadPoolExecutor(1)
        loop.set_default_executor(plain)
        with pytest.raises(TimeoutError):
            await _timed_out_to_thread(call)
        assert call.left.is_set()
        assert getattr(loop, "_default_executor") is plain
        assert tc_aio.loop_executor(loop) is not plain

    asyncio.run(main())


@pytest.mark.parametrize("backend", _backends())
def test_anyio_cancel_stops_the_thread_before_the_token_comes_back(backend: str,
                                                                   patched_for_test: None) -> None:
    async def main() -> None:
        limiter = anyio.CapacityLimiter(1)
        for _ in range(20):
            call = Blocked()
            async with anyio.create_task_group() as group:
                with anyio.CancelScope() as scope:
                    group.start_soon(_once_started, call, scope.cancel)
                    await tc_anyio.run_sync(call, limiter=limiter)
            assert scope.cancelled_caught
            assert call.left.is_set() and limiter.borrowed_tokens == 0
        # fail_after: anyio's TimeoutError; the one token is free for the next call.
        with pytest.raises(TimeoutError):
            with anyio.fail_after(0.02):
                await tc_anyio.run_sync(Blocked(), limiter=limiter)
        assert await tc_anyio.run_sync(lambda a: a * 2, 21, limiter=limiter) == 42
        with pytest.raises(DeadlineExceeded):
            await tc_anyio.run_sync(time.sleep, 60, limit=0.05)
        with pytest.raises(ZeroDivisionError):
            await tc_anyio.run_sync(lambda: 1 // 0)

    anyio.run(main, backend=backend)


@pytest.mark.parametrize("backend", _backends())
def test_anyio_token_stays_taken_while_a_thread_cannot_be_stopped(
        backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A call that no interrupt reaches for a while (a shielded section here, as C code that
    holds the GIL would be): the caller's cancellation goes on after STOP_WAIT, and the
    limiter's token stays taken until the thread has really left."""
    monkeypatch.setattr(tc_anyio, "STOP_WAIT", 0.05)
    call = Blocked()  # only its started/left events: the body below is its own
    release = threading.Event()

    def stubborn() -> None:
        with timeoutcore.shield():  # the interrupt waits for the shield's end
            call.started.set()
            release.wait(60)
            call.left.set()

    async def main() -> None:
        limiter = anyio.CapacityLimiter(1)
        async with anyio.create_task_group() as group:
            with anyio.CancelScope() as scope:
                group.start_soon(_once_started, call, scope.cancel)
                await tc_anyio.run_sync(stubborn, limiter=limiter)
        assert scope.cancelled_caught and not call.left.is_set()
        assert limiter.borrowed_tokens == 1  # the thread still works
        release.set()
        with anyio.fail_after(30):
            while limiter.borrowed_tokens:
                await anyio.sleep(0.01)
        assert call.left.is_set()

    anyio.run(main, backend=backend)
