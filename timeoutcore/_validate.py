"""The one check of a number of seconds (and of the limits' two spellings) for the package.

It gives the same messages as the C core's ``parse_seconds`` (csrc), so an error reads the
same whichever engine or layer caught it::

    thread_deadline(): seconds must be a number of seconds (int or float) or None, not str
    run(): hard must be a positive finite number of seconds, got 0
    sleep(): seconds is too large (1e12 s; at most 3e8)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal, Optional, overload

#: The longest limit accepted (about 9.5 years), as in the C core.
MAX_SECONDS = 3.0e8


@overload
def seconds(value: Any, where: str, arg: str, *, allow_zero: bool = ...,
            allow_none: Literal[False] = ..., bounded: bool = ...) -> float: ...


@overload
def seconds(value: Any, where: str, arg: str, *, allow_zero: bool = ...,
            allow_none: Literal[True], bounded: bool = ...) -> Optional[float]: ...


def seconds(value: Any, where: str, arg: str, *, allow_zero: bool = False,
            allow_none: bool = False, bounded: bool = True) -> Optional[float]:
    """``value`` as a float number of seconds, or a ``TypeError``/``ValueError`` that names
    ``where`` (the function, e.g. ``"run()"``) and ``arg`` (the argument).

    Accepted: an ``int`` or ``float`` (not a ``bool``), finite, positive (``allow_zero``:
    zero too), at most :data:`MAX_SECONDS` (unless ``bounded`` is false: the timeout of a
    wait may be longer than any limit). ``None`` is returned as ``None`` when ``allow_none``
    is true and refused otherwise.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{where}: {arg} must be a number of seconds (int or float) or None, "
            f"not {type(value).__name__}"
        )
    v = float(value)
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        kind = "non-negative" if allow_zero else "positive"
        raise ValueError(f"{where}: {arg} must be a {kind} finite number of seconds, "
                         f"got {value!r}")
    if bounded and v > MAX_SECONDS:
        raise ValueError(f"{where}: {arg} is too large ({value!r} s; at most 3e8)")
    return v


def monotonic(value: Any, where: str) -> float:
    """``value`` as an absolute ``time.monotonic()`` deadline (``when``), or the C core's
    ``TypeError``/``ValueError`` naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{where}: when must be a time.monotonic() value (int or float), "
            f"not {type(value).__name__}"
        )
    v = float(value)
    if not math.isfinite(v) or v < 0 or v > 9.0e9:
        raise ValueError(f"{where}: when must be a finite time.monotonic() value, got {value!r}")
    return v


def alias(where: str, name: str, value: Any, old_name: str, old_value: Any) -> Any:
    """The value of an argument that has a name and an older alias (``limit=`` and
    ``hard=``): whichever was given (``None``: neither), a ``TypeError`` if both were."""
    if old_value is None:
        return value
    if value is not None:
        raise TypeError(f"{where}: give {name} or its alias {old_name}, not both")
    return old_value


class LimitNames:
    """``limit``/``soft_limit`` on a pydantic model whose fields have the older names
    ``hard``/``soft`` (kept as the serialised keys, so what was written before still
    parses)."""

    if TYPE_CHECKING:  # the model's own fields; nothing for pydantic to collect here
        hard: float
        soft: Optional[float]

    @property
    def limit(self) -> float:
        """The hard limit in seconds (``hard`` is its older name)."""
        return self.hard

    @property
    def soft_limit(self) -> Optional[float]:
        """The soft limit in seconds, or None (``soft`` is its older name)."""
        return self.soft
