"""The ``subprocess.Popen`` part of ``patch()``: scope-owned children.

Imported by ``timeoutcore.patch`` when ``patch()`` runs. A child started inside a scope
gets a session and process group of its own and is *scope-owned*: when the deadline
interrupts ``wait``/``communicate`` (and so ``subprocess.run``/``call``/``check_output``),
its group is killed and it is reaped before the interrupt goes on.
"""

from __future__ import annotations

import subprocess
from typing import Any, Callable, Optional, Tuple

from .blocking import Make, _is_number, _remaining, _shield, bounded_wait
from ._process_tree import kill_and_reap
from .errors import _DeadlineInterrupt

_OWNED = "_timeoutcore_owned"  # on a Popen started inside a scope: "group" or "pid"
_START_NEW_SESSION_POS = 15  # Popen(args, bufsize, ..., restore_signals, start_new_session)


def _make_popen_init(orig: Callable[..., None]) -> Callable[..., None]:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if _remaining() is None:
            return orig(self, *args, **kwargs)
        own = "pid"
        if ("start_new_session" not in kwargs and "process_group" not in kwargs
                and len(args) <= _START_NEW_SESSION_POS):
            kwargs["start_new_session"] = True
        if kwargs.get("start_new_session") is True:
            own = "group"
        orig(self, *args, **kwargs)
        setattr(self, _OWNED, own)
        return None

    return __init__


def _abandon(proc: Any) -> None:
    """The deadline interrupted a wait on ``proc``: a scope-owned child is killed, reaped."""
    owned = getattr(proc, _OWNED, None)
    if owned is not None:
        kill_and_reap(proc, group=owned == "group")


def _make_popen_wait(orig: Callable[..., Any]) -> Callable[..., Any]:
    def wait(self: Any, timeout: Optional[float] = None) -> Any:
        if (_remaining() is None or self.returncode is not None
                or not (timeout is None or _is_number(timeout))):
            return orig(self, timeout)

        def step(t: Optional[float]) -> Tuple[bool, Any]:
            with _shield():
                try:
                    return True, orig(self, t)
                except subprocess.TimeoutExpired as exc:
                    return False, exc

        return _owned_wait(self, step, timeout)

    return wait


def _owned_wait(proc: Any, step: Callable[[Optional[float]], Tuple[bool, Any]],
                timeout: Optional[float]) -> Any:
    """Run a Popen wait in deadline-bounded steps; if the deadline interrupts it, kill and
    reap the scope-owned child before the interrupt goes on."""
    try:
        result = bounded_wait(step, timeout)
    except _DeadlineInterrupt:
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
            with _shield():
                try:
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
