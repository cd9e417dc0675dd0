"""What the accelerators buy, and what their switches cost: the same cases under several
``TIMEOUTCORE_ACCEL`` settings, alternated, in one sitting.

Cases (the code measured is ``benchmarks/harness.py``'s, as for ``python -m timeoutcore
bench``):

- ``overhead``: a block that does not time out, ``with thread_deadline(10)`` around an empty
  body, in the main thread: the median of rounds of 1,000 blocks, ns per block (the no-op
  Python ``with`` beside it, the loop included in both);
- ``quiet``: lateness past a 50 ms deadline of a CPU loop with the process otherwise idle,
  in the main thread and in a pool worker, and of a blocking C call (ctypes ``read()``) in a
  pool worker;
- ``hogs3`` / ``hogs7``: the CPU loop in a pool worker next to 3 and 7 threads spinning in
  Python;
- ``cpu_pool``: CPU work per second of 4 workers where every task runs under a deadline and
  every 4th fires half-way, against the same work without deadlines (``x_same_work``);
  ``cpu_pool_calls`` the same with a loop that calls a Python function every turn;
- ``parallel``: blocks per second of 2 threads entering and exiting ``thread_deadline(10)``
  blocks (harness.never_firing_scope) at once, over 1 thread's (``x2``; the no-op ``with`` beside it, ``x2_noop``: the
  machine's own scaling), alternated, harness.parallel_round each;
- ``floor3``: the floor of ``hogs3``: how long a thread spinning next to 3 spinning threads
  waits, at a random instant, until it runs bytecode again (harness.run_floor); no
  deadline lands before that.

Each configuration runs in its own subprocess (the switch is read at import), and the
configurations run in turn, round after round, in ABBA order (A B, B A, A B, ...), so that a
drift of the machine meets all of them alike. A configuration's figure is the median over
its rounds; ``*_lo``/``*_hi`` are the smallest and largest round: the spread between
repeated rounds of one configuration is the noise a difference has to exceed.

Run, from the repository root, for the current build (the C core built in place or an
editable install)::

    python benchmarks/bench_accelerators.py --config all=all --config none=none --rounds 6

``--config LABEL=ACCEL`` (repeatable) names a configuration and its ``TIMEOUTCORE_ACCEL``
(a comma-separated list leaves the others off: ``--config no_prearm=anticipation,...`` for
what one accelerator buys); ``--tree LABEL=DIR`` runs that label with another checkout's
build instead (``PYTHONPATH`` and cwd = DIR: how the before/after comparison across commits
was run, with a worktree of each commit built in place). The figures are merged into
``benchmarks/results/accelerators.json`` under this interpreter's version and ``--study``
name (the other rows stay); ``--out -`` prints them instead. ``--raw FILE`` keeps every
round's figures, and ``--from-raw FILE`` (same ``--config``/``--tree``, same interpreter)
summarizes them again without measuring. ``--child`` is the subprocess's side.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULT = HERE / "results" / "accelerators.json"
MAIN_STUDY = "main"

LIMIT_S = 0.05
TRIALS = 40  # lateness trials per case and round
OVERHEAD_ROUNDS = 200  # rounds of harness.CHEAP_OPS blocks
POOL_REPS = 2  # run_cpu_pool's throughput_reps: 2 x CPU_POOL_TASKS tasks a mode
PARALLEL_REPS = 5  # rounds per thread count and kind in the parallel case ...
PARALLEL_BLOCKS = 100_000  # ... of this many blocks per thread

POOLS = (("cpu_pool", False), ("cpu_pool_calls", True))  # (key, the loop calls a function)

# (key, title, workload attribute of harness, thread, busy threads)
LATENESS = (
    ("quiet_cpu_main", "quiet: CPU loop, main thread", "CPU", "main", 0),
    ("quiet_cpu_worker", "quiet: CPU loop, pool worker", "CPU", "worker", 0),
    ("quiet_c_call_worker", "quiet: blocking C call, pool worker", "C_CALL", "worker", 0),
    ("hogs3", "CPU loop, pool worker, +3 spinning threads", "CPU", "worker", 3),
    ("hogs7", "CPU loop, pool worker, +7 spinning threads", "CPU", "worker", 7),
)


def child() -> dict[str, Any]:
    """Run every case once in this process; the raw figures."""
    sys.path.insert(0, str(HERE))
    import harness  # noqa: PLC0415 - the benchmarks folder, not the package

    import timeoutcore  # noqa: PLC0415 - after the environment was set by the parent

    plan = harness.Plan(name="accelerators", limits=(LIMIT_S,), trials=TRIALS,
                        case_budget_s=TRIALS * LIMIT_S, slow_trials=TRIALS, slow_budget_s=0.0,
                        overhead_rounds=OVERHEAD_ROUNDS, overhead_thread_rounds=3,
                        throughput_tasks=0, throughput_reps=POOL_REPS, contention=True)
    switches = getattr(timeoutcore, "accelerators", None)  # None: a build before the switches
    out: dict[str, Any] = {
        "engine": timeoutcore.ENGINE,
        "package": str(Path(timeoutcore.__file__).parent),
        "active": (sorted(k for k, v in switches().items() if v) if switches
                   else "no switches in this build"),
    }
    if timeoutcore.ENGINE == "native":
        with timeoutcore.thread_deadline(None):
            pass
    t = harness.TIMEOUTCORE
    ops = harness.CHEAP_OPS
    out["overhead_ns"] = harness._time_rounds(t.empty_blocks, t.cleanup, ops,
                                              OVERHEAD_ROUNDS)["per_block_ns"]
    noop = harness.NO_DEADLINE
    out["noop_ns"] = harness._time_rounds(noop.empty_blocks, noop.cleanup, ops,
                                          OVERHEAD_ROUNDS)["per_block_ns"]
    for key, _title, workload, thread, hogs in LATENESS:
        case = harness.Case(t, getattr(harness, workload), thread, LIMIT_S, hogs=hogs)
        trials = _trials(harness, case)
        outcomes = [trial.outcome for trial in trials]
        if {"abandoned", "returned"} & set(outcomes):
            out[key] = {"error": f"outcomes: {outcomes}"}
            continue
        # A trial whose deadline had not landed when its work ended by itself, SLACK after
        # the deadline: its sample is that moment, so the percentiles are lower bounds then.
        out[key] = {"samples_ms": [round((tr.exit.left_at - tr.exit.deadline) * 1e3, 4)
                                   for tr in trials],
                    "not_interrupted": outcomes.count("not_interrupted")}
    for key, calls in POOLS:
        pool = harness.run_cpu_pool(plan, calls=calls)
        out[key] = {k: pool[k] for k in ("x_same_work", "deadlines_turns_per_s",
                                         "same_work_turns_per_s")}
    out["parallel"] = _parallel(harness)
    out["floor3"] = harness.run_floor(3)
    return out


def _parallel(harness: Any) -> dict[str, float]:
    """Blocks per second with 1 and 2 threads, timeoutcore and the no-op ``with``, each
    the median of PARALLEL_REPS rounds taken in turn."""
    makes = {"noop": harness.NoOp, "timeoutcore": harness.never_firing_scope}
    secs: dict[tuple[str, int], list[float]] = {}
    for _ in range(PARALLEL_REPS):
        for threads in (1, 2):
            for kind, make in makes.items():
                secs.setdefault((kind, threads), []).append(
                    harness.parallel_round(threads, make, PARALLEL_BLOCKS))
    rate = {k: k[1] * PARALLEL_BLOCKS / statistics.median(v) for k, v in secs.items()}
    return {"rate1": round(rate["timeoutcore", 1]),
            "x2": round(rate["timeoutcore", 2] / rate["timeoutcore", 1], 3),
            "x2_noop": round(rate["noop", 2] / rate["noop", 1], 3)}


def _trials(harness: Any, case: Any) -> list[Any]:
    """TRIALS trials of ``case`` after one unrecorded, next to its busy threads, in its
    thread. (Not harness.run_case: a case whose first trial is slow gets only a couple of
    trials there, and a configuration without accelerators makes the busy cases slow.)"""
    phase = random.Random(case.id) if case.hogs else None  # the same instants every run

    def run() -> list[Any]:
        harness.run_trial(case, phase)  # warm-up
        return [harness.run_trial(case, phase) for _ in range(TRIALS)]

    with harness.cpu_hogs(case.hogs):
        if case.thread == "main":
            return run()
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="bench") as pool:
            return pool.submit(run).result()


def _pair(text: str, what: str) -> tuple[str, str]:
    label, sep, value = text.partition("=")
    if not sep or not label:
        raise argparse.ArgumentTypeError(f"{what}: expected LABEL=VALUE, got {text!r}")
    return label, value


def _run(label: str, accel: str, tree: Path) -> dict[str, Any]:
    env = dict(os.environ, TIMEOUTCORE_ACCEL=accel, PYTHONPATH=str(tree))
    load = os.getloadavg()[0]
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child"],
                          cwd=tree, env=env, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"configuration {label} failed:\n{proc.stderr}")
    result: dict[str, Any] = json.loads(proc.stdout)
    result["load"] = (load + os.getloadavg()[0]) / 2  # the machine's, other processes' too
    if result["engine"] != "native":
        raise SystemExit(f"configuration {label}: the {result['engine']} engine, not the C core")
    if Path(result["package"]).parent != tree:
        raise SystemExit(f"configuration {label}: timeoutcore imported from "
                         f"{result['package']}, not from {tree}")
    return result


def _pct(values: list[float], q: int) -> float:
    return statistics.quantiles(sorted(values), n=100, method="inclusive")[q - 1]


def _summary(label: str, runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per case: the median over rounds, and the smallest and largest round."""
    out: dict[str, dict[str, Any]] = {}
    per = [r["overhead_ns"] for r in runs]
    noop = [r["noop_ns"] for r in runs]
    out["overhead"] = {"config": label, "case": "overhead",
                       "per_block_ns": round(statistics.median(per), 1),
                       "per_block_ns_lo": min(per), "per_block_ns_hi": max(per),
                       "noop_ns": round(statistics.median(noop), 1),
                       "rounds": len(runs)}
    for key, title, *_ in LATENESS:
        rows = [r[key] for r in runs]
        bad = [row["error"] for row in rows if "error" in row]
        if bad:
            out[key] = {"config": label, "case": key, "title": title, "error": bad[0]}
            continue
        p50 = [_pct(row["samples_ms"], 50) for row in rows]
        p99 = [_pct(row["samples_ms"], 99) for row in rows]
        pooled = [v for row in rows for v in row["samples_ms"]]
        out[key] = {"config": label, "case": key, "title": title,
                    "p50_ms": round(statistics.median(p50), 3),
                    "p50_ms_lo": round(min(p50), 3), "p50_ms_hi": round(max(p50), 3),
                    "p99_ms": round(_pct(pooled, 99), 3),
                    "p99_ms_round_lo": round(min(p99), 3),
                    "p99_ms_round_hi": round(max(p99), 3),
                    "trials": len(pooled), "rounds": len(runs),
                    "not_interrupted": sum(row["not_interrupted"] for row in rows)}
    for key, _calls in POOLS:
        if not all(key in r for r in runs):  # not in a raw file of an older run
            continue
        x = [r[key]["x_same_work"] for r in runs]
        out[key] = {"config": label, "case": key,
                    "x_same_work": round(statistics.median(x), 3),
                    "x_same_work_lo": min(x), "x_same_work_hi": max(x),
                    "deadlines_turns_per_s": round(statistics.median(
                        r[key]["deadlines_turns_per_s"] for r in runs)),
                    "rounds": len(runs)}
    if all("parallel" in r for r in runs):  # not in a raw file of an older run
        x2 = [r["parallel"]["x2"] for r in runs]
        out["parallel"] = {"config": label, "case": "parallel", "x2": round(statistics.median(x2), 3),
                           "x2_lo": min(x2), "x2_hi": max(x2),
                           "x2_noop": round(statistics.median(r["parallel"]["x2_noop"]
                                                              for r in runs), 3),
                           "rate1": round(statistics.median(r["parallel"]["rate1"] for r in runs)),
                           "rounds": len(runs)}
        f99 = [r["floor3"]["p99_ms"] for r in runs]
        out["floor3"] = {"config": label, "case": "floor3",
                         "p99_ms": round(statistics.median(f99), 3),
                         "p99_ms_lo": min(f99), "p99_ms_hi": max(f99),
                         "p50_ms": round(statistics.median(r["floor3"]["p50_ms"] for r in runs), 3),
                         "rounds": len(runs)}
    return out


LATENESS_KEYS = frozenset(key for key, *_ in LATENESS)
# The figure each case is compared by.
FIGURE = {"overhead": "per_block_ns", **{key: "p50_ms" for key, *_ in LATENESS},
          **{key: "x_same_work" for key, _ in POOLS}, "parallel": "x2", "floor3": "p99_ms"}


def _ratios(base: dict[str, dict[str, Any]], other: dict[str, dict[str, Any]],
            other_label: str, base_label: str) -> list[dict[str, Any]]:
    """other / base per case, with the noise: the larger relative spread (hi/lo) of the
    two configurations' rounds."""
    rows = []
    for case, figure in FIGURE.items():
        a, b = base.get(case, {}), other.get(case, {})
        if figure not in a or figure not in b or not a[figure]:
            continue
        spread = max(s[f"{figure}_hi"] / s[f"{figure}_lo"] for s in (a, b) if s[f"{figure}_lo"])
        row = {"compare": f"{other_label} / {base_label}", "case": case, "figure": figure,
               "ratio": round(b[figure] / a[figure], 3),
               "noise_hi_over_lo": round(spread, 3)}
        if case in LATENESS_KEYS:
            row["p99_ratio"] = round(b["p99_ms"] / a["p99_ms"], 3)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--config", action="append", default=[],
                        type=lambda s: _pair(s, "--config"),
                        help="LABEL=ACCEL: a configuration (repeatable; default all and none)")
    parser.add_argument("--tree", action="append", default=[],
                        type=lambda s: _pair(s, "--tree"),
                        help="LABEL=DIR: run that label with the build of another checkout")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--study", default=MAIN_STUDY,
                        help="a name for this set of configurations: its rows replace only "
                             "the earlier rows of the same study and interpreter")
    parser.add_argument("--out", default=str(RESULT), help="result file, or - to print")
    parser.add_argument("--raw", help="also write every round's raw figures to this file")
    parser.add_argument("--from-raw", help="measure nothing: summarize the rounds a --raw "
                                           "file holds (the same --config/--tree)")
    args = parser.parse_args()
    if args.child:
        json.dump(child(), sys.stdout)
        return
    if not args.config:
        args.config = [("all", "all"), ("none", "none")]
    configs: list[tuple[str, str]] = args.config
    trees = {label: Path(d).resolve() for label, d in args.tree}
    unknown = set(trees) - {label for label, _ in configs}
    if unknown:
        parser.error(f"--tree for labels not given by --config: {sorted(unknown)}")
    if args.from_raw:
        runs: dict[str, list[dict[str, Any]]] = json.loads(Path(args.from_raw).read_text())
        if set(runs) != {label for label, _ in configs}:
            parser.error(f"{args.from_raw} holds the configurations {sorted(runs)}")
        args.rounds = min(len(rs) for rs in runs.values())
    else:
        runs = {label: [] for label, _ in configs}
        t0 = time.monotonic()
        for r in range(args.rounds):
            order = configs if r % 2 == 0 else configs[::-1]
            for label, accel in order:
                runs[label].append(_run(label, accel, trees.get(label, ROOT)))
                print(f"round {r + 1}/{args.rounds}: {label} done "
                      f"({time.monotonic() - t0:.0f} s)", file=sys.stderr)
        if args.raw:
            Path(args.raw).write_text(json.dumps(runs) + "\n")
    measured = _measured(args, runs, trees)
    if args.out == "-":
        json.dump(measured, sys.stdout, indent=1)
        return
    _merge(Path(args.out), measured)


def _measured(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]],
              trees: dict[str, Path]) -> dict[str, Any]:
    """The result file's rows for this interpreter and study."""
    py = platform.python_version() + ("t" if sysconfig.get_config_var("Py_GIL_DISABLED") else "")
    summaries = {label: _summary(label, rs) for label, rs in runs.items()}
    ref = "all" if "all" in summaries else args.config[0][0]
    ratios = [row for label in summaries if label != ref
              for row in _ratios(summaries[ref], summaries[label], label, ref)]
    commits = {label: _commit(trees.get(label, ROOT)) for label, _ in args.config}
    command = ("python benchmarks/bench_accelerators.py "
               + " ".join(f"--config {label}={accel}" for label, accel in args.config)
               + f" --rounds {args.rounds}"
               + (f" --study {args.study}" if args.study != MAIN_STUDY else "")
               + "".join(f" --tree {label}=<checkout of {commits[label]}>"
                         for label, _ in args.tree))
    loads = [r["load"] for rs in runs.values() for r in rs]
    return {
        "python": py,
        "study": args.study,
        "runs": [{"command": command, "rounds": args.rounds,
                  "load_min": round(min(loads), 2), "load_max": round(max(loads), 2)}],
        # One string: the docs' renderer takes a list this long for raw samples.
        "configs": [{"config": label, "TIMEOUTCORE_ACCEL": accel, "commit": commits[label],
                     "active": _names(runs[label][0]["active"])}
                    for label, accel in args.config],
        "overhead": [s["overhead"] for s in summaries.values()],
        "lateness": [s[key] for s in summaries.values() for key, *_ in LATENESS],
        "cpu_pool": [s[key] for s in summaries.values() for key, _ in POOLS if key in s],
        "parallel": [s["parallel"] for s in summaries.values() if "parallel" in s],
        "floor3": [s["floor3"] for s in summaries.values() if "floor3" in s],
        "ratios": ratios,
    }


def _names(active: list[str] | str) -> str:
    return active if isinstance(active, str) else ", ".join(active) or "none"


def _commit(tree: Path) -> str:
    """The checkout's commit (short), with ``+changes`` where its tracked files differ."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tree), *args], capture_output=True,
                              text=True, check=False).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


TABLES = ("runs", "configs", "overhead", "lateness", "cpu_pool", "parallel", "floor3", "ratios")


def _merge(path: Path, measured: dict[str, Any]) -> None:
    """This interpreter's rows of this study replace its earlier ones; the others stay."""
    py, study = measured["python"], measured["study"]
    data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    data["environment"] = {"machine": platform.machine(), "cpus": os.cpu_count(),
                           "engine": "native",
                           "command": "python benchmarks/bench_accelerators.py (each "
                                      "interpreter's: runs)"}
    for table in TABLES:
        data[table] = [row for row in data.get(table, [])
                       if (row.get("python"), row.get("study")) != (py, study)]
        data[table] += [{"python": py, "study": study, **row} for row in measured[table]]
    path.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
