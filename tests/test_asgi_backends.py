"""DeadlineMiddleware on each anyio backend, the app called directly through ASGI.

tests/test_asgi.py runs the real thing (uvicorn, asyncio). Here the same middleware runs
under anyio's asyncio and trio backends with no server: a sync endpoint blocked in
``time.sleep`` gets the 504 at its deadline, its thread leaves the endpoint, the pool's
token is back, and nothing surfaces after the request.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("anyio")
pytest.importorskip("starlette")

import anyio  # noqa: E402
import anyio.to_thread  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

import timeoutcore  # noqa: E402
from timeoutcore.contrib.asgi import DeadlineMiddleware  # noqa: E402


def _backends() -> list[str]:
    try:
        import trio  # noqa: F401
    except ImportError:
        return ["asyncio"]
    return ["asyncio", "trio"]


@pytest.fixture(autouse=True)
def patched() -> Iterator[None]:
    timeoutcore.patch()
    yield
    timeoutcore.unpatch()


def _app(left: list[str]) -> Starlette:
    def slow(request: Any) -> JSONResponse:
        try:
            time.sleep(60)
        finally:
            left.append(threading.current_thread().name)
        return JSONResponse({"slept": True})

    def fast(request: Any) -> JSONResponse:
        return JSONResponse({"ok": True})

    return Starlette(routes=[Route("/slow", slow), Route("/fast", fast)],
                     middleware=[Middleware(DeadlineMiddleware, seconds=0.3)])


async def _call(app: Starlette, path: str) -> tuple[int, bytes]:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "headers": [],
             "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1)}
    got: dict[str, Any] = {"body": b""}

    async def receive() -> dict[str, Any]:
        await anyio.sleep(3600)  # no disconnect while the request runs
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            got["status"] = message["status"]
        else:
            got["body"] += message.get("body", b"")

    await app(scope, receive, send)
    return got["status"], got["body"]


@pytest.mark.parametrize("backend", _backends())
def test_a_blocked_sync_endpoint_gets_504_and_its_thread_leaves(backend: str) -> None:
    left: list[str] = []
    app = _app(left)

    async def main() -> tuple[int, bytes, float, int, int, bytes]:
        t0 = time.monotonic()
        status, body = await _call(app, "/slow")
        took = time.monotonic() - t0
        borrowed = anyio.to_thread.current_default_thread_limiter().borrowed_tokens
        fast_status, fast_body = await _call(app, "/fast")  # the loop and pool go on
        await anyio.sleep(0.2)  # a late interrupt or cancel would surface here
        return status, body, took, borrowed, fast_status, fast_body

    status, body, took, borrowed, fast_status, fast_body = anyio.run(main, backend=backend)
    assert status == 504 and body == b"request deadline exceeded\n"
    assert 0.3 <= took < 5.0, took
    assert len(left) == 1 and borrowed == 0  # the thread left before the 504 went out
    assert fast_status == 200 and fast_body == b'{"ok":true}'


def _is_ours(value: object) -> bool:
    return type(value).__module__.startswith("timeoutcore")


@pytest.mark.parametrize("backend", _backends())
def test_the_context_a_server_copies_as_the_response_ends_holds_nothing_of_it(
        backend: str) -> None:
    """A server copies the request's context as its last body message goes out (uvicorn's
    keep-alive timer, whose cancelled handle stays in the loop a while): that copy keeps
    nothing of the middleware's alive, for a plain response and for a streaming one (sent
    from a child task on some Starlette versions). A request object held there would keep
    its deadline entry and closures alive past the request -- enough garbage to wake the
    collector every few dozen requests of a busy server."""
    from starlette.responses import StreamingResponse

    def chunks() -> Iterator[bytes]:
        yield b"a"
        yield b"b"

    def streamed(request: Any) -> StreamingResponse:
        return StreamingResponse(chunks())

    def fast(request: Any) -> JSONResponse:
        return JSONResponse({"ok": True})

    app = Starlette(routes=[Route("/fast", fast), Route("/stream", streamed)],
                    middleware=[Middleware(DeadlineMiddleware, seconds=30)])
    copies: list[contextvars.Context] = []

    async def call(path: str) -> bytes:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(),
                 "query_string": b"", "root_path": "", "headers": [],
                 "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1)}
        body = b""

        async def receive() -> dict[str, Any]:
            await anyio.sleep(3600)
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            nonlocal body
            if message["type"] == "http.response.body":
                body += message.get("body", b"")
                if not message.get("more_body", False):
                    copies.append(contextvars.copy_context())  # as the server does

        await app(scope, receive, send)
        return body

    async def main() -> tuple[bytes, bytes]:
        return await call("/fast"), await call("/stream")

    fast_body, stream_body = anyio.run(main, backend=backend)
    assert fast_body == b'{"ok":true}' and stream_body == b"ab"
    assert len(copies) == 2
    for copy in copies:
        assert not [v for v in copy.values() if _is_ours(v)]  # broken: the request is held
