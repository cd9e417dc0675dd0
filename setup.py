import sysconfig

from setuptools import setup

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

install_requires = [
    "cffi>=1.17; python_version < '3.14'",
    "cffi>=2.0; python_version >= '3.14'",  # the first cffi with free-threaded support
    "pydantic>=2.5",
]
test = ["pytest>=7", "pytest-benchmark>=4", "pytest-timeout>=2.1", "celery[redis]>=5.3",
        "redis>=4.5", "psycopg-pool>=3.2",
        # The integrations' real servers, workers and clients (tests/test_asgi.py,
        # test_to_thread.py, test_wsgi*.py, test_pytest_plugin.py, test_dramatiq.py,
        # test_rq.py, test_huey.py).
        "anyio>=4.4", "trio>=0.26", "fastapi>=0.115", "uvicorn>=0.30", "httpx>=0.27",
        "gunicorn>=23", "waitress>=3.0", "flask>=3.0", "django>=5.2", "requests>=2.32",
        "dramatiq[redis]>=1.17", "rq>=2.0", "huey>=2.5",
        "pytest-xdist>=3.5", "pytest-run-parallel>=0.10"]  # pure Python: every interpreter
if FREE_THREADED:
    test += ["psycopg>=3.2"]
else:
    install_requires += ["orjson>=3.8"]
    test += ["psycopg2-binary>=2.9.9", "psycopg[binary]>=3.2"]

setup(
    cffi_modules=["timeoutcore/_ffi_build.py:ffibuilder"],
    install_requires=install_requires,
    extras_require={
        "celery": ["celery[redis]>=5.3"],
        "redis": ["redis>=4.5"],
        # timeoutcore.contrib.anyio and contrib.asgi (Starlette and FastAPI bring it too).
        "anyio": ["anyio>=4.4"],
        # timeoutcore.contrib.dramatiq, contrib.rq and contrib.huey (abort, stop-job and
        # revoke of a running job also need the redis extra).
        "dramatiq": ["dramatiq>=1.17"],
        "rq": ["rq>=2.0"],
        "huey": ["huey>=2.5"],
        # The tests drive a real Celery worker and a real Redis (redis-server from the system).
        "test": test,
        "bench": ["pytest-benchmark>=4", "stopit", "func_timeout"],
        "plot": ["matplotlib>=3.5"],
    },
)
