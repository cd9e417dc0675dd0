"""Stop every running block of the process: ``cancel_all()`` and a SIGTERM handler.

For a worker that runs jobs in threads (a ``DeadlineExecutor``, a plain thread pool, a
consumer loop): at shutdown the jobs get a grace period, then every block still running is
cancelled -- interrupted wherever it is, its exit raises ``DeadlineCancelled`` -- and, with
:func:`timeoutcore.patch`, the processes it started are killed with their process groups
and sessions and reaped (``timeoutcore._patch_subprocess``).

>>> import timeoutcore
>>> timeoutcore.patch()
>>> stopper = timeoutcore.handle_sigterm(grace=5.0)   # in the main thread
>>> # ... run jobs under thread_deadline(...) in threads; on SIGTERM, stop taking new ones
>>> # (stopper.requested is set), running ones get 5 s, then are cancelled, then the
>>> # main thread gets SystemExit(143).
"""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType
from typing import Any, Optional

from . import _validate
from ._engine import core
from ._safe_raise import raise_when_safe

__all__ = ["ShutdownHandler", "active_scopes", "cancel_all", "cancel_soon", "handle_sigterm"]

#: Exit status of a process stopped by SIGTERM (128 + 15), what ``SystemExit`` carries.
SIGTERM_EXIT = 128 + signal.SIGTERM
_POLL = 0.01  # s: how often the shutdown thread looks whether the blocks have ended


def active_scopes() -> list[Any]:
    """The outermost active scope of every thread of the process (a snapshot)."""
    return [stack[0] for stack in core.scope_stacks(True)]


def cancel_all(reason: Optional[str] = None) -> list[Any]:
    """Cancel every block running in the process, in every thread: each thread's outermost
    active scope is cancelled (``scope.cancel(reason)``), so the whole block stops and its
    exit raises :class:`~timeoutcore.DeadlineCancelled` with ``reason``; inner scopes let
    the interrupt through. Returns the scopes it cancelled (those that had not expired
    already). Callable from any thread, a signal handler included (the calling thread's own
    block is cancelled through :func:`cancel_soon`: it never raises here); blocks entered
    after the call are not affected.

    A block stops at its next bytecode, or in a wait that ends at the thread's stop time
    (``timeoutcore.sleep``, the waits of ``patch()``). A scope without a deadline
    (``thread_deadline(None)``) gives its waits no stop time, so a ``time.sleep`` in it
    runs to its end first: give such blocks a far limit instead (``DeadlineExecutor`` and
    ``contrib.celery`` do, ``executor.NO_LIMIT``)."""
    if reason is not None and not isinstance(reason, str):
        raise TypeError(f"cancel_all(): reason must be a str or None, not {type(reason).__name__}")
    cancelled = []
    for scope in active_scopes():
        if scope.expired():
            continue
        cancel_soon(scope, reason)
        cancelled.append(scope)
    return cancelled


def cancel_soon(scope: Any, reason: Optional[str] = None) -> None:
    """``scope.cancel(reason)``, which never raises here: in the scope's own thread
    ``cancel()`` raises at once -- inside a signal handler that would be in the middle of
    whatever the handler interrupted, protected code included -- so there the cancel is
    made from a helper thread, and the interrupt reaches the block through safe delivery:
    at the thread's next line outside protected code -- possibly in the rest of the
    calling handler, unless that is protected (``@timeoutcore.protected``)."""
    if scope.thread_ident == threading.get_ident():
        threading.Thread(target=scope.cancel, args=(reason,), daemon=True,
                         name="timeoutcore-cancel").start()
    else:
        scope.cancel(reason)


def _kill_children_of(scopes: list[Any]) -> None:
    from ._patch_subprocess import kill_children

    for scope in scopes:
        try:
            kill_children(scope)
        except Exception:  # noqa: BLE001 - logged; the shutdown goes on
            import logging

            logging.getLogger("timeoutcore").exception("killing the children of %r", scope)


class ShutdownHandler:
    """What :func:`handle_sigterm` installed: its state, and :meth:`uninstall`.

    ``requested`` is set at the first signal: stop taking new work. ``cancelled`` lists the
    scopes the handler cancelled once the grace period was over; ``done`` is set when the
    handler has finished (blocks ended or cancelled, children killed)."""

    def __init__(self, grace: float, signals: tuple[int, ...], exit_code: Optional[int],
                 reason: str) -> None:
        self.grace = grace
        self.signals = signals
        self.exit_code = exit_code
        self.reason = reason
        self.requested = threading.Event()
        self.done = threading.Event()
        self.cancelled: list[Any] = []
        self._now = threading.Event()  # a repeated signal: cancel without waiting more
        self._previous: dict[int, Any] = {}
        self._exit_pending = False
        self._wake = threading.Event()  # the first signal, or uninstall()
        self._stopped = False
        # Started now, not in the handler: Thread.start() takes threading's own lock, which
        # the interrupted main thread may hold.
        self._thread = threading.Thread(target=self._run, name="timeoutcore-shutdown",
                                        daemon=True)
        self._thread.start()

    def _on_signal(self, signum: int, frame: Optional[FrameType]) -> None:
        if self._exit_pending:  # the shutdown thread has finished: leave now
            self._exit_pending = False
            # not inside protected code (a Condition.wait waking up: _safe_raise)
            raise_when_safe(frame, SystemExit(self.exit_code))
            return
        if self.requested.is_set():
            self._now.set()  # the signal again: the grace period is over
            return
        self.requested.set()
        self._wake.set()

    def _run(self) -> None:
        self._wake.wait()
        if self._stopped:
            return
        end = time.monotonic() + self.grace
        while active_scopes() and not self._now.is_set():
            left = end - time.monotonic()
            if left <= 0:
                break
            self._now.wait(min(_POLL, left))
        self.cancelled = cancel_all(self.reason)
        # The blocks stop at their next bytecode or wait; one stuck in C code does not.
        # Its children go now, from here, rather than at its exit.
        end = time.monotonic() + 1.0
        while any(s.active for s in self.cancelled) and time.monotonic() < end:
            time.sleep(_POLL)
        _kill_children_of([s for s in self.cancelled if s.active])
        main = threading.main_thread()
        if self.exit_code is not None and main.is_alive() and main.ident is not None:
            # A real signal: it ends a wait the main thread is in. Sent before `done` is
            # set, so that a main thread waiting for `done` meets it in that wait, which
            # then raises it (_safe_raise); set first, the main thread could run on past
            # the wait and meet the exit anywhere after it.
            self._exit_pending = True
            signal.pthread_kill(main.ident, self.signals[0])
        self.done.set()

    def uninstall(self) -> None:
        """Put back the handlers that were there before (main thread only); before a
        signal came, this also ends the handler's thread."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
        if not self.requested.is_set():
            self._stopped = True
            self._wake.set()
            self._thread.join()


def handle_sigterm(grace: float = 5.0, *, signals: tuple[int, ...] = (signal.SIGTERM,),
                   exit_code: Optional[int] = SIGTERM_EXIT,
                   reason: str = "shutdown: SIGTERM") -> ShutdownHandler:
    """Install a handler for SIGTERM (or ``signals``) that shuts a threaded worker down:

    1. at the first signal, ``requested`` is set (the worker stops taking new work; the
       running blocks go on);
    2. when every block has ended, or ``grace`` seconds later, every block still running
       is cancelled (:func:`cancel_all` with ``reason``), and the scope-owned processes of
       those that do not stop within a second are killed and reaped from here;
    3. with ``exit_code`` (default 143), ``SystemExit(exit_code)`` is raised in the main
       thread -- where it is, or, if that is inside protected code (a wait in
       ``threading``, say), as soon as it is out of it; ``None`` leaves the exit to the
       program.

    The same signal again skips what is left of the grace period. Call it from the main
    thread (a CPython rule for signal handlers). Returns the :class:`ShutdownHandler`."""
    grace = _validate.seconds(grace, "handle_sigterm()", "grace", allow_zero=True)
    if not isinstance(signals, tuple) or not signals or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in signals):
        raise TypeError("handle_sigterm(): signals must be a non-empty tuple of signal numbers")
    if exit_code is not None and (isinstance(exit_code, bool) or not isinstance(exit_code, int)):
        raise TypeError("handle_sigterm(): exit_code must be an int or None")
    if not isinstance(reason, str):
        raise TypeError("handle_sigterm(): reason must be a str")
    for signum in signals:
        signal.Signals(signum)  # ValueError for a number that is no signal
    if threading.current_thread() is not threading.main_thread():
        raise ValueError("handle_sigterm() must be called from the main thread")
    handler = ShutdownHandler(grace, signals, exit_code, reason)
    for signum in signals:
        handler._previous[signum] = signal.signal(signum, handler._on_signal)
    return handler
