"""Safe delivery for the pure-Python engine: where a fired interrupt surfaces.

The same rule as the native core's (csrc/tc_deliver.c, :mod:`timeoutcore.protect`), in
Python. The watchdog never raises into a thread blindly: it stores the interrupt as
*pending* for that thread (:data:`pending`, one entry per thread ident) and arms a hook
that runs IN THE TARGET THREAD at its next line boundary. There :func:`decide` looks at the
thread's own stack at the moment of delivery and raises only if

* no frame from the innermost up to (not including) the frame of the scope's ``with``
  statement runs protected code -- a protected module (``protect_module``), a protected
  code object (``@protected``), the engine's own modules whatever the protected set says,
  a ``__del__`` (CPython would only report an interrupt raised in a finalizer as ignored)
  or an ``__exit__``/``__aexit__`` (a cleanup; and the exit of a wrapper that entered the
  scope by hand, where the interrupt waits for the scope's own exit to claim it);
* the thread is not shielded, not inside a garbage collection (finalizers), and not
  already raising or handling our interrupt;
* the instruction is a place where raising runs the enclosing handlers: not a ``with``
  statement's exit call or a handler's first instruction, not an instruction that cannot
  raise and lies outside its neighbour's handler, not 3.14's gap after ``__enter__``
  (the same bytecode tests as csrc/tc_compat.h, read from the deoptimised code).

Otherwise the next line boundary decides again. Looking at the thread's frames from the
watchdog would decide nothing: from 3.13 an asynchronous exception surfaces at the
target's next eval-breaker check, wherever that is (DESIGN.md, section 6).

The hook, per interpreter:

* 3.12+: a ``sys.monitoring`` tool of its own (LINE and JUMP events), switched on only while
  some thread has a delivery pending. The callbacks run in every thread meanwhile and return
  at once in a thread with nothing pending. A backward jump is a line boundary too (a
  one-line loop has no LINE event). On 3.12 and 3.13.0-3.13.14 a raise from a JUMP callback
  is handled at a wrong offset (csrc/tc_compat.h: the frame is left past its handlers), so
  there the callback, having decided, switches on INSTRUCTION events for that code object
  (local events of our tool) and raises at the jump's target, the loop head, inside the
  loop's handlers, as the native core does. (An asynchronous exception of the thread itself,
  for the jump's breaker check to raise, is no answer: in Python the callback's own bytecode
  has breaker checks, and the exception surfaced in the callback; and 3.12 attributes it to
  the unit before the loop head, outside a ``try:`` block that starts with the loop.)
* 3.11: the thread's tracer, installed by the watchdog for that one thread
  (``_PyEval_SetTrace`` with CPython's own trampoline, whose address is read back from a
  probe and checked), plus ``f_trace`` set on the frames already on its stack. A raise from
  the tracer turns tracing off (the trampoline does). A loop without line events
  (``while True: pass``) gets opcode events for its frame from the watchdog's backstop and
  is raised at its back-edge. A thread with a Python tracer of its own (``sys.settrace``)
  keeps it: only the frames on its stack get our line events, chained to theirs. A thread
  with a C tracer (a coverage tool) is left to the pre-checked asynchronous exception
  (:func:`precheck`), a documented limit.

Without a hook (3.11 with a foreign tracer, every ``sys.monitoring`` tool id taken) the
engine falls back to ``PyThreadState_SetAsyncExc`` after :func:`precheck` -- the old, less
safe delivery, never used where the hook is available.
"""

from __future__ import annotations

import ctypes
import gc
import sys
import threading
import time
import types
from typing import Any, Optional

from . import protect
from .errors import _DeadlineInterrupt

#: Modules whose frames never receive an interrupt, whatever the protected set says: the
#: engine itself (its locks, its bookkeeping between "block finished" and "taken back").
ENGINE_MODULES = ("timeoutcore._fallback", "timeoutcore._fallback_deliver",
                  "timeoutcore._fallback_dropped")

_get_ident = threading.get_ident

#: Delivery counters, for tests and the hammers (each a plain increment under the GIL):
#: hooks armed, interrupts raised by the hook, decisions that waited -- for protected code,
#: at an unsafe instruction, in a garbage collection, while our interrupt was on its way
#: out -- and deliveries sent without a hook.
stats = {"arms": 0, "hook_raises": 0, "wait_protected": 0, "wait_unsafe": 0, "wait_gc": 0,
         "wait_in_flight": 0, "hookless": 0, "dropped": 0}

#: Code where CPython dropped an exception of ours: protected (_fallback_dropped learns it).
dropped_codes: set[types.CodeType] = set()

#: thread ident -> (exception class, scope or None): what waits for that thread's next
#: safe line boundary. Single dict operations are atomic under the GIL: the watchdog
#: stores, the thread itself pops (delivery, or its scope's exit taking it back).
pending: dict[int, tuple[type[BaseException], Any]] = {}

class Engine:
    """What this module asks of the engine (``timeoutcore._fallback`` installs its own in
    :data:`engine`): the defaults say "no scope frame, nothing shielded, nothing recorded"."""

    def frame_of(self, scope: Any) -> Optional[types.FrameType]:
        """The frame of ``scope``'s with statement while it is active, or None."""
        return None

    def shielded(self, ident: int) -> bool:
        """Is thread ``ident`` inside a shield (or a scope's exit hook)?"""
        return False

    def on_defer(self, scope: Any, where: str) -> None:
        """The first wait of ``scope``'s delivery, held by the protected frame ``where``."""

    def on_deliver(self, scope: Any, deferred: float, where: Optional[str]) -> None:
        """``scope``'s interrupt was raised, after waiting ``deferred`` seconds."""

    def instance(self, ident: int, exc: type[BaseException], scope: Any) -> BaseException:
        """What to raise for ``exc``, pending for ``scope`` in thread ``ident``: a new one."""
        return exc()

    def before_arm(self) -> None:
        """The delivery hook is about to be armed (GIL held): the engine's own part."""

    def ours(self, exc: BaseException) -> bool:
        """Is ``exc`` an instance this engine raised, still meant for an active block?"""
        return False

    def on_dropped(self, ident: int, exc: BaseException) -> None:
        """CPython dropped ``exc``, one of :meth:`ours`, in thread ``ident``: send it again."""


engine = Engine()


# -- Bytecode questions (csrc/tc_compat.h, in Python) -------------------------------------

_op: dict[str, int] = {}
_CANNOT_RAISE: frozenset[int] = frozenset()
_code_cache: dict[types.CodeType, tuple[bytes, list[tuple[int, int, int]]]] = {}


def _load_opcodes() -> None:
    global _CANNOT_RAISE
    import opcode  # only once a delivery is armed: not a cost of every import

    _op.update(opcode.opmap)
    names = ("NOP", "POP_TOP", "SWAP", "COPY", "PUSH_NULL", "LOAD_CONST", "LOAD_SMALL_INT",
             "RESUME", "JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT",
             "RETURN_VALUE", "RETURN_CONST", "NOT_TAKEN")
    _CANNOT_RAISE = frozenset(_op[n] for n in names if n in _op)


def _varints(tab: bytes) -> list[tuple[int, int, int]]:
    """The exception table as (start, end, target) in code units
    (Objects/exception_handling_notes.txt)."""
    out: list[tuple[int, int, int]] = []
    i, n = 0, len(tab)

    def one() -> int:
        nonlocal i
        b = tab[i]
        i += 1
        v = b & 63
        while b & 64:
            b = tab[i]
            i += 1
            v = (v << 6) | (b & 63)
        return v

    try:
        while i < n:
            start, length, target = one(), one(), one()
            one()  # depth and lasti
            out.append((start, start + length, target))
    except IndexError:  # pragma: no cover - a malformed table: no handler known
        pass
    return out


def _code(code: types.CodeType) -> tuple[bytes, list[tuple[int, int, int]]]:
    got = _code_cache.get(code)
    if got is None:
        if len(_code_cache) > 4096:
            _code_cache.clear()
        got = (code.co_code, _varints(code.co_exceptiontable))
        _code_cache[code] = got
    return got


def _handler(table: list[tuple[int, int, int]], unit: int) -> int:
    for start, end, target in table:
        if start <= unit < end:
            return target
    return -1


def _at_with_exit(code: types.CodeType, off: int) -> bool:
    """A with's normal exit call (LOAD_CONST None x3; CALL/PRECALL, outside the with's
    handler range) or a handler's first instruction (PUSH_EXC_INFO): raising there skips
    an ``__exit__`` or a ``finally``."""
    b, _ = _code(code)
    if off + 7 >= len(b):
        return False
    if b[off] == _op["PUSH_EXC_INFO"]:
        return True
    lc = _op["LOAD_CONST"]
    calls = (_op["CALL"], _op.get("PRECALL", -1))
    return (b[off] == lc and b[off + 2] == lc and b[off + 4] == lc and b[off + 6] in calls
            and b[off + 1] < len(code.co_consts) and code.co_consts[b[off + 1]] is None)


def _uncovered_no_raise(code: types.CodeType, off: int) -> bool:
    """An instruction that cannot raise, whose handler differs from the one of the
    instruction before it: raising "at" it could pick the wrong handler (the NOP of a
    ``with sem: pass``, the SWAP that starts a ``return f()``'s with exit)."""
    b, table = _code(code)
    if off < 0 or off + 1 >= len(b) or b[off] not in _CANNOT_RAISE:
        return False
    prev = off - 2
    cache = _op.get("CACHE", 0)
    while prev >= 0 and b[prev] == cache:
        prev -= 2
    return prev >= 0 and _handler(table, off // 2) != _handler(table, prev // 2)


def _in_enter_gap(code: types.CodeType, off: int) -> bool:
    """3.14: the CALL of ``__enter__`` (LOAD_SPECIAL 0/2; CALL), whose breaker check comes
    before the block's handler exists (gh-148874)."""
    if sys.version_info[:2] != (3, 14):
        return False
    b, _ = _code(code)
    return (2 <= off < len(b) - 1 and b[off] == _op["CALL"]
            and b[off - 2] == _op.get("LOAD_SPECIAL", -1) and b[off - 1] in (0, 2))


def _at_back_edge(code: types.CodeType, off: int) -> bool:
    b, _ = _code(code)
    return 0 <= off < len(b) and b[off] == _op["JUMP_BACKWARD"]


# -- Protected code -------------------------------------------------------------------------

#: Code that is protected by its name: a finalizer (CPython reports an exception raised
#: there as ignored and swallows it) and a context manager's exit (an interrupt there tears
#: the cleanup -- and a scope entered by hand from a wrapper's ``__enter__`` is exited from
#: the wrapper's ``__exit__``: the interrupt waits there until the scope's own exit claims
#: it, instead of escaping at the wrapper's first line).
_HELD_NAMES = frozenset({"__del__", "__exit__", "__aexit__"})

_verdicts: dict[types.CodeType, bool] = {}
_snap: Any = None


def _protected(frame: types.FrameType) -> bool:
    code = frame.f_code
    v = _verdicts.get(code)
    if v is None:
        mods, exempt, codes = _snap
        name = frame.f_globals.get("__name__")
        v = (code in codes or code.co_name in _HELD_NAMES or code in dropped_codes
             or (isinstance(name, str)
                 and (name in ENGINE_MODULES or protect._rule(name, mods, exempt))))
        if len(_verdicts) > 8192:
            _verdicts.clear()
        _verdicts[code] = v
    return v


def _refresh() -> None:
    global _snap
    snap = protect._snapshot()
    if snap != _snap:
        _verdicts.clear()
        _snap = snap


def _where(f: types.FrameType) -> str:
    return f"{f.f_code.co_filename}:{f.f_lineno} in {f.f_code.co_qualname}"


def stack_protected(cur: Optional[types.FrameType], bound: Optional[types.FrameType]) -> Optional[str]:
    """Where protected code runs between ``cur`` (innermost) and ``bound`` (the scope's
    with-frame, exclusive; None or not on the stack: the innermost frame alone decides),
    as "file:line in function" of the outermost such frame; None if nowhere."""
    _refresh()
    if cur is None:
        return None
    outer: Optional[types.FrameType] = None
    f: Optional[types.FrameType] = cur
    while f is not None:
        if f is bound:
            return None if outer is None else _where(outer)
        if _protected(f):
            outer = f
        f = f.f_back
    return _where(cur) if _protected(cur) else None


# -- Garbage collection: finalizers run by the collector --------------------------------------

_gc_thread: Optional[int] = None


def _gc_callback(phase: str, info: dict[str, int]) -> None:
    global _gc_thread
    _gc_thread = _get_ident() if phase == "start" else None


# -- The decision, in the target thread -------------------------------------------------------

#: thread ident -> (time.monotonic() of the first deferral, where), while deferred.
_deferred: dict[int, tuple[float, Optional[str]]] = {}
RAISE, DECIDE = 0, 2
_TRACE_HOOK = sys.version_info < (3, 12)
#: thread ident -> its own tracer, turned off by a delivery's raise (3.11), until take_back.
_restore: dict[int, Any] = {}


def decide(frame: types.FrameType, vetted: bool, mode: int) -> bool:
    """In the thread itself, at a line boundary of ``frame`` (``vetted``: a loop's
    back-edge whose raise position the caller checked), with something pending: raise it
    here (``mode`` RAISE) or only say so (DECIDE: 3.12-3.13.14's JUMP, which raises at
    the jump's target). Returns True if it decided to deliver (DECIDE)."""
    me = _get_ident()
    item = pending.get(me)
    if item is None or engine.shielded(me):
        return False
    code, off = frame.f_code, frame.f_lasti
    if _at_with_exit(code, off) or _in_enter_gap(code, off) or (
        not vetted and _uncovered_no_raise(code, off)
    ):
        stats["wait_unsafe"] += 1
        return False
    if _gc_thread == me:
        stats["wait_gc"] += 1
        return False
    handling = sys.exc_info()[1]
    if isinstance(handling, _DeadlineInterrupt):
        stats["wait_in_flight"] += 1
        return False  # on its way out already; if swallowed, the watchdog sends it again
    exc, scope = item
    where = stack_protected(frame, engine.frame_of(scope) if scope is not None else None)
    if where is not None:
        stats["wait_protected"] += 1
        if me not in _deferred:
            _deferred[me] = (time.monotonic(), where)
            if scope is not None:
                engine.on_defer(scope, where)
        return False
    if mode == DECIDE:
        return True
    got = pending.pop(me, None)
    if got is not item:  # changed meanwhile: put it back, the next boundary decides
        if got is not None:
            pending.setdefault(me, got)
        return False
    disarm(me)
    since = _deferred.pop(me, None)
    engine.on_deliver(scope, time.monotonic() - since[0] if since else 0.0,
                      since[1] if since else None)
    stats["hook_raises"] += 1
    if _TRACE_HOOK:
        # 3.11's trampoline turns the thread's tracing off when a trace function raises:
        # a tracer of the thread's own is put back by the scope's exit (take_back).
        own = sys.gettrace()
        if own is not None and own is not _tracer:
            _restore[me] = own
    raise engine.instance(me, exc, scope)


# -- The hook ----------------------------------------------------------------------------------

_setup_lock = threading.Lock()
_ready: Optional[bool] = None  # None: not tried yet


def _setup() -> bool:
    global _ready
    with _setup_lock:
        if _ready is None:
            try:
                _load_opcodes()
                gc.callbacks.append(_gc_callback)
                _ready = _hook.setup()
            except Exception:  # noqa: BLE001 - no hook: the pre-checked fallback
                _ready = False
    return bool(_ready)


def arm(ident: int, tstate: int) -> bool:
    """Watchdog (or a canceller), GIL held: make thread ``ident`` (its PyThreadState at
    ``tstate``, 3.11) run :func:`decide` at its next line boundary. False if no hook can
    be armed for it (the caller falls back to :func:`precheck`)."""
    engine.before_arm()
    if _setup() and _hook.arm(ident, tstate):
        stats["arms"] += 1
        return True
    return False


def nudge(ident: int, tstate: int) -> bool:
    """Backstop, still pending: arm again (a tracer replaced) and cover a loop without
    line boundaries (3.11: opcode events for the innermost frame)."""
    return _setup() and _hook.nudge(ident, tstate)


def disarm(ident: int) -> None:
    """The thread itself: its delivery was made or taken back; the hook goes off for it
    (3.12+: the events, once no thread has anything pending)."""
    if _ready:
        _hook.disarm(ident)


def take_back(ident: int) -> Optional[tuple[type[BaseException], Any]]:
    """The thread itself (a scope's exit, a shield, a checkpoint): what was pending for it,
    no longer pending; the hook goes off for it, and a tracer of its own that a delivery
    turned off (3.11) is back."""
    got = pending.pop(ident, None)
    _deferred.pop(ident, None)
    if got is not None:
        disarm(ident)
    own = _restore.pop(ident, None)
    if own is not None and sys.gettrace() is None:
        sys.settrace(own)
    return got


def _look_begin() -> bool:
    """Before a look at another thread's frames (``sys._current_frames()``, ``f_back``):
    the collector off; returns whether it was on, for :func:`_look_end`.

    Such a look makes frame objects for frames that thread is running, and CPython reads
    and writes the frame right after allocating its object. The allocation may start a
    collection, whose finalizers may let the GIL go; the thread may then leave that very
    frame, and the new object points at freed memory (the native core's watchdog crashed
    so: csrc/tc_internal.h, frames_look_begin). With the collector off the making of each
    frame object is atomic. Between two steps of the walk the GIL may still go, which is
    safe: a frame object held here takes its frame's data when the thread leaves it.
    Rejected: ``gc.freeze()`` or a lock -- neither stops a collection that an allocation
    starts. The collector's state is put back, so one the program switched off stays
    off."""
    was = gc.isenabled()
    gc.disable()
    return was


def _look_end(was: bool) -> None:
    if was:
        gc.enable()


def precheck(ident: int, scope: Any) -> bool:
    """Without a hook: may an asynchronous exception be sent to thread ``ident`` now, judged
    by its stack seen from here? (Less than the hook's check: from 3.13 the exception
    surfaces at the next breaker check, not where the thread is seen now.)"""
    _load_opcodes() if not _op else None
    gc_was = _look_begin()
    try:
        frame = sys._current_frames().get(ident)
        return frame is not None and stack_protected(frame, engine.frame_of(scope)) is None
    finally:
        _look_end(gc_was)


class _Trace311:
    """3.11: the thread's own tracer, installed for it by the watchdog."""

    OFF_TRACE, OFF_TRACEOBJ = 72, 88  # PyThreadState (3.11's Include/cpython/pystate.h)

    def __init__(self) -> None:
        self.trampoline = 0
        self.settrace: Any = None
        self.armed: set[int] = set()

    def setup(self) -> bool:
        """Read CPython's trace trampoline from a probe set in this thread, checking the
        offsets against the probe object itself; False if they do not match."""
        get = ctypes.pythonapi.PyThreadState_Get
        get.restype = ctypes.c_void_p
        ts = get() or 0
        old = sys.gettrace()

        def probe(frame: Any, event: str, arg: Any) -> None:
            return None

        sys.settrace(probe)
        try:
            fn = ctypes.c_void_p.from_address(ts + self.OFF_TRACE).value or 0
            obj = ctypes.c_void_p.from_address(ts + self.OFF_TRACEOBJ).value
            ok = obj == id(probe) and fn != 0
        finally:
            sys.settrace(old)
        if not ok:
            return False
        self.trampoline = fn
        self.settrace = ctypes.PYFUNCTYPE(
            ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.py_object
        )(("_PyEval_SetTrace", ctypes.pythonapi))
        return True

    def _mode(self, ts: int) -> int:
        """0: no tracer; 1: a Python tracer (``sys.settrace``: CPython's trampoline, ours
        or the thread's own); 2: a C tracer (a coverage tool, the native core's)."""
        fn = ctypes.c_void_p.from_address(ts + self.OFF_TRACE).value
        return 0 if not fn else 1 if fn == self.trampoline else 2

    def arm(self, ident: int, ts: int) -> bool:
        gc_was = _look_begin()
        try:
            return self._arm(ident, ts)
        finally:
            _look_end(gc_was)

    def _arm(self, ident: int, ts: int) -> bool:
        frame = sys._current_frames().get(ident)
        mode = self._mode(ts) if ts else 2
        if frame is None or mode == 2:
            return False
        if mode == 0:
            if self.settrace(ts, self.trampoline, _tracer) != 0:
                return False
            self.armed.add(ident)
        # A tracer of the thread's own stays in place (sys.gettrace() still returns it):
        # only the frames on the stack get line events of ours, chained to theirs.
        f: Optional[types.FrameType] = frame
        while f is not None:
            t = f.f_trace
            if t is None:
                f.f_trace = _local
            elif t is not _local and not isinstance(t, _Chain):
                f.f_trace = _Chain(t)
            f = f.f_back
        return True

    def nudge(self, ident: int, ts: int) -> bool:
        gc_was = _look_begin()
        try:
            if not self._arm(ident, ts):
                return False
            frame = sys._current_frames().get(ident)
            if frame is not None and (
                frame.f_trace is _local or isinstance(frame.f_trace, _Chain)
            ):
                frame.f_trace_opcodes = True
            return True
        finally:
            _look_end(gc_was)

    def disarm(self, ident: int) -> None:
        if ident in self.armed:
            self.armed.discard(ident)
            if sys.gettrace() is _tracer:
                sys.settrace(None)


def _tracer(frame: types.FrameType, event: str, arg: Any) -> Any:
    """3.11, 'call' events: new frames trace lines while something is pending."""
    if _get_ident() not in pending:
        sys.settrace(None)
        return None
    return _local


def _local(frame: types.FrameType, event: str, arg: Any) -> Any:
    """3.11, a frame's line (and, from the backstop, opcode) events: decide there; with
    nothing pending any more, the frame is left alone again."""
    if _get_ident() in pending:
        _event(frame, event)
        return _local
    frame.f_trace_opcodes = False
    frame.f_trace = None
    return None


def _event(frame: types.FrameType, event: str) -> None:
    if event == "line":
        decide(frame, False, RAISE)
    elif event == "opcode" and _at_back_edge(frame.f_code, frame.f_lasti):
        decide(frame, True, RAISE)


class _Chain:
    """3.11: a frame's own local tracer (the thread's ``sys.settrace``), called first, then
    the decision; put back in place once nothing is pending."""

    __slots__ = ("orig",)

    def __init__(self, orig: Any) -> None:
        self.orig = orig

    def __call__(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        if event != "opcode":
            r = self.orig(frame, event, arg)
            if r is not None:
                self.orig = r
        if _get_ident() in pending:
            _event(frame, event)
            return self
        frame.f_trace_opcodes = False
        frame.f_trace = self.orig
        return self.orig


class _Monitoring:
    """3.12+: a sys.monitoring tool of its own, events on while anything is pending."""

    def __init__(self) -> None:
        self.tool = -1
        self.on = False
        self.lock = threading.Lock()  # events on/off; never held where an interrupt surfaces
        self.insn: dict[int, tuple[types.CodeType, int]] = {}  # 3.12, 3.13.0-3.13.14

    def setup(self) -> bool:
        mon = sys.monitoring  # type: ignore[attr-defined,unused-ignore]
        for tool in (3, 4, 5):
            if mon.get_tool(tool) is None:
                mon.use_tool_id(tool, "timeoutcore-fallback")
                self.tool = tool
                break
        else:
            return False
        ev = mon.events
        mon.register_callback(self.tool, ev.LINE, _on_line)
        mon.register_callback(self.tool, ev.JUMP, _on_jump)
        mon.register_callback(self.tool, ev.INSTRUCTION, _on_instruction)
        return True

    def _events(self, on: bool) -> None:
        mon = sys.monitoring  # type: ignore[attr-defined,unused-ignore]
        mon.set_events(self.tool, (mon.events.LINE | mon.events.JUMP) if on else 0)
        self.on = on

    def arm(self, ident: int, ts: int) -> bool:
        with self.lock:
            if not self.on:
                self._events(True)
        return True

    def nudge(self, ident: int, ts: int) -> bool:
        return self.arm(ident, ts)

    def disarm(self, ident: int) -> None:
        got = self.insn.pop(ident, None)
        if got is not None:
            self._insn(got[0], False)
        with self.lock:
            if self.on and not pending:
                self._events(False)

    def _insn(self, code: types.CodeType, on: bool) -> None:
        mon = sys.monitoring  # type: ignore[attr-defined,unused-ignore]
        if on or not any(c is code for c, _ in self.insn.values()):
            mon.set_local_events(self.tool, code, mon.events.INSTRUCTION if on else 0)


_JUMP_DEFER = (3, 12) <= sys.version_info < (3, 13, 15)


def _on_line(code: types.CodeType, line: int) -> Any:
    if _get_ident() in pending:
        decide(sys._getframe(1), False, RAISE)
    return None


def _on_jump(code: types.CodeType, src: int, dest: int) -> Any:
    if dest > src or _get_ident() not in pending:
        return None
    frame = sys._getframe(1)
    if dest != src and _uncovered_no_raise(code, dest):
        return None
    if _JUMP_DEFER:
        mon = _hook
        me = _get_ident()
        if isinstance(mon, _Monitoring) and me not in mon.insn and decide(frame, True, DECIDE):
            mon.insn[me] = (code, dest)
            mon._insn(code, True)
        return None
    decide(frame, True, RAISE)
    return None


def _on_instruction(code: types.CodeType, off: int) -> Any:
    """3.12, 3.13.0-3.13.14: the jump's target, where the interrupt decided at the jump is raised
    (attributed to that very instruction: the loop head, inside the loop's handlers)."""
    mon = _hook
    me = _get_ident()
    if not isinstance(mon, _Monitoring):
        return None
    got = mon.insn.get(me)
    if got is None or got[0] is not code:
        return None
    del mon.insn[me]
    mon._insn(code, False)
    if off == got[1] and me in pending:
        decide(sys._getframe(1), True, RAISE)
    return None


_hook: Any = _Trace311() if sys.version_info < (3, 12) else _Monitoring()


def after_fork() -> None:
    """In a fork's child (one thread): nothing is pending, no lock of ours is held."""
    global _setup_lock
    pending.clear()
    _deferred.clear()
    _restore.clear()
    _setup_lock = threading.Lock()
    if isinstance(_hook, _Monitoring):
        _hook.lock = threading.Lock()
        _hook.insn.clear()
        if _hook.on:
            _hook._events(False)
    else:
        _hook.armed.clear()
