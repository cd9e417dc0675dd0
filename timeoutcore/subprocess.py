"""``run()``: a command with a soft and a hard time limit, whose whole process tree ends.

The command starts in a session and process group of its own (``start_new_session=True``).
At the soft limit the group gets ``SIGTERM``; after ``grace`` seconds (or at the hard limit,
whichever is first) everything still running in the group and session gets ``SIGKILL``.
When the command ends by itself, whatever it left running in its process group is killed
too. The command is always reaped; descendants that were re-parented to this process (it is
PID 1, or a child subreaper) are reaped as well -- no orphans, no zombies. Inside a
``thread_deadline`` scope the scope's deadline also ends the command (killed, reaped, then
the scope raises ``DeadlineExceeded`` as usual), and so does any other stop of the scope:
a ``soft_raise`` soft limit, ``cancel()``, an earlier ``reschedule()``.

Command lists only (never a shell); the arguments are validated with pydantic, the result is
a pydantic model serialised as JSON (``timeoutcore._json``).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess as _stdlib_subprocess
import time
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Sequence, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBytes, StrictInt, StrictStr
from pydantic import field_validator, model_validator

from . import _json, _stop, _validate
from ._process_tree import (  # noqa: F401 - kill_and_reap, signal_tree: public here before
    _REAP_ORPHANS_FOR,
    _reap,
    kill_and_reap,
    reap_orphans,
    signal_tree,
)
from .blocking import bounded_wait, original, wait_for

__all__ = ["DEFAULT_GRACE", "DEFAULT_TAIL", "RunResult", "run"]

DEFAULT_GRACE = 2.0
"""Seconds between ``SIGTERM`` at the soft limit and ``SIGKILL``."""

DEFAULT_TAIL = 65536
"""Bytes kept from the end of stdout and of stderr."""

Status = Literal["completed", "soft_killed", "timed_out", "error"]

_READ_CHUNK = 65536
_DRAIN_AFTER_EXIT = 0.5  # s: reading output after the tree is gone (a runaway may hold a pipe)
_POLL_FALLBACK = (0.0005, 0.02)  # s: exit polling when pidfd_open is not available

_Popen = _stdlib_subprocess.Popen


# --- validation -------------------------------------------------------------------------


def _run_seconds(value: Any, arg: str, *, allow_zero: bool = False) -> float:
    try:
        return _validate.seconds(value, "run()", arg, allow_zero=allow_zero)
    except TypeError as exc:  # pydantic reports ValueErrors only (as ValidationError)
        raise ValueError(str(exc)) from None


class _RunSpec(BaseModel):
    """The arguments of :func:`run`, validated."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cmd: List[StrictStr]
    hard: float
    soft: Optional[float] = None
    grace: float = DEFAULT_GRACE
    cwd: Optional[Union[StrictStr, Path]] = None
    env: Optional[Dict[StrictStr, StrictStr]] = None
    input: Optional[StrictBytes] = None
    capture_tail: StrictInt = Field(default=DEFAULT_TAIL, ge=0)

    @field_validator("cmd", mode="before")
    @classmethod
    def _cmd(cls, value: Any) -> Any:
        if isinstance(value, (str, bytes)):
            raise ValueError(
                "cmd must be a list of strings: run() never uses a shell; split the command "
                "line yourself (e.g. shlex.split) or pass ['sh', '-c', line] on purpose"
            )
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"cmd must be a list of strings, not {type(value).__name__}")
        if not value:
            raise ValueError("cmd must not be empty")
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise ValueError(f"cmd[{i}] must be a str, not {type(item).__name__}")
        return list(value)

    @field_validator("hard", mode="before")
    @classmethod
    def _hard(cls, value: Any) -> float:
        return _run_seconds(value, "hard")

    @field_validator("soft", mode="before")
    @classmethod
    def _soft(cls, value: Any) -> Optional[float]:
        return None if value is None else _run_seconds(value, "soft")

    @field_validator("grace", mode="before")
    @classmethod
    def _grace(cls, value: Any) -> float:
        return _run_seconds(value, "grace", allow_zero=True)

    @model_validator(mode="after")
    def _order(self) -> _RunSpec:
        if self.soft is not None and self.soft >= self.hard:
            raise ValueError(f"soft ({self.soft:g} s) must be less than hard ({self.hard:g} s)")
        return self


# --- the result -------------------------------------------------------------------------


class RunResult(_validate.LimitNames, BaseModel):
    """What :func:`run` reports.

    ``status``: ``completed`` (ended by itself, whatever its exit code), ``soft_killed``
    (ended after ``SIGTERM`` at the soft limit), ``timed_out`` (``SIGKILL`` was needed) or
    ``error`` (could not be started: ``error`` says why). ``exit_code`` is set when the
    command exited, ``signal`` when a signal ended it. ``elapsed`` runs from the start to the
    moment the command ended. ``stdout_tail``/``stderr_tail`` are the last ``capture_tail``
    bytes, decoded as UTF-8 (invalid bytes replaced); ``stdout_bytes``/``stderr_bytes`` count
    everything that was written.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    cmd: List[str]
    pid: Optional[int]
    status: Status
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    elapsed: float
    soft: Optional[float] = None
    hard: float
    stdout_tail: str = ""
    stderr_tail: str = ""
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    error: Optional[str] = None

    @property
    def ok(self) -> bool:
        """Ended by itself with exit code 0."""
        return self.status == "completed" and self.exit_code == 0

    def to_json(self) -> bytes:
        """One JSON object, UTF-8 bytes."""
        return _json.dumps(self.model_dump(mode="json"))

    @classmethod
    def from_json(cls, data: Union[bytes, bytearray, memoryview, str]) -> RunResult:
        """The inverse of :meth:`to_json` (validated)."""
        return cls.model_validate(_json.loads(data))


# --- run --------------------------------------------------------------------------------


class _Tail:
    """The last ``cap`` bytes of a stream, and how many bytes it had."""

    __slots__ = ("buf", "cap", "total")

    def __init__(self, cap: int) -> None:
        self.buf = bytearray()
        self.cap = cap
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        self.buf += data
        if len(self.buf) > 2 * self.cap:
            del self.buf[: len(self.buf) - self.cap]

    def text(self) -> str:
        data = bytes(self.buf[-self.cap:]) if self.cap else b""
        if self.total > len(data):
            # Cut mid-character: drop the continuation bytes of the first one.
            i = 0
            while i < min(3, len(data)) and 0x80 <= data[i] < 0xC0:
                i += 1
            data = data[i:]
        return data.decode("utf-8", "replace")


class _ExitWatch:
    """Tells when the child has exited, without reaping it (pidfd, else waitid polling)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fd: Optional[int] = None
        self.delay = _POLL_FALLBACK[0]
        try:
            self.fd = os.pidfd_open(pid)  # type: ignore[attr-defined,unused-ignore]
        except (AttributeError, OSError):
            self.fd = None

    def exited(self) -> bool:
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return info is not None

    def slice(self, timeout: Optional[float]) -> Optional[float]:
        """The timeout of the next wait: without a pidfd, wake up to poll for the exit."""
        if self.fd is not None:
            return timeout
        self.delay = min(self.delay * 2, _POLL_FALLBACK[1])
        return self.delay if timeout is None else min(timeout, self.delay)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def run(
    cmd: Sequence[str],
    *,
    limit: Optional[float] = None,
    soft_limit: Optional[float] = None,
    grace: float = DEFAULT_GRACE,
    cwd: Optional[Union[str, Path]] = None,
    env: Optional[Dict[str, str]] = None,
    input: Optional[bytes] = None,  # noqa: A002 - the name subprocess.run uses
    capture_tail: int = DEFAULT_TAIL,
    hard: Optional[float] = None,
    soft: Optional[float] = None,
) -> RunResult:
    """Run ``cmd`` (a list of strings, no shell) with a hard time limit; kill its whole tree.

    ``limit`` (required): seconds after which everything left of the command gets
    ``SIGKILL``. ``soft_limit``: seconds (``< limit``) after which its process group gets
    ``SIGTERM``; ``SIGKILL`` follows ``grace`` seconds later, or at ``limit``. ``hard`` and
    ``soft`` are the older spellings of ``limit`` and ``soft_limit`` (aliases; give one
    of each pair). ``input``: bytes for its stdin (else
    ``/dev/null``). ``capture_tail``: bytes kept from the end of stdout and stderr (``0``:
    discard them). Returns a :class:`RunResult`; a command that cannot be started gives
    ``status="error"``. Bad arguments raise ``pydantic.ValidationError`` (a ``ValueError``).
    Inside a ``thread_deadline`` scope, the scope's deadline also ends it: the tree is killed
    and reaped, then the scope's interrupt goes on.
    """
    hard = _validate.alias("run()", "limit", limit, "hard", hard)
    if hard is None:
        raise TypeError("run() needs the hard limit: limit=<seconds> (alias: hard=)")
    soft = _validate.alias("run()", "soft_limit", soft_limit, "soft", soft)
    spec = _RunSpec.model_validate({
        "cmd": cmd, "hard": hard, "soft": soft, "grace": grace, "cwd": cwd, "env": env,
        "input": input, "capture_tail": capture_tail,
    })
    start = time.monotonic()
    pipe = _stdlib_subprocess.PIPE if spec.capture_tail else _stdlib_subprocess.DEVNULL
    try:
        proc = _Popen(
            spec.cmd,
            stdin=_stdlib_subprocess.PIPE if spec.input is not None
            else _stdlib_subprocess.DEVNULL,
            stdout=pipe,
            stderr=pipe,
            cwd=spec.cwd,
            env=spec.env,
            close_fds=True,
            start_new_session=True,
        )
    except (OSError, ValueError) as exc:
        return RunResult(cmd=spec.cmd, pid=None, status="error", elapsed=time.monotonic() - start,
                         soft=spec.soft, hard=spec.hard, error=f"{type(exc).__name__}: {exc}")
    return _Supervisor(spec, proc, start).result()


class _Supervisor:
    """One running command: its pipes, its limits and what happened."""

    def __init__(self, spec: _RunSpec, proc: Any, start: float) -> None:
        self.spec = spec
        self.proc = proc
        self.start = start
        self.status: Status = "completed"
        self.ended = 0.0
        self.outputs: dict[int, _Tail] = {}
        self.files: list[Any] = []
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                os.set_blocking(stream.fileno(), False)
                self.outputs[stream.fileno()] = _Tail(spec.capture_tail)
                self.files.append(stream)
        self.out_fd = proc.stdout.fileno() if proc.stdout is not None else -1
        self.err_fd = proc.stderr.fileno() if proc.stderr is not None else -1
        self.stdin_fd = -1
        self.pending = memoryview(spec.input or b"")
        if proc.stdin is not None:
            self.files.append(proc.stdin)
            self.stdin_fd = proc.stdin.fileno()
            os.set_blocking(self.stdin_fd, False)
            self._feed()

    def result(self) -> RunResult:
        watch = _ExitWatch(self.proc.pid)
        try:
            self._supervise(watch)
            self._finish()
        except BaseException:
            # The scope's deadline (or Ctrl-C) interrupted us: nothing may outlive run().
            kill_and_reap(self.proc)
            raise
        finally:
            watch.close()
            for f in self.files:
                f.close()
        rc = self.proc.returncode
        out = self.outputs.get(self.out_fd, _Tail(0))
        err = self.outputs.get(self.err_fd, _Tail(0))
        return RunResult(
            cmd=self.spec.cmd,
            pid=self.proc.pid,
            status=self.status,
            exit_code=rc if rc is not None and rc >= 0 else None,
            signal=-rc if rc is not None and rc < 0 else None,
            elapsed=round(self.ended - self.start, 6),
            soft=self.spec.soft,
            hard=self.spec.hard,
            stdout_tail=out.text(),
            stderr_tail=err.text(),
            stdout_bytes=out.total,
            stderr_bytes=err.total,
        )

    def _supervise(self, watch: _ExitWatch) -> None:
        spec, pid = self.spec, self.proc.pid
        soft_at = None if spec.soft is None else self.start + spec.soft
        kill_at = self.start + spec.hard
        killed = False
        while True:
            now = time.monotonic()
            if soft_at is not None and now >= soft_at:
                soft_at = None
                self.status = "soft_killed"
                signal_tree(pid, signal.SIGTERM)
                kill_at = min(kill_at, now + spec.grace)
            if not killed and now >= kill_at:
                killed = True
                self.status = "timed_out"
                signal_tree(pid, signal.SIGKILL)
            if watch.exited():
                self.ended = time.monotonic()
                return
            until = None if killed else (kill_at if soft_at is None else min(soft_at, kill_at))
            self._wait(watch, None if until is None else max(0.0, until - now))

    def _wait(self, watch: _ExitWatch, timeout: Optional[float]) -> None:
        """One wait for output, stdin space or the child's exit; handles what is ready."""
        poller = original(select.poll)()
        if watch.fd is not None:
            poller.register(watch.fd, select.POLLIN)
        for fd in self.outputs:
            if fd in self._open:
                poller.register(fd, select.POLLIN)
        if self.pending:
            poller.register(self.stdin_fd, select.POLLOUT)
        # Inside a scope, the thread's wake-up fd too: the scope's stop time changed.
        wake = _stop.wake_fd() if _stop.stop_time() is not None else -1
        if wake >= 0:
            poller.register(wake, select.POLLIN)
        events: list[tuple[int, int]] = []

        def step(t: Optional[float]) -> tuple[bool, None]:
            events[:] = [ev for ev in poller.poll(None if t is None else t * 1000.0)
                         if ev[0] != wake]
            return bool(events), None

        bounded_wait(step, watch.slice(timeout))
        for fd, _ in events:
            if fd == self.stdin_fd:
                self._feed()
            elif fd in self.outputs:
                self._read(fd)

    @property
    def _open(self) -> set[int]:
        return {f.fileno() for f in self.files if not f.closed}

    def _read(self, fd: int) -> bool:
        """Read what is there; ``False`` at end of file (the pipe is then closed)."""
        try:
            data = os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            return True
        if data:
            self.outputs[fd].add(data)
            return True
        self._close(fd)
        return False

    def _close(self, fd: int) -> None:
        for f in self.files:
            if not f.closed and f.fileno() == fd:
                f.close()

    def _feed(self) -> None:
        try:
            n = os.write(self.stdin_fd, self.pending[:_READ_CHUNK])
        except BlockingIOError:
            return
        except (BrokenPipeError, ConnectionResetError):
            n = len(self.pending)
        self.pending = self.pending[n:]
        if not self.pending:
            self._close(self.stdin_fd)
            self.stdin_fd = -1

    def _finish(self) -> None:
        """The command has ended (not yet reaped): kill what it left in its process group
        (its whole session if it had to be stopped), collect the rest of its output, reap."""
        pid = self.proc.pid
        stopped = self.status != "completed"
        signal_tree(pid, signal.SIGKILL, session=stopped)
        end = time.monotonic() + _DRAIN_AFTER_EXIT
        open_outputs = [fd for fd in self.outputs if fd in self._open]
        for _ in range(1 << 30):
            if not open_outputs:
                break
            left = end - time.monotonic()
            if left <= 0 or not wait_for(open_outputs, select.POLLIN, left):
                break
            open_outputs = [fd for fd in open_outputs if self._read(fd)]
        _reap(self.proc)
        reap_orphans(pid, timeout=_REAP_ORPHANS_FOR if stopped else 0.2)
