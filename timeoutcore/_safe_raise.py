"""Raise an exception from a Python signal handler, but never inside protected code.

A Python signal handler runs in the main thread at whatever bytecode it was at, and an
exception it raises surfaces right there: in ``Condition.wait`` between the wait and
re-taking the condition's lock, for instance -- the ``with`` around it then releases a lock
it does not hold (``RuntimeError: release unlocked lock``, seen when the SIGTERM handler's
``SystemExit`` met a main thread waking from ``handler.done.wait()``). The same rule as the
deadlines' safe delivery therefore applies (:mod:`timeoutcore.protect`): if no frame of the
interrupted stack runs protected code, the exception is raised at once; otherwise the
thread is traced until it is out, and the exception is raised at its first line outside
protected code, or as the outermost protected call returns to unprotected code (that call
then raises it, as if the wait itself had). The tracer is the thread's only while the
exception is on its way; the thread's own tracer is put back before it is raised.

Main thread only (where CPython runs signal handlers); lock-free: the handler may have
interrupted the thread inside ``protect``'s own bookkeeping.
"""

from __future__ import annotations

import sys
from types import CodeType, FrameType
from typing import Any, Optional

from . import protect


_Rules = tuple[tuple[str, ...], tuple[str, ...], frozenset[CodeType]]


def _frame_protected(frame: FrameType, rules: Optional[_Rules] = None) -> bool:
    modules, exempt, codes = rules or protect._snapshot()  # no lock (see above)
    if frame.f_code in codes:
        return True
    name = frame.f_globals.get("__name__")
    return isinstance(name, str) and protect._rule(name, modules, exempt)


def _stack_protected(frame: Optional[FrameType]) -> bool:
    rules = protect._snapshot()
    while frame is not None:
        if _frame_protected(frame, rules):
            return True
        frame = frame.f_back
    return False


def raise_when_safe(frame: Optional[FrameType], exc: BaseException) -> None:
    """From a signal handler given the interrupted ``frame``: raise ``exc`` now if no frame
    of that stack is protected; else return, and ``exc`` is raised in this thread as soon as
    it is outside protected code (see the module's docstring)."""
    if not _stack_protected(frame):
        raise exc
    previous = sys.gettrace()
    traced: list[FrameType] = []

    def fire() -> None:
        sys.settrace(previous)
        for f in traced:
            f.f_trace = None
        traced.clear()
        raise exc

    def tracer(f: FrameType, event: str, arg: Any) -> Any:
        if not traced:  # fired already (another frame's late event)
            return None
        if event == "line" and not _stack_protected(f):
            fire()
        if event == "return" and _frame_protected(f) and not _stack_protected(f.f_back):
            fire()
        return tracer

    f = frame
    while f is not None:
        f.f_trace = tracer
        f.f_trace_lines = True
        traced.append(f)
        f = f.f_back
    sys.settrace(tracer)
