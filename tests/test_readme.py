"""The README's runnable example does what it says (docs that drift are defects)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"

# Documentation examples: what they exercise is tested on every interpreter elsewhere.
pytestmark = pytest.mark.once


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


def _blocks(section_title: str) -> list[str]:
    if not README.exists():
        pytest.skip("README.md is not beside tests/ (not a source checkout)")
    section = README.read_text(encoding="utf-8").split(f"## {section_title}\n")[1]
    section = section.split("\n## ", 1)[0]
    return [b.split("```", 1)[0] for b in section.split("```python")[1:]]


def test_celery_example_runs_with_a_threads_pool_worker(tmp_path: Path, redis_url: str) -> None:
    pytest.importorskip("celery")
    tasks, client = _blocks("Celery")
    (tmp_path / "tasks.py").write_text(tasks, encoding="utf-8")
    (tmp_path / "client.py").write_text(client, encoding="utf-8")
    # The example's app uses the default queue; one of its own keeps runs sharing a Redis
    # apart (worker: -Q, client: task_default_queue).
    queue = f"readme-{os.getpid()}-{time.monotonic_ns()}"
    env = dict(os.environ, REDIS_URL=redis_url,
               PYTHONPATH=os.pathsep.join(p for p in (str(tmp_path),
                                                      os.environ.get("PYTHONPATH")) if p))
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tasks", "worker", "--pool", "threads",
         "--concurrency", "4", "-Q", queue, "-l", "WARNING", "--without-gossip",
         "--without-mingle", "--without-heartbeat"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", f"import tasks; tasks.app.conf.task_default_queue = {queue!r}; "
             "exec(open('client.py').read())"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
        )
    finally:
        worker.terminate()
        log, _ = worker.communicate(timeout=30)
    assert proc.returncode == 0, proc.stderr + log.decode(errors="replace")
    assert proc.stdout.splitlines() == [
        "done partial", "stuck: TimeLimitExceeded(0.5)", "partial"], proc.stdout


def test_redis_registry_example_runs(tmp_path: Path, redis_url: str) -> None:
    pytest.importorskip("redis")
    (code,) = _blocks("Redis registry")
    script = tmp_path / "registry_example.py"
    script.write_text(code, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
        timeout=60, env=dict(os.environ, REDIS_URL=redis_url),
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == "[('a', 'completed'), ('b', 'cancelled')]", proc.stdout
    assert any(line.startswith("DeadlineCancelled block 'resize b' cancelled") for line in lines)
    listed = [line for line in lines if line.startswith(("a resize a", "b resize b"))]
    assert len(listed) == 2, proc.stdout


def test_shutdown_example_cancels_the_jobs_and_leaves_no_child(tmp_path: Path) -> None:
    """The SIGTERM example: exit 143 after the grace, every job cancelled, and none of the
    `sleep 60` children left (they carry a marker in their environment, found in /proc)."""
    code = _blocks("Stopping a worker: cancel everything, leave no process behind")[0]
    script = tmp_path / "worker.py"
    script.write_text(code, encoding="utf-8")
    marker = f"readme-shutdown-{os.getpid()}-{time.monotonic_ns()}"
    start = time.monotonic()
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, TC_MARKER=marker))
    took = time.monotonic() - start
    assert proc.returncode == 143, proc.stderr
    assert proc.stdout.strip() == str(["DeadlineCancelled"] * 4), proc.stdout
    assert took < 30
    left = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if f"TC_MARKER={marker}".encode() in f.read():
                    left.append(int(name))
        except (OSError, ValueError):
            continue
    assert left == [], left


def test_cancel_example_stops_every_timed_out_thread(tmp_path: Path) -> None:
    [code] = _blocks("Cancel means stop: asyncio, anyio, FastAPI, WSGI servers, pytest")
    script = tmp_path / "cancel.py"
    script.write_text(code, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["still served", "stopped at 0.1 s"]
