"""cffi (API mode) build script: reads the real C files in ``csrc/``; nothing else.

``setup.py`` names it in ``cffi_modules``; the extension is ``timeoutcore._timeoutcore``.
The core is a unity build: ``csrc/timeoutcore.c`` is the compiled unit that includes the
parts (``tc_*.c``), listed as dependencies, not as sources; beside it ``csrc/tc_gil.c``
is compiled on its own, with ``Py_BUILD_CORE`` (CPython's internal headers).

Warnings: ``-Wall -Wextra -Wundef`` always; ``TIMEOUTCORE_WERROR=1`` (set by CI and nox)
turns them into errors, so a warning fails the build where we test, never on a user's
newer compiler.
"""

import os
import sysconfig
from pathlib import Path

from cffi import FFI

_ROOT = Path(__file__).resolve().parent.parent
_CSRC = _ROOT / "csrc"
_HEADER = (_CSRC / "timeoutcore.h").read_text(encoding="utf-8")

# cffi's generated wrapper has unused parameters by design; our own code needs no exception.
_FLAGS = ["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Wundef", "-Wno-unused-parameter"]
if os.environ.get("TIMEOUTCORE_WERROR", "") not in ("", "0"):
    _FLAGS.append("-Werror")

# Free-threaded CPython (3.14t): cffi writes "#define _CFFI_NO_LIMITED_API" into the wrapper
# and also passes -D_CFFI_NO_LIMITED_API (value 1): a macro redefinition, which -Werror
# turns into a failed build. The command-line copy is dropped; the wrapper's stays.
_UNDEF = ["_CFFI_NO_LIMITED_API"] if sysconfig.get_config_var("Py_GIL_DISABLED") else []

ffibuilder = FFI()
ffibuilder.cdef(_HEADER.split("/* cdef-begin")[1].split("*/", 1)[1].split("/* cdef-end */")[0])
ffibuilder.set_source(
    "timeoutcore._timeoutcore",
    '#include "timeoutcore.h"\n',
    # relative to setup.py, as setuptools requires; tc_gil.c is the one unit built with
    # CPython's internal headers (where 3.12+ keeps the switch interval)
    sources=["csrc/timeoutcore.c", "csrc/tc_gil.c"],
    depends=sorted(f"csrc/{p.name}" for p in _CSRC.iterdir() if p.suffix in (".c", ".h")),
    include_dirs=["csrc"],
    extra_compile_args=_FLAGS,
    undef_macros=_UNDEF,
    py_limited_api=False,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
