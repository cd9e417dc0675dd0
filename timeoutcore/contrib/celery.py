"""Celery: ``time_limit`` / ``soft_time_limit`` honoured by the ``threads`` and ``solo`` pools.

Celery enforces time limits only in its ``prefork`` pool, by signalling or killing the child
process; the ``threads`` and ``solo`` pools accept the limits and ignore them. One line::

    from timeoutcore.contrib.celery import install
    install(app)

adds a worker bootstep. When the worker starts with ``--pool threads`` or ``--pool solo``,
every task runs under a :func:`~timeoutcore.thread_deadline` built from the limits Celery
itself resolved for that task (``apply_async(time_limit=, soft_time_limit=)``, the task's
``time_limit``/``soft_time_limit``, else the app's ``task_time_limit``/
``task_soft_time_limit``), with Celery's semantics:

* at the soft limit ``celery.exceptions.SoftTimeLimitExceeded`` is raised inside the task,
  which may catch it and clean up; the worker logs "Soft time limit (...) exceeded";
* at the hard limit the task is stopped wherever it is (``except Exception`` cannot keep
  it running) and fails with ``celery.exceptions.TimeLimitExceeded``: the result backend
  stores the failure, ``task-failed`` is sent, ``task_failure``/``on_failure``/errbacks run,
  ``acks_late``/``acks_on_failure_or_timeout`` apply as for any timeout; the worker logs
  "Hard time limit (...) exceeded";
* the worker thread survives and takes the next task.

Under any other pool (``prefork``, ``gevent``, ``eventlet``, custom) the bootstep does
nothing: Celery's own enforcement stays as it is.

What it guards: the task body (``run``), from the moment the worker thread starts it. Like
prefork's, the limit starts when a pool thread picks the task up, not when it was received.
Blocking calls that CPython retries after a signal (``time.sleep``, socket reads) need
:func:`timeoutcore.patch` to stop precisely; call it in the worker (``install(app,
patch=True)`` does).

With ``install(app, registry=DeadlineRegistry(...))`` every time-limited task is published
in Redis under its task id while it runs: a coordinator can list it, extend its hard limit,
or cancel it -- ``revoke(terminate=True)`` for pools that have no process to kill.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any, Callable, Optional

from celery import bootsteps, signals
from celery.concurrency.solo import TaskPool as SoloPool
from celery.concurrency.thread import TaskPool as ThreadPool
from celery.exceptions import Ignore, SoftTimeLimitExceeded, TimeLimitExceeded

from ..errors import DeadlineCancelled, DeadlineExceeded
from ..scope import thread_deadline

__all__ = ["TimeLimitStep", "install", "is_enforcing"]

log = logging.getLogger("timeoutcore.celery")
worker_log = logging.getLogger("celery.worker.request")  # where Celery logs its own limits

#: Stands in for "no hard limit" when a task has only a soft one (about 31 years).
_NO_HARD_LIMIT = 1e9

_WRAPPED = "__timeoutcore_guarded__"


class _Limits:
    """The limits the pool was asked to enforce for one task, handed to its thread."""

    __slots__ = ("hard", "soft", "timeout_callback", "registry")

    def __init__(self, hard: Optional[float], soft: Optional[float],
                 timeout_callback: Optional[Callable[[bool, float], Any]],
                 registry: Any = None) -> None:
        self.hard = hard
        self.soft = soft
        self.timeout_callback = timeout_callback
        self.registry = registry


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


def _wrap_pool(pool: Any, registry: Any = None) -> None:
    original = pool.on_apply
    default_hard = _limit_option(pool.options.get("timeout"))
    default_soft = _limit_option(pool.options.get("soft_timeout"))

    def on_apply(target: Callable[..., Any], args: Any = None, kwargs: Any = None,
                 callback: Any = None, accept_callback: Any = None, **options: Any) -> Any:
        hard = _limit_option(options.get("timeout")) or default_hard
        soft = _limit_option(options.get("soft_timeout")) or default_soft
        if soft is not None and hard is not None and soft >= hard:
            soft = None  # as in prefork: the hard limit comes first, the soft one never fires
        if hard is not None or soft is not None:
            limits = _Limits(hard, soft, options.get("timeout_callback"), registry)
            target = functools.partial(_with_limits, target, limits)
        return original(target, args, kwargs, callback, accept_callback, **options)

    pool.on_apply = on_apply


def _guard_task(task: Any) -> None:
    """Make ``task.run`` (what Celery's tracer calls) apply the pending limits."""
    run = task.run
    if getattr(run, _WRAPPED, False):
        return

    @functools.wraps(run)
    def guarded_run(*args: Any, **kwargs: Any) -> Any:
        limits: Optional[_Limits] = getattr(_pending, "limits", None)
        if limits is None:
            return run(*args, **kwargs)
        _pending.limits = None  # a task called synchronously from this one runs unguarded
        return _run_limited(task, run, limits, args, kwargs)

    setattr(guarded_run, _WRAPPED, True)
    task.run = guarded_run


def _run_limited(task: Any, run: Callable[..., Any], limits: _Limits,
                 args: Any, kwargs: Any) -> Any:
    extras: dict[str, Any] = {"label": task.name}
    if limits.soft is not None:
        extras.update(soft_limit=limits.soft, soft_raise=SoftTimeLimitExceeded)
        if limits.timeout_callback is not None:
            extras["on_soft"] = functools.partial(_soft_passed, limits)
    hard = limits.hard if limits.hard is not None else _NO_HARD_LIMIT
    task_id = getattr(task.request, "id", None)
    if limits.registry is not None and task_id:
        extras = limits.registry.scope_options(task_id, **extras)
    scope = thread_deadline(hard, **extras)
    try:
        with scope:
            return run(*args, **kwargs)
    except DeadlineCancelled as exc:
        if exc.scope is not scope:
            raise
        _revoked(task, task_id)
        raise Ignore() from None  # the state is REVOKED; nothing else is stored
    except DeadlineExceeded as exc:
        if exc.scope is not scope:
            raise  # a deadline of the task's own
        worker_log.error("Hard time limit (%ss) exceeded for %s[%s]", limits.hard, task.name,
                         task_id)
        raise TimeLimitExceeded(limits.hard) from None


_CANCELLED = "cancelled through the deadline registry"


def _revoked(task: Any, task_id: Optional[str]) -> None:
    """What Celery does for ``revoke(terminate=True)``: REVOKED in the result backend,
    a ``task-revoked`` event, the ``task_revoked`` signal."""
    worker_log.warning("Task %s[%s] %s", task.name, task_id, _CANCELLED)
    request = task.request
    task.backend.mark_as_revoked(task_id, _CANCELLED, request=request,
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


def _enforcing_pool(pool: Any) -> bool:
    return isinstance(pool, (ThreadPool, SoloPool))


class TimeLimitStep(bootsteps.Step):
    """Worker bootstep added by :func:`install`; acts only on the threads and solo pools."""

    name = "timeoutcore.contrib.celery.TimeLimitStep"
    requires = ("celery.worker.components:Pool",)
    patch_blocking = False
    registry: Any = None

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        worker.timeoutcore_enforcing = False

    def create(self, worker: Any) -> None:
        pool = worker.pool
        if not _enforcing_pool(pool):
            log.info("pool %s enforces its own time limits: timeoutcore stays out",
                      type(pool).__module__)
            return None
        if self.patch_blocking:
            from ..patch import patch

            patch()
        for task in worker.app.tasks.values():
            _guard_task(task)
        _wrap_pool(pool, self.registry)
        worker.timeoutcore_enforcing = True
        log.info("time limits enforced by timeoutcore in the %s pool", type(pool).__module__)
        return None


def install(app: Any, *, patch: bool = False, registry: Any = None) -> None:
    """Make workers of ``app`` that run the ``threads`` or ``solo`` pool honour time limits.

    Call it where the app is defined (before the worker starts). ``patch=True`` also calls
    :func:`timeoutcore.patch` in such a worker, so ``time.sleep``, socket reads and other
    waits that CPython retries after a signal stop at the limit too.

    ``registry``: a :class:`timeoutcore.contrib.redis.DeadlineRegistry`; every task with a
    time limit is then published under its task id while it runs, so a coordinator can list
    it, ``extend(task_id, seconds)`` it, or ``cancel(task_id)`` it, which does what
    ``revoke(terminate=True)`` does under prefork: the task stops, its state is REVOKED
    (``TaskRevokedError``), ``task-revoked`` is sent. Idempotent (the last call wins).
    """
    steps = app.steps["worker"]
    step: type[TimeLimitStep] = type("TimeLimitStep", (TimeLimitStep,), {
        "patch_blocking": patch, "registry": registry, "name": TimeLimitStep.name})
    for existing in list(steps):
        if getattr(existing, "name", None) == TimeLimitStep.name:
            steps.discard(existing)
    steps.add(step)


def is_enforcing(worker: Any) -> bool:
    """True if timeoutcore enforces the time limits of this worker (threads/solo pool)."""
    return bool(getattr(worker, "timeoutcore_enforcing", False))
