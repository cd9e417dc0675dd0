"""DeadlineFuture.cancel(): cancel means stop, for a task that is already running.

The standard future's cancel() returns False once the task runs and the worker thread stays
busy to the task's end; a DeadlineExecutor's stops the task in its thread, ends the future
cancelled at once, and frees the worker for the next task.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import queue
import random
import socket
import sys
import threading
import time
from typing import Any, Callable

import pytest
from conftest import spin_forever

from timeoutcore import DeadlineExecutor


def _silent_peer() -> tuple[socket.socket, socket.socket]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = socket.create_connection(listener.getsockname())
    return listener, client


def _blockers() -> dict[str, Callable[[], Any]]:
    q: queue.Queue[int] = queue.Queue()
    return {
        "cpu": spin_forever,
        "sleep": lambda: time.sleep(60),
        "queue": q.get,
        "event": threading.Event().wait,
    }


@pytest.mark.parametrize("kind", ["cpu", "sleep", "queue", "event", "socket"])
def test_cancel_stops_a_running_task_and_frees_its_worker(kind: str, patched_for_test: None) -> None:
    started = threading.Event()
    left: list[BaseException] = []
    peer = _silent_peer() if kind == "socket" else None
    block = (lambda: peer[1].recv(10)) if peer else _blockers()[kind]

    def task() -> None:
        started.set()
        try:
            block()
        except BaseException as exc:
            left.append(exc)
            raise

    try:
        with DeadlineExecutor(1) as pool:
            future = pool.submit(task)
            assert started.wait(10)
            t0 = time.monotonic()
            assert future.cancel() is True
            assert future.cancelled() and future.done()
            with pytest.raises(cf.CancelledError):
                future.result()
            assert future.wait_stopped(10)
            assert time.monotonic() - t0 < 5.0  # the task was stopped, not run to its end
            assert len(left) == 1 and isinstance(left[0], BaseException)
            # The one worker takes the next task.
            assert pool.submit(lambda: 7).result(10) == 7
            assert future.cancel() is True  # cancelling again: still cancelled
    finally:
        if peer:
            for s in peer:
                s.close()


def test_wait_and_as_completed_see_a_cancelled_running_task(patched_for_test: None) -> None:
    with DeadlineExecutor(2) as pool:
        started = threading.Barrier(3)

        def task() -> None:
            started.wait(10)
            time.sleep(60)

        futures = [pool.submit(task) for _ in range(2)]
        started.wait(10)
        waiter = threading.Thread(target=lambda: cf.wait(futures, timeout=30))
        waiter.start()
        for f in futures:
            assert f.cancel()
        waiter.join(30)
        assert not waiter.is_alive()
        done, not_done = cf.wait(futures, timeout=5)
        assert done == set(futures) and not not_done
        assert set(cf.as_completed(futures, timeout=5)) == set(futures)


def test_a_finished_task_keeps_its_result_and_a_queued_one_never_runs() -> None:
    ran: list[int] = []
    gate = threading.Event()
    with DeadlineExecutor(1) as pool:
        first = pool.submit(gate.wait, 30)
        queued = pool.submit(ran.append, 1)
        assert queued.cancel() is True and queued.cancelled()
        gate.set()
        assert first.result(10) is True
        assert first.cancel() is False and not first.cancelled()
        assert first.result() is True
        assert queued.wait_stopped(10)
    assert ran == []


def test_shutdown_cancel_futures_ends_queued_futures() -> None:
    gate = threading.Event()
    pool = DeadlineExecutor(1)
    running = pool.submit(gate.wait, 30)
    queued = [pool.submit(int) for _ in range(3)]
    pool.shutdown(wait=False, cancel_futures=True)
    gate.set()
    assert running.result(10) is True
    done, not_done = cf.wait(queued, timeout=10)
    assert not not_done and all(f.cancelled() for f in queued)
    pool.shutdown(wait=True)


def test_except_exception_in_the_task_cannot_swallow_the_cancel(patched_for_test: None) -> None:
    caught: list[Exception] = []
    started = threading.Event()

    def task() -> None:
        started.set()
        try:
            time.sleep(60)
        except Exception as exc:  # what task code often does
            caught.append(exc)
        time.sleep(60)

    with DeadlineExecutor(1) as pool:
        future = pool.submit(task)
        assert started.wait(10)
        assert future.cancel()
        assert future.wait_stopped(10)
    assert caught == []


def test_map_closed_early_stops_the_running_items(patched_for_test: None) -> None:
    with DeadlineExecutor(2) as pool:
        results = pool.map(time.sleep, [0, 60, 60])
        assert next(results) is None
        t0 = time.monotonic()
        results.close()  # cancels the rest: the two sleeps are stopped
        assert pool.submit(lambda: 1).result(10) == 1
        pool.shutdown(wait=True)
        assert time.monotonic() - t0 < 10


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.parametrize("switch", [None, 200e-6], ids=["default-switch", "switch-200us"])
def test_cancels_racing_completion_never_leak_an_interrupt(switch: Any, patched_for_test: None) -> None:
    """Cancels land at random moments around the end of short tasks. Each future ends
    either with its result or cancelled; an interrupt that leaked out of a task's scope
    would show as a DeadlineCancelled in a later, uncancelled task (or in the pool's own
    loop, which logs and loses the thread)."""
    handler = _Records()
    logging.getLogger("concurrent.futures").addHandler(handler)
    rng = random.Random(37)
    outcomes = {"result": 0, "cancelled": 0}
    interval = sys.getswitchinterval()
    if switch is not None:
        sys.setswitchinterval(switch)
    try:
        with DeadlineExecutor(4) as pool:
            for i in range(600):
                work = rng.choice([0.0, 0.0005, 0.002, 0.006])
                future = pool.submit(_busy, work, i)
                time.sleep(rng.choice([0.0, 0.0005, 0.002, 0.005]))
                cancelled = future.cancel()
                assert future.wait_stopped(10)
                if cancelled:
                    assert future.cancelled()
                    outcomes["cancelled"] += 1
                else:
                    assert future.result(10) == i  # never a stray DeadlineCancelled
                    outcomes["result"] += 1
            # Each worker runs a last task long enough for a late interrupt to land.
            tail = [pool.submit(_busy, 0.02, -1) for _ in range(8)]
            assert [f.result(30) for f in tail] == [-1] * 8
    finally:
        sys.setswitchinterval(interval)
        logging.getLogger("concurrent.futures").removeHandler(handler)
    assert not handler.records, [r.getMessage() for r in handler.records]
    assert outcomes["result"] > 50 and outcomes["cancelled"] > 50, outcomes


def test_a_cancel_racing_a_task_s_start_always_stops_it(patched_for_test: None) -> None:
    """cancel() while a worker takes the task: the task is queued or running, never
    finished (a get on an empty queue), so every cancel() returns True and stops it, and
    no getter is left to take an item put later. Before, a task the worker took between
    cancel()'s look at its state and the standard Future.cancel() was left running."""
    q: queue.Queue[int] = queue.Queue()
    rng = random.Random(43)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # many more hand-overs of the GIL inside the window
    try:
        with DeadlineExecutor(2) as pool:
            try:
                for _ in range(1500):
                    future = pool.submit(q.get)
                    if rng.random() < 0.5:
                        time.sleep(0)  # let the worker take it, or be taking it
                    assert future.cancel()  # broken: False, and the getter runs on
                    assert future.wait_stopped(10)
                for i in range(4):
                    q.put(i)
                assert [pool.submit(q.get).result(10) for _ in range(4)] == [0, 1, 2, 3]
            finally:
                for _ in range(2):
                    q.put(-1)  # a getter left running by a failed cancel: free its worker
    finally:
        sys.setswitchinterval(interval)


def _busy(seconds: float, value: int) -> int:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
    return value
