"""Every wait kind x every trigger: a patched wait ends at the scope's *current* stop time.

Triggers, on a worker thread with ``patch()`` on: the hard deadline (0.3 s), a ``soft_raise``
soft limit (0.3 s on a 4 s scope), ``cancel()`` from another thread at 0.3 s on a 4 s scope,
``reschedule()`` to an earlier time (at 0.1 s, to 0.3 s, on a 4 s scope) and to a later one
(a 1 s scope moved to 1.3 s at 0.05 s: the wait must run on past 1 s; the second between the
move and the first deadline is for a rescheduling thread that starts late on a loaded
machine). Broken, a wait runs to 4 s (or stops at 1 s for "later"); the bounds are generous
for a loaded 2-core machine, and count from when the trigger thread acted if it acted late.
Children of subprocess waits must be gone (killed and reaped) by PID.
"""

from __future__ import annotations

import os
import queue
import select
import selectors
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import pytest
from conftest import run_under_trigger

import timeoutcore

TRIGGER_AT = 0.3  # s after entry
LATER_FROM = 1.0  # s: the deadline "reschedule later" moves (well after the move at 0.05 s)
LATE = 1.3  # s: where "reschedule later" moves it
BOUND = 0.5  # s: the stop must surface within this of its trigger


@pytest.fixture(autouse=True, scope="module")
def _patched() -> Any:
    timeoutcore.patch()
    yield
    timeoutcore.unpatch()


def _pid_of(path: str) -> int:
    for _ in range(200):
        try:
            with open(path) as f:
                text = f.read().strip()
            if text:
                return int(text)
        except FileNotFoundError:
            pass
        time.sleep(0.01)
    raise AssertionError("the child never wrote its pid")


def _child_cmd(pidfile: str) -> list[str]:
    return ["sh", "-c", f"echo $$ > {pidfile}; exec sleep 10"]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


class Kind:
    """A wait that blocks for ~10 s unless stopped; ``pids`` collects children to check."""

    def __init__(self, tmp_path: Any) -> None:
        self.tmp = tmp_path
        self.pids: list[int] = []
        self.cleanup: list[Callable[[], None]] = []

    def pidfile(self) -> str:
        path = str(self.tmp / f"pid{len(self.pids)}-{time.monotonic_ns()}")
        threading.Thread(target=lambda: self.pids.append(_pid_of(path)), daemon=True).start()
        return path


def w_time_sleep(k: Kind) -> None:
    time.sleep(10)


def w_event_wait(k: Kind) -> None:
    threading.Event().wait(10)


def w_queue_get(k: Kind) -> None:
    queue.Queue().get(timeout=10)


def w_thread_join(k: Kind) -> None:
    stop = threading.Event()
    k.cleanup.append(stop.set)
    t = threading.Thread(target=stop.wait, args=(10,))
    t.start()
    t.join()


def _socketpair(k: Kind) -> socket.socket:
    a, b = socket.socketpair()
    k.cleanup += [a.close, b.close]
    return a


def w_socket_recv(k: Kind) -> None:
    _socketpair(k).recv(10)


def w_select(k: Kind) -> None:
    select.select([_socketpair(k)], [], [], 10)


def w_poll(k: Kind) -> None:
    p = select.poll()
    p.register(_socketpair(k), select.POLLIN)
    p.poll(10_000)


def w_selector(k: Kind) -> None:
    with selectors.DefaultSelector() as sel:
        sel.register(_socketpair(k), selectors.EVENT_READ)
        sel.select(10)


def w_wait_readable(k: Kind) -> None:
    timeoutcore.wait_readable(_socketpair(k), 10)


def w_subprocess_run(k: Kind) -> None:
    subprocess.run(_child_cmd(k.pidfile()))


def w_popen_wait(k: Kind) -> None:
    subprocess.Popen(_child_cmd(k.pidfile())).wait()


def w_communicate(k: Kind) -> None:
    proc = subprocess.Popen(_child_cmd(k.pidfile()), stdout=subprocess.PIPE)
    proc.communicate()


def w_run(k: Kind) -> None:
    timeoutcore.run(_child_cmd(k.pidfile()), limit=10)


KINDS = [w_time_sleep, w_event_wait, w_queue_get, w_thread_join, w_socket_recv, w_select,
         w_poll, w_selector, w_wait_readable, w_subprocess_run, w_popen_wait, w_communicate,
         w_run]
TRIGGERS = ["hard", "soft", "cancel", "earlier", "later"]


def _guarded(trigger: str, wait: Callable[[Kind], None], k: Kind) -> tuple[str, float, float]:
    """Run ``wait`` under the trigger on this (worker) thread: (outcome, elapsed, when the
    stop was due: TRIGGER_AT or LATE, or when a late trigger thread acted)."""
    at = LATER_FROM if trigger == "later" else TRIGGER_AT
    return run_under_trigger(trigger, lambda: wait(k), at, later=LATE)


@pytest.mark.parametrize("trigger", TRIGGERS)
@pytest.mark.parametrize("wait", KINDS, ids=lambda f: f.__name__[2:])
def test_wait_ends_at_the_trigger(wait: Callable[[Kind], None], trigger: str,
                                  tmp_path: Any) -> None:
    k = Kind(tmp_path)
    try:
        with ThreadPoolExecutor(1) as pool:
            outcome, elapsed, due = pool.submit(_guarded, trigger, wait, k).result()
    finally:
        for fn in k.cleanup:
            fn()
    want = {"hard": "hard", "soft": "soft", "cancel": "cancelled", "earlier": "hard",
            "later": "hard"}[trigger]
    assert outcome == want, (outcome, elapsed)
    assert due - 0.05 <= elapsed < due + BOUND, (elapsed, due)
    for pid in k.pids:
        assert _gone(pid), f"child {pid} outlived the wait"
