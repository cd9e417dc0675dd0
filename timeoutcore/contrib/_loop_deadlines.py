"""Deadlines for many asyncio tasks on one loop, served by a single timer handle.

What ``asyncio.timeout`` does for one task -- at the deadline ``task.cancel()``, and the
owner tells that cancel apart from anybody else's through ``task.uncancel()`` -- done for
every request a server runs: one heap of deadlines and at most one ``TimerHandle`` armed
for the earliest live one. A request that ends just drops its task from its entry; the
timer skips such entries and the heap is compacted once they are the majority.

Rejected: an ``asyncio.timeout`` per request -- each one schedules and cancels its own
``TimerHandle``, whose cancelled handles pile up in the loop's heap until it rebuilds it,
and that was the largest single cost ``contrib.asgi`` added to a fast request. Rejected:
a deque in arrival order -- per-route limits make deadlines arrive out of order.

Held back while a thread works for the task (``Entry.busy``): a request's thread calls run
under the request's own deadline in their thread, so at that deadline the thread stops by
itself, and anyio's await -- shielded from anyio's cancels, not from ``task.cancel()`` --
returns once the thread is free, which is when its limiter token must come back. A
cancel at that moment would end the await at once and give the token back while the
thread still runs. So a due entry that is busy is marked ``overdue`` and kept for ``grace``
seconds more; the task is cancelled when its last thread call returns without having been
stopped by the deadline (:meth:`release`), or at the end of the grace (a thread no
interrupt reaches, e.g. in C code holding the GIL).

Rule: every method runs on the loop's thread (the middleware's coroutine, the carrier's
await, the timer's callback), so no lock is needed; an entry is popped from the heap only
by :meth:`_fire`. Rule: the task is never cancelled from inside itself -- on 3.11/3.12
``uncancel()`` does not clear a cancel requested while the task runs, which would then
surface at its next await after the owner had handled the deadline -- so :meth:`release`
schedules the cancel with ``call_soon``.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from typing import Optional

#: Compact the heap when at least this many of its entries have ended and they are the
#: majority (a smaller heap is not worth the rebuild).
_COMPACT_MIN = 64


class Entry:
    """One task's deadline. ``expired``: the timer cancelled the task."""

    __slots__ = ("task", "cancelling", "expired", "busy", "overdue")

    def __init__(self, task: asyncio.Task[object]) -> None:
        self.task: Optional[asyncio.Task[object]] = task  # None once ended or expired
        self.cancelling = task.cancelling()  # cancel requests the task had before
        self.expired = False
        self.busy = 0  # thread calls of the task in flight
        self.overdue = False  # due while busy: cancel once they return


class LoopDeadlines:
    """The deadlines of one loop's tasks (see the module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, grace: float) -> None:
        self.loop = loop
        self.grace = grace  # how long a busy entry's cancel waits for its threads
        self._heap: list[tuple[float, int, Entry]] = []
        self._seq = itertools.count()
        self._ended = 0  # entries in the heap whose task is None
        self._handle: Optional[asyncio.TimerHandle] = None
        self._armed_for = math.inf  # the loop time self._handle fires at

    def add(self, when: float, task: asyncio.Task[object]) -> Entry:
        """Cancel ``task`` at loop time ``when`` unless :meth:`end` comes first."""
        entry = Entry(task)
        heapq.heappush(self._heap, (when, next(self._seq), entry))
        if when < self._armed_for:
            self._arm(when)
        return entry

    def end(self, entry: Entry) -> None:
        """The task no longer needs its deadline (its request ended, or its response is
        complete). Idempotent; a no-op once the timer has expired it."""
        if entry.task is None:
            return
        entry.task = None
        self._ended += 1
        if self._ended >= _COMPACT_MIN and 2 * self._ended > len(self._heap):
            self._heap = [item for item in self._heap if item[2].task is not None]
            heapq.heapify(self._heap)
            self._ended = 0

    def release(self, entry: Entry) -> None:
        """A thread call of the entry's task has returned (``busy`` already decremented):
        cancel the task soon if it is overdue and no call is left."""
        if not entry.busy and entry.overdue and entry.task is not None:
            self.loop.call_soon(self._expire_live, entry)

    def settle(self, entry: Entry) -> bool:
        """For the task itself, once the guarded code has ended: True if its deadline
        cancelled it and no other cancel is pending (then the ``CancelledError`` it got is
        the deadline's, and this owner handles it); False otherwise. Consumes the
        deadline's cancel request, as ``asyncio.timeout`` does on exit."""
        self.end(entry)
        if not entry.expired:
            return False
        entry.expired = False
        task = asyncio.current_task()
        assert task is not None
        return task.uncancel() <= entry.cancelling

    def _arm(self, when: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self.loop.call_at(when, self._fire)
        self._armed_for = when

    def _expire_live(self, entry: Entry) -> None:
        """Cancel the entry's task now, unless it has ended (the entry stays in the heap,
        counted as ended)."""
        if entry.task is not None:
            self._ended += 1
            self._expire(entry)

    @staticmethod
    def _expire(entry: Entry) -> None:
        task = entry.task
        assert task is not None
        entry.task = None
        entry.expired = True
        task.cancel()

    def _fire(self) -> None:
        self._handle = None
        self._armed_for = math.inf
        now = self.loop.time()
        heap = self._heap
        held: list[Entry] = []
        while heap and (heap[0][0] <= now or heap[0][2].task is None):
            _, _, entry = heapq.heappop(heap)
            if entry.task is None:
                self._ended -= 1
            elif entry.busy and not entry.overdue:
                entry.overdue = True
                held.append(entry)
            else:
                self._expire(entry)
        for entry in held:  # pushed after the loop: a grace of 0 is due at once
            heapq.heappush(heap, (now + self.grace, next(self._seq), entry))
        if heap:
            self._arm(heap[0][0])
