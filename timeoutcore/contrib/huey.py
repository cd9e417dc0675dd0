"""Huey: task timeouts that thread workers enforce, and a revoke that stops a running task.

Needs huey 3.0 or later (task timeouts came with it). One line, in the module that
defines the Huey instance (before the consumer is made)::

    from huey import RedisHuey
    from timeoutcore.contrib.huey import install

    huey = RedisHuey("my-app")
    install(huey, patch=True)

Then, in a thread consumer (``huey_consumer app.huey -k thread -w 8``):

* ``@huey.task(timeout=5)`` and a per-call ``my_task(..., timeout=5)`` (seconds, float
  allowed) stop the task at its limit wherever it is -- ``except Exception`` in the task
  cannot keep it running -- and the task fails with huey's own ``TaskTimeout``, raised
  where huey's process workers raise it: huey logs "timed out", ``SIGNAL_TIMEOUT`` fires,
  the result holds the error, and a task with ``retries`` is retried as huey does for a
  timeout. Stock thread workers ignore ``timeout`` (their ``timeout()`` is a bare
  ``yield``; the maintainer in huey#864: "We can't put an execution timeout on tasks,
  unfortunately -- not cleanly").
* ``Result.revoke()``, ``huey.revoke_by_id(id)``, ``huey.revoke(task)`` and a task class's
  ``revoke()`` stop the matching tasks that are running (huey#635: a revoke only keeps a
  task from starting). The task ends with huey's outcome for a revoked task --
  ``SIGNAL_REVOKED``, not retried -- through huey's own path for a task that cancels
  itself (``CancelExecution(retry=False)``: :class:`TaskRevoked` here), so huey also sends
  ``SIGNAL_CANCELED``, runs post-execute hooks, and stores the error in the result: a
  caller blocked in ``Result.get(blocking=True)`` gets ``TaskException`` instead of waiting
  for a result that never comes. A revoke of a task that has not started yet behaves as
  huey has it (the task is skipped, ``SIGNAL_REVOKED``, nothing stored).
* ``patch=True``: :func:`timeoutcore.patch` in the consumer, so ``time.sleep``, socket
  reads (``requests``, ``redis``, database drivers) and ``subprocess`` waits are stopped
  too, and a child process started by the task is killed with it.

Other worker types. ``-k process``: huey's own ``SIGALRM`` timeout runs in each worker
process's main thread and already interrupts blocking calls; :func:`install` leaves it
alone (no ``patch()``, no revoke of a running task). ``-k greenlet``: huey's
``gevent.Timeout`` stays; :func:`install` does nothing either (a thread's deadline would
stop every greenlet of the hub's thread). ``huey.immediate = True``: nothing changes.

How it plugs in. huey's consumer wraps every task run in ``huey._timeout_context(task)``
(``huey/api.py``), which calls the ``timeout()`` of the consumer's worker environment --
for threads, a no-op. :func:`install` replaces the instance's ``create_consumer``; when
the consumer it makes runs thread workers, ``_timeout_context`` makes each task's
``execute`` run under a :func:`~timeoutcore.thread_deadline` whose ``with`` statement
directly encloses the task function, so no frame of this module runs between the task's
end and the scope's exit (a wrapper's ``__exit__`` inside the scope would be exposed to a
deadline that fires just as the task returns).

How the worker learns of a revoke. huey records a revoke as a key in its storage
(``r:<task id>``, or one per task class); the consumer only reads it before it runs a
task. Here one thread per consumer process -- asleep once no task has run for a second
(:data:`IDLE_AFTER`) -- asks huey
(``huey.is_revoked(task)``, the check huey itself makes before a task runs) every
``revoke_interval`` seconds (default 0.05) for each running task, and cancels the scope
of a revoked one. So any revoke counts, from any process, with or without this module
installed there, with any storage (Redis, SQLite, file), and a revoke sent between
huey's own check and the task's start is not lost: the key stays until huey deletes it
after the run. Its cost: one storage read per running task per interval, none when idle
(benchmarks/bench_huey.py measures it, and the rejected designs' per-task cost).
Rejected:

* the Redis deadline registry (``contrib.redis.DeadlineRegistry``, as ``contrib.celery``
  uses): two Redis round trips per task to publish and withdraw it -- a large share of a
  short task -- and a revoke would have to go through the registry, not huey's API;
* a pub/sub message sent by a wrapped ``revoke()``: milliseconds instead of one interval,
  but it misses revokes from processes that did not call :func:`install` (or that made
  their own Huey instance), revokes sent before the task was registered, and works with
  Redis only;
* Redis keyspace notifications: they need ``notify-keyspace-events`` set on the server,
  and huey keeps its revoke flags in the same hash as every result, so each result
  written would wake every consumer.

Bad limits: a ``timeout`` that is not a number of seconds (negative, NaN, infinite, a
string, a bool) is refused with ``ValueError``/``TypeError`` when the task is enqueued
from a process where :func:`install` ran (not a consumer). Enqueued from elsewhere, a bad
number fails the task in a thread worker with the same error; a value that is not a number
at all fails in huey's own code before the task runs, as it does without timeoutcore (huey
logs an unhandled error and stores no result). ``timeout=None`` or ``0`` is no limit, as in
huey.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from contextlib import nullcontext
from typing import Any, Callable, Optional

from huey.api import Huey, Task
from huey.consumer import ThreadEnvironment
from huey.exceptions import CancelExecution
from huey.signals import SIGNAL_REVOKED

try:
    from huey.exceptions import TaskTimeout
except ImportError:  # huey 2.x has no task timeouts
    raise ImportError("timeoutcore.contrib.huey needs huey 3.0 or later (task timeouts came "
                      "with it)") from None

from .. import _validate
from ..errors import DeadlineCancelled, DeadlineExceeded
from ..executor import NO_LIMIT
from ..scope import thread_deadline

__all__ = ["TaskRevoked", "install", "is_enforcing"]

#: Under huey's own logger, which huey_consumer configures: the consumer's log tells.
log = logging.getLogger("huey.timeoutcore")

#: The reason a revoked task's scope is cancelled with.
REVOKED = "revoked"
#: Seconds without a running task after which the revoke watcher sleeps until one starts.
IDLE_AFTER = 1.0

_INSTALLED = "_timeoutcore_huey"
_NOTHING = nullcontext()  # reusable: what _timeout_context hands huey's `with`


class TaskRevoked(CancelExecution):  # type: ignore[misc]  # huey is untyped
    """The task was revoked while it ran and stopped: huey's ``CancelExecution`` with
    ``retry=False``, so huey does not retry it and stores it as the task's error."""

    def __init__(self, msg: Optional[str] = None) -> None:
        super().__init__(msg, retry=False)


def _task_timeout(task: Any) -> Optional[float]:
    """The task's limit in seconds (huey's ``timeout``), None for none; a value that is not
    a number of seconds raises ``TypeError``/``ValueError`` naming the task."""
    value = task.timeout
    if value is None or (value == 0 and not isinstance(value, bool)):
        return None  # huey's convention: a falsy timeout is no timeout
    seconds = _validate.seconds(value, f"huey task {task.name}", "timeout")
    return seconds


class _Running:
    """The tasks running under a scope in this process, and the thread that cancels the
    revoked ones: started with the first task, it checks every ``interval`` seconds while
    tasks run and sleeps once none has run for :data:`IDLE_AFTER` seconds.

    Rule: starting a task wakes the watcher only when it sleeps. A wake-up per task (the
    first design) cost each short task a thread switch and a storage read of its own --
    more than the task's scope itself -- for nothing: a revoke of a task that has just
    started can wait for the next check like any other."""

    def __init__(self, huey: Huey, interval: Optional[float]) -> None:
        self.huey = huey
        self.interval = interval
        self.cond = threading.Condition(threading.Lock())
        self.tasks: dict[Any, Any] = {}  # scope -> task, while the task runs
        self.thread: Optional[threading.Thread] = None
        self.pid = 0
        self.sleeping = False  # the watcher waits for a task (no timeout)
        self.stopping = False
        self.failing = False  # the storage failed; logged once until it answers again
        self.start_failed = False  # the watcher could not start; logged once until it does

    def add(self, scope: Any, task: Any) -> None:
        if self.interval is None:
            return
        with self.cond:
            self.tasks[scope] = task
            if self.thread is None or self.pid != os.getpid():  # first task, or forked
                self.stopping = self.sleeping = False
                self.pid = os.getpid()
                thread = threading.Thread(target=self._watch, daemon=True,
                                          name="timeoutcore-huey-revoke")
                try:
                    thread.start()
                except RuntimeError as exc:
                    # No thread can be started now (a thread or memory limit). Rule: the
                    # task still runs, under its timeout; only revokes wait, and the next
                    # task tries again. Rejected: failing the task -- its own limit works
                    # without the watcher, and huey would retry it into the same limit.
                    if not self.start_failed:
                        self.start_failed = True
                        log.warning("cannot start the revoke watcher (%s); running tasks "
                                    "cannot be revoked until a thread can be started", exc)
                    self.thread = None  # (after a fork: the parent's) the next task retries
                    return
                if self.start_failed:
                    self.start_failed = False
                    log.info("revoke watcher started: running tasks can be revoked again")
                self.thread = thread
                _watchers.add(self)
            elif self.sleeping:
                self.sleeping = False
                self.cond.notify()

    def remove(self, scope: Any) -> None:
        if self.interval is None:
            return
        with self.cond:
            self.tasks.pop(scope, None)

    def stop(self) -> None:
        """Stop and join the watcher (atexit; a test's teardown)."""
        with self.cond:
            self.stopping = True
            self.cond.notify()
            thread, self.thread = self.thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)

    def _watch(self) -> None:
        interval = self.interval
        assert interval is not None
        busy_at = time.monotonic()
        while True:
            with self.cond:
                if self.stopping:
                    return
                if self.tasks:
                    busy_at = time.monotonic()
                elif time.monotonic() - busy_at > IDLE_AFTER:
                    self.sleeping = True
                    while self.sleeping and not self.stopping:
                        self.cond.wait()
                    continue  # a task started: check now, then every interval
                running = list(self.tasks.items())
            for scope, task in running:
                if self._revoked(task):
                    with self.cond:
                        if self.tasks.pop(scope, None) is None:
                            continue  # it ended meanwhile
                    scope.cancel(REVOKED)
            with self.cond:
                if not self.stopping:
                    self.cond.wait(interval)

    def _revoked(self, task: Any) -> bool:
        """huey's own check (task id and task class, ``revoke_until``); ``peek=False``
        consumes a ``revoke_once`` as huey does when it skips a task."""
        try:
            revoked = bool(self.huey.is_revoked(task, peek=False))
        except Exception as exc:  # noqa: BLE001 - the storage is down: try again later
            if not self.failing:
                self.failing = True
                log.warning("cannot read huey's revoke flags (%s: %s); running tasks "
                            "cannot be revoked until the storage answers", type(exc).__name__,
                            exc)
            return False
        if self.failing:
            self.failing = False
            log.info("huey's revoke flags readable again")
        return revoked


_watchers: weakref.WeakSet[_Running] = weakref.WeakSet()


@atexit.register
def _stop_watchers() -> None:
    for running in list(_watchers):
        running.stop()


class _Guard:
    """What :func:`install` puts on one Huey instance."""

    def __init__(self, huey: Huey, patch: bool, revoke_interval: Optional[float]) -> None:
        self.huey = huey
        self.patch = patch
        self.running = _Running(huey, revoke_interval)
        self.enforcing = False
        self.create_consumer: Callable[..., Any] = type(huey).create_consumer.__get__(huey)
        self.enqueue: Callable[[Any], Any] = type(huey).enqueue.__get__(huey)

    # -- the caller's side -------------------------------------------------------------

    def checked_enqueue(self, task: Any) -> Any:
        """huey's ``enqueue``, after refusing a task (or pipeline step) whose timeout is
        not a number of seconds. Groups and chords come back here for each member."""
        step = task
        while isinstance(step, Task):
            _task_timeout(step)
            step = step.on_complete
        return self.enqueue(task)

    # -- the consumer's side -----------------------------------------------------------

    def consumer(self, **options: Any) -> Any:
        """huey's ``create_consumer``; for thread workers, every task then runs guarded.

        In the consumer's process ``enqueue`` is huey's own again: the consumer re-enqueues
        retries and scheduled tasks itself, and a refusal there would drop the task (the
        scheduler logs the error and goes on) where the worker's check fails it visibly."""
        self.huey.__dict__.pop("enqueue", None)
        consumer = self.create_consumer(**options)
        environment = getattr(consumer, "environment", None)
        if not isinstance(environment, ThreadEnvironment):
            log.info("huey %s workers keep huey's own timeout: timeoutcore stays out",
                     getattr(consumer, "worker_type", "?"))
            self.enforcing = False
            self.huey.__dict__.pop("_timeout_context", None)
            return consumer
        if self.patch:
            from ..patch import patch

            patch()
        self.huey._timeout_context = self.timeout_context
        self.enforcing = True
        log.info("huey thread workers: task timeouts and revokes enforced by timeoutcore")
        return consumer

    def timeout_context(self, task: Any) -> Any:
        """huey's ``_timeout_context(task)``, called in the worker thread just before
        ``task.execute()``: make that call run guarded. A bad timeout raises here, inside
        huey's handling: the task fails with that error."""
        limit = _task_timeout(task)
        if limit is None and self.running.interval is None:
            return _NOTHING  # nothing could stop it: run it as huey would
        # the class's execute, not the instance's: a task object run twice in this
        # process (immediate mode, a test) is not guarded twice
        task.execute = _guarded(self, task, type(task).execute.__get__(task), limit)
        return _NOTHING


def _guarded(guard: _Guard, task: Any, execute: Callable[[], Any],
             limit: Optional[float]) -> Callable[[], Any]:
    def execute_guarded() -> Any:
        scope = thread_deadline(limit if limit is not None else NO_LIMIT, label=task.name)
        running = guard.running
        running.add(scope, task)
        try:
            with scope:  # no frame of this module between the scope and the task function
                return execute()
        except DeadlineCancelled as exc:
            if exc.scope is not scope:
                raise
            log.warning("Task %s was revoked while running, stopped after %.3fs.",
                        task.id, exc.elapsed)
            guard.huey._emit(SIGNAL_REVOKED, task)
            raise TaskRevoked(f"revoked while running (after {exc.elapsed:.3f}s)") from None
        except DeadlineExceeded as exc:
            if exc.scope is not scope:
                raise  # a deadline of the task's own
            raise TaskTimeout(f"timeout ({task.timeout}s)") from None
        finally:
            running.remove(scope)
            # the task holds this function, which holds the task: break the cycle, or
            # every task would wait for the cyclic garbage collector to be freed
            task.__dict__.pop("execute", None)

    return execute_guarded


def install(huey: Huey, *, patch: bool = False,
            revoke_interval: Optional[float] = 0.05) -> None:
    """Make thread consumers of ``huey`` enforce task timeouts and stop revoked running
    tasks (see the module's documentation). Call it where ``huey`` is defined, before a
    consumer is made.

    ``patch=True`` calls :func:`timeoutcore.patch` in a thread consumer, so blocking calls
    (sleep, sockets, subprocess waits) stop at the limit too. ``revoke_interval``: seconds
    between two checks of the running tasks' revoke flags (how late a revoke may be seen);
    ``None``: a revoke does not stop a running task, and tasks without a timeout run
    unguarded. Idempotent (the last call wins). Process and greenlet consumers keep huey's
    own timeout.
    """
    if not isinstance(huey, Huey):
        raise TypeError(f"install(): huey must be a huey.Huey instance, not "
                        f"{type(huey).__name__}")
    if not isinstance(patch, bool):
        raise TypeError(f"install(): patch must be True or False, not {patch!r}")
    interval = _validate.seconds(revoke_interval, "install()", "revoke_interval",
                                 allow_none=True)
    if not callable(getattr(type(huey), "_timeout_context", None)):
        raise RuntimeError("install(): this huey has no Huey._timeout_context (huey 2.x/3.x "
                           "have it); timeoutcore cannot hook its task runs")
    previous: Optional[_Guard] = huey.__dict__.get(_INSTALLED)
    if previous is not None:
        previous.running.stop()
    guard = _Guard(huey, patch, interval)
    setattr(huey, _INSTALLED, guard)
    huey.create_consumer = guard.consumer
    huey.enqueue = guard.checked_enqueue
    huey.__dict__.pop("_timeout_context", None)  # until a thread consumer is made


def is_enforcing(huey: Huey) -> bool:
    """True once a thread consumer of ``huey`` enforces its tasks' limits here."""
    guard: Optional[_Guard] = huey.__dict__.get(_INSTALLED)
    return guard is not None and guard.enforcing
