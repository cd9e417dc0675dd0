"""``python -m timeoutcore``: every subcommand's happy path and bad input.

The commands run as a user runs them: ``sys.executable -m timeoutcore`` in a scratch folder,
with the repository root on PYTHONPATH (after the folder the tests imported the package from)
so that an in-place build works as well as an installed package. Bad input must give a
non-zero status and a one-line reason on stderr, never a traceback.

``bench`` is the benchmark in the package (timeoutcore._bench), which must run from an
installed wheel; ``bench --full`` the harness of a source checkout (benchmarks/harness.py).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any, Optional

from timeoutcore import _json as orjson  # whichever JSON engine is active
import pytest
from conftest import LATE

import timeoutcore
from timeoutcore import cli

ROOT = Path(__file__).resolve().parent.parent
# The commands must load the package these tests import: an installed one (nox, wheels) or
# the in-place build (``python -m pytest`` from the repository root). Its folder goes first.
IMPORTED_FROM = Path(timeoutcore.__file__).resolve().parent.parent
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _env(extra_path: Optional[Path] = None) -> dict[str, str]:
    env = dict(os.environ)
    paths = list(dict.fromkeys([str(IMPORTED_FROM), str(ROOT)]))
    if extra_path is not None:
        paths.insert(0, str(extra_path))
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.pop("TIMEOUTCORE_ENGINE", None)
    return env


def tc(
    *args: str, cwd: Path, timeout: float = 60, extra_path: Optional[Path] = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "timeoutcore", *args],
        cwd=cwd,
        env=_env(extra_path),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def assert_clean_error(proc: subprocess.CompletedProcess[str], status: int, *words: str) -> None:
    assert proc.returncode == status, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert "Traceback" not in proc.stdout
    for word in words:
        assert word in proc.stderr, proc.stderr


# --- the command and its help ---------------------------------------------------------------


def test_no_command_prints_help_and_fails(tmp_path: Path) -> None:
    proc = tc(cwd=tmp_path)
    assert_clean_error(proc, 2, "demo", "bench", "run")


def test_unknown_command(tmp_path: Path) -> None:
    proc = tc("frobnicate", cwd=tmp_path)
    assert_clean_error(proc, 2, "invalid choice", "frobnicate")


@pytest.mark.parametrize("command", [[], ["demo"], ["bench"], ["run"]])
def test_help_everywhere(tmp_path: Path, command: list[str]) -> None:
    proc = tc(*command, "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: timeoutcore")


# --- demo -----------------------------------------------------------------------------------

TABLE_ROW = re.compile(r"^ +(\d+)  (.+?)  +(completed|soft exceeded|timed out|error|cancelled)"
                       r" +([0-9.]+) s(?: +([0-9.]+) ms)?$")


def _demo_rows(stdout: str) -> list[tuple[int, str, str, float, Optional[float]]]:
    rows = []
    for line in stdout.splitlines():
        m = TABLE_ROW.match(line)
        if m:
            over = float(m[5]) if m[5] else None
            rows.append((int(m[1]), m[2].strip(), m[3], float(m[4]), over))
    return rows


def test_demo_prints_json_lines_and_stops_the_overrunning_tasks(tmp_path: Path) -> None:
    # What the demo promises: the overrunning tasks are stopped at the hard limit and the
    # short ones are not. The limit is 2 s rather than the default 0.25 s so that this holds
    # however slowly a loaded machine runs the short tasks: they end 1.6 s before their hard
    # limit. Whether a short task passes its soft limit, and whether a soft-only task (0.5 s
    # to spare) ends before its hard limit, depend on that speed and are not asserted.
    proc = tc("demo", "--json", "--tasks", "8", "--limit", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if not line.startswith("#")]
    tasks = [orjson.loads(line) for line in lines]
    assert [t["task"] for t in tasks] == list(range(8))
    assert {t["status"] for t in tasks if t["task"] % 4 == 0} == {"timed_out"}
    # stopped at the limit, not when the work would have ended (8 s): the demo's workloads
    # are not protected library code (timeoutcore.cli is exempt, see protect.py)
    assert all(t["overshoot"] < LATE and not t["deferred"] for t in tasks if t["task"] % 4 == 0)
    # a soft-only task works 1.5 s: past its 1 s soft limit whatever the load (the warning)
    assert {t["status"] for t in tasks if t["task"] % 4 == 2} <= {"soft_exceeded", "timed_out"}
    assert {t["status"] for t in tasks if t["task"] % 2} <= {"completed", "soft_exceeded"}
    assert all(t["limit"] == pytest.approx(2.0) for t in tasks)
    assert all(t["soft_limit"] == pytest.approx(1.0) for t in tasks)
    assert "soft limit passed: label='task-2'" in proc.stdout
    assert "signal.alarm in a pool thread: ValueError" in proc.stdout


def test_demo_at_its_defaults_prints_a_table_and_stops_the_overrunning_tasks(
    tmp_path: Path,
) -> None:
    # The README's first command: exit status 0 means every overrunning task was stopped
    # (cli.demo); the statuses of the short tasks at 0.25 s depend on the machine's load.
    proc = tc("demo", "--tasks", "4", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "{" not in out  # a table, not JSON
    assert "task  what it did" in out and "overshoot" in out
    rows = _demo_rows(out)
    assert [r[0] for r in rows] == [0, 1, 2, 3], out
    task, what, status, elapsed, over = rows[0]
    assert what == "CPU loop, 1.00 s of work", out
    assert status == "timed out" and over is not None and over < LATE * 1e3, out
    assert 0.25 <= elapsed < 0.25 + LATE, out
    assert all(r[4] is None for r in rows if r[2] != "timed out"), out  # timed out only
    assert re.search(r"^4 tasks in [0-9.]+ s: .*\d timed out", out, re.MULTILINE), out
    assert 'signal.alarm, for comparison: in a pool thread it raises ValueError ("' in out
    assert "0.25 s becomes 1 s" in out
    # the soft-limit warnings are counted, not printed between the rows
    assert "soft limit passed" not in out + proc.stderr, (out, proc.stderr)
    assert all(len(line) <= 100 for line in out.splitlines()), out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tasks", "0"], "must be at least 1"),
        (["--tasks", "many"], "not a whole number"),
        (["--limit", "-1"], "must be a positive finite number"),
        (["--limit", "nan"], "must be a positive finite number"),
        (["--limit", "inf"], "must be a positive finite number"),
        (["--workers", "x"], "not a whole number"),
        (["--json", "x"], "unrecognized arguments"),
        (["--frobnicate"], "unrecognized arguments"),
    ],
)
def test_demo_bad_input(tmp_path: Path, args: list[str], message: str) -> None:
    assert_clean_error(tc("demo", *args, cwd=tmp_path), 2, message)


# --- bench: the benchmark in the package (timeoutcore._bench) ---------------------------------

METHOD_KEYS = ("timeoutcore", "signal.alarm", "signal.setitimer", "timer_async_exc")
WORKLOAD_KEYS = ("cpu", "sleep", "c_call")


def _installed(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


# A quick run takes ~10 s; what these tests read (its output formats, that every method ran)
# does not depend on the interpreter: they run once in CI, in the README suite.
@pytest.fixture(scope="module")
def quick_bench(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One ``bench --quick --json [--plot]`` run shared by the tests that read its output."""
    tmp = tmp_path_factory.mktemp("bench")
    plot = ["--plot", "plot.png"] if _installed("matplotlib") else []
    t0 = time.monotonic()
    proc = tc("bench", "--quick", "--json", "result.json", *plot, cwd=tmp, timeout=120)
    wall = time.monotonic() - t0
    return {"proc": proc, "wall": wall, "json": tmp / "result.json", "plot": tmp / "plot.png"}


@pytest.mark.once
def test_bench_quick_runs_from_the_package_in_well_under_a_minute(
    quick_bench: dict[str, Any],
) -> None:
    proc = quick_bench["proc"]
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert quick_bench["wall"] < 60  # a correctness bound (a hang, a plan gone wrong)


@pytest.mark.once
def test_bench_quick_prints_the_tables(quick_bench: dict[str, Any]) -> None:
    out = quick_bench["proc"].stdout
    for heading in ("Overhead of a block", "Overshoot past a 50 ms deadline", "Busy pool"):
        assert heading in out
    for title in ("timeoutcore", "signal.alarm", "signal.setitimer", "Timer+SetAsyncExc"):
        assert title in out
    assert "n/a: raises ValueError" in out  # signal recipes in a pool worker
    assert "whole seconds" in out  # alarm's footnote
    assert "overshoot: CPU loop" in quick_bench["proc"].stderr  # progress went to stderr


@pytest.mark.once
def test_bench_quick_json_is_a_result_file(quick_bench: dict[str, Any]) -> None:
    result = orjson.loads(quick_bench["json"].read_bytes())
    assert result["schema"] == "timeoutcore-bench-compact/1"
    assert result["mode"] == "quick"
    env = result["environment"]
    assert env["python"] == ".".join(map(str, sys.version_info[:3]))
    assert env["timeoutcore"] == timeoutcore.__version__
    assert env["cpus"] >= 1 and env["host"] and env["date"].endswith("+00:00")
    assert "commit" in env  # None outside a checkout
    for w in WORKLOAD_KEYS:
        for key in METHOD_KEYS:
            rows = {r["thread"]: r for r in result["overshoot"]
                    if r["method"] == key and r["workload"] == w}
            assert set(rows) == {"main", "worker"}, (w, key)
            measured = list(rows.values())
            if key.startswith("signal."):
                assert rows["worker"]["error"].startswith("ValueError")
                measured = [rows["main"]]
            for r in measured:
                assert r["trials"] == len(r["samples_ms"]) == len(r["outcomes"]) >= 1
                assert r["p50_ms"] <= r["p90_ms"] <= r["max_ms"]
    assert [r["method"] for r in result["overhead"]] == ["none", *METHOD_KEYS]
    assert all(r["per_block_ns"] > 0 for r in result["overhead"])
    assert [r["method"] for r in result["busy_pool"]] == ["timeoutcore", "timer_async_exc"]


@pytest.mark.once
def test_bench_quick_timeoutcore_stops_every_workload(quick_bench: dict[str, Any]) -> None:
    result = orjson.loads(quick_bench["json"].read_bytes())
    # The fallback engine has no signal: a blocking C call runs to its end there.
    native = result["environment"]["engine"] == "native"
    stoppable = WORKLOAD_KEYS if native else ("cpu", "sleep")
    for r in result["overshoot"]:
        if r["method"] == "timeoutcore" and r["workload"] in stoppable:
            assert r["stopped"] == r["trials"], r
    (pool,) = [r for r in result["busy_pool"] if r["method"] == "timeoutcore"]
    assert pool["stopped"] == pool["trials"], pool


@pytest.mark.once
@pytest.mark.skipif(not _installed("matplotlib"), reason="matplotlib is not installed")
def test_bench_plot_is_a_png(quick_bench: dict[str, Any]) -> None:
    assert quick_bench["plot"].read_bytes()[:8] == PNG_SIGNATURE


def test_bench_plot_without_matplotlib_says_how_to_get_it(tmp_path: Path) -> None:
    # A folder first on PYTHONPATH whose ``matplotlib`` fails to import, as when it is absent.
    fake = tmp_path / "fake"
    (fake / "matplotlib").mkdir(parents=True)
    (fake / "matplotlib" / "__init__.py").write_text("raise ImportError('no matplotlib')\n")
    t0 = time.monotonic()
    proc = tc("bench", "--quick", "--plot", "out.png", cwd=tmp_path, extra_path=fake)
    assert_clean_error(proc, 2, "matplotlib", "pip install matplotlib")
    assert time.monotonic() - t0 < 20, "refused only after running the benchmark"
    assert not (tmp_path / "out.png").exists()


def _overshoot(method: str, thread: str, workload: str = "cpu", **figures: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"method": method, "title": method, "workload": workload,
                           "workload_title": workload.upper(), "thread": thread,
                           "limit_s": 0.05, "note": None}
    row.update(figures)
    return row


def _measured(p50: float, outcome: str = "stopped", n: int = 3) -> dict[str, Any]:
    return {"trials": n, "stopped": n if outcome == "stopped" else 0,
            "not_interrupted": n if outcome == "not_interrupted" else 0, "returned": 0,
            "samples_ms": [p50] * n, "outcomes": [outcome] * n,
            "p50_ms": p50, "p90_ms": p50, "max_ms": p50}


SYNTHETIC: dict[str, Any] = {
    "schema": "timeoutcore-bench-compact/1",
    "mode": "quick",
    "elapsed_s": 1.0,
    "slack_s": 0.25,
    "environment": {
        "date": "2026-01-01T00:00:00+00:00", "host": "h", "cpus": 2, "cpu_model": "cpu",
        "system": "Linux", "kernel": "k", "machine": "m", "implementation": "CPython",
        "python": "3.x", "gil": True, "switch_interval_s": 0.005, "engine": "native",
        "timeoutcore": "0", "commit": None, "loadavg_1m": 0.1,
    },
    "overhead": [
        {"method": "none", "title": "no-op `with` (baseline)", "per_block_ns": 100.0,
         "x_baseline": 1.0},
        {"method": "signal.alarm", "title": "signal.alarm",
         "skipped": "not run from the main thread"},
    ],
    "overshoot": [
        _overshoot("timeoutcore", "main", **_measured(0.1234)),
        _overshoot("timeoutcore", "worker", **_measured(0.2)),
        _overshoot("signal.alarm", "main", **_measured(950.0), note="whole seconds"),
        _overshoot("signal.alarm", "worker", error="ValueError: main thread only"),
        _overshoot("Timer+SetAsyncExc", "worker", "sleep", **_measured(250.0, "not_interrupted")),
    ],
    "busy_pool": [
        {"method": "timeoutcore", "title": "timeoutcore", "workers": 4, "limit_s": 0.05,
         **_measured(1.5)},
    ],
}


@pytest.mark.once
def test_bench_table_shows_every_kind_of_cell() -> None:
    from timeoutcore import _bench

    table = _bench.render(SYNTHETIC)
    assert re.search(r"^CPU +timeoutcore +0\.123 / 0\.123 / 0\.123 \(3\) ", table, re.MULTILINE)
    assert "950 / 950 / 950 (3) [1]" in table and "[1] whole seconds" in table
    assert "n/a: raises ValueError [2]" in table and "[2] ValueError: main thread only" in table
    assert "not interrupted [3]" in table and "250 ms after the deadline" in table
    assert "1.50 / 1.50 / 1.50 (3)" in table  # the busy pool
    assert "not run from the main thread" in table


@pytest.mark.once
@pytest.mark.skipif(not _installed("matplotlib"), reason="matplotlib is not installed")
def test_bench_plot_draws_a_result_file(tmp_path: Path) -> None:
    from timeoutcore import _bench

    _bench.plot(SYNTHETIC, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").read_bytes()[:8] == PNG_SIGNATURE


def test_bench_json_dash_writes_json_on_stdout_instead_of_the_table(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from timeoutcore import _bench

    monkeypatch.setattr(_bench, "run", lambda plan, progress=None: dict(SYNTHETIC, mode=plan.name))
    assert cli.main(["bench", "--quick", "--json", "-"]) == 0
    assert orjson.loads(capsys.readouterr().out)["mode"] == "quick"
    assert cli.main(["bench", "--json", "-"]) == 0
    assert orjson.loads(capsys.readouterr().out)["mode"] == "standard"


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["--json", "no-such-dir/result.json"], 2, "no such directory"),
        (["--json", "."], 2, "is a directory"),
        (["--json", ""], 2, "a file name is needed"),
        (["--plot", "out/"], 2, "a file name is needed"),
        (["--plot", "no-such-dir/plot.png"], 2, "no such directory"),
        (["--quick", "--frobnicate"], 2, "unrecognized arguments"),
        (["--json"], 2, "expected one argument"),
    ],
)
def test_bench_bad_input_fails_before_running(
    tmp_path: Path, args: list[str], status: int, message: str
) -> None:
    if args[0] == "--plot" and not _installed("matplotlib"):
        message = "pip install matplotlib"
    t0 = time.monotonic()
    assert_clean_error(tc("bench", *args, cwd=tmp_path), status, message)
    assert time.monotonic() - t0 < 20


# --- bench --full: the harness of a source checkout (benchmarks/harness.py) -----------------

# Where the tests run from a copy beside an installed wheel, `bench --full` cannot find it.
HAS_HARNESS = any(path.is_file() for path in cli.harness_candidates()[:1])
needs_harness = pytest.mark.skipif(
    not HAS_HARNESS, reason="benchmarks/harness.py is not beside the installed package"
)


@needs_harness
def test_bench_full_json_dash_runs_the_harness(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    harness = cli.load_bench_harness()
    monkeypatch.setattr(harness, "run", lambda plan, progress=None: {"mode": plan.name})
    assert cli.main(["bench", "--full", "--quick", "--json", "-"]) == 0
    assert orjson.loads(capsys.readouterr().out) == {"mode": harness.QUICK.name}


def _harness_row(method: str, thread: str, **figures: Any) -> dict[str, Any]:
    """An overshoot row as the harness writes it (more keys than the packaged bench's)."""
    return _overshoot(method, thread, method_title=method, workload_title="CPU loop",
                      section="cpu", row=method, hogs=0, **figures)


def _harness_measured(p50: float, outcome: str = "stopped") -> dict[str, Any]:
    return {**_measured(p50, outcome), "abandoned": 3 if outcome == "abandoned" else 0,
            "p99_ms": p50}


HARNESS_SYNTHETIC = {
    "mode": "quick",
    "elapsed_s": 1.0,
    "environment": dict(SYNTHETIC["environment"]),
    "overhead": [
        {"case": "none", "method": "none", "title": "no-op", "per_block_ns": 100.0,
         "x_baseline": 1.0},
        {"case": "stopit", "method": "stopit", "title": "stopit",
         "skipped": "not installed (pip install stopit)"},
    ],
    "overshoot": [
        _harness_row("timeoutcore", "main", **_harness_measured(0.1234)),
        _harness_row("signal.alarm", "main", **_harness_measured(950.0), note="whole seconds"),
        _harness_row("signal.alarm", "worker", error="ValueError: main thread only"),
        _harness_row("func_timeout", "worker", **_harness_measured(1.5, "abandoned")),
        _harness_row("stopit", "worker", skipped="not installed (pip install stopit)"),
    ],
    "throughput": [
        {"method": "none", "title": "no deadline", "tasks_per_s": 1000.0, "x_no_deadline": 1.0},
    ],
}


@needs_harness
def test_bench_full_table_shows_every_kind_of_cell() -> None:
    table = cli.load_bench_harness().render(HARNESS_SYNTHETIC)
    assert re.search(r"^\| CPU loop +\| timeoutcore +\| 0\.123 ", table, re.MULTILINE)
    assert "950 / 950 / 950 (3) [1]" in table and "[1] whole seconds" in table
    assert "n/a: raises ValueError [2]" in table and "[2] ValueError: main thread only" in table
    assert "1.50 / 1.50 / 1.50 (3) [3]" in table and "abandoned thread" in table
    assert "not installed (pip install stopit)" in table


def test_bench_full_without_the_harness_says_where_it_is(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An installed wheel has no benchmarks/: a one-line error, no traceback."""
    monkeypatch.setattr(cli, "harness_candidates", lambda: [tmp_path / "benchmarks/harness.py"])
    monkeypatch.delitem(sys.modules, "timeoutcore_bench_harness", raising=False)
    assert cli.main(["bench", "--full", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "benchmarks/harness.py" in err and "source checkout" in err and "--full" in err
    assert "Traceback" not in err


def test_the_packaged_benchmark_needs_no_checkout() -> None:
    """``bench`` without --full imports nothing from benchmarks/: it runs from a wheel."""
    source = Path(importlib.import_module("timeoutcore._bench").__file__ or "").read_text()
    assert "benchmarks" not in source.replace("benchmarks/harness.py", "")
    assert importlib.util.find_spec("timeoutcore.bench") is None  # the harness stays out


# --- run ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "required: --limit/--hard"),
        (["--hard", "1"], "no command given"),
        (["--hard", "1", "--"], "no command given"),
        (["--hard", "0", "--", "true"], "must be a positive finite number"),
        (["--hard", "-2", "--", "true"], "must be a positive finite number"),
        (["--hard", "soon", "--", "true"], "not a number"),
        (["--hard", "1", "--soft", "0", "--", "true"], "must be a positive finite number"),
        (["--hard", "1", "--grace", "-1", "--", "true"], "must be a non-negative finite number"),
    ],
)
def test_run_bad_usage_exits_125(tmp_path: Path, args: list[str], message: str) -> None:
    assert_clean_error(tc("run", *args, cwd=tmp_path), cli.EXIT_FAILED, message)


class FakeResult:
    """The fields of ``timeoutcore.subprocess.RunResult`` that the CLI reads."""

    def __init__(
        self,
        status: str,
        exit_code: Optional[int] = None,
        signal: Optional[int] = None,
        error: Optional[str] = None,
    ) -> None:
        self.status = status
        self.exit_code = exit_code
        self.signal = signal
        self.error = error

    def to_json(self) -> bytes:
        return orjson.dumps(vars(self))


def _fake_subprocess(monkeypatch: pytest.MonkeyPatch, run: Any) -> list[Any]:
    calls: list[Any] = []

    def recording_run(cmd: list[str], **kwargs: Any) -> Any:
        calls.append((cmd, kwargs))
        return run(cmd, **kwargs)

    module = types.ModuleType("timeoutcore.subprocess")
    module.run = recording_run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "timeoutcore.subprocess", module)
    return calls


@pytest.mark.parametrize(
    ("result", "exit_status"),
    [
        (FakeResult("completed", exit_code=0), 0),
        (FakeResult("completed", exit_code=3), 3),
        (FakeResult("completed", signal=9), 128 + 9),
        (FakeResult("soft_killed", signal=15), 124),
        (FakeResult("soft_killed", exit_code=0), 124),
        (FakeResult("timed_out", signal=9), 124),
        (FakeResult("error", error="OSError: [Errno 7] Argument list too long"), 125),
    ],
)
def test_run_exit_status_follows_the_result(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    result: FakeResult,
    exit_status: int,
) -> None:
    calls = _fake_subprocess(monkeypatch, lambda cmd, **kw: result)
    code = cli.main(["run", "--hard", "2", "--soft", "1", "--", "prog", "-x", "--hard", "y"])
    assert code == exit_status
    assert calls == [(["prog", "-x", "--hard", "y"], {"hard": 2.0, "soft": 1.0})]
    assert orjson.loads(capsys.readouterr().out) == vars(result)


def test_run_a_command_that_cannot_start_is_127_or_126(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = FakeResult("error", error="FileNotFoundError: [Errno 2] No such file: 'prog'")
    _fake_subprocess(monkeypatch, lambda cmd, **kw: missing)
    assert cli.main(["run", "--hard", "1", "--", "prog"]) == cli.EXIT_NOT_FOUND
    captured = capsys.readouterr()
    assert orjson.loads(captured.out)["status"] == "error"
    assert "cannot run prog: FileNotFoundError" in captured.err
    denied = FakeResult("error", error="PermissionError: [Errno 13] Permission denied: 'prog'")
    _fake_subprocess(monkeypatch, lambda cmd, **kw: denied)
    assert cli.main(["run", "--hard", "1", "--", "prog"]) == cli.EXIT_CANNOT_RUN


def test_run_passes_grace_only_when_given(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_subprocess(monkeypatch, lambda cmd, **kw: FakeResult("completed", 0))
    assert cli.main(["run", "--hard", "1", "--grace", "0.5", "--", "true"]) == 0
    assert calls[0][1] == {"hard": 1.0, "grace": 0.5}


@pytest.mark.parametrize(
    ("error", "exit_status", "message"),
    [
        (FileNotFoundError(2, "No such file or directory"), 127, "command not found: prog"),
        (PermissionError(13, "Permission denied"), 126, "permission denied"),
        (ValueError("soft must be less than hard"), 125, "soft must be less than hard"),
    ],
)
def test_run_errors_are_one_line_on_stderr(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    error: Exception,
    exit_status: int,
    message: str,
) -> None:
    def fail(cmd: list[str], **kwargs: Any) -> Any:
        raise error

    _fake_subprocess(monkeypatch, fail)
    assert cli.main(["run", "--hard", "1", "--", "prog"]) == exit_status
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in captured.err
    assert captured.err.count("\n") == 1


# With the real timeoutcore.subprocess (skipped until that module exists).


@pytest.fixture
def real_run() -> None:
    pytest.importorskip("timeoutcore.subprocess")


def _result(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert "Traceback" not in proc.stderr
    result: dict[str, Any] = orjson.loads(proc.stdout)
    return result


@pytest.mark.usefixtures("real_run")
def test_run_completed_mirrors_the_exit_status(tmp_path: Path) -> None:
    ok = tc("run", "--hard", "10", "--", sys.executable, "-c", "print('hi')", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert _result(ok)["status"] == "completed"
    three = tc("run", "--hard", "10", "--", sys.executable, "-c", "raise SystemExit(3)",
               cwd=tmp_path)
    assert three.returncode == 3, three.stderr
    assert _result(three)["exit_code"] == 3


@pytest.mark.usefixtures("real_run")
def test_run_hard_limit_exits_124(tmp_path: Path) -> None:
    t0 = time.monotonic()
    proc = tc("run", "--hard", "0.5", "--", sys.executable, "-c", "import time; time.sleep(30)",
              cwd=tmp_path)
    assert proc.returncode == 124, proc.stderr
    assert time.monotonic() - t0 < 15
    assert _result(proc)["status"] in ("timed_out", "soft_killed")


@pytest.mark.usefixtures("real_run")
def test_run_soft_limit_exits_124(tmp_path: Path) -> None:
    proc = tc("run", "--hard", "10", "--soft", "0.3", "--grace", "0.5", "--",
              sys.executable, "-c", "import time; time.sleep(30)", cwd=tmp_path)
    assert proc.returncode == 124, proc.stderr
    assert _result(proc)["status"] in ("soft_killed", "timed_out")


@pytest.mark.usefixtures("real_run")
def test_run_missing_command(tmp_path: Path) -> None:
    proc = tc("run", "--hard", "5", "--", "no-such-command-timeoutcore-test", cwd=tmp_path)
    assert_clean_error(proc, cli.EXIT_NOT_FOUND, "no-such-command-timeoutcore-test")
    assert _result(proc)["status"] == "error"


@pytest.mark.usefixtures("real_run")
def test_run_soft_not_below_hard_is_refused_or_ignored_cleanly(tmp_path: Path) -> None:
    proc = tc("run", "--hard", "1", "--soft", "5", "--", sys.executable, "-c", "pass",
              cwd=tmp_path)
    assert "Traceback" not in proc.stderr
    assert proc.returncode in (0, cli.EXIT_FAILED)
    if proc.returncode == cli.EXIT_FAILED:
        assert "soft" in proc.stderr
