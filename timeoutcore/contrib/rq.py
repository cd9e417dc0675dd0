"""RQ: job timeouts that stop blocking calls in any thread, and stop-job for threaded workers.

One option on the command line::

    rq worker --worker-class timeoutcore.contrib.rq.SimpleWorker --url redis://... high default

(or ``timeoutcore.contrib.rq.Worker`` for RQ's forking worker). Every job then runs under
:class:`DeathPenalty`, a drop-in for RQ's ``BaseDeathPenalty`` protocol
(``DeathPenalty(timeout, JobTimeoutException, job_id=...)`` used as a context manager):

* the job's ``job_timeout`` is enforced in whatever thread runs the job -- the forking
  worker's horse, a ``SimpleWorker`` in the main thread, a ``SimpleWorker`` hosted in any
  other thread -- and the job fails with RQ's own ``JobTimeoutException`` ("Task exceeded
  maximum timeout value (N seconds)"): it lands in the ``FailedJobRegistry``, retries and
  failure callbacks behave as with RQ's own penalties;
* with :func:`timeoutcore.patch` (the worker classes call it; ``patch_blocking = False`` in
  a subclass opts out) ``time.sleep``, socket reads and writes (``requests``, Redis,
  database drivers), ``select`` and ``subprocess`` waits end at the limit, and a child
  process the job started is killed with its process group;
* ``-1`` (and ``None``, and ``0`` as RQ's own penalties read it) is "no limit"; a limit is a
  float, sub-second included (see "Sub-second limits").

Why not RQ's own: ``UnixSignalDeathPenalty`` (the default) arms ``SIGALRM`` with whole
seconds and works in the main thread only -- a ``SimpleWorker`` started in another thread
stops at once with "signal only works in main thread" (its own signal handlers), and with
those taken out fails every job with it (rq#734, rq#1804, rq#2135).
``TimerDeathPenalty`` starts a ``threading.Timer`` per job and raises the exception with
``PyThreadState_SetAsyncExc``, which lands only when the thread next runs bytecode: a job
blocked in ``time.sleep``, a socket read or ``subprocess.run`` runs on to its end; and an
``except Exception`` in the job swallows it.

Stop-job. ``rq.command.send_stop_job_command(redis, job_id)`` (``rq stop`` on the command
line) kills the forking worker's horse; a stock ``SimpleWorker`` has no horse and does
nothing (cvat#10660: "Job.timeout ... and stop-job commands are no-ops on this worker").
:class:`SimpleWorker` stops the running job in its thread, wherever it blocks: the job ends
with :class:`JobStopped`, its status is ``STOPPED``, it is never retried, and its
``on_stopped`` callback runs (as for the forking worker's killed horse). A stop that arrives
between the dequeue and the start of the job keeps the job from starting.

Sub-second limits. RQ 3 reads ``job_timeout`` through ``parse_timeout``, which makes it an
``int`` (``1.5`` becomes ``1``; ``0.5`` becomes ``0`` and is refused). Two ways to give a
finer limit, both read by the worker classes of this module:

* enqueue through :class:`Queue` (``timeoutcore.contrib.rq.Queue``, an ``rq.Queue``):
  ``queue.enqueue(f, job_timeout=0.25)`` stores ``0.25`` in the job's ``meta`` under
  :data:`META_KEY` and gives RQ the limit rounded up to whole seconds (``1``);
* or put it in ``meta`` yourself: ``enqueue(f, job_timeout=1, meta={META_KEY: 0.25})``.

The ``meta`` limit can only shorten RQ's: RQ sizes the worker's heartbeat and the
``StartedJobRegistry`` entry on its own (whole-second) timeout, so the job is stopped at the
smaller of the two. :class:`DeathPenalty` used on its own (``death_penalty_class`` of a
worker class of yours) gets only RQ's whole seconds: it is the worker's ``perform_job``
that hands it the job.

What is stopped and what is not: see the package documentation. In short, Python code and
the patched blocking calls stop at the limit; a C call that holds the GIL to its end (a
long regex, a big ``numpy`` op) is stopped when it returns.

The forking worker's own monitor (``HorseMonitorTimeoutException`` around ``os.wait4`` in
the worker's main thread, every ``job_monitoring_interval`` seconds) stays with RQ's
``SIGALRM`` penalty: before Python 3.15 timeoutcore's interrupt cannot end that wait
(CPython retries it after the signal, PEP 475, and ``patch()`` does not cover it), while a
``SIGALRM`` handler can.
"""

from __future__ import annotations

import math
import threading
import traceback
from types import TracebackType
from typing import Any, Optional

from rq import Queue as _RQQueue
from rq import SimpleWorker as _RQSimpleWorker
from rq import Worker as _RQWorker
from rq.callbacks import execute_stopped_callback
from rq.timeouts import (
    BaseDeathPenalty,
    HorseMonitorTimeoutException,
    JobTimeoutException,
    UnixSignalDeathPenalty,
)
from rq.utils import now

from .. import _validate
from ..errors import DeadlineCancelled, DeadlineExceeded
from ..executor import NO_LIMIT
from ..scope import thread_deadline

__all__ = ["META_KEY", "DeathPenalty", "JobStopped", "Queue", "SimpleWorker", "Worker"]

#: The ``meta`` key of a job's limit in (float) seconds, finer than RQ's whole seconds.
META_KEY = "timeoutcore_timeout"

#: The reason a stop-job command gives the job's scope.
STOPPED_REASON = "rq stop-job"


class JobStopped(Exception):
    """The job was stopped by ``send_stop_job_command`` (or ``rq stop``) while it ran in a
    :class:`SimpleWorker`; its status is ``STOPPED``. An ``Exception``, as RQ records any
    failure: it is raised after the job's code has been left, which cannot catch it."""


class _Performing:
    """The job a worker performs right now, shared by the worker thread (which enters the
    job's scope) and the pubsub thread (which stops it)."""

    __slots__ = ("job", "lock", "scope", "body_started", "stop_requested")

    def __init__(self, job: Any) -> None:
        self.job = job
        self.lock = threading.Lock()
        self.scope: Any = None
        # The first DeathPenalty of this job in perform_job guards its body; later ones
        # guard its success/failure callbacks, which a stop does not reach.
        self.body_started = False
        self.stop_requested = False

    def stop(self) -> None:
        """Stop the job's body now, or keep it from starting if it has not started yet."""
        with self.lock:
            self.stop_requested = True
            scope = self.scope
        if scope is not None:
            scope.cancel(STOPPED_REASON)  # no-op once the body has left its scope


_performing = threading.local()  # .record: the _Performing of the job this thread runs


def _limit(timeout: Any, where: str) -> Optional[float]:
    """RQ's ``timeout`` as seconds, or None for "no limit" (``-1``, ``None``, and ``0`` as
    RQ's own penalties read it); a clear error for anything else."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"{where}: timeout must be a number of seconds (int or float), -1 or "
                        f"None, not {type(timeout).__name__}")
    if timeout == -1 or timeout == 0:
        return None
    return _validate.seconds(timeout, where, "timeout")


def _meta_limit(job: Any) -> Optional[float]:
    meta = getattr(job, "meta", None) or {}
    value = meta.get(META_KEY)
    if value is None:
        return None
    return _validate.seconds(value, "timeoutcore.contrib.rq", f"meta[{META_KEY!r}]")


def _where_stopped(error: BaseException, tb: Optional[TracebackType]) -> BaseException:
    """``error`` carrying the traceback of the job where it was interrupted (``tb``, given
    to the penalty's ``__exit__``), so that the ``exc_info`` RQ records shows the line the
    job was stopped at, as RQ's own SIGALRM penalty's does."""
    return error if tb is None else error.with_traceback(tb)


class DeathPenalty(BaseDeathPenalty):
    """RQ's death-penalty protocol, enforced by a :func:`~timeoutcore.thread_deadline` in
    the thread that enters it.

    ``DeathPenalty(timeout, exception=JobTimeoutException, job_id=None)``: ``timeout`` in
    seconds (float accepted), ``-1``/``None``/``0`` for none. Entering it starts the limit;
    leaving it after the limit passed raises ``exception("Task exceeded maximum timeout
    value (N seconds)")``, chained to the :class:`~timeoutcore.DeadlineExceeded` whose
    traceback shows where the job was stopped. A ``TypeError``/``ValueError`` at
    construction names a bad ``timeout`` (a negative other than ``-1``, NaN, infinity, a
    string, a bool) or ``exception``.

    Inside a worker of this module, the job's body also gets the ``meta`` limit
    (:data:`META_KEY`) and can be stopped by stop-job. Given RQ's
    ``HorseMonitorTimeoutException`` (the forking worker's horse monitor) it is RQ's
    ``UnixSignalDeathPenalty`` (the module's documentation says why).
    """

    def __init__(self, timeout: Any, exception: Any = JobTimeoutException,
                 **kwargs: Any) -> None:
        where = "DeathPenalty()"
        if not (isinstance(exception, type) and issubclass(exception, BaseException)):
            raise TypeError(f"{where}: exception must be an exception class, not {exception!r}")
        limit = _limit(timeout, where)
        super().__init__(timeout, exception, **kwargs)  # type: ignore[no-untyped-call]
        self._delegate: Optional[BaseDeathPenalty] = None
        self._scope: Any = None
        self._record: Optional[_Performing] = None
        if issubclass(exception, HorseMonitorTimeoutException):
            stock: Any = UnixSignalDeathPenalty  # RQ's classes are not annotated
            self._delegate = stock(timeout, exception, **kwargs)
            return
        job_id = kwargs.get("job_id")
        record: Optional[_Performing] = getattr(_performing, "record", None)
        if record is not None and job_id is not None and record.job.id == job_id \
                and not record.body_started:
            record.body_started = True
            self._record = record
            finer = _meta_limit(record.job)
            if finer is not None and (limit is None or finer < limit):
                limit = finer
        self._limit = limit
        self._scope = thread_deadline(NO_LIMIT if limit is None else limit,
                                      label=f"rq job {job_id}" if job_id else "rq")

    @property
    def limit(self) -> Optional[float]:
        """The limit this penalty enforces, in seconds (None: none)."""
        return None if self._delegate is not None else self._limit

    def __enter__(self) -> None:
        if self._delegate is not None:
            self._delegate.__enter__()  # type: ignore[no-untyped-call]
            return
        record = self._record
        if record is not None:
            with record.lock:
                if record.stop_requested:  # stopped before it started: it never starts
                    raise JobStopped(f"job {record.job.id} stopped before it started")
                record.scope = self._scope
        self._scope.__enter__()

    def __exit__(self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> bool:
        if self._delegate is not None:
            return bool(self._delegate.__exit__(exc_type, exc, tb))  # type: ignore[no-untyped-call]
        scope = self._scope
        try:
            return bool(scope.__exit__(exc_type, exc, tb))
        except DeadlineCancelled as stop:
            if stop.scope is not scope:
                raise
            raise _where_stopped(JobStopped(
                f"job stopped ({stop.reason or 'cancelled'}) after {stop.elapsed:.3f} s"),
                tb) from stop
        except DeadlineExceeded as stop:
            if stop.scope is not scope:
                raise  # a deadline of the job's own
            raise _where_stopped(self._exception(
                f"Task exceeded maximum timeout value ({self._timeout_text()} seconds)"),
                tb) from stop
        finally:
            record = self._record
            if record is not None:
                with record.lock:
                    record.scope = None

    def _timeout_text(self) -> str:
        limit = self._limit
        if limit is None:
            return str(self._timeout)
        return str(int(limit)) if limit == int(limit) else f"{limit:g}"

    # The protocol's two methods, for code that calls them instead of using ``with``.
    def setup_death_penalty(self) -> None:
        self.__enter__()

    def cancel_death_penalty(self) -> None:
        self.__exit__(None, None, None)


class _Enforcing:
    """What both worker classes add to RQ's: this module's death penalty, ``patch()`` at
    ``work()``, and the job being performed made known to its penalty and to stop-job."""

    death_penalty_class: type[BaseDeathPenalty] = DeathPenalty
    #: Call :func:`timeoutcore.patch` when the worker starts working (before any fork).
    patch_blocking: bool = True

    _timeoutcore_performing: Optional[_Performing] = None

    def work(self, *args: Any, **kwargs: Any) -> bool:
        if self.patch_blocking:
            from ..patch import patch

            patch()
        return bool(super().work(*args, **kwargs))  # type: ignore[misc]

    def unsubscribe(self) -> None:
        """RQ's, without its shutdown hang (rq#1613): RQ unsubscribes, then stops the
        pubsub thread and joins it without a timeout; if the thread reads the unsubscribe
        reply before ``stop()``, it loops once more into redis-py's wait for a subscription
        (``get_message(timeout=60)``), and the worker's exit -- or, for a worker hosted in a
        thread, that thread's end -- waits up to a minute. Telling the thread to stop
        *first* (no join) makes the unsubscribe reply its last message."""
        thread = getattr(self, "pubsub_thread", None)
        if thread is not None:
            try:
                thread.stop(timeout=0)  # clears its running flag; redis-py >= 5.1
            except TypeError:  # an older redis-py: RQ's own order
                pass
        super().unsubscribe()  # type: ignore[misc]

    def perform_job(self, job: Any, queue: Any, *args: Any, **kwargs: Any) -> bool:
        record = _Performing(job)
        # A stop accepted between the dequeue and now found no record (kill_horse): RQ has
        # set _stopped_job_id already, and the job must not run.
        if getattr(self, "_stopped_job_id", None) == job.id:
            record.stop_requested = True
        self._timeoutcore_performing = record
        _performing.record = record
        try:
            return bool(super().perform_job(job, queue, *args, **kwargs))  # type: ignore[misc]
        finally:
            _performing.record = None
            self._timeoutcore_performing = None


class SimpleWorker(_Enforcing, _RQSimpleWorker):
    """RQ's ``SimpleWorker`` (jobs run in the worker's own thread) with :class:`DeathPenalty`
    and a working stop-job (see the module's documentation).

    ``rq worker --worker-class timeoutcore.contrib.rq.SimpleWorker ...``. It can also be
    run from a thread other than the main one (``SimpleWorker(queues, connection=r).work()``
    in a thread you start): it then installs no signal handlers (only the main thread can),
    so stop it with ``max_jobs``, ``burst=True`` or ``max_idle_time``.
    """

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is threading.main_thread():
            super()._install_signal_handlers()  # type: ignore[no-untyped-call]

    def kill_horse(self, sig: Any = None) -> None:
        """RQ calls it for stop-job and stop-execution (after setting ``_stopped_job_id``):
        stop the job this worker runs, if it is that one."""
        record = self._timeoutcore_performing
        if record is not None and record.job.id == self._stopped_job_id:
            record.stop()

    def _finalize_failure(self, job: Any, queue: Any, execution: Any, exc_info: Any) -> None:
        # A stopped job ends as the forking worker's killed horse does: STOPPED, its
        # on_stopped callback run, no failure callback. (RQ's own method would run
        # on_failure; it decides STOPPED from ``_stopped_job_id`` in handle_job_failure.)
        if not (self._stopped_job_id == job.id and isinstance(exc_info[1], JobStopped)):
            super()._finalize_failure(job, queue, execution, exc_info)
            return
        job.ended_at = now()
        self.log.warning("Worker %s: job %s stopped by user, moving job to FailedJobRegistry",
                         self.name, job.id)
        try:
            execute_stopped_callback(job, self.death_penalty_class)
        except Exception:  # noqa: BLE001 - as RQ: a raising callback does not un-stop the job
            self.log.exception("Worker %s: stopped callback for job %s raised", self.name,
                               job.id)
        self.handle_job_failure(job, queue=queue,
                                exc_string="".join(traceback.format_exception(*exc_info)),
                                started_job_registry=queue.started_job_registry,
                                execution=execution)


class Worker(_Enforcing, _RQWorker):
    """RQ's forking ``Worker`` with :class:`DeathPenalty` in the horse (sub-second limits,
    blocking calls stopped). Stop-job is RQ's own: it kills the horse.

    ``rq worker --worker-class timeoutcore.contrib.rq.Worker ...``.
    """


class Queue(_RQQueue):
    """An ``rq.Queue`` whose ``job_timeout`` may be a float: a fraction of a second is kept
    in the job's ``meta`` (:data:`META_KEY`), and RQ gets the limit rounded up to whole
    seconds. Everything else is RQ's."""

    def create_job(self, func: Any, args: Any = None, kwargs: Any = None,
                   timeout: Any = None, *rest: Any, **options: Any) -> Any:
        """RQ's ``create_job`` (every ``enqueue*`` method goes through it), with a float
        ``timeout`` kept as described above. A negative number other than ``-1``, NaN or
        infinity is a ``ValueError`` here, not a failure of the job on the worker (``0``
        and strings are RQ's to judge)."""
        if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) \
                and timeout not in (-1, 0):
            seconds = _validate.seconds(timeout, "Queue.enqueue()", "job_timeout")
            if isinstance(timeout, float) and not seconds.is_integer():
                if len(rest) > _META_AFTER_TIMEOUT:  # meta given by position
                    given = list(rest)
                    given[_META_AFTER_TIMEOUT] = {**(given[_META_AFTER_TIMEOUT] or {}),
                                                  META_KEY: seconds}
                    rest = tuple(given)
                else:
                    options["meta"] = {**(options.get("meta") or {}), META_KEY: seconds}
            timeout = math.ceil(seconds)  # what RQ keeps: an int, never below the limit
        return super().create_job(func, args, kwargs, timeout, *rest, **options)


# create_job(func, args, kwargs, timeout, result_ttl, ttl, failure_ttl, description,
# depends_on, job_id, meta, ...): meta's place among the arguments after timeout
_META_AFTER_TIMEOUT = 6
