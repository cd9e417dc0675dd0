"""The README's and the docs' code examples do what they say (docs that drift are defects).

The rule for a code block in README.md and docs/**/*.md:

- ```` ```python ````: a complete program. It is run, as a script in a scratch folder, and
  must exit 0 (test_example_runs). A block whose first line names a file (``# tasks.py``)
  is one file of an example that needs more than one process or file: the test named for
  it in ``MULTI_FILE`` runs it and checks what it prints; a file block not listed there is
  configuration for a server (``gunicorn.conf.py``, Django's ``settings.py``) and is
  compiled only.
- ```` ```py ````: a fragment (names defined elsewhere, a server or a database needed):
  compiled, not run.

Pages another session's tests cover are listed in ``OWN_TESTS`` with the test that runs
their examples.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import LATE

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"

# Documentation examples: what they exercise is tested on every interpreter elsewhere.
pytestmark = pytest.mark.once

#: The pages whose examples their integration's own test module runs.
OWN_TESTS = {"dramatiq.md": "tests/test_dramatiq.py", "rq.md": "tests/test_rq.py",
             "huey.md": "tests/test_huey.py"}

#: Blocks that name their file, by that name: the test below that runs them.
MULTI_FILE = {
    "tasks.py": "test_celery_example_runs_with_a_threads_pool_worker",
    "client.py": "test_celery_example_runs_with_a_threads_pool_worker",
    "registry.py": "test_redis_registry_example_runs",
    "worker.py": "test_shutdown_example_cancels_the_jobs_and_leaves_no_child",
    "stop_threads.py": "test_cancel_example_stops_every_timed_out_thread",
    "tour.py": "test_tour_runs_every_feature",
}

FENCE = re.compile(r"^```(python|py)\n(.*?)^```", re.M | re.S)
FILE_NAME = re.compile(r"#\s*([\w.]+\.py)\b")


def _pages() -> list[Path]:
    if not README.exists():  # tests copied out of the source tree to test an installed wheel
        return []
    pages = [README, *sorted(DOCS.rglob("*.md"))]
    return [p for p in pages if p.name not in OWN_TESTS and "_build" not in p.parts]


def _blocks() -> list[tuple[str, str, str]]:
    """(id, kind, code) of every code block: kind is "run", "file" or "fragment"."""
    found = []
    for page in _pages():
        text = page.read_text(encoding="utf-8")
        for n, match in enumerate(FENCE.finditer(text), 1):
            lang, code = match.groups()
            line = text[:match.start()].count("\n") + 1
            first = FILE_NAME.match(code.splitlines()[0]) if code.strip() else None
            kind = "fragment" if lang == "py" else "file" if first else "run"
            found.append((f"{page.relative_to(ROOT)}:{line}", kind, code))
    return found


BLOCKS = _blocks()


def _named(name: str) -> str:
    """The one block whose first line names ``name``."""
    matches = [code for _, kind, code in BLOCKS
               if kind == "file" and FILE_NAME.match(code.splitlines()[0])[1] == name]
    if not matches:
        pytest.skip("the docs are not beside tests/ (not a source checkout)")
    assert len(matches) == 1, f"{len(matches)} blocks are named {name}"
    return matches[0]


def _run(code: str, tmp_path: Path, name: str = "example.py", timeout: float = 60,
         **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / name
    script.write_text(code, encoding="utf-8")
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ, **env))


@pytest.mark.parametrize("code", [pytest.param(c, id=i) for i, k, c in BLOCKS if k == "run"])
def test_example_runs(code: str, tmp_path: Path) -> None:
    proc = _run(code, tmp_path)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("code", [pytest.param(c, id=i) for i, k, c in BLOCKS if k != "run"])
def test_fragment_compiles(code: str) -> None:
    # A fragment of an async function may `await` at its top level.
    compile(code, "<fragment>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def test_every_page_has_its_examples_tested() -> None:
    if not README.exists():
        pytest.skip("README.md is not beside tests/ (not a source checkout)")
    for page, test in OWN_TESTS.items():
        if (DOCS / page).exists():
            assert (ROOT / test).exists(), f"docs/{page}: its examples' test {test} is missing"
    named = {FILE_NAME.match(c.splitlines()[0])[1] for _, k, c in BLOCKS if k == "file"}
    missing = set(MULTI_FILE) - named
    assert not missing, f"examples the tests expect are gone from the docs: {missing}"


def test_readme_is_short_and_starts_with_the_two_commands() -> None:
    """PyPI shows the README: it stays an introduction. CI runs its two commands."""
    if not README.exists():
        pytest.skip("README.md is not beside tests/ (not a source checkout)")
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 160, f"README.md has {len(lines)} lines; the rest belongs in docs/"
    assert lines[2:6] == [
        "```bash",
        "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/python -m timeoutcore demo",
        "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest",
        "```",
    ]


def test_readme_links_point_at_files_that_exist() -> None:
    """The README's relative links (into docs/) name files of the repository; the docs'
    own links are checked by their build (nox -s docs)."""
    if not README.exists():
        pytest.skip("README.md is not beside tests/ (not a source checkout)")
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text(encoding="utf-8"))
    relative = [t for t in targets if "://" not in t and not t.startswith("mailto:")]
    assert relative, "the README links into docs/"
    missing = [t for t in relative if not (ROOT / t).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_readme_pool_example_stops_the_stuck_tasks(tmp_path: Path) -> None:
    runnable = [c for i, k, c in BLOCKS if k == "run" and i.startswith("README.md")]
    if not runnable:
        pytest.skip("README.md is not beside tests/ (not a source checkout)")
    proc = _run(runnable[0], tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 8, proc.stdout
    # Tasks 0 and 4 sleep 10 s: stopped at the 0.25 s deadline; the others finish.
    for n, line in enumerate(lines):
        if n % 4 == 0:
            m = re.fullmatch(rf"stopped: task-{n} after (\d+\.\d+) s", line)
            assert m and 0.25 <= float(m[1]) < 0.25 + LATE, line
        else:
            assert line.startswith("done in "), line


def test_tour_runs_every_feature(tmp_path: Path) -> None:
    proc = _run(_named("tour.py"), tmp_path, "tour.py")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "soft: report" in out and "cleanup: runs in this thread" in out
    assert "deadline 'report' exceeded" in out and "tidying up" in out
    assert "timed_out" in out and "DeadlineExceeded None" in out and "[1, 2]" in out
    assert (tmp_path / "runs.jsonl").read_text().count("\n") == 1


def test_celery_example_runs_with_a_threads_pool_worker(tmp_path: Path, redis_url: str) -> None:
    pytest.importorskip("celery")
    (tmp_path / "tasks.py").write_text(_named("tasks.py"), encoding="utf-8")
    (tmp_path / "client.py").write_text(_named("client.py"), encoding="utf-8")
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
    proc = _run(_named("registry.py"), tmp_path, "registry.py", REDIS_URL=redis_url)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == "[('a', 'completed'), ('b', 'cancelled')]", proc.stdout
    assert any(line.startswith("DeadlineCancelled block 'resize b' cancelled") for line in lines)
    listed = [line for line in lines if line.startswith(("a resize a", "b resize b"))]
    assert len(listed) == 2, proc.stdout


def test_shutdown_example_cancels_the_jobs_and_leaves_no_child(tmp_path: Path) -> None:
    """The SIGTERM example: exit 143 after the grace, every job cancelled, and none of the
    `sleep 60` children left (they carry a marker in their environment, found in /proc)."""
    marker = f"readme-shutdown-{os.getpid()}-{time.monotonic_ns()}"
    start = time.monotonic()
    proc = _run(_named("worker.py"), tmp_path, "worker.py", TC_MARKER=marker)
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
    proc = _run(_named("stop_threads.py"), tmp_path, "stop_threads.py", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["still served", "stopped at 0.1 s"]
