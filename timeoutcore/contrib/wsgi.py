"""WSGI: a hard deadline for every request, in the thread that serves it.

Threaded WSGI servers (gunicorn's ``gthread`` worker, waitress, mod_wsgi's daemon threads)
cannot stop one request: gunicorn's ``timeout`` watches the worker's main loop, not its
request threads, and waitress has no request timeout at all. Wrapped around the
application, :class:`DeadlineMiddleware` runs ``app(environ, start_response)`` *and the
iteration of its response* under one deadline counted from the request's start::

    from timeoutcore.contrib.wsgi import DeadlineMiddleware
    app.wsgi_app = DeadlineMiddleware(app.wsgi_app, 30, soft_limit=20)   # Flask
    application = DeadlineMiddleware(get_wsgi_application(), 30)         # Django

At the deadline the request's work is stopped wherever it is (``timeoutcore.patch()`` for
sleeps, sockets and subprocess waits; ``contrib.db.guard`` for a database query), and:

* if no byte of the response has been handed to the server yet, the client gets
  ``status`` (504 by default) with a short plain-text body: the application's own
  ``start_response`` call is held back until its first body chunk (PEP 3333 allows
  middleware that), so the 504 never has to replace headers the server already took
  (gunicorn appends the headers of a second ``start_response`` call to the first one's);
* if the response has started, :class:`ResponseAborted` (an ``Exception``) is raised to
  the server from the response iterator. gunicorn (``gthread``, ``sync``) then closes the
  socket without the chunked terminator; waitress closes the connection after what it has
  flushed. A client therefore sees an incomplete body (chunked encoding without its last
  chunk, or fewer bytes than ``Content-Length``), never a response that looks complete --
  except an HTTP/1.0 response without ``Content-Length``, whose end *is* the close.

The interrupt never reaches the server's code: each part of the request that runs
application code (the call, each ``next()`` of the response) is a scope of its own entered
and left inside this module, so what the server sees is a return value, a 504 or
``ResponseAborted`` -- gunicorn's ``gthread`` worker catches only ``Exception`` around a
request, and a ``BaseException`` there would take the worker down. The response's
``close()`` always runs, outside any deadline (it is the application's cleanup).

Per request, the limit can be changed:

* by an outer layer, ``environ["timeoutcore.limit"] = seconds`` (:data:`LIMIT_KEY`) before
  this middleware runs;
* by the view, ``@deadline(seconds)`` (:func:`deadline`): the request's deadline becomes
  ``seconds`` after its start, earlier or later than the middleware's.

``soft_limit``: a request still running that long after its start is logged as a warning
on logger ``timeoutcore`` naming the method and path (``label='GET /report'``); during
a streamed response the soft limit is checked between chunks. Stops are logged as warnings
on logger ``timeoutcore.wsgi``.

What it does not do: stop the server's own work (reading the request body before the
application asks for it, writing to a slow client); code that holds the GIL in one C call
is stopped when the call returns; the interrupt surfaces in whatever Python code the
request's thread runs at the deadline, the framework's included, which unwinds through its
``finally`` blocks and context managers as for any exception.
"""

from __future__ import annotations

import contextvars
import functools
import http
import inspect
import logging
import time
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Any, Callable, Optional, TypeVar

from .. import _validate
from ..errors import DeadlineExceeded
from ..protect import unprotect_module
from ..scope import DeadlineScope, shield, thread_deadline, thread_deadline_at

__all__ = ["LIMIT_KEY", "DeadlineMiddleware", "ResponseAborted", "current_request_limit",
           "deadline"]

# The package is protected code (timeoutcore.protect): no interrupt surfaces while one of
# its frames is on the stack. The view wrapper of @deadline and the response iterator call
# application code from frames of this module, so this module must not count as protected,
# or a decorated view would never be stopped. What of it runs inside a deadline and must
# not be torn -- the server's start_response -- runs under shield().
unprotect_module(__name__)

log = logging.getLogger("timeoutcore.wsgi")
soft_log = logging.getLogger("timeoutcore")

#: The environ key an outer layer sets to give one request its own limit (seconds).
LIMIT_KEY = "timeoutcore.limit"

_DEFAULT_BODY = b"Gateway Timeout: the request ran past its deadline.\n"

Environ = dict[str, Any]
ExcInfo = tuple[type[BaseException], BaseException, Optional[TracebackType]]
StartResponse = Callable[..., Callable[[bytes], Any]]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]
F = TypeVar("F", bound=Callable[..., Any])


class ResponseAborted(Exception):
    """Raised to the server when a request's deadline passed after its response had
    started: the server closes the connection, so the client sees an incomplete response.
    ``label`` is the request's method and path, ``limit`` its limit in seconds, ``elapsed``
    the seconds since its start; the ``DeadlineExceeded`` is its ``__cause__``."""

    def __init__(self, label: str, limit: float, elapsed: float) -> None:
        super().__init__(f"{label}: deadline of {limit:g} s passed after the response had "
                         f"started ({elapsed:.3f} s); response aborted")
        self.label = label
        self.limit = limit
        self.elapsed = elapsed


class _Request:
    """One request's deadline: its start, its stop time, the scope running now (if any)."""

    __slots__ = ("label", "limit", "scope", "soft", "soft_at", "soft_warned", "start", "when")

    def __init__(self, label: str, limit: float, soft: Optional[float]) -> None:
        self.label = label
        self.limit = limit
        self.start = time.monotonic()
        self.when = self.start + limit
        self.soft = None if soft is None or soft >= limit else soft
        self.soft_at = None if self.soft is None else self.start + self.soft
        self.soft_warned = False
        self.scope: Optional[DeadlineScope] = None

    def set_limit(self, seconds: float) -> None:
        """The request's deadline becomes ``seconds`` after its start (earlier or later)."""
        self.limit = seconds
        self.when = self.start + seconds
        scope = self.scope
        if scope is not None:
            try:
                scope.reschedule(self.when)
            except RuntimeError:  # it exited meanwhile; the next part reads self.when
                pass

    def check_soft(self) -> None:
        """Log the soft-limit warning once if the limit has passed and no scope logged it
        (it passed while the server, not the application, was running)."""
        if self.soft_at is not None and not self.soft_warned \
                and time.monotonic() >= self.soft_at:
            self.soft_warned = True
            soft_log.warning("soft limit passed: label=%r elapsed=%.3fs soft=%ss hard=%ss",
                             self.label, time.monotonic() - self.start,
                             self.soft, self.limit)


_current: contextvars.ContextVar[Optional[_Request]] = contextvars.ContextVar(
    "timeoutcore_wsgi_request", default=None)


def _label(environ: Environ) -> str:
    path = f"{environ.get('SCRIPT_NAME', '')}{environ.get('PATH_INFO', '')}" or "/"
    return f"{environ.get('REQUEST_METHOD', 'GET')} {path}"


def _status_line(status: Any) -> str:
    if isinstance(status, bool) or not isinstance(status, int):
        raise TypeError(f"DeadlineMiddleware(): status must be an int HTTP status code, "
                        f"not {type(status).__name__}")
    if not 400 <= status <= 599:
        raise ValueError(f"DeadlineMiddleware(): status must be an error status (400-599), "
                         f"got {status!r}")
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = "Deadline Exceeded"
    return f"{status} {phrase}"


def validate(seconds: Any, soft_limit: Any, status: Any, body: Any,
             where: str = "DeadlineMiddleware()") -> tuple[float, Optional[float], str, bytes]:
    """The middleware's settings checked: ``(seconds, soft_limit, status line, body)``, or
    a ``TypeError``/``ValueError`` naming the bad one (shared with the Django middleware)."""
    limit = _validate.seconds(seconds, where, "seconds")
    soft = _validate.seconds(soft_limit, where, "soft_limit", allow_none=True)
    if soft is not None and soft >= limit:
        raise ValueError(f"{where}: soft_limit ({soft!r} s) must be less than seconds "
                         f"({limit!r} s)")
    line = _status_line(status)
    if body is None:
        body = _DEFAULT_BODY
    if not isinstance(body, bytes):
        raise TypeError(f"{where}: body must be bytes, not {type(body).__name__}")
    return limit, soft, line, body


class DeadlineMiddleware:
    """``DeadlineMiddleware(app, seconds, *, soft_limit=None, status=504, body=None)``:
    a WSGI application that runs ``app`` with a hard deadline of ``seconds`` per request
    (the module docstring says what the client gets at the deadline).

    ``soft_limit`` (seconds, below ``seconds``): a warning naming the request's method and
    path once it has run that long. ``status``: the error status sent when the deadline
    passes before the response started (400-599); ``body``: its bytes (``text/plain``).
    ``environ["timeoutcore.limit"]`` set by an outer layer, or ``@deadline(s)`` on the
    view, changes one request's limit. Bad settings raise ``TypeError``/``ValueError``
    naming the argument; a bad ``environ`` limit fails that request the same way, before
    anything is armed.
    """

    def __init__(self, app: WSGIApp, seconds: float, *, soft_limit: Optional[float] = None,
                 status: int = 504, body: Optional[bytes] = None) -> None:
        if not callable(app):
            raise TypeError(f"DeadlineMiddleware(): app must be a WSGI application "
                            f"(callable), not {type(app).__name__}")
        self.app = app
        self.seconds, self.soft_limit, self._status, self.body = validate(
            seconds, soft_limit, status, body)
        self.status = status
        self._headers = [("Content-Type", "text/plain; charset=utf-8"),
                         ("Content-Length", str(len(self.body)))]

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        limit = self.seconds
        override = environ.get(LIMIT_KEY)
        if override is not None:
            limit = _validate.seconds(override, "DeadlineMiddleware", f"environ[{LIMIT_KEY!r}]")
        req = _Request(_label(environ), limit, self.soft_limit)
        response = _Response(self, req, environ, start_response)
        token = _current.set(req)
        try:
            return response.call_app()
        finally:
            _current.reset(token)


def _scope(req: _Request, first: bool) -> DeadlineScope:
    """The scope for the next part of the request: up to its deadline, with the soft limit
    when that is still ahead (the first part's is counted from the request's start)."""
    if first and req.soft is not None:
        return thread_deadline(req.limit, label=req.label, soft_limit=req.soft)
    left = req.when - time.monotonic()
    if left <= 0:  # already due: a scope that fires at its entry
        return thread_deadline_at(req.when, label=req.label)
    # thread_deadline(seconds) rather than thread_deadline_at(when): the same stop time,
    # and the engine's constructor directly (the _at form goes through a Python wrapper).
    return thread_deadline(left, label=req.label)


def _close(result: Any) -> None:
    close = getattr(result, "close", None)
    if close is None:
        return
    try:
        close()
    except Exception:  # noqa: BLE001 - the stop is what the server must hear of
        log.exception("close() of the response of a stopped request failed")


class _Response:
    """One request's dealings with the server: the application's ``start_response`` held
    back until its first body byte, the 504 or the abort at the deadline."""

    __slots__ = ("_pending", "_server_start", "_server_write", "environ", "mw", "req",
                 "started")

    def __init__(self, mw: DeadlineMiddleware, req: _Request, environ: Environ,
                 start_response: StartResponse) -> None:
        self.mw = mw
        self.req = req
        self.environ = environ
        self._server_start = start_response
        self._pending: Optional[tuple[str, list[tuple[str, str]]]] = None
        self._server_write: Optional[Callable[[bytes], Any]] = None
        # True once the server may have sent anything: from then on only an abort is left
        self.started = False

    # -- what the application sees ------------------------------------------------------

    def start_response(self, status: str, headers: list[tuple[str, str]],
                       exc_info: Optional[ExcInfo] = None) -> Callable[[bytes], Any]:
        if exc_info is not None:
            try:
                if self.started:  # PEP 3333: too late to change; re-raise the app's error
                    raise exc_info[1].with_traceback(exc_info[2])
            finally:
                exc_info = None
        elif self._pending is not None:
            raise AssertionError("start_response() called a second time without exc_info")
        self._pending = (status, list(headers))
        return self.write

    def write(self, data: bytes) -> None:
        """The application's ``write()`` (PEP 3333's imperative API): the response starts."""
        self.started = True
        self.commit()
        assert self._server_write is not None
        self._server_write(data)

    # -- towards the server ------------------------------------------------------------

    def commit(self) -> None:
        """Pass the application's held-back ``start_response`` on to the server, once."""
        if self._server_write is not None or self._pending is None:
            return
        status, headers = self._pending
        with shield():  # the server's bookkeeping is never torn by the deadline
            self._server_write = self._server_start(status, headers)

    def call_app(self) -> Iterable[bytes]:
        req = self.req
        result: Any = None
        scope = _scope(req, first=True)
        req.scope = scope
        try:
            with scope:
                result = self.mw.app(self.environ, self.start_response)
        except DeadlineExceeded as exc:
            if exc.scope is not scope:
                raise  # the application's own scope: its error, not this middleware's
            _close(result)
            return self.stopped(exc)
        finally:
            req.scope = None
            if scope.soft_expired():
                req.soft_warned = True
        if isinstance(result, (list, tuple)):  # no application code left to run
            self.started = True
            self.commit()
            req.check_soft()
            return result
        return _GuardedIterable(self, result)

    def stopped(self, exc: DeadlineExceeded) -> list[bytes]:
        """The deadline passed: the error response if nothing was sent, else the abort."""
        req = self.req
        elapsed = time.monotonic() - req.start
        if self.started:
            log.warning("deadline exceeded: %s after %.3f s (limit %g s): response aborted",
                        req.label, elapsed, req.limit)
            raise ResponseAborted(req.label, req.limit, elapsed) from exc
        log.warning("deadline exceeded: %s after %.3f s (limit %g s): %s sent",
                    req.label, elapsed, req.limit, self.mw.status)
        self.started = True
        self._server_start(self.mw._status, list(self.mw._headers))
        return [self.mw.body]


class _GuardedIterable:
    """The application's response, each ``next()`` under the request's deadline; the
    server calls ``close()``, which closes the application's response."""

    __slots__ = ("_it", "_result", "_stopped", "resp")

    def __init__(self, resp: _Response, result: Iterable[bytes]) -> None:
        self.resp = resp
        self._result = result
        self._it: Optional[Iterator[bytes]] = None
        self._stopped: Optional[list[bytes]] = None  # the 504 body still to hand over

    def __iter__(self) -> _GuardedIterable:
        return self

    def __next__(self) -> bytes:
        resp, req = self.resp, self.resp.req
        if self._stopped is not None:
            if not self._stopped:
                raise StopIteration
            return self._stopped.pop()
        scope = _scope(req, first=False)
        req.scope = scope
        token = _current.set(req)
        try:
            with scope:
                if self._it is None:
                    self._it = iter(self._result)
                chunk = next(self._it)
        except StopIteration:
            self._stopped = []
            resp.started = True
            resp.commit()  # an application that called start_response in its iterator
            req.check_soft()
            raise
        except DeadlineExceeded as exc:
            if exc.scope is not scope:
                raise
            self._stopped = resp.stopped(exc)
            return self._stopped.pop()
        finally:
            _current.reset(token)
            req.scope = None
        resp.started = True
        resp.commit()
        req.check_soft()
        return chunk

    def close(self) -> None:
        close = getattr(self._result, "close", None)
        if close is not None:
            close()


def deadline(seconds: float) -> Callable[[F], F]:
    """A decorator for a view (Flask, Django, any function a WSGI framework calls in the
    request's thread): the request's deadline becomes ``seconds`` after the request's
    start, earlier or later than the middleware's limit (:class:`DeadlineMiddleware`, or
    the Django middleware ``timeoutcore.contrib.django.DeadlineMiddleware``), for the rest
    of the request, its streamed response included. The last one to run wins.

    Called outside a request that such a middleware guards (a test client, a management
    command), the view runs under its own ``thread_deadline(seconds)``, which raises
    ``DeadlineExceeded`` at its end. ``async def`` views are refused with a ``TypeError``:
    they run on an event loop, where an ASGI middleware applies. Bad ``seconds`` raises
    ``TypeError``/``ValueError`` naming it."""
    limit = _validate.seconds(seconds, "deadline()", "seconds")

    def decorate(view: F) -> F:
        if not callable(view):
            raise TypeError(f"deadline({seconds!r}) decorates a view (callable), not "
                            f"{type(view).__name__}")
        if inspect.iscoroutinefunction(view):
            raise TypeError(f"deadline(): {getattr(view, '__qualname__', view)!r} is an async "
                            f"view; per-request deadlines for those come from an ASGI "
                            f"middleware")

        @functools.wraps(view)
        def limited(*args: Any, **kwargs: Any) -> Any:
            req = _current.get()
            if req is not None:
                req.set_limit(limit)
                return view(*args, **kwargs)
            with thread_deadline(limit, label=getattr(view, "__qualname__", None)):
                return view(*args, **kwargs)

        return limited  # type: ignore[return-value]

    return decorate


def current_request_limit() -> Optional[float]:
    """The limit in seconds of the request this thread serves under a deadline middleware
    (after any ``environ``/``@deadline`` change), or ``None`` outside one."""
    req = _current.get()
    return None if req is None else req.limit
