"""The one hook the core calls around a block that needs more than a deadline.

A scope gets it when it has a soft limit, cleanup handlers, an observer or a result log of
its own;
every scope gets it (as the core's default hook) while metrics or a default result log are
on. A scope that needs none of this never calls into Python at all.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Optional

from ._engine import core

log = logging.getLogger("timeoutcore")


class _State:
    metrics = False
    result_log: Optional[Any] = None  # a ResultLog for every scope


state = _State()


def _refresh_default() -> None:
    on = state.metrics or state.result_log is not None
    core._set_default_hook(dispatch if on else None)


def set_metrics(on: bool) -> None:
    state.metrics = on
    _refresh_default()


def set_default_result_log(result_log: Optional[Any]) -> None:
    state.result_log = result_log
    _refresh_default()


def dispatch(scope: Any, event: str, exc: Any) -> None:
    """Called by the core with ``event`` "enter" (before arming) or "exit" (after
    disarming, before DeadlineExceeded is raised, shielded from interrupts)."""
    observer = getattr(scope, "_observer", None)
    if event == "enter":
        soft = getattr(scope, "_soft", None)
        if soft is not None:
            from .soft import timer

            timer.register(scope, time.monotonic() + soft)
        if observer is not None:
            _notify(observer.on_enter, scope)
        return
    if scope.expired():
        _run_cleanups(scope)
    if observer is not None:
        _notify(observer.on_exit, scope)
    result_log = getattr(scope, "_result_log", None) or state.result_log
    if result_log is None and not state.metrics:
        return
    from .results import build_result, status_of

    if result_log is not None:
        result_log.write(build_result(scope))
    if state.metrics:  # counted from the scope itself: no pydantic on this path
        from .metrics import collector

        collector.record(status_of(scope), scope.label, scope.elapsed(), scope.overshoot)


def _notify(method: Any, scope: Any) -> None:
    try:
        method(scope)
    except Exception:  # noqa: BLE001 - an observer never breaks the block it observes
        log.exception("scope observer %r failed for scope %r", method, scope.label)


def _run_cleanups(scope: Any) -> None:
    cleanups = getattr(scope, "_cleanups", None)
    while cleanups:
        fn, args = cleanups.pop()  # last registered first
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - logged; the other handlers still run
            log.exception("on_timeout handler %r failed for scope %r", fn, scope.label)
