"""Sample test files for tests/test_pytest_plugin.py: the suites that a pytest run under
``-p timeoutcore.contrib.pytest`` (or stock pytest-timeout) executes.

Each hanging sample is followed by a test that must pass, and each has a fixture whose
teardown appends a line to the file named by ``TC_MARKS``: ``<what> <xdist worker> <pid>``.
``CONFTEST`` makes every pytest process append, at its exit (after ``pytest_unconfigure``),
which threads are still alive and whether ``timeoutcore.patch()`` is still in effect.
"""

from __future__ import annotations

# The teardown marker, the silent peer and the database connection: fixtures every sample
# file shares (the sample's conftest.py).
CONFTEST = '''
import atexit, os, socket, threading
import pytest


def mark(what):
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(os.environ["TC_MARKS"], "a") as f:
        f.write(f"{what} {worker} {os.getpid()}\\n")


def _at_exit():
    import timeoutcore
    names = sorted(t.name.replace(" ", "_") for t in threading.enumerate())
    mark("exit threads=" + ",".join(names) + f" patched={timeoutcore.is_patched()}")


atexit.register(_at_exit)


@pytest.fixture
def marker(request):
    yield
    mark("teardown " + request.node.name)


@pytest.fixture
def silent_peer():
    """A connected loopback socket whose peer never sends."""
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    yield client
    for s in (client, peer, server):
        s.close()


@pytest.fixture
def pg():
    import psycopg
    conn = psycopg.connect(os.environ["TC_DSN"], connect_timeout=10)
    yield conn
    conn.rollback()  # the cancelled query's transaction
    assert conn.execute("select 1").fetchone() == (1,)
    conn.close()
    mark("closed pg")
'''

# Blocking calls and Python code: stopped by the deadline.
SLEEP_AND_CPU = '''
import time
from conftest import mark


def test_sleep(marker):
    time.sleep(30)


def test_after_sleep():
    mark("passed test_after_sleep")


def test_cpu_loop(marker):
    n = 0
    while True:
        try:
            n += 1
        except Exception:  # cannot keep the test running
            pass


def test_after_cpu_loop():
    mark("passed test_after_cpu_loop")
'''

# A socket read from a silent peer, a PostgreSQL query.
SOCKET_AND_PG = '''
from conftest import mark
from timeoutcore.contrib.db import guard


def test_socket_read(silent_peer, marker):
    silent_peer.recv(1)


def test_after_socket_read():
    mark("passed test_after_socket_read")


def test_pg_sleep(pg, marker):
    with guard(pg):
        pg.execute("select pg_sleep(30)")


def test_after_pg_sleep(pg):
    assert pg.execute("select 2").fetchone() == (2,)
    mark("passed test_after_pg_sleep")
'''

# A C call that retries EINTR (PEP 475), not covered by patch(): the deadline cannot stop
# it; only the escalation ends the process.
STUCK = '''
import os
from conftest import mark


def test_stuck_in_c(marker):
    r, w = os.pipe()
    os.read(r, 1)  # nobody writes; the write end stays open


def test_never_reached():
    mark("passed test_never_reached")
'''

# Threads of its own (pytest-run-parallel's workers): each stopped.
PARALLEL = '''
import time
import pytest
from conftest import mark


@pytest.mark.force_parallel_threads(3)
def test_parallel_sleep(marker):
    time.sleep(30)


@pytest.mark.force_parallel_threads(3)
def test_parallel_cpu():
    n = 0
    while True:
        n += 1


def test_after_parallel():
    mark("passed test_after_parallel")
'''
