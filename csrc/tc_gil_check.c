/*
 * tc_gil_check.c -- the import check of the internal addresses tc_gil.c
 * uses.  Included by tc_gil.c (the unit built with Py_BUILD_CORE), never
 * compiled on its own.
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
 * The checks, in this order (the write comes last, only after every read
 * agreed, so a wrong address is never written to):
 *   1. 3.13+ (_Py_DebugOffsets, which CPython keeps for debuggers at the
 *      start of _PyRuntime): the cookie, the version against the running
 *      interpreter's Py_Version, the build kind, and the offsets of the
 *      fields used against this build's offsetof.  (Where the debug-offsets
 *      struct itself changed between patch releases the fields read are
 *      others, and the check fails: off, never wrong.)
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
