"""The Flask application tests/test_wsgi.py serves through real gunicorn and waitress
processes, wrapped by ``timeoutcore.contrib.wsgi.DeadlineMiddleware``.

Configured by the environment the test gives the server:

* ``WSGI_TEST_LIMIT`` / ``WSGI_TEST_SOFT``: the middleware's ``seconds`` / ``soft_limit``;
* ``WSGI_TEST_DSN``: the PostgreSQL the ``/pg`` view queries (unset: ``/pg`` answers 501);
* ``WSGI_TEST_PATCH_AT_IMPORT=1``: call ``timeoutcore.patch()`` here (waitress: one
  process, no fork hook); under gunicorn the config's ``post_fork`` does it.

An ``X-Deadline`` request header is copied into ``environ["timeoutcore.limit"]`` by a
layer outside the middleware: the per-request override an outer layer would make.

The views that block record themselves in ``BLOCKED`` while they block (removed in a
``finally``), so ``/fast`` can show that it was served while slow requests were stuck;
``/diag`` reports the process's threads, file descriptors and the children ``/subprocess``
started that still exist (running or zombie).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, Callable

import flask
import requests

import timeoutcore
from timeoutcore.contrib.db import guard
from timeoutcore.contrib.wsgi import LIMIT_KEY, DeadlineMiddleware, current_request_limit, deadline

if os.environ.get("WSGI_TEST_PATCH_AT_IMPORT") == "1":
    timeoutcore.patch()

logging.basicConfig(stream=sys.stderr, level=logging.WARNING,
                    format="%(levelname)s %(name)s: %(message)s")

LIMIT = float(os.environ.get("WSGI_TEST_LIMIT", "0.5"))
SOFT = float(os.environ["WSGI_TEST_SOFT"]) if os.environ.get("WSGI_TEST_SOFT") else None
DSN = os.environ.get("WSGI_TEST_DSN")
PG_APP_NAME = "timeoutcore-wsgi-test"

app = flask.Flask(__name__)

_lock = threading.Lock()
BLOCKED: dict[int, str] = {}  # thread ident -> the view blocked in it
CHILDREN: list[int] = []  # pids /subprocess started
CLOSED: list[str] = []  # streamed responses whose close() ran


def _blocking(name: str, work: Callable[[], Any]) -> Any:
    ident = threading.get_ident()
    with _lock:
        BLOCKED[ident] = name
    try:
        return work()
    finally:
        with _lock:
            BLOCKED.pop(ident, None)


@app.get("/fast")
def fast() -> Any:
    with _lock:
        blocked = sorted(BLOCKED.values())
    return {"pid": os.getpid(), "blocked": blocked, "limit": current_request_limit()}


@app.get("/sleep")
def sleep() -> Any:
    _blocking("sleep", lambda: time.sleep(60))
    return "slept 60 s"


@app.get("/slept")
def slept() -> Any:
    seconds = float(flask.request.args["s"])
    time.sleep(seconds)
    return {"slept": seconds, "limit": current_request_limit()}


@app.get("/upstream")
def upstream() -> Any:
    url = f"http://127.0.0.1:{int(flask.request.args['port'])}/"
    return _blocking("upstream", lambda: requests.get(url).text)


@app.get("/cpu")
def cpu() -> Any:
    def spin() -> int:
        n = 0
        while n >= 0:
            n += 1
        return n

    return str(_blocking("cpu", spin))


@app.get("/pg")
def pg() -> Any:
    if DSN is None:
        return "no PostgreSQL", 501
    import psycopg

    def query() -> Any:
        with psycopg.connect(DSN, autocommit=True, application_name=PG_APP_NAME) as conn, \
                guard(conn):
            return conn.execute("SELECT pg_sleep(60)").fetchone()

    return str(_blocking("pg", query))


@app.get("/subprocess")
def child() -> Any:
    def run() -> int:
        proc = subprocess.Popen(["sleep", "60"])
        with _lock:
            CHILDREN.append(proc.pid)
        return proc.wait()

    return str(_blocking("subprocess", run))


@app.get("/stream")
def stream() -> Any:
    def body() -> Iterator[bytes]:
        yield b"first chunk\n"
        _blocking("stream", lambda: time.sleep(60))
        yield b"never sent\n"

    response = flask.Response(body(), mimetype="text/plain")
    response.call_on_close(lambda: CLOSED.append("stream"))
    return response


@app.get("/decorated/longer")
@deadline(LIMIT * 4)
def longer() -> Any:
    time.sleep(LIMIT * 2)
    return {"limit": current_request_limit()}


@app.get("/decorated/shorter")
@deadline(LIMIT / 2)
def shorter() -> Any:
    _blocking("shorter", lambda: time.sleep(60))
    return "slept 60 s"


def _exists(pid: int) -> bool:
    """Running or a zombie nobody reaped (a reaped child has no /proc entry)."""
    return os.path.exists(f"/proc/{pid}")


@app.get("/diag")
def diag() -> Any:
    with _lock:
        children = [pid for pid in CHILDREN if _exists(pid)]
        started = len(CHILDREN)
    return {"pid": os.getpid(), "threads": threading.active_count(),
            "fds": len(os.listdir("/proc/self/fd")), "children_left": children,
            "children_started": started, "streams_closed": len(CLOSED),
            "patched": timeoutcore.is_patched()}


def _limit_from_header(inner: Callable[..., Any]) -> Callable[..., Any]:
    def layer(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        header = environ.get("HTTP_X_DEADLINE")
        if header is not None:
            environ[LIMIT_KEY] = float(header)
        return inner(environ, start_response)

    return layer


app.wsgi_app = _limit_from_header(  # type: ignore[method-assign]
    DeadlineMiddleware(app.wsgi_app, LIMIT, soft_limit=SOFT))
