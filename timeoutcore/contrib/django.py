"""Django: a ``MIDDLEWARE`` entry that gives every request a hard deadline, its database
queries cancelled at that deadline.

For projects that cannot wrap the WSGI callable (``timeoutcore.contrib.wsgi``)::

    # settings.py
    MIDDLEWARE = ["timeoutcore.contrib.django.DeadlineMiddleware", ...]   # first
    TIMEOUTCORE_DEADLINE = {"seconds": 30, "soft_limit": 20}              # status=504, body

Each request runs ``get_response(request)`` -- the rest of the middleware chain and the view
-- under a deadline of ``seconds`` from the request's start (``request.META
["timeoutcore.limit"]``, set by an outer layer, or ``@timeoutcore.contrib.wsgi.deadline(s)``
on the view change one request's limit). At the deadline the view is stopped wherever it
is; Django's ``transaction.atomic`` blocks unwind and roll back as for any exception, and
the client gets ``status`` (504) with a short ``text/plain`` body through the rest of the
middleware chain, as any response. A streamed response (``StreamingHttpResponse``) is
iterated under the same deadline; past it, ``ResponseAborted`` is raised to the server,
which closes the connection (the client sees an incomplete body).

Database queries: while the request runs, every connection of ``django.db.connections``
executes its queries through a wrapper (Django's ``connection.execute_wrapper``, its
documented instrumentation hook) that applies ``timeoutcore.contrib.db.guard`` to the
driver's connection: at the deadline a PostgreSQL query gets libpq's cancel
(``psycopg``/``psycopg2``), a SQLite one ``interrupt()``. Django records the error on the
connection; at the request's end (``request_finished``) and the next request's start it
checks such a connection (``close_if_unusable_or_obsolete``) and keeps it if it answers,
else closes it, so the next request on that thread gets a working connection, with nothing
of the stopped request's open transaction committed. Statements the stopped request ran in
autocommit mode before the deadline stay committed, as they would after any error: use
``ATOMIC_REQUESTS`` or ``atomic()`` for all-or-nothing requests. Drivers without a known
cancel run their queries unguarded (a query there ends when the database returns it).

The interrupt never leaves this middleware: the server, and the middleware outside this
one, see a response. The entry is synchronous: under ASGI use
``timeoutcore.contrib.asgi``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any, Callable

from django.conf import settings
from django.db import connections
from django.http import HttpRequest, HttpResponse, HttpResponseBase

from .. import _validate
from ..errors import DeadlineExceeded
from ..protect import unprotect_module
from ..scope import thread_deadline_at
from .db import cancel_of, guard
from .wsgi import LIMIT_KEY, ResponseAborted, _current, _Request, _scope, validate

__all__ = ["SETTING", "DeadlineMiddleware"]

# As timeoutcore.contrib.wsgi: the query wrapper and the stream call application code from
# frames of this module, which must therefore not count as protected code.
unprotect_module(__name__)

log = logging.getLogger("timeoutcore.wsgi")

#: The settings name: a dict with the keys ``seconds``, ``soft_limit``, ``status``, ``body``.
SETTING = "TIMEOUTCORE_DEADLINE"
_KEYS = ("seconds", "soft_limit", "status", "body")


def _settings() -> dict[str, Any]:
    conf = getattr(settings, SETTING, None)
    if conf is None:
        raise ValueError(f"settings.{SETTING} is needed by timeoutcore.contrib.django."
                         f"DeadlineMiddleware: a dict such as {{'seconds': 30}}")
    if not isinstance(conf, Mapping):
        raise TypeError(f"settings.{SETTING} must be a dict, not {type(conf).__name__}")
    unknown = sorted(set(conf) - set(_KEYS))
    if unknown:
        raise TypeError(f"settings.{SETTING}: unknown key {unknown[0]!r} (known: "
                        f"{', '.join(_KEYS)})")
    if "seconds" not in conf:
        raise ValueError(f"settings.{SETTING} needs 'seconds'")
    return dict(conf)


def _guarded_execute(execute: Callable[..., Any], sql: Any, params: Any, many: bool,
                     context: dict[str, Any]) -> Any:
    """Django's execute wrapper: the query under ``guard`` of the driver's connection."""
    raw = getattr(context.get("connection"), "connection", None)
    if raw is None or _current.get() is None:
        return execute(sql, params, many, context)
    try:
        cancel_of(raw)
    except TypeError:  # a driver without a known cancel: the query runs unguarded
        return execute(sql, params, many, context)
    with guard(raw):
        return execute(sql, params, many, context)


@contextlib.contextmanager
def _queries_guarded() -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for alias in connections:
            stack.enter_context(connections[alias].execute_wrapper(_guarded_execute))
        yield


def _stream(req: _Request, content: Iterator[Any]) -> Iterator[Any]:
    """A streamed response's chunks, each produced under the request's deadline (the
    ``yield`` is outside every scope: the server's code runs without it)."""
    it = iter(content)
    while True:
        scope = thread_deadline_at(req.when, label=req.label)
        req.scope = scope
        token = _current.set(req)
        try:
            with scope:
                chunk = next(it)
        except StopIteration:
            req.check_soft()
            return
        except DeadlineExceeded as exc:
            if exc.scope is not scope:
                raise
            elapsed = time.monotonic() - req.start
            log.warning("deadline exceeded: %s after %.3f s (limit %g s): response aborted",
                        req.label, elapsed, req.limit)
            raise ResponseAborted(req.label, req.limit, elapsed) from exc
        finally:
            _current.reset(token)
            req.scope = None
        req.check_soft()
        yield chunk


class DeadlineMiddleware:
    """Django middleware: every request runs under the deadline of
    ``settings.TIMEOUTCORE_DEADLINE`` (``{"seconds": ..., "soft_limit": None, "status": 504,
    "body": b"..."}``), its database queries cancelled at the deadline (the module
    docstring). Put it first in ``MIDDLEWARE``. A missing or bad setting raises
    ``TypeError``/``ValueError`` naming it when Django builds the middleware chain."""

    sync_capable = True
    async_capable = False

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        conf = _settings()
        self.get_response = get_response
        self.seconds, self.soft_limit, status_line, self.body = validate(
            conf["seconds"], conf.get("soft_limit"), conf.get("status", 504),
            conf.get("body"), where=f"settings.{SETTING}")
        self.status = int(status_line.split()[0])

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        limit = self.seconds
        override = request.META.get(LIMIT_KEY)
        if override is not None:
            limit = _validate.seconds(override, "DeadlineMiddleware", f"META[{LIMIT_KEY!r}]")
        req = _Request(f"{request.method} {request.path}", limit, self.soft_limit)
        token = _current.set(req)
        scope = _scope(req, first=True)
        try:
            with _queries_guarded():
                req.scope = scope
                try:
                    with scope:
                        response = self.get_response(request)
                finally:
                    req.scope = None
                    if scope.soft_expired():
                        req.soft_warned = True
        except DeadlineExceeded as exc:
            if exc.scope is not scope:
                raise
            log.warning("deadline exceeded: %s after %.3f s (limit %g s): %s sent",
                        req.label, time.monotonic() - req.start, req.limit, self.status)
            return HttpResponse(self.body, status=self.status,
                                content_type="text/plain; charset=utf-8")
        finally:
            _current.reset(token)
        if getattr(response, "streaming", False) and not getattr(response, "is_async", False):
            response.streaming_content = _stream(req, response.streaming_content)
        else:
            req.check_soft()
        return response
