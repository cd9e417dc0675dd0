"""Developer and CI sessions: ``nox`` runs lint, types and the tests on CPython 3.11-3.14
and the free-threaded 3.14t.

    nox                      # every default session
    nox -s lint types        # static checks only
    nox -s tests-3.12 -- -k scope -x   # one interpreter, extra pytest arguments

Every interpreter of ``REQUIRED`` must be found, or the run fails
(``error_on_missing_interpreters``): a silently skipped version is a version nobody tested.
``OPTIONAL`` versions (3.14 and 3.14t: in no registry this project's CI machines reach) get a session
only where such an interpreter is found (on PATH as ``pythonX.Y``, or in pyenv).
Where ``pythonX.Y`` is not on PATH but pyenv has that version (pyenv's shims answer only for
the selected version), the noxfile links the pyenv interpreter into ``.nox/.interpreters``
and puts that folder first on PATH, so plain ``nox`` works on a pyenv machine too.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import nox

REQUIRED = ["3.11", "3.12", "3.13"]
OPTIONAL = ["3.14", "3.14t"]

ROOT = Path(__file__).resolve().parent

# Every install in every session, the project's build requirements included (pip 25.3+ reads
# PIP_BUILD_CONSTRAINT for its isolated build environment, older pips PIP_CONSTRAINT), takes
# the exact versions in constraints.txt, so a release elsewhere cannot change what the checks
# run against; the caps on the tools and their reasons are in scripts/refresh_constraints.py,
# which rewrites the file. Explicit values win: `PIP_CONSTRAINT= PIP_BUILD_CONSTRAINT= nox -s
# types` checks against the newest releases.
CONSTRAINTS = ROOT / "constraints.txt"
for _var in ("PIP_CONSTRAINT", "PIP_BUILD_CONSTRAINT"):
    os.environ.setdefault(_var, str(CONSTRAINTS))

nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["lint", "types", "tests"]

# Prints where ``timeoutcore`` was imported from and which engine loaded. Run with ``-I``
# (no cwd on sys.path) and TIMEOUTCORE_ENGINE=native, it fails unless the *installed* package
# and its compiled core load: the tests must not silently exercise the pure-Python fallback.
CHECK_INSTALLED = (
    "import timeoutcore, sys; "
    "print('timeoutcore', timeoutcore.__version__, 'engine', timeoutcore.ENGINE, "
    "'from', timeoutcore.__file__, 'on', sys.version.split()[0])"
)


def _works(exe: str) -> bool:
    try:
        proc = subprocess.run([exe, "-c", "pass"], capture_output=True, timeout=30, check=False)
        return proc.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _pyenv_root() -> Path | None:
    if os.environ.get("PYENV_ROOT"):
        return Path(os.environ["PYENV_ROOT"])
    pyenv = shutil.which("pyenv")
    if pyenv is None:
        return None
    out = subprocess.run([pyenv, "root"], capture_output=True, text=True, check=False)
    return Path(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None


def _expose_pyenv_interpreters() -> None:
    """Make ``pythonX.Y`` resolvable for each version that pyenv has but PATH lacks."""
    wanted = REQUIRED + OPTIONAL
    missing = [v for v in wanted if not (shutil.which(f"python{v}") and _works(f"python{v}"))]
    root = _pyenv_root() if missing else None
    if not missing or root is None:
        return
    links = ROOT / ".nox" / ".interpreters"
    for version in missing:
        # Plain CPython builds only ("3.12.1"), not "3.13.0t" or virtualenvs; newest patch.
        candidates = [
            d
            for d in (root / "versions").glob(f"{version}.*")
            if re.fullmatch(rf"{re.escape(version)}\.\d+", d.name)
            and (d / "bin" / f"python{version}").exists()
        ]
        if not candidates:
            continue  # nox reports it as missing, and error_on_missing_interpreters fails
        best = max(candidates, key=lambda d: int(d.name.rsplit(".", 1)[1]))
        links.mkdir(parents=True, exist_ok=True)
        link = links / f"python{version}"
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(best / "bin" / f"python{version}")
    if links.is_dir():
        os.environ["PATH"] = f"{links}{os.pathsep}{os.environ.get('PATH', '')}"


_expose_pyenv_interpreters()
PYTHONS = REQUIRED + [v for v in OPTIONAL if shutil.which(f"python{v}") and _works(f"python{v}")]


def _install_project(session: nox.Session, spec: str, *more: str) -> None:
    """``pip install`` the work tree with setuptools' build folder in the session's tmp.

    The default, ./build, is shared with anyone's ``setup.py build_ext --inplace`` and with the
    other sessions, and setuptools skips compiling when the built module is newer than the .c
    files, even if only csrc/timeoutcore.h changed. DIST_EXTRA_CONFIG (read by setuptools'
    distutils) moves the build folder out of the tree and forces build_ext to recompile.
    """
    cfg = _build_outside(Path(session.create_tmp()))
    # TIMEOUTCORE_WERROR: a compiler warning in the C core fails the build (_ffi_build.py).
    session.install(spec, *more, env={"DIST_EXTRA_CONFIG": str(cfg), "TIMEOUTCORE_WERROR": "1"})


def _build_outside(tmp: Path) -> Path:
    """A setuptools config (for DIST_EXTRA_CONFIG) that builds in ``tmp``, not ./build, and
    always recompiles (:func:`_install_project` says why)."""
    cfg = tmp / "setuptools-build.cfg"
    cfg.write_text(f"[build]\nbuild_base = {tmp / 'build'}\n\n[build_ext]\nforce = 1\n")
    return cfg


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check over the whole repository (config: [tool.ruff] in pyproject.toml)."""
    session.install("ruff")
    session.run("ruff", "check", ".", *session.posargs)


@nox.session
def types(session: nox.Session) -> None:
    """mypy --strict (config: [tool.mypy] in pyproject.toml) over the timeoutcore package."""
    # The package itself brings cffi (imported by _ffi_build.py); types-cffi gives it types.
    # pytest (typed) for contrib.pytest, anyio (typed) for contrib.anyio and contrib.asgi.
    _install_project(session, ".[celery,redis,anyio,dramatiq,rq,huey]", "mypy", "types-cffi", "pytest")
    session.run("mypy", "timeoutcore", *session.posargs)


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """Build and install the package (compiles the C core), then run the test suite."""
    _install_project(session, ".[test]")
    # From a scratch folder: proves the installed wheel (not ./timeoutcore) loads natively.
    session.chdir(session.create_tmp())
    session.run("python", "-I", "-c", CHECK_INSTALLED, env={"TIMEOUTCORE_ENGINE": "native"})
    session.chdir(ROOT)
    # Tests marked `once` (pyproject.toml) check nothing that depends on the interpreter.
    # .ci/run has run them in its README suite and says so with TIMEOUTCORE_TESTS_ONCE_DONE;
    # a developer's plain `nox` runs everything on every interpreter.
    once = ["-m", "not once"] if os.environ.get("TIMEOUTCORE_TESTS_ONCE_DONE") else []
    session.run("pytest", "tests", "-q", *once, *session.posargs)


#: The part of the suite that exercises an engine -- scopes, deliveries, cancels, soft
#: limits, deadline-aware waits, the race and integrity hammers -- run once more on the
#: pure-Python engine by the ``fallback`` session. (The rest of the suite runs on whichever
#: engine loads; the ``api`` fixture already runs many scope tests on both engines.)
FALLBACK_TESTS = [
    "tests/test_fallback.py",
    "tests/test_race.py",
    "tests/test_integrity.py",
    "tests/test_scope.py",
    "tests/test_cancel.py",
    "tests/test_soft.py",
]


#: The part of the suite that pins the core's behaviour -- scopes, delivery, the race and
#: integrity hammers, patched blocking calls, cancels -- run once more by the ``core``
#: session with every latency accelerator switched off (TIMEOUTCORE_ACCEL=none): the core
#: must be correct on its own.
CORE_TESTS = [
    "tests/test_scope.py",
    "tests/test_integrity.py",
    "tests/test_race.py",
    "tests/test_patch.py",
    "tests/test_patch_socket_stops.py",
    "tests/test_cancel.py",
    "tests/test_watchdog.py",
    "tests/test_resources.py",
    "tests/test_thread_start_failure.py",
    "tests/test_accelerators.py",
]


@nox.session(python="3.13")
def core(session: nox.Session) -> None:
    """The core alone: :data:`CORE_TESTS` with ``TIMEOUTCORE_ACCEL=none`` on 3.13 (the
    newest required CPython, where most accelerators exist), against the installed build."""
    _install_project(session, ".[test]")
    session.run("pytest", *CORE_TESTS, "-q", *session.posargs,
                env={"TIMEOUTCORE_ACCEL": "none"})


#: Run in the ``fallback`` session's venv: passes only where ``timeoutcore`` was imported
#: from a build without the C core and the default engine choice picked the pure-Python one.
CHECK_PURE = (
    "import importlib.util, timeoutcore; "
    "assert timeoutcore.ENGINE == 'fallback', timeoutcore.ENGINE; "
    "assert importlib.util.find_spec('timeoutcore._timeoutcore') is None; "
    "print('timeoutcore', timeoutcore.__version__, 'engine', timeoutcore.ENGINE, "
    "'from', timeoutcore.__file__)"
)


@nox.session
def fallback(session: nox.Session) -> None:
    """The pure-Python build: ``TIMEOUTCORE_PURE_PYTHON=1`` makes the ``py3-none-any``
    wheel (published, tagged for macOS, beside the Linux wheels; what a build where the C
    core cannot compile installs too); installed without the C core, the default engine choice must pick
    the pure-Python engine, and the engine tests run on it, on the interpreter nox runs on
    only (the suite's tests/test_fallback.py runs its workloads on that engine, in
    subprocesses, on every interpreter of the ``tests`` session, and test_pure_build.py
    builds with a C core that fails to compile)."""
    tmp = Path(session.create_tmp())
    dist = tmp / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    session.run("python", "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(ROOT),
                env={"TIMEOUTCORE_PURE_PYTHON": "1",
                     "DIST_EXTRA_CONFIG": str(_build_outside(tmp))})
    wheels = sorted(dist.glob("timeoutcore-*.whl"))
    if [w.name.rsplit("-", 3)[1:] for w in wheels] != [["py3", "none", "any.whl"]]:
        session.error(f"expected one py3-none-any wheel, built {[w.name for w in wheels]}")
    # A reused venv may hold an earlier (native) install of the same version, which pip
    # would keep: it goes first.
    session.run("python", "-m", "pip", "uninstall", "-q", "-y", "timeoutcore")
    session.install(f"{wheels[0]}[test]")
    env = {"TIMEOUTCORE_ENGINE": "fallback",
           "TIMEOUTCORE_HAMMER_BLOCKS": os.environ.get("TIMEOUTCORE_HAMMER_BLOCKS", "20000")}
    session.chdir(tmp)
    session.run("python", "-I", "-c", CHECK_PURE, env={"TIMEOUTCORE_ENGINE": "auto"})
    session.chdir(ROOT)
    # TIMEOUTCORE_ENGINE=fallback as well: tests that expect the native engine on Linux
    # skip themselves on it (tests/test_scope.py).
    session.run("pytest", *FALLBACK_TESTS, "-q", *session.posargs, env=env)


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site (docs/conf.py) with every warning an error: a broken
    link, an unresolved reference to a timeoutcore name, a public name without a reference
    entry. Its code examples run in the test suite (tests/test_readme.py). Then the README,
    the PyPI description, must pass ``twine check --strict``."""
    # With the C core: the reference documents the native engine's scope type (its
    # attributes live in C), not the pure-Python engine's. The integrations' frameworks are
    # stood in for by autodoc (autodoc_mock_imports), so the session installs none of them.
    # The plot extra (matplotlib) draws the Performance page's charts; without it the site
    # has the tables only.
    _install_project(session, ".[docs,plot]")
    out = ROOT / "docs" / "_build" / "html"
    session.run("sphinx-build", "-W", "--keep-going", "-n", "-q", "-b", "html",
                str(ROOT / "docs"), str(out), *session.posargs)
    session.log(f"docs: {out / 'index.html'}")
    # The README is the PyPI description: twine checks it renders there, from a wheel's
    # metadata (the pure-Python build: no compiler needed, the same metadata).
    tmp = Path(session.create_tmp())
    dist = tmp / "readme-check"
    shutil.rmtree(dist, ignore_errors=True)
    session.install("twine")
    session.run("python", "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(ROOT),
                env={"TIMEOUTCORE_PURE_PYTHON": "1",
                     "DIST_EXTRA_CONFIG": str(_build_outside(tmp))})
    session.run("twine", "check", "--strict", *map(str, sorted(dist.glob("*.whl"))))
