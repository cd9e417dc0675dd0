"""redis-py's connection pools under deadlines: a stopped command gives its connection back.

redis-py takes a connection from its pool and gives it back in plain Python, several lines
apart: ``Redis`` runs ``conn = pool.get_connection()``, then a few statements, then its
``try:``/``finally: pool.release(conn)``; ``Pipeline.execute`` and ``PubSub.execute_command``
store the connection on themselves a line after taking it; the pools' own
``get_connection()``/``release()`` take it out of (or put it into) their bookkeeping
several statements before they are done; an abandoned pipeline or pub/sub gives its
connection back from its ``__del__``. A deadline's interrupt that surfaces in any of
those gaps leaves a connection that nobody will give back: a ``BlockingConnectionPool`` of
2 then waits in vain (``ConnectionError: No connection available``), a ``ConnectionPool``
grows until ``MaxConnectionsError``. A ``Pipeline.reset()`` interrupted between its
``release()`` and ``self.connection = None`` is worse: the pipeline's ``with`` releases the
same connection again and two threads end up sharing it (``InvalidResponse``,
``ResponseError``, replies meant for the other thread).

:func:`protect_pools` marks those functions as protected code (``timeoutcore.protected``:
the interrupt never surfaces while one of them is on the thread's stack). What stays
stoppable, and where it stops:

* a command waiting for Redis (a socket read or write, ``BLPOP``, a connect) under
  ``timeoutcore.patch()``: the patched wait is an explicit point, which raises even in
  protected code, at the stop time; redis-py's own handlers (``except BaseException``)
  disconnect the connection and the ``finally`` gives it back: the pool keeps it,
  disconnected, and the next command reconnects;
* a wait for a free connection in a ``BlockingConnectionPool`` under ``patch()``: the
  queue's wait ends at the stop time, having taken nothing;
* everything else -- the Python-level parsing of a reply, the retry logic -- is held back
  until the command returns (at most one command's Python work; a hold longer than 50 ms is
  logged like any deferral). Without ``patch()`` a socket wait is not stopped anyway
  (the docs' "What a deadline can interrupt"), so the interrupt surfaces when the command
  returns.

One gap protection cannot close: a ``WATCH``ing pipeline's ``reset()`` (the exit of its
``with``, the end of ``transaction()``) sends ``UNWATCH`` and reads the reply before it
gives the connection back. After a stop that read is an explicit point too and raises at
once, so ``reset()`` ends before its ``release()``; the pipeline keeps the connection
until it is collected -- in a reference cycle with the traceback, that is the garbage
collector's next run. So :func:`protect_pools` also wraps ``Pipeline.reset``: when the
original raises with the connection still taken, the wrapper disconnects it (the reply is
unread; a closed connection has no ``WATCH`` left on the server, as redis-py does itself
after a ``ConnectionError`` there), gives it back, finishes the reset without I/O and
re-raises.

Rejected: protecting the whole ``redis`` package (``protect_module``) -- it would also
protect your code that redis-py calls (a ``transaction()`` function, pub/sub message
handlers) and gains nothing for the pools; wrapping the pool methods in ``shield()`` --
that would hold back the explicit points too, so a blocked ``BLPOP`` or a connect to a dead
host would run to redis-py's own timeout.

Not covered: ``RedisCluster`` and its pipelines, ``Monitor``, ``redis.asyncio``, and pool or
client subclasses of your own that override these methods (protect them the same way with
``@timeoutcore.protected``).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import threading
import types
from typing import Any, Callable

from ..protect import protected

__all__ = ["protect_pools"]

#: (module, class, method, required): the functions between a connection's checkout and
#: its return. Required ones exist in every redis-py the extra allows (>= 4.5); a missing
#: one means a layout this helper does not know, and protecting the rest would be a false
#: promise. ``Redis._execute_command`` carries the body of ``execute_command`` from 5.1 on.
_TARGETS: tuple[tuple[str, str, str, bool], ...] = (
    ("redis.connection", "ConnectionPool", "get_connection", True),
    ("redis.connection", "ConnectionPool", "release", True),
    ("redis.connection", "BlockingConnectionPool", "get_connection", True),
    ("redis.connection", "BlockingConnectionPool", "release", True),
    ("redis.client", "Redis", "execute_command", True),
    ("redis.client", "Redis", "_execute_command", False),
    ("redis.client", "Redis", "close", True),
    ("redis.client", "Pipeline", "execute", True),
    ("redis.client", "Pipeline", "immediate_execute_command", True),
    ("redis.client", "Pipeline", "reset", True),
    ("redis.client", "PubSub", "execute_command", True),
    ("redis.client", "PubSub", "reset", True),
    # The finalizers give back what an abandoned client, pipeline or pub/sub still holds
    # (``try: self.reset() except Exception: pass``): an interrupt surfacing before their
    # reset would lose that connection with the object.
    ("redis.client", "Redis", "__del__", False),
    ("redis.client", "Pipeline", "__del__", False),
    ("redis.client", "PubSub", "__del__", False),
)

_lock = threading.Lock()
_done: tuple[str, ...] = ()


def _function(module: str, cls: str, name: str) -> types.FunctionType | None:
    owner = getattr(importlib.import_module(module), cls)
    attr = owner.__dict__.get(name)  # the class's own: an inherited one is its base's entry
    if attr is None:
        return None
    # Under redis-py's @deprecated_args wrapper (get_connection): the wrapper's frame only
    # calls and returns on one line, and its code object is shared by every decorated
    # function, so the wrapped function is the one to protect.
    fn = inspect.unwrap(attr)
    return fn if isinstance(fn, types.FunctionType) else None


def _releasing_reset(original: Callable[[Any], None]) -> Callable[[Any], None]:
    """``Pipeline.reset`` that gives the connection back when the original is stopped
    half-way (in its ``UNWATCH``; the module docstring)."""

    @functools.wraps(original)
    def reset(self: Any) -> None:
        try:
            original(self)
        except BaseException:
            conn, self.connection = self.connection, None
            if conn is not None:
                conn.disconnect()  # the UNWATCH reply is unread: the connection is spent
                self.connection_pool.release(conn)
            original(self)  # the rest of the reset: no connection, so no I/O to stop
            raise

    reset.__timeoutcore_releasing__ = True  # type: ignore[attr-defined]
    return reset


def protect_pools() -> tuple[str, ...]:
    """Protect redis-py's connection checkout and return paths (the module docstring), so a
    command, pipeline or pub/sub call stopped by a deadline, ``cancel()`` or soft exception
    always leaves its connection to the pool. Call it once at start-up, before the first
    guarded command; later calls do nothing. Under ``timeoutcore.patch()`` a command
    blocked on the network still stops at the stop time. ``Pipeline.reset`` is also
    wrapped to give the connection back when its ``UNWATCH`` is stopped.

    Returns the qualified names of the protected functions (``"redis.connection.
    BlockingConnectionPool.release"``, ...). ``ImportError`` where redis-py is not
    installed; ``RuntimeError`` naming the functions not found in a redis-py whose layout
    differs (nothing is protected then)."""
    global _done
    with _lock:
        if _done:
            return _done
        found: list[tuple[str, types.FunctionType]] = []
        missing: list[str] = []
        for module, cls, name, required in _TARGETS:
            qualname = f"{module}.{cls}.{name}"
            fn = _function(module, cls, name)
            if fn is not None:
                found.append((qualname, fn))
            elif required:
                missing.append(qualname)
        if missing:
            import redis

            raise RuntimeError(
                f"protect_pools(): redis-py {getattr(redis, '__version__', '?')} has no "
                f"{', '.join(missing)}; its connection handling is not the one this helper "
                f"knows, nothing was protected")
        for _, fn in found:
            protected(fn)
        pipeline = importlib.import_module("redis.client").Pipeline
        if not getattr(pipeline.reset, "__timeoutcore_releasing__", False):
            pipeline.reset = protected(_releasing_reset(pipeline.reset))
        _done = tuple(qualname for qualname, _ in found)
        return _done
