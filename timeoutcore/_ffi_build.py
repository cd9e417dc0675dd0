"""cffi (API mode) build script: reads the real C files in ``csrc/``; nothing else.

``setup.py`` names it in ``cffi_modules``; the extension is ``timeoutcore._timeoutcore``.
"""

from pathlib import Path

from cffi import FFI

_ROOT = Path(__file__).resolve().parent.parent
_HEADER = (_ROOT / "csrc" / "timeoutcore.h").read_text(encoding="utf-8")

ffibuilder = FFI()
ffibuilder.cdef(_HEADER.split("/* cdef-begin")[1].split("*/", 1)[1].split("/* cdef-end */")[0])
ffibuilder.set_source(
    "timeoutcore._timeoutcore",
    '#include "timeoutcore.h"\n',
    sources=["csrc/timeoutcore.c"],  # relative to setup.py, as setuptools requires
    include_dirs=["csrc"],
    extra_compile_args=["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
    py_limited_api=False,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
