/*
 * tc_unraisable.c -- an interrupt CPython dropped: learn where, send it
 * again.  Part of the unity build (timeoutcore.c), after tc_slot.c.
 *
 * Why: a weakref callback, a finalizer, an atexit or GC callback runs where
 * an exception cannot propagate; CPython reports it ("Exception ignored
 * in ...", sys.unraisablehook) and drops it.  An interrupt delivered there
 * is lost: a loop that drops objects with weakref callbacks (an ORM's
 * identity map) ran on past its deadline for seconds, each re-delivery
 * landing in another callback.  Code named __del__ is protected by name
 * (tc_guarded.c); the rest has no name to know it by, so it is learned:
 * CPython raises the audit event "sys.unraisablehook" before it reports,
 * whichever hook is installed (an audit hook cannot be replaced or removed,
 * unlike sys.unraisablehook, which pytest and others swap), and there, in
 * the thread that dropped it, with the GIL:
 *   - the outermost Python function the interrupt left (the callback: the
 *     first entry of its traceback) joins the codes that count as
 *     protected, so no later delivery lands in it;
 *   - so does the hook about to report (it runs right after the event: an
 *     interrupt surfacing there would be dropped in turn);
 *   - if the thread's scope has fired and nothing is pending, the interrupt
 *     is made pending again at once, for the next safe point -- not at the
 *     watchdog's next re-injection, which backs off.
 * A soft exception (soft_raise) dropped the same way is learned from and
 * sent again just so, once per drop: nobody else would send it again (the
 * soft timer sends it once), and the block ran on to its hard limit.  It is
 * known by what the slot noted when it was sent (soft_drop_of): the same
 * class, for a scope still on the thread's stack with it outstanding, and
 * -- when the hook delivered it -- a traceback that starts in the frame it
 * surfaced in; an exception of that class the program raised itself
 * elsewhere is left alone.
 * The report itself is dropped by the Python layer's sys.unraisablehook
 * wrapper (timeoutcore/_native.py): it is the library's own bookkeeping,
 * and the deadline still ends the block.  The audit hook is a C function
 * that compares the event's name and returns: what it costs every other
 * audit event.  The learned set only grows, by one code object per
 * distinct callback that ever dropped an interrupt, and lives as long as
 * the process.
 */

/* Learn the callback that traceback `tb` starts in (its outermost frame). */
static void unraisable_learn(PyObject *tb)
{
    PyFrameObject *f;
    PyCodeObject *code;
    if (tb == NULL || !PyTraceBack_Check(tb))
        return;
    f = ((PyTracebackObject *)tb)->tb_frame;
    if (f == NULL || g_dropped_codes == NULL)
        return;
    code = PyFrame_GetCode(f);
    if (PySet_Contains(g_dropped_codes, (PyObject *)code) == 0) {
        if (PySet_Add(g_dropped_codes, (PyObject *)code) == 0)
            g_prot_gen++; /* tc_deliver.c: every cached verdict is stale now */
        STAT_INC(dropped_learned);
    }
    Py_DECREF(code);
    PyErr_Clear();
}

static PyObject *g_call_key; /* interned "__call__" */

/* Learn the hook about to report (a function, a method, or an object whose
 * class defines __call__ in Python): an interrupt sent again at once would
 * surface at its first line -- inside the report, another unraisable
 * context. */
static void unraisable_learn_hook(PyObject *hook)
{
    PyObject *fn = hook, *code;
    if (PyMethod_Check(fn))
        fn = PyMethod_GET_FUNCTION(fn);
    else if (!PyFunction_Check(fn))
        fn = _PyType_Lookup(Py_TYPE(fn), g_call_key); /* borrowed, or NULL */
    if (fn == NULL || !PyFunction_Check(fn) || g_dropped_codes == NULL)
        return;
    code = PyFunction_GET_CODE(fn);
    if (PySet_Contains(g_dropped_codes, code) == 0 && PySet_Add(g_dropped_codes, code) == 0)
        g_prot_gen++;
    PyErr_Clear();
}

/* The scope whose soft exception (class `et`, traceback `tb`) this drop
 * is, or NULL if it is none of ours (above).  Core lock held. */
static PyObject *soft_drop_of(tc_slot *s, PyObject *et, PyObject *tb)
{
    PyObject *p;
    if ((const void *)et != atomic_load(&s->soft_cls))
        return NULL;
    for (p = s->top; p != NULL && p != s->soft_scope; p = as_scope(p)->parent)
        ;
    if (p == NULL || as_scope(p)->state != SCOPE_ACTIVE || !as_scope(p)->soft_pending)
        return NULL;
    if (s->soft_frame != NULL) {
        if (tb == NULL || !PyTraceBack_Check(tb))
            return NULL;
        while (((PyTracebackObject *)tb)->tb_next != NULL)
            tb = (PyObject *)((PyTracebackObject *)tb)->tb_next;
        if ((const void *)((PyTracebackObject *)tb)->tb_frame != s->soft_frame)
            return NULL; /* raised elsewhere: the program's own */
    }
    return p;
}

static int unraisable_audit(const char *event, PyObject *args, void *data)
{
    PyObject *u, *et, *soft = NULL;
    tc_slot *s = t_slot;
    int hard;
    (void)data;
    if (s == NULL || strcmp(event, "sys.unraisablehook") != 0 || g_interrupt == NULL ||
        !PyTuple_Check(args) || PyTuple_GET_SIZE(args) != 2)
        return 0;
    u = PyTuple_GET_ITEM(args, 1); /* UnraisableHookArgs, a struct sequence */
    if (!PyTuple_Check(u) || PyTuple_GET_SIZE(u) < 3)
        return 0;
    et = PyTuple_GET_ITEM(u, 0);
    if (et == NULL || !PyType_Check(et))
        return 0;
    hard = PyType_IsSubtype((PyTypeObject *)et, (PyTypeObject *)g_interrupt);
    if (!hard && (const void *)et != atomic_load(&s->soft_cls)) /* the usual case: no lock */
        return 0;
    TC_CORE_BEGIN();
    if (hard || (soft = soft_drop_of(s, et, PyTuple_GET_ITEM(u, 2))) != NULL) {
        unraisable_learn(PyTuple_GET_ITEM(u, 2));
        unraisable_learn_hook(PyTuple_GET_ITEM(args, 0));
        STAT_INC(dropped);
    }
    /* Own thread: nothing to kick.  A hard interrupt pending is never
     * replaced by a soft exception (deliver_async). */
    if (hard && atomic_load(&s->state) == SLOT_INJECTED && s->fired != NULL &&
        s->pending == NULL && !s->async_pending && atomic_load(&s->shield) == 0)
        (void)deliver_async(s, g_interrupt, s->fired);
    else if (soft != NULL && atomic_load(&s->state) != SLOT_INJECTED && s->pending == NULL &&
             !s->async_pending && atomic_load(&s->shield) == 0)
        (void)deliver_async(s, et, soft);
    TC_CORE_END();
    return 0;
}

/* Once, GIL held (_setup_delivery).  -1 with an exception on failure. */
static int unraisable_setup(void)
{
    if (g_dropped_codes != NULL)
        return 0;
    if (g_call_key == NULL && (g_call_key = PyUnicode_InternFromString("__call__")) == NULL)
        return -1;
    if ((g_dropped_codes = PySet_New(NULL)) == NULL)
        return -1;
    if (PySys_AddAuditHook(unraisable_audit, NULL) < 0) {
        Py_CLEAR(g_dropped_codes);
        return -1;
    }
    return 0;
}
