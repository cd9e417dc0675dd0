"""The deferral log: a deadline interrupt that waited long for protected code says so.

The native core delivers a fired interrupt only outside protected code
(:mod:`timeoutcore.protect`). When a scope's interrupt waited longer than the cap for the
thread to leave protected code, the scope's exit calls :func:`_report` once (shielded),
and one warning on the ``timeoutcore`` logger names the scope and the protected frame that
held it. ``set_deferral_log_cap(None)`` turns it off; the time is in ``scope.deferred``
either way.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from . import _validate
from ._status import thread_name

#: The default cap, seconds: well above what a log call or a queue operation holds an
#: interrupt (tens of microseconds), well below what a user notices.
DEFAULT_CAP = 0.05

_lock = threading.Lock()
_cap: Optional[float] = DEFAULT_CAP
_apply: Any = None  # core._set_deferral_report, installed by the native engine


def _report(scope: Any) -> None:
    import logging  # only when a deferral was long: not a cost of `import timeoutcore`

    logging.getLogger("timeoutcore").warning(
        "deadline interrupt deferred %.1f ms by protected code: label=%s thread=%s "
        "held at %s (overshoot %.1f ms)",
        (scope.deferred or 0.0) * 1e3, scope.label,
        thread_name(scope.thread_ident), scope.deferred_where,
        (scope.overshoot or 0.0) * 1e3,
    )


def _push() -> None:
    if _apply is not None:
        _apply(None if _cap is None else _report, 0.0 if _cap is None else _cap)


def _install(apply: Any) -> None:
    """Called by the engine that defers (the native one) with its setter."""
    global _apply
    with _lock:
        _apply = apply
        _push()


def set_deferral_log_cap(seconds: Optional[float]) -> None:
    """Log (once per scope, a warning on the ``timeoutcore`` logger) every deadline
    interrupt that waited longer than ``seconds`` for its thread to leave protected code,
    with the frame that held it. ``None`` turns the log off. Default: 0.05 s."""
    global _cap
    cap = _validate.seconds(seconds, "set_deferral_log_cap()", "seconds", allow_zero=True,
                            allow_none=True)
    with _lock:
        _cap = cap
        _push()


def deferral_log_cap() -> Optional[float]:
    """The cap in force (seconds), or None when the deferral log is off."""
    return _cap
