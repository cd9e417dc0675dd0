"""Benchmark plumbing: collect ``bench_*.py``, gather ``extra_info``, print and save a summary.

Run with ``python -m pytest benchmarks/ --benchmark-only``. A plain ``pytest`` / ``pytest tests/``
never loads this folder (``testpaths = ["tests"]``).

Every benchmark leaves its figures in ``benchmark.extra_info``; at the end of the session the
figures are printed as one compact table and written to ``benchmarks/.results/summary.json``.
Two kinds of rows are understood:

- per-operation cost (group ``overhead``): ``per_op_ns`` (median round / ops per round),
  ``per_op_ns_min``; the table adds the ratio to the row marked ``baseline``;
- latency distributions (groups ``overshoot``, ``cancel``): ``p50_ms``, ``p90_ms``,
  ``p99_ms``, ``max_ms``, ``trials``, or a ``note`` when the case cannot be measured
  (``n/a: ...``); rows of other groups (pool throughput, Celery) print their ``note``.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

HERE = Path(__file__).resolve().parent
RESULTS_DIR = HERE / ".results"

# Let `pytest benchmarks/` (not only `python -m pytest`) import the in-place build.
if importlib.util.find_spec("timeoutcore") is None:
    sys.path.insert(0, str(HERE.parent))

_ROWS_KEY = pytest.StashKey[list[dict[str, Any]]]()
_ENV_KEY = pytest.StashKey[dict[str, Any]]()


def record_per_op(benchmark: Any, case: str, ops: int, baseline: bool = False) -> None:
    """Store a per-operation cost row (group ``overhead``) for a round of ``ops`` operations."""
    assert benchmark.stats is not None
    stats = benchmark.stats.stats
    benchmark.extra_info.update(
        case=case,
        ops_per_round=ops,
        per_op_ns=round(stats.median / ops * 1e9, 1),
        per_op_ns_min=round(stats.min / ops * 1e9, 1),
        baseline=baseline,
    )


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_ROWS_KEY] = []


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> Optional[pytest.Module]:
    """Collect ``bench_*.py`` in this folder as test modules (pytest only looks at test_*.py)."""
    if parent.session.isinitpath(file_path):
        return None  # named on the command line: pytest's own collector takes it
    if file_path.suffix == ".py" and file_path.name.startswith("bench_"):
        module: pytest.Module = pytest.Module.from_parent(parent, path=file_path)
        return module
    return None


@pytest.fixture(autouse=True)
def _record_extra_info(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each benchmark, keep its name, group and ``extra_info`` for the summary."""
    if "benchmark" not in request.fixturenames:
        yield
        return
    bench = request.getfixturevalue("benchmark")
    yield
    if bench.stats is None:  # skipped or disabled
        return
    group = bench.group or request.node.module.__name__
    row: dict[str, Any] = {"group": group, "name": request.node.name}
    row.update(bench.extra_info)
    request.config.stash[_ROWS_KEY].append(row)


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}" if abs(value) < 1e4 else f"{value:.0f}"
    return str(value)


def _add_ratios(rows: list[dict[str, Any]]) -> None:
    """Give every per-operation row ``x_baseline``: its cost over its group's baseline."""
    baselines = {r["group"]: r["per_op_ns"] for r in rows if r.get("baseline") and "per_op_ns" in r}
    for r in rows:
        base = baselines.get(r["group"])
        if base and "per_op_ns" in r:
            r["x_baseline"] = round(r["per_op_ns"] / base, 2)


_TITLES = {
    "overshoot": "overshoot past a 50 ms deadline",
    "cancel": "DeadlineRegistry.cancel() to the job stopping",
    "trigger": "trigger -> exception, worker, patch()",
    "throughput": "pools",
    "celery": "Celery integration",
    "future-cancel": "DeadlineFuture.cancel() to the thread free",
    "executor": "DeadlineExecutor against ThreadPoolExecutor",
    "asgi": "FastAPI with DeadlineMiddleware (uvicorn)",
}


def _table(rows: list[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    cost = [r for r in rows if "per_op_ns" in r]
    lat = [r for r in rows if "per_op_ns" not in r]
    if cost:
        w = max(len(r["case"]) for r in cost)
        lines.append(
            f"{'cost per operation':<{w}}  {'median ns':>10}  {'min ns':>10}  {'x baseline':>10}"
        )
        for r in cost:
            lines.append(
                f"{r['case']:<{w}}  {_fmt(r['per_op_ns'], 1):>10}  "
                f"{_fmt(r.get('per_op_ns_min'), 1):>10}  {_fmt(r.get('x_baseline'), 2):>10}"
            )
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in lat:
        groups.setdefault(r["group"], []).append(r)
    for group, members in groups.items():
        if lines:
            lines.append("")
        title = _TITLES.get(group, group)
        w = max(len(title), *(len(r["case"]) for r in members))
        head = f"{title:<{w}}  {'p50 ms':>8}  {'p90 ms':>8}  {'p99 ms':>8}"
        lines.append(f"{head}  {'max ms':>8}  {'n':>3}")
        for r in members:
            if "p50_ms" not in r:
                lines.append(f"{r['case']:<{w}}  {r.get('note', '-')}")
                continue
            lines.append(
                f"{r['case']:<{w}}  {_fmt(r['p50_ms']):>8}  {_fmt(r['p90_ms']):>8}  "
                f"{_fmt(r['p99_ms']):>8}  {_fmt(r['max_ms']):>8}  {r['trials']:>3}"
            )
            if r.get("note"):
                lines.append(f"{'':<{w}}    ({r['note']})")
    return lines


def _environment() -> dict[str, Any]:
    from timeoutcore import ENGINE

    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "machine": platform.machine(),
        "kernel": platform.release(),
        "engine": ENGINE,
        "switch_interval_s": sys.getswitchinterval(),
        "cpus": os.cpu_count(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Print the table (pytest_sessionfinish, which runs first, has completed the rows)."""
    rows = config.stash.get(_ROWS_KEY, [])
    env = config.stash.get(_ENV_KEY, None)
    if not rows or env is None:
        return
    terminalreporter.write_sep("=", "timeoutcore benchmark summary")
    terminalreporter.write_line(
        f"CPython {env['python']} {env['machine']}, kernel {env['kernel']}, "
        f"engine {env['engine']}, switch interval {env['switch_interval_s'] * 1e3:g} ms, "
        f"{env['cpus']} CPUs, load {env['loadavg_1m']}"
    )
    for line in _table(rows):
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"summary written to {_summary_path().relative_to(HERE.parent)}")


def _summary_path() -> Path:
    return RESULTS_DIR / "summary.json"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    rows = session.config.stash.get(_ROWS_KEY, [])
    if not rows:
        return
    _add_ratios(rows)
    env = session.config.stash[_ENV_KEY] = _environment()
    payload = {"environment": env, "results": rows}
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / ".gitignore").write_text("# run-time output of the benchmarks\n*\n")
    try:
        import orjson
    except ImportError:
        import json

        _summary_path().write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    else:
        _summary_path().write_bytes(
            orjson.dumps(payload, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"
        )


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: Any) -> Iterator[str]:
    """The tests' Redis: TIMEOUTCORE_TEST_REDIS_URL, else a redis-server started for this
    session; the Celery and registry benchmarks are skipped where neither exists."""
    sys.path.insert(0, str(HERE.parent / "tests"))
    try:
        from redis_server import session_redis
    finally:
        sys.path.pop(0)
    with session_redis(lambda: tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture(scope="session")
def postgres_dsn(tmp_path_factory: Any) -> Iterator[str]:
    """The tests' PostgreSQL: TIMEOUTCORE_TEST_POSTGRES_DSN, else a throw-away cluster
    started for this session; the driver benchmarks are skipped where neither exists."""
    sys.path.insert(0, str(HERE.parent / "tests"))
    try:
        from postgres_server import session_postgres
    finally:
        sys.path.pop(0)
    with session_postgres() as dsn:
        yield dsn
