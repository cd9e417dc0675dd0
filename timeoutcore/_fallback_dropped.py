"""The pure-Python engine: an exception of ours that CPython dropped -- learn where, send it
again (the native engine's twin is csrc/tc_unraisable.c).

A weakref callback, a finalizer, a GC callback runs where an exception cannot propagate:
CPython reports it as ignored (``sys.unraisablehook``) and drops it. The interrupt, or the
soft exception of a ``soft_raise`` soft limit, delivered there is lost; and a loop that
spends its time in such callbacks (objects dropped with a weakref callback each) got every
re-send of the interrupt in another one and never ended. Code named ``__del__`` is
protected by name; the rest is learned here, from the audit event ``sys.unraisablehook``
(raised before the report whatever hook is installed: pytest replaces the hook, and an
audit hook cannot be replaced or removed), in the thread that dropped it:

- the outermost Python function the exception left (the callback) and the hook about to
  report it join :data:`timeoutcore._fallback_deliver.dropped_codes`, which counts as
  protected: no later delivery lands there;
- the engine sends it again at once (``Engine.on_dropped``), not at the watchdog's next
  re-send, which backs off -- and for a soft exception, which nobody else sends again.

An exception counts as ours only if it is the very instance the engine raised
(``Engine.instance`` notes it): the program's own exceptions of the same classes, dropped
in its callbacks, are left alone.

Rule: the audit hook is installed once, with the delivery hook (the first delivery), and
costs every audit event of the process one string comparison from then on. The learned set
only grows, by one code object per distinct callback that ever dropped one of ours.
"""

from __future__ import annotations

import sys
import threading
import types
from typing import Any, Optional

from . import _fallback_deliver as _dl

_installed = False
_install_lock = threading.Lock()


def _code_of_hook(hook: Any) -> Optional[types.CodeType]:
    """The code the hook about to report runs first: a function's, a method's, or the
    ``__call__`` of an object whose class defines it in Python."""
    fn = getattr(hook, "__func__", hook)
    if not isinstance(fn, types.FunctionType):
        fn = getattr(type(hook), "__call__", None)
    return fn.__code__ if isinstance(fn, types.FunctionType) else None


def _learn(code: Optional[types.CodeType]) -> None:
    if code is not None and code not in _dl.dropped_codes:
        _dl.dropped_codes.add(code)
        _dl._verdicts.pop(code, None)  # decided before: protected from now on


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event != "sys.unraisablehook":
        return
    hook, unraisable = args
    exc = getattr(unraisable, "exc_value", None)
    if not isinstance(exc, BaseException) or not _dl.engine.ours(exc):
        return
    tb = getattr(unraisable, "exc_traceback", None)
    if isinstance(tb, types.TracebackType):
        _learn(tb.tb_frame.f_code)
    _learn(_code_of_hook(hook))
    _dl.stats["dropped"] += 1
    _dl.engine.on_dropped(threading.get_ident(), exc)


def install() -> None:
    """Install the audit hook (once; idempotent)."""
    global _installed
    with _install_lock:
        if not _installed:
            sys.addaudithook(_audit)
            _installed = True
