"""Database drivers: ``guard(conn)`` stops a blocked query at the thread's stop time.

A query blocked in libpq or SQLite retries ``EINTR`` itself, so the deadline's signal cannot
end it; each driver has a cancel meant for another thread, which ``guard`` hands to
:func:`timeoutcore.interrupt_with`::

    with thread_deadline(2.0), guard(conn):
        conn.execute("SELECT ...")      # ends with DeadlineExceeded at 2 s

========================  ==========================  ====================================
driver                    cancel                      afterwards
========================  ==========================  ====================================
``sqlite3``               ``conn.interrupt()``        usable (the statement is rolled back)
``psycopg2``              ``conn.cancel()``           ``conn.rollback()``, then usable
``psycopg`` (3)           ``conn.cancel_safe()``      ``conn.rollback()``, then usable
========================  ==========================  ====================================
"""

from __future__ import annotations

from typing import Any, Callable

from ..interrupt import interrupt_with
from ..protect import protect_module, protected_modules

__all__ = ["cancel_of", "guard"]


def cancel_of(conn: Any) -> Callable[[], Any]:
    """The function that cancels ``conn``'s running statement from another thread."""
    module = type(conn).__module__.split(".")[0]
    if module == "sqlite3":
        return conn.interrupt  # type: ignore[no-any-return]
    if module == "psycopg" and callable(getattr(conn, "cancel_safe", None)):
        return conn.cancel_safe  # type: ignore[no-any-return]
    if module in ("psycopg", "psycopg2") or callable(getattr(conn, "cancel", None)):
        return conn.cancel  # type: ignore[no-any-return]
    raise TypeError(f"guard(): no known cancel for a {type(conn).__qualname__} connection")


def guard(conn: Any) -> interrupt_with:
    """``interrupt_with`` the right cancel for a sqlite3, psycopg2 or psycopg connection.

    psycopg 3 runs its protocol in Python where its C speed-up is not installed (its
    pure-Python implementation is the only one on free-threaded CPython): an interrupt that
    surfaced there would leave the connection with "another command already in progress".
    So guard() protects the ``psycopg`` package (:func:`timeoutcore.protect_module`): the
    cancelled query returns its error to the caller, and the interrupt surfaces there."""
    cancel = cancel_of(conn)
    if type(conn).__module__.split(".")[0] == "psycopg" and "psycopg" not in protected_modules():
        protect_module("psycopg")
    return interrupt_with(cancel)
