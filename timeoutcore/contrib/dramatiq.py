"""Dramatiq: time limits that stop blocking calls, and abort of a running message.

A drop-in for ``dramatiq.middleware.TimeLimit``, in its place in the broker's middleware::

    from dramatiq.brokers.redis import RedisBroker
    from timeoutcore.contrib.dramatiq import install

    broker = RedisBroker(url=url)
    install(broker, patch=True)      # replaces the stock TimeLimit, same position

or ``RedisBroker(url=url, middleware=[..., TimeLimit(patch=True), ...])``. Every actor
then runs under a :func:`~timeoutcore.thread_deadline` built from the same option as the
stock middleware: ``time_limit`` in milliseconds, from the message
(``send_with_options(time_limit=...)``), else the actor, else the middleware's
``time_limit`` (default 600,000 ms; ``float("inf")``: no limit). At the limit the actor is
stopped wherever it is and fails with :class:`TimeLimitExceeded`, a subclass of
``dramatiq.middleware.TimeLimitExceeded`` and, like it, a ``BaseException`` that an
actor's ``except Exception`` cannot swallow: the worker logs it, ``Retries`` retries it,
``Results`` stores it, ``throws``/``on_failure`` see it, as for the stock middleware.

What changes against the stock middleware, which polls every ``interval`` (1 s) and injects
an asynchronous exception that lands only when the thread next runs Python bytecode (its
docstring: "this middleware can't cancel system calls"; dramatiq#211, #653, #445): the
deadline fires at its time, not at the next poll, and with ``patch=True`` (or
:func:`timeoutcore.patch` called in the worker) ``time.sleep``, socket reads (``requests``,
``httpx``), ``subprocess`` waits and lock/queue waits end at it too; a child process started
by the actor is killed with it.

``soft_time_limit`` (ms; middleware default, actor or message option) logs a warning on the
stock middleware's logger (``dramatiq.middleware.time_limit.TimeLimit``) when it passes;
the actor runs on to the hard limit. The hard limit is logged there too.

Abort (the Redis deadline registry, :mod:`timeoutcore.contrib.redis`)::

    registry = DeadlineRegistry.from_url(url)
    install(broker, patch=True, registry=registry)          # worker side
    abort(message.message_id, registry=registry)            # any process: True if it ran

publishes each running message under its message id; :func:`abort` cancels it through Redis:
it stops within milliseconds (Python code and every wait ``patch()`` covers: ``time.sleep``,
socket reads, subprocess, lock/queue/event waits), and fails with :class:`Aborted`. It is not retried: ``Aborted`` is added to
every actor's ``throws`` option, the switch the ``Retries`` middleware documents for "never
retried" (the worker then logs it at INFO as an expected exception and ``Retries`` fails the
message: dead-letter queue, ``Results`` stores ``Aborted``). An abort of a message that is
not running yet is kept in Redis for ``abort_ttl`` ms: if the message starts within that
time it fails with ``Aborted`` at once, its body never run (dramatiq-abort's choice too; the
alternative, a no-op, would let a queued message run after its caller gave up).
dramatiq-abort's aborts land only when a blocking call returns, and its aborted messages are
retried (Flared/dramatiq-abort#29, #30): both are what this module does differently.
Messages without a time limit are not published (the limit bounds the life of their key in
Redis): they cannot be aborted while running.

Not covered: async actors (the ``AsyncIO`` middleware) run their coroutine on the event loop
thread, not in the worker thread this middleware guards: their limits are not enforced here
(a warning is logged when one is declared). Unlike the stock middleware, whose interrupt
reaches the worker thread's wait for the coroutine and cancels it at its next poll: put
``asyncio.timeout`` in the coroutine instead.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import threading
import time
from typing import Any, Callable, NamedTuple, Optional, Union

from dramatiq.middleware import Middleware, MiddlewareError
from dramatiq.middleware import TimeLimit as StockTimeLimit
from dramatiq.middleware import TimeLimitExceeded as StockTimeLimitExceeded
from dramatiq.middleware.threading import Interrupt, is_gevent_active

from ..errors import DeadlineCancelled, DeadlineExceeded
from ..executor import NO_LIMIT
from ..scope import checkpoint, shield, thread_deadline

__all__ = ["Aborted", "InvalidTimeLimit", "TimeLimit", "TimeLimitExceeded", "abort", "install"]

#: The stock middleware's logger: log configuration written for it applies unchanged.
logger = logging.getLogger("dramatiq.middleware.time_limit.TimeLimit")
log = logging.getLogger("timeoutcore.dramatiq")

DEFAULT_TIME_LIMIT = 600_000  # ms, as dramatiq.middleware.TimeLimit
DEFAULT_ABORT_TTL = 90_000  # ms an abort of a message not yet running is kept

_GUARDED = "__timeoutcore_dramatiq__"
_ABORT_KEY = "{prefix}:dramatiq-abort:{message_id}"


class TimeLimitExceeded(StockTimeLimitExceeded):
    """The actor ran past its ``time_limit`` and was stopped (a ``BaseException``, as
    dramatiq's own ``TimeLimitExceeded``, which it subclasses). ``args``: a message naming
    the actor, the message id and the limit in ms."""


class Aborted(Interrupt):
    """The message was aborted (:func:`abort`) while it ran, or before it started; it is
    not retried (it is in every actor's ``throws``). A dramatiq ``Interrupt``, so a
    ``BaseException``."""


class InvalidTimeLimit(MiddlewareError, ValueError, TypeError):
    """A ``time_limit``/``soft_time_limit`` that is not a positive number of milliseconds.

    A ``ValueError`` (and a ``TypeError``: a wrong type is one too, so either ``except``
    catches it); also a dramatiq ``MiddlewareError``, the one kind of error dramatiq
    lets out of a middleware hook: so ``@dramatiq.actor(time_limit=-1)`` and
    ``send_with_options(time_limit="1s")`` raise it at the caller instead of being logged
    and ignored. A bad limit that reaches a worker anyway fails that message with it."""


def _ms(value: Any, name: str, where: str) -> Optional[float]:
    """``value`` (milliseconds) as seconds; ``None`` for ``float("inf")`` (no limit)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidTimeLimit(f"{where}: {name} must be a number of milliseconds "
                               f"(int or float), not {type(value).__name__}")
    if value == math.inf:
        return None
    if math.isnan(value) or value <= 0:
        raise InvalidTimeLimit(f"{where}: {name} must be a positive number of milliseconds "
                               f"(or float('inf') for none), got {value!r}")
    seconds = float(value) / 1000.0
    if seconds > NO_LIMIT:
        raise InvalidTimeLimit(f"{where}: {name} is too large ({value!r} ms; at most 3e11)")
    return seconds


class _Job(NamedTuple):
    """One message about to run in this worker thread: what the actor's guard needs."""

    middleware: TimeLimit
    message_id: str
    actor_name: str
    hard: Optional[float]
    soft: Optional[float]
    error: Optional[BaseException]


# The job handed from before_process_message to the actor's guard, in the worker thread.
# The guard takes it (so an actor called synchronously from the actor runs in the caller's
# scope, not under a second one); after_process_message/after_skip_message drop what is
# left, whichever way the message went: skipped by another middleware (SkipMessage), failed
# before the actor was called, or an exception in another middleware's hook.
_pending = threading.local()


class TimeLimit(Middleware):
    """Dramatiq middleware: actors stopped at their ``time_limit`` (ms) by timeoutcore.

    Keywords: ``time_limit`` (ms, default 600,000; ``float("inf")``: none) and ``interval``
    (accepted for compatibility with ``dramatiq.middleware.TimeLimit``; nothing polls here)
    as the stock middleware; ``soft_time_limit`` (ms or None): a warning when it passes;
    ``patch``: call :func:`timeoutcore.patch` when the worker process boots, so blocking
    calls stop at the limit; ``registry``: a
    :class:`~timeoutcore.contrib.redis.DeadlineRegistry` under which running messages are
    published by message id (:func:`abort`). Bad values raise :class:`InvalidTimeLimit`
    (a ``ValueError``) or ``TypeError``.
    """

    def __init__(self, *, time_limit: float = DEFAULT_TIME_LIMIT, interval: int = 1000,
                 soft_time_limit: Optional[float] = None, patch: bool = False,
                 registry: Any = None) -> None:
        _ms(time_limit, "time_limit", "TimeLimit()")
        _ms(interval, "interval", "TimeLimit()")
        if soft_time_limit is not None:
            _ms(soft_time_limit, "soft_time_limit", "TimeLimit()")
        if not isinstance(patch, bool):
            raise TypeError(f"TimeLimit(): patch must be True or False, not {patch!r}")
        if is_gevent_active():  # type: ignore[no-untyped-call]  # dramatiq leaves it untyped
            # greenlets share one OS thread: a thread's deadline cannot tell them apart
            raise RuntimeError("timeoutcore's TimeLimit limits worker threads; under gevent "
                               "(dramatiq-gevent) keep dramatiq.middleware.TimeLimit")
        if registry is not None:
            _check_registry(registry, "TimeLimit()")
        self.logger = logger
        self.time_limit = time_limit
        self.interval = interval
        self.soft_time_limit = soft_time_limit
        self.patch = patch
        self.registry = registry

    @property
    def actor_options(self) -> set[str]:
        return {"time_limit", "soft_time_limit"}

    # -- declaration and boot ------------------------------------------------------------

    def before_declare_actor(self, broker: Any, actor: Any) -> None:
        self._check(actor.options, f"actor {actor.actor_name!r}")

    def after_declare_actor(self, broker: Any, actor: Any) -> None:
        _guard(actor)

    def after_process_boot(self, broker: Any) -> None:
        """In each worker process: ``patch()`` if asked; every actor guarded (those
        declared before this middleware was added too)."""
        if self.patch:
            from ..patch import patch

            patch()
        for actor in list(broker.actors.values()):
            _guard(actor)

    def before_enqueue(self, broker: Any, message: Any, delay: Any) -> None:
        self._check(message.options, f"message {message.message_id}")

    def _check(self, options: Any, where: str) -> None:
        for name in ("time_limit", "soft_time_limit"):
            value = options.get(name)
            if value is not None:
                _ms(value, name, where)

    # -- each message --------------------------------------------------------------------

    def before_process_message(self, broker: Any, message: Any) -> None:
        error: Optional[BaseException] = None
        hard = soft = None
        try:
            actor = broker.get_actor(message.actor_name)
            # resolved as dramatiq.middleware.TimeLimit does (message, actor, middleware)
            # an actor's time_limit=None is "not set", as the stock middleware's `or` reads
            # its message option (it would fail on the actor's None itself)
            hard = _ms(message.options.get("time_limit")
                       or actor.options.get("time_limit") or self.time_limit,
                       "time_limit", f"message {message.message_id}")
            soft_ms = (message.options.get("soft_time_limit")
                       or actor.options.get("soft_time_limit", self.soft_time_limit))
            if soft_ms is not None:
                soft = _ms(soft_ms, "soft_time_limit", f"message {message.message_id}")
                if soft is not None and hard is not None and soft >= hard:
                    soft = None  # the hard limit comes first: the warning would never fire
        except InvalidTimeLimit as exc:
            error = exc  # the message fails with it (never runs unlimited)
        except Exception:  # noqa: BLE001 - an unknown actor: dramatiq reports it itself
            _pending.job = None
            return
        _pending.job = _Job(self, message.message_id, message.actor_name, hard, soft, error)

    def after_process_message(self, broker: Any, message: Any, *, result: Any = None,
                              exception: Optional[BaseException] = None) -> None:
        _pending.job = None

    after_skip_message = after_process_message

    def _run(self, job: _Job, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        """Runs the actor's function under the message's scope, in the worker thread."""
        if job.error is not None:
            raise job.error
        label = f"{job.actor_name}[{job.message_id}]"
        extras: dict[str, Any] = {"label": label}
        if job.soft is not None:
            extras.update(soft_limit=job.soft,
                          on_soft=functools.partial(_soft_passed, label, job.soft))
        registry = self.registry if job.hard is not None else None
        if registry is not None:
            extras = registry.scope_options(job.message_id, **extras)
        scope = thread_deadline(job.hard if job.hard is not None else NO_LIMIT, **extras)
        try:
            with scope:  # the function is called from this frame: no frame of ours between
                if registry is not None and _take_early_abort(registry, job.message_id):
                    scope.cancel("aborted before it started")
                    checkpoint()  # the body never starts
                return fn(*args, **kwargs)
        except DeadlineCancelled as exc:
            if exc.scope is not scope:
                raise
            reason = exc.reason or "aborted"
            self.logger.warning("Message %s (%s) %s after %.0f ms.", job.message_id,
                                job.actor_name, reason, exc.elapsed * 1000)
            raise Aborted(f"{label} {reason}") from None
        except DeadlineExceeded as exc:
            if exc.scope is not scope:
                raise  # a deadline of the actor's own
            limit_ms = (job.hard or 0) * 1000
            self.logger.warning("Time limit exceeded (%g ms) for message %s (%s).", limit_ms,
                                job.message_id, job.actor_name)
            raise TimeLimitExceeded(f"{label} exceeded its time limit of {limit_ms:g} ms") \
                from None


def _soft_passed(label: str, soft: float, scope: Any) -> None:
    logger.warning("Soft time limit (%g ms) exceeded for %s.", soft * 1000, label)


def _guard(actor: Any) -> None:
    """Make ``actor.fn`` (what ``Actor.__call__`` calls) run under the message's limits
    when the worker calls it, and add :class:`Aborted` to the actor's ``throws``.

    Why the function and not the hooks alone: a scope entered in before_process_message
    and left in after_process_message would put the other middleware's hooks (Retries
    enqueuing a retry, Results writing to Redis) under the deadline, and hand the worker's
    ``except BaseException`` the raw interrupt instead of the exception at the scope's
    boundary. Idempotent."""
    fn = actor.fn
    if getattr(fn, _GUARDED, False) or getattr(actor, _GUARDED, False):
        return
    _add_throws(actor)
    if inspect.iscoroutinefunction(getattr(fn, "__wrapped__", None)):
        log.warning("actor %s is async: timeoutcore's TimeLimit does not limit it "
                    "(its coroutine runs on the event loop thread)", actor.actor_name)
        setattr(actor, _GUARDED, True)
        return

    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        job: Optional[_Job] = getattr(_pending, "job", None)
        if job is None:  # called directly, or from another actor
            return fn(*args, **kwargs)
        _pending.job = None
        return job.middleware._run(job, fn, args, kwargs)

    setattr(guarded, _GUARDED, True)
    actor.fn = guarded


def _add_throws(actor: Any) -> None:
    """``Retries`` never retries an exception in the actor's ``throws`` (its documented
    switch; the worker then logs it at INFO as expected). Added here rather than to the
    message's options: those travel (``Callbacks`` sends them to ``on_failure``) and must
    stay JSON. A message that carries its own ``throws`` replaces the actor's: such a
    message would be retried after an abort."""
    throws = actor.options.get("throws")
    given = () if throws is None else (throws,) if isinstance(throws, type) else tuple(throws)
    # InvalidTimeLimit too: a message with a bad limit (sent by a producer without this
    # middleware) fails the same way on every retry.
    missing = tuple(e for e in (Aborted, InvalidTimeLimit)
                    if not any(issubclass(e, t) for t in given))
    if missing:
        actor.options["throws"] = (*given, *missing)


# -- abort ----------------------------------------------------------------------------------

_warned_at = [0.0]


def _take_early_abort(registry: Any, message_id: str) -> bool:
    """Whether an abort came for this message before it ran (and forget it). Read after
    the message was published, so that an abort is never lost between the two: see
    :func:`abort`. Redis down: no (the local limit still holds); logged once a minute."""
    import redis

    if not registry._health.usable():  # Redis failing: as the registry's publishing, skip
        return False                   # the round trip (each could take socket_timeout)
    try:
        key = _ABORT_KEY.format(prefix=registry.prefix, message_id=message_id)
        # Shielded, as the registry's own publishing: a command cut half-way would leave
        # its reply on a pooled connection for the next command to read. Bounded by the
        # client's socket_timeout (from_url: 1 s).
        with shield():
            return bool(registry.client.delete(key))
    except (redis.RedisError, OSError) as exc:
        now = time.monotonic()
        if now - _warned_at[0] > 60:
            _warned_at[0] = now
            log.warning("early aborts not checked, Redis unavailable: %s", exc)
        return False


def _check_registry(registry: Any, where: str) -> None:
    from .redis import DeadlineRegistry  # redis-py: only where a registry is used

    if not isinstance(registry, DeadlineRegistry):
        raise TypeError(f"{where}: registry must be a timeoutcore.contrib.redis."
                        f"DeadlineRegistry, not {type(registry).__name__}")


def abort(message: Union[str, Any], *, registry: Any,
          abort_ttl: Optional[int] = DEFAULT_ABORT_TTL) -> bool:
    """Abort a message (its id, or the ``Message`` that ``send()`` returned) wherever it
    runs: it stops within milliseconds, fails with :class:`Aborted` and is not retried.

    Returns True if it was running. Otherwise, unless ``abort_ttl`` is 0 or None, the abort
    is kept in Redis for ``abort_ttl`` milliseconds: a message that starts within that time
    (queued, delayed, or waiting for a retry) fails with ``Aborted`` without running.

    The order makes the race with a message starting right now harmless: the worker
    publishes the message, then looks for a kept abort; here the cancel is tried, the abort
    kept, the cancel tried again. Whichever comes first, one of the two finds the other.
    """
    message_id = getattr(message, "message_id", message)
    if not isinstance(message_id, str) or not message_id:
        raise TypeError(f"abort(): a message id (str) or a dramatiq Message, not {message!r}")
    _check_registry(registry, "abort()")
    if abort_ttl is not None and (isinstance(abort_ttl, bool)
                                  or not isinstance(abort_ttl, int) or abort_ttl < 0):
        raise ValueError(f"abort(): abort_ttl must be a whole number of milliseconds >= 0 "
                         f"or None, got {abort_ttl!r}")
    if registry.cancel(message_id):
        return True
    if not abort_ttl:
        return False
    key = _ABORT_KEY.format(prefix=registry.prefix, message_id=message_id)
    registry.client.set(key, b"1", px=abort_ttl)
    if registry.cancel(message_id):
        registry.client.delete(key)
        return True
    return False


def install(broker: Any, **options: Any) -> TimeLimit:
    """Put a :class:`TimeLimit` made with ``options`` in place of the broker's
    ``dramatiq.middleware.TimeLimit`` (same position; appended if there is none) and
    return it. Call it where the broker is made, before the worker boots."""
    ours = TimeLimit(**options)
    position = len(broker.middleware)
    for i, existing in enumerate(list(broker.middleware)):
        if isinstance(existing, (StockTimeLimit, TimeLimit)):
            broker.middleware.remove(existing)
            position = min(position, i)
    broker.add_middleware(ours)  # options, and the actors declared so far
    broker.middleware.remove(ours)
    broker.middleware.insert(min(position, len(broker.middleware)), ours)
    return ours
