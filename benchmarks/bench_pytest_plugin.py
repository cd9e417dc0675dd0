"""One suite with one hanging test, under stock pytest-timeout and under our backend.

    python benchmarks/bench_pytest_plugin.py [--json benchmarks/results/pytest_plugin.json]

The suite: a passing test, a test that sleeps far past ``--timeout`` inside a fixture with a
teardown, a passing test. Each configuration runs it with ``--junitxml`` in a fresh folder
(and once more with ``-n 2`` where pytest-xdist is installed) and reports what survived:
the exit status, whether the hanging test's teardown ran, whether the test after it ran,
whether the JUnit XML was written and how many tests it records, whether an xdist worker
was lost, and the wall time. Not a pytest-benchmark file: what it compares is outcomes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

TIMEOUT = 1.0
SUITE = '''
import os, time
import pytest

MARKS = os.environ["TC_MARKS"]


def mark(what):
    with open(MARKS, "a") as f:
        f.write(what + "\\n")


@pytest.fixture
def resource():
    yield
    mark("teardown")


def test_before():
    pass


def test_hangs(resource):
    time.sleep(60)


def test_after():
    mark("after")
'''

CONFIGS = {
    "pytest-timeout --timeout-method=thread": ["--timeout-method=thread"],
    "pytest-timeout + timeoutcore backend": ["-p", "timeoutcore.contrib.pytest"],
}


def run(args: list[str], xdist: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "test_suite.py").write_text(SUITE)
        marks = folder / "marks.txt"
        junit = folder / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
               f"--timeout={TIMEOUT}", f"--junitxml={junit}", *args]
        if xdist:
            cmd += ["-n", "2", "--dist", "loadfile"]
        env = dict(os.environ, TC_MARKS=str(marks))
        env.pop("PYTEST_ADDOPTS", None)
        start = time.monotonic()
        proc = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True,
                              timeout=120, check=False)
        wall = time.monotonic() - start
        lines = marks.read_text().split() if marks.exists() else []
        recorded = None
        if junit.exists():
            root = ET.parse(junit).getroot()
            recorded = sum(1 for _ in root.iter("testcase"))
        return {
            "exit_status": proc.returncode,
            "teardown_ran": "teardown" in lines,
            "test_after_ran": "after" in lines,
            "junit_written": junit.exists(),
            "junit_testcases": recorded,
            "worker_lost": "node down" in proc.stdout or "crashed" in proc.stdout,
            "wall_s": round(wall, 2),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the results here")
    opts = parser.parse_args()
    modes = [False] + ([True] if importlib.util.find_spec("xdist") else [])
    results = []
    for xdist in modes:
        for name, args in CONFIGS.items():
            outcome = run(args, xdist)
            results.append({"config": name, "xdist": "-n 2" if xdist else "no", **outcome})
    header = list(results[0])
    print(" | ".join(header))
    for row in results:
        print(" | ".join(str(row[k]) for k in header))
    if opts.json:
        opts.json.parent.mkdir(parents=True, exist_ok=True)
        opts.json.write_text(json.dumps({
            "command": "python benchmarks/bench_pytest_plugin.py",
            "python": sys.version.split()[0],
            "timeout_s": TIMEOUT,
            "results": results,
        }, indent=2) + "\n")


if __name__ == "__main__":
    main()
