"""JSON for results, result logs, metrics, the CLI and the Redis registry: orjson when it is
installed, the standard library's ``json`` otherwise, the same bytes either way.

orjson has no free-threaded build (and refuses to build for one), so on free-threaded
CPython the package does not depend on it (setup.py) and this module falls back.  The
fallback writes what orjson writes for the JSON-native values the package serialises
(dict with str keys, list, tuple, str, int, float, bool, None): compact separators, UTF-8
without ``\\u`` escapes beyond the control characters, NaN and infinities as ``null``, and
orjson's float spelling (Python's shortest repr, except that exponents -5..-1 are written out
in full -- ``0.00001`` -- and negative exponents have no zero padding -- ``2.5e-7``).
Anything else is a TypeError, as with orjson.

``ENGINE`` says which one is active ("orjson" or "json"); the environment variable
``TIMEOUTCORE_JSON=json`` forces the standard library (tests, or to compare).
"""

from __future__ import annotations

import json as _std
import os
from typing import Any, Callable, Iterable, Union

__all__ = ["ENGINE", "dumps", "loads", "std_dumps", "std_loads"]

_MAX_INT = 2**64 - 1  # orjson's range: -(2**63) .. 2**64 - 1
_MIN_INT = -(2**63)


def _float(v: float) -> str:
    if v != v or v in (float("inf"), float("-inf")):
        return "null"
    r = repr(v)
    e = r.find("e")
    if e < 0:
        return r
    mant, exp = r[:e], int(r[e + 1 :])
    if exp > 0:
        return r
    if exp >= -5:  # written out: 1.234e-05 -> 0.00001234
        sign = "-" if mant.startswith("-") else ""
        digits = mant.lstrip("-").replace(".", "")
        return f"{sign}0.{'0' * (-exp - 1)}{digits}"
    return f"{mant}e{exp}"  # 2.5e-07 -> 2.5e-7


_str: Callable[[str], str] = _std.encoder.encode_basestring  # the C one where it exists


def _encode(o: Any, out: list[str], indent: int, level: int) -> None:
    if o is None:
        out.append("null")
    elif o is True:
        out.append("true")
    elif o is False:
        out.append("false")
    elif isinstance(o, str):
        out.append(_str(o))
    elif isinstance(o, int):
        if not _MIN_INT <= o <= _MAX_INT:
            raise TypeError("Integer exceeds 64-bit range")
        out.append(int.__repr__(o))
    elif isinstance(o, float):
        out.append(_float(o))
    elif isinstance(o, dict):
        _container(o.items(), "{}", out, indent, level)
    elif isinstance(o, (list, tuple)):
        _container(((None, v) for v in o), "[]", out, indent, level)
    else:
        raise TypeError(f"Type is not JSON serializable: {type(o).__name__}")


def _container(items: Iterable[tuple[Any, Any]], brackets: str, out: list[str], indent: int,
               level: int) -> None:
    """A dict's (key, value) pairs, or a list's (None, value) pairs, between `brackets`."""
    pad = "\n" + " " * (indent * (level + 1)) if indent else ""
    out.append(brackets[0])
    empty = True
    for key, value in items:
        if not empty:
            out.append(",")
        empty = False
        out.append(pad)
        if brackets == "{}":
            if not isinstance(key, str):
                raise TypeError("Dict key must be str")
            out.append(_str(key))
            out.append(": " if indent else ":")
        _encode(value, out, indent, level + 1)
    if indent and not empty:
        out.append("\n" + " " * (indent * level))
    out.append(brackets[1])


def std_dumps(obj: Any, indent: bool = False) -> bytes:
    """``obj`` as JSON bytes, written by the standard library's rules above (orjson's
    bytes); ``indent``: two spaces, as orjson's OPT_INDENT_2."""
    out: list[str] = []
    _encode(obj, out, 2 if indent else 0, 0)
    try:
        return "".join(out).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: orjson refuses it too
        raise TypeError("str is not valid UTF-8: surrogates not allowed") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"invalid JSON: {name} is not a JSON value")


def std_loads(data: Union[bytes, bytearray, memoryview, str]) -> Any:
    """Parse JSON with the standard library; NaN/Infinity refused, as orjson does.
    Errors are ValueError (json.JSONDecodeError for malformed input)."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        data = bytes(data).decode("utf-8")
    return _std.loads(data, parse_constant=_no_constant)


dumps: Callable[..., bytes]
loads: Callable[[Union[bytes, bytearray, memoryview, str]], Any]

try:
    if os.environ.get("TIMEOUTCORE_JSON", "").strip().lower() == "json":
        raise ImportError("TIMEOUTCORE_JSON=json")
    import orjson as _orjson
except ImportError:
    ENGINE = "json"
    dumps = std_dumps
    loads = std_loads
else:
    ENGINE = "orjson"
    _OPT_INDENT = _orjson.OPT_INDENT_2

    def dumps(obj: Any, indent: bool = False) -> bytes:
        """``obj`` as JSON bytes (orjson); ``indent``: two spaces."""
        return _orjson.dumps(obj, option=_OPT_INDENT if indent else None)

    loads = _orjson.loads  # orjson.JSONDecodeError is a json.JSONDecodeError (ValueError)
