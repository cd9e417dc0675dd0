"""timeoutcore.run: soft/hard limits, the whole process tree killed and reaped, validation,
the JSON result; and inside a deadline scope."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pydantic
import pytest
from conftest import LATE, in_thread

from timeoutcore import DeadlineExceeded, thread_deadline
from timeoutcore.subprocess import __all__ as subprocess_all
from timeoutcore.subprocess import DEFAULT_GRACE, RunResult, run

PY = sys.executable
WAIT = 10.0  # s: the most a test waits for what it needs (a broken build fails, never hangs)

# The child ignores SIGTERM, starts a grandchild that ignores it too (an ignored signal stays
# ignored across fork and exec), prints the grandchild's pid and waits; only SIGKILL to the
# whole tree ends them. A shell starts in a millisecond, but on a loaded machine the hard
# limit still gives it a second to get to its echo.
TREE = ["sh", "-c", 'trap "" TERM; sleep 60 & echo $!; sleep 60']


@contextmanager
def _children_ignore_sigterm() -> Iterator[None]:
    """Children started meanwhile ignore SIGTERM from their first instruction on (inherited
    across fork and exec, as the trap's is): a soft limit's SIGTERM that comes before the
    shell has run its ``trap`` cannot kill it. (This process ignores it meanwhile too.)"""
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

_PR_SET_CHILD_SUBREAPER = 36


def _state(pid: int) -> str:
    """'gone', or the /proc state letter (Z = zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return "gone"


def _gone(pid: int) -> bool:
    """Not running and not a zombie: fully reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return _state(pid) == "gone"
    return False


@pytest.fixture
def subreaper() -> Iterator[None]:
    """Make this process the reaper of orphaned descendants (like PID 1 in a container), so
    that run() must reap them itself: then "no zombie" can be checked by PID."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        pytest.skip("prctl(PR_SET_CHILD_SUBREAPER) refused")
    try:
        yield
    finally:
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def test_public_names() -> None:
    assert sorted(subprocess_all) == ["DEFAULT_GRACE", "DEFAULT_TAIL", "RunResult", "run"]


def test_completed() -> None:
    r = run([PY, "-c", "import sys; print('out'); print('err', file=sys.stderr); exit(3)"],
            hard=30)
    assert r.status == "completed" and r.exit_code == 3 and r.signal is None
    assert r.stdout_tail == "out\n" and r.stderr_tail == "err\n"
    assert r.stdout_bytes == 4 and not r.ok
    assert r.pid is not None and _gone(r.pid)
    assert 0 < r.elapsed < 30


def test_ok_and_input() -> None:
    r = run([PY, "-c", "import sys; sys.stdout.write(sys.stdin.read().upper())"], hard=30,
            input=b"hello " * 100_000)
    assert r.ok and r.stdout_bytes == 600_000
    assert r.stdout_tail == ("HELLO " * 100_000)[-65536:]


def test_tail_is_the_end_and_counts_everything() -> None:
    r = run([PY, "-c", "print('x' * 100000 + 'END')"], hard=30, capture_tail=10)
    assert r.stdout_tail == "xxxxxxEND\n" and r.stdout_bytes == 100004
    r = run([PY, "-c", "print('é' * 20)"], hard=30, capture_tail=5)
    assert r.stdout_tail == "éé\n"  # cut mid-character: the broken one is dropped
    r = run([PY, "-c", "print('x')"], hard=30, capture_tail=0)
    assert r.stdout_tail == "" and r.stdout_bytes == 0


def test_soft_limit_terminates() -> None:
    r = run([PY, "-c", "import time; time.sleep(30)"], soft=0.2, hard=10, grace=5)
    assert r.status == "soft_killed" and r.signal == signal.SIGTERM and r.exit_code is None
    assert 0.2 <= r.elapsed < 0.2 + LATE


def test_hard_limit_kills() -> None:
    r = run([PY, "-c", "import time; time.sleep(30)"], hard=0.3)
    assert r.status == "timed_out" and r.signal == signal.SIGKILL
    assert 0.3 <= r.elapsed < 0.3 + LATE


def test_grace_then_kill() -> None:
    with _children_ignore_sigterm():
        r = run(TREE, soft=0.3, hard=10, grace=0.3)
    assert r.status == "timed_out" and r.signal == signal.SIGKILL
    assert 0.6 <= r.elapsed < 0.6 + LATE


def test_tree_killed_at_the_hard_limit(subreaper: None) -> None:
    """Child and grandchild both ignore SIGTERM: SIGKILL at the hard limit ends both, both
    are reaped (checked by PID), nothing is left in the session."""
    t0 = time.monotonic()
    with _children_ignore_sigterm():
        r = run(TREE, soft=0.3, hard=1.0, grace=5)
    took = time.monotonic() - t0
    assert r.status == "timed_out" and r.signal == signal.SIGKILL
    assert 1.0 <= r.elapsed < 1.0 + LATE and took < 1.0 + 2 * LATE
    grandchild = int(r.stdout_tail.split()[0])
    assert r.pid is not None
    for pid in (r.pid, grandchild):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        assert _state(pid) == "gone"


def test_tree_killed_without_being_the_reaper() -> None:
    """Not a subreaper: the orphaned grandchild goes to init. It is dead, and it is not
    this process's zombie; the child itself is reaped."""
    r = run(TREE, hard=1.0)
    assert r.status == "timed_out"
    grandchild = int(r.stdout_tail.split()[0])
    assert r.pid is not None and _gone(r.pid)
    assert _state(grandchild) in ("gone", "Z")


def test_leftovers_are_killed_when_the_command_completes(subreaper: None) -> None:
    r = run(["sh", "-c", 'trap "" TERM; sleep 60 & echo $!'], hard=30)
    assert r.status == "completed" and r.exit_code == 0
    grandchild = int(r.stdout_tail.split()[0])
    assert _gone(grandchild)


def test_descendant_in_another_process_group_is_killed(subreaper: None) -> None:
    script = (
        "import os, subprocess, sys, time\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],\n"
        "                     preexec_fn=lambda: os.setpgid(0, 0))\n"
        "print(g.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    r = run([PY, "-c", script], hard=3)  # Python starts slowly on a loaded machine
    assert r.status == "timed_out"
    assert _gone(int(r.stdout_tail.split()[0]))


def test_start_failure_is_an_error_result(tmp_path: Path) -> None:
    r = run([str(tmp_path / "missing")], hard=1)
    assert r.status == "error" and r.pid is None and "FileNotFoundError" in (r.error or "")
    r = run([PY, "-c", "pass"], hard=1, cwd=tmp_path / "nope")
    assert r.status == "error"


def test_cwd_and_env(tmp_path: Path) -> None:
    r = run([PY, "-c", "import os; print(os.getcwd(), os.environ.get('TC_X'))"], hard=30,
            cwd=tmp_path, env={**os.environ, "TC_X": "42"})
    assert r.stdout_tail.split() == [str(tmp_path), "42"]


def test_json_round_trip() -> None:
    r = run([PY, "-c", "print('ünïcode')"], hard=30, soft=20)
    data = r.to_json()
    assert isinstance(data, bytes) and data.startswith(b"{")
    back = RunResult.from_json(data)
    assert back == r
    assert RunResult.from_json(data.decode()) == r
    with pytest.raises(pydantic.ValidationError):
        RunResult.from_json(b'{"status": "weird"}')


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"cmd": "echo hi"}, "list of strings"),
        ({"cmd": b"echo"}, "list of strings"),
        ({"cmd": []}, "must not be empty"),
        ({"cmd": ["echo", 1]}, "cmd[1] must be a str"),
        ({"cmd": ["echo", None]}, "cmd[1] must be a str"),
        ({"cmd": None}, "cmd must be a list"),
        ({"hard": 0}, "hard must be a positive finite number of seconds"),
        ({"hard": -1}, "hard must be a positive finite number of seconds"),
        ({"hard": float("nan")}, "hard must be a positive finite number of seconds"),
        ({"hard": float("inf")}, "hard must be a positive finite number of seconds"),
        ({"hard": "5"}, "hard must be a number of seconds"),
        ({"hard": True}, "hard must be a number of seconds"),
        ({"soft": 0}, "soft must be a positive finite number of seconds"),
        ({"soft": float("nan")}, "soft must be a positive finite number of seconds"),
        ({"soft": 5}, "must be less than hard"),
        ({"soft": 6}, "must be less than hard"),
        ({"grace": -1}, "grace must be a non-negative finite number of seconds"),
        ({"capture_tail": -1}, "capture_tail"),
        ({"input": "text"}, "input"),
        ({"env": {"A": 1}}, "env"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any], needle: str) -> None:
    args: dict[str, Any] = {"cmd": ["true"], "hard": 5}
    args.update(kwargs)
    cmd = args.pop("cmd")
    with pytest.raises(ValueError) as info:  # pydantic.ValidationError is a ValueError
        run(cmd, **args)
    assert isinstance(info.value, pydantic.ValidationError)
    assert needle in str(info.value)


def test_missing_hard_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        run(["true"])  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        run(["true"], 5)  # type: ignore[misc]


def test_default_grace() -> None:
    assert DEFAULT_GRACE > 0


def test_scope_deadline_ends_run_and_reaps_the_tree(subreaper: None, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = f'trap "" TERM; sleep 60 & echo $$ $! > {pids}; sleep 60'
    box: dict[str, Any] = {}

    def body() -> Any:
        scope = thread_deadline(WAIT)

        def stop_once_the_tree_is_up() -> None:
            # The deadline comes once the shell has written both pids (however long it took
            # to start), while run() waits for the tree.
            end = time.monotonic() + WAIT
            while time.monotonic() < end:
                if pids.exists() and pids.read_text().endswith("\n"):
                    break
                time.sleep(0.01)
            box["stop"] = time.monotonic() + 0.05
            scope.reschedule(box["stop"])

        threading.Thread(target=stop_once_the_tree_is_up, daemon=True).start()
        with pytest.raises(DeadlineExceeded):
            with scope:
                box["result"] = run(["sh", "-c", script], hard=30)
        return time.monotonic(), scope

    ended, scope = in_thread(body)
    assert "result" not in box
    assert 0 <= ended - box["stop"] < LATE
    assert scope.overshoot < LATE
    child, grandchild = map(int, pids.read_text().split())
    for pid in (child, grandchild):
        assert _gone(pid), (pid, _state(pid))


def test_run_inside_a_scope_that_is_long_enough() -> None:
    def body() -> Any:
        with thread_deadline(30):
            return run([PY, "-c", "print(1)"], hard=20)

    r = in_thread(body)
    assert r.ok and r.stdout_tail == "1\n"
