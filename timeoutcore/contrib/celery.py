"""Celery: time limits enforced by timeoutcore in every pool, and no process left behind.

One line::

    from timeoutcore.contrib.celery import install
    install(app, patch=True, reap=True, shutdown_grace=1.0)

adds a worker bootstep. Every task body then runs under a
:func:`~timeoutcore.thread_deadline` built from the limits Celery itself resolved for that
task (``apply_async(time_limit=, soft_time_limit=)``, the task's
``time_limit``/``soft_time_limit``, else the app's ``task_time_limit``/
``task_soft_time_limit``), with Celery's semantics:

* at the soft limit ``celery.exceptions.SoftTimeLimitExceeded`` is raised inside the task,
  which may catch it and clean up;
* at the hard limit the task is stopped wherever it is (``except Exception`` cannot keep
  it running) and fails with ``celery.exceptions.TimeLimitExceeded``: the result backend
  stores the failure, ``task-failed`` is sent, ``task_failure``/``on_failure``/errbacks run;
  the worker logs "Hard time limit (...) exceeded";
* the worker thread -- under prefork, the pool child -- survives and takes the next task.

Per pool:

* ``threads`` and ``solo``, which accept the limits and ignore them: enforced here. And
  ``revoke(terminate=True)`` and a cold shutdown, for which these pools raise
  ``NotImplementedError`` (and the threads pool then hangs), stop the task through its
  scope: REVOKED (or, for a cold shutdown, what Celery records: RETRY), never a hang.
* ``prefork``: the limits are enforced inside the pool child, a little before Celery's
  own kill from the parent (which stays as the backstop), so the task's processes are
  killed and reaped and the child lives on (``timeoutcore.contrib._celery_child``).
* any other pool (``gevent``, ``eventlet``, custom): the bootstep does nothing.

Options:

* ``patch=True``: :func:`timeoutcore.patch` in the worker (or pool child): ``time.sleep``,
  socket reads, ``subprocess`` waits stop at the limit, and a child process started inside
  a task is killed with its process group and session when the task is stopped.
* ``reap=True``: the process that runs the tasks (the pool child, or the worker for
  threads/solo) becomes a child subreaper, and after each task -- for the threads pool,
  each time no task is running -- and at its exit, every descendant it has is killed and
  reaped: ``setsid()`` escapes, daemons and zombies included. Off by default: it also kills
  the daemons a task meant to leave.
* ``shutdown_grace=seconds``: on a warm shutdown (SIGTERM), the running tasks get that long,
  then are cancelled like a revoke (REVOKED, their processes killed). ``None`` (default):
  Celery's own behaviour, which waits for them without end.
* ``registry=DeadlineRegistry(...)``: every task is published in Redis under its task id
  while it runs: a coordinator can list it, extend its hard limit, or cancel it.

What it guards: the task body (``run``), from the moment it starts; like prefork's, the limit
starts when a pool thread or child picks the task up, not when it was received.
"""

from __future__ import annotations

import functools
import logging
import os
import signal as _signal
import threading
import time
from typing import Any, Callable, Optional

from celery import bootsteps, signals
from celery.concurrency.prefork import TaskPool as PreforkPool
from celery.concurrency.solo import TaskPool as SoloPool
from celery.concurrency.thread import TaskPool as ThreadPool
from celery.exceptions import Ignore, Reject, SoftTimeLimitExceeded, TimeLimitExceeded

from .. import _validate
from ..errors import DeadlineCancelled, DeadlineExceeded
from ..executor import NO_LIMIT
from ..scope import checkpoint, thread_deadline
from . import _celery_child

__all__ = ["TimeLimitStep", "install", "is_enforcing"]

log = logging.getLogger("timeoutcore.celery")
worker_log = logging.getLogger("celery.worker.request")  # where Celery logs its own limits

#: Reasons a task's scope is cancelled for; Celery announces the first two itself.
TERMINATED = "revoked: terminated"
COLD_SHUTDOWN = "worker cold shutdown"
SHUTDOWN = _celery_child.SHUTDOWN_REASON
_ANNOUNCED_BY_CELERY = (TERMINATED, COLD_SHUTDOWN)

_WRAPPED = "__timeoutcore_guarded__"


class _Limits:
    """The limits the pool was asked to enforce for one task, handed to its thread."""

    __slots__ = ("hard", "soft", "timeout_callback", "options")

    def __init__(self, hard: Optional[float], soft: Optional[float],
                 timeout_callback: Optional[Callable[[bool, float], Any]],
                 options: _Options) -> None:
        self.hard = hard
        self.soft = soft
        self.timeout_callback = timeout_callback
        self.options = options


class _Options:
    """What ``install()`` was given, as the worker (or pool child) uses it."""

    def __init__(self, registry: Any, reap: bool, prefork_child: bool,
                 default_hard: Optional[float] = None,
                 default_soft: Optional[float] = None) -> None:
        self.registry = registry
        self.reap = reap
        self.prefork_child = prefork_child
        # the pool's own limits (app conf or `celery worker --time-limit/--soft-time-limit`),
        # read in the parent before the children fork
        self.default_hard = default_hard
        self.default_soft = default_soft


class _Running:
    """The scopes of the tasks running in this process, by task id (the threads and solo
    pools' cancel paths reach a task through them)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.scopes: dict[str, Any] = {}
        # cancels that came before the task's scope existed (a revoke between Celery's
        # accept and the body's start): reason by task id
        self.early: dict[str, str] = {}

    def add(self, task_id: Optional[str], scope: Any) -> bool:
        """Register the task's scope (before it is entered); a cancel that came early is
        applied to it now. True then: the caller stops the task at entry."""
        if not task_id:
            return False
        with self.lock:
            self.scopes[task_id] = scope
            reason = self.early.pop(task_id, None)
        if reason is None:
            return False
        scope.cancel(reason)
        return True

    def cancel(self, task_id: str, reason: str) -> Any:
        """The scope of a running task, or None after noting an early cancel for it."""
        with self.lock:
            scope = self.scopes.get(task_id)
            if scope is None:
                self.early[task_id] = reason
            return scope

    def reap_if_idle(self, kill: Callable[[], Any]) -> None:
        """Run ``kill()`` if no task is running, holding the lock so that none starts
        meanwhile (and so none starts a process the kill would take for a leftover)."""
        with self.lock:
            if not self.scopes:
                kill()

    def remove(self, task_id: Optional[str], scope: Any) -> int:
        """Forget the task; returns how many tasks still run."""
        with self.lock:
            if task_id and self.scopes.get(task_id) is scope:
                del self.scopes[task_id]
            return len(self.scopes)

    def all(self) -> list[Any]:
        with self.lock:
            return list(self.scopes.values())


running = _Running()
_pending = threading.local()


def _with_limits(target: Callable[..., Any], limits: _Limits, *args: Any, **kwargs: Any) -> Any:
    """Runs in the pool thread: make the limits visible to the task body, run Celery's
    tracer (which calls the body), and never let them outlive this task."""
    _pending.limits = limits
    try:
        return target(*args, **kwargs)
    finally:
        _pending.limits = None


def _limit_option(value: Any) -> Optional[float]:
    """A limit as Celery hands it to the pool (``timeout``/``soft_timeout``), in Celery's
    convention: ``None``, ``False`` or a value <= 0 is "no limit". Not a validation: the
    scope checks the number (timeoutcore._validate) when the task runs."""
    if value is None or value is False:
        return None
    seconds = float(value)
    return seconds if seconds > 0 else None


def _resolve(hard: Optional[float], soft: Optional[float]) -> tuple[Optional[float],
                                                                     Optional[float]]:
    if soft is not None and hard is not None and soft >= hard:
        soft = None  # as in prefork: the hard limit comes first, the soft one never fires
    return hard, soft


def _wrap_pool(pool: Any, options: _Options) -> None:
    """threads/solo: every task runs under a scope (one without limits too, so that a
    revoke or a shutdown can stop it), with the limits Celery gave the pool."""
    original = pool.on_apply
    default_hard = _limit_option(pool.options.get("timeout"))
    default_soft = _limit_option(pool.options.get("soft_timeout"))

    def on_apply(target: Callable[..., Any], args: Any = None, kwargs: Any = None,
                 callback: Any = None, accept_callback: Any = None, **opts: Any) -> Any:
        hard, soft = _resolve(_limit_option(opts.get("timeout")) or default_hard,
                              _limit_option(opts.get("soft_timeout")) or default_soft)
        limits = _Limits(hard, soft, opts.get("timeout_callback"), options)
        target = functools.partial(_with_limits, target, limits)
        return original(target, args, kwargs, callback, accept_callback, **opts)

    pool.on_apply = on_apply
    pool.terminate_job = _terminate_job


def _child_limits(task: Any, options: _Options) -> _Limits:
    """prefork child: the limits the parent enforces for this task, as Celery resolves
    them (call-time ``timelimit``, the task's, the app's)."""
    timelimit = getattr(task.request, "timelimit", None) or (None, None)
    conf = task.app.conf
    hard = (_limit_option(timelimit[0]) or _limit_option(task.time_limit)
            or options.default_hard or _limit_option(conf.task_time_limit))
    soft = (_limit_option(timelimit[1]) or _limit_option(task.soft_time_limit)
            or options.default_soft or _limit_option(conf.task_soft_time_limit))
    hard, soft = _resolve(hard, soft)
    return _Limits(hard, soft, None, options)


def _guard_task(task: Any, child_options: Optional[_Options] = None) -> None:
    """Make ``task.run`` (what Celery's tracer calls) run under the task's limits:
    those the pool handed over (threads/solo), or, in a prefork child (``child_options``),
    those read from the request."""
    run = getattr(task.run, "__wrapped_run__", task.run)

    @functools.wraps(run)
    def guarded_run(*args: Any, **kwargs: Any) -> Any:
        if child_options is not None:
            if getattr(_pending, "inside", False):  # a task called from a task
                return run(*args, **kwargs)
            return _run_limited(task, run, _child_limits(task, child_options), args, kwargs)
        limits: Optional[_Limits] = getattr(_pending, "limits", None)
        if limits is None:
            return run(*args, **kwargs)
        _pending.limits = None  # a task called synchronously from this one runs unguarded
        return _run_limited(task, run, limits, args, kwargs)

    setattr(guarded_run, _WRAPPED, True)
    guarded_run.__wrapped_run__ = run  # type: ignore[attr-defined]
    task.run = guarded_run


def _run_limited(task: Any, run: Callable[..., Any], limits: _Limits,
                 args: Any, kwargs: Any) -> Any:
    options = limits.options
    extras: dict[str, Any] = {"label": task.name}
    if limits.soft is not None:
        extras.update(soft_limit=limits.soft, soft_raise=SoftTimeLimitExceeded)
        if limits.timeout_callback is not None:
            extras["on_soft"] = functools.partial(_soft_passed, limits)
    hard = limits.hard if limits.hard is not None else NO_LIMIT
    if options.prefork_child and limits.hard is not None:
        hard = limits.hard - _celery_child.hard_margin(limits.hard)  # before Celery's kill
        if limits.soft is not None and limits.soft >= hard:
            extras["soft_limit"] = hard * 0.95  # still before the (earlier) hard limit
    task_id = getattr(task.request, "id", None)
    if options.registry is not None and task_id and limits.hard is not None:
        # only tasks with a hard limit: it bounds the key's life in Redis
        extras = options.registry.scope_options(task_id, **extras)
    scope = thread_deadline(hard, **extras)
    revoked_early = running.add(task_id, scope)
    _pending.inside = True
    previous = _celery_child.begin(scope) if options.prefork_child else None
    try:
        with scope:  # no frame of this package between it and the body (protected code)
            if revoked_early:
                checkpoint()  # the body never starts, on either engine (executor.py)
            return run(*args, **kwargs)
    except DeadlineCancelled as exc:
        if exc.scope is not scope:
            raise
        if exc.reason == COLD_SHUTDOWN and task.acks_late:
            # Celery left the message unacknowledged for the broker to redeliver; Ignore
            # would acknowledge it (the task would be lost)
            raise Reject(requeue=True) from None
        if exc.reason not in _ANNOUNCED_BY_CELERY:
            _revoked(task, task_id, exc.reason or _CANCELLED)
        raise Ignore() from None  # the state is REVOKED (or Celery's own); nothing stored
    except DeadlineExceeded as exc:
        if exc.scope is not scope:
            raise  # a deadline of the task's own
        worker_log.error("Hard time limit (%ss) exceeded for %s[%s]", limits.hard, task.name,
                         task_id)
        raise TimeLimitExceeded(limits.hard) from None
    finally:
        _pending.inside = False
        if options.prefork_child:
            _celery_child.end(previous)
        left = running.remove(task_id, scope)
        if options.reap:
            _reap_after(scope, left, options.prefork_child)


def _reap_after(scope: Any, others_running: int, prefork_child: bool) -> None:
    """``reap``: the task's own processes go at once. In a prefork child every other
    descendant too; in the worker (threads/solo) those outside its own session -- the
    sessions the task's processes got, daemons that ``setsid()`` -- once no task runs
    (another task's processes are not ours to kill; the worker's own helpers, such as an
    embedded beat, are in its session). Never raises: the task's result stands."""
    from .._patch_subprocess import kill_children
    from .._process_tree import kill_descendants

    try:
        kill_children(scope)
        if prefork_child:
            kill_descendants()
        elif not others_running:
            running.reap_if_idle(lambda: kill_descendants(other_sessions=True))
    except Exception:  # noqa: BLE001 - logged; never the task's outcome
        log.exception("reaping the processes of a task failed")


_CANCELLED = "cancelled through the deadline registry"


def _revoked(task: Any, task_id: Optional[str], reason: str) -> None:
    """What Celery does for ``revoke(terminate=True)``: REVOKED in the result backend,
    a ``task-revoked`` event, the ``task_revoked`` signal."""
    worker_log.warning("Task %s[%s] %s", task.name, task_id, reason)
    request = task.request
    task.backend.mark_as_revoked(task_id, reason, request=request,
                                 store_result=task.store_errors_even_if_ignored
                                 or not task.ignore_result)
    try:
        task.send_event("task-revoked", terminated=True, signum=None, expired=False)
    except Exception:  # noqa: BLE001 - monitoring must not change the task's outcome
        log.exception("task-revoked event for %s[%s] not sent", task.name, task_id)
    signals.task_revoked.send(sender=task, request=request, terminated=True, signum=None,
                              expired=False)


def _soft_passed(limits: _Limits, scope: Any) -> None:
    """on_soft: Celery's own soft-timeout handler (it logs the warning)."""
    callback = limits.timeout_callback
    if callback is not None and limits.soft is not None:
        callback(True, limits.soft)


# --- threads/solo: Celery's cancel paths, mapped to the task's scope -------------------------

_target = threading.local()  # the request whose terminate()/cancel() is running


def _terminate_job(pid: Any, signal: Any = None) -> None:
    """The pool's ``terminate_job`` (threads/solo have none): Celery calls it from
    ``Request.terminate`` (revoke) and ``Request.cancel`` (cold shutdown) with the worker's
    pid, the same for every task; the request itself comes from the wrappers below."""
    request, reason = getattr(_target, "request", None), getattr(_target, "reason", None)
    if request is None:
        return
    scope = running.cancel(request.id, reason or TERMINATED)
    if scope is None:
        return  # accepted, body not started yet: it stops at entry (_Running.add)
    if scope.thread_ident != threading.get_ident():
        scope.cancel(reason or TERMINATED)
        return
    # solo: Celery's shutdown handler runs inside the task itself, and still has work to do
    # (the RETRY record, over a socket that patch() makes a stop point): the task is
    # cancelled from another thread once the handler has returned.
    threading.Thread(target=_cancel_after_handlers, args=(scope, reason or TERMINATED),
                     daemon=True, name="timeoutcore-celery-cancel").start()


class _Handlers:
    """How many of Celery's signal handlers are running (wrapped at worker_ready)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.running = 0


_handlers = _Handlers()


def _cancel_after_handlers(scope: Any, reason: str) -> None:
    with _handlers.cond:
        _handlers.cond.wait_for(lambda: _handlers.running == 0, timeout=10.0)
    scope.cancel(reason)


def _count_handlers(**kw: Any) -> None:
    """worker_ready: Celery's shutdown handlers are installed (main thread); wrap them so
    that :func:`_cancel_after_handlers` knows when one has returned."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (_signal.SIGTERM, _signal.SIGQUIT, _signal.SIGINT):
        handler = _signal.getsignal(signum)
        if not callable(handler) or getattr(handler, _WRAPPED, False):
            continue

        def counted(sig: int, frame: Any, handler: Any = handler) -> Any:
            with _handlers.cond:
                _handlers.running += 1
            try:
                return handler(sig, frame)
            finally:
                with _handlers.cond:
                    _handlers.running -= 1
                    _handlers.cond.notify_all()

        setattr(counted, _WRAPPED, True)
        _signal.signal(signum, counted)


def _patch_request_class() -> None:
    from celery.worker import request as request_module

    cls = request_module.Request
    if getattr(cls.terminate, _WRAPPED, False):
        return

    def calling(orig: Callable[..., Any], reason: str) -> Callable[..., Any]:
        @functools.wraps(orig)
        def method(self: Any, pool: Any, *args: Any, **kwargs: Any) -> Any:
            _target.request, _target.reason = self, reason
            try:
                return orig(self, pool, *args, **kwargs)
            finally:
                _target.request = _target.reason = None

        setattr(method, _WRAPPED, True)
        return method

    cls.terminate = calling(cls.terminate, TERMINATED)
    cls.cancel = calling(cls.cancel, COLD_SHUTDOWN)


def _enforcing_pool(pool: Any) -> bool:
    return isinstance(pool, (ThreadPool, SoloPool))


# --- shutdown_grace -------------------------------------------------------------------------


def _after_grace(grace: float, cancel: Callable[[], None]) -> None:
    """``grace`` seconds into a warm shutdown: ``cancel()`` what still runs. (A daemon
    thread: if the tasks end first, the worker exits and this goes with it.)"""
    time.sleep(grace)
    cancel()


def _cancel_in_threads() -> None:
    for scope in running.all():
        _cancel_after_handlers(scope, SHUTDOWN)


def _cancel_in_children(pool: Any) -> Callable[[], None]:
    def cancel() -> None:
        inner = getattr(pool, "_pool", None)
        for process in list(getattr(inner, "_pool", None) or ()):
            if getattr(process, "exitcode", None) is not None:
                continue  # exited (and reaped): its pid may be another process's now
            try:
                os.kill(process.pid, _celery_child.CANCEL_SIGNAL)
            except (ProcessLookupError, TypeError):
                pass

    return cancel


def _on_shutting_down(grace: float, cancel: Callable[[], None]) -> Callable[..., None]:
    started = threading.Event()

    def on_shutting_down(sender: Any = None, how: Any = None, **kw: Any) -> None:
        if how != "Warm" or started.is_set():
            return  # a repeated signal changes nothing: the grace runs from the first
        started.set()
        threading.Thread(target=_after_grace, args=(grace, cancel), daemon=True,
                         name="timeoutcore-celery-grace").start()

    return on_shutting_down


# --- the bootstep ---------------------------------------------------------------------------


class TimeLimitStep(bootsteps.Step):
    """Worker bootstep added by :func:`install`."""

    name = "timeoutcore.contrib.celery.TimeLimitStep"
    requires = ("celery.worker.components:Pool",)
    patch_blocking = False
    registry: Any = None
    reap = False
    shutdown_grace: Optional[float] = None

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        worker.timeoutcore_enforcing = False

    def create(self, worker: Any) -> None:
        pool = worker.pool
        if isinstance(pool, PreforkPool):
            self._prefork(worker, pool)
        elif _enforcing_pool(pool):
            self._in_process(worker, pool)
        else:
            log.info("pool %s enforces its own time limits: timeoutcore stays out",
                     type(pool).__module__)
            return None
        worker.timeoutcore_enforcing = True
        log.info("time limits enforced by timeoutcore in the %s pool", type(pool).__module__)
        return None

    def _in_process(self, worker: Any, pool: Any) -> None:
        if self.patch_blocking:
            from ..patch import patch

            patch()
        if self.reap:
            from .._process_tree import become_subreaper, kill_descendants

            become_subreaper()
            signals.worker_shutdown.connect(
                lambda **kw: kill_descendants(other_sessions=True), weak=False)
        options = _Options(self.registry, self.reap, prefork_child=False)
        for task in worker.app.tasks.values():
            _guard_task(task)
        _wrap_pool(pool, options)
        _patch_request_class()
        signals.worker_ready.connect(_count_handlers, weak=False)
        if self.shutdown_grace is not None:
            signals.worker_shutting_down.connect(
                _on_shutting_down(self.shutdown_grace, _cancel_in_threads), weak=False)

    def _prefork(self, worker: Any, pool: Any) -> None:
        patch_blocking, reap, app = self.patch_blocking, self.reap, worker.app
        options = _Options(self.registry, reap, prefork_child=True,
                           default_hard=_limit_option(pool.options.get("timeout")),
                           default_soft=_limit_option(pool.options.get("soft_timeout")))

        def child_init(**kw: Any) -> None:
            if patch_blocking:
                from ..patch import patch

                patch()
            _celery_child.on_process_init(reap)
            for task in app.tasks.values():
                _guard_task(task, options)

        signals.worker_process_init.connect(child_init, weak=False)
        signals.worker_process_shutdown.connect(
            lambda **kw: _celery_child.on_process_shutdown(), weak=False)
        if self.shutdown_grace is not None:
            signals.worker_shutting_down.connect(
                _on_shutting_down(self.shutdown_grace, _cancel_in_children(pool)), weak=False)


def install(app: Any, *, patch: bool = False, registry: Any = None, reap: bool = False,
            shutdown_grace: Optional[float] = None) -> None:
    """Make the workers of ``app`` enforce time limits through timeoutcore, in the
    ``prefork``, ``threads`` and ``solo`` pools (see the module's documentation).

    Call it where the app is defined (before the worker starts). ``patch=True`` calls
    :func:`timeoutcore.patch` where the tasks run. ``reap=True``: nothing a task started
    survives it (the task-running process is a child subreaper that kills and reaps every
    descendant after each task and at exit). ``shutdown_grace``: seconds running tasks get
    on a warm shutdown before they are cancelled (REVOKED); ``None`` keeps Celery's wait.
    ``registry``: a :class:`timeoutcore.contrib.redis.DeadlineRegistry` that publishes
    every running task (list, ``extend``, ``cancel``). Idempotent (the last call wins).
    """
    if not isinstance(patch, bool):
        raise TypeError(f"install(): patch must be True or False, not {patch!r}")
    if not isinstance(reap, bool):
        raise TypeError(f"install(): reap must be True or False, not {reap!r}")
    grace = _validate.seconds(shutdown_grace, "install()", "shutdown_grace", allow_zero=True,
                              allow_none=True)
    steps = app.steps["worker"]
    step: type[TimeLimitStep] = type("TimeLimitStep", (TimeLimitStep,), {
        "patch_blocking": patch, "registry": registry, "name": TimeLimitStep.name,
        "reap": reap, "shutdown_grace": grace})
    for existing in list(steps):
        if getattr(existing, "name", None) == TimeLimitStep.name:
            steps.discard(existing)
    steps.add(step)


def is_enforcing(worker: Any) -> bool:
    """True if timeoutcore enforces the time limits of this worker."""
    return bool(getattr(worker, "timeoutcore_enforcing", False))
