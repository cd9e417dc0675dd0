"""The latency accelerators' switch: what ``accelerators()`` reports, ``TIMEOUTCORE_ACCEL``,
the import check of CPython internals -- and that deadlines are delivered with them off.
What each accelerator does is tested beside it, in tests/accelerators/ (the only readers of
its counters; their skip mark: ``accelerators.accelerated``).

Each configuration is read once at import, so each runs in a child interpreter (cwd: a tmp
dir, so the installed package is the one imported).
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
from timeoutcore import _fallback

from conftest import FREE_THREADED, needs_gil

NAMES = {
    "anticipation", "fast_window", "self_fire", "prearm", "sleeping_tracer",
    "direct_delivery", "prepare", "placement", "rescue", "remote_relay", "frame_address",
}
#: the ones that read or write CPython internals (csrc/tc_accel.c)
INTERNALS = {"fast_window", "self_fire", "direct_delivery"}

native_only = pytest.mark.skipif(
    timeoutcore.ENGINE != "native", reason="the accelerators are the native core's"
)

# The child: report the accelerators, then three deadlines that must all end, each with
# its time: a CPU loop, time.sleep under patch(), and a cancel from another thread.
CHILD = r"""
import json, threading, time, warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    import timeoutcore
from timeoutcore import DeadlineCancelled, DeadlineExceeded, thread_deadline

out = {"active": timeoutcore.accelerators(), "why": timeoutcore.accelerators(explain=True),
       "warnings": [str(w.message) for w in caught]}
if timeoutcore.ENGINE == "native":
    from timeoutcore import _native
    out["internals"] = _native.internals_check()

def timed(body):
    t0 = time.monotonic()
    try:
        body()
    except (DeadlineExceeded, DeadlineCancelled) as exc:
        return type(exc).__name__, time.monotonic() - t0
    return "ran on", time.monotonic() - t0

def cpu():
    with thread_deadline(0.2):
        while True:
            pass

def sleep():
    with thread_deadline(0.2):
        time.sleep(10)

def cancelled():
    scopes, ready, result = [], threading.Event(), []
    def worker():
        result.append(timed(lambda: guarded()))
    def guarded():
        with thread_deadline(30) as scope:
            scopes.append(scope)
            ready.set()
            while True:
                pass
    t = threading.Thread(target=worker)
    t.start()
    ready.wait(10)
    time.sleep(0.05)
    t0 = time.monotonic()
    scopes[0].cancel()
    t.join(10)
    name, _ = result[0] if result else ("ran on", 0.0)
    return name, time.monotonic() - t0, t.is_alive()

if DELIVER:
    timeoutcore.patch()
    out["cpu"] = timed(cpu)
    out["sleep"] = timed(sleep)
    out["cancel"] = cancelled()
    timeoutcore.unpatch()
print(json.dumps(out))
"""


def supported() -> set[str]:
    """The accelerators this CPython supports, whatever this process's TIMEOUTCORE_ACCEL."""
    why = timeoutcore.accelerators(explain=True)
    return {n for n in NAMES if not (why[n] or "").startswith("unsupported on this CPython")}


def child(tmp_path: Path, deliver: bool = True, **env: str) -> dict[str, Any]:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("TIMEOUTCORE_ACCEL", "TIMEOUTCORE_TEST_CORRUPT_GIL_OFFSET")}
    environ.update(env)
    p = subprocess.run(
        [sys.executable, "-c", f"DELIVER = {deliver}\n" + CHILD],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=environ,
    )
    assert p.returncode == 0, p.stderr
    result: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return result


def assert_delivered(out: dict[str, Any]) -> None:
    """The three deadlines ended as they must, within generous bounds."""
    name, took = out["cpu"]
    assert name == "DeadlineExceeded" and 0.19 <= took < 2.0, out["cpu"]
    name, took = out["sleep"]
    assert name == "DeadlineExceeded" and 0.19 <= took < 2.0, out["sleep"]
    name, took, alive = out["cancel"]
    assert name == "DeadlineCancelled" and took < 2.0 and not alive, out["cancel"]


def test_keys_and_types() -> None:
    active, why = timeoutcore.accelerators(), timeoutcore.accelerators(explain=True)
    assert set(active) == NAMES and set(why) == NAMES
    for name in NAMES:
        assert isinstance(active[name], bool)
        assert (why[name] is None) == active[name]
        assert why[name] is None or (isinstance(why[name], str) and why[name])


@needs_gil
def test_the_pure_python_engine_has_the_same_names_all_off() -> None:
    assert _fallback.accelerators() == dict.fromkeys(NAMES, False)
    assert _fallback.accelerators(explain=True) == dict.fromkeys(NAMES, "pure-Python engine")


@native_only
def test_none_switches_every_one_off_and_deadlines_still_land(tmp_path: Path) -> None:
    out = child(tmp_path, TIMEOUTCORE_ACCEL="none")
    assert out["active"] == dict.fromkeys(NAMES, False)
    for name, why in out["why"].items():
        assert why == "switched off by TIMEOUTCORE_ACCEL" or why.startswith(
            "unsupported on this CPython"), (name, why)
    assert out["warnings"] == []
    assert out["internals"] == "not checked"  # nothing private read or written
    assert_delivered(out)


@native_only
def test_a_named_subset_is_what_is_on(tmp_path: Path) -> None:
    out = child(tmp_path, deliver=False, TIMEOUTCORE_ACCEL=" Rescue , remote_relay,")
    on = {n for n, active in out["active"].items() if active}
    assert on == {"rescue", "remote_relay"} & supported()
    for name in NAMES - on:
        expected = "switched off by TIMEOUTCORE_ACCEL" if name in supported() else "unsupported"
        assert out["why"][name].startswith(expected), (name, out["why"][name])


@native_only
def test_an_unknown_name_warns_and_the_rest_applies(tmp_path: Path) -> None:
    out = child(tmp_path, deliver=False, TIMEOUTCORE_ACCEL="rescue,warp_drive")
    (message,) = out["warnings"]
    assert "'warp_drive'" in message and "remote_relay" in message and "'none'" in message
    assert out["active"]["rescue"] == ("rescue" in supported())
    assert not out["active"]["prepare"]


@native_only
@pytest.mark.skipif(not FREE_THREADED, reason="free-threaded builds")
def test_free_threaded_the_self_fire_replaces_the_pre_arm_by_default(tmp_path: Path) -> None:
    """Free-threaded, `self_fire` is on by default and the pre-arm off, saying why (it
    would switch the hook's events on ahead of every deadline, for every thread);
    `prepare` then works through the self-fire's trigger. Named without `self_fire`, the
    pre-arm is on and `prepare` works through it; with neither, `prepare` is off, saying
    why. Deadlines land every way."""
    out = child(tmp_path)
    assert out["active"]["self_fire"], out["why"]["self_fire"]
    assert out["why"]["prearm"] == "off while self_fire is on (free-threaded builds)"
    assert out["why"]["placement"] == "needs prearm, which is off"
    assert out["active"]["prepare"], out["why"]["prepare"]
    assert_delivered(out)
    out = child(tmp_path, TIMEOUTCORE_ACCEL="prearm,prepare,rescue,remote_relay")
    assert out["active"]["prearm"] and out["active"]["prepare"], out["why"]
    assert_delivered(out)
    out = child(tmp_path, TIMEOUTCORE_ACCEL="prepare,rescue,remote_relay")
    assert out["why"]["prepare"] == "needs prearm, which is off"
    assert_delivered(out)


@native_only
@pytest.mark.skipif(FREE_THREADED, reason="no GIL state to point the check at")
def test_a_wrong_internal_address_is_refused(tmp_path: Path) -> None:
    out = child(tmp_path, TIMEOUTCORE_TEST_CORRUPT_GIL_OFFSET="1")
    assert out["internals"].startswith("failed its import check: "), out["internals"]
    for name in INTERNALS:
        assert not out["active"][name]
        if name in supported():  # off because of the check
            assert out["why"][name].startswith("failed its import check: "), out["why"][name]
            assert "switch interval" in out["why"][name]
    for name in NAMES - INTERNALS:  # the others do not need the internals
        assert out["active"][name] == (name in supported()), (name, out["why"][name])
    assert_delivered(out)


@native_only
@pytest.mark.skipif(os.environ.get("TIMEOUTCORE_ACCEL", "all").strip().lower() not in ("", "all"),
                    reason="TIMEOUTCORE_ACCEL chose the accelerators")
def test_this_process_passed_its_import_check() -> None:
    """The interpreter running the tests: the check must not refuse a sound build (on a
    free-threaded one too, where only safe delivery's gc.collecting depends on it)."""
    from timeoutcore import _native

    assert _native.internals_check() == "passed"
    why = timeoutcore.accelerators(explain=True)
    for name in NAMES:  # the GIL state's users, and those with a check of their own
        assert not (why[name] or "").startswith("failed its import check"), (name, why[name])
