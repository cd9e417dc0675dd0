"""``pip install`` where the C core cannot compile (setup.py): the build goes on without it,
says so once, and the package runs on the pure-Python engine.

One real build (pip, isolated, as a user's install runs it) with a compiler that fails the
way macOS's does on ``timer_create``. The other paths are the CI's: the pure-Python wheel
(TIMEOUTCORE_PURE_PYTHON=1) is built, installed and tested by nox's ``fallback`` session;
TIMEOUTCORE_WERROR=1 (set by nox and cibuildwheel) keeps a failed compile fatal wherever a
native wheel is built.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import needs_gil

ROOT = Path(__file__).resolve().parent.parent
MESSAGE = "timeoutcore: the C core could not be built here"

pytestmark = [
    pytest.mark.once,  # the build's logic, not the interpreter's
    pytest.mark.skipif(not (ROOT / "setup.py").is_file(), reason="needs the source tree"),
    # cibuildwheel tests the wheels it built, once per wheel: the build path is nox's part
    pytest.mark.skipif(os.environ.get("CIBUILDWHEEL") == "1", reason="tested by nox"),
    needs_gil,  # what it installs runs on the pure-Python engine
]

FAILING_CC = """#!/bin/sh
echo "csrc/tc_timer.c: error: call to undeclared function 'timer_create'" >&2
exit 1
"""


def _run_python(code: str, site: Path, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "TIMEOUTCORE_ENGINE"}
    full.update(env)
    # An editable install of the work tree (a developer's venv) puts a finder on
    # sys.meta_path that maps every timeoutcore submodule to the work tree, its compiled
    # core included: it goes, so that the package imports from ``site`` alone.
    prelude = (f"import sys; sys.path.insert(0, {str(site)!r}); sys.meta_path[:] = "
               "[f for f in sys.meta_path if 'editable' not in repr(f).lower()]; ")
    return subprocess.run([sys.executable, "-c", prelude + code], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=60, check=False)


def test_a_core_that_cannot_compile_gives_a_pure_python_install(tmp_path: Path) -> None:
    cc = tmp_path / "cc"
    cc.write_text(FAILING_CC)
    cc.chmod(0o755)
    # The build folder in tmp: ./build is shared, and a core an earlier build left there
    # must not be what this test finds (setup.py removes it; this keeps the test clean).
    cfg = tmp_path / "setuptools-build.cfg"
    cfg.write_text(f"[build]\nbuild_base = {tmp_path / 'build'}\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("TIMEOUTCORE_WERROR", "TIMEOUTCORE_PURE_PYTHON")}
    env.update(CC=str(cc), DIST_EXTRA_CONFIG=str(cfg))
    for var in ("PIP_CONSTRAINT", "PIP_BUILD_CONSTRAINT"):
        env.setdefault(var, str(ROOT / "constraints.txt"))
    dist = tmp_path / "dist"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(dist), str(ROOT)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert output.count(MESSAGE) == 1, output[-4000:]  # said once, and said
    assert "timer_create" in output  # the compiler's own reason is in the log too
    (wheel,) = dist.glob("timeoutcore-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    assert not [n for n in names if "_timeoutcore" in n], names
    # Installed as pip installs it (the wheel keeps its platform tag, and so its files sit
    # under .data/purelib), into a folder of its own put first on sys.path.
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(site), str(wheel)], cwd=tmp_path, check=True, timeout=120)

    auto = _run_python("import timeoutcore as t; print(t.ENGINE, t.__file__)", site, tmp_path)
    assert auto.returncode == 0, auto.stderr
    assert auto.stdout.split()[0] == "fallback", auto.stdout
    native = _run_python("import timeoutcore", site, tmp_path, TIMEOUTCORE_ENGINE="native")
    assert native.returncode != 0
    assert "has no C core" in native.stderr, native.stderr
