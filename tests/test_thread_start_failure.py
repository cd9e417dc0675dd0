"""A thread that could not be started leaves deadlines where they were: on time.

On 3.11 a failed ``Thread.start()`` leaves the new thread's preallocated thread state in the
interpreter with the thread id of the thread that tried; the core must still find the live
one. Each case runs in a child process: no thread at all can be started while the stack size
is out of reach, which must not touch the test process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import CHILD_BLOCKS

import timeoutcore

CHILD = CHILD_BLOCKS + textwrap.dedent("""
    import json
    import timeoutcore

    def fail_a_thread_start():
        threading.stack_size(1 << 40)  # no stack that size can be mapped
        try:
            threading.Thread(target=print).start()
        except RuntimeError:
            return True
        finally:
            threading.stack_size(0)
        return False

    def spin():
        time.sleep(0.005)

    out = {}
    with thread_deadline(60):  # the core is running before the failed start too
        pass
    out["failed"] = fail_a_thread_start()
    out["main_deadline"] = stopped_after(lambda: thread_deadline(0.2), spin)
    out["main_cancel"] = stopped_after(cancelled_soon, spin)

    def worker():
        out["worker_failed"] = fail_a_thread_start()  # the dead state gets this thread's id
        out["worker_deadline"] = stopped_after(lambda: thread_deadline(0.2), spin)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    out["engine"] = timeoutcore.ENGINE
    print(json.dumps(out))
""")


@pytest.mark.parametrize("accel", ["all", "none"])
def test_deadlines_land_on_time_after_a_thread_failed_to_start(accel: str,
                                                              tmp_path: Path) -> None:
    env = dict(os.environ, TIMEOUTCORE_ACCEL=accel)
    # cwd: a tmp dir, so that the child imports the installed package, not the source tree
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          env=env, timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["engine"] == timeoutcore.ENGINE, out  # the engine under test
    assert out["failed"] and out["worker_failed"], out  # the precondition held
    for case, want in (("main_deadline", "DeadlineExceeded"), ("main_cancel", "DeadlineCancelled"),
                       ("worker_deadline", "DeadlineExceeded")):
        kind, took = out[case]
        # Generous: a loaded machine; a lost delivery shows as the 30 s loop's end instead.
        assert kind == want and took < 10.0, (case, out[case])
