"""timeoutcore.blocking: deadline-aware waits, in worker threads (the case CPython cannot
interrupt before 3.15) and outside any scope (plain waits)."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any, Optional

import pytest
from conftest import LATE, expect_deadline, in_thread

import timeoutcore
from timeoutcore import DeadlineExceeded, thread_deadline
from timeoutcore.blocking import (
    __all__ as blocking_all,
    acquire,
    bounded_wait,
    socket_timeout,
    wait_readable,
    wait_writable,
)

LIMIT = 0.05


@pytest.fixture
def full_pipe() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        for _ in range(10**6):
            os.write(w, b"x" * 65536)
    except BlockingIOError:
        pass
    yield r, w
    os.close(r)
    os.close(w)


def test_public_names() -> None:
    assert sorted(blocking_all) == [
        "acquire", "bounded_wait", "socket_timeout", "wait_readable", "wait_writable"]


# --- in a scope, in a worker thread: ended at the deadline ---------------------------------


def test_wait_readable_ends_at_the_deadline(pipe: tuple[int, int]) -> None:
    expect_deadline(lambda: wait_readable(pipe[0]))


def test_wait_readable_with_a_longer_timeout_ends_at_the_deadline(pipe: Any) -> None:
    expect_deadline(lambda: wait_readable(pipe[0], 5.0))


def test_wait_writable_ends_at_the_deadline(full_pipe: tuple[int, int]) -> None:
    expect_deadline(lambda: wait_writable(full_pipe[1]))


def test_wait_readable_on_a_socket_object() -> None:
    a, b = socket.socketpair()
    with a, b:
        expect_deadline(lambda: wait_readable(a))


def test_acquire_ends_at_the_deadline() -> None:
    lock = threading.Lock()
    lock.acquire()
    expect_deadline(lambda: acquire(lock))
    expect_deadline(lambda: acquire(lock, timeout=5.0))
    lock.release()


def test_bounded_wait_with_any_wait() -> None:
    event = threading.Event()

    def step(t: Optional[float]) -> tuple[bool, bool]:
        got = event.wait(t)
        return got, got

    expect_deadline(lambda: bounded_wait(step, None))


def test_socket_timeout_then_checkpoint() -> None:
    """The documented recipe for code that drives a socket itself."""
    a, b = socket.socketpair()

    def work() -> None:
        a.settimeout(socket_timeout(None))
        try:
            a.recv(1)
        except socket.timeout:
            timeoutcore.checkpoint()
        raise AssertionError("checkpoint() did not raise")

    with a, b:
        expect_deadline(work)


# --- in a scope, but ready or with a shorter own timeout: like the plain wait ---------------


def test_ready_before_the_deadline_returns_true(pipe: tuple[int, int]) -> None:
    def body() -> Any:
        threading.Timer(0.02, os.write, args=(pipe[1], b"x")).start()
        with thread_deadline(1.0):
            return wait_readable(pipe[0])

    assert in_thread(body) is True


def test_own_shorter_timeout_returns_false(pipe: tuple[int, int]) -> None:
    def body() -> Any:
        t0 = time.monotonic()
        with thread_deadline(1.0) as scope:
            ready = wait_readable(pipe[0], 0.05)
        return ready, time.monotonic() - t0, scope

    ready, took, scope = in_thread(body)
    assert ready is False and not scope.expired()
    assert 0.05 <= took < 0.05 + LATE


def test_acquire_returns_when_the_lock_is_free() -> None:
    lock = threading.Lock()

    def body() -> Any:
        with thread_deadline(1.0):
            return acquire(lock), acquire(lock, blocking=False), acquire(lock, timeout=0.01)

    assert in_thread(body) == (True, False, False)


def test_socket_timeout_values() -> None:
    assert socket_timeout(None) is None
    assert socket_timeout(0.0) == 0.0
    assert socket_timeout(2.5) == 2.5

    def body() -> Any:
        with thread_deadline(30.0) as scope:
            # each bracketed by the scope's remaining time just before and just after
            def bracket(sock_timeout: Any) -> Any:
                before = scope.remaining()
                got = socket_timeout(sock_timeout)
                return before, got, scope.remaining()

            return bracket(None), socket_timeout(0.0), socket_timeout(0.1), bracket(60.0)

    blocking_, nonblocking, shorter, longer = in_thread(body)
    assert blocking_[2] <= blocking_[1] <= blocking_[0] <= 30.0
    assert nonblocking == 0.0 and shorter == 0.1
    assert longer[2] <= longer[1] <= longer[0] <= 30.0


def test_shield_lets_the_wait_run_to_its_own_timeout(pipe: tuple[int, int]) -> None:
    def body() -> Any:
        t0 = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            with thread_deadline(0.03):
                with timeoutcore.shield():
                    ready = wait_readable(pipe[0], 0.15)
                    took = time.monotonic() - t0
        return ready, took

    ready, took = in_thread(body)
    assert ready is False
    assert 0.15 <= took < 0.15 + LATE


# --- outside any scope: plain waits --------------------------------------------------------


def test_outside_a_scope_plain_waits(pipe: tuple[int, int]) -> None:
    t0 = time.monotonic()
    assert wait_readable(pipe[0], 0.05) is False
    assert 0.05 <= time.monotonic() - t0 < 0.05 + LATE
    assert wait_writable(pipe[1], 0) is True
    os.write(pipe[1], b"x")
    assert wait_readable(pipe[0], 0) is True
    lock = threading.Lock()
    assert acquire(lock) is True and acquire(lock, timeout=0.01) is False

    def step(t: Optional[float]) -> tuple[bool, Any]:
        return False, t

    assert bounded_wait(step, 1.5) == 1.5
    assert bounded_wait(step, None) is None


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("x",), TypeError),
        ((-1,), ValueError),
        ((None,), TypeError),
        ((0, -1.0), ValueError),
        ((0, float("nan")), ValueError),
        ((0, "1"), TypeError),
        ((0, True), TypeError),
    ],
)
def test_bad_arguments(args: tuple[Any, ...], error: type[Exception]) -> None:
    with pytest.raises(error):
        wait_readable(*args)
    with pytest.raises(error):
        wait_writable(*args)
