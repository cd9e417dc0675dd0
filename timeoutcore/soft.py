"""Soft limits: a warning (and optionally a catchable exception) before the hard one.

One daemon thread, the *soft timer*, keeps a heap of pending soft deadlines. It is not the
thread that enforces hard limits (that is the core's watchdog), and it does not run user
callbacks itself either: ``on_soft`` callbacks run on a small callback pool, so a slow
callback can delay neither a hard limit nor another scope's soft limit.

At a scope's soft limit, if the block is still running:

* a WARNING is logged on logger ``timeoutcore`` (label, thread, elapsed, limits);
* ``on_soft(scope)`` is called exactly once;
* with ``soft_raise=True``, ``SoftDeadlineExceeded`` (or the Exception subclass given as
  ``soft_raise``) is raised inside the block (the core
  raises it atomically with respect to the block's exit, and takes back an undelivered one
  at exit, so it never lands after the block).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional

from . import _fork, _stop
from ._status import thread_name

log = logging.getLogger("timeoutcore")

OnSoft = Callable[[Any], Any]
#: s: the soft timer's first and longest wait before it looks at a scope again (a soft
#: exception the core refused while shielded, a block not entered yet): _next_delay
_RETRY_FIRST = 0.0005
_RETRY_MAX = 0.02
#: s: how long a scope registered by its enter hook may take to be entered before the soft
#: timer stops looking (an entry that failed after the hook never comes)
_ENTERING_MAX = 5.0


class _SoftTimer:
    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, Any]] = []
        self._seq = itertools.count()
        self._thread: Optional[threading.Thread] = None
        self._pool: Optional[ThreadPoolExecutor] = None

    def register(self, scope: Any, when: float) -> None:
        entry = (when, next(self._seq), scope)
        with self._cond:
            heapq.heappush(self._heap, entry)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="timeoutcore-soft", daemon=True
                )
                self._thread.start()
            if self._heap[0] is entry:  # only an earlier wake-up needs the timer thread
                self._cond.notify()

    def _callbacks(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(2, thread_name_prefix="timeoutcore-on-soft")
        return self._pool

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    if self._heap and self._heap[0][0] <= now:
                        _, _, scope = heapq.heappop(self._heap)
                        break
                    self._cond.wait(self._heap[0][0] - now if self._heap else None)
            if not scope.active and scope.exited_at is None:
                # Rule: the enter hook registers a block before the scope stamps its entry;
                # a soft limit due before then (the first hook imports this module and
                # starts this thread) finds it not yet active. Not active yet is not ended:
                # look again shortly, else that block never gets its soft limit. (Free-
                # threaded, the entry's stamp and its state may be seen apart: only an
                # exit stamp says a block has ended.)
                self._entering(scope)
                continue
            if scope.active and not scope.expired():
                due = scope.entered_at + scope._soft
                if not getattr(scope, "_soft_fired", False) and due > time.monotonic():
                    # registered in the enter hook, a moment before the scope stamped its
                    # entry (the first one imports this module): never fire early
                    self.register(scope, due)
                    continue
                if getattr(scope, "_soft_fired", False):
                    self._deliver(scope)  # a retry: the block was shielded
                else:
                    self._fire(scope)

    def _entering(self, scope: Any) -> None:
        """Look at a block that is being entered again in a moment (_next_delay), for at
        most _ENTERING_MAX seconds."""
        now = time.monotonic()
        since, delay = getattr(scope, "_soft_entering", (now, None))
        if now - since < _ENTERING_MAX:
            delay = _next_delay(delay)
            scope._soft_entering = (since, delay)
            self.register(scope, now + delay)

    def _deliver(self, scope: Any) -> None:
        """Raise the soft exception in the block and wake its waits; while the block is
        shielded the core refuses, so try again shortly (_next_delay): a shielded section
        holds the soft limit back as it holds the hard one."""
        if _stop.deliver_soft(scope):
            return
        delay = _next_delay(getattr(scope, "_soft_retry", None))
        scope._soft_retry = delay
        self.register(scope, time.monotonic() + delay)

    def _fire(self, scope: Any) -> None:
        scope._soft_fired = True
        # The hard limit as it stands now: reschedule() moves it, and the limit the scope
        # was created with would then be wrong.
        when = scope.when()
        log.warning(
            "soft limit passed: label=%r thread=%s elapsed=%.3fs soft=%ss hard=%s",
            scope.label,
            thread_name(scope.thread_ident),
            scope.elapsed(),
            scope._soft,
            "none" if when is None else f"{when - scope.entered_at:.3f}s",
        )
        if scope._soft_raise:
            self._deliver(scope)
        callback: Optional[OnSoft] = scope._on_soft
        if callback is not None:
            self._callbacks().submit(_call_on_soft, callback, scope)

    def _after_fork_in_child(self) -> None:
        self.__init__()  # type: ignore[misc]  # the threads did not survive the fork


def _next_delay(previous: Optional[float]) -> float:
    """The soft timer's next look at a scope it must look at again: 0.5 ms, then doubling
    up to 20 ms."""
    return _RETRY_FIRST if previous is None else min(2 * previous, _RETRY_MAX)


def _call_on_soft(callback: OnSoft, scope: Any) -> None:
    try:
        callback(scope)
    except Exception:  # noqa: BLE001 - a failing callback is reported, nothing else
        log.exception("on_soft callback %r failed for scope %r", callback, scope.label)


timer = _SoftTimer()
_fork.register(_fork.FEATURE, after_in_child=timer._after_fork_in_child)
