"""A real PostgreSQL on loopback for the database-driver tests (a throw-away cluster).

``.ci/run`` starts one for the whole run and exports ``TIMEOUTCORE_TEST_POSTGRES_DSN``;
without that variable the session fixture starts its own (``initdb``/``pg_ctl`` from
``/usr/lib/postgresql/*/bin``, as user ``postgres`` when running as root, in a temporary
folder, on a free loopback port, stopped at the end), and skips only where there is none.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

import pytest
from redis_server import free_port

ENV = "TIMEOUTCORE_TEST_POSTGRES_DSN"


def _bindir() -> Optional[str]:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return os.path.dirname(found[-1])
    exe = shutil.which("initdb")
    return os.path.dirname(exe) if exe else None


def answers(dsn: str) -> bool:
    try:
        try:
            import psycopg2 as driver
        except ImportError:  # free-threaded CPython: only the pure-Python psycopg
            import psycopg as driver  # type: ignore[no-redef]

        driver.connect(dsn, connect_timeout=3).close()
        return True
    except Exception:  # noqa: BLE001 - any failure means "does not answer"
        return False


class PostgresServer:
    def __init__(self, folder: Path) -> None:
        bindir = _bindir()
        if bindir is None:
            raise FileNotFoundError("no initdb (Debian's postgresql package)")
        self.bindir = bindir
        self.folder = folder
        self.data = folder / "data"
        self.port = free_port()
        self.user = "postgres" if os.getuid() == 0 else None
        self.dsn = (f"host=127.0.0.1 port={self.port} dbname=postgres "
                    f"user={self.user or os.environ.get('USER', 'postgres')}")

    def _run(self, *args: str) -> None:
        cmd = [os.path.join(self.bindir, args[0]), *args[1:]]
        if self.user:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        subprocess.run(cmd, check=True, timeout=120, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)

    def start(self) -> PostgresServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.user:
            shutil.chown(self.folder, self.user)
            self.folder.chmod(0o755)
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", self.user or
                  os.environ.get("USER", "postgres"))
        self._run("pg_ctl", "-D", str(self.data), "-w", "-l", str(self.folder / "pg.log"),
                  "-o", f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.folder}",
                  "start")
        if not answers(self.dsn):
            raise RuntimeError(f"PostgreSQL on port {self.port} does not answer")
        return self

    def stop(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")


@contextlib.contextmanager
def session_postgres() -> Iterator[str]:
    """The DSN of a live PostgreSQL: $TIMEOUTCORE_TEST_POSTGRES_DSN (it must answer), else
    a throw-away cluster in a temporary folder (removed afterwards); skips only where
    neither exists."""
    dsn = os.environ.get(ENV)
    if dsn:
        if not answers(dsn):
            pytest.fail(f"{ENV}={dsn} does not answer")
        yield dsn
        return
    # Not under pytest's 0700 basetemp: the server runs as user postgres when we are root.
    folder = Path(tempfile.mkdtemp(prefix="timeoutcore-pg-"))
    try:
        try:
            server = PostgresServer(folder).start()
        except FileNotFoundError:
            pytest.skip(f"no PostgreSQL: install postgresql or set {ENV}")
        try:
            yield server.dsn
        finally:
            server.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
