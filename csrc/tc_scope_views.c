/*
 * tc_scope_views.c -- the Scope type's methods after enter and exit: when(),
 * reschedule(), expired(), remaining(), elapsed(), the read-only attributes
 * and the hook's setter, and the type's method and getset tables and spec.
 * Part of the unity build (timeoutcore.c), after tc_scope.c.
 *
 * Who calls what: Python code, in any thread, with the GIL (free-threaded:
 * inside the core lock and the scope's slot's, through the TC_SCOPE_LOCKED_
 * wrapper after each *_locked function; tc_lock.h).  reschedule() is the
 * one that changes a deadline: it publishes the slot's new earliest
 * deadline (tc_slot.c: slot_publish, through slot_deadline_set) and fires
 * at once if that is already due.  Nothing here runs without the GIL or in
 * a signal handler.
 */

static PyObject *ns_to_float(int64_t ns)
{
    if (ns == TC_NEVER)
        Py_RETURN_NONE;
    return PyFloat_FromDouble((double)ns / TC_NS_PER_S_F);
}

static PyObject *Scope_when_locked(PyObject *self, PyObject *unused)
{
    (void)unused;
    Scope *sc = as_scope(self);
    if (sc->state == SCOPE_NEW && !sc->has_deadline_arg)
        Py_RETURN_NONE;
    return ns_to_float(sc->deadline);
}
TC_SCOPE_LOCKED_2(PyObject *, Scope_when, PyObject *)

static PyObject *Scope_reschedule_locked(PyObject *self, PyObject *when)
{
    Scope *sc = as_scope(self);
    int64_t d;
    if (when == Py_None)
        d = TC_NEVER;
    else if (parse_when(when, "reschedule()", &d) < 0)
        return NULL;
    if (sc->state == SCOPE_DONE) {
        PyErr_SetString(PyExc_RuntimeError, "reschedule() on a scope that has exited");
        return NULL;
    }
    sc->deadline = d;
    prepare_drop(sc); /* for the old deadline (or before a cancel) */
    if (sc->state == SCOPE_NEW) {
        sc->has_deadline_arg = 1;
        sc->seconds = NAN;
        Py_RETURN_NONE;
    }
    tc_slot *s = sc->slot;
    if (s != NULL && s->fired == NULL) {
        slot_publish(s);
        int64_t now = now_ns();
        if (d <= now && atomic_load(&s->shield) == 0) {
            if (t_slot == s) {
                slot_fire(s, now, 1);
                return NULL;
            }
            /* Another thread's block (cancel(), or a deadline moved into the
             * past): fire it from here, as the watchdog's sweep would --
             * this thread holds the GIL (free-threaded: the core lock) now,
             * while the watchdog would first have to win it from the busy
             * threads (for the registry's cancel of a spinning job, the
             * watchdog's own wait for the GIL was most of the latency).  The
             * interrupt goes pending for that thread's hook, which raises it
             * at a safe line boundary there; nothing is raised here. */
            if (s->alive && atomic_load(&s->state) == SLOT_ARMED)
                (void)slot_fire(s, now, 0);
        }
    }
    Py_RETURN_NONE;
}
TC_SCOPE_LOCKED_2(PyObject *, Scope_reschedule, PyObject *)

static PyObject *Scope_expired_locked(PyObject *self, PyObject *unused)
{
    (void)unused;
    return PyBool_FromLong(as_scope(self)->expired);
}
TC_SCOPE_LOCKED_2(PyObject *, Scope_expired, PyObject *)

static PyObject *Scope_remaining_locked(PyObject *self, PyObject *unused)
{
    (void)unused;
    Scope *sc = as_scope(self);
    if (sc->deadline == TC_NEVER || (sc->state == SCOPE_NEW && !sc->has_deadline_arg)) {
        if (sc->state == SCOPE_NEW && !isnan(sc->seconds))
            return PyFloat_FromDouble(sc->seconds);
        Py_RETURN_NONE;
    }
    int64_t end = sc->state == SCOPE_DONE ? sc->exited : now_ns();
    int64_t r = sc->deadline - end;
    return PyFloat_FromDouble(r > 0 ? (double)r / TC_NS_PER_S_F : 0.0);
}
TC_SCOPE_LOCKED_2(PyObject *, Scope_remaining, PyObject *)

static PyObject *Scope_elapsed_locked(PyObject *self, PyObject *unused)
{
    (void)unused;
    Scope *sc = as_scope(self);
    if (sc->state == SCOPE_NEW)
        return PyFloat_FromDouble(0.0);
    int64_t end = sc->state == SCOPE_DONE ? sc->exited : now_ns();
    return PyFloat_FromDouble((double)(end - sc->entered) / TC_NS_PER_S_F);
}
TC_SCOPE_LOCKED_2(PyObject *, Scope_elapsed, PyObject *)

static PyObject *Scope_get_label_locked(PyObject *self, void *c)
{
    (void)c;
    Py_INCREF(as_scope(self)->label);
    return as_scope(self)->label;
}
TC_SCOPE_LOCKED_2(PyObject *, Scope_get_label, void *)

static PyObject *Scope_get_limit_locked(PyObject *self, void *c)
{
    (void)c;
    Scope *sc = as_scope(self);
    if (!isnan(sc->seconds))
        return PyFloat_FromDouble(sc->seconds);
    if (sc->deadline == TC_NEVER || sc->state == SCOPE_NEW)
        Py_RETURN_NONE;
    return PyFloat_FromDouble((double)(sc->deadline - sc->entered) / TC_NS_PER_S_F);
}
TC_SCOPE_LOCKED_2(PyObject *, Scope_get_limit, void *)

static PyObject *Scope_get_overshoot_locked(PyObject *self, void *c)
{
    (void)c;
    Scope *sc = as_scope(self);
    if (!sc->expired || sc->state != SCOPE_DONE)
        Py_RETURN_NONE;
    int64_t o = sc->exited - sc->deadline;
    return PyFloat_FromDouble(o > 0 ? (double)o / TC_NS_PER_S_F : 0.0);
}
TC_SCOPE_LOCKED_2(PyObject *, Scope_get_overshoot, void *)

static PyObject *Scope_get_deferred_locked(PyObject *self, void *c)
{
    Scope *sc = as_scope(self);
    (void)c;
    /* something was sent to the block: its deadline fired, or a soft exception */
    if (!sc->expired && sc->delivered_at == 0 && sc->deferred_where == NULL)
        Py_RETURN_NONE;
    return PyFloat_FromDouble((double)sc->deferred_ns / TC_NS_PER_S_F);
}
TC_SCOPE_LOCKED_2(PyObject *, Scope_get_deferred, void *)

/* A new reference to `o`, or to None for NULL (the optional fields below). */
static PyObject *ref_or_none(PyObject *o) { return Py_NewRef(o != NULL ? o : Py_None); }

static PyObject *Scope_get_deferred_where_locked(PyObject *self, void *c)
{
    (void)c;
    return ref_or_none(as_scope(self)->deferred_where);
}
TC_SCOPE_LOCKED_2(PyObject *, Scope_get_deferred_where, void *)

static PyObject *Scope_get_prepared_locked(PyObject *self, void *c)
{
    (void)c;
    return ref_or_none(prepare_peek(as_scope(self)));
}
TC_SCOPE_LOCKED_2(PyObject *, Scope_get_prepared, void *)

static PyObject *Scope_get_delivered_at_locked(PyObject *self, void *c)
{
    (void)c;
    if (as_scope(self)->delivered_at == 0)
        Py_RETURN_NONE;
    return ns_to_float(as_scope(self)->delivered_at);
}
TC_SCOPE_LOCKED_2(PyObject *, Scope_get_delivered_at, void *)

static PyObject *Scope_get_fired_at_locked(PyObject *self, void *c)
{
    (void)c;
    if (!as_scope(self)->expired)
        Py_RETURN_NONE;
    return ns_to_float(as_scope(self)->fired_at);
}
TC_SCOPE_LOCKED_2(PyObject *, Scope_get_fired_at, void *)

static PyObject *Scope_get_entered_at_locked(PyObject *self, void *c)
{
    (void)c;
    if (as_scope(self)->state == SCOPE_NEW)
        Py_RETURN_NONE;
    return ns_to_float(as_scope(self)->entered);
}
TC_SCOPE_LOCKED_2(PyObject *, Scope_get_entered_at, void *)

static PyObject *Scope_get_exited_at_locked(PyObject *self, void *c)
{
    (void)c;
    if (as_scope(self)->state != SCOPE_DONE || as_scope(self)->exited == 0)
        Py_RETURN_NONE;
    return ns_to_float(as_scope(self)->exited);
}
TC_SCOPE_LOCKED_2(PyObject *, Scope_get_exited_at, void *)

static PyObject *Scope_get_active_locked(PyObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(as_scope(self)->state == SCOPE_ACTIVE);
}
TC_SCOPE_LOCKED_2(PyObject *, Scope_get_active, void *)

static PyObject *Scope_get_used_locked(PyObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(as_scope(self)->state != SCOPE_NEW);
}
TC_SCOPE_LOCKED_2(PyObject *, Scope_get_used, void *)

static PyObject *Scope_get_raise_locked(PyObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(as_scope(self)->raise_on_timeout);
}
TC_SCOPE_LOCKED_2(PyObject *, Scope_get_raise, void *)

static PyObject *Scope_get_native_id_locked(PyObject *self, void *c)
{
    (void)c;
    if (as_scope(self)->state == SCOPE_NEW)
        Py_RETURN_NONE;
    return PyLong_FromLong((long)as_scope(self)->native_id);
}
TC_SCOPE_LOCKED_2(PyObject *, Scope_get_native_id, void *)

static PyObject *Scope_get_exit_exc_locked(PyObject *self, void *c)
{
    (void)c;
    return ref_or_none(as_scope(self)->exit_exc);
}
TC_SCOPE_LOCKED_2(PyObject *, Scope_get_exit_exc, void *)

static PyObject *Scope_get_hook_locked(PyObject *self, void *c)
{
    (void)c;
    return ref_or_none(as_scope(self)->hook);
}
TC_SCOPE_LOCKED_2(PyObject *, Scope_get_hook, void *)

static int Scope_set_hook_locked(PyObject *self, PyObject *value, void *c)
{
    (void)c;
    if (as_scope(self)->state == SCOPE_DONE) {
        PyErr_SetString(PyExc_RuntimeError, "a scope's hook cannot be set after it exited");
        return -1;
    }
    if (value != NULL && value != Py_None && !PyCallable_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "_hook must be callable or None");
        return -1;
    }
    if (value == Py_None)
        value = NULL;
    Py_XINCREF(value);
    Py_XSETREF(as_scope(self)->hook, value);
    return 0;
}
TC_SCOPE_LOCKED_3(int, Scope_set_hook, PyObject *, void *)

static PyObject *Scope_get_thread_ident_locked(PyObject *self, void *c)
{
    (void)c;
    if (as_scope(self)->state == SCOPE_NEW)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLong(as_scope(self)->ident);
}
TC_SCOPE_LOCKED_2(PyObject *, Scope_get_thread_ident, void *)

static PyMethodDef Scope_methods[] = {
    {"__enter__", Scope_enter, METH_NOARGS, "Arm the deadline; returns the scope."},
    {"__exit__", (PyCFunction)(void (*)(void))Scope_exit, METH_FASTCALL,
     "Disarm; turn this scope's interrupt into DeadlineExceeded."},
    {"when", Scope_when, METH_NOARGS,
     "The absolute deadline as a time.monotonic() value, or None."},
    {"reschedule", Scope_reschedule, METH_O,
     "Move the deadline to `when` (time.monotonic() seconds, or None for no deadline)."},
    {"expired", Scope_expired, METH_NOARGS, "True once this scope's deadline has fired."},
    {"remaining", Scope_remaining, METH_NOARGS,
     "Seconds left before the deadline (0.0 once passed), or None without one."},
    {"elapsed", Scope_elapsed, METH_NOARGS, "Seconds since the scope was entered."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Scope_getset[] = {
    {"label", Scope_get_label, NULL, "The label given at construction, or None.", NULL},
    {"limit", Scope_get_limit, NULL, "The limit in seconds, or None.", NULL},
    {"overshoot", Scope_get_overshoot, NULL,
     "Seconds between the deadline and the moment the block was left, if it fired.", NULL},
    {"fired_at", Scope_get_fired_at, NULL,
     "time.monotonic() when the interrupt was raised, or None.", NULL},
    {"entered_at", Scope_get_entered_at, NULL, "time.monotonic() at entry, or None.", NULL},
    {"deferred", Scope_get_deferred, NULL,
     "Seconds the interrupt (or a soft_raise exception) waited for the thread to leave "
     "protected code (0.0 if it never had to), or None if nothing was sent to the block.",
     NULL},
    {"deferred_where", Scope_get_deferred_where, NULL,
     "'file:line in function' of the protected code that first held the interrupt, or "
     "None.", NULL},
    {"delivered_at", Scope_get_delivered_at, NULL,
     "time.monotonic() when the interrupt surfaced inside the block, or None (it never "
     "did: the block ended first, or it was raised at an explicit point).", NULL},
    {"exited_at", Scope_get_exited_at, NULL, "time.monotonic() at exit, or None.", NULL},
    {"active", Scope_get_active, NULL, "True between enter and exit.", NULL},
    {"used", Scope_get_used, NULL, "True once entered.", NULL},
    {"raise_on_timeout", Scope_get_raise, NULL, "Whether expiry raises DeadlineExceeded.",
     NULL},
    {"native_id", Scope_get_native_id, NULL,
     "Kernel thread id of the thread that entered it, or None.", NULL},
    {"exit_exception", Scope_get_exit_exc, NULL,
     "The exception the block ended with (as passed to __exit__), or None.", NULL},
    {"_prepared", Scope_get_prepared, NULL,
     "Internal: the exception the watchdog built ahead of the deadline, or None.", NULL},
    {"_hook", Scope_get_hook, Scope_set_hook,
     "Internal: hook(scope, 'enter'|'exit', exc), called around the block.", NULL},
    {"thread_ident", Scope_get_thread_ident, NULL,
     "threading.get_ident() of the thread that entered it, or None.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

#define SCOPE_DOC "Native deadline scope (use timeoutcore.thread_deadline)."
#define SCOPE_FLAGS (Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC)

#if TC_FREE_THREADED
/* Free-threaded, the type is static.  A heap type's instances hold a
 * reference to it that its own tp_dealloc drops with Py_DECREF: for
 * DeadlineScope's instances, one atomic write per block to a cache line
 * that every thread's blocks share, and the end of their scaling.  Under a
 * static base, subtype_dealloc drops it instead, through the per-thread
 * count CPython keeps for heap types.  (With the GIL nothing is shared
 * that way, and the heap type made from the spec below stays.) */
static PyTypeObject Scope_static = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "timeoutcore._core.Scope",
    .tp_basicsize = sizeof(Scope),
    .tp_flags = SCOPE_FLAGS,
    .tp_doc = SCOPE_DOC,
    .tp_new = Scope_new,
    .tp_init = Scope_init,
    .tp_dealloc = Scope_dealloc,
    .tp_traverse = Scope_traverse,
    .tp_clear = Scope_clear,
    .tp_methods = Scope_methods,
    .tp_getset = Scope_getset,
};

/* The Scope type (a new reference), or NULL with an exception. */
static PyObject *scope_type_make(void)
{
    if (PyType_Ready(&Scope_static) < 0)
        return NULL;
    return Py_NewRef((PyObject *)&Scope_static);
}
#else
static PyType_Slot Scope_slots[] = {
    {Py_tp_doc, SCOPE_DOC},
    {Py_tp_new, Scope_new},
    {Py_tp_init, Scope_init},
    {Py_tp_dealloc, Scope_dealloc},
    {Py_tp_traverse, Scope_traverse},
    {Py_tp_clear, Scope_clear},
    {Py_tp_methods, Scope_methods},
    {Py_tp_getset, Scope_getset},
    {0, NULL},
};

static PyType_Spec Scope_spec = {
    "timeoutcore._core.Scope",
    sizeof(Scope),
    0,
    SCOPE_FLAGS,
    Scope_slots,
};

static PyObject *scope_type_make(void) { return PyType_FromSpec(&Scope_spec); }
#endif

