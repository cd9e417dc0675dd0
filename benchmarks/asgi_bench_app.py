"""The app bench_cancel.py serves with uvicorn: a fast sync endpoint and a slow one, with
``DeadlineMiddleware`` when TC_BENCH_DEADLINE is a number of seconds, without it when "0"."""

from __future__ import annotations

import os
import time
from typing import Any

from fastapi import FastAPI

import timeoutcore
from timeoutcore.contrib.asgi import DeadlineMiddleware

timeoutcore.patch()

app = FastAPI()
_seconds = float(os.environ.get("TC_BENCH_DEADLINE", "0"))
if _seconds:
    app.add_middleware(DeadlineMiddleware, seconds=_seconds)


@app.get("/fast")
def fast() -> dict[str, Any]:
    return {"ok": True}


@app.get("/slow")
def slow() -> dict[str, Any]:
    time.sleep(60)
    return {"slept": True}
