"""What happened in a guarded block, as a pydantic model serialised as JSON
(orjson where installed, else the standard library, the same bytes: ``timeoutcore._json``).

``scope.result`` builds a :class:`DeadlineResult` lazily, after the block exited: a block
nobody asks a result of never touches pydantic. :class:`ResultLog` appends results as JSON
Lines, per scope (``thread_deadline(..., result_log=log)``) or for every scope
(``set_default_result_log(log)``).
"""

from __future__ import annotations

import datetime as _dt
import os
import threading
import time
from pathlib import Path
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict

from . import _json
from ._status import Status, status_of
from ._status import thread_name as _thread_name_of

__all__ = ["DeadlineResult", "ResultLog", "Status", "build_result", "status_of"]

# time.time() - time.monotonic(), read once: results are then reproducible
_WALL_MINUS_MONOTONIC = time.time() - time.monotonic()


class DeadlineResult(BaseModel):
    """One guarded run: limits, timing, and how it ended.

    Built only when asked for: ``scope.result`` after the block exited, or a result log.
    Immutable; JSON with :meth:`to_json`, back with :meth:`from_json`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: the scope's label, or None
    label: Optional[str]
    #: ``threading`` name of the thread that ran the block (None once that thread ended)
    thread_name: Optional[str]
    #: kernel thread id of that thread
    thread_native_id: Optional[int]
    #: the hard limit in seconds (None: an absolute deadline, or none)
    limit: Optional[float]
    #: the soft limit in seconds, or None
    soft_limit: Optional[float]
    #: wall-clock time of the block's entry (UTC)
    started_at: _dt.datetime
    #: seconds from entry to exit
    elapsed: float
    #: how it ended: ``completed``, ``soft_exceeded`` (passed its soft limit only),
    #: ``timed_out``, ``cancelled`` (``cancel()``) or ``error`` (it raised an exception of
    #: its own)
    status: Status
    #: seconds between the deadline and the block's exit, if the deadline fired
    overshoot: Optional[float]
    #: seconds the interrupt waited for the thread to leave protected code (None: no fire)
    deferred: Optional[float] = None
    #: "file:line in function" of the protected code that held it, if any
    deferred_where: Optional[str] = None
    #: for ``error``: the exception's class name
    error_type: Optional[str] = None
    #: for ``error``: ``str()`` of the exception
    error_message: Optional[str] = None

    def to_json(self) -> bytes:
        """The result as one line of JSON (bytes)."""
        return _json.dumps(self.model_dump(mode="json"))

    @classmethod
    def from_json(cls, data: Union[bytes, str]) -> DeadlineResult:
        """Parse what :meth:`to_json` wrote."""
        return cls.model_validate(_json.loads(data))


def build_result(scope: Any, thread_name: Optional[str] = None) -> DeadlineResult:
    """Build the result of an exited scope (the caller checked that it exited)."""
    status = status_of(scope)
    exc = scope.exit_exception
    error = exc if status == "error" else None
    if thread_name is None:
        thread_name = _thread_name_of(scope.thread_ident)
    # wall-clock start derived from the monotonic entry time: no clock read per block
    started = _WALL_MINUS_MONOTONIC + scope.entered_at
    return DeadlineResult(
        label=scope.label,
        thread_name=thread_name,
        thread_native_id=scope.native_id,
        limit=scope.limit,
        soft_limit=getattr(scope, "_soft", None),
        started_at=_dt.datetime.fromtimestamp(started, tz=_dt.timezone.utc),
        elapsed=scope.elapsed(),
        status=status,
        overshoot=scope.overshoot,
        deferred=scope.deferred,
        deferred_where=scope.deferred_where,
        error_type=None if error is None else type(error).__qualname__,
        error_message=None if error is None else str(error),
    )


def _write_all(fd: int, data: bytes) -> None:
    # The loop lives in its own frame: CPython 3.13.0 skips a frame's with-exits when an
    # exception is raised at a `while <cond>:` back-edge (cpython#130279), and the caller
    # holds a lock in a with statement.
    written = os.write(fd, data)
    while written < len(data):  # only for exotic file systems
        written += os.write(fd, data[written:])


class ResultLog:
    """Appends results to a JSON Lines file; safe with concurrent writers.

    Each result is written with one ``os.write`` on a descriptor opened with ``O_APPEND``,
    so lines from threads and processes never interleave or overwrite one another.
    """

    def __init__(self, path: Union[str, "os.PathLike[str]"]) -> None:
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._lock = threading.Lock()

    def write(self, result: DeadlineResult) -> None:
        """Append one result as one line."""
        line = result.to_json() + b"\n"
        with self._lock:
            _write_all(self._fd, line)

    def read(self) -> list[DeadlineResult]:
        """Every result in the file, in order."""
        with open(self.path, "rb") as f:
            return [DeadlineResult.from_json(line) for line in f if line.strip()]

    def close(self) -> None:
        """Close the file (idempotent)."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> ResultLog:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
