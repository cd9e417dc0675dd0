"""The JSON engines: orjson where installed, the standard library otherwise, the same bytes."""

from __future__ import annotations

import math
import os
import random
import struct
import subprocess
import sys
from typing import Any

import pytest

import timeoutcore
from timeoutcore import _json

try:
    import orjson
except ImportError:  # free-threaded CPython: orjson does not build there
    orjson = None

needs_orjson = pytest.mark.skipif(orjson is None, reason="orjson is not installed here")

# Spellings orjson uses (checked against orjson 3.x where it is installed, below).
KNOWN = [
    (0.0, b"0.0"), (-0.0, b"-0.0"), (1.0, b"1.0"), (0.1, b"0.1"), (100.0, b"100.0"),
    (1e15, b"1000000000000000.0"), (1e16, b"1e+16"), (1.5e300, b"1.5e+300"),
    (1e-4, b"0.0001"), (1.234e-5, b"0.00001234"), (-1.234e-5, b"-0.00001234"),
    (1e-5, b"0.00001"), (9.99e-6, b"9.99e-6"), (2.5e-7, b"2.5e-7"), (-2.5e-7, b"-2.5e-7"),
    (5e-324, b"5e-324"), (math.nan, b"null"), (math.inf, b"null"), (-math.inf, b"null"),
    (2**64 - 1, b"18446744073709551615"), (-(2**63), b"-9223372036854775808"),
    (True, b"true"), (None, b"null"), ("a\x00\x1f\"\\\u2028é\x7f", '"a\\u0000\\u001f\\"\\\\\u2028é\x7f"'.encode()),
    ({"a": [1, {}, [], (2, 3.5)], "b": None}, b'{"a":[1,{},[],[2,3.5]],"b":null}'),
]


@pytest.mark.parametrize("value,expected", KNOWN, ids=[repr(v)[:30] for v, _ in KNOWN])
def test_the_standard_library_engine_writes_orjsons_spelling(value: Any, expected: bytes) -> None:
    assert _json.std_dumps(value) == expected


@needs_orjson
@pytest.mark.parametrize("value,expected", KNOWN, ids=[repr(v)[:30] for v, _ in KNOWN])
def test_the_known_spellings_are_orjsons(value: Any, expected: bytes) -> None:
    assert orjson.dumps(value) == expected


def _random_floats(n: int, seed: int) -> list[float]:
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        kind = rnd.random()
        if kind < 0.5:  # any bit pattern: every exponent, subnormals, NaN, infinities
            out.append(struct.unpack("<d", rnd.getrandbits(64).to_bytes(8, "little"))[0])
        elif kind < 0.8:  # the range durations and ratios live in
            out.append(rnd.uniform(-1, 1) * 10 ** rnd.randint(-12, 12))
        else:  # short decimals
            out.append(round(rnd.uniform(0, 1000), rnd.randint(0, 8)) * 10 ** rnd.randint(-9, 3))
    return out


@needs_orjson
def test_the_same_bytes_as_orjson_for_20000_random_floats() -> None:
    for v in _random_floats(20_000, seed=14):
        assert _json.std_dumps(v) == orjson.dumps(v), repr(v)


@needs_orjson
def test_the_same_bytes_as_orjson_for_results_and_metrics_shaped_data() -> None:
    data = {
        "label": "job-é", "limit": 0.25, "elapsed": 0.2500123, "overshoot": 1.23e-5,
        "status": "timeout", "deferred": None, "nested": [{"p50": 2.5e-7, "n": 3}, []],
        "big": 2**63, "neg": -17, "empty": {},
    }
    assert _json.std_dumps(data) == orjson.dumps(data)
    assert _json.std_dumps(data, indent=True) == orjson.dumps(data, option=orjson.OPT_INDENT_2)


@pytest.mark.parametrize("bad,message", [
    ({1: 2}, "Dict key must be str"), (2**64, "64-bit"), (object(), "not JSON serializable"),
    ("\ud800", "surrogates"), ({1.5}, "not JSON serializable"),
])
def test_what_orjson_refuses_the_standard_library_engine_refuses(bad: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        _json.std_dumps(bad)
    if orjson is not None:
        with pytest.raises(TypeError):
            orjson.dumps(bad)


def test_loads_round_trips_and_refuses_what_orjson_refuses() -> None:
    data = {"a": [1, 2.5, None, True, "é"], "b": {"c": -0.0}}
    for engine_loads in (_json.std_loads, _json.loads):
        assert engine_loads(_json.std_dumps(data)) == data
        assert engine_loads(bytearray(b"[1]")) == [1]
        for bad in (b"NaN", b"[Infinity]", b"{", b"\xff"):
            with pytest.raises(ValueError):
                engine_loads(bad)


def test_the_active_engine_is_named_and_exported() -> None:
    assert timeoutcore.JSON_ENGINE == _json.ENGINE
    assert _json.ENGINE == ("orjson" if orjson is not None else "json")
    assert "JSON_ENGINE" in timeoutcore.__all__


def test_results_metrics_and_policies_work_on_the_standard_library_engine(tmp_path: Any) -> None:
    """A process where orjson is not used: the same bytes, read back the same way."""
    code = (
        "import sys, timeoutcore\n"
        "from timeoutcore import _json\n"
        "assert timeoutcore.JSON_ENGINE == 'json', timeoutcore.JSON_ENGINE\n"
        "def spin():  # its own frame: CPython 3.13.0 skips the with-exit of a frame\n"
        "    while True:  # whose while loop is interrupted (cpython#130279)\n"
        "        pass\n"
        "with timeoutcore.thread_deadline(0.02, label='x', raise_on_timeout=False) as s:\n"
        "    spin()\n"
        "r = s.result\n"
        "assert r.status == 'timed_out' and type(r).from_json(r.to_json()) == r\n"
        "sys.stdout.buffer.write(r.to_json() + b'\\n')\n"
        "m = timeoutcore.metrics.enable()\n"
        "with timeoutcore.thread_deadline(1, label='y'):\n"
        "    pass\n"
        "assert _json.loads(m.snapshot_json())['by_status'] == {'completed': 1}\n"
        "open('p.json', 'wb').write(_json.dumps({'job': {'hard': 2}}))\n"
        "assert timeoutcore.PolicyTable.from_json('p.json').get('job').hard == 2\n"
        "assert 'orjson' not in sys.modules\n"
    )
    env = dict(os.environ, TIMEOUTCORE_JSON="json")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr.decode()
    line = proc.stdout.splitlines()[0]
    if orjson is not None:  # what the orjson engine writes for the same result
        assert orjson.dumps(orjson.loads(line)) == line
    assert timeoutcore.DeadlineResult.from_json(line).label == "x"
