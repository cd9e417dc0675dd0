"""The loop-side deadlines of contrib.asgi: many tasks, one timer handle.

Pure asyncio, no server: the behaviour DeadlineMiddleware relies on -- a task is cancelled
at its deadline and its owner can tell that cancel from anybody else's; an ended entry is
never cancelled; a task with a thread call in flight is held until the call returns or the
grace ends.
"""

from __future__ import annotations

import asyncio
from typing import Optional

import pytest

from timeoutcore.contrib._loop_deadlines import Entry, LoopDeadlines

pytestmark = pytest.mark.once  # pure asyncio: nothing interpreter-dependent in the core


async def _guarded(deadlines: LoopDeadlines, after: float, work: float,
                   entries: Optional[list[Entry]] = None) -> str:
    """What the middleware does: 'expired' when the deadline stopped the work."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    entry = deadlines.add(loop.time() + after, task)
    if entries is not None:
        entries.append(entry)
    try:
        await asyncio.sleep(work)
    except asyncio.CancelledError:
        if deadlines.settle(entry):
            return "expired"
        raise
    deadlines.settle(entry)
    return "done"


def test_each_task_is_cancelled_at_its_own_deadline_in_any_order() -> None:
    async def main() -> list[str]:
        deadlines = LoopDeadlines(asyncio.get_running_loop(), grace=1.0)
        return list(await asyncio.gather(
            _guarded(deadlines, 0.2, 0.05), _guarded(deadlines, 0.05, 5),
            _guarded(deadlines, 5, 0.1), _guarded(deadlines, 0.1, 5)))

    assert asyncio.run(asyncio.wait_for(main(), 10)) == ["done", "expired", "done", "expired"]


def test_ended_entries_are_never_cancelled_and_the_heap_stays_small() -> None:
    async def main() -> int:
        deadlines = LoopDeadlines(asyncio.get_running_loop(), grace=1.0)
        results = [await _guarded(deadlines, 0.01 + i * 1e-4, 0) for i in range(2000)]
        assert results == ["done"] * 2000
        await asyncio.sleep(0.3)  # every deadline has passed: nothing may fire
        return len(deadlines._heap)

    assert asyncio.run(main()) < 200


def test_another_cancel_is_not_taken_for_the_deadline() -> None:
    async def main() -> None:
        deadlines = LoopDeadlines(asyncio.get_running_loop(), grace=1.0)
        task = asyncio.ensure_future(_guarded(deadlines, 0.1, 5))
        await asyncio.sleep(0.02)
        task.cancel()  # before the deadline: the caller's own cancel
        with pytest.raises(asyncio.CancelledError):
            await task

        async def both() -> None:
            me = asyncio.current_task()
            assert me is not None
            asyncio.get_running_loop().call_later(0.1, me.cancel)  # also at the deadline
            await _guarded(deadlines, 0.1, 5)

        with pytest.raises(asyncio.CancelledError):
            await both()

    asyncio.run(asyncio.wait_for(main(), 10))


def test_the_owner_takes_its_cancel_back() -> None:
    async def main() -> int:
        deadlines = LoopDeadlines(asyncio.get_running_loop(), grace=1.0)
        assert await _guarded(deadlines, 0.05, 5) == "expired"
        me = asyncio.current_task()
        assert me is not None
        await asyncio.sleep(0.01)  # no cancel left pending for the task
        return me.cancelling()

    assert asyncio.run(main()) == 0


def test_a_busy_task_is_held_until_its_call_returns() -> None:
    async def main() -> tuple[str, float]:
        loop = asyncio.get_running_loop()
        deadlines = LoopDeadlines(loop, grace=5.0)
        entries: list[Entry] = []
        task = asyncio.ensure_future(_guarded(deadlines, 0.05, 10, entries))
        await asyncio.sleep(0)
        entries[0].busy += 1  # a thread call in flight
        await asyncio.sleep(0.2)  # past the deadline: held
        assert not task.done() and entries[0].overdue
        t0 = loop.time()
        entries[0].busy -= 1  # the call returned (not stopped by the deadline)
        deadlines.release(entries[0])
        result = await task
        return result, loop.time() - t0

    result, took = asyncio.run(asyncio.wait_for(main(), 10))
    assert result == "expired" and took < 1.0


def test_a_busy_task_is_cancelled_at_the_end_of_the_grace() -> None:
    async def main() -> tuple[str, float]:
        loop = asyncio.get_running_loop()
        deadlines = LoopDeadlines(loop, grace=0.2)
        entries: list[Entry] = []
        t0 = loop.time()
        task = asyncio.ensure_future(_guarded(deadlines, 0.05, 10, entries))
        await asyncio.sleep(0)
        entries[0].busy += 1  # a call that never returns
        return await task, loop.time() - t0

    result, took = asyncio.run(asyncio.wait_for(main(), 10))
    assert result == "expired" and 0.25 <= took < 5.0
