"""The pure-Python engine: an exception of ours that CPython dropped -- learn where, send it
again (the native engine's twin is csrc/tc_unraisable.c).

A weakref callback, a finalizer, a GC callback runs where an exception cannot propagate:
CPython reports it as ignored (``sys.unraisablehook``) and drops it. The interrupt, or the
soft exception of a ``soft_raise`` soft limit, delivered there is lost; and a loop that
spends its time in such callbacks (objects dropped with a weakref callback each) got every
re-send of the interrupt in another one and never ended. Code named ``__del__`` is
protected by name; the rest is learned here, by the ``sys.unraisablehook`` in place, which
this engine wraps, in the thread that dropped it:

- the outermost Python function the exception left (the callback) joins
  :data:`timeoutcore._fallback_deliver.dropped_codes`, which counts as protected: no later
  delivery lands there;
- the engine sends it again (``Engine.on_dropped``), for the next safe line after the
  report -- not at the watchdog's next re-send, which backs off; and a soft exception,
  which nobody else sends again, at all.

An exception counts as ours only if it is the very instance the engine raised
(``Engine.instance`` notes it): the program's own exceptions of the same classes, dropped
in its callbacks, are reported as usual. The report of the internal interrupt is dropped
(it is the engine's own bookkeeping); a soft exception's is passed on.

Rule: the wrapper goes around whatever hook is in place at each arm of the delivery hook
(``Engine.before_arm``), so a hook installed since -- pytest installs its own per test --
is wrapped in turn, and one installed between an arm and a drop misses that drop only: the
watchdog still re-sends the interrupt. Rejected: the audit event ``sys.unraisablehook``,
which fires whatever hook is installed. A Python audit hook runs at every audited
operation, among them each read of a frame's ``f_code``: the watchdog's look at another
thread's frames (``precheck``) then ran Python code, the GIL could change hands in the
middle of it, and the look was stale by the time it sent -- a logging lock was left held.
"""

from __future__ import annotations

import sys
import threading
import types
from typing import Any

from . import _fallback_deliver as _dl
from ._unraisable import _Hook
from .errors import _DeadlineInterrupt


class _LearnDropped:
    """``sys.unraisablehook`` that learns from a drop of ours and sends it again."""

    def __init__(self, chained: _Hook) -> None:
        self.chained = chained

    def __call__(self, unraisable: Any) -> None:
        exc = getattr(unraisable, "exc_value", None)
        if not isinstance(exc, BaseException) or not _dl.engine.ours(exc):
            self.chained(unraisable)
            return
        tb = getattr(unraisable, "exc_traceback", None)
        if isinstance(tb, types.TracebackType):
            code = tb.tb_frame.f_code
            if code not in _dl.dropped_codes:
                _dl.dropped_codes.add(code)
                _dl._verdicts.pop(code, None)  # decided before: protected from now on
        _dl.stats["dropped"] += 1
        if not isinstance(exc, _DeadlineInterrupt):
            self.chained(unraisable)  # the program's soft exception: reported as usual
        _dl.engine.on_dropped(threading.get_ident(), exc)


def install() -> None:
    """Wrap the ``sys.unraisablehook`` in place, unless it is ours already (idempotent)."""
    if not isinstance(sys.unraisablehook, _LearnDropped):
        sys.unraisablehook = _LearnDropped(sys.unraisablehook)
