import os
import sys
import sysconfig

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, ExecError, PlatformError

# Metadata and tool configuration live in pyproject.toml. This file names the cffi build
# script, so that setuptools compiles the C core, and computes the requirements that depend
# on the interpreter the wheel is built for: a free-threaded CPython (3.14t) gets no orjson
# (it has no free-threaded build and its build refuses one; timeoutcore._json falls back to
# the standard library with the same bytes) and no psycopg binary packages in the test
# extra (none exist for it; the pure-Python psycopg uses the system's libpq, and psycopg2's
# extension would switch the GIL back on at import). Wheels are per interpreter ABI
# (cp314 vs cp314t), so each wheel's metadata states exactly what it needs; PEP 508 markers
# cannot tell the two builds apart.
FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))

# The C core (csrc/, through cffi) or none, from TIMEOUTCORE_PURE_PYTHON:
#   unset/""  try the C core; where it cannot compile (macOS has no timer_create, a machine
#             may have no C compiler), say so once and install without it: the package then
#             runs on the pure-Python engine (timeoutcore/_engine.py picks it by itself);
#   "1"       no C core at all: a pure-Python wheel, py3-none-any (the build the `fallback`
#             nox session tests; published beside the Linux wheels, tagged for macOS only:
#             .github/workflows/wheels.yml says why). Build it on a GIL CPython: the
#             pure-Python engine does not run on a free-threaded one;
#   "0"       the C core or a failed build.
# TIMEOUTCORE_WERROR=1 (CI, nox, cibuildwheel) also makes a failed compile fatal: where we
# build and test, a broken C core must never turn silently into a pure-Python package.
PURE_ENV = "TIMEOUTCORE_PURE_PYTHON"
_pure = os.environ.get(PURE_ENV, "").strip()
if _pure not in ("", "0", "1"):
    raise SystemExit(f"{PURE_ENV}={_pure!r}: expected 1 (no C core), 0 (C core required) "
                     "or unset (C core where it compiles)")
PURE = _pure == "1"
NATIVE_REQUIRED = _pure == "0" or os.environ.get("TIMEOUTCORE_WERROR", "") not in ("", "0")

# What a compile or link can fail with: the compiler's error, no compiler at all (spawn
# failed), no compiler for this platform (MSVC missing).
_BUILD_FAILURES = (CCompilerError, ExecError, PlatformError)


class BuildExtOrPurePython(build_ext):
    """setuptools' build_ext (cffi wraps it to write the C wrapper first); when the C core
    cannot be built and it is not required, the package is installed without it.

    The extension is dropped from the command's list once it failed, so that nothing after
    the build (the in-place copy of an editable install, the outputs the install records)
    looks for a file that does not exist; a core an earlier build left in the build folder
    is removed, so that the wheel cannot ship a core older than its sources. The wheel keeps
    its platform tag: it was built here, for here; the published pure-Python wheel comes
    from TIMEOUTCORE_PURE_PYTHON=1.
    """

    def build_extensions(self) -> None:
        try:
            super().build_extensions()
        except _BUILD_FAILURES as exc:
            if NATIVE_REQUIRED:
                raise
            for ext in self.extensions:
                # A core an earlier build left behind: in the build folder, and in the source
                # tree (an editable install builds in place, get_ext_fullpath's answer then):
                # either would be imported in place of the pure-Python engine.
                for stale in {os.path.join(self.build_lib, self.get_ext_filename(ext.name)),
                              self.get_ext_fullpath(ext.name)}:
                    if os.path.exists(stale):
                        os.remove(stale)
            self.extensions = []
            self.distribution.ext_modules = []
            reason = " ".join(str(exc).split()) or type(exc).__name__
            if len(reason) > 200:  # a failed command: the compiler's own output is above
                reason = reason[:200] + "..."
            rule = "=" * 78
            sys.stderr.write(
                f"\n{rule}\ntimeoutcore: the C core could not be built here ({reason}).\n"
                "Installing the pure-Python engine instead: the same API; it stops Python code "
                "and\ntimeoutcore.sleep, not a blocking system call. TIMEOUTCORE_PURE_PYTHON=0 "
                f"makes this an error.\n{rule}\n\n"
            )
            sys.stderr.flush()


install_requires = [
    "pydantic>=2.5",
]
if not PURE:  # cffi's runtime loads the compiled core
    install_requires += [
        "cffi>=1.17; python_version < '3.14'",
        "cffi>=2.0; python_version >= '3.14'",  # the first cffi with free-threaded support
    ]
test = ["pytest>=7", "pytest-benchmark>=4", "pytest-timeout>=2.1", "celery[redis]>=5.3",
        "redis>=4.5", "psycopg-pool>=3.2",
        # The integrations' real servers, workers and clients (tests/test_asgi.py,
        # test_to_thread.py, test_wsgi*.py, test_pytest_plugin.py, test_dramatiq.py,
        # test_rq.py, test_huey.py).
        "anyio>=4.4", "trio>=0.26", "fastapi>=0.115", "uvicorn>=0.30", "httpx>=0.27",
        "gunicorn>=23", "waitress>=3.0", "flask>=3.0", "django>=5.2", "requests>=2.32",
        "dramatiq[redis]>=1.17", "rq>=3.0", "huey>=3.0",
        "pytest-xdist>=3.5", "pytest-run-parallel>=0.10"]  # pure Python: every interpreter
if FREE_THREADED:
    test += ["psycopg>=3.2"]
else:
    test += ["psycopg2-binary>=2.9.9", "psycopg[binary]>=3.2"]
# orjson only beside the C core: the pure-Python wheel is installed on whatever CPython a
# platform has (a free-threaded one included, where orjson would have to be built and
# refuses to), and timeoutcore._json writes the same bytes without it.
if not FREE_THREADED and not PURE:
    install_requires += ["orjson>=3.8"]

setup(
    cffi_modules=[] if PURE else ["timeoutcore/_ffi_build.py:ffibuilder"],
    cmdclass={"build_ext": BuildExtOrPurePython},
    install_requires=install_requires,
    extras_require={
        "celery": ["celery[redis]>=5.3"],
        "redis": ["redis>=4.5"],
        # timeoutcore.contrib.anyio and contrib.asgi (Starlette and FastAPI bring it too).
        "anyio": ["anyio>=4.4"],
        # timeoutcore.contrib.dramatiq, contrib.rq and contrib.huey (abort, stop-job and
        # revoke of a running job also need the redis extra).
        "dramatiq": ["dramatiq>=1.17"],
        "rq": ["rq>=3.0"],
        "huey": ["huey>=3.0"],
        # The tests drive a real Celery worker and a real Redis (redis-server from the system).
        "test": test,
        "bench": ["pytest-benchmark>=4", "stopit", "func_timeout"],
        "plot": ["matplotlib>=3.5"],
        # The documentation site (nox -s docs): Sphinx, MyST Markdown, the furo theme, and
        # towncrier for the changelog's unreleased fragments.
        "docs": ["sphinx>=8.1", "myst-parser>=4", "furo>=2024.8.6", "towncrier>=24.8"],
    },
)
