"""timeoutcore.contrib.django: the MIDDLEWARE entry, with Django and the real PostgreSQL.

gunicorn (``-k gthread --threads 1``: every request on the same thread, with Django's
persistent connection, ``CONN_MAX_AGE = None``) serves the one-module Django project of
tests/wsgi_django.py. A request blocked in ``pg_sleep`` inside ``transaction.atomic`` is
stopped at its deadline: its query is cancelled in PostgreSQL, its insert rolled back, the
client gets its 504, and the next request on that thread gets a working connection. The
same project wrapped in ``timeoutcore.contrib.wsgi.DeadlineMiddleware`` (no MIDDLEWARE
entry) stops a stuck view too.
"""

from __future__ import annotations

import http.client
import re
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("django")
pytest.importorskip("gunicorn")
psycopg = pytest.importorskip("psycopg")

from wsgi_servers import Server, assert_clean_log, only_aborts, serve, settles  # noqa: E402

LIMIT = 0.5
LATE = 2.5  # generous bound on a 504's lateness past its deadline (loaded 2-core CI)
TABLE = "wsgi_django_rows"
PG_APP_NAME = "timeoutcore-django-test"
BODY = b"Gateway Timeout: the request ran past its deadline.\n"


def _sql(dsn: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


@pytest.fixture(scope="module")
def table(postgres_dsn: str) -> Iterator[str]:
    _sql(postgres_dsn, f"DROP TABLE IF EXISTS {TABLE}")
    _sql(postgres_dsn, f"CREATE TABLE {TABLE} (id serial PRIMARY KEY, tag text NOT NULL)")
    yield postgres_dsn
    _sql(postgres_dsn, f"DROP TABLE IF EXISTS {TABLE}")


def _django(mode: str, dsn: str, tmp_path_factory: pytest.TempPathFactory,
            threads: int) -> Any:
    env = {"WSGI_DJANGO_MODE": mode, "WSGI_TEST_LIMIT": str(LIMIT), "WSGI_TEST_DSN": dsn,
           "WSGI_TABLE": TABLE, "DJANGO_SETTINGS_MODULE": "wsgi_django"}
    return serve("gunicorn", "wsgi_django:application", env,
                 tmp_path_factory.mktemp(f"django-{mode}"), threads=threads)


@pytest.fixture(scope="module")
def django_server(table: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with _django("middleware", table, tmp_path_factory, threads=1) as srv:
        srv.first_pid = srv.json("/fast")["pid"]  # type: ignore[attr-defined]
        yield srv
        log = srv.log()
    assert_clean_log(log)


def _active_queries(dsn: str) -> int:
    """The Django app's sessions still running a statement (a cancelled one is idle)."""
    rows = _sql(dsn, "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                     "AND state <> 'idle'", PG_APP_NAME)
    return int(rows[0][0])


def _connections(dsn: str) -> int:
    rows = _sql(dsn, "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                PG_APP_NAME)
    return int(rows[0][0])


def test_a_query_stopped_in_a_transaction_is_cancelled_and_rolled_back(
        django_server: Server, table: str) -> None:
    before = django_server.json("/fast")
    status, body, elapsed = django_server.request("/atomic-sleep?tag=stopped")
    assert (status, body) == (504, BODY)
    assert LIMIT - 0.05 <= elapsed < LIMIT + LATE
    assert settles(lambda: _active_queries(table), 0) == 0  # pg_sleep is not running on
    # The next request, on the same (only) thread: a working connection, no transaction
    # left open, and the stopped request's insert is gone.
    after = django_server.json("/fast")
    assert after["thread"] == before["thread"] and after["pid"] == before["pid"]
    assert after["in_atomic"] is False and after["autocommit"] is True
    assert django_server.json("/insert?tag=after")["rows"] == ["after"]
    assert [r[0] for r in _sql(table, f"SELECT tag FROM {TABLE}")] == ["after"]
    assert _connections(table) == 1
    assert re.search(r"deadline exceeded: GET /atomic-sleep after [0-9.]+ s "
                     r"\(limit 0.5 s\): 504 sent", django_server.log())


def test_stopped_queries_leave_one_working_connection(django_server: Server,
                                                      table: str) -> None:
    for _ in range(10):
        status, body, _ = django_server.request("/pg-sleep")
        assert (status, body) == (504, BODY)
        assert django_server.json("/fast")["autocommit"] is True
    assert settles(lambda: _active_queries(table), 0) == 0
    assert _connections(table) == 1  # one persistent connection: reused or replaced


def test_a_stuck_view_gets_504_and_the_thread_serves_on(django_server: Server) -> None:
    status, body, elapsed = django_server.request("/sleep")
    assert (status, body) == (504, BODY)
    assert LIMIT - 0.05 <= elapsed < LIMIT + LATE
    assert django_server.json("/fast")["pid"] == django_server.first_pid  # type: ignore[attr-defined]


def test_a_streamed_response_stopped_half_way_is_cut_short(django_server: Server) -> None:
    with pytest.raises(http.client.IncompleteRead) as info:
        django_server.request("/stream")
    assert info.value.partial == b"first chunk\n"
    assert django_server.json("/fast")["pid"] == django_server.first_pid  # type: ignore[attr-defined]
    assert "GET /stream: deadline of 0.5 s passed after the response had started" \
        in django_server.log()


def test_the_view_decorator_extends_the_limit(django_server: Server) -> None:
    status, body, elapsed = django_server.request("/decorated/longer")
    assert (status, body) == (200, b"done")
    assert elapsed >= LIMIT * 2


def test_wrapped_as_a_wsgi_application(table: str,
                                       tmp_path_factory: pytest.TempPathFactory) -> None:
    with _django("wsgi", table, tmp_path_factory, threads=2) as srv:
        pid = srv.json("/fast")["pid"]
        status, body, elapsed = srv.request("/sleep")
        assert (status, body) == (504, BODY)
        assert LIMIT - 0.05 <= elapsed < LIMIT + LATE
        assert srv.json("/fast")["pid"] == pid
        with pytest.raises(http.client.IncompleteRead):
            srv.request("/stream")
        assert srv.json("/fast")["pid"] == pid
        log = srv.log()
    assert only_aborts(log), log


# --- in-process: the settings -------------------------------------------------------------


@pytest.fixture
def configured() -> None:
    from django.conf import settings

    if not settings.configured:
        settings.configure(DATABASES={}, TIMEOUTCORE_DEADLINE={"seconds": 1})


@pytest.mark.parametrize(("value", "error", "words"), [
    (None, ValueError, "settings.TIMEOUTCORE_DEADLINE is needed"),
    ([30], TypeError, "settings.TIMEOUTCORE_DEADLINE must be a dict"),
    ({"secs": 30}, TypeError, "unknown key 'secs'"),
    ({"soft_limit": 3}, ValueError, "needs 'seconds'"),
    ({"seconds": -1}, ValueError, "settings.TIMEOUTCORE_DEADLINE: seconds must be a positive"),
    ({"seconds": 2, "soft_limit": 3}, ValueError, "soft_limit (3.0 s) must be less than"),
    ({"seconds": 2, "status": 302}, ValueError, "status must be an error status"),
])
def test_bad_settings_are_refused_by_name(configured: None, value: Any, error: type[Exception],
                                          words: str) -> None:
    from django.test import override_settings

    from timeoutcore.contrib.django import DeadlineMiddleware

    with override_settings(TIMEOUTCORE_DEADLINE=value), \
            pytest.raises(error, match=re.escape(words)):
        DeadlineMiddleware(lambda request: None)
