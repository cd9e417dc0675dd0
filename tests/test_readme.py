"""The README's runnable example does what it says (docs that drift are defects)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def test_feature_example_runs(tmp_path: Path) -> None:
    if not README.exists():  # tests copied out of the source tree to test an installed wheel
        pytest.skip("README.md is not beside tests/ (not a source checkout)")
    text = README.read_text(encoding="utf-8")
    section = text.split("## Soft limits, cleanup, results, policies, metrics, thread pool")[1]
    code = section.split("```python", 1)[1].split("```", 1)[0]
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
        timeout=60, env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "soft: report" in out and "cleanup: runs in this thread" in out
    assert "deadline 'report' exceeded" in out and "tidying up" in out
    assert "timed_out" in out and "DeadlineExceeded None" in out and "[1, 2]" in out
    assert (tmp_path / "runs.jsonl").read_text().count("\n") == 1
