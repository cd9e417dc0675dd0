"""``interrupt_with(fn)``: stop a blocking C call that has a cancel API of its own.

A query blocked in libpq or SQLite is a C call that retries ``EINTR`` itself: the core's
signal cannot knock it loose. Such libraries offer a cancel meant to be called from another
thread (``sqlite3.Connection.interrupt()``, psycopg's ``conn.cancel()``). Inside
``with interrupt_with(fn):`` in a scope, when the thread's stop time comes -- its hard
deadline, a ``cancel()``/earlier ``reschedule()``, a ``soft_raise`` soft limit -- ``fn()`` is
called once on the *interrupter* thread (never the guarded one); the C call returns, and the
interrupt surfaces as usual (``DeadlineExceeded``, ``DeadlineCancelled``,
``SoftDeadlineExceeded``).

The stop time watched is the earliest of the innermost scope's ``when()``, the thread's
effective deadline at entry when an outer scope's is earlier, and the thread's pending
``soft_raise`` soft limits; ``reschedule()``/``cancel()`` wake the interrupter
(``timeoutcore._stop.listeners``) so that it re-reads them.

Exit and call never race: each guard has a lock and a state (armed, called, closed). The
interrupter calls ``fn`` only while it holds the lock and the guard is armed; leaving the
``with`` takes the lock and closes the guard, so once the exit has returned ``fn`` is never
called (an exit that comes while ``fn`` runs waits for it to return). A failing ``fn`` is
logged on logger ``timeoutcore`` and does not prevent the interrupt.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import Any, Callable, Optional

from . import _fork, _stop
from ._engine import core

__all__ = ["interrupt_with"]

_ARMED, _CALLED, _CLOSED = "armed", "called", "closed"


class _Guard:
    __slots__ = ("fn", "ident", "lock", "outer", "scope", "state")

    def __init__(self, fn: Callable[[], Any], scope: Any, outer: Optional[float]) -> None:
        self.fn = fn
        self.scope = scope
        self.outer = outer
        self.ident = threading.get_ident()
        self.lock = threading.Lock()
        self.state = _ARMED

    def stop_time(self) -> Optional[float]:
        times = [t for t in (self.scope.when(), self.outer) if t is not None]
        times += _stop.soft_times(self.ident)
        return min(times) if times else None

    def call(self) -> None:
        with self.lock:
            if self.state != _ARMED:
                return
            self.state = _CALLED
            try:
                self.fn()
            except Exception:  # noqa: BLE001 - logged; the interrupt still surfaces
                import logging

                logging.getLogger("timeoutcore").exception(
                    "interrupt_with(%r) failed for scope %r", self.fn, self.scope.label)


class _Interrupter:
    """One daemon thread that calls each guard's ``fn`` at its stop time."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._guards: set[_Guard] = set()
        self._thread: Optional[threading.Thread] = None

    def add(self, guard: _Guard) -> None:
        with self._cond:
            self._guards.add(guard)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="timeoutcore-interrupt",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()

    def remove(self, guard: _Guard) -> None:
        with self._cond:
            self._guards.discard(guard)

    def changed(self, ident: int) -> None:
        """A scope of thread ``ident`` was rescheduled or cancelled, or a soft exception
        delivered (a ``_stop`` listener)."""
        if any(g.ident == ident for g in list(self._guards)):
            with self._cond:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    due = []
                    wait: Optional[float] = None
                    for g in self._guards:
                        t = g.stop_time()
                        if t is None:
                            continue
                        if t <= now:
                            due.append(g)
                        elif wait is None or t - now < wait:
                            wait = t - now
                    if due:
                        self._guards.difference_update(due)
                        break
                    self._cond.wait(wait)
            for g in due:
                g.call()

    def _after_fork_in_child(self) -> None:
        self.__init__()  # type: ignore[misc]  # the thread did not survive the fork


_interrupter = _Interrupter()
_stop.listeners.append(_interrupter.changed)
_fork.register(_fork.FEATURE, after_in_child=_interrupter._after_fork_in_child)


class interrupt_with:  # noqa: N801 - a context manager named like the stdlib's (suppress)
    """``with interrupt_with(fn):`` -- call ``fn()`` from another thread at this thread's
    stop time, to end a blocking C call through its own cancel API.

    Inside a scope, when the stop time comes -- the hard deadline, a ``cancel()`` or an
    earlier ``reschedule()``, a ``soft_raise`` soft limit -- ``fn()`` is called once, on
    another thread (never the guarded one); the C call returns, and the interrupt surfaces
    as usual. ``fn`` is never called after the ``with`` has exited; a failing ``fn`` is
    logged on logger ``timeoutcore`` and does not prevent the interrupt. Outside a scope it
    does nothing. Nested ones are independent; each calls its own ``fn`` at most once.
    ``timeoutcore.contrib.db.guard(conn)`` picks the cancel of a database connection.
    Raises ``TypeError`` if ``fn`` is not callable."""

    __slots__ = ("_fn", "_guard")

    def __init__(self, fn: Callable[[], Any]) -> None:
        if not callable(fn):
            raise TypeError(f"interrupt_with() needs a callable, not {type(fn).__name__}")
        self._fn = fn
        self._guard: Optional[_Guard] = None

    def __enter__(self) -> interrupt_with:
        scope = core.current_scope()
        if scope is None:
            return self
        deadline = core.current_deadline()
        when = scope.when()
        outer = deadline if deadline is not None and (when is None or deadline < when) else None
        self._guard = _Guard(self._fn, scope, outer)
        _interrupter.add(self._guard)
        return self

    def __exit__(self, exc_type: Optional[type[BaseException]],
                 exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        guard, self._guard = self._guard, None
        if guard is None:
            return
        with guard.lock:
            called = guard.state == _CALLED
            guard.state = _CLOSED
        _interrupter.remove(guard)
        if called:
            # fn ended the C call with the library's own error: the stop goes on from here.
            core.checkpoint()
            _stop.deliver_due()
