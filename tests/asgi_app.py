"""The FastAPI app that tests/test_asgi.py serves with a real uvicorn process.

Set up as the docs say: ``timeoutcore.patch()`` at import, the middleware with one line.
Environment: TC_ASGI_SILENT_PORT (a loopback port that accepts and never answers),
TC_ASGI_PG_DSN (PostgreSQL, optional).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio.to_thread
import psycopg
from fastapi import Depends, FastAPI
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

import timeoutcore
from timeoutcore.contrib.asgi import DeadlineMiddleware
from timeoutcore.contrib.db import guard

timeoutcore.patch()

app = FastAPI()
app.add_middleware(DeadlineMiddleware, seconds=1.5, soft_limit=0.5,
                   routes={"/fast": 30.0, "/stats": 30.0, "/roomy": 5.0, "/own-timeout": 30.0})

# Endpoints entered, and left however their body ended (_tracked): a stopped request's thread
# must get there (the stop is an exception in the thread, not an abandoned thread).
entered: dict[str, int] = {}
left: dict[str, int] = {}
counts_lock = threading.Lock()


def _count(counts: dict[str, int], name: str) -> None:
    with counts_lock:
        counts[name] = counts.get(name, 0) + 1


@contextlib.contextmanager
def _tracked(name: str) -> Iterator[None]:
    """Counts the endpoint ``name`` in ``entered``, and in ``left`` however its body ends."""
    _count(entered, name)
    try:
        yield
    finally:
        _count(left, name)


def slow_dependency() -> int:
    with _tracked("dependency"):
        time.sleep(60)
        return 1


@app.get("/fast")
def fast() -> dict[str, Any]:
    return {"ok": True, "thread": threading.current_thread().name}


@app.get("/sleep")
def sleep() -> dict[str, Any]:
    with _tracked("sleep"):
        time.sleep(60)
        return {"slept": True}


@app.get("/socket")
def socket_read() -> dict[str, Any]:
    with _tracked("socket"):
        with socket.create_connection(("127.0.0.1", int(os.environ["TC_ASGI_SILENT_PORT"]))) as s:
            return {"got": s.recv(10).decode()}


@app.get("/cpu")
def cpu() -> dict[str, Any]:
    with _tracked("cpu"):
        n = 0
        while True:
            n += 1


@app.get("/pg")
def pg() -> dict[str, Any]:
    with _tracked("pg"):
        with psycopg.connect(os.environ["TC_ASGI_PG_DSN"], application_name="tc-asgi") as conn:
            with guard(conn):
                conn.execute("select pg_sleep(60)")
        return {"slept": True}


@app.get("/subprocess")
def child() -> dict[str, Any]:
    with _tracked("subprocess"):
        subprocess.run(["sleep", "60"], check=False)
        return {"slept": True}


@app.get("/dependency")
def with_dependency(value: int = Depends(slow_dependency)) -> dict[str, Any]:
    return {"value": value}


@app.get("/async")
async def async_sleep() -> dict[str, Any]:
    with _tracked("async"):
        await asyncio.sleep(60)
        return {"slept": True}


def _sleep_tracked() -> None:
    with _tracked("own-timeout"):
        time.sleep(60)


@app.get("/own-timeout")
async def own_timeout() -> dict[str, Any]:
    # The app's own timeout around a thread call, far inside the request's deadline: the
    # cancel it makes stops the thread too.
    try:
        await asyncio.wait_for(run_in_threadpool(_sleep_tracked), 0.3)
    except asyncio.TimeoutError:
        return {"timed_out": True}
    return {"timed_out": False}


@app.get("/roomy")
def roomy() -> dict[str, Any]:
    time.sleep(2.5)  # past the default deadline, inside this route's own
    return {"roomy": True}


@app.get("/stream")
def stream() -> StreamingResponse:
    def body() -> Iterator[bytes]:
        with _tracked("stream"):
            for _ in range(600):
                yield b"chunk\n"
                time.sleep(0.1)

    return StreamingResponse(body(), media_type="text/plain")


@app.get("/stats")
async def stats() -> dict[str, Any]:
    children = [p for p in os.listdir("/proc") if p.isdigit() and _parent(p) == os.getpid()]
    with counts_lock:
        done, began = dict(left), dict(entered)
    return {
        "pid": os.getpid(),
        "engine": timeoutcore.ENGINE,
        "threads": threading.active_count(),
        "fds": len(os.listdir("/proc/self/fd")),
        "borrowed": anyio.to_thread.current_default_thread_limiter().borrowed_tokens,
        "children": len(children),
        "left": done,
        "entered": began,
    }


def _parent(pid: str) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1
