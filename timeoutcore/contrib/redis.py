"""A deadline registry in Redis: see, extend and cancel running jobs from another process.

Worker side::

    registry = DeadlineRegistry.from_url("redis://localhost:6379/0")
    with registry.deadline("job-42", 30, label="ingest") as scope:
        ...                                   # an ordinary thread_deadline(30) block

Coordinator side (any process, any machine)::

    registry.jobs()                 # [JobInfo(job='job-42', remaining=27.1, ...), ...]
    registry.extend("job-42", 60)   # the job may run 60 s longer
    registry.cancel("job-42")       # the job stops now: DeadlineCancelled, status 'cancelled'

How it works. Entering the block publishes a hash ``<prefix>:job:<id>`` (deadline on the
Redis server's clock, label, host, pid, thread) whose TTL is the time left plus ``margin``,
so a worker that dies leaves nothing behind for long, and indexes it in the sorted set
``<prefix>:jobs``; leaving the block deletes both. ``extend`` and ``cancel`` are Lua scripts
that update the hash and PUBLISH on ``<prefix>:control``; each worker process keeps one
subscriber thread on that channel, which reschedules (``scope.reschedule``) or cancels
(``scope.cancel``) the local scope as soon as the message arrives: no polling. Deadlines
travel as durations, so the clocks of worker and coordinator never need to agree.

Connections of your own redis-py pools under deadlines: :func:`protect_pools`
(``timeoutcore.contrib.redis_client``, re-exported here).

Redis being down never breaks a job: the local deadline is the one that stops it. The first
failure is logged once (WARNING, logger ``timeoutcore.redis``), Redis is then left alone
for ``retry_after`` seconds at a time, and its return is logged once (INFO).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import uuid
import weakref
from typing import Any, Optional

from .. import _json
import redis
import redis.connection
from pydantic import BaseModel, ConfigDict

from .. import _fork, _stop
from .._engine import core
from ..scope import DeadlineScope, shield, thread_deadline
from .redis_client import protect_pools

__all__ = ["DeadlineRegistry", "JobInfo", "JobNotFound", "protect_pools"]

log = logging.getLogger("timeoutcore.redis")

_REGISTER = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local deadline = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'job', ARGV[1], 'deadline', string.format('%.6f', deadline),
           'started', string.format('%.6f', now), 'limit', ARGV[2], 'label', ARGV[4],
           'host', ARGV[5], 'pid', ARGV[6], 'thread', ARGV[7], 'state', 'running',
           'token', ARGV[8])
redis.call('PEXPIRE', KEYS[1], math.ceil((tonumber(ARGV[2]) + tonumber(ARGV[3])) * 1000))
redis.call('ZADD', KEYS[2], deadline, ARGV[1])
return 1
"""

_UNREGISTER = """
if redis.call('HGET', KEYS[1], 'token') == ARGV[2] then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
  return 1
end
return 0
"""

_EXTEND = """
local token = redis.call('HGET', KEYS[1], 'token')
if not token then return false end
if redis.call('HGET', KEYS[1], 'state') == 'cancelling' then return 'cancelling' end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local deadline = tonumber(redis.call('HGET', KEYS[1], 'deadline')) + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'deadline', string.format('%.6f', deadline))
local version = redis.call('HINCRBY', KEYS[1], 'extends', 1)
redis.call('HINCRBYFLOAT', KEYS[1], 'extended', ARGV[2])
redis.call('PEXPIRE', KEYS[1], math.max(1, math.ceil((deadline - now + tonumber(ARGV[3])) * 1000)))
redis.call('ZADD', KEYS[2], deadline, ARGV[1])
redis.call('PUBLISH', ARGV[4], cjson.encode({op='extend', job=ARGV[1], token=token,
                                             seconds=tonumber(ARGV[2]), n=version}))
return string.format('%.6f', deadline - now)
"""

_CANCEL = """
local token = redis.call('HGET', KEYS[1], 'token')
if not token then return 0 end
redis.call('HSET', KEYS[1], 'state', 'cancelling')
redis.call('PUBLISH', ARGV[2], cjson.encode({op='cancel', job=ARGV[1], token=token}))
return 1
"""


class JobNotFound(KeyError):
    """No live job under this id (it finished, was never registered, or its key expired)."""


class JobInfo(BaseModel):
    """A live job as the registry sees it. Times are on the Redis server's clock (Unix
    seconds); ``remaining`` is computed against that clock when the list was read."""

    model_config = ConfigDict(frozen=True)

    job: str
    label: Optional[str]
    host: str
    pid: int
    thread: str
    limit: float
    started: float
    deadline: float
    remaining: float
    state: str  # "running", or "cancelling" once cancel() was sent


class _Health:
    """Logs the first failure and the recovery once each; tells when to try Redis again."""

    def __init__(self, retry_after: float) -> None:
        self.retry_after = retry_after
        self._lock = threading.Lock()
        self._down_since: Optional[float] = None
        self._retry_at = 0.0

    def usable(self) -> bool:
        return self._down_since is None or time.monotonic() >= self._retry_at

    def failed(self, what: str, exc: BaseException) -> None:
        with self._lock:
            now = time.monotonic()
            self._retry_at = now + self.retry_after
            if self._down_since is None:
                self._down_since = now
                log.warning("Redis deadline registry unavailable (%s: %s); jobs keep their "
                            "local deadlines, no further failures are logged until it is back",
                            what, exc)

    def ok(self) -> None:
        if self._down_since is None:
            return
        with self._lock:
            if self._down_since is not None:
                log.info("Redis deadline registry reachable again after %.1f s",
                         time.monotonic() - self._down_since)
                self._down_since = None


class _Entry:
    """One entry of a scope into its block under a job id."""

    __slots__ = ("job", "token", "scope", "published", "extends", "extended")

    def __init__(self, job: str, scope: Any) -> None:
        self.job = job
        self.token = uuid.uuid4().hex  # tells this entry from any other under the same id
        self.scope = scope
        self.published = False
        # How many extensions this scope already has (the key's `extends` counter, set by
        # every extend): an extend message is a delta, so one that a resync after a
        # (re)subscribe already counted must not be added a second time.
        self.extends = 0
        # The seconds of extension applied to this scope here: a resync puts its deadline
        # at (its deadline - these) + the seconds the key says it was extended by --
        # seconds counted on both sides, so no mapping between this host's clock and the
        # server's moves it.
        self.extended = 0.0


class _Registration:
    """The registry's observer (``observer=`` of thread_deadline) for one job id; the same
    observer may serve many entries (the decorator form makes a scope per call)."""

    __slots__ = ("registry", "job")

    def __init__(self, registry: DeadlineRegistry, job: str) -> None:
        self.registry = registry
        self.job = job

    def on_enter(self, scope: Any) -> None:
        self.registry._enter(self.job, scope)

    def on_exit(self, scope: Any) -> None:
        self.registry._exit(scope)


_registries: weakref.WeakSet[DeadlineRegistry] = weakref.WeakSet()


class DeadlineRegistry:
    """Publishes guarded blocks' deadlines in Redis under job ids; lists, extends and
    cancels them from anywhere.

    ``client``: a ``redis.Redis`` (decode_responses must be off, the default) or use
    :meth:`from_url`. ``prefix`` namespaces the keys and the control channel; ``margin``
    (seconds) is how long a job's key outlives its deadline if the worker never deletes it;
    ``retry_after`` (seconds) is how long Redis is left alone after a failure.
    """

    def __init__(self, client: redis.Redis, *, prefix: str = "timeoutcore",
                 margin: float = 5.0, retry_after: float = 1.0) -> None:
        if not isinstance(client, redis.Redis):
            raise TypeError(f"DeadlineRegistry needs a redis.Redis client, not "
                            f"{type(client).__name__}")
        kwargs = client.connection_pool.connection_kwargs
        if not kwargs.get("socket_timeout"):
            raise ValueError(
                "DeadlineRegistry: the client needs socket_timeout=<seconds> (for instance "
                "redis.Redis(..., socket_timeout=1.0)), or a hung Redis could hold a job "
                "past its deadline; from_url() sets one")
        if not isinstance(prefix, str) or not prefix:
            raise ValueError("DeadlineRegistry: prefix must be a non-empty string")
        for name, value in (("margin", margin), ("retry_after", retry_after)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"DeadlineRegistry: {name} must be a number of seconds")
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"DeadlineRegistry: {name} must be a positive finite number "
                                 f"of seconds, got {value!r}")
        self.client = client
        self.prefix = prefix
        self.margin = float(margin)
        self.channel = f"{prefix}:control"
        self._index = f"{prefix}:jobs"
        self._health = _Health(float(retry_after))
        self._register = client.register_script(_REGISTER)
        self._unregister = client.register_script(_UNREGISTER)
        self._extend = client.register_script(_EXTEND)
        self._cancel = client.register_script(_CANCEL)
        self._lock = threading.Lock()
        self._local: dict[str, _Entry] = {}  # job id -> its running entry in this process
        self._entries: dict[int, _Entry] = {}  # id(scope) -> entry, while the scope runs
        self._listener: Optional[threading.Thread] = None
        self._pubsub: Any = None
        self._subscribed = threading.Event()
        self._stop = threading.Event()
        self._host = socket.gethostname()
        _registries.add(self)

    @classmethod
    def from_url(cls, url: str, *, socket_timeout: float = 1.0, **kwargs: Any) -> DeadlineRegistry:
        """A registry with its own client for ``url``; Redis calls give up after
        ``socket_timeout`` seconds (connecting included), so a dead server costs a job at
        most that, once per ``retry_after``."""
        client = redis.Redis.from_url(url, socket_timeout=socket_timeout,
                                      socket_connect_timeout=socket_timeout)
        return cls(client, **kwargs)

    # -- worker side -------------------------------------------------------------------

    def deadline(self, job: str, seconds: float, **kwargs: Any) -> DeadlineScope:
        """``thread_deadline(seconds, **kwargs)`` published under ``job`` while it runs
        (the label defaults to the job id). Cancelled remotely, its block raises
        ``DeadlineCancelled`` and its result's status is ``cancelled``. ``seconds`` may not
        be None: the deadline is what bounds the life of the job's key."""
        if seconds is None:
            raise ValueError("DeadlineRegistry.deadline(): a registered job needs a deadline "
                             "(seconds), which also bounds its key's TTL")
        return thread_deadline(seconds, **self.scope_options(job, **kwargs))

    def scope_options(self, job: str, **kwargs: Any) -> dict[str, Any]:
        """The keyword arguments that make any thread_deadline(...) publish under ``job``."""
        if not isinstance(job, str) or not job:
            raise ValueError("DeadlineRegistry: the job id must be a non-empty string")
        if "observer" in kwargs:
            raise TypeError("DeadlineRegistry: observer= is the registry's own")
        kwargs.setdefault("label", job)
        return dict(kwargs, observer=_Registration(self, job))

    def _enter(self, job: str, scope: Any) -> None:
        entry = _Entry(job, scope)
        with self._lock:
            self._local[job] = entry
            self._entries[id(scope)] = entry
        try:
            with shield():  # an enclosing deadline waits until the job is published...
                # Armed before it is published: a cancel sent the moment it is listed
                # stops it from the subscriber's socket, without the GIL (_await_message).
                core.remote_arm(scope, entry.token)
                self._publish(entry)
        except BaseException:
            with shield():  # ...and then the scope is not entered: take it back
                self._withdraw(scope)
            raise

    def _publish(self, entry: _Entry) -> None:
        if not self._health.usable():
            return
        self._ensure_listener()
        # Not needed for correctness (a (re)subscribed listener re-reads its jobs, so a
        # cancel/extend sent before it listened still applies), only to apply it at once;
        # kept short so a reconnecting listener costs a job little.
        self._subscribed.wait(0.1)
        remaining = entry.scope.remaining()
        if remaining is None:  # scope_options() on a scope without a deadline
            log.warning("job %r has no deadline: not published", entry.job)
            return
        try:
            self._register(
                keys=[self._key(entry.job), self._index],
                args=[entry.job, f"{max(remaining, 0.0):.6f}", f"{self.margin:.6f}",
                      entry.scope.label or "", self._host, os.getpid(),
                      threading.current_thread().name, entry.token])
        except (redis.RedisError, OSError) as exc:
            self._health.failed("publishing a job", exc)
            return
        entry.published = True
        self._health.ok()

    def _exit(self, scope: Any) -> None:
        self._withdraw(scope)

    def _withdraw(self, scope: Any) -> None:
        with self._lock:
            entry = self._entries.pop(id(scope), None)
            if entry is not None and self._local.get(entry.job) is entry:
                del self._local[entry.job]
        if entry is not None:
            core.remote_disarm(scope)
        if entry is None or not entry.published or not self._health.usable():
            return  # not in Redis, or Redis is down: the key's TTL removes it
        try:
            self._unregister(keys=[self._key(entry.job), self._index],
                             args=[entry.job, entry.token])
        except (redis.RedisError, OSError) as exc:
            self._health.failed("removing a finished job", exc)
            return
        self._health.ok()

    def _ensure_listener(self) -> None:
        if self._listener is not None and self._listener.is_alive():
            return
        with self._lock:
            if self._listener is not None and self._listener.is_alive():
                return
            self._stop.clear()
            self._listener = threading.Thread(target=self._listen, daemon=True,
                                              name=f"timeoutcore-registry:{self.prefix}")
            self._listener.start()

    def _subscriber_client(self) -> redis.Redis:
        """A client like ``self.client`` whose connections block in reads without a
        timeout: the subscriber waits in one blocking ``recv`` (one GIL hand-over when a
        message arrives, where polling with a timeout takes two). TCP keepalive is on; a
        server that goes away resets the connection."""
        pool = self.client.connection_pool
        kwargs = dict(pool.connection_kwargs, socket_timeout=None)
        if issubclass(pool.connection_class, redis.connection.Connection):
            kwargs["socket_keepalive"] = True
        return redis.Redis(connection_pool=redis.ConnectionPool(
            connection_class=pool.connection_class, **kwargs))

    def _listen(self) -> None:
        """The subscriber thread: applies extend/cancel to this process's scopes."""
        backoff = 0.05
        client = self._subscriber_client()
        while not self._stop.is_set():
            pubsub = self._pubsub = client.pubsub()
            try:
                pubsub.subscribe(self.channel)
                while not self._stop.is_set():
                    if not self._await_message(pubsub):
                        continue
                    # Blocks until a message comes; close() wakes it. redis-py documents and
                    # implements timeout=None as "wait indefinitely" (one blocking read),
                    # but annotates the parameter as float.
                    message = pubsub.get_message(timeout=None)  # type: ignore[arg-type]
                    if message is None:
                        continue
                    if message["type"] == "subscribe":
                        self._subscribed.set()
                        backoff = 0.05
                        self._health.ok()
                        self._resync()
                    elif message["type"] == "message":
                        try:
                            self._apply(message["data"])
                        except Exception:  # noqa: BLE001 - the listener must survive
                            log.exception("control message %r not applied", message["data"])
            except (redis.RedisError, OSError, ValueError) as exc:
                self._subscribed.clear()
                if self._stop.is_set():
                    break
                self._health.failed("listening for extend/cancel", exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self._health.retry_after)
            finally:
                self._pubsub = None
                try:
                    pubsub.close()
                except Exception:  # noqa: BLE001 - a dead link, or close() got there first
                    pass
        self._subscribed.clear()
        client.close()

    def _await_message(self, pubsub: Any) -> bool:
        """Wait until the subscription has something to read: True when it has (or when
        its socket cannot be reached: the blocking read then waits, as it would anyway),
        False after a second without (the caller checks ``_stop`` and comes again).

        Why not just block in the read: when a message arrives while the job to cancel
        spins in Python, the subscriber must get the GIL back, and a plain read waits a
        whole switch interval (5 ms by default) before the spinning thread is even asked
        to let go. ``core.wait_readable`` waits outside the GIL and takes it back in the
        fast window (native engine), a fraction of a millisecond. And before that, still
        without the GIL, it looks at the queued bytes (``control=True``): a cancel for a
        job of this process (armed in ``_enter``) stops it at once -- the watchdog fires
        it like a passed deadline -- and the message read here afterwards finds the job
        stopped already (csrc/accel_remote_relay.c)."""
        connection = pubsub.connection
        sock = getattr(connection, "_sock", None)  # redis-py's socket; absent: no urgency
        if sock is None or connection.can_read(timeout=0):  # a message already buffered
            return True
        fd = sock.fileno()
        return fd < 0 or core.wait_readable(fd, 1.0, True)

    def _apply(self, data: bytes) -> None:
        try:
            msg = _json.loads(data)
            job, token, op = msg["job"], msg["token"], msg["op"]
            if not (isinstance(job, str) and isinstance(token, str) and op in ("cancel", "extend")):
                raise TypeError
            seconds = float(msg["seconds"]) if op == "extend" else 0.0
            n = int(msg.get("n", 0)) if op == "extend" else 0
        except (KeyError, TypeError, ValueError):  # ValueError: JSONDecodeError of either engine
            log.warning("ignoring a malformed control message: %r", data[:200])
            return
        with self._lock:
            entry = self._local.get(job)
        if entry is None or entry.token != token:
            return  # another process's job, or one that has ended
        if op == "cancel":
            entry.scope.cancel()
            # The subscriber's wait may have cancelled the scope already, without the GIL
            # (csrc/accel_remote_relay.c): then cancel() found it expired and returned, and nothing
            # told the job's patched waits (a socket read, a subprocess wait) that their stop
            # time moved -- they ran on to the old deadline. Wake them either way: a wait
            # woken for nothing re-reads its stop time and goes on.
            _stop.wake(entry.scope.thread_ident)
        elif n == 0 or n > entry.extends:
            entry.extends = max(entry.extends, n)
            self._extend_local(entry, seconds)

    @staticmethod
    def _extend_local(entry: _Entry, seconds: float) -> None:
        scope = entry.scope
        when = scope.when()
        for _ in range(100):  # the message can beat the arming of a scope being entered
            if when is not None or scope.exited_at is not None:
                break
            time.sleep(0.001)
            when = scope.when()
        if when is None or scope.expired() or getattr(scope, "_cancelled", False):
            return
        try:
            scope.reschedule(when + seconds)
        except RuntimeError:
            return  # the block exited meanwhile
        entry.extended += seconds

    def _resync(self) -> None:
        """After (re)subscribing: apply what was sent while nobody listened."""
        with self._lock:
            entries = list(self._local.values())
        if not entries:
            return
        pipe = self.client.pipeline(transaction=False)
        pipe.time()
        for entry in entries:
            pipe.hmget(self._key(entry.job), ["token", "state", "deadline", "extends", "extended"])
        (sec, usec), *rows = pipe.execute()
        server_now = sec + usec / 1e6
        for entry, (token, state, deadline, extends, extended) in zip(entries, rows):
            if token is None or token.decode() != entry.token:
                continue
            if state == b"cancelling":
                entry.scope.cancel()
                continue
            when = entry.scope.when()
            if when is None or deadline is None or entry.scope.expired():
                continue
            if extended is not None:
                # Exact: mapping the key's deadline onto this host's clock (below) is off
                # by the round trips and by how long the key was written before the scope
                # was armed, and once put a deadline 0.6 ms before the one the extensions
                # gave (a resync right after the first subscription, on a loaded machine).
                published = when - entry.extended + float(extended)
            else:  # a key written by an older version
                published = time.monotonic() + float(deadline) - server_now
            entry.extends = max(entry.extends, int(extends or 0))  # counted in `published`
            if published > when + 0.001:  # extended while the subscription was down
                try:
                    entry.scope.reschedule(published)
                except RuntimeError:
                    continue
                if extended is not None:
                    entry.extended = float(extended)

    def close(self) -> None:
        """Stop this process's subscriber thread (running blocks keep their local
        deadlines). The registry starts it again if used afterwards."""
        self._stop.set()
        pubsub = self._pubsub
        connection = getattr(pubsub, "connection", None)
        if connection is not None:
            try:  # shut the socket down: the blocked read returns, the listener cleans up
                connection.disconnect()
            except Exception:  # noqa: BLE001 - racing the listener's own clean-up
                pass
        listener = self._listener
        if listener is not None and listener is not threading.current_thread():
            listener.join(5)
        self._listener = None

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        self._health = _Health(self._health.retry_after)
        self._local = {}
        self._entries = {}
        self._listener = None
        self._pubsub = None
        self._subscribed = threading.Event()
        self._stop = threading.Event()

    # -- coordinator side --------------------------------------------------------------

    def jobs(self) -> list[JobInfo]:
        """The live jobs, earliest deadline first. Index entries whose key has expired
        (a worker that died) are dropped on the way."""
        pipe = self.client.pipeline(transaction=False)
        pipe.time()
        pipe.zrange(self._index, 0, -1)
        (sec, usec), ids = pipe.execute()
        now = sec + usec / 1e6
        if not ids:
            return []
        pipe = self.client.pipeline(transaction=False)
        for job in ids:
            pipe.hgetall(self._key(job.decode()))
        found: list[JobInfo] = []
        stale: list[bytes] = []
        for job, fields in zip(ids, pipe.execute()):
            if not fields:
                stale.append(job)
                continue
            found.append(self._info(fields, now))
        if stale:
            self.client.zrem(self._index, *stale)
        return found

    def get(self, job: str) -> Optional[JobInfo]:
        """One live job, or None."""
        pipe = self.client.pipeline(transaction=False)
        pipe.time()
        pipe.hgetall(self._key(job))
        (sec, usec), fields = pipe.execute()
        return self._info(fields, sec + usec / 1e6) if fields else None

    def extend(self, job: str, seconds: float) -> float:
        """Give ``job`` ``seconds`` more; returns the seconds it now has left. Raises
        :class:`JobNotFound` if it is not live."""
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise TypeError(f"extend(): seconds must be a number, not {type(seconds).__name__}")
        if not math.isfinite(seconds) or seconds <= 0:
            raise ValueError(f"extend(): seconds must be a positive finite number, got {seconds!r}")
        left = self._extend(keys=[self._key(job), self._index],
                            args=[job, f"{float(seconds):.6f}", f"{self.margin:.6f}", self.channel])
        if left is None:
            raise JobNotFound(job)
        if left == b"cancelling":
            raise JobNotFound(f"{job} is being cancelled")
        return float(left)

    def cancel(self, job: str) -> bool:
        """Stop ``job`` wherever it runs: its block raises ``DeadlineCancelled`` and its
        result's status is ``cancelled``. False if no such job is live. The cancel is
        recorded in the job's key too: a worker whose subscription was down applies it
        when it is back. A job being cancelled cannot be extended."""
        return bool(self._cancel(keys=[self._key(job)], args=[job, self.channel]))

    # -- helpers -------------------------------------------------------------------------

    def _key(self, job: str) -> str:
        return f"{self.prefix}:job:{job}"

    @staticmethod
    def _info(fields: dict[bytes, bytes], now: float) -> JobInfo:
        f = {k.decode(): v.decode() for k, v in fields.items()}
        deadline = float(f["deadline"])
        return JobInfo(job=f["job"], label=f.get("label") or None, host=f["host"],
                       pid=int(f["pid"]), thread=f["thread"], limit=float(f["limit"]),
                       started=float(f["started"]), deadline=deadline,
                       remaining=deadline - now, state=f.get("state", "running"))


def _after_fork_in_child() -> None:
    for registry in list(_registries):
        registry._after_fork_in_child()


_fork.register(_fork.CONTRIB, after_in_child=_after_fork_in_child)
