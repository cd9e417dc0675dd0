"""Per-request deadlines for ASGI apps (Starlette, FastAPI), sync endpoints included.

>>> app = FastAPI()
>>> app.add_middleware(DeadlineMiddleware, seconds=2.0)

A request still running at its deadline is stopped: async endpoints are cancelled, and the
sync endpoints and sync dependencies that Starlette/FastAPI run in anyio's thread pool are
stopped *in their threads* (a CPU loop at its next bytecode; ``time.sleep``, socket reads,
queue waits, subprocesses once ``timeoutcore.patch()`` has been called; a PostgreSQL query
through ``timeoutcore.contrib.db.guard``). The pool's tokens come back as soon as the threads
are free. The client gets ``status`` (504) if no response has started; a response already
under way is cut off (the server closes the connection), never completed as if whole.

How the deadline reaches the threads: the middleware sets a context variable for the
request, and ``anyio.to_thread.run_sync`` -- the one door through which Starlette's
``run_in_threadpool``/``iterate_in_threadpool`` and FastAPI's sync endpoints and
dependencies enter a thread -- is wrapped, once, when the first middleware is built: a call
made in a request's context runs in its thread under the request's own deadline, so the
thread stops by itself at that deadline and anyio gives the pool token back when the
thread returns; any other call goes to anyio's function untouched.

Once the response is complete (its last body message sent), the request's deadline is
lifted: Starlette's background tasks run after that, without it.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import math
import time
from collections.abc import Awaitable, Mapping, MutableMapping
from typing import Any, Callable, Optional, TypeVar

import anyio
import anyio.to_thread

from .. import _validate
from ..errors import DeadlineExceeded
from ..scope import thread_deadline_at
from ._loop_deadlines import Entry, LoopDeadlines
from .anyio import anyio_run_sync

T = TypeVar("T")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger("timeoutcore")


class _Request:
    """The deadline of the request being served, as the context variable carries it."""

    __slots__ = ("deadline", "label", "active", "lift", "entry", "deadlines", "hit")

    def __init__(self, deadline: float, label: str) -> None:
        self.deadline = deadline  # time.monotonic()
        self.label = label  # "GET /path": the scope label of its thread calls
        self.active = True  # False once the response is complete
        # Lifts the loop-side deadline once the response is complete: on asyncio the
        # entry's end (below), on other backends set by the backend.
        self.lift: Callable[[], None] = _nothing
        # asyncio: the request's loop-side deadline (None on other backends).
        self.entry: Optional[Entry] = None
        self.deadlines: Optional[LoopDeadlines] = None
        self.hit = False  # a thread call was stopped by this request's deadline


def _nothing() -> None:
    pass


def _is_request_deadline(request: _Request) -> bool:
    """The app raised DeadlineExceeded: is it the request's deadline? (A thread call's
    scope can end before the loop's timer fires.) Else it is one of the app's own."""
    return request.hit or (request.active and time.monotonic() >= request.deadline)


_current: contextvars.ContextVar[Optional[_Request]] = contextvars.ContextVar(
    "timeoutcore_asgi_request", default=None)

_installed = False


class _ThreadCall:
    """One thread call of a request: its scope once the thread has made it, and whether the
    caller was cancelled (by something other than the request's deadline)."""

    __slots__ = ("scope", "cancelled")

    def __init__(self) -> None:
        self.scope: Any = None
        self.cancelled = False

    def cancel(self) -> None:
        # Rule: the flag is set before the scope is read, and the thread stores the scope
        # before it reads the flag, so one of the two sees the other. A thread that
        # misses it all the same (free-threaded, where the two are not ordered) runs on to
        # the request's deadline, which still stops it.
        self.cancelled = True
        scope = self.scope
        if scope is not None:
            scope.cancel("request cancelled")


def _run_in_request(request: _Request, call: _ThreadCall, func: Callable[..., Any],
                    args: tuple[Any, ...]) -> Any:
    """In the worker thread: ``func(*args)`` under the request's deadline."""
    scope = thread_deadline_at(request.deadline, label=request.label)
    call.scope = scope
    if call.cancelled:  # the caller is gone: func never starts
        return None
    try:
        with scope:
            return func(*args)
    except DeadlineExceeded as exc:
        if exc.scope is scope and not scope.cancelled():
            request.hit = True  # read by the loop after the await returned
        raise
    return None  # not reached: the scope raises what ends the block


def _install_carrier() -> None:
    """Wrap ``anyio.to_thread.run_sync`` (once per process) so that calls made in a
    request's context run under its deadline."""
    global _installed
    if _installed:
        return
    original = anyio_run_sync  # anyio's own, whatever wrapped the module attribute since

    @functools.wraps(original)
    async def run_sync(func: Callable[..., T], *args: Any, abandon_on_cancel: bool = False,
                       cancellable: Optional[bool] = None,
                       limiter: Optional[anyio.CapacityLimiter] = None) -> T:
        request = _current.get()
        if request is None or not request.active:
            return await original(func, *args, abandon_on_cancel=abandon_on_cancel,
                                  cancellable=cancellable, limiter=limiter)
        # abandon_on_cancel is moot here: the call's thread stops at the request's deadline
        # by itself, and anyio's shielded await gives the token back once it has. Rejected:
        # contrib.anyio.run_in_scope (a cancel from the loop stops the thread, the token is
        # taken on the call's behalf) -- its second limiter, lock and bookkeeping cost
        # more per request than the rest of the middleware together.
        call = _ThreadCall()
        entry = request.entry
        if entry is not None:
            entry.busy += 1
        try:
            result: T = await original(_run_in_request, request, call, func, args,
                                       limiter=limiter)
            return result
        except anyio.get_cancelled_exc_class():
            # A cancel other than the request's deadline (held back while busy), e.g. an
            # asyncio.wait_for of the app's own: stop the thread too. anyio has given the
            # token back already, as it does for any native cancel.
            call.cancel()
            raise
        finally:
            if entry is not None:
                entry.busy -= 1
                if not request.hit:
                    assert request.deadlines is not None
                    request.deadlines.release(entry)

    # Starlette and FastAPI look the function up on the module at every call
    # (anyio.to_thread.run_sync), which is what makes wrapping it there enough.
    setattr(anyio.to_thread, "run_sync", run_sync)  # noqa: B010 - a typed module attribute
    _installed = True


def _limits(routes: Optional[Mapping[str, Optional[float]]]) -> list[tuple[str, Optional[float]]]:
    if routes is None:
        return []
    if not isinstance(routes, Mapping):
        raise TypeError("DeadlineMiddleware: routes must be a mapping of path prefixes to "
                        f"seconds or None, not {type(routes).__name__}")
    checked = []
    for prefix, seconds in routes.items():
        if not isinstance(prefix, str) or not prefix.startswith("/"):
            raise ValueError(f"DeadlineMiddleware: routes: {prefix!r} is not a path prefix "
                             "starting with '/'")
        if seconds is not None:
            seconds = _validate.seconds(seconds, "DeadlineMiddleware", f"routes[{prefix!r}]")
        checked.append((prefix, seconds))
    return sorted(checked, key=lambda item: len(item[0]), reverse=True)  # longest first


class DeadlineMiddleware:
    """ASGI middleware: every HTTP request runs under a deadline of ``seconds``.

    ``soft_limit``: seconds (below ``seconds``) after which a warning naming the method and
    path is logged while the request still runs (on asyncio; other backends log it when a
    request that passed it ends). ``status``: the status sent when the deadline passes
    before a response has started (default 504), with ``body`` as ``text/plain``.
    ``routes``: per path-prefix limits, the longest matching prefix wins (``None``: no
    deadline for those paths), e.g. ``{"/reports": 30.0, "/stream": None}``.
    ``stop_wait``: how long past its deadline a request waits for its threads to leave the
    endpoint (they stop by themselves at the deadline) before it is cancelled and the
    response goes out regardless; a thread blocked where no interrupt reaches it (C code
    holding the GIL) goes on running, and on asyncio anyio gives its pool token back then.

    Non-HTTP scopes (websocket, lifespan) pass through untouched.
    """

    def __init__(self, app: ASGIApp, seconds: float, *, soft_limit: Optional[float] = None,
                 status: int = 504, body: bytes = b"request deadline exceeded\n",
                 routes: Optional[Mapping[str, Optional[float]]] = None,
                 stop_wait: float = 1.0) -> None:
        self.app = app
        self.seconds = _validate.seconds(seconds, "DeadlineMiddleware", "seconds")
        self.soft_limit = None if soft_limit is None else _validate.seconds(
            soft_limit, "DeadlineMiddleware", "soft_limit")
        if self.soft_limit is not None and self.soft_limit >= self.seconds:
            raise ValueError(f"DeadlineMiddleware: soft_limit ({self.soft_limit:g} s) must be "
                             f"below seconds ({self.seconds:g} s)")
        if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
            raise ValueError(f"DeadlineMiddleware: status must be an HTTP status code, not "
                             f"{status!r}")
        if not isinstance(body, bytes):
            raise TypeError(f"DeadlineMiddleware: body must be bytes, not {type(body).__name__}")
        self.status = status
        self.body = body
        self.routes = _limits(routes)
        self.stop_wait = _validate.seconds(stop_wait, "DeadlineMiddleware", "stop_wait",
                                           allow_zero=True)
        self._deadlines: Optional[LoopDeadlines] = None  # asyncio: the serving loop's
        _install_carrier()

    def limit_for(self, path: str) -> Optional[float]:
        """The limit in seconds for a request to ``path`` (None: no deadline)."""
        for prefix, seconds in self.routes:
            if path.startswith(prefix):
                return seconds
        return self.seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope.get("path", "")) if self.routes else self.seconds
        if limit is None:
            await self.app(scope, receive, send)
            return
        label = f"{scope.get('method', '')} {scope.get('path', '')}"
        begun = time.monotonic()
        request = _Request(begun + limit, label)
        started = False
        soft = None if self.soft_limit is None else self._soft_timer(label)
        token: Optional[contextvars.Token[Optional[_Request]]] = None

        async def guarded_send(message: Message) -> None:
            nonlocal started, token
            kind = message["type"]
            if kind == "http.response.start":
                started = True
            elif kind == "http.response.body" and not message.get("more_body", False):
                request.active = False  # complete: what follows runs without the deadline
                if request.deadlines is not None:
                    assert request.entry is not None
                    request.deadlines.end(request.entry)
                else:
                    request.lift()
                # Rule: the request leaves the context before the last body goes out. The
                # server copies the context then (uvicorn's keep-alive timer, a cancelled
                # handle that stays in the loop's heap for a while), and a copy that holds
                # the request holds its entry and closures: a few objects per request that
                # outlive it, enough to make the collector run every few dozen requests.
                # The token works only in the context that made it; a response sent from
                # a child task (a streaming one) sets None there instead.
                if token is not None:
                    try:
                        _current.reset(token)
                        token = None
                    except ValueError:
                        _current.set(None)
            await send(message)

        token = _current.set(request)
        try:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # another backend (trio)
                stopped = await self._guarded_anyio(scope, receive, guarded_send, request,
                                                    limit)
            else:
                # Inline rather than a coroutine of its own: every layer of the await chain
                # runs again at each of the request's suspensions.
                deadlines = self._deadlines
                if deadlines is None or deadlines.loop is not loop:
                    deadlines = self._deadlines = LoopDeadlines(loop, self.stop_wait)
                task = asyncio.current_task(loop)
                assert task is not None  # an ASGI server runs each request in a task
                entry = deadlines.add(loop.time() + limit, task)
                request.entry = entry
                request.deadlines = deadlines
                # Rule: settle() runs exactly once, whatever way the app ends: it takes back
                # the deadline's cancel request (as asyncio.timeout's exit does).
                try:
                    await self.app(scope, receive, guarded_send)
                except asyncio.CancelledError:
                    if not deadlines.settle(entry):
                        raise
                    stopped = True
                except DeadlineExceeded:
                    if not (deadlines.settle(entry) or _is_request_deadline(request)):
                        raise
                    stopped = True
                except BaseException:
                    deadlines.settle(entry)
                    raise
                else:
                    stopped = entry.expired  # the app itself swallowed the deadline's cancel
                    deadlines.settle(entry)
        finally:
            if token is not None:
                _current.reset(token)
            if soft is not None:
                soft.cancel()
        if self.soft_limit is not None and soft is None and \
                time.monotonic() - begun >= self.soft_limit:
            self._warn_soft(label)
        if stopped:
            await self._stopped(send, label, limit, started)

    async def _stopped(self, send: Send, label: str, limit: float, started: bool) -> None:
        """The deadline stopped the request: answer ``status``, or cut the response off."""
        if started:
            # Cut off: returning without the last body message makes the server close the
            # connection, so the client cannot take the response for a whole one.
            log.warning("timeoutcore: %s passed its %g s deadline mid-response; the response "
                        "was cut off", label, limit)
            return
        log.warning("timeoutcore: %s passed its %g s deadline; answered %d", label, limit,
                    self.status)
        await send({"type": "http.response.start", "status": self.status,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                (b"content-length", str(len(self.body)).encode())]})
        await send({"type": "http.response.body", "body": self.body})

    async def _guarded_anyio(self, scope: Scope, receive: Receive, send: Send,
                             request: _Request, limit: float) -> bool:
        """Other backends (trio): the app under an anyio CancelScope; True if the deadline
        stopped it (an exception of the app's own propagates). Rejected on asyncio:
        anyio.CancelScope -- entering and leaving one cost several times the rest of the
        middleware; an asyncio.timeout per request -- see _loop_deadlines."""
        with anyio.CancelScope(deadline=anyio.current_time() + limit) as cancel_scope:

            def lift() -> None:
                cancel_scope.deadline = math.inf

            request.lift = lift
            try:
                await self.app(scope, receive, send)
            except DeadlineExceeded:
                if _is_request_deadline(request):
                    return True
                raise
        return cancel_scope.cancelled_caught

    def _soft_timer(self, label: str) -> Any:
        if self.soft_limit is None:
            return None
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # another backend (trio): warned at the request's end
            return None
        return loop.call_later(self.soft_limit, self._warn_soft, label)

    def _warn_soft(self, label: str) -> None:
        log.warning("timeoutcore: %s passed its soft limit of %g s", label, self.soft_limit)
