"""DeadlineExecutor: per-task limits, exactly the overrunning tasks fail, the pool lives on."""

from __future__ import annotations

import time

import pytest
from conftest import burn, spin_forever

import timeoutcore
from timeoutcore import DeadlineExceeded, DeadlineExecutor, DeadlinePolicy


def task(i: int, limits: str = "the task's own keyword") -> tuple[int, str]:
    if i % 7 == 0:
        spin_forever()
    burn(0.001)
    return i, limits


def task_under_policy(i: int, limits: str = "the task's own keyword") -> tuple[int, str]:
    """``task`` run under the pool's policy of 10 s, which no quick task reaches on a loaded
    machine: an overrunning one brings the deadline of that policy's scope near (fired by
    the watchdog while the other tasks run), so the test does not wait out the limit."""
    scope = timeoutcore.current_scope()
    assert scope is not None and scope.limit == 10  # the pool's policy
    if i % 7 == 0:
        scope.reschedule(time.monotonic() + 0.02)
    return task(i, limits)


def test_hundred_tasks_exactly_the_overrunning_ones_fail() -> None:
    with DeadlineExecutor(8, policy=10) as pool:
        futures = [pool.submit(task_under_policy, i, limits="mine") for i in range(100)]
        failed = {i for i, f in enumerate(futures) if f.exception(timeout=60) is not None}
        assert failed == {i for i in range(100) if i % 7 == 0}
        assert all(isinstance(futures[i].exception(), DeadlineExceeded) for i in failed)
        assert futures[1].result() == (1, "mine")  # no collision with the task's kwargs
        # the pool still serves new tasks
        assert pool.submit(task_under_policy, 3).result() == (3, "the task's own keyword")


def test_submit_with_per_task_limits() -> None:
    with DeadlineExecutor(2) as pool:  # no default policy
        slow = pool.submit_with(0.02, task, 7)
        policy = pool.submit_with(DeadlinePolicy(hard=0.02, label="x"), task, 14)
        mapping = pool.submit_with({"hard": 5}, task, 1)
        with pytest.raises(DeadlineExceeded):
            slow.result()
        with pytest.raises(DeadlineExceeded) as info:
            policy.result()
        assert info.value.label == "x" and mapping.result() == (1, "the task's own keyword")
        with pytest.raises(TypeError, match="limits"):
            pool.submit_with("fast", task, 1)


def test_map_with_per_item_limits() -> None:
    with DeadlineExecutor(4) as pool:
        assert list(pool.map(lambda x: x + 1, range(4), limits=[1, 1, 1, 1])) == [1, 2, 3, 4]
        results = pool.map(task, [1, 7], limits=[1, 0.02])
        assert next(results) == (1, "the task's own keyword")
        with pytest.raises(DeadlineExceeded):
            next(results)


def test_shutdown_is_not_blocked_beyond_the_hard_limit() -> None:
    pool = DeadlineExecutor(2, policy=0.2)
    futures = [pool.submit(spin_forever) for _ in range(2)]
    t0 = time.monotonic()
    pool.shutdown(wait=True)
    assert time.monotonic() - t0 < 0.2 + 0.5
    assert all(isinstance(f.exception(), DeadlineExceeded) for f in futures)
