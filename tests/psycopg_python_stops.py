"""Run by test_drivers.py in a child process: stops of a guarded query, several in a row on
one connection, with psycopg's pure-Python implementation under ``timeoutcore.patch()``.

psycopg picks its implementation (``PSYCOPG_IMPL``) and its wait function
(``PSYCOPG_WAIT_FUNC``) once, when it is imported: the test sets both in this process's
environment. Prints one JSON object: the implementation and wait function psycopg took, and
for each stop how the block ended, how late, the connection's transaction status right
after, and what a ``rollback()`` plus ``SELECT 1`` gave; or ``{"skip": reason}`` where the
pure-Python psycopg cannot load the system's libpq.

A stop is one of ``run_under_trigger``'s triggers ("hard", "soft", "cancel") ending a
guarded ``SELECT pg_sleep(10)``, or "notifies": a hard deadline ending a guarded
``conn.notifies()`` wait, where no command is in progress for the cancel to end, or
"inside": a hard deadline ending a guarded query on a connection opened inside the scope
with ``with psycopg.connect(...)``, whose exit (a rollback, then the close) runs in the
stopped scope; its status is then CLOSED if that exit closed it.

Usage: ``python psycopg_python_stops.py DSN STOP...`` (from the tests folder).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

STOPS = ("hard", "soft", "cancel", "notifies", "inside")


def main(dsn: str, stops: list[str]) -> dict[str, Any]:
    try:
        import psycopg
    except ImportError as e:  # no libpq for the pure-Python implementation
        return {"skip": f"pure-Python psycopg unavailable: {e}"}
    from conftest import run_under_trigger

    import timeoutcore
    from timeoutcore import interrupt
    from timeoutcore.contrib.db import guard
    from timeoutcore.patch import _left

    out: dict[str, Any] = {"impl": psycopg.pq.__impl__, "wait": psycopg.waiting.wait.__name__,
                           "stops": []}
    timeoutcore.patch()
    conn = psycopg.connect(dsn)
    try:
        for stop in stops:
            opened: list[Any] = []

            def body(stop: str = stop) -> None:
                if stop == "inside":
                    with psycopg.connect(dsn) as inner:
                        opened.append(inner)
                        with guard(inner):
                            inner.execute("SELECT pg_sleep(10)")
                    return
                with guard(conn):
                    if stop == "notifies":
                        for _ in conn.notifies(timeout=10):
                            pass
                    else:
                        conn.execute("SELECT pg_sleep(10)")

            trigger = "hard" if stop in ("notifies", "inside") else stop
            try:
                outcome, elapsed, due = run_under_trigger(trigger, body, 0.2)
            except psycopg.Error as e:  # the connection was left unusable by a stop before
                outcome, elapsed, due = f"{type(e).__name__}: {e}", 0.0, 0.0
            if opened:
                status = "CLOSED" if opened[0].closed else psycopg.pq.TransactionStatus(
                    opened[0].pgconn.transaction_status).name
                opened[0].close()
            else:
                status = psycopg.pq.TransactionStatus(conn.pgconn.transaction_status).name
            try:
                conn.rollback()
                after: Any = conn.execute("SELECT 1").fetchone()[0]  # type: ignore[index]
            except psycopg.Error as e:
                after = f"{type(e).__name__}: {e}"
            time.sleep(0.05)  # patched, outside any scope: no interrupt may surface here
            out["stops"].append({"stop": stop, "outcome": outcome,
                                 "late": elapsed - due, "status": status, "after": after})
    finally:
        conn.close()
    # Nothing left armed: no registered cancel, no socket left to one.
    out["left"] = {"guards": len(interrupt._interrupter._guards),
                   "fds": len(_left.fds)}
    return out


if __name__ == "__main__":
    wanted = sys.argv[2:]
    if not wanted or any(t not in STOPS for t in wanted):
        raise SystemExit(f"usage: {sys.argv[0]} DSN STOP... (of {', '.join(STOPS)})")
    print(json.dumps(main(sys.argv[1], wanted)))
