"""The pytest backend's last resort: one watcher thread that ends the process for a test
that its deadline could not stop.

A deadline stops Python code and the waits ``patch()`` covers; a C call that never returns
(and never lets the interrupt surface) keeps the test running past it. For such a test the
backend arms an *escalation* here at ``deadline + grace``; the timer is disarmed when
pytest-timeout cancels the test's timer. If it is still armed when due, its action runs on
this watcher thread -- the backend passes pytest-timeout's own ``timeout_timer`` (stack
dump, then ``os._exit(1)``), so a run never hangs.

One thread for the whole session, started at the first arm and joined by :meth:`close`
(the plugin's ``pytest_unconfigure``), rather than a ``threading.Timer`` per test as
pytest-timeout's thread method starts: a thread start per test costs more than the test's
whole deadline bookkeeping.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Hashable, Optional

__all__ = ["Escalation"]


class Escalation:
    """Deadlines on a watcher thread: ``arm(key, when, action)`` runs ``action()`` on that
    thread at ``when`` (a ``time.monotonic()`` value) unless ``disarm(key)`` came first."""

    def __init__(self, name: str = "timeoutcore pytest escalation") -> None:
        self._name = name
        self._cond = threading.Condition(threading.Lock())
        self._due: dict[Hashable, tuple[float, Callable[[], None]]] = {}
        self._thread: Optional[threading.Thread] = None
        self._closed = False

    @property
    def thread(self) -> Optional[threading.Thread]:
        """The watcher thread, or None before the first :meth:`arm` and after :meth:`close`."""
        return self._thread

    def armed(self) -> int:
        """How many escalations are armed now."""
        with self._cond:
            return len(self._due)

    def arm(self, key: Hashable, when: float, action: Callable[[], None]) -> None:
        """Run ``action()`` on the watcher thread at ``when`` unless ``key`` is disarmed
        first. Arming a key again replaces its time and action."""
        if not callable(action):
            raise TypeError(f"arm(): action must be callable, not {type(action).__name__}")
        with self._cond:
            if self._closed:
                raise RuntimeError("arm() on a closed Escalation")
            self._due[key] = (when, action)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()

    def disarm(self, key: Hashable) -> bool:
        """Forget ``key``'s escalation; True if it was armed (its action has not run)."""
        with self._cond:
            return self._due.pop(key, None) is not None

    def close(self) -> None:
        """Stop and join the watcher thread; the armed escalations are dropped. Idempotent."""
        with self._cond:
            self._closed = True
            self._due.clear()
            self._cond.notify()
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                if not self._due:
                    self._cond.wait()
                    continue
                key, (when, action) = min(self._due.items(), key=lambda kv: kv[1][0])
                delay = when - time.monotonic()
                if delay > 0:
                    self._cond.wait(delay)
                    continue
                del self._due[key]
            action()  # outside the lock: pytest-timeout's action never returns
