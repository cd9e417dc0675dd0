"""The import check of CPython internals (csrc/tc_gil_check.c): a wrong address is refused,
the accelerators that need it are off, the core still delivers, and the reason is logged; a
wrong address among the thread-state fields the core reads itself keeps the core from running
at all.

Each case is one child interpreter (the check runs once, at import), started in a tmp dir so
that the installed package is the one imported. The child keeps the ``timeoutcore`` logger's
records from before the import on, imports with a tracer set and an exception being handled
(the thread-state check sets and puts back both), then runs one deadline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import timeoutcore

from conftest import FREE_THREADED

pytestmark = pytest.mark.skipif(
    timeoutcore.ENGINE != "native", reason="the import check is the native core's"
)

#: csrc/tc_accel.c: accel_uses_internals (the GIL state)
GIL_USERS = {"fast_window", "self_fire", "direct_delivery"}
SWITCHED_OFF = "switched off by TIMEOUTCORE_ACCEL"

#: A CPU loop under a 0.2 s deadline, in a child's main module: ``ended`` is when it ended.
DEADLINE = """
t0 = time.monotonic()
try:
    with timeoutcore.thread_deadline(0.2):
        while True:
            pass
except timeoutcore.DeadlineExceeded:
    ended = time.monotonic() - t0
"""

CHILD = r"""
import json, logging, sys, time

records = []


class Keep(logging.Handler):
    def emit(self, record):
        records.append([record.levelname, record.getMessage()])


log = logging.getLogger("timeoutcore")
log.setLevel(logging.DEBUG)
log.addHandler(Keep())


def tracer(frame, event, arg):
    return None


sys.settrace(tracer)
try:
    raise LookupError("being handled during the import")
except LookupError as handled:
    import timeoutcore
    from timeoutcore import _native

    kept = {"tracer": sys.gettrace() is tracer, "handled": sys.exc_info()[1] is handled}
sys.settrace(None)
""" + DEADLINE + r"""
print(json.dumps({"records": records, "kept": kept, "ended": ended,
                  "internals": _native.internals_check(),
                  "why": timeoutcore.accelerators(explain=True)}))
"""


def run_child(tmp_path: Path, **env: str) -> dict[str, Any]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TIMEOUTCORE_")}
    environ.update(env)
    p = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path, env=environ)
    assert p.returncode == 0, p.stderr
    out: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    # The check puts back what it set, and the core alone still ends a CPU loop.
    assert out["kept"] == {"tracer": True, "handled": True}
    assert 0.15 < out["ended"] < 10.0, out["ended"]
    return out


def logged(out: dict[str, Any], level: str) -> list[str]:
    return [msg for lvl, msg in out["records"] if lvl == level]


def assert_one_debug_line_per_reason(out: dict[str, Any]) -> None:
    """Every accelerator off for another reason than TIMEOUTCORE_ACCEL has its DEBUG line,
    naming it and why; nothing else is logged at DEBUG."""
    expected = sorted(f"accelerator {name} is off: {why}" for name, why in out["why"].items()
                      if why is not None and why != SWITCHED_OFF)
    assert sorted(logged(out, "DEBUG")) == expected


def supported() -> set[str]:
    """The accelerators a default import turns on: those this CPython supports -- but for
    `prearm` on a free-threaded build, off while `self_fire` is on, and `placement`, which
    needs it."""
    why = timeoutcore.accelerators(explain=True)
    names = {n for n, w in why.items() if not (w or "").startswith("unsupported on this CPython")}
    if FREE_THREADED:
        names -= {"prearm", "placement"}
    return names


@pytest.mark.parametrize("hook, users, reason", [
    pytest.param("TIMEOUTCORE_TEST_CORRUPT_GIL_OFFSET", GIL_USERS,
                 "the switch interval read through the GIL state",
                 marks=pytest.mark.skipif(FREE_THREADED, reason="no GIL state to point at"),
                 id="gil"),
    pytest.param("TIMEOUTCORE_TEST_CORRUPT_FRAME_OFFSET", {"frame_address"},
                 "the thread state's current frame is not the one PyThreadState_GetFrame() "
                 "shows",
                 marks=pytest.mark.skipif(
                     (timeoutcore.accelerators(explain=True)["frame_address"] or "").startswith(
                         "unsupported"), reason="frame_address: not on this CPython"),
                 id="frame"),
])
def test_a_wrong_address_is_refused_said_and_logged(tmp_path: Path, hook: str,
                                                    users: set[str], reason: str) -> None:
    """The check points at a wrong address (the test hook): refused at its first read,
    exactly the accelerators that need that part are off, each says why at DEBUG, and one
    WARNING says the check failed and which it turned off."""
    out = run_child(tmp_path, **{hook: "1"})
    said = "failed its import check: " + reason
    off = users & supported()
    assert off, "no accelerator this check is for is on here"
    for name in off:
        assert out["why"][name].startswith(said), out["why"][name]
    said = out["why"][min(off)]
    if users == GIL_USERS:  # the GIL state's check: also what internals_check() says
        assert out["internals"] == said
    else:
        assert out["internals"] in ("passed", "not checked")
    for name in supported() - users:
        assert out["why"][name] is None, (name, out["why"][name])
    assert_one_debug_line_per_reason(out)
    (warning,) = logged(out, "WARNING")
    assert said in warning and "deadlines still work" in warning
    assert f"so {', '.join(sorted(off, key=list(out['why']).index))} " in warning, warning


def test_a_passed_check_logs_only_what_this_cpython_lacks(tmp_path: Path) -> None:
    out = run_child(tmp_path)
    assert out["internals"] == "passed"
    assert {n for n, why in out["why"].items() if why is None} == supported()
    assert_one_debug_line_per_reason(out)
    assert logged(out, "WARNING") == []


def test_switched_off_accelerators_are_not_logged(tmp_path: Path) -> None:
    out = run_child(tmp_path, TIMEOUTCORE_ACCEL="none")
    # The GIL state is not looked at; the thread state (the core's own reads) was, and held.
    assert out["internals"] == "not checked"
    assert_one_debug_line_per_reason(out)
    assert all("unsupported on this CPython" in msg for msg in logged(out, "DEBUG"))
    assert logged(out, "WARNING") == []


def _import_with_a_wrong_thread_state_offset(tmp_path: Path, engine: str,
                                             code: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TIMEOUTCORE_")}
    environ.update(TIMEOUTCORE_TEST_CORRUPT_TSTATE_OFFSET="1", TIMEOUTCORE_ENGINE=engine)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env=environ)


#: the hook corrupts the read of async_exc (check 4), which the core itself makes
REFUSED = "failed its import check: the thread state's async_exc "

DEADLINE_ENDS = "import time, timeoutcore\n" + DEADLINE + "print(timeoutcore.ENGINE, ended)\n"


@pytest.mark.skipif(FREE_THREADED, reason="no pure-Python engine without a GIL")
def test_a_wrong_thread_state_offset_makes_the_core_refuse_and_the_fallback_take_over(
        tmp_path: Path) -> None:
    """The core reads thread-state fields itself: when the check finds them elsewhere, the
    C core does not run at all; ``auto`` takes the pure-Python engine, which ends the
    deadline, and one WARNING on stderr (logging never configured: its last resort) says
    why. The DEBUG lines have nowhere to go without logging imported first, and are not
    made (a plain import loads no logging: tests/test_layers.py)."""
    p = _import_with_a_wrong_thread_state_offset(tmp_path, "auto", DEADLINE_ENDS)
    assert p.returncode == 0, p.stderr
    engine, took = p.stdout.split()
    assert engine == "fallback" and 0.15 < float(took) < 10.0, p.stdout
    (line,) = p.stderr.splitlines()
    assert REFUSED in line and "does not run on this CPython" in line, line


def test_a_wrong_thread_state_offset_is_an_import_error_where_the_core_is_asked_for(
        tmp_path: Path) -> None:
    """``TIMEOUTCORE_ENGINE=native`` (and a free-threaded CPython, which has no other
    engine) gets an ImportError that says why, never a core reading wrong addresses."""
    engines = ["native"] + (["auto"] if FREE_THREADED else [])
    for engine in engines:
        p = _import_with_a_wrong_thread_state_offset(tmp_path, engine, "import timeoutcore")
        assert p.returncode != 0, (engine, p.stdout)
        assert "ImportError" in p.stderr and REFUSED in p.stderr, (engine, p.stderr)
