from setuptools import setup

# Metadata and tool configuration live in pyproject.toml; this file only names the
# cffi build script so that setuptools compiles the C core.
setup(cffi_modules=["timeoutcore/_ffi_build.py:ffibuilder"])
