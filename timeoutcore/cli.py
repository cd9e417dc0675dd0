"""``python -m timeoutcore`` (also the ``timeoutcore`` console script).

- ``demo``: a thread pool in which some tasks overrun ``thread_deadline(0.25)``; a table,
  one row per task (``--json``: each task's result as a JSON line), then a summary and a
  comparison with ``signal.alarm``.
- ``bench``: timeoutcore side by side with ``signal.alarm``, ``signal.setitimer`` and a
  ``threading.Timer`` + ``PyThreadState_SetAsyncExc`` recipe (:mod:`timeoutcore._bench`,
  part of the package); a table on stdout, optionally a JSON result file and a PNG.
  ``--full`` runs the full harness instead, ``benchmarks/harness.py`` of a source checkout
  (more workloads and deadlines, stopit and func_timeout), loaded when the command runs.
- ``run``: a command under a hard (and soft) limit via ``timeoutcore.subprocess.run``; the
  result as JSON on stdout, the exit status like coreutils ``timeout``.

This module is the one part of the package that is not protected code
(``timeoutcore.protect.DEFAULT_EXEMPT``): the demo's and the benchmark's workloads live here
because they stand for the user's code, and a deadline must stop them as it stops that.

Bad input is reported on stderr, one line, never a traceback: exit status 2 (125 for ``run``,
whose other statuses belong to the command).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import importlib.util
import itertools
import logging
import math
import os
import re
import signal
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, NoReturn, Optional, Sequence

from . import _json

from . import ENGINE, DeadlineExceeded, _validate, sleep, thread_deadline

PROG = "timeoutcore"

# ``run`` exit statuses, as coreutils ``timeout`` has them.
EXIT_TIMEOUT = 124  # the command was stopped at a limit
EXIT_FAILED = 125  # timeoutcore itself failed, or bad usage of ``run``
EXIT_CANNOT_RUN = 126  # the command was found but could not be run
EXIT_NOT_FOUND = 127  # the command was not found


class UsageError(Exception):
    """Bad input detected after argument parsing; reported on stderr without a traceback."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


def _fail(message: str, status: int, command: str = "") -> int:
    where = f"{PROG} {command}".strip()
    print(f"{where}: error: {message}", file=sys.stderr)
    return status


# --- workloads: the demo's tasks and the benchmark's work (timeoutcore._bench) --------------


def cpu_loop(seconds: float) -> None:
    """Python code that runs for ``seconds`` (a CPU loop)."""
    end = time.perf_counter() + seconds
    # Not ``while perf_counter() < end``: an exception raised at such a loop's back-edge
    # skips that frame's handlers on CPython 3.13.0 (cpython#130279).
    for _ in itertools.count():
        if time.perf_counter() >= end:
            return


def blocking_read(seconds: float) -> None:
    """A C call that blocks: ``read()`` on a pipe nobody writes to within ``seconds``."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.read.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)
    r, w = os.pipe()
    writer = threading.Timer(seconds, os.write, (w, b"x"))
    writer.start()
    try:
        buf = ctypes.create_string_buffer(1)
        libc.read(r, buf, 1)
    finally:
        writer.cancel()
        writer.join()  # it may be writing right now: never close the fd under it
        os.close(r)
        os.close(w)


# --- demo -----------------------------------------------------------------------------------

_KINDS: dict[str, Callable[[float], None]] = {
    "cpu-loop": cpu_loop,
    "timeoutcore.sleep": sleep,
    "blocking-read": blocking_read,
}


def _what(kind: str, seconds: float) -> str:
    """What a demo task does, for the table."""
    if kind == "cpu-loop":
        return f"CPU loop, {seconds:.2f} s of work"
    if kind == "blocking-read":
        return f"blocking read(), {seconds:.2f} s"
    return f"{kind}({seconds:.2f})"


def _task(i: int, kind: str, seconds: float, limit: float) -> dict[str, Any]:
    scope = thread_deadline(limit, label=f"task-{i}", soft_limit=limit * SOFT_SHARE)
    try:
        with scope:
            _KINDS[kind](seconds)
    except DeadlineExceeded:
        pass
    row: dict[str, Any] = {"task": i, "kind": kind, "work_s": seconds}
    row.update(_json.loads(scope.result.to_json()))  # the DeadlineResult, as logged
    return row


def _alarm_in_worker() -> str:
    def attempt() -> str:
        try:
            signal.signal(signal.SIGALRM, lambda *a: None)
            signal.alarm(1)
            signal.alarm(0)
            return "worked"
        except ValueError as exc:
            return f"ValueError: {exc}"

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(attempt).result()


SOFT_SHARE = 0.5  # the demo's soft limit, as a share of the hard one


def _work_for(i: int, limit: float) -> float:
    """Every fourth task overruns the hard limit; every fourth, from the third on, passes
    only the soft one; the rest finish well within both."""
    if i % 4 == 0:
        return limit * 4.0
    if i % 4 == 2:
        return limit * 0.75
    return limit * 0.2


class _Collect(logging.Handler):
    """Keeps the records of the ``timeoutcore`` logger (the soft-limit warnings) for the
    summary instead of printing them between the table's rows."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


_DEMO_COLUMNS = ("task", "what it did", "status", "elapsed", "overshoot")
_DEMO_WIDTHS = (4, 30, 13, 8, 9)
_DEMO_WIDTH = 88  # the summary lines wrap here


def _demo_line(cells: Sequence[str]) -> str:
    task, what, status, elapsed, over = cells
    w = _DEMO_WIDTHS
    return (f"{task:>{w[0]}}  {what:<{w[1]}}  {status:<{w[2]}}  {elapsed:>{w[3]}}  "
            f"{over:>{w[4]}}").rstrip()


def _demo_row(r: dict[str, Any]) -> str:
    over = f"{r['overshoot'] * 1e3:.2f} ms" if r["overshoot"] is not None else ""
    return _demo_line([str(r["task"]), _what(r["kind"], r["work_s"]),
                       str(r["status"]).replace("_", " "), f"{r['elapsed']:.3f} s", over])


def demo(args: argparse.Namespace) -> int:
    limit = args.limit
    as_json = args.json
    kinds = list(_KINDS)
    plan = [(i, kinds[i % len(kinds)], _work_for(i, limit)) for i in range(args.tasks)]
    soft = limit * SOFT_SHARE
    if as_json:
        print(
            f"# engine={ENGINE}: {len(plan)} tasks on {args.workers} pool threads, each under "
            f"thread_deadline({limit:g}, soft_limit={soft:g}); every fourth task overruns "
            "its hard limit, every fourth from the third on passes only the soft one",
            flush=True,
        )
        handler: logging.Handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("# %(levelname)s %(message)s"))
    else:
        print(f"{len(plan)} tasks on {args.workers} pool threads, each under "
              f"thread_deadline({limit:g}, soft_limit={soft:g}); engine: {ENGINE}\n")
        print(_demo_line(_DEMO_COLUMNS))
        print(_demo_line(["-" * w for w in _DEMO_WIDTHS]), flush=True)
        handler = _Collect()
    log = logging.getLogger("timeoutcore")
    log.addHandler(handler)
    t0 = time.monotonic()
    try:
        with ThreadPoolExecutor(max_workers=args.workers, thread_name_prefix="worker") as pool:
            futures = [pool.submit(_task, i, kind, secs, limit) for i, kind, secs in plan]
            results = []
            for fut in futures:
                res = fut.result()
                results.append(res)
                # one write per line: in JSON mode the soft-limit warnings share stdout
                line = _json.dumps(res).decode() if as_json else _demo_row(res)
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
    finally:
        log.removeHandler(handler)
    wall = time.monotonic() - t0
    counts: dict[str, int] = {}
    for r in results:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    overs = sorted(r["overshoot"] * 1e3 for r in results if r["overshoot"] is not None)
    alarm = _alarm_in_worker()
    if as_json:
        summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        print(f"# {summary}; wall {wall:.2f} s")
        if overs:
            print(f"# hard limit overshoot: median {overs[len(overs) // 2]:.3f} ms, "
                  f"max {overs[-1]:.3f} ms")
        print(f"# for comparison, signal.alarm in a pool thread: {alarm}")
    else:
        parts = [f"{n} {status.replace('_', ' ')}" for status, n in sorted(counts.items())]
        lines = [f"{len(results)} tasks in {wall:.2f} s: {', '.join(parts)}."]
        if overs:
            how = ("whatever they were doing" if ENGINE == "native" else "Python code and "
                   "timeoutcore.sleep at once, a blocking C call when it returned (the "
                   "pure-Python engine)")
            lines.append(f"Overrunning tasks were stopped {overs[len(overs) // 2]:.2f} ms after "
                         f"their hard limit (median; at most {overs[-1]:.2f} ms): {how}.")
        if isinstance(handler, _Collect) and handler.records:
            lines.append(f"The soft limit ({soft:g} s) logged a warning for "
                         f"{len(handler.records)} tasks (logger 'timeoutcore') and let them "
                         "go on.")
        kind, _, why = alarm.partition(": ")
        lines.append("signal.alarm, for comparison: in a pool thread it raises "
                     + (f'{kind} ("{why}")' if why else kind) + "; in the main thread it "
                     f"counts whole seconds: {limit:g} s becomes {max(1, math.ceil(limit))} s.")
        print()
        for text in lines:
            # a figure stays on one line with its unit (NUL: a character textwrap keeps)
            text = re.sub(r"(\d) (m?s)\b", "\\1\0\\2", text)
            print(textwrap.fill(text, width=_DEMO_WIDTH, subsequent_indent="  ")
                  .replace("\0", " "))
    # success: every overrunning task was stopped at its hard limit
    stopped = all(r["status"] == "timed_out" for r in results if r["task"] % 4 == 0)
    return 0 if stopped else 1


# --- bench ----------------------------------------------------------------------------------


def _check_output_path(option: str, path: str) -> None:
    """Refuse, before a run of minutes, a path that cannot be written."""
    if not path or path.endswith(os.sep):
        raise UsageError(f"{option} {path!r}: a file name is needed")
    if os.path.isdir(path):
        raise UsageError(f"{option} {path!r} is a directory")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UsageError(f"{option} {path!r}: no such directory {os.path.dirname(path)!r}")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"{option} {path!r}: directory is not writable")


class _Progress:
    """One line per step on stderr; on a terminal the line is rewritten in place."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.t0 = time.monotonic()

    def __call__(self, message: str) -> None:
        text = f"bench {time.monotonic() - self.t0:5.1f} s: {message}"
        if self.tty:
            sys.stderr.write("\r\033[K" + text[:150])
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


HARNESS = Path("benchmarks", "harness.py")
_HARNESS_MODULE = "timeoutcore_bench_harness"


def harness_candidates() -> list[Path]:
    """Where ``bench --full`` looks for the harness, in order: the source checkout this
    package was imported from (``benchmarks/`` beside ``timeoutcore/``), then the current
    directory."""
    checkout = Path(__file__).resolve().parent.parent
    return [checkout / HARNESS, Path.cwd() / HARNESS]


def load_bench_harness() -> ModuleType:
    """The full benchmark harness module, loaded from the first of
    :func:`harness_candidates` that exists (once per process); :class:`UsageError` when
    there is none, as in an installed wheel."""
    loaded = sys.modules.get(_HARNESS_MODULE)
    if loaded is not None:
        return loaded
    for path in harness_candidates():
        if not path.is_file():
            continue
        spec = importlib.util.spec_from_file_location(_HARNESS_MODULE, path)
        if spec is None or spec.loader is None:  # pragma: no cover - a .py file always has one
            continue
        module = importlib.util.module_from_spec(spec)
        sys.modules[_HARNESS_MODULE] = module  # dataclasses look their module up there
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[_HARNESS_MODULE]
            raise
        return module
    raise UsageError(
        f"--full runs the full harness ({HARNESS.as_posix()}), which is part of a source "
        "checkout of timeoutcore, not of the installed package: run it in a checkout (or "
        "in the folder that holds benchmarks/), or drop --full for the packaged benchmark"
    )


def bench(args: argparse.Namespace) -> int:
    if args.full:
        engine: Any = load_bench_harness()
        plan = engine.QUICK if args.quick else engine.FULL
        about = "well under a minute" if args.quick else "about 6 minutes"
    else:
        engine = importlib.import_module("timeoutcore._bench")
        plan = engine.QUICK if args.quick else engine.STANDARD
        about = "about 10 s" if args.quick else "under a minute"

    if args.plot is not None:
        try:
            importlib.import_module("matplotlib")
        except ImportError:
            print(f"{PROG} bench: --plot needs matplotlib, which is not installed; "
                  "get it with: pip install matplotlib (or timeoutcore[plot])",
                  file=sys.stderr)
            return 2
        _check_output_path("--plot", args.plot)
    if args.json is not None and args.json != "-":
        _check_output_path("--json", args.json)

    print(f"{PROG} bench ({plan.name}): {about}; progress on stderr", file=sys.stderr)
    if args.full:
        missing = [m.requires for m in engine.METHODS if m.missing() is not None]
        if missing:
            print(f"{PROG} bench: skipping {', '.join(str(n) for n in missing)} (not "
                  f"installed; pip install {' '.join(str(n) for n in missing)})",
                  file=sys.stderr)
    progress = _Progress()
    try:
        results = engine.run(plan, progress=progress)
    finally:
        progress.close()

    if args.json == "-":
        sys.stdout.buffer.write(_json.dumps(results, indent=True) + b"\n")
        sys.stdout.flush()
    else:
        sys.stdout.write(engine.render(results))
        sys.stdout.flush()
    if args.json is not None and args.json != "-":
        with open(args.json, "wb") as f:
            f.write(_json.dumps(results, indent=True) + b"\n")
        print(f"{PROG} bench: results written to {args.json}", file=sys.stderr)
    if args.plot is not None:
        engine.plot(results, args.plot)
        print(f"{PROG} bench: plot written to {args.plot}", file=sys.stderr)
    return 0


# --- run ------------------------------------------------------------------------------------


def _describe_invalid(exc: BaseException) -> str:
    """One readable line for a ValueError/TypeError, pydantic's ValidationError included."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            items = errors()
            parts = []
            for item in items:
                loc = ".".join(str(p) for p in item.get("loc", ()))
                msg = str(item.get("msg", "")).removeprefix("Value error, ")
                parts.append(f"{loc}: {msg}" if loc else msg)
            if parts:
                return "; ".join(parts)
        except Exception:  # noqa: BLE001 - fall back to the plain message
            pass
    return " ".join(str(exc).split()) or type(exc).__name__


def _status_of(result: Any) -> int:
    """The exit status for a ``RunResult``, as coreutils ``timeout`` would give it."""
    status = getattr(result, "status", None)
    if status in ("soft_killed", "timed_out"):
        return EXIT_TIMEOUT
    if status == "error":
        error = str(getattr(result, "error", "") or "")
        if error.startswith("FileNotFoundError"):
            return EXIT_NOT_FOUND
        if error.startswith(("PermissionError", "IsADirectoryError", "NotADirectoryError")):
            return EXIT_CANNOT_RUN
        return EXIT_FAILED
    code = getattr(result, "exit_code", None)
    if code is None:
        code = getattr(result, "returncode", None)
    if isinstance(code, int):
        return 128 - code if code < 0 else code  # < 0: subprocess's "died of signal -code"
    sig = getattr(result, "signal", None)
    if isinstance(sig, int):
        return 128 + sig  # died of a signal nobody at timeoutcore sent: the shell's convention
    return EXIT_FAILED


class _Waiting:
    """On a terminal, after 2 s, a line on stderr saying the command still runs (its output is
    captured, so nothing else shows); nothing when stderr is not a terminal."""

    def __init__(self, name: str, hard: float) -> None:
        self.name, self.hard = name, hard
        self.stop = threading.Event()
        self.thread: Optional[threading.Thread] = None

    def __enter__(self) -> _Waiting:
        if sys.stderr.isatty():
            self.thread = threading.Thread(target=self._show, daemon=True)
            self.thread.start()
        return self

    def _show(self) -> None:
        t0 = time.monotonic()
        if self.stop.wait(2.0):
            return
        while True:
            sys.stderr.write(f"\r\033[K{PROG} run: {self.name} running, "
                             f"{int(time.monotonic() - t0)} s of at most {self.hard:g} s")
            sys.stderr.flush()
            if self.stop.wait(0.5):
                break
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()


def run_command(args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("no command given: timeoutcore run --limit S -- CMD [ARGS...]",
                         EXIT_FAILED)
    try:
        module: Any = importlib.import_module("timeoutcore.subprocess")
    except ImportError as exc:
        return _fail(f"this installation cannot run commands under limits "
                     f"(timeoutcore.subprocess: {exc})", EXIT_FAILED, "run")
    kwargs: dict[str, Any] = {"hard": args.hard}
    if args.soft is not None:
        kwargs["soft"] = args.soft
    if args.grace is not None:
        kwargs["grace"] = args.grace
    try:
        with _Waiting(cmd[0], args.hard):
            result = module.run(cmd, **kwargs)
    except FileNotFoundError:
        return _fail(f"command not found: {cmd[0]}", EXIT_NOT_FOUND, "run")
    except PermissionError:
        return _fail(f"cannot run {cmd[0]}: permission denied", EXIT_CANNOT_RUN, "run")
    except (ValueError, TypeError) as exc:
        return _fail(_describe_invalid(exc), EXIT_FAILED, "run")
    except OSError as exc:
        return _fail(f"cannot run {cmd[0]}: {exc.strerror or exc}", EXIT_CANNOT_RUN, "run")
    payload = result.to_json()
    if isinstance(payload, str):
        payload = payload.encode()
    sys.stdout.buffer.write(payload + b"\n")
    sys.stdout.flush()
    code = _status_of(result)
    if getattr(result, "status", None) == "error":
        _fail(f"cannot run {cmd[0]}: {getattr(result, 'error', None) or 'unknown error'}",
              code, "run")
    return code


# --- parser ---------------------------------------------------------------------------------


def _seconds_arg(text: str, allow_zero: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    try:
        return _validate.seconds(value, PROG, "value", allow_zero=allow_zero)
    except ValueError as exc:  # argparse names the option: keep "value must be ..."
        raise argparse.ArgumentTypeError(str(exc).partition(": ")[2]) from None


def _positive(text: str) -> float:
    return _seconds_arg(text, allow_zero=False)


def _non_negative(text: str) -> float:
    return _seconds_arg(text, allow_zero=True)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors exit with ``usage_status``: 2, except for
    ``run``, which uses 125 as coreutils ``timeout`` does, leaving 2 to the command."""

    usage_status = 2

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(self.usage_status, f"{self.prog}: error: {message}\n")


BENCH_HELP = """\
Measures, on this machine and interpreter, timeoutcore against signal.alarm (the classic
recipe, whole seconds), signal.setitimer and a threading.Timer + PyThreadState_SetAsyncExc
recipe: the overhead of a block that does not time out; how late a 50 ms deadline stops a
CPU loop, a sleep and a blocking C call, in the main thread and in a pool worker; and how late
in a pool whose every worker is busy. --full runs the full harness of a source checkout
instead (benchmarks/harness.py: more workloads and deadlines, stopit and func_timeout when
installed, pool throughput; about 6 minutes).
"""

RUN_HELP = """\
exit status: the command's own; 124 if it was stopped at a limit; 125 if timeoutcore failed
or was used wrongly; 126 if the command could not be run; 127 if it was not found; 128+N if
it died of signal N. The result is printed on stdout as JSON.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Hard time limits for any Python thread.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("demo", help="a thread pool where some tasks overrun their deadline",
                       description="A thread pool in which every fourth task overruns its "
                       "thread_deadline: a table of what each task did and how it ended, "
                       "then a summary.")
    p.add_argument("--tasks", type=_count, default=12, help="number of tasks (default 12)")
    p.add_argument("--workers", type=_count, default=4, help="pool threads (default 4)")
    p.add_argument("--limit", type=_positive, default=0.25, help="deadline in s (default 0.25)")
    p.add_argument("--json", action="store_true",
                   help="each task's result as a JSON line (comments start with #) instead "
                   "of the table")
    p.set_defaults(func=demo)

    p = sub.add_parser("bench", help="timeoutcore side by side with signal.alarm and the recipes",
                       description=BENCH_HELP)
    p.add_argument("--quick", action="store_true",
                   help="fewer trials (about 10 s; with --full: the 50 ms deadline only)")
    p.add_argument("--json", metavar="PATH",
                   help="also write every figure as JSON to PATH, with the date, host, CPUs "
                   "and versions ('-': JSON on stdout instead of the table)")
    p.add_argument("--plot", metavar="PATH",
                   help="also write a PNG of the overshoot distributions (needs matplotlib: "
                   "pip install timeoutcore[plot])")
    p.add_argument("--full", action="store_true",
                   help="run the full harness of a source checkout (benchmarks/harness.py)")
    p.set_defaults(func=bench)

    p = sub.add_parser("run", help="run a command under a hard (and soft) time limit",
                       description="Run CMD in its own process group; at the soft limit it "
                       "gets SIGTERM, at the hard limit (or after the grace period) the whole "
                       "group gets SIGKILL and is reaped.",
                       epilog=RUN_HELP, usage="%(prog)s --limit S [--soft-limit S] [--grace S] "
                       "-- CMD [ARGS...]")
    assert isinstance(p, _Parser)
    p.usage_status = EXIT_FAILED
    p.add_argument("--limit", "--hard", dest="hard", type=_positive, required=True,
                   metavar="S", help="hard limit in seconds (--hard: its older name)")
    p.add_argument("--soft-limit", "--soft", dest="soft", type=_positive, metavar="S",
                   help="soft limit in seconds: SIGTERM first (--soft: its older name)")
    p.add_argument("--grace", type=_non_negative, metavar="S",
                   help="seconds between SIGTERM and SIGKILL")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD", help="the command and its "
                   "arguments, after --")
    p.set_defaults(func=run_command)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Optional[Callable[[argparse.Namespace], int]] = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return func(args)
    except UsageError as exc:
        return _fail(str(exc), exc.status, args.command)
    except KeyboardInterrupt:
        print(f"{PROG} {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): no traceback, and none at exit either.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except OSError as exc:  # writing an output file, typically
        return _fail(str(exc), 1, args.command)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
