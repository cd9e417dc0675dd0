/*
 * tc_guarded.c -- which code a scope guards, and code no interrupt may
 * surface in whatever module it belongs to.  Part of the unity build
 * (timeoutcore.c), before tc_deliver.c, which applies both rules.
 *
 * Wrapper scopes.  A scope is bounded by the frame whose code entered it:
 * the delivery's protected-code check walks from the innermost frame up to
 * that frame (tc_deliver.c), and on 3.13 a scope whose frame no longer runs
 * is stale (tc_slot.c).  A scope entered from another object's __enter__ --
 * a framework's hook, a class that opens a scope in __enter__ and closes it
 * in __exit__, ExitStack.enter_context, a @contextmanager generator -- has
 * that wrapper as its frame, which returns at once: the block it guards
 * runs in the wrapper's caller.  There the walk found no bound, judged the
 * innermost frame alone, and raised on the first line of the wrapper's
 * __exit__ -- before it reached the scope's own exit, so the raw internal
 * interrupt escaped and the scope was never exited; 3.13 dropped the scope
 * as stale the first time it looked.  So the entering code is looked at
 * (code_enters: named __enter__/__aenter__/enter_context/
 * enter_async_context, or a generator), and if it is a wrapper the scope
 * also records its *owner*: the first frame outward that is not one (the
 * with statement that entered the wrapper).  The owner bounds the walk once
 * the entering frame has returned, and tells on 3.13 whether the scope is
 * still in use.  While the entering frame still runs, it is the bound as
 * before -- a scope opened and closed inside an __enter__ is interrupted in
 * its block like any other -- except where an exception would leave that
 * frame (no handler of its own covers the instruction: the wrapper's
 * __enter__ after the scope's entry), which counts as protected: raised
 * there, the interrupt would escape the with statement that never started.
 * The look is the entering frame's code (its object's, or with the
 * accelerator frame_address its address's) and four compares; only the
 * entry of a scope entered by such code walks frame objects outward.
 *
 * Exits, entries and finalizers.  Code named __exit__, __aexit__,
 * __enter__, __aenter__ or __del__ is protected wherever it lives: an exit
 * interrupted half-way skips the rest of its cleanup (a wrapper's exit
 * never reaches the scope's, an ExitStack skips callbacks) and an entry
 * interrupted after it took a resource leaks it, because the with
 * statement that would release it has not started; a finalizer run by
 * reference counting is an "unraisable" context: CPython prints "Exception
 * ignored" and drops whatever is raised there, and a loop that drops
 * objects with finalizers ran on past its deadline while each delivery
 * landed in one.  Weakref callbacks and other unraisable contexts have no
 * name to know them by: tc_unraisable.c learns them when CPython reports
 * one of our interrupts as ignored, and sends it again at once.
 */

enum {
    TC_NAME_ENTER,
    TC_NAME_AENTER,
    TC_NAME_ENTER_CONTEXT,
    TC_NAME_ENTER_ASYNC_CONTEXT,
    TC_NAME_EXIT,
    TC_NAME_AEXIT,
    TC_NAME_DEL,
    TC_NAMES
};
static const char *const g_name_strs[TC_NAMES] = {
    "__enter__", "__aenter__", "enter_context", "enter_async_context", "__exit__", "__aexit__", "__del__",
};
static PyObject *g_names[TC_NAMES]; /* interned (code names are), set once (GIL) */
static PyObject *g_contextlib;      /* interned "contextlib"                     */
static PyObject *g_name_key;        /* interned "__name__" (tc_deliver.c too)    */

/* Code where CPython once dropped an interrupt (tc_unraisable.c learns
 * it): a set of code objects, written with the GIL / core lock. */
static PyObject *g_dropped_codes;

/* Does `code` count as protected because it once dropped an interrupt? */
static int code_dropped_once(PyCodeObject *code)
{
    return g_dropped_codes != NULL && PySet_Contains(g_dropped_codes, (PyObject *)code) == 1;
}

/* Once, GIL held (module set-up).  -1 with an exception on failure. */
static int guarded_setup(void)
{
    for (int i = 0; i < TC_NAMES; i++)
        if (g_names[i] == NULL && (g_names[i] = PyUnicode_InternFromString(g_name_strs[i])) == NULL)
            return -1;
    if (g_contextlib == NULL && (g_contextlib = PyUnicode_InternFromString("contextlib")) == NULL)
        return -1;
    return 0;
}

/* Does `code` (or NULL) enter context managers on its caller's behalf?
 * Code names are interned, so identity decides. */
static int code_enters(PyCodeObject *code)
{
    PyObject *n;
    if (code == NULL || g_names[TC_NAME_ENTER] == NULL)
        return 0;
    if (code->co_flags & CO_GENERATOR)
        return 1;
    n = code->co_name;
    return n == g_names[TC_NAME_ENTER] || n == g_names[TC_NAME_AENTER] ||
           n == g_names[TC_NAME_ENTER_CONTEXT] || n == g_names[TC_NAME_ENTER_ASYNC_CONTEXT];
}

/* Is `code` an exit, an entry or a finalizer (protected by its name)? */
static int code_protected_by_name(PyCodeObject *code)
{
    PyObject *n = code->co_name;
    if (g_names[TC_NAME_ENTER] == NULL)
        return 0;
    return n == g_names[TC_NAME_EXIT] || n == g_names[TC_NAME_AEXIT] || n == g_names[TC_NAME_DEL] ||
           n == g_names[TC_NAME_ENTER] || n == g_names[TC_NAME_AENTER];
}

/* Frame `f` (borrowed, or NULL) runs code that enters on its caller's
 * behalf (code_enters): the question a scope's entry asks of its own frame,
 * which is entering code by name when it is a wrapper at all. */
static int frame_code_enters(PyFrameObject *f)
{
    PyCodeObject *code;
    int r;
    if (f == NULL)
        return 0;
    code = PyFrame_GetCode(f);
    r = code_enters(code);
    Py_DECREF(code);
    return r;
}

/* Frame `f` (borrowed, or NULL) enters on its caller's behalf: its code
 * does, or it runs contextlib's machinery -- the question of the walk
 * outward from a wrapper to its owner, past contextlib's helpers. */
static int frame_enters(PyFrameObject *f)
{
    int r = frame_code_enters(f);
    if (!r && f != NULL && g_contextlib != NULL) {
        PyObject *globals = PyFrame_GetGlobals(f);
        PyObject *name = globals != NULL ? PyDict_GetItemWithError(globals, g_name_key) : NULL;
        r = name != NULL && PyUnicode_Check(name) && PyUnicode_Compare(name, g_contextlib) == 0;
        Py_XDECREF(globals);
        PyErr_Clear();
    }
    return r;
}

/* Scope `sc` is being entered by a wrapper (GIL held, the entering thread):
 * record its owner, the first frame outward that is no wrapper, and the
 * wrapper's frame object: once the wrapper has returned, the address that
 * identifies a scope's frame elsewhere (accel_frame_address.c) may be
 * another frame's, so a wrapper scope's frame is known by its object.
 * None found (the wrapper is the thread's outermost frame): no owner. */
static void scope_find_owner(Scope *sc)
{
    PyFrameObject *f = PyEval_GetFrame(); /* borrowed: the wrapper's */
    PyFrameObject *back = f != NULL ? PyFrame_GetBack(f) : NULL;
    if (back == NULL)
        return;
    Py_INCREF(f);
    Py_XSETREF(sc->frame, (PyObject *)f);
    while (back != NULL && frame_enters(back)) {
        PyFrameObject *next = PyFrame_GetBack(back);
        Py_DECREF(back);
        back = next;
    }
    Py_XSETREF(sc->owner, (PyObject *)back); /* the reference moves here */
}
