"""``to_thread``: ``asyncio.to_thread`` whose cancel stops the thread.

>>> async with asyncio.timeout(0.5):
...     data = await timeoutcore.to_thread(fetch, url)              # stopped at 0.5 s
>>> rows = await timeoutcore.to_thread(query, sql, limit=2.0)       # a hard limit of its own

asyncio forwards a cancel to the executor's future, and a standard future cannot stop work
that has started: the thread runs on, holding the executor's worker. Here the call runs on a
:class:`~timeoutcore.DeadlineExecutor`, whose futures stop running work, so a cancelled
``to_thread`` ends the call in its thread (``DeadlineCancelled`` there; blocking calls too,
with ``timeoutcore.patch()``) and then waits, up to :data:`STOP_WAIT` seconds, until the
thread has left ``fn``: once the ``CancelledError`` reaches the caller, no thread still uses
what the caller passed in.

The executor: the loop's default executor when it is a ``DeadlineExecutor`` (set one with
``loop.set_default_executor(DeadlineExecutor(n))``: plain ``asyncio.to_thread`` and
``loop.run_in_executor(None, ...)`` then stop their threads on a cancel too). A loop that has
no default executor yet gets one, as asyncio would create it (its size), which the loop
shuts down as usual (``asyncio.run`` does). A loop whose default executor is something else
keeps it; ``to_thread`` then uses an executor of its own for that loop, whose idle threads
end when the loop is garbage-collected.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import weakref
from typing import Any, Callable, Optional, TypeVar

from .executor import DeadlineExecutor, DeadlineFuture, Limits

T = TypeVar("T")

log = logging.getLogger("timeoutcore")

#: How long a cancelled :func:`to_thread` waits for its thread to leave ``fn`` before the
#: ``CancelledError`` goes on regardless (with a warning naming ``fn``). Reached only by a
#: call blocked where no interrupt lands: C code holding the GIL, or a blocking call that
#: ``patch()`` does not cover (or ``patch()`` not called).
STOP_WAIT = 5.0

# Loops whose default executor is not a DeadlineExecutor -> the executor used for them.
_own: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, DeadlineExecutor] = (
    weakref.WeakKeyDictionary()
)
_MISSING = object()


def loop_executor(loop: Optional[asyncio.AbstractEventLoop] = None) -> DeadlineExecutor:
    """The ``DeadlineExecutor`` that :func:`to_thread` uses for ``loop`` (default: the
    running loop), made and installed as the loop's default executor if it has none."""
    if loop is None:
        loop = asyncio.get_running_loop()
    # asyncio's loops keep their default executor in _default_executor (None until the
    # first run_in_executor(None, ...)); a loop without that field (uvloop) or with an
    # executor of its own is left alone.
    current = getattr(loop, "_default_executor", _MISSING)
    if isinstance(current, DeadlineExecutor):
        return current
    if current is None and not loop.is_closed():
        executor = DeadlineExecutor(thread_name_prefix="asyncio")
        loop.set_default_executor(executor)
        return executor
    own = _own.get(loop)
    if own is None:
        own = _own[loop] = DeadlineExecutor(thread_name_prefix="timeoutcore-to_thread")
    return own


async def to_thread(fn: Callable[..., T], /, *args: Any, limit: Limits = None,
                    **kwargs: Any) -> T:
    """Run ``fn(*args, **kwargs)`` in a worker thread and return its result, like
    ``asyncio.to_thread`` (the current context is copied into the thread).

    ``limit``: a hard limit for this call (seconds, a ``DeadlinePolicy`` or a mapping of its
    fields); past it the call ends with ``DeadlineExceeded``. When the awaiting task is
    cancelled (``asyncio.timeout``, ``wait_for``, ``task.cancel()``, a failing
    ``TaskGroup``), ``fn`` is stopped in its thread, the call waits (up to
    :data:`STOP_WAIT` seconds) until the thread has left ``fn``, and asyncio's own
    ``CancelledError`` propagates (``asyncio.timeout`` turns it into ``TimeoutError`` as
    usual). Raises ``TypeError``/``ValidationError`` for a bad ``limit`` before anything
    runs.
    """
    loop = asyncio.get_running_loop()
    executor = loop_executor(loop)
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    future: DeadlineFuture[T] = (
        executor.submit(call) if limit is None else executor.submit_with(limit, call)
    )
    try:
        return await asyncio.wrap_future(future, loop=loop)
    except asyncio.CancelledError:
        future.cancel()  # wrap_future has forwarded the cancel already; this is a no-op then
        await _left(loop, future, fn)
        raise


async def _left(loop: asyncio.AbstractEventLoop, future: DeadlineFuture[Any],
                fn: Callable[..., Any]) -> None:
    """Wait (bounded by STOP_WAIT) until no thread runs ``future``'s task."""
    if future.wait_stopped(0):
        return
    left = loop.create_future()

    def tell(_: Any) -> None:  # in the worker thread, once it has left the task
        def done() -> None:
            if not left.done():
                left.set_result(None)

        try:
            loop.call_soon_threadsafe(done)
        except RuntimeError:  # the loop has closed meanwhile: nobody is waiting
            pass

    future.add_stopped_callback(tell)
    _, pending = await asyncio.wait({left}, timeout=STOP_WAIT)
    if pending:
        left.cancel()
        log.warning("timeoutcore.to_thread: %s still runs %.1f s after its cancel (blocked "
                    "where no interrupt reaches it); the cancel goes on without it",
                    getattr(fn, "__qualname__", fn), STOP_WAIT)
