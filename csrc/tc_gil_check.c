/*
 * tc_gil_check.c -- the import check of the CPython internals the core and
 * its accelerators use.  Two parts, one per compiled unit: the GIL state's
 * (included by tc_gil.c, the unit built with Py_BUILD_CORE) and the thread
 * state's (included by tc_accel.c, in the unity build, so that it checks
 * the very helpers of tc_compat.h the core calls).  Never compiled alone.
 *
 * Why: the offsets of interp->ceval.gil, of the GIL state's fields, of
 * gc.collecting and of _PyRuntime.main_thread are baked in at build time,
 * and CPython may change those layouts in any release, patch releases
 * included (pyabi.h: the internal ABI "may change at any time").  A wheel
 * built against one 3.x.y runs on every 3.x.z, and a moved field would be a
 * write to a wrong address in every user's process.  So before anything
 * uses them, each is compared with what the interpreter says through its
 * public API; one mismatch and tc_gil_setup returns 0: every accelerator
 * that needs them is off (tc_accel.c) and the core works without them.
 *
 * The GIL state's checks, in this order (the write comes last, only after
 * every read agreed, so a wrong address is never written to):
 *   1. 3.13+ (_Py_DebugOffsets, which CPython keeps for debuggers at the
 *      start of _PyRuntime): the cookie, the version against the running
 *      interpreter's Py_Version, the build kind, and the offsets of the
 *      fields used (the interpreter's and the thread state's) against this
 *      build's offsetof.  (Where the debug-offsets struct itself changed
 *      between patch releases the fields read are others, and the check
 *      fails: off, never wrong.)
 *   2. With a GIL: the interval read through the address equals
 *      sys.getswitchinterval() (CPython keeps microseconds); the GIL is
 *      held (we hold it) and its last holder is our own thread state.
 *   3. _PyRuntime.main_thread equals threading.main_thread().ident.
 *   4. gc.collecting reads 0 now, and 1 inside a gc.callbacks callback
 *      during a gc.collect(0).
 *   5. With a GIL: a distinct interval written through the address is what
 *      sys.getswitchinterval() returns next; the original is put back.
 * Test hook: TIMEOUTCORE_TEST_CORRUPT_GIL_OFFSET=1 in the environment
 * makes the check look at a GIL state 64 bytes off the real one (still
 * inside the interpreter or runtime state that holds it; refused at the
 * first read, so never written): it must be refused.
 *
 * The thread state's checks (tstate_check; PyThreadState is declared in the
 * public cpython/ headers, whose layout CPython keeps within a feature
 * release, but its fields are undocumented, and a build of another kind --
 * a debug or a free-threaded one -- lays it out otherwise):
 *   1. tc_find_tstate finds our own thread state by its address and id
 *      (public API only: a check of the lookup, not of a layout);
 *   2. the fields of the code the thread runs (PyFrame_GetCode() of
 *      PyThreadState_GetFrame()) that the core reads (co_consts,
 *      co_exceptiontable, co_flags, co_name, co_qualname, co_filename) are
 *      what its attributes return;
 *   3. the exception being raised (curexc_type, 3.11; current_exception,
 *      3.12+) follows PyErr_SetString / PyErr_Clear, and the one being
 *      handled (exc_info) follows PyErr_SetHandledException, put back after;
 *   4. the asynchronous exception waiting (async_exc) follows
 *      PyThreadState_SetAsyncExc with a probe, and is empty again once a
 *      loop's back-edge has raised it;
 *   5. 3.11: the thread's tracer (c_tracefunc, c_traceobj) and the byte
 *      its tracing switches (cframe->use_tracing) follow PyEval_SetTrace --
 *      a probe tracer set and removed when the thread has none (sys.gettrace()
 *      and sys.getprofile() both None), else compared with sys.gettrace()
 *      and left alone;
 *   6. the current interpreter frame (cframe->current_frame, 3.11 and 3.12;
 *      current_frame, 3.14) is the one PyThreadState_GetFrame()'s frame
 *      object points at (f_frame, mirrored by tc_compat.h), and the code it
 *      runs (tc_iframe_code: _PyInterpreterFrame.f_code on 3.11) is
 *      PyFrame_GetCode()'s.
 * The core itself reads 2, 4 and, on 3.11, 5; a mismatch there keeps the
 * whole core from running (tc_accel.c: tc_accel_core_refused), and
 * timeoutcore._native refuses to load with the reason.  An accelerator
 * alone reads 3 (direct_delivery: tstate_exceptions_check) and 6
 * (frame_address: frame_address_check), each checked only where it is
 * asked for: a mismatch turns that accelerator off.
 * Test hooks, each reading a field 64 bytes past its place (an address only
 * compared, never followed), which must be refused:
 * TIMEOUTCORE_TEST_CORRUPT_TSTATE_OFFSET=1 for 4 (the core's), and
 * TIMEOUTCORE_TEST_CORRUPT_FRAME_OFFSET=1 for 6 (frame_address's).
 *
 * GIL held throughout; Python errors met on the way are cleared and count
 * as a failed check.
 */

#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

static int check_fail(char *why, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    (void)vsnprintf(why, n, fmt, ap);
    va_end(ap);
    if (PyErr_Occurred())
        PyErr_Clear();
    return 0;
}

#ifdef Py_BUILD_CORE /* -- the GIL state (tc_gil.c) ------------------------------ */

#ifndef Py_GIL_DISABLED
/* sys.getswitchinterval() in whole microseconds, or 0 (error cleared). */
static unsigned long sys_interval_us(void)
{
    PyObject *fn = PySys_GetObject("getswitchinterval"); /* borrowed */
    PyObject *r = fn != NULL ? PyObject_CallNoArgs(fn) : NULL;
    double v = r != NULL ? PyFloat_AsDouble(r) : -1.0;
    Py_XDECREF(r);
    if (PyErr_Occurred())
        PyErr_Clear();
    return v > 0.0 && v < 1e3 ? (unsigned long)(v * 1e6 + 0.5) : 0;
}
#endif

/* threading.main_thread().ident, or 0 (error cleared). */
static unsigned long public_main_thread(void)
{
    unsigned long ident = 0;
    PyObject *mod = PyImport_ImportModule("threading");
    PyObject *t = mod != NULL ? PyObject_CallMethod(mod, "main_thread", NULL) : NULL;
    PyObject *id = t != NULL ? PyObject_GetAttrString(t, "ident") : NULL;
    if (id != NULL && PyLong_Check(id))
        ident = PyLong_AsUnsignedLong(id);
    Py_XDECREF(id);
    Py_XDECREF(t);
    Py_XDECREF(mod);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        ident = 0;
    }
    return ident;
}

/* gc.collecting as seen from a gc.callbacks callback at "start". */
static PyInterpreterState *g_check_interp;
static int g_seen_collecting = -1;

static PyObject *gc_probe(PyObject *self, PyObject *args)
{
    const char *phase = NULL;
    PyObject *info;
    (void)self;
    if (!PyArg_ParseTuple(args, "sO", &phase, &info))
        return NULL;
    if (strcmp(phase, "start") == 0 && g_seen_collecting < 0)
        g_seen_collecting = g_check_interp->gc.collecting != 0;
    Py_RETURN_NONE;
}

static PyMethodDef g_gc_probe_def = {"_tc_gc_probe", gc_probe, METH_VARARGS, NULL};

/* 1 if the probe saw gc.collecting set during gc.collect(0), else 0. */
static int gc_collecting_seen(PyInterpreterState *interp)
{
    PyObject *gc = PyImport_ImportModule("gc"), *cbs = NULL, *probe = NULL, *r = NULL;
    g_check_interp = interp;
    g_seen_collecting = -1;
    if (gc != NULL && (cbs = PyObject_GetAttrString(gc, "callbacks")) != NULL &&
        PyList_Check(cbs) && (probe = PyCFunction_New(&g_gc_probe_def, NULL)) != NULL &&
        PyList_Append(cbs, probe) == 0) {
        r = PyObject_CallMethod(gc, "collect", "i", 0);
        Py_ssize_t i = PySequence_Index(cbs, probe);
        if (i >= 0)
            (void)PySequence_DelItem(cbs, i);
    }
    Py_XDECREF(r);
    Py_XDECREF(probe);
    Py_XDECREF(cbs);
    Py_XDECREF(gc);
    if (PyErr_Occurred())
        PyErr_Clear();
    return g_seen_collecting == 1;
}

#ifdef _Py_Debug_Cookie
/* 1 if CPython's own debug offsets agree with this build's. */
static int debug_offsets_agree(char *why, size_t n)
{
    const _Py_DebugOffsets *d = &_PyRuntime.debug_offsets;
    const char cookie[] = _Py_Debug_Cookie;
    if (memcmp(d->cookie, cookie, sizeof(d->cookie)) != 0)
        return check_fail(why, n, "_Py_DebugOffsets has no cookie");
    if (d->version != (uint64_t)Py_Version)
        return check_fail(why, n, "_Py_DebugOffsets version %#llx is not the interpreter's %#lx",
                          (unsigned long long)d->version, (unsigned long)Py_Version);
#ifdef Py_GIL_DISABLED
    if (d->free_threaded != 1)
#else
    if (d->free_threaded != 0)
#endif
        return check_fail(why, n, "_Py_DebugOffsets: another build kind");
    if (d->interpreter_state.gc != offsetof(PyInterpreterState, gc) ||
        d->interpreter_state.ceval_gil != offsetof(PyInterpreterState, ceval.gil) ||
        d->interpreter_state.gil_runtime_state_locked != offsetof(PyInterpreterState, _gil.locked) ||
        d->interpreter_state.gil_runtime_state_holder !=
            offsetof(PyInterpreterState, _gil.last_holder))
        return check_fail(why, n, "_Py_DebugOffsets: the interpreter state's layout differs");
    if (d->thread_state.current_frame != offsetof(PyThreadState, current_frame))
        return check_fail(why, n, "_Py_DebugOffsets: the thread state's layout differs");
#ifdef Py_INTERNAL_DEBUG_OFFSETS_H /* 3.14+: gc's own offsets too */
    if (d->gc.collecting != offsetof(struct _gc_runtime_state, collecting))
        return check_fail(why, n, "_Py_DebugOffsets: the gc state's layout differs");
#endif
    return 1;
}
#endif

static int gil_check(PyInterpreterState *interp, char *why, size_t n)
{
    unsigned long main_public, main_ours;
#ifndef Py_GIL_DISABLED
    const char *corrupt = getenv("TIMEOUTCORE_TEST_CORRUPT_GIL_OFFSET");
    struct _gil_runtime_state *gil;
    unsigned long cur, test, back;
    const void *holder;
    int locked;
#endif
#ifdef _Py_Debug_Cookie
    if (!debug_offsets_agree(why, n))
        return 0;
#endif
#ifndef Py_GIL_DISABLED
#if PY_VERSION_HEX >= 0x030C0000
    gil = interp->ceval.gil;
#else
    gil = &_PyRuntime.ceval.gil;
#endif
    if (gil == NULL)
        return check_fail(why, n, "the interpreter has no GIL state");
    if (corrupt != NULL && strcmp(corrupt, "1") == 0)
        gil = (struct _gil_runtime_state *)((char *)gil + 64);
    cur = __atomic_load_n(&gil->interval, __ATOMIC_RELAXED);
    if (cur != sys_interval_us())
        return check_fail(why, n, "the switch interval read through the GIL state (%lu us) "
                          "is not sys.getswitchinterval()", cur);
#if PY_VERSION_HEX >= 0x030D0000
    holder = _Py_atomic_load_ptr_relaxed(&gil->last_holder);
    locked = _Py_atomic_load_int_relaxed(&gil->locked);
#else
    holder = (const void *)_Py_atomic_load_relaxed(&gil->last_holder);
    locked = _Py_atomic_load_relaxed(&gil->locked);
#endif
    if (locked != 1 || holder != (const void *)PyThreadState_Get())
        return check_fail(why, n, "the GIL state's holder is not the thread that holds the GIL");
#endif
    main_ours = _PyRuntime.main_thread;
    main_public = public_main_thread();
    if (main_public == 0 || main_ours != main_public)
        return check_fail(why, n, "_PyRuntime.main_thread is not threading.main_thread().ident");
    if (interp->gc.collecting != 0)
        return check_fail(why, n, "gc.collecting is set outside a collection");
    if (!gc_collecting_seen(interp))
        return check_fail(why, n, "gc.collecting is not set during a collection");
#ifndef Py_GIL_DISABLED
    test = cur != 1000 ? 1000 : 2000;
    __atomic_store_n(&gil->interval, test, __ATOMIC_RELAXED);
    back = sys_interval_us();
    __atomic_store_n(&gil->interval, cur, __ATOMIC_RELAXED);
    if (back != test)
        return check_fail(why, n, "an interval written through the GIL state is not what "
                          "sys.getswitchinterval() reads");
#endif
    return 1;
}

#else /* -- the thread state (tc_accel.c, the unity build) -------------------- */

/* The probe's tracer (3.11): set and removed before any code could run. */
#if TC_HOOK_TRACE
static int tstate_probe_trace(PyObject *obj, PyFrameObject *f, int what, PyObject *arg)
{
    (void)obj;
    (void)f;
    (void)what;
    (void)arg;
    return 0;
}

/* sys.<name>() (a new reference), or NULL with the error cleared. */
static PyObject *sys_call(const char *name)
{
    PyObject *fn = PySys_GetObject(name); /* borrowed */
    PyObject *r = fn != NULL ? PyObject_CallNoArgs(fn) : NULL;
    if (r == NULL && PyErr_Occurred())
        PyErr_Clear();
    return r;
}

/* Check 5: the thread's tracer fields against PyEval_SetTrace and
 * sys.gettrace().  `probe`: any object, the probe tracer's argument. */
static int tstate_tracer_agrees(PyThreadState *t, PyObject *probe, char *why, size_t n)
{
    PyObject *trace = sys_call("gettrace"), *profile = sys_call("getprofile");
    int ok, idle = trace == Py_None && profile == Py_None;
    if (trace == NULL || profile == NULL) {
        Py_XDECREF(trace);
        Py_XDECREF(profile);
        return check_fail(why, n, "the thread state: sys.gettrace() or sys.getprofile() failed");
    }
    if (!idle) { /* someone traces this thread (a debugger, coverage): only compare */
        ok = t->c_traceobj == (trace == Py_None ? NULL : trace);
        Py_DECREF(trace);
        Py_DECREF(profile);
        return ok ? 1 : check_fail(why, n, "the thread state's c_traceobj is not sys.gettrace()");
    }
    Py_DECREF(trace);
    Py_DECREF(profile);
    if (t->c_tracefunc != NULL || t->c_traceobj != NULL || t->cframe->use_tracing != 0)
        return check_fail(why, n, "the thread state's tracer fields are set, and "
                          "sys.gettrace() is None");
    PyEval_SetTrace(tstate_probe_trace, probe);
    ok = t->c_tracefunc == tstate_probe_trace && t->c_traceobj == probe &&
         t->cframe->use_tracing == 255;
    PyEval_SetTrace(NULL, NULL);
    if (!ok || PyErr_Occurred())
        return check_fail(why, n, "the thread state's c_tracefunc, c_traceobj or "
                          "cframe->use_tracing do not follow PyEval_SetTrace");
    if (t->c_tracefunc != NULL || t->c_traceobj != NULL || t->cframe->use_tracing != 0)
        return check_fail(why, n, "the thread state's tracer fields stay set after "
                          "PyEval_SetTrace(NULL, NULL)");
    return 1;
}
#endif

/* Check 3: the raised and the handled exception, with a type of our own
 * (`probe`) that nothing else raises or handles. */
static int tstate_exceptions_agree(PyThreadState *t, PyObject *probe, char *why, size_t n)
{
    PyObject *prev, *inst;
    int before, during, after;
    before = tc_raising(t, probe);
    PyErr_SetString(probe, "timeoutcore's import check");
    during = tc_raising(t, probe);
    PyErr_Clear();
    after = tc_raising(t, probe);
    if (before || !during || after)
        return check_fail(why, n, "the thread state's raised exception (%s) does not follow "
                          "PyErr_SetString and PyErr_Clear",
                          PY_VERSION_HEX >= 0x030C0000 ? "current_exception" : "curexc_type");
    if ((inst = PyObject_CallNoArgs(probe)) == NULL)
        return check_fail(why, n, "the thread state: the probe exception could not be made");
    prev = PyErr_GetHandledException(); /* NULL: none */
    before = tc_handling(t, probe);
    PyErr_SetHandledException(inst);
    during = tc_handling(t, probe);
    PyErr_SetHandledException(prev);
    after = tc_handling(t, probe);
    Py_XDECREF(prev);
    Py_DECREF(inst);
    if (before || !during || after)
        return check_fail(why, n, "the thread state's handled exception (exc_info) does not "
                          "follow PyErr_SetHandledException");
    return 1;
}

/* Check 2: the fields of PyCodeObject the core reads (safe delivery's
 * rules, tc_compat.h and tc_guarded.c; a frame's place in messages,
 * tc_deliver.c) are the objects its attributes return -- those of the code
 * the importing thread runs. */
static int tstate_code_agrees(PyThreadState *t, char *why, size_t n)
{
    static const char *const names[] = {"co_consts", "co_exceptiontable", "co_name",
                                        "co_qualname", "co_filename"};
    PyFrameObject *f = PyThreadState_GetFrame(t); /* new reference */
    PyCodeObject *code;
    int ok;
    if (f == NULL)
        return check_fail(why, n, "the thread state: no Python frame to compare with");
    code = PyFrame_GetCode(f);
    Py_DECREF(f);
    PyObject *const fields[] = {code->co_consts, code->co_exceptiontable, code->co_name,
                                code->co_qualname, code->co_filename};
    PyObject *flags = PyObject_GetAttrString((PyObject *)code, "co_flags");
    ok = flags != NULL && PyLong_Check(flags) && PyLong_AsLong(flags) == code->co_flags;
    Py_XDECREF(flags);
    for (size_t i = 0; ok && i < sizeof(names) / sizeof(names[0]); i++) {
        PyObject *attr = PyObject_GetAttrString((PyObject *)code, names[i]);
        ok = attr != NULL && attr == fields[i];
        Py_XDECREF(attr);
        if (!ok) {
            Py_DECREF(code);
            return check_fail(why, n, "the code object's %s is not its attribute's", names[i]);
        }
    }
    Py_DECREF(code);
    return ok ? 1 : check_fail(why, n, "the code object's co_flags is not its attribute's");
}

/* Check 4's field, read as tc_async_exc_waiting does, or with the test hook
 * 64 bytes off it (past it where the struct goes on that far, else before
 * it): still inside the thread state. */
static int async_exc_waiting_checked(PyThreadState *t)
{
    const char *corrupt = getenv("TIMEOUTCORE_TEST_CORRUPT_TSTATE_OFFSET");
    const char *field = (const char *)&t->async_exc;
    void *v;
    if (corrupt == NULL || strcmp(corrupt, "1") != 0)
        return tc_async_exc_waiting(t);
    field += offsetof(PyThreadState, async_exc) + 64 + sizeof(v) <= sizeof(PyThreadState) ? 64 : -64;
    memcpy(&v, field, sizeof(v));
    return v != NULL;
}

/* Check 4: async_exc follows PyThreadState_SetAsyncExc, and is empty again
 * once the thread's next eval-breaker check has raised it (a loop's
 * back-edge, run here; consumed, never cleared, which on 3.11 and 3.12
 * would leave the breaker tripped).  The loop runs with tracing suspended
 * and the collector off: raised in the importer's tracer (CPython then
 * removes the tracer) or in a finalizer (reported as ignored), the probe
 * would do harm or be lost. */
static int tstate_async_exc_agrees(PyThreadState *t, PyObject *probe, char *why, size_t n)
{
    unsigned long me = PyThread_get_thread_ident();
    PyObject *globals, *r = NULL;
    int before = async_exc_waiting_checked(t), during, raised = 0, after, gc_was;
    if (before)
        return check_fail(why, n, "the thread state's async_exc shows an asynchronous "
                          "exception before any was sent");
    if (PyThreadState_SetAsyncExc(me, probe) != 1)
        return check_fail(why, n, "the thread state: PyThreadState_SetAsyncExc found no thread");
    during = async_exc_waiting_checked(t);
    gc_was = PyGC_Disable();
    PyThreadState_EnterTracing(t);
    if ((globals = PyDict_New()) != NULL) {
        r = PyRun_String("i = 0\nwhile i < 1000:\n    i += 1\n", Py_file_input, globals, globals);
        Py_DECREF(globals);
    }
    PyThreadState_LeaveTracing(t);
    if (gc_was)
        (void)PyGC_Enable();
    if (r == NULL) {
        raised = PyErr_ExceptionMatches(probe);
        PyErr_Clear();
    }
    Py_XDECREF(r);
    if (!raised) /* still there (or never set): not left behind for later code */
        (void)PyThreadState_SetAsyncExc(me, NULL);
    after = async_exc_waiting_checked(t);
    if (!during || !raised || after)
        return check_fail(why, n, "the thread state's async_exc does not follow "
                          "PyThreadState_SetAsyncExc");
    return 1;
}

/* Check 1: the lookup the core does for another thread, of our own. */
static int tstate_lookup_agrees(PyThreadState *t, char *why, size_t n)
{
#if !TC_FREE_THREADED /* never looked up there (tc_compat.h: tc_find_tstate) */
    if (tc_find_tstate(t, PyThreadState_GetID(t)) != t)
        return check_fail(why, n, "the thread state is not found by its address and id");
#else
    (void)t, (void)why, (void)n;
#endif
    return 1;
}

/* The core's thread-state checks above (1, 2, 4, 5), in the importing
 * thread, GIL held (free-threaded: attached), no error set.  1 if all held,
 * else 0 with the reason in `why`. */
static int tstate_check(char *why, size_t n)
{
    PyThreadState *t = PyThreadState_Get();
    PyObject *probe;
    int ok;
    if (PyErr_Occurred())
        return check_fail(why, n, "the thread state: an error was already set");
    if (!tstate_code_agrees(t, why, n) || !tstate_lookup_agrees(t, why, n))
        return 0;
    probe = PyErr_NewException("timeoutcore._ImportCheckProbe", NULL, NULL);
    if (probe == NULL)
        return check_fail(why, n, "the thread state: the probe type could not be made");
    ok = tstate_async_exc_agrees(t, probe, why, n);
#if TC_HOOK_TRACE
    ok = ok && tstate_tracer_agrees(t, probe, why, n);
#endif
    Py_DECREF(probe);
    return ok;
}

/* Check 3 alone, for the one accelerator that reads another thread's
 * exception state (accel_direct_delivery.c), in the importing thread, GIL
 * held, no error set.  1 if it held, else 0 with the reason in `why`. */
static int tstate_exceptions_check(char *why, size_t n)
{
    PyObject *probe = PyErr_NewException("timeoutcore._ImportCheckProbe", NULL, NULL);
    int ok;
    if (probe == NULL)
        return check_fail(why, n, "the thread state: the probe type could not be made");
    ok = tstate_exceptions_agree(PyThreadState_Get(), probe, why, n);
    Py_DECREF(probe);
    return ok;
}

#if TC_IFRAME_ID
/* Check 6's field, read as tc_current_iframe does, or with the test hook 64
 * bytes past it: 3.11 and 3.12 keep it in the eval loop's _PyCFrame, on the
 * C stack, whose older part lies past it. */
static void *current_iframe_checked(PyThreadState *t)
{
    const char *corrupt = getenv("TIMEOUTCORE_TEST_CORRUPT_FRAME_OFFSET");
    void *cur;
    if (corrupt == NULL || strcmp(corrupt, "1") != 0)
        return tc_current_iframe(t);
#if PY_VERSION_HEX < 0x030D0000
    if (t->cframe == NULL)
        return NULL;
    memcpy(&cur, (const char *)&t->cframe->current_frame + 64, sizeof(cur));
#else
    memcpy(&cur, (const char *)&t->current_frame + 64, sizeof(cur));
#endif
    return cur;
}
#endif

/* Check 6 alone, for the accelerator frame_address (accel_frame_address.c),
 * where this build has it, in the importing thread, GIL held: its
 * current-frame address and the code it runs, against the frame object and
 * code public API gives.  1 if it held, else 0 with the reason in `why`. */
static int frame_address_check(char *why, size_t n)
{
#if TC_IFRAME_ID
    PyThreadState *t = PyThreadState_Get();
    PyFrameObject *f = PyThreadState_GetFrame(t); /* new reference */
    PyCodeObject *code;
    const char *wrong = NULL;
    void *cur;
    if (f == NULL)
        return check_fail(why, n, "the thread state: no Python frame to compare with");
    code = PyFrame_GetCode(f);
    cur = current_iframe_checked(t);
    if (cur == NULL || tc_frame_iframe(f) != cur)
        wrong = "the thread state's current frame is not the one PyThreadState_GetFrame() shows";
    else if (tc_iframe_code(cur) != code)
        wrong = "the current interpreter frame's code is not PyFrame_GetCode()'s";
    Py_DECREF(code);
    Py_DECREF(f);
    return wrong == NULL ? 1 : check_fail(why, n, "%s", wrong);
#else
    return check_fail(why, n, "no interpreter frame layout for this CPython");
#endif
}

#endif /* Py_BUILD_CORE */
