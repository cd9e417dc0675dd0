"""Chooses the engine: the native C core, or the pure-Python fallback.

``TIMEOUTCORE_ENGINE`` = ``auto`` (default: native where it loads, else fallback),
``native`` (fail at import if the C core cannot load) or ``fallback``.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

_choice = os.environ.get("TIMEOUTCORE_ENGINE", "auto").strip().lower() or "auto"
if _choice not in ("auto", "native", "fallback"):
    raise ImportError(
        f"TIMEOUTCORE_ENGINE={_choice!r} is not one of 'auto', 'native', 'fallback'"
    )

core: Any
ENGINE: str

if _choice != "fallback":
    try:
        from . import _native

        core = _native.core
        ENGINE = "native"
    except ImportError:
        if _choice == "native":
            raise
        _choice = "fallback"

if _choice == "fallback":
    from . import _fallback

    core = _fallback
    ENGINE = "fallback"

__all__ = ["ENGINE", "core", "ModuleType"]
