"""The one hook the engine calls around a block that needs more than a deadline.

A scope gets it when it has a soft limit, cleanup handlers, an observer or a result log of
its own; every scope gets it (as the engine's default hook) while metrics or a default
result log are on. A scope that needs none of this never calls into Python at all.

This module sits below the features it serves and never imports them: metrics hands it a
recorder (:func:`set_metrics`), a result log comes in as an object with ``write``, and
what the scope layer needs of the other features (:data:`features`) is plugged in by the
package root as loaders.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from . import _stop
from ._engine import core
from ._status import status_of

#: ``record(status, label, elapsed, overshoot, deferred)``, called for every exited block.
Recorder = Callable[[str, Optional[str], float, Optional[float], Optional[float]], None]


class _Features:
    """What the scope layer reaches of the features above it. ``timeoutcore/__init__.py``
    (the package root, above every layer) plugs in loaders that import the feature on first
    use; until then each slot says what is missing."""

    @staticmethod
    def _missing(*args: Any) -> Any:
        raise RuntimeError("a timeoutcore feature module was not plugged in")

    #: ``build_result(scope) -> DeadlineResult`` (timeoutcore.results)
    build_result: Callable[[Any], Any] = _missing
    #: ``soft_register(scope, when)``: the soft timer watches ``scope`` (timeoutcore.soft)
    soft_register: Callable[[Any, float], None] = _missing
    #: ``policy_table() -> PolicyTable``: the process's default table (timeoutcore.policy)
    policy_table: Callable[[], Any] = _missing


features = _Features()


class _State:
    recorder: Optional[Recorder] = None  # metrics.collector.record while metrics are on
    result_log: Optional[Any] = None  # a ResultLog for every scope


state = _State()


def _refresh_default() -> None:
    on = state.recorder is not None or state.result_log is not None
    core._set_default_hook(dispatch if on else None)


def set_metrics(recorder: Optional[Recorder]) -> None:
    """Count every exited block with ``recorder`` (None: stop counting)."""
    state.recorder = recorder
    _refresh_default()


def set_default_result_log(result_log: Optional[Any]) -> None:
    """Write the result of every exited block to ``result_log`` (None: stop)."""
    state.result_log = result_log
    _refresh_default()


def dispatch(scope: Any, event: str, exc: Any) -> None:
    """Called by the engine with ``event`` "enter" (before arming) or "exit" (after
    disarming, before DeadlineExceeded is raised, shielded from interrupts)."""
    observer = getattr(scope, "_observer", None)
    if event == "enter":
        soft = getattr(scope, "_soft", None)
        if soft is not None:
            features.soft_register(scope, time.monotonic() + soft)
            if scope._soft_raise:  # a stop time for this thread's waits (timeoutcore._stop)
                # Read after the soft timer's registration, which the first time imports
                # timeoutcore.soft and starts its thread: measured from before that, the
                # waits' soft stop came that much before entered_at + soft.
                _stop.add_soft(scope, time.monotonic() + soft)
        if observer is not None:
            _notify(observer.on_enter, scope)
        return
    if getattr(scope, "_soft_raise", False):
        _stop.remove_soft(scope)
    if scope.expired():
        _run_cleanups(scope)
    if observer is not None:
        _notify(observer.on_exit, scope)
    result_log = getattr(scope, "_result_log", None) or state.result_log
    if result_log is not None:
        result_log.write(features.build_result(scope))
    recorder = state.recorder
    if recorder is not None:  # counted from the scope itself: no pydantic on this path
        recorder(status_of(scope), scope.label, scope.elapsed(), scope.overshoot,
                 scope.deferred)


def _log_exception(message: str, *args: Any) -> None:
    import logging  # only when something failed: not a cost of `import timeoutcore`

    logging.getLogger("timeoutcore").exception(message, *args)


def _notify(method: Any, scope: Any) -> None:
    try:
        method(scope)
    except Exception:  # noqa: BLE001 - an observer never breaks the block it observes
        _log_exception("scope observer %r failed for scope %r", method, scope.label)


def _run_cleanups(scope: Any) -> None:
    cleanups = getattr(scope, "_cleanups", None)
    while cleanups:
        fn, args = cleanups.pop()  # last registered first
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - logged; the other handlers still run
            _log_exception("on_timeout handler %r failed for scope %r", fn, scope.label)
