"""Chooses the engine: the native C core, or the pure-Python fallback.

``TIMEOUTCORE_ENGINE`` = ``auto`` (default: native where it loads, else fallback),
``native`` (fail at import if the C core cannot load) or ``fallback``.

Free-threaded CPython has no fallback: the pure-Python engine's watchdog marks an
interrupt pending and switches a hook on for the target thread, reading and writing that
thread's state (3.11: its tracer; where no hook can be had, an asynchronous exception after
a look at its stack), which is sound only while the GIL keeps the target paused. There the
C core loads or the import fails.

``core`` is the chosen :class:`~timeoutcore._engine_api.Engine`; the layers above use it
and never ask which one it is (``ENGINE``, its name, is for people and reports).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the interface costs nothing at run time
    from ._engine_api import Engine

_choice = os.environ.get("TIMEOUTCORE_ENGINE", "auto").strip().lower() or "auto"
if _choice not in ("auto", "native", "fallback"):
    raise ImportError(
        f"TIMEOUTCORE_ENGINE={_choice!r} is not one of 'auto', 'native', 'fallback'"
    )

core: Engine

#: A free-threaded build (PEP 703: "t" in its ABI flags; cheaper than importing sysconfig).
FREE_THREADED = "t" in getattr(sys, "abiflags", "")
if FREE_THREADED and _choice == "fallback":
    raise ImportError(
        "TIMEOUTCORE_ENGINE=fallback: the pure-Python engine needs a GIL, and this CPython is "
        "free-threaded; use the native engine (the default)"
    )

if _choice != "fallback":
    try:
        from . import _native

        core = _native
    except ImportError:
        if _choice == "native" or FREE_THREADED:
            raise
        _choice = "fallback"

if _choice == "fallback":
    from . import _fallback

    core = _fallback

ENGINE: str = core.NAME


def engine_of(scope: Any) -> Engine:
    """The engine a scope belongs to: the chosen one, or the fallback engine for one of
    its scopes made directly (the tests run both engines side by side)."""
    if isinstance(scope, core.Scope):
        return core
    from . import _fallback

    return _fallback


__all__ = ["ENGINE", "core", "engine_of"]
