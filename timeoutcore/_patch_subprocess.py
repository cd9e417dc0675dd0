"""The ``subprocess.Popen`` part of ``patch()``: scope-owned children.

Imported by ``timeoutcore.patch`` when ``patch()`` runs. A child started inside a scope
gets a session and process group of its own and is *scope-owned*: when the deadline
interrupts ``wait``/``communicate`` (and so ``subprocess.run``/``call``/``check_output``),
its group is killed and it is reaped before the interrupt goes on. And a scope that is
stopped (its deadline, ``cancel()``, ``cancel_all()``) kills, at its exit, every
scope-owned child started inside it that still runs -- its process group and session,
grandchildren included -- and reaps it, whatever the block was doing when it stopped;
``kill_children(scope)`` does the same from any thread.

These waits are not cleanups, so none of them is shielded: they end at the thread's stop
time (hard deadline, ``soft_raise`` soft limit, ``reschedule``, ``cancel``; see
``timeoutcore._stop``) like every other wait. ``wait`` polls a pidfd of the child together
with the thread's wake-up eventfd; ``communicate`` is the stdlib's own, whose inner waits
(a patched selector, the patched ``wait``) are woken the same way. A wait that ends for a
stop -- the deadline's interrupt, or a soft exception -- kills the child's group and session
and reaps it before the exception goes on.
"""

from __future__ import annotations

import os
import select
import subprocess
from typing import Any, Callable, Optional, Tuple

from . import _stop
from ._engine import core
from .blocking import Make, _is_number, _poll_step, _remaining, _shield, bounded_wait, original
from ._process_tree import kill_and_reap, kill_session
from .errors import _DeadlineInterrupt

_OWNED = "_timeoutcore_owned"  # on a Popen started inside a scope: "group" or "pid"
_START_NEW_SESSION_POS = 15  # Popen(args, bufsize, ..., restore_signals, start_new_session)


def _make_popen_init(orig: Callable[..., None]) -> Callable[..., None]:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        stacks = core.scope_stacks(False)
        if not stacks:
            return orig(self, *args, **kwargs)
        own = "pid"
        if ("start_new_session" not in kwargs and "process_group" not in kwargs
                and len(args) <= _START_NEW_SESSION_POS):
            kwargs["start_new_session"] = True
        if kwargs.get("start_new_session") is True:
            own = "group"
        orig(self, *args, **kwargs)
        setattr(self, _OWNED, own)
        for scope in stacks[0]:
            _adopt(scope, self)
        return None

    return __init__


def _adopt(scope: Any, proc: Any) -> None:
    """Make ``proc`` a child of ``scope``: killed if the scope is stopped. Children already
    reaped are forgotten here, so a long-lived scope holds only the ones that may run."""
    children: Optional[list[Any]] = getattr(scope, "_children", None)
    if children is None:
        children = scope._children = []
        scope.on_timeout(kill_children, scope)
    children[:] = [p for p in children if original(subprocess.Popen.poll)(p) is None]
    children.append(proc)


def kill_children(scope: Any) -> int:
    """Kill and reap every scope-owned child started inside ``scope`` that still runs, with
    its process group and session (for a child that has exited: what is left of its
    session). Runs at the exit of a stopped scope; callable from any thread. Returns how
    many children were still running."""
    children: list[Any] = list(getattr(scope, "_children", None) or ())
    running = 0
    for proc in children:
        owned = getattr(proc, _OWNED, None)
        if proc.returncode is None:
            running += 1
            kill_and_reap(proc, group=owned == "group")
        elif owned == "group":
            kill_session(proc.pid)
    return running


def _abandon(proc: Any) -> None:
    """The deadline interrupted a wait on ``proc``: a scope-owned child is killed, reaped."""
    owned = getattr(proc, _OWNED, None)
    if owned is not None:
        kill_and_reap(proc, group=owned == "group")


def _pidfd(pid: int) -> int:
    try:
        return int(os.pidfd_open(pid))  # type: ignore[attr-defined,unused-ignore]
    except (AttributeError, OSError):  # no pidfd (old kernel), or already reaped
        return -1


def _make_popen_wait(orig: Callable[..., Any]) -> Callable[..., Any]:
    def wait(self: Any, timeout: Optional[float] = None) -> Any:
        if (_remaining() is None or self.returncode is not None
                or not (timeout is None or _is_number(timeout))):
            return orig(self, timeout)
        fd = _pidfd(self.pid)
        if fd < 0:
            return orig(self, timeout)
        try:
            poller = original(select.poll)()
            poller.register(fd, select.POLLIN)
            ready = _poll_step(poller)

            def step(t: Optional[float]) -> Tuple[bool, Any]:
                if not ready(t)[0]:
                    return False, subprocess.TimeoutExpired(self.args, 0.0)  # timeout: set below
                with _shield():  # it has exited: this only reaps it (no waiting)
                    try:
                        return True, orig(self, 0)
                    except subprocess.TimeoutExpired as exc:  # another thread reaps it
                        return False, exc

            return _owned_wait(self, step, timeout)
        finally:
            os.close(fd)

    return wait


def _owned_wait(proc: Any, step: Callable[[Optional[float]], Tuple[bool, Any]],
                timeout: Optional[float]) -> Any:
    """Run a Popen wait in stop-bounded steps; if a stop ends it (the deadline's interrupt,
    a soft exception), kill and reap the scope-owned child before the exception goes on."""
    try:
        result = bounded_wait(step, timeout)
    except BaseException as exc:
        if isinstance(exc, _DeadlineInterrupt) or _stop.stopping():
            _abandon(proc)
        raise
    if isinstance(result, subprocess.TimeoutExpired):
        result.timeout = timeout  # type: ignore[assignment]
        raise result
    return result


def _make_communicate(orig: Callable[..., Any]) -> Callable[..., Any]:
    def communicate(self: Any, input: Any = None, timeout: Optional[float] = None) -> Any:  # noqa: A002
        if (_remaining() is None or not (timeout is None or _is_number(timeout))):
            return orig(self, input, timeout)
        sent = [False]

        def step(t: Optional[float]) -> Tuple[bool, Any]:
            data = None if sent[0] else input  # a retried communicate() must not resend
            sent[0] = True
            try:  # not shielded: its inner waits (patched) end at the stop themselves
                return True, orig(self, data, t)
            except subprocess.TimeoutExpired as exc:
                return False, exc

        return _owned_wait(self, step, timeout)

    return communicate


def targets() -> list[tuple[str, Any, str, Make]]:
    """(group, owner, attribute, make(original) -> wrapper) for ``subprocess.Popen``."""
    return [
        ("subprocess", subprocess.Popen, "__init__", _make_popen_init),
        ("subprocess", subprocess.Popen, "wait", _make_popen_wait),
        ("subprocess", subprocess.Popen, "communicate", _make_communicate),
    ]
