/*
 * tc_compat.h -- every CPython-version switch of the core, in one place.
 *
 * The rest of the core calls the helpers below and never tests
 * PY_VERSION_HEX itself.  Each switch cites the CPython change it follows.
 * Supported: CPython 3.11 to 3.14 (3.15 by design, untested), and the
 * free-threaded 3.14t (TC_FREE_THREADED below; the core lock, tc_lock.h).
 *
 * Private CPython fields read here, and by whom:
 *   - PyThreadState.curexc_type (3.11) / .current_exception (3.12) and
 *     PyThreadState.exc_info->exc_value chain: only the accelerator
 *     direct_delivery (3.11, 3.12), with the GIL, to see whether an
 *     interrupt is being raised or handled in the paused thread it judges
 *     (tc_raising, tc_handling; the core asks only its own thread, through
 *     public calls: tc_deliver.c, interrupt_in_flight_here).
 *   - PyThreadState.async_exc: whether an asynchronous exception sent to a
 *     thread is still waiting, before it is taken back (tc_deliver_steps.c:
 *     deliver_cancel; with the GIL; free-threaded only in the thread's own
 *     state): taking back one that is not there leaves the eval breaker
 *     tripped on 3.11 and 3.12.
 *   - PyThreadState.c_tracefunc / c_traceobj (3.11): the delivery hook, with
 *     the GIL, to chain to and restore the thread's own tracer.
 *   - accelerator frame_address (3.11, 3.12, 3.14, 3.14t): PyThreadState.
 *     cframe->current_frame (3.11, 3.12) / .current_frame (3.14), and
 *     PyFrameObject's f_frame: the scope, at entry, in its own thread, and
 *     the delivery's stack walk (with the GIL), to know the with
 *     statement's frame without making a frame object (an address
 *     compared, never dereferenced); that frame's code (3.11: f_code;
 *     3.14t: f_executable, through CPython's inline; tc_gil.c:
 *     tc_iframe_code), read by the scope at entry, in its own thread.
 *   - the GIL state's switch interval, mutex and condition variable (via
 *     tc_gil.c): the watchdog, without the GIL (see "the fast window" below);
 *     its `locked` and `last_holder` (3.12+), which the watchdog reads
 *     without the GIL to see whether a guarded thread holds it (tc_gil.c).
 *   - 3.14t: PyThreadState.eval_breaker, and its asynchronous-exception
 *     bit (tc_gil.c: tc_async_exc_bit; confirmed at import), read, set and
 *     cleared by a thread in its own state only (the self-fire's trigger,
 *     "The self-fire's trigger" below).
 * Private functions: _PyEval_SetTrace (3.11 only),
 * _PyEval_RequestCodeExtraIndex / _PyCode_Get/SetExtra (3.11; PyUnstable_
 * from 3.12), see below; _PyEval_AddPendingCall (3.12+, via tc_gil.c: the
 * function behind Py_AddPendingCall, for a call any thread may run).
 */
#ifndef TC_COMPAT_H
#define TC_COMPAT_H

#if PY_VERSION_HEX < 0x030B0000
#error "timeoutcore supports CPython 3.11 and later"
#endif

/* -- Free-threaded builds (PEP 703) -----------------------------------------
 * 3.14t is supported (PEP 779 made it official there; 3.13t was
 * experimental and lacks the public critical-section-on-a-mutex API the core
 * lock uses, gh-123119).  On it: the core lock (tc_lock.h) replaces the GIL,
 * the watchdog raises at the deadline without anticipation or switch
 * interval, and no other thread's thread state is read. */
#ifdef Py_GIL_DISABLED
#if PY_VERSION_HEX < 0x030E0000
#error "timeoutcore supports free-threaded CPython from 3.14 on (3.13t is not supported)"
#endif
#define TC_FREE_THREADED 1
#else
#define TC_FREE_THREADED 0
#endif

/* -- Stale scopes (3.13 only) ------------------------------------------------
 * CPython 3.13 can leave a frame without running its with-exits when an
 * exception is raised at the back-edge of a `while <cond>:` loop
 * (cpython#130279; 3.11, 3.12 and 3.14 are not affected).  There each scope
 * remembers the frame of its with statement, so a scope whose frame no
 * longer runs can be found and dropped instead of firing into unrelated
 * code (tc_slot.c: slot_prune_stale). */
#if PY_VERSION_HEX >= 0x030D0000 && PY_VERSION_HEX < 0x030E0000
#define TC_TRACK_FRAMES 1
#else
#define TC_TRACK_FRAMES 0
#endif

/* -- Lowering the switch interval: the fast window --------------------------
 * The watchdog lowers the GIL switch interval to TC_FAST_SWITCH_US while a
 * deadline is due or a fired interrupt is on its way (tc_watchdog.c), and
 * puts the user's value back after.  The value lives in the GIL state:
 * runtime-global on 3.11 (_PyRuntime.ceval.gil), per interpreter from 3.12
 * (interp->ceval.gil, PEP 684), where _PyEval_Get/SetSwitchInterval need a
 * current thread state (a first try without one crashed).  So on every
 * version the GIL state's address is taken once at import, with the GIL, by
 * tc_gil.c -- the one unit built with CPython's internal headers -- and the
 * interval is read and written here with relaxed atomics (CPython itself
 * reads it without a lock).  tc_gil.c also wakes the threads that wait for
 * the GIL, so that they wait the lowered interval at once (its header says
 * why).  No GIL state, or its address failed the import check: no window. */
int tc_gil_setup(char *why, size_t n);     /* tc_gil.c: checked at import */
unsigned long *tc_gil_interval_addr(void); /* tc_gil.c */
int tc_gil_rewait(void);                   /* tc_gil.c */
int tc_gil_drop_requested(void);           /* tc_gil.c */
int tc_gc_collecting(void);                /* tc_gil.c */
unsigned long tc_main_thread(void);        /* tc_gil.c */
int tc_gil_holder(const void **holder);    /* tc_gil.c */
int tc_add_pending(int (*func)(void *), void *arg); /* tc_gil.c */
PyCodeObject *tc_iframe_code(void *iframe);          /* tc_gil.c */
uintptr_t tc_async_exc_bit(void);                    /* tc_gil.c */
static unsigned long *g_interval_addr;     /* set by tc_switch_setup        */

/* At import, with the GIL, after tc_gil_setup (tc_accel.c: accel_setup). */
static inline void tc_switch_setup(int on)
{
    g_interval_addr = on ? tc_gil_interval_addr() : NULL;
}

static inline int tc_lower_switch_supported(void)
{
    return g_interval_addr != NULL;
}

static inline unsigned long tc_switch_interval_us(void)
{
    return g_interval_addr != NULL ? __atomic_load_n(g_interval_addr, __ATOMIC_RELAXED) : 0;
}

/* Store the interval; with `rewait`, also wake the GIL's waiters so that
 * they wait the new one at once (without: each finishes its current wait
 * first).  Returns 0 or the errno of a failed wake-up (the interval is
 * stored all the same). */
static inline int tc_set_switch_interval_us(unsigned long us, int rewait)
{
    if (g_interval_addr == NULL)
        return 0;
    __atomic_store_n(g_interval_addr, us, __ATOMIC_RELAXED);
    return rewait ? tc_gil_rewait() : 0;
}

/* -- The exception a thread is raising right now ------------------------------
 * 3.12 keeps the raised exception as one object, tstate->current_exception
 * (gh-101578); 3.11 still has the (curexc_type, value, traceback) triple.
 * Returns 1 if it is an instance (3.12+) or subclass (3.11) of `cls`.  Read
 * with the GIL held: the target thread cannot run meanwhile. */
static inline int tc_raising(PyThreadState *t, PyObject *cls)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *v = t->current_exception;
    return v != NULL && PyObject_TypeCheck(v, (PyTypeObject *)cls);
#else
    PyObject *tp = t->curexc_type;
    return tp != NULL && PyType_Check(tp) &&
           PyType_IsSubtype((PyTypeObject *)tp, (PyTypeObject *)cls);
#endif
}

/* The exception being handled (except/finally/__exit__) at each level of
 * the thread's exc_info chain; 3.11 stores only the value there
 * (bpo-45711).  Returns 1 if any is an instance of `cls`.  GIL held. */
static inline int tc_handling(PyThreadState *t, PyObject *cls)
{
    for (_PyErr_StackItem *it = t->exc_info; it != NULL; it = it->previous_item) {
        PyObject *v = it->exc_value;
        if (v != NULL && v != Py_None && PyObject_TypeCheck(v, (PyTypeObject *)cls))
            return 1;
    }
    return 0;
}

/* The thread state at address `known` whose PyThreadState_GetID is `uid`
 * (the one a slot's owner last noted: tc_internal.h, slot_note_tstate) if
 * it is still linked in the current thread's interpreter, else NULL.  GIL
 * held (thread states are unlinked only by threads that hold it).  Public
 * API only: the address is only ever compared, and the id tells a state
 * from a newer one made at the same address.
 * Rejected: looking up by the thread's ident (PyThreadState.thread_id, a
 * private field) -- on 3.11 a failed thread start leaves its preallocated
 * state linked at the head of the list with the ident of the thread that
 * tried, and the hook went to that dead state (the thread's deadlines came
 * only at its block's exit); and the address alone, without the id -- a
 * thread without a Python thread of its own gets a new state for each call,
 * often at the address its last one had. */
static inline PyThreadState *tc_find_tstate(const void *known, uint64_t uid)
{
    PyInterpreterState *interp = PyThreadState_GetInterpreter(PyThreadState_Get());
    for (PyThreadState *t = PyInterpreterState_ThreadHead(interp); t != NULL;
         t = PyThreadState_Next(t))
        if ((const void *)t == known)
            return PyThreadState_GetID(t) == uid ? t : NULL;
    return NULL;
}

/* Is an asynchronous exception (PyThreadState_SetAsyncExc) still waiting
 * in thread state `t`?  GIL held (free-threaded: `t` is the caller's own;
 * other threads set it with an atomic exchange).  Private field
 * PyThreadState.async_exc; checked at import (tc_gil_check.c). */
static inline int tc_async_exc_waiting(PyThreadState *t)
{
    return __atomic_load_n(&t->async_exc, __ATOMIC_RELAXED) != NULL;
}

/* Attribute `name` of `o`, or NULL without an error if it has none: 1, 0,
 * or -1 with the error set (PyObject_GetOptionalAttr is 3.13+; before, the
 * same function was _PyObject_LookupAttr). */
static inline int tc_optional_attr(PyObject *o, PyObject *name, PyObject **result)
{
#if PY_VERSION_HEX >= 0x030D0000
    return PyObject_GetOptionalAttr(o, name, result);
#else
    return _PyObject_LookupAttr(o, name, result);
#endif
}

/* Is the object behind the weak reference `ref` still alive?  GIL held
 * (free-threaded: in the object's own thread, in a region where a
 * finalizer may run: the reference taken here may turn out the last).
 * PyWeakref_GetObject, deprecated in 3.13, is the same test before. */
static inline int tc_weakref_alive(PyObject *ref)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *o = NULL;
    int r = PyWeakref_GetRef(ref, &o);
    Py_XDECREF(o);
    return r > 0;
#else
    return PyWeakref_GetObject(ref) != Py_None;
#endif
}

/* -- The delivery hook: how a fired interrupt reaches a line boundary -------
 * The interrupt is raised by a hook that runs in the guarded thread at its
 * next line boundary (tc_deliver.c), armed only while a delivery is pending.
 *   3.11: a C trace function set on that one thread state with
 *     _PyEval_SetTrace (exported there), chained to the thread's own tracer.
 *     Tracing is per thread in 3.11: other threads pay nothing.
 *   3.12+: legacy tracing became a layer over sys.monitoring (PEP 669) and
 *     _PyEval_SetTrace is no longer exported from 3.13, so the hook is a
 *     sys.monitoring tool of its own (LINE and backward JUMP events; PY_START
 *     from 3.13, below).  Events are interpreter-wide: while any delivery is
 *     pending every thread runs instrumented code and calls the callback,
 *     which returns at once when its own thread has nothing pending.
 * Private fields read: PyThreadState.c_tracefunc / c_traceobj (3.11). */
#if PY_VERSION_HEX < 0x030C0000
#define TC_HOOK_TRACE 1
#else
#define TC_HOOK_TRACE 0
#endif

/* -- A function's start is a line boundary too (3.13+) ------------------------
 * From 3.13 a function emits no LINE event for a line it starts on: a body
 * on the `def` line (`def step(x): return x`, a lambda) runs no LINE event
 * at all, and called over and over from a loop written in C (`sum(map(step,
 * itertools.count()))`) has no backward jump either -- the hook was never
 * called and the block ran on past its deadline, for ever.  3.12 emits the
 * LINE event there.  So from 3.13 the hook also takes PY_START, with the
 * LINE callback: the same point 3.12's first LINE event is, and the same
 * checks (the callee's frame is on the stack it walks: an __exit__, a
 * finalizer or protected code started there defers).  Not PY_RESUME:
 * CPython itself checks no eval breaker where a generator resumes after
 * `yield from` or `await` (inside the delegation's own handler), so a
 * generator that only delegates to a C iterator, drained by a loop in C,
 * stays beyond the hook as it is beyond Ctrl-C (docs: what stops); a
 * generator that yields itself has a loop (a JUMP) or soon returns. */
#if PY_VERSION_HEX >= 0x030D0000
#define TC_HOOK_PY_START 1
#else
#define TC_HOOK_PY_START 0
#endif

/* -- Raising from a sys.monitoring JUMP callback ------------------------------
 * 3.12's instrumented jumps handle an error from the JUMP callback at a wrong
 * instruction offset (the destination is recomputed after next_instr was
 * cleared), so the exception leaves the frame past its handlers: on 3.12.1,
 * `with lock: with thread_deadline(...): while True: pass` let the raw
 * interrupt escape the scope's __exit__ every time.  3.13 has the same bug
 * until 3.13.15 (gh-152375).  So there the JUMP callback does not raise:
 * having decided, it switches on INSTRUCTION events for the frame's code
 * object (our tool's local events, nobody else's) and returns; the
 * INSTRUCTION callback at the jump's target switches them off and raises,
 * which INSTRUMENTED_INSTRUCTION's error path attributes to that very
 * instruction -- the loop head, inside the loop's handlers
 * (tc_hook_monitoring.c: mon_insn).  On 3.13 nothing runs between the two
 * (its breaker check comes before the callback); on 3.12 the jump's breaker
 * check does, and the INSTRUCTION callback decides again.
 * Rejected for 3.12: making the interrupt an asynchronous exception of the
 * thread, for INSTRUMENTED_JUMP_BACKWARD's breaker check right after the
 * callback to raise.  That check runs after the jump is taken, and CPython
 * attributes its exception to the unit before the target (tc_back_edge_in_loop
 * below): for a loop that is the first statement of a `try:` block, the
 * try's NOP, outside every handler -- `with lock: with thread_deadline(...):
 * try: while True: pass` let the raw interrupt escape the scope and leave the
 * lock held every time, and a soft exception skipped the `except` around its
 * loop (tests/test_integrity.py).  And that check runs a garbage collection
 * the interpreter has scheduled before it looks at the asynchronous
 * exception, so the exception could surface in a finalizer, where it is
 * dropped.  Before it, on 3.13.0, `with thread_deadline(0.005): while True:
 * pass` on one line let the raw interrupt escape every time
 * (tests/test_integrity.py).  Decided by the running interpreter
 * (Py_Version): a wheel built against 3.13.15 may run on 3.13.0. */
#if PY_VERSION_HEX >= 0x030C0000 && PY_VERSION_HEX < 0x030E0000
#define TC_JUMP_DEFER_BUILD 1
static inline int tc_jump_raise_deferred(void)
{
    return PY_VERSION_HEX < 0x030D0000 || Py_Version < 0x030D0FF0;
}
/* (Until that, 3.13 before 3.13.15 was not pre-armed: a thread firing its
 * own deadline does so at its first event past it, in a loop at a
 * back-edge's JUMP callback.) */
#else
#define TC_JUMP_DEFER_BUILD 0
#endif

/* -- Instructions where raising would skip a with-exit ----------------------
 * A line boundary is a safe place to raise, except two kinds of line starts
 * that belong to a with statement's exit: the normal exit's call of
 * __exit__(None, None, None) (LOAD_CONST None x3, then PRECALL (3.11) or
 * CALL), which lies outside the with's exception-table range, and the first
 * instruction of an exception handler (PUSH_EXC_INFO), where raising skips
 * the handler -- a with's __exit__, a finally body (3.11-3.14 alike;
 * tests/test_integrity.py).  Read from the deoptimised bytecode
 * (PyCode_GetCode) at the frame's current offset (PyFrame_GetLasti). */
#include "opcode.h"

/* The questions below read `f`'s deoptimised bytecode at a byte offset: each
 * is a test(code, bytes, their length, offset), asked by tc_ask_code, which
 * returns `none` where the bytecode cannot be had or `off` lies outside it. */
typedef int (*tc_code_test)(PyCodeObject *code, const unsigned char *b, Py_ssize_t n, int off);

static inline int tc_ask_code(PyFrameObject *f, int off, tc_code_test test, int none)
{
    PyCodeObject *code = PyFrame_GetCode(f);
    PyObject *bytes = PyCode_GetCode(code);
    int r = none;
    if (bytes != NULL && off >= 0 && off < PyBytes_GET_SIZE(bytes))
        r = test(code, (const unsigned char *)PyBytes_AS_STRING(bytes), PyBytes_GET_SIZE(bytes), off);
    if (bytes == NULL)
        PyErr_Clear();
    Py_XDECREF(bytes);
    Py_DECREF(code);
    return r;
}

static inline int tc_with_exit_test(PyCodeObject *code, const unsigned char *b, Py_ssize_t n, int off)
{
    if (off + 7 >= n)
        return 0;
    b += off;
    return b[0] == PUSH_EXC_INFO ||
           (b[0] == LOAD_CONST && b[2] == LOAD_CONST && b[4] == LOAD_CONST &&
#ifdef PRECALL
            (b[6] == PRECALL || b[6] == CALL) &&
#else
            b[6] == CALL &&
#endif
            b[1] < PyTuple_GET_SIZE(code->co_consts) &&
            PyTuple_GET_ITEM(code->co_consts, b[1]) == Py_None);
}

static inline int tc_at_with_exit(PyFrameObject *f)
{
    return tc_ask_code(f, PyFrame_GetLasti(f), tc_with_exit_test, 0);
}

/* Instructions that cannot raise need no exception-table entry, and the
 * compiler does not always give them the enclosing handler: the NOP of a
 * `pass` that is a with's whole body lies outside the with's range on
 * 3.11-3.14 (`with sem: pass`: raising at its line event skipped
 * Semaphore.__exit__; tests/test_integrity.py), and so does the SWAP that
 * starts the exit of a with whose block ends in `return <value>` (its line
 * is the with's own: raising there skipped the scope's __exit__ and the
 * internal interrupt escaped the block -- `with thread_deadline(s): return
 * fn()` with fn outlasting s).  So an exception may be
 * raised "at" an instruction that cannot raise only if the exception table
 * gives it the handler of the instruction before it (the code it continues);
 * else the next line boundary is the place.  Opcodes are deoptimised. */
static inline int tc_op_cannot_raise(int op)
{
    switch (op) {
    case NOP:
    case POP_TOP:
    case SWAP: /* `return f()` in a with: SWAP starts its exit, uncovered */
    case COPY:
    case PUSH_NULL:
    case LOAD_CONST:
#ifdef LOAD_SMALL_INT
    case LOAD_SMALL_INT: /* 3.14 */
#endif
    case RESUME:
    case JUMP_FORWARD:
    case JUMP_BACKWARD:
    case JUMP_BACKWARD_NO_INTERRUPT:
    case RETURN_VALUE:
#ifdef RETURN_CONST
    case RETURN_CONST: /* 3.12, 3.13 */
#endif
#ifdef NOT_TAKEN
    case NOT_TAKEN: /* 3.14 */
#endif
        return 1;
    default:
        return 0;
    }
}

/* One varint of the exception table (Objects/exception_handling_notes.txt:
 * 6-bit groups, bit 6 = more follows, bit 7 = start of an entry). */
static inline int tc_exc_varint(const unsigned char **p, const unsigned char *end)
{
    int b, v;
    if (*p >= end)
        return -1;
    b = *(*p)++;
    v = b & 63;
    while (b & 64) {
        if (*p >= end)
            return -1;
        b = *(*p)++;
        v = (v << 6) | (b & 63);
    }
    return v;
}

/* Handler target (code units) covering code unit `unit` of `code`, or -1. */
static inline int tc_exc_handler(PyCodeObject *code, int unit)
{
    PyObject *tab = code->co_exceptiontable;
    const unsigned char *p, *end;
    if (tab == NULL || !PyBytes_Check(tab))
        return -1;
    p = (const unsigned char *)PyBytes_AS_STRING(tab);
    end = p + PyBytes_GET_SIZE(tab);
    while (p < end) {
        int start = tc_exc_varint(&p, end), len = tc_exc_varint(&p, end);
        int target = tc_exc_varint(&p, end), dl = tc_exc_varint(&p, end);
        if (start < 0 || len < 0 || target < 0 || dl < 0)
            return -1;
        if (unit >= start && unit < start + len)
            return target;
    }
    return -1;
}

/* The deoptimised opcode at byte offset `off` of `f`'s code, or -1. */
static inline int tc_opcode_test(PyCodeObject *code, const unsigned char *b, Py_ssize_t n, int off)
{
    (void)code;
    (void)n;
    return b[off];
}

static inline int tc_opcode_at(PyFrameObject *f, int off)
{
    return tc_ask_code(f, off, tc_opcode_test, -1);
}

/* 1 if raising at byte offset `off` of `f`'s code could pick the wrong
 * handler: the instruction cannot raise and its handler differs from the
 * one of the instruction before it (cache entries, opcode CACHE = 0 in the
 * deoptimised code, are skipped). */
static inline int tc_uncovered_test(PyCodeObject *code, const unsigned char *b, Py_ssize_t n, int off)
{
    int prev = off - 2;
    if (off + 1 >= n || !tc_op_cannot_raise(b[off]))
        return 0;
    while (prev >= 0 && b[prev] == CACHE)
        prev -= 2;
    return prev >= 0 && tc_exc_handler(code, off / 2) != tc_exc_handler(code, prev / 2);
}

static inline int tc_uncovered_no_raise(PyFrameObject *f, int off)
{
    return tc_ask_code(f, off, tc_uncovered_test, 0);
}

/* -- A thread paused at a loop's back-edge (3.11, 3.12) ------------------------
 * A CPU loop asked to let the GIL go does so at JUMP_BACKWARD's eval-breaker
 * check, in _Py_HandlePending's drop-request branch; when it has the GIL
 * back, the very next step there is the check for an asynchronous exception,
 * which reads tstate->async_exc afresh (3.11, 3.12).  From 3.13 the check
 * tests a copy of the breaker bits taken before the GIL was let go, so an
 * exception sent meanwhile waits for the next check, wherever that is: not
 * used there (TC_DIRECT_BACK_EDGE; tried on 3.14.7: a loop that ended first
 * met it at the entry of its with's __exit__, which then never ran -- the
 * hammer's one-line loops leaked their semaphore).  CPython attributes that exception to
 * the unit before the jump's target (the jump is taken before the check:
 * exception_unwind looks up INSTR_OFFSET()-1 with next_instr at the target);
 * 1 if frame `f` is at a JUMP_BACKWARD whose target and the unit before the
 * target have the same handler: the loop's.  The jump's own unit is not
 * consulted -- the raise is never attributed to it -- and must not be: the
 * compiler leaves the closing jump of a loop written inline in a `with` or
 * `try` block (`while <cond>:`, or a `for` whose body ends in an `if ...:
 * break`) outside every handler range (3.12.1: `with cm: while t() < x:
 * pass` has the table's ranges end before and resume after the jump), and
 * requiring its handler to match refused every such loop -- left to the
 * hook, a line boundary later.  (3.11's POP_JUMP_BACKWARD_IF_* check the breaker
 * too; they are left to the hook.) */
/* The unit a JUMP_BACKWARD at byte `off` jumps to, or -1 if there is none
 * there.  Its oparg counts back from the unit after it and its cache: none on
 * 3.11 and 3.12, one unit from 3.13. */
#define TC_JUMP_BACKWARD_CACHE (PY_VERSION_HEX >= 0x030D0000 ? 1 : 0)
static inline int tc_jump_back_target(const unsigned char *b, Py_ssize_t n, int off)
{
    int oparg, shift = 8, target;
    if (off + 1 >= n || b[off] != JUMP_BACKWARD)
        return -1;
    oparg = b[off + 1];
    for (int p = off - 2; p >= 0 && b[p] == EXTENDED_ARG && shift < 32; p -= 2, shift += 8)
        oparg |= b[p + 1] << shift;
    target = off / 2 + 1 + TC_JUMP_BACKWARD_CACHE - oparg;
    return target >= 0 && target <= off / 2 ? target : -1;
}

#if PY_VERSION_HEX < 0x030D0000 && !TC_FREE_THREADED
#define TC_DIRECT_BACK_EDGE 1
static inline int tc_back_edge_test(PyCodeObject *code, const unsigned char *b, Py_ssize_t n, int off)
{
    int target = tc_jump_back_target(b, n, off);
    if (target < 0)
        return 0;
    return target >= 1 && tc_exc_handler(code, target) == tc_exc_handler(code, target - 1) ? 1 : -1;
}

/* 1 at a usable back-edge; 0 elsewhere (and at a refused one). */
static inline int tc_back_edge_in_loop(PyFrameObject *f)
{
    return tc_ask_code(f, PyFrame_GetLasti(f), tc_back_edge_test, 0) == 1;
}
#else
#define TC_DIRECT_BACK_EDGE 0
#endif

/* -- Raising at the thread's own breaker check, at a back-edge (3.12+) -------
 * A thread that holds the GIL at its deadline fires it itself, from a
 * pending call (tc_gil.c) that its eval loop runs at its next breaker check
 * (accel_self_fire.c: pc_fire).  An error returned from there surfaces at that
 * very instruction, as an asynchronous exception would -- no snapshot is
 * involved, the call runs inside the check.  Free-threaded, the same
 * decision runs at the same check from a trigger object's deallocation
 * (TC_SELF_FIRE_TRIGGER below; accel_self_fire_trigger.c).  It raises only at a loop's
 * back-edge (anywhere else -- a call that just returned, a function's
 * RESUME -- it asks to be run again at the next check): 1 if frame `f` is at
 * a JUMP_BACKWARD whose raise lands in the loop's own handler.  3.12 takes
 * the jump before the check (the exception belongs to the unit before the
 * target: tc_back_edge_in_loop); 3.13 and 3.14 check first, so it belongs
 * to the jump itself, which must share the handler of the jump's target.  3.13 leaves the closing
 * jump of a `while <cond>:` loop outside the handler ranges (cpython#130279;
 * 3.13.0: `with lock: while cond(): ...`, the jump one past the range's
 * end): refused, so such a loop is left to the hook.  -1 at such a refused
 * back-edge (a JUMP_BACKWARD that is this loop's breaker check and never
 * usable: the caller hands the loop to the hook at once), 0 at any other
 * instruction. */
#if PY_VERSION_HEX >= 0x030C0000
#define TC_SELF_FIRE 1
#if PY_VERSION_HEX >= 0x030D0000
static inline int tc_breaker_back_edge_test(PyCodeObject *code, const unsigned char *b, Py_ssize_t n,
                                            int off)
{
    int target = tc_jump_back_target(b, n, off);
    if (target < 0)
        return 0;
    return tc_exc_handler(code, off / 2) == tc_exc_handler(code, target) ? 1 : -1;
}
#else
#define tc_breaker_back_edge_test tc_back_edge_test /* 3.12: the jump comes first */
#endif

static inline int tc_breaker_back_edge(PyFrameObject *f)
{
    return tc_ask_code(f, PyFrame_GetLasti(f), tc_breaker_back_edge_test, 0);
}
#else
#define TC_SELF_FIRE 0
#endif

/* -- The self-fire's trigger (free-threaded) -------------------------------
 * Free-threaded, a pending call may run in any thread (CPython sets its bit
 * in every thread's breaker), so the self-fire reaches its thread through
 * an object that thread owns (accel_self_fire_trigger.c), and raises through
 * the thread's own asynchronous-exception bit: PyThreadState.eval_breaker
 * (declared in the cpython/ headers since 3.13, one word per thread) and the
 * bit PyThreadState_SetAsyncExc sets there, which the import check learns
 * from that call's effect and compares with the internal headers'
 * (tc_async_exc_bit).  Read and cleared by the thread itself only. */
#if TC_FREE_THREADED
#define TC_SELF_FIRE_TRIGGER 1
static inline uintptr_t tc_own_breaker(PyThreadState *t)
{
    return __atomic_load_n(&t->eval_breaker, __ATOMIC_SEQ_CST);
}

static inline void tc_own_breaker_clear(PyThreadState *t, uintptr_t bit)
{
    (void)__atomic_fetch_and(&t->eval_breaker, ~bit, __ATOMIC_SEQ_CST);
}

static inline void tc_own_breaker_set(PyThreadState *t, uintptr_t bit)
{
    (void)__atomic_fetch_or(&t->eval_breaker, bit, __ATOMIC_SEQ_CST);
}
#else
#define TC_SELF_FIRE_TRIGGER 0
#endif

/* 3.14 compiles `with cm:` as LOAD_SPECIAL __enter__; CALL 0, and checks the
 * eval breaker in that CALL, before the block's handler exists: an
 * asynchronous exception raised there leaves __enter__'s work (a taken lock)
 * without its __exit__ (gh-148874, fixed in 3.15).  1 if frame `f` is at
 * such a CALL (paused in __enter__, or just back from it). */
#if PY_VERSION_HEX >= 0x030E0000 && PY_VERSION_HEX < 0x030F0000
static inline int tc_enter_gap_test(PyCodeObject *code, const unsigned char *b, Py_ssize_t n, int off)
{
    (void)code;
    if (off < 2 || off + 1 >= n)
        return 0;
    /* LOAD_SPECIAL oparg 0 is __enter__, 2 is __aenter__; it has no cache */
    return b[off] == CALL && b[off - 2] == LOAD_SPECIAL && (b[off - 1] == 0 || b[off - 1] == 2);
}
#endif

static inline int tc_in_with_enter_gap(PyFrameObject *f)
{
#if PY_VERSION_HEX >= 0x030E0000 && PY_VERSION_HEX < 0x030F0000
    return tc_ask_code(f, PyFrame_GetLasti(f), tc_enter_gap_test, 0);
#else
    (void)f;
    return 0;
#endif
}

/* -- A per-code-object slot (co_extra) for the protection verdict ----------
 * The API CPython gives tools to keep data on code objects: underscore names
 * on 3.11, PyUnstable_ from 3.12 (the old names stay as aliases). */
#if PY_VERSION_HEX >= 0x030C0000
#define tc_request_code_extra PyUnstable_Eval_RequestCodeExtraIndex
#define tc_code_get_extra PyUnstable_Code_GetExtra
#define tc_code_set_extra PyUnstable_Code_SetExtra
#else
#define tc_request_code_extra _PyEval_RequestCodeExtraIndex
#define tc_code_get_extra _PyCode_GetExtra
#define tc_code_set_extra _PyCode_SetExtra
#endif

/* -- The with statement's frame, without making a frame object -------------
 * For the accelerator frame_address (accel_frame_address.c says what it
 * does, and what the core does without it): the address of the thread's
 * current _PyInterpreterFrame, and a frame object's f_frame, to compare it
 * with.  Private fields read: PyThreadState.cframe->current_frame (3.11,
 * 3.12) / current_frame (3.13, 3.14), and f_frame, the third field of
 * struct _frame (internal/pycore_frame.h) on 3.11-3.14 alike, mirrored by
 * tc_frame_head; checked at import (tc_gil_check.c: frame_address_check).
 * Later versions are not mirrored: the core's frame object there. */
#if PY_VERSION_HEX < 0x030F0000
#define TC_IFRAME_ID 1
struct tc_frame_head {
    PyObject_HEAD
    PyFrameObject *f_back;
    void *f_frame;
};

static inline void *tc_current_iframe(PyThreadState *t)
{
#if PY_VERSION_HEX < 0x030D0000
    return t->cframe != NULL ? (void *)t->cframe->current_frame : NULL;
#else
    return (void *)t->current_frame;
#endif
}

static inline void *tc_frame_iframe(PyFrameObject *f)
{
    return ((struct tc_frame_head *)f)->f_frame;
}
#else
#define TC_IFRAME_ID 0
#endif

#endif /* TC_COMPAT_H */
