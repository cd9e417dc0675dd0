"""contrib.asgi.DeadlineMiddleware in a real uvicorn process, driven by a real HTTP client.

The app (tests/asgi_app.py) is a FastAPI app set up as the docs say. A request blocked in a
sync endpoint (sleep, a silent socket, a CPU loop, pg_sleep, a subprocess, a sync
dependency) or an async one gets its 504 at the deadline, its thread leaves the endpoint,
the pool's tokens come back, and the same server process goes on serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import timeoutcore  # noqa: E402
from timeoutcore.contrib.asgi import DeadlineMiddleware  # noqa: E402

HERE = Path(__file__).resolve().parent
DEADLINE = 1.5  # the app's default (asgi_app.py)
STOPPED_WELL_BEFORE = 10.0  # every blocked endpoint would run 60 s unstopped

SLOW = ["sleep", "socket", "cpu", "subprocess", "dependency", "async"]


class Server:
    def __init__(self, url: str, log: Path, proc: subprocess.Popen[bytes]) -> None:
        self.url, self.log, self.proc = url, log, proc

    def stats(self) -> dict[str, Any]:
        r = httpx.get(f"{self.url}/stats", timeout=30)
        r.raise_for_status()
        result: dict[str, Any] = r.json()
        return result


@pytest.fixture(scope="module")
def silent_port(silent_peer: Any) -> int:
    """A loopback port whose peer accepts connections and never sends a byte."""
    port: int = silent_peer.port
    return port


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, silent_port: int,
           postgres_dsn: str) -> Iterator[Server]:
    """uvicorn serving asgi_app:app on a socket bound here (no port race), in its own
    process; stopped after the module."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(256)
    port = listener.getsockname()[1]
    log = tmp_path_factory.mktemp("uvicorn") / "server.log"
    env = dict(os.environ, TC_ASGI_SILENT_PORT=str(silent_port), TC_ASGI_PG_DSN=postgres_dsn)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "asgi_app:app", "--app-dir", str(HERE),
             "--fd", str(listener.fileno()), "--log-level", "warning", "--no-access-log"],
            stdout=out, stderr=subprocess.STDOUT, env=env, pass_fds=[listener.fileno()],
            # Not the repository's root: `python -m` puts the working folder first on
            # sys.path, and the source tree's timeoutcore (no compiled core for this
            # interpreter) would stand in for the installed one.
            cwd=str(HERE))
    listener.close()
    srv = Server(f"http://127.0.0.1:{port}", log, proc)
    try:
        end = time.monotonic() + 60
        while True:
            try:
                srv.stats()
                break
            except httpx.HTTPError:
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < end, "uvicorn did not come up:\n" + log.read_text()
                time.sleep(0.1)
        yield srv
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


async def _get(client: Any, path: str) -> tuple[int, str, float]:
    t0 = time.monotonic()
    r = await client.get(path)
    return r.status_code, r.text, time.monotonic() - t0


def _gather(server: Server, paths: list[str]) -> list[tuple[int, str, float]]:
    async def main() -> list[tuple[int, str, float]]:
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client:
            return list(await asyncio.gather(*(_get(client, p) for p in paths)))

    return asyncio.run(main())


def _settled(server: Server, want: dict[str, int]) -> dict[str, Any]:
    """Stats once the endpoints' threads have recorded leaving (they do before the 504 is
    sent; the poll only covers the client seeing the response first)."""
    end = time.monotonic() + 10
    while True:
        stats = server.stats()
        if all(stats["left"].get(k, 0) >= n for k, n in want.items()) or time.monotonic() > end:
            return stats


def _pg_connections(dsn: str) -> int:
    import psycopg

    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "select count(*) from pg_stat_activity where application_name = 'tc-asgi'"
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_every_kind_of_blocked_request_gets_504_at_its_deadline(server: Server,
                                                                postgres_dsn: str) -> None:
    assert server.stats()["engine"] == timeoutcore.ENGINE  # the installed package's
    pid = server.stats()["pid"]
    results = _gather(server, [f"/{p}" for p in SLOW + ["pg"]] + ["/fast"])
    for path, (status, text, took) in zip(SLOW + ["pg", "fast"], results):
        if path == "fast":
            assert status == 200, text
            continue
        assert status == 504, (path, status, text)
        assert text == "request deadline exceeded\n"
        assert DEADLINE <= took < STOPPED_WELL_BEFORE, (path, took)
    stats = _settled(server, {k: 1 for k in SLOW + ["pg"]})
    # Every endpoint's thread (and the async one) left through its finally block.
    # Each endpoint began before its deadline (1.5 s is far more than a thread takes to
    # start, on a loaded machine too) and left through its finally block.
    missing = [k for k in SLOW + ["pg"]
               if not stats["entered"].get(k) or stats["left"].get(k) != stats["entered"][k]]
    assert not missing, f"{missing} {json.dumps(stats)}\n{server.log.read_text()[-3000:]}"
    assert stats["pid"] == pid and stats["borrowed"] == 0 and stats["children"] == 0, stats
    end = time.monotonic() + 10
    while _pg_connections(postgres_dsn) and time.monotonic() < end:
        time.sleep(0.05)  # the backend exits just after the client closed
    assert _pg_connections(postgres_dsn) == 0


def test_the_apps_own_timeout_around_a_thread_call_stops_the_thread(server: Server) -> None:
    before = server.stats()["left"].get("own-timeout", 0)
    r = httpx.get(f"{server.url}/own-timeout", timeout=60)
    assert r.status_code == 200 and r.json() == {"timed_out": True}, r.text
    # Left long before its 60 s sleep or the route's 30 s deadline would end it.
    stats = _settled(server, {"own-timeout": before + 1})
    assert stats["left"].get("own-timeout") == before + 1, stats
    assert stats["borrowed"] == 0, stats


def test_a_route_with_a_longer_limit_finishes(server: Server) -> None:
    [(status, text, took)] = _gather(server, ["/roomy"])
    assert status == 200 and "roomy" in text and took >= 2.5


def test_a_streaming_response_is_cut_off_never_completed(server: Server) -> None:
    before = server.stats()["left"].get("stream", 0)
    chunks = 0
    with pytest.raises(httpx.RemoteProtocolError):  # the connection closed mid-body
        with httpx.stream("GET", f"{server.url}/stream", timeout=30) as r:
            assert r.status_code == 200
            for _ in r.iter_lines():
                chunks += 1
    assert 0 < chunks < 600
    assert _settled(server, {"stream": before + 1})["left"]["stream"] == before + 1


def test_fifty_slow_requests_and_fast_ones_leave_nothing_behind(server: Server) -> None:
    pid = server.stats()["pid"]

    async def burst() -> tuple[list[int], list[int]]:
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client:
            slow = [asyncio.ensure_future(client.get("/sleep")) for _ in range(50)]
            fast: list[int] = []
            while not all(s.done() for s in slow):
                fast.append((await client.get("/fast")).status_code)
            return [s.result().status_code for s in slow], fast

    after = []
    for _ in range(2):
        slow, fast = asyncio.run(burst())
        assert slow == [504] * 50
        assert fast and set(fast) == {200}
        after.append(_settled(server, {}))
    first, second = after
    assert first["pid"] == second["pid"] == pid
    assert first["borrowed"] == second["borrowed"] == 0
    # A second burst reuses anyio's pool: no thread or descriptor piles up per request.
    assert second["threads"] <= first["threads"] + 2, after
    assert second["fds"] <= first["fds"] + 2, after
    # A stopped request gave its token back: 40 fast requests at once (anyio's default
    # limiter) all get a thread.
    assert {s for s, _, _ in _gather(server, ["/fast"] * 40)} == {200}


def test_the_server_log_has_the_warnings_and_no_stray_exception(server: Server) -> None:
    _gather(server, ["/sleep"])
    with contextlib.suppress(httpx.HTTPError):
        server.stats()
    text = server.log.read_text()
    assert "GET /sleep passed its soft limit of 0.5 s" in text
    assert "GET /sleep passed its 1.5 s deadline; answered 504" in text
    # A stopped request never surfaces as an application error: no traceback, no 500.
    assert "Traceback" not in text and "Exception in ASGI application" not in text, text


async def _app(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("not called")


@pytest.mark.parametrize("kwargs, error, words", [
    ({"seconds": 0}, ValueError, "seconds must be a positive"),
    ({"seconds": "2"}, TypeError, "seconds must be a number"),
    ({"seconds": 1, "soft_limit": 1}, ValueError, "soft_limit"),
    ({"seconds": 1, "status": 99}, ValueError, "status"),
    ({"seconds": 1, "status": True}, ValueError, "status"),
    ({"seconds": 1, "body": "text"}, TypeError, "body must be bytes"),
    ({"seconds": 1, "routes": {"reports": 2}}, ValueError, "path prefix"),
    ({"seconds": 1, "routes": {"/r": -1}}, ValueError, "routes"),
    ({"seconds": 1, "routes": [("/r", 1)]}, TypeError, "routes must be a mapping"),
])
def test_bad_settings_are_refused_by_name(kwargs: dict[str, Any], error: type[Exception],
                                          words: str) -> None:
    with pytest.raises(error, match=words):
        DeadlineMiddleware(_app, **kwargs)


def test_route_limits_take_the_longest_prefix() -> None:
    mw = DeadlineMiddleware(_app, 2.0, routes={"/a": 5.0, "/a/b": None, "/c": 1})
    assert mw.limit_for("/x") == 2.0 and mw.limit_for("/a/z") == 5.0
    assert mw.limit_for("/a/b/c") is None and mw.limit_for("/c") == 1.0
