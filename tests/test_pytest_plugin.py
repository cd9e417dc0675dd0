"""timeoutcore.contrib.pytest: pytest runs of sample suites (tests/pytest_plugin_samples.py)
in a subprocess each, with the real pytest-timeout, pytest-xdist and PostgreSQL.

Each hanging sample must fail with pytest-timeout's message, its fixtures' teardown must
run, the next test must pass in the same process, the JUnit XML must record every test, and
the process must leave no thread of ours and no patch behind. A test stuck in a C call the
deadline cannot reach must end the run (pytest-timeout's stack dump and ``os._exit``) after
the grace period, never hang.
"""

from __future__ import annotations

import importlib.util
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import pytest_plugin_samples as samples

pytest_plugins = ["pytester"]

TIMEOUT = 1.0
MESSAGE = f"Timeout (>{TIMEOUT}s) from pytest-timeout."
PLUGIN = ("-p", "timeoutcore.contrib.pytest")
RUN_LIMIT = 60  # s: a sample run that takes longer is a hang


def _marks(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def _suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, dsn: str = "",
           **files: str) -> Path:
    marks = pytester.path / "marks.txt"
    monkeypatch.setenv("TC_MARKS", str(marks))
    monkeypatch.setenv("TC_DSN", dsn)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    monkeypatch.delenv("PYTEST_TIMEOUT", raising=False)
    pytester.makeconftest(samples.CONFTEST)
    pytester.makepyfile(**files)
    return marks


@pytest.fixture(autouse=True)
def _own_rootdir(pytester: pytest.Pytester) -> None:
    """Each sample run is a project of its own: without an ini file of its own, a run
    under a folder of this repository (nox puts its temporary files in .nox/) takes the
    repository's pyproject.toml, its settings and a node id relative to the repository."""
    pytester.makeini("[pytest]\n")


def _junit(path: Path) -> dict[str, str]:
    """testcase name -> "passed" or its failure message's first line."""
    root = ET.parse(path).getroot()
    outcome = {}
    for case in root.iter("testcase"):
        failure = case.find("failure")
        error = case.find("error")
        if error is not None:
            outcome[case.get("name", "")] = "error: " + error.get("message", "")
        else:
            message = "passed" if failure is None else failure.get("message", "")
            outcome[case.get("name", "")] = message.splitlines()[0]  # then the stacks
    return outcome


def _check_exit_lines(marks: list[list[str]], processes: int) -> None:
    exits = [m for m in marks if m[0] == "exit"]
    assert len(exits) == processes, marks
    for line in exits:
        assert "timeoutcore_pytest_escalation" not in line[1], line  # joined at unconfigure
        assert line[2] == "patched=False", line  # patch() undone at unconfigure


HANGING = ("test_sleep", "test_cpu_loop", "test_socket_read", "test_pg_sleep")
AFTER = ("test_after_sleep", "test_after_cpu_loop", "test_after_socket_read",
         "test_after_pg_sleep")


def _check_suite(result: Any, marks_file: Path, junit: Path, processes: int) -> None:
    result.assert_outcomes(failed=4, passed=4)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    for name in HANGING:
        result.stdout.fnmatch_lines([f"FAILED *::{name} - Failed: Timeout (>*"])
    result.stdout.no_fnmatch_line("*node down*")
    result.stdout.no_fnmatch_line("*replacing crashed worker*")
    outcome = _junit(junit)
    assert outcome == {**{n: f"Failed: {MESSAGE}" for n in HANGING},
                       **{n: "passed" for n in AFTER}}
    marks = _marks(marks_file)
    pid_of = {" ".join(m[:2]): m[-1] for m in marks if m[0] in ("teardown", "passed")}
    for name, after in zip(HANGING, AFTER):
        # the teardown ran, and the next test passed in the same process
        assert pid_of[f"teardown {name}"] == pid_of[f"passed {after}"], marks
    # the cancelled query's connection rolled back, answered and closed in teardown, and
    # so did the next test's
    assert [m[:2] for m in marks if m[0] == "closed"] == [["closed", "pg"]] * 2, marks
    _check_exit_lines(marks, processes)


def test_hanging_tests_fail_and_the_session_goes_on(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, postgres_dsn: str
) -> None:
    """Main thread: a sleep, a CPU loop, a socket read and pg_sleep each fail with
    pytest-timeout's message; teardown runs; the next test passes; the JUnit XML is whole."""
    marks = _suite(pytester, monkeypatch, postgres_dsn, test_a=samples.SLEEP_AND_CPU,
                   test_b=samples.SOCKET_AND_PG)
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest_subprocess(
        *PLUGIN, f"--timeout={TIMEOUT}", "-p", "no:cacheprovider", f"--junitxml={junit}",
        timeout=RUN_LIMIT)
    result.stdout.fnmatch_lines(["timeout backend: timeoutcore *"])
    _check_suite(result, marks, junit, processes=1)


@pytest.mark.once  # pytest's and its plugins' behaviour: one interpreter is enough
def test_xdist_workers_survive(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, postgres_dsn: str
) -> None:
    """``-n 2``: the same in two pytest-xdist workers, each keeping its process."""
    pytest.importorskip("xdist")
    marks = _suite(pytester, monkeypatch, postgres_dsn, test_a=samples.SLEEP_AND_CPU,
                   test_b=samples.SOCKET_AND_PG)
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest_subprocess(
        *PLUGIN, f"--timeout={TIMEOUT}", "-p", "no:cacheprovider", "-n", "2",
        "--dist", "loadfile", f"--junitxml={junit}", timeout=RUN_LIMIT)
    _check_suite(result, marks, junit, processes=3)  # the controller and two workers
    workers = {m[2] for m in _marks(marks) if m[0] == "teardown"}
    assert workers == {"gw0", "gw1"}


def test_escalation_ends_a_test_stuck_in_c(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``os.read`` on a silent pipe retries EINTR and is not patched: the deadline cannot
    stop it. After the grace period pytest-timeout's thread method ends the process: its
    stack dump (with the stuck line), exit status 1 -- the run does not hang."""
    marks = _suite(pytester, monkeypatch, test_stuck=samples.STUCK)
    result = pytester.runpytest_subprocess(
        *PLUGIN, f"--timeout={TIMEOUT}", "--timeoutcore-grace=0.5", "-p", "no:cacheprovider",
        timeout=RUN_LIMIT)
    assert result.ret == 1
    # our line is in the test's captured stderr, which pytest-timeout prints first
    result.stdout.fnmatch_lines([
        "*+ Timeout +*",
        "*timeoutcore: test_stuck.py::test_stuck_in_c is still running 0.5s after its 1s "
        "timeout; ending the process*",
        "*Stack of MainThread*", "*os.read(r, 1)*"])
    assert not any(m[:2] == ["passed", "test_never_reached"] for m in _marks(marks))


@pytest.mark.once  # pytest's and its plugins' behaviour: one interpreter is enough
def test_stock_thread_method_is_untouched_without_the_plugin(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not selected, the module changes nothing: pytest-timeout's thread method still ends
    the process at the first hanging test (no teardown, no later test, no JUnit XML)."""
    marks = _suite(pytester, monkeypatch, test_a=samples.SLEEP_AND_CPU)
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest_subprocess(
        f"--timeout={TIMEOUT}", "--timeout-method=thread", "-p", "no:cacheprovider",
        f"--junitxml={junit}", timeout=RUN_LIMIT)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*+ Timeout +*"])
    assert _marks(marks) == []  # no teardown, no later test; os._exit: not even atexit
    assert not junit.exists()


@pytest.mark.once  # option parsing
@pytest.mark.parametrize("grace", ["-1", "abc", "inf"])
def test_bad_grace_is_a_usage_error(pytester: pytest.Pytester, grace: str) -> None:
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    result = pytester.runpytest_subprocess(*PLUGIN, f"--timeoutcore-grace={grace}",
                                           timeout=RUN_LIMIT)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--timeoutcore-grace must be *{grace}*"])


@pytest.mark.once  # pytest's and its plugins' behaviour: one interpreter is enough
def test_without_pytest_timeout_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    result = pytester.runpytest_subprocess(*PLUGIN, "-p", "no:timeout", timeout=RUN_LIMIT)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*backend for pytest-timeout*"])


@pytest.mark.skipif(importlib.util.find_spec("pytest_run_parallel") is None,
                    reason="pytest-run-parallel is not installed")
def test_run_parallel_worker_threads_are_stopped(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pytest-run-parallel runs a test's body in threads of its own: each is stopped at the
    test's deadline, the test fails with the message, teardown runs, the session goes on."""
    marks = _suite(pytester, monkeypatch, test_par=samples.PARALLEL)
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest_subprocess(
        *PLUGIN, f"--timeout={TIMEOUT}", "-p", "no:cacheprovider", f"--junitxml={junit}",
        timeout=RUN_LIMIT)
    # pytest-run-parallel's own status for a failed parallel test: "error", PARALLEL FAILED
    result.assert_outcomes(errors=2, passed=1)
    for name in ("test_parallel_sleep", "test_parallel_cpu"):
        result.stdout.fnmatch_lines([f"PARALLEL FAILED *::{name} - Failed: Timeout (>*"])
    assert _junit(junit) == {"test_parallel_sleep": f"Failed: {MESSAGE}",
                             "test_parallel_cpu": f"Failed: {MESSAGE}",
                             "test_after_parallel": "passed"}
    lines = _marks(marks)
    assert ["teardown", "test_parallel_sleep"] in [m[:2] for m in lines]
    assert ["passed", "test_after_parallel"] in [m[:2] for m in lines]
    _check_exit_lines(lines, processes=1)
    # no worker thread of pytest-run-parallel outlived its test
    exit_threads = [m[1] for m in lines if m[0] == "exit"][0]
    assert exit_threads == "threads=MainThread", exit_threads


@pytest.mark.once  # pytest's and its plugins' behaviour: one interpreter is enough
def test_debugger_detection_skips_the_deadline(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As pytest-timeout: while a debugger's trace function is set (pytest-timeout knows one
    by its module's name, ``bdb*``/``pydevd*``) no deadline is armed."""
    marks = _suite(pytester, monkeypatch, test_dbg=f"""
import time
from conftest import mark

def test_traced():
    time.sleep({1.5 * TIMEOUT})
    mark("passed test_traced")
""", bdbstub="def trace(frame, event, arg):\n    return None\n")
    pytester.makeconftest(samples.CONFTEST + """
import sys

def pytest_collection_finish(session):
    import bdbstub
    sys.settrace(bdbstub.trace)
""")
    result = pytester.runpytest_subprocess(*PLUGIN, f"--timeout={TIMEOUT}", "-p",
                                           "no:cacheprovider", timeout=RUN_LIMIT)
    result.assert_outcomes(passed=1)
    assert ["passed", "test_traced"] in [m[:2] for m in _marks(marks)]
