"""A minimal Django project in one module -- settings, URLs, views, the WSGI application --
for tests/test_wsgi_django.py, served by gunicorn (``DJANGO_SETTINGS_MODULE=wsgi_django``).

``WSGI_DJANGO_MODE``: ``middleware`` (default) puts
``timeoutcore.contrib.django.DeadlineMiddleware`` first in ``MIDDLEWARE``; ``wsgi`` leaves
``MIDDLEWARE`` empty and wraps the WSGI application in
``timeoutcore.contrib.wsgi.DeadlineMiddleware`` instead. ``WSGI_TEST_DSN``: the PostgreSQL
(``CONN_MAX_AGE = None``: one persistent connection per thread, so the request after a
stopped one reuses -- or replaces -- the connection the stopped one left). Views query the
table ``WSGI_TABLE`` the test creates.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg.conninfo

from timeoutcore.contrib.wsgi import deadline

MODE = os.environ.get("WSGI_DJANGO_MODE", "middleware")
LIMIT = float(os.environ.get("WSGI_TEST_LIMIT", "0.5"))
TABLE = os.environ.get("WSGI_TABLE", "wsgi_django_rows")
PG_APP_NAME = "timeoutcore-django-test"

# --- settings ---------------------------------------------------------------------------

SECRET_KEY = "test-only"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = __name__
USE_TZ = True
INSTALLED_APPS: list[str] = []
MIDDLEWARE = ["timeoutcore.contrib.django.DeadlineMiddleware"] if MODE == "middleware" else []
TIMEOUTCORE_DEADLINE = {"seconds": LIMIT}
_dsn = psycopg.conninfo.conninfo_to_dict(os.environ["WSGI_TEST_DSN"])
DATABASES = {"default": {
    "ENGINE": "django.db.backends.postgresql",
    "NAME": _dsn.get("dbname", "postgres"), "USER": _dsn.get("user", ""),
    "HOST": _dsn.get("host", ""), "PORT": str(_dsn.get("port", "")),
    "PASSWORD": _dsn.get("password", ""),
    "CONN_MAX_AGE": None,
    "OPTIONS": {"application_name": PG_APP_NAME},
}}
LOGGING = {"version": 1, "disable_existing_loggers": False,
           "handlers": {"err": {"class": "logging.StreamHandler"}},
           "loggers": {"timeoutcore": {"handlers": ["err"], "level": "WARNING"}}}

# --- views ------------------------------------------------------------------------------

from django.db import connection, transaction  # noqa: E402
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse  # noqa: E402
from django.urls import path  # noqa: E402


def _rows() -> list[str]:
    with connection.cursor() as cur:
        cur.execute(f"SELECT tag FROM {TABLE} ORDER BY id")
        return [r[0] for r in cur.fetchall()]


def fast(request: HttpRequest) -> HttpResponse:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        backend = cur.fetchone()[0]
    return JsonResponse({"pid": os.getpid(), "thread": threading.get_ident(),
                         "backend": backend, "in_atomic": connection.in_atomic_block,
                         "autocommit": connection.get_autocommit()})


def atomic_sleep(request: HttpRequest) -> HttpResponse:
    """Insert a row, then block in pg_sleep inside the same transaction."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(f"INSERT INTO {TABLE} (tag) VALUES (%s)", [request.GET["tag"]])
        cur.execute("SELECT pg_sleep(60)")
    return HttpResponse("slept 60 s")


def pg_sleep(request: HttpRequest) -> HttpResponse:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_sleep(60)")
    return HttpResponse("slept 60 s")


def sleep(request: HttpRequest) -> HttpResponse:
    time.sleep(60)
    return HttpResponse("slept 60 s")


def insert(request: HttpRequest) -> HttpResponse:
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(f"INSERT INTO {TABLE} (tag) VALUES (%s)", [request.GET["tag"]])
    return JsonResponse({"rows": _rows()})


def stream(request: HttpRequest) -> HttpResponse:
    def body() -> Iterator[bytes]:
        yield b"first chunk\n"
        time.sleep(60)
        yield b"never sent\n"

    return StreamingHttpResponse(body(), content_type="text/plain")  # type: ignore[return-value]


@deadline(LIMIT * 4)
def longer(request: HttpRequest) -> HttpResponse:
    time.sleep(LIMIT * 2)
    return HttpResponse("done")


def diag(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"pid": os.getpid(), "threads": threading.active_count(),
                         "fds": len(os.listdir("/proc/self/fd"))})


urlpatterns: list[Any] = [
    path("fast", fast), path("atomic-sleep", atomic_sleep), path("pg-sleep", pg_sleep),
    path("sleep", sleep), path("insert", insert), path("stream", stream),
    path("decorated/longer", longer), path("diag", diag),
]

# --- the WSGI application ---------------------------------------------------------------

os.environ.setdefault("DJANGO_SETTINGS_MODULE", __name__)

from django.core.wsgi import get_wsgi_application  # noqa: E402

application: Any = get_wsgi_application()
if MODE == "wsgi":
    from timeoutcore.contrib.wsgi import DeadlineMiddleware

    application = DeadlineMiddleware(application, LIMIT)
