"""Deadlines in a thread that CPython did not start, which calls Python one call at a time.

A ctypes callback called from a thread made in C takes a new thread state for each call
(``PyGILState_Ensure``/``Release``), while the core keeps one slot for the OS thread. Its
deadlines and cancels must still reach the block that runs in the current call. Each case
runs in a child process (a small C helper, built here, makes the thread)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

import timeoutcore

from conftest import CHILD_BLOCKS, FREE_THREADED

HELPER = textwrap.dedent("""
    #include <pthread.h>
    #include <stdint.h>

    typedef void (*step_fn)(int);
    struct job { step_fn step; int calls; };

    static void *run(void *p)
    {
        struct job *job = (struct job *)p;
        for (int i = 0; i < job->calls; i++)
            job->step(i); /* each call: PyGILState_Ensure ... Release */
        return NULL;
    }

    /* Calls step(0) .. step(calls - 1) from one new thread; 0, or an errno. */
    int calls_in_a_c_thread(step_fn step, int calls)
    {
        struct job job = {step, calls};
        pthread_t t;
        int err = pthread_create(&t, NULL, run, &job);
        return err != 0 ? err : pthread_join(t, NULL);
    }
""")

CHILD = CHILD_BLOCKS + textwrap.dedent("""
    import ctypes, json, sys
    import timeoutcore

    lib = ctypes.CDLL(sys.argv[1])  # a CDLL call lets the GIL go: the C thread runs
    STEP = ctypes.CFUNCTYPE(None, ctypes.c_int)
    lib.calls_in_a_c_thread.argtypes = (STEP, ctypes.c_int)

    def spin():
        pass  # a CPU loop: the hook must land

    local = threading.local()
    out = {"idents": [], "fresh": []}

    def step(i):
        out["idents"].append(threading.get_ident())
        out["fresh"].append(not hasattr(local, "seen"))  # a new thread state each call
        local.seen = True
        if i == 0:
            with thread_deadline(60):  # the slot is made on this call's state
                pass
        elif i in (1, 3):
            out[f"deadline{i}"] = stopped_after(lambda: thread_deadline(0.2), spin)
        else:
            out["cancel"] = stopped_after(cancelled_soon, spin)

    keep = STEP(step)
    out["rc"] = lib.calls_in_a_c_thread(keep, 4)
    out["engine"] = timeoutcore.ENGINE
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def helper(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("foreign")
    (d / "helper.c").write_text(HELPER)
    cc = shlex.split(sysconfig.get_config_var("CC") or "cc")
    subprocess.run([*cc, "-shared", "-fPIC", "-O1", "-o", str(d / "helper.so"),
                    str(d / "helper.c"), "-lpthread"], check=True, capture_output=True,
                   timeout=120)
    return d / "helper.so"


ENGINES = [("native", "all"), ("native", "none")] + ([] if FREE_THREADED else [("fallback", "all")])


@pytest.mark.parametrize(("engine", "accel"), ENGINES)
def test_deadlines_and_cancels_reach_each_call_of_a_thread_started_in_c(
        engine: str, accel: str, helper: Path, tmp_path: Path) -> None:
    env = dict(os.environ, TIMEOUTCORE_ACCEL=accel, TIMEOUTCORE_ENGINE=engine)
    # cwd: a tmp dir, so that the child imports the installed package, not the source tree
    proc = subprocess.run([sys.executable, "-c", CHILD, str(helper)], capture_output=True,
                          text=True, env=env, timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    want_engine = timeoutcore.ENGINE if engine == "native" else "fallback"
    assert out["engine"] == want_engine and out["rc"] == 0, out
    # The precondition: one OS thread, and a thread state of its own for every call.
    assert len(set(out["idents"])) == 1 and out["fresh"] == [True] * 4, out
    for case, want in (("deadline1", "DeadlineExceeded"), ("cancel", "DeadlineCancelled"),
                       ("deadline3", "DeadlineExceeded")):
        kind, took = out[case]
        # Generous: a loaded machine; a lost delivery shows as the 30 s loop's end instead.
        assert kind == want and took < 10.0, (case, out[case])
