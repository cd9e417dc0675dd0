"""``run_sync``: anyio's ``to_thread.run_sync`` whose cancellation stops the thread.

>>> with anyio.move_on_after(0.5):
...     await timeoutcore.contrib.anyio.run_sync(blocking_io, arg)     # stopped at 0.5 s

anyio's own ``to_thread.run_sync`` either shields the caller from the cancellation until the
thread returns by itself, or (``abandon_on_cancel=True``) returns at once, gives the
limiter's token back and leaves the thread running. Here a cancellation (a ``CancelScope``,
``move_on_after``, ``fail_after``, a failing task group) stops the call in its thread
(``DeadlineCancelled`` there; blocking calls too, with ``timeoutcore.patch()``); the caller
then sees anyio's own cancellation once the thread has left the call, and only then is the
limiter's token released, so a ``CapacityLimiter`` still counts every thread at work.

The call runs on anyio's worker threads, as ``to_thread.run_sync`` does (so
``anyio.from_thread`` works inside it), on every backend anyio supports.
"""

from __future__ import annotations

import asyncio
import math
import threading
from typing import Any, Callable, Optional, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from ..executor import Limits, _factory, as_policy

T = TypeVar("T")

#: The reason a cancelled call's scope carries (``DeadlineCancelled.reason`` in the thread).
REASON = "anyio cancelled"

#: How long a cancelled :func:`run_sync` waits for its thread to leave ``fn`` before anyio's
#: cancellation goes on regardless. Reached only by a call blocked where no interrupt
#: lands (C code holding the GIL, a wait that ``patch()`` does not cover); the limiter's
#: token stays taken until that thread is free all the same.
STOP_WAIT = 5.0

_QUEUED, _RUNNING, _LEFT = 0, 1, 2

# anyio's own function, taken at import: contrib.asgi replaces the module attribute with a
# wrapper, which neither this module nor the wrapper itself may call back.
anyio_run_sync = anyio.to_thread.run_sync

_NO_LIMIT = _factory(None)  # a scope without a deadline of its own, which cancel() can stop

# anyio's own limiter is bypassed (our token is taken on the call's behalf, see run_sync):
# the call goes through to_thread.run_sync with an unbounded one, which never makes it wait
# and so is tied to no event loop: one serves every asyncio loop. Rejected for asyncio: an
# anyio RunVar (one per loop) -- its look-up cost more than the rest of the call's own
# bookkeeping together; other backends (trio) keep one per run that way.
_asyncio_unbounded: list[anyio.CapacityLimiter] = []
_other_unbounded: anyio.lowlevel.RunVar[anyio.CapacityLimiter] = anyio.lowlevel.RunVar(
    "timeoutcore_unbounded_limiter")


class _Call:
    """One call's meeting point between the event loop and its worker thread."""

    __slots__ = ("lock", "state", "scope", "cancelled", "on_left")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.state = _QUEUED
        self.scope: Any = None  # the call's scope while the thread runs fn
        self.cancelled = False  # the caller was cancelled: stop fn, or never start it
        self.on_left: Optional[Callable[[], object]] = None  # run on the loop once fn left

    def cancel(self, on_left: Callable[[], object]) -> bool:
        """Stop the call; True if a thread is in ``fn`` (``on_left`` then runs on the
        loop once it has left), False if none is or ever will be."""
        # Rule: the flag, the state and the scope are read and written under one lock
        # with the thread's entry into and exit from fn, so a cancel either stops the
        # running call (and is told when it has left), or keeps it from starting, or finds
        # it over; a scope that has exited ignores cancel().
        with self.lock:
            self.cancelled = True
            running = self.state == _RUNNING
            if running:
                self.on_left = on_left
            scope = self.scope
        if scope is not None:
            scope.cancel(REASON)
        return running


def _in_thread(call: _Call, make: Callable[[], Any], fn: Callable[..., T],
               args: tuple[Any, ...]) -> Optional[T]:
    scope = make()
    with call.lock:
        if call.cancelled:  # the caller is gone: fn never starts
            call.state = _LEFT
            return None
        call.state = _RUNNING
        call.scope = scope
    try:
        with scope:
            return fn(*args)
    finally:
        with call.lock:
            call.state = _LEFT
            call.scope = None
            on_left = call.on_left
        if on_left is not None:
            try:
                anyio.from_thread.run_sync(on_left)
            except RuntimeError:  # the event loop has ended: nothing is waiting any more
                pass


def _unbounded_limiter() -> anyio.CapacityLimiter:
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # trio
        try:
            return _other_unbounded.get()
        except LookupError:
            limiter = anyio.CapacityLimiter(math.inf)
            _other_unbounded.set(limiter)
            return limiter
    if not _asyncio_unbounded:
        _asyncio_unbounded.append(anyio.CapacityLimiter(math.inf))
    return _asyncio_unbounded[0]


async def run_sync(fn: Callable[..., T], /, *args: Any, limiter: Optional[anyio.CapacityLimiter]
                   = None, limit: Limits = None) -> T:
    """Call ``fn(*args)`` in one of anyio's worker threads and return its result.

    ``limiter``: the ``CapacityLimiter`` to take a token from (default: anyio's default
    thread limiter); the token is held until the thread has left ``fn`` -- after a
    cancellation too. ``limit``: a hard limit for the call (seconds, a ``DeadlinePolicy`` or
    a mapping of its fields); past it the call raises ``DeadlineExceeded``. When the caller
    is cancelled, ``fn`` is stopped in its thread and the caller gets anyio's own
    cancellation exception once the thread has left ``fn`` (after at most
    :data:`STOP_WAIT` seconds). A bad ``limit`` raises ``TypeError``/``ValidationError``
    before anything runs.
    """
    make = _NO_LIMIT if limit is None else _factory(as_policy(limit, None))
    return await run_in_scope(fn, args, make, limiter=limiter, stop_wait=STOP_WAIT)


async def run_in_scope(fn: Callable[..., T], args: tuple[Any, ...], make: Callable[[], Any], *,
                       limiter: Optional[anyio.CapacityLimiter], stop_wait: float) -> T:
    """:func:`run_sync` with the call's scope made by ``make()`` in the worker thread, and
    ``stop_wait`` in place of :data:`STOP_WAIT`."""
    if limiter is None:
        limiter = anyio.to_thread.current_default_thread_limiter()
    unbounded = _unbounded_limiter()
    call = _Call()
    try:
        # Without a checkpoint when a token is free (anyio's run_sync below has its own):
        # the awaiting form yields to the loop once more even then.
        limiter.acquire_on_behalf_of_nowait(call)
    except anyio.WouldBlock:
        await limiter.acquire_on_behalf_of(call)
    # Rejected: anyio's run_sync with its default shield and a watcher task beside it that
    # hears the cancellation -- a task group per call doubled the cost of a call.
    # abandon_on_cancel=True lets the cancellation end the await at once; the token, taken
    # on the call's behalf, is given back only once no thread runs fn.
    try:
        value = await anyio_run_sync(_in_thread, call, make, fn, args,
                                     abandon_on_cancel=True, limiter=unbounded)
    except anyio.get_cancelled_exc_class():
        left = anyio.Event()

        def on_left() -> None:  # on the loop
            limiter.release_on_behalf_of(call)
            left.set()

        if not call.cancel(on_left):
            limiter.release_on_behalf_of(call)
            raise
        with anyio.move_on_after(stop_wait, shield=True):
            await left.wait()
        raise
    except BaseException:
        limiter.release_on_behalf_of(call)
        raise
    limiter.release_on_behalf_of(call)
    return value  # type: ignore[return-value]
