/*
 * tc_module.c -- the Shield type and the functions of the Python-facing
 * module (timeoutcore._core); fork handling and the cffi entry points that
 * build the module follow in tc_export.c.  Part of the unity build
 * (timeoutcore.c).  Free-threaded: each function that
 * touches core state runs inside the core lock (TC_LOCKED_ wrappers,
 * tc_lock.h).
 */

/* -- Shield: hold interrupts back; deliver at exit ---------------------------- */
typedef struct {
    PyObject_HEAD
    tc_slot *slot;
    int state;
} Shield;

static PyObject *Shield_enter_locked(PyObject *self, PyObject *unused)
{
    (void)unused;
    Shield *sh = (Shield *)self;
    tc_slot *s;
    if (sh->state != 0) {
        PyErr_SetString(PyExc_RuntimeError, "a shield is not reusable");
        return NULL;
    }
    s = t_slot;
    if (s == NULL && (s = slot_get()) == NULL)
        return NULL;
    sh->slot = s;
    sh->state = 1;
    if (atomic_fetch_add(&s->shield, 1) == 0 && atomic_load(&s->state) == SLOT_INJECTED &&
        s->fired != NULL) {
        /* A raised-but-undelivered interrupt must not land in the shield:
         * take it back; shield exit delivers it. */
        slot_take_back(s);
    }
    atomic_fetch_add(&s->gen, 1);
    Py_INCREF(self);
    return self;
}
TC_LOCKED_2(PyObject *, Shield_enter, PyObject *, PyObject *)

static PyObject *Shield_exit_locked(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)args;
    (void)nargs;
    Shield *sh = (Shield *)self;
    tc_slot *s = sh->slot;
    if (sh->state != 1 || s != t_slot) {
        PyErr_SetString(PyExc_RuntimeError,
                        "shield exited twice or in another thread than it was entered");
        return NULL;
    }
    sh->state = 2;
    if (atomic_fetch_sub(&s->shield, 1) == 1) {
        int64_t now = now_ns();
        atomic_fetch_add(&s->gen, 1);
        if (slot_held(s, now))
            return slot_deliver_held(s, now); /* here, synchronously */
        wd_notify(s, atomic_load(&s->deadline), 0);
    }
    Py_RETURN_FALSE;
}
TC_LOCKED_3(PyObject *, Shield_exit, PyObject *, PyObject *const *, Py_ssize_t)

static PyMethodDef Shield_methods[] = {
    {"__enter__", Shield_enter, METH_NOARGS, "Hold interrupts back."},
    {"__exit__", (PyCFunction)(void (*)(void))Shield_exit, METH_FASTCALL,
     "Deliver a held-back interrupt."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot Shield_slots[] = {
    {Py_tp_doc, "Context manager during which deadline interrupts are held back."},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_methods, Shield_methods},
    {0, NULL},
};

static PyType_Spec Shield_spec = {
    "timeoutcore._core.Shield",
    sizeof(Shield),
    0,
    Py_TPFLAGS_DEFAULT,
    Shield_slots,
};

/* ------------------------------------------------------------------------ */
/* Module functions                                                         */

/* sleep(seconds): ends at the current thread's deadline and raises there. */
static PyObject *mod_sleep_locked(PyObject *m, PyObject *arg)
{
    (void)m;
    double secs;
    int64_t target, until, now;
    tc_slot *s = t_slot;
    if (parse_seconds(arg, "sleep()", "seconds", &secs, 1) < 0)
        return NULL;
    if (isnan(secs)) {
        PyErr_SetString(PyExc_TypeError, "sleep(): seconds must be a number, not None");
        return NULL;
    }
    target = now_ns() + (int64_t)(secs * TC_NS_PER_S_F);
    uint32_t raised0 = s != NULL ? atomic_load(&s->raised) : 0;
    for (;;) {
        int64_t dl = TC_NEVER;
        uint32_t seen = 0;
        if (s != NULL) {
            seen = atomic_load(&s->wake);
            if (slot_check(s))
                return NULL;
            if (atomic_load(&s->shield) == 0)
                dl = atomic_load(&s->deadline);
        }
        until = dl < target ? dl : target;
        /* Any return (woken, timed out, EINTR from our kick or another
         * signal) leads to the same checks below. */
        Py_BEGIN_ALLOW_THREADS
        if (s != NULL)
            (void)futex_wait_until(&s->wake, seen, until);
        else {
            struct timespec ts = to_ts(until);
            (void)clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        }
        Py_END_ALLOW_THREADS
        if (PyErr_CheckSignals() < 0)
            return NULL;
        if (slot_check(s))
            return NULL; /* the interrupt, or a soft exception sent meanwhile */
        if (s != NULL && atomic_load(&s->raised) != raised0)
            Py_RETURN_NONE; /* sent asynchronously (no hook): let it land */
        now = now_ns();
        if (now >= target)
            Py_RETURN_NONE;
    }
}
TC_LOCKED_2(PyObject *, mod_sleep, PyObject *, PyObject *)

/* checkpoint(): raise the interrupt here if this thread's deadline has
 * passed (or has fired and was swallowed); else return None.  For waits that
 * end by their own timeout at the deadline. */
static PyObject *mod_checkpoint_locked(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    if (slot_check(t_slot))
        return NULL;
    Py_RETURN_NONE;
}
TC_LOCKED_2(PyObject *, mod_checkpoint, PyObject *, PyObject *)

static PyObject *mod_remaining_locked(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    tc_slot *s = t_slot;
    if (s == NULL || s->top == NULL)
        Py_RETURN_NONE;
    int64_t d = atomic_load(&s->deadline);
    if (d == TC_NEVER)
        Py_RETURN_NONE;
    int64_t r = d - now_ns();
    return PyFloat_FromDouble(r > 0 ? (double)r / TC_NS_PER_S_F : 0.0);
}
TC_LOCKED_2(PyObject *, mod_remaining, PyObject *, PyObject *)

/* current_deadline(): this thread's effective (earliest) deadline as a
 * time.monotonic() value, or None when no scope with a deadline is active. */
static PyObject *mod_current_deadline_locked(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    tc_slot *s = t_slot;
    if (s == NULL || s->top == NULL)
        Py_RETURN_NONE;
    return ns_to_float(atomic_load(&s->deadline));
}
TC_LOCKED_2(PyObject *, mod_current_deadline, PyObject *, PyObject *)

static PyObject *mod_current_locked(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    tc_slot *s = t_slot;
    if (s == NULL || s->top == NULL)
        Py_RETURN_NONE;
    Py_INCREF(s->top);
    return s->top;
}
TC_LOCKED_2(PyObject *, mod_current, PyObject *, PyObject *)

/* _scope_stacks(all): the active scopes, one tuple per thread, outermost
 * first -- of every live thread (all true; cancel_all) or of this thread
 * only (the scope-owned children of timeoutcore._patch_subprocess).  A
 * snapshot: the scopes are referenced first (PyMem, no collection can run
 * and change a stack half-read), the Python objects built after.  The
 * registry's head is read under g_mu; the list behind it is immutable
 * (slots are prepended, never freed).  Each stack is read with the GIL
 * (free-threaded: the core lock and that slot's, tc_lock.h): top and parent
 * are written only under them. */
static PyObject *mod_scope_stacks(PyObject *m, PyObject *arg)
{
    (void)m;
    if (!PyBool_Check(arg)) { /* no __bool__ of a user's object under the core lock */
        PyErr_SetString(PyExc_TypeError, "_scope_stacks(all): all must be a bool");
        return NULL;
    }
    int all = arg == Py_True;
    tc_slot *head = t_slot;
    if (all) {
        pthread_mutex_lock(&g_mu);
        head = g_slots;
        pthread_mutex_unlock(&g_mu);
    }
    size_t cap = 16, n = 0;
    PyObject **refs = PyMem_Malloc(cap * sizeof(PyObject *));
    if (refs == NULL)
        return PyErr_NoMemory();
    /* refs holds, per stack, its depth d (as a tagged count) then d scopes,
     * innermost first. */
    for (tc_slot *s = head; s != NULL; s = all ? s->next : NULL) {
        int failed = 0;
        TC_CORE_BEGIN_ON(s); /* one stack at a time: its slot's lock too */
        if (atomic_load(&s->alive) && s->top != NULL) {
            size_t depth = 0;
            for (PyObject *o = s->top; o != NULL; o = as_scope(o)->parent)
                depth++;
            PyObject **grown = refs;
            if (n + depth + 1 > cap) {
                while (n + depth + 1 > cap)
                    cap *= 2;
                grown = PyMem_Realloc(refs, cap * sizeof(PyObject *));
            }
            if (grown == NULL)
                failed = 1;
            else {
                refs = grown;
                refs[n++] = (PyObject *)((depth << 1) | 1);
                for (PyObject *o = s->top; o != NULL; o = as_scope(o)->parent) {
                    Py_INCREF(o);
                    refs[n++] = o;
                }
            }
        }
        TC_CORE_END();
        if (failed) {
            for (size_t i = 0; i < n; i++)
                if (((uintptr_t)refs[i] & 1) == 0)
                    Py_DECREF(refs[i]);
            PyMem_Free(refs);
            return PyErr_NoMemory();
        }
    }
    PyObject *out = PyList_New(0);
    size_t i = 0;
    while (i < n) {
        size_t depth = (size_t)((uintptr_t)refs[i++] >> 1);
        PyObject *stack = out == NULL ? NULL : PyTuple_New((Py_ssize_t)depth);
        for (size_t k = 0; k < depth; k++) {
            PyObject *o = refs[i + k];
            if (stack != NULL)
                PyTuple_SET_ITEM(stack, (Py_ssize_t)(depth - 1 - k), o); /* steals */
            else
                Py_DECREF(o);
        }
        i += depth;
        if (stack == NULL)
            Py_CLEAR(out);
        else if (PyList_Append(out, stack) < 0)
            Py_CLEAR(out);
        Py_XDECREF(stack);
    }
    PyMem_Free(refs);
    return out;
}

static PyObject *mod_shield(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    return PyObject_CallNoArgs(g_shield_type);
}

/* _set_default_hook(hook or None): every scope created from now on gets it. */
static PyObject *mod_set_default_hook_locked(PyObject *m, PyObject *hook)
{
    (void)m;
    if (hook != Py_None && !PyCallable_Check(hook)) {
        PyErr_SetString(PyExc_TypeError, "the default hook must be callable or None");
        return NULL;
    }
    /* Stored atomically: a new scope looks at it without the core lock
     * while it is NULL (tc_scope.c: Scope_init). */
    PyObject *old = g_default_hook;
    __atomic_store_n(&g_default_hook, hook == Py_None ? NULL : Py_NewRef(hook), __ATOMIC_RELEASE);
    Py_XDECREF(old);
    Py_RETURN_NONE;
}
TC_LOCKED_2(PyObject *, mod_set_default_hook, PyObject *, PyObject *)

/* _raise_in_scope(scope, exc_type) -> bool: raise exc_type asynchronously in
 * the thread running `scope`, if the scope is still active, not shielded and
 * its deadline has not fired.  Atomic with respect to the scope's exit (both
 * hold the GIL); the exit takes back an undelivered one. */
static PyObject *raise_in_scope_locked(PyObject *scope, PyObject *exc)
{
    Scope *sc = as_scope(scope);
    tc_slot *s = sc->slot;
    if (sc->state != SCOPE_ACTIVE || s == NULL || !s->alive || s->ident != sc->ident ||
        atomic_load(&s->shield) > 0 || atomic_load(&s->state) == SLOT_INJECTED)
        Py_RETURN_FALSE; /* not (or no longer) running in a live thread of its own */
#if !TC_FREE_THREADED /* there: `alive` above is the liveness test (tc_lock.h) */
    if (slot_find_tstate(s) == NULL)
        Py_RETURN_FALSE; /* its thread is gone (a stale scope) */
#endif
    sc->soft_pending = 1;
    atomic_fetch_add(&s->raised, 1);
    atomic_store(&s->soft_cls, exc); /* for the unraisable audit hook (tc_unraisable.c) */
    s->soft_scope = scope;
    s->soft_frame = NULL;
    slot_inject(s, exc, scope);
    if (s != t_slot)
        deliver_backstop(s); /* a loop without line events gets its opcode events now
                                (3.11: `while True: pass`): the watchdog's backstop
                                looks at fired slots only */
    Py_RETURN_TRUE;
}
TC_SCOPE_LOCKED_2(PyObject *, raise_in_scope, PyObject *)

static PyObject *mod_raise_in_scope(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *scope, *exc;
    if (!PyArg_ParseTuple(args, "OO:_raise_in_scope", &scope, &exc))
        return NULL;
    if (!PyObject_TypeCheck(scope, (PyTypeObject *)g_scope_type)) {
        PyErr_SetString(PyExc_TypeError, "_raise_in_scope() needs a deadline scope");
        return NULL;
    }
    if (!PyType_Check(exc) || !PyType_IsSubtype((PyTypeObject *)exc,
                                                 (PyTypeObject *)PyExc_BaseException)) {
        PyErr_SetString(PyExc_TypeError, "_raise_in_scope() needs an exception class");
        return NULL;
    }
    return raise_in_scope(scope, exc); /* in the scope's lock and its slot's */
}

static PyObject *mod_setup_locked(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *interrupt, *exceeded;
    if (!PyArg_ParseTuple(args, "OO:_setup", &interrupt, &exceeded))
        return NULL;
    if (g_name_key == NULL && (g_name_key = PyUnicode_InternFromString("__name__")) == NULL)
        return NULL;
    if (guarded_setup() < 0 || interrupt_setup(interrupt) < 0) /* tc_guarded.c, tc_slot.c */
        return NULL;
    Py_INCREF(interrupt);
    Py_XSETREF(g_interrupt, interrupt);
    Py_INCREF(exceeded);
    Py_XSETREF(g_exceeded, exceeded);
    Py_RETURN_NONE;
}
TC_LOCKED_2(PyObject *, mod_setup, PyObject *, PyObject *)

/* Stop and join the watchdog (atexit).  Safe to call more than once. */
static PyObject *mod_shutdown_locked(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    int err = wd_stop();
    hook_idle_off(TC_NEVER); /* free-threaded: no idle events left behind (exit, fork) */
    if (err != 0) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}
TC_LOCKED_2(PyObject *, mod_shutdown, PyObject *, PyObject *)

/* _setup_delivery() -> "trace" | "monitoring": arm the safe-delivery hook
 * (tc_deliver.c).  On failure raises, and delivery stays asynchronous. */
static PyObject *mod_setup_delivery_locked(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    if (g_hook_mode != HOOK_NONE)
        return PyUnicode_FromString(g_hook_mode == HOOK_TRACE ? "trace" : "monitoring");
    if (g_name_key == NULL && (g_name_key = PyUnicode_InternFromString("__name__")) == NULL)
        return NULL;
    if (g_extra < 0)
        g_extra = tc_request_code_extra(NULL); /* -1: no cache, still correct */
    if (g_prot_names == NULL && (g_prot_names = PyTuple_New(0)) == NULL)
        return NULL;
    if (unraisable_setup() < 0 || hook_setup() < 0)
        return NULL;
    g_hook_mode = TC_HOOK_TRACE ? HOOK_TRACE : HOOK_MONITORING;
    return PyUnicode_FromString(g_hook_mode == HOOK_TRACE ? "trace" : "monitoring");
}
TC_LOCKED_2(PyObject *, mod_setup_delivery, PyObject *, PyObject *)

static int all_str(PyObject *tuple)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tuple); i++)
        if (!PyUnicode_Check(PyTuple_GET_ITEM(tuple, i))) {
            PyErr_SetString(PyExc_TypeError, "_set_protection(): module names must be str");
            return 0;
        }
    return 1;
}

/* _set_protection(names, codes, exempt=()): protected modules (a tuple of
 * str: each a module, its submodules included), code objects (a set, or
 * None), and modules under a protected one that are not (tuple of str; the
 * more specific entry wins). */
static PyObject *mod_set_protection_locked(PyObject *m, PyObject *args)
{
    PyObject *names, *codes, *exempt = NULL;
    (void)m;
    if (!PyArg_ParseTuple(args, "O!O|O!:_set_protection", &PyTuple_Type, &names, &codes,
                          &PyTuple_Type, &exempt))
        return NULL;
    if (!all_str(names) || (exempt != NULL && !all_str(exempt)))
        return NULL;
    if (codes != Py_None && !PyAnySet_Check(codes)) {
        PyErr_SetString(PyExc_TypeError, "_set_protection(): codes must be a set or None");
        return NULL;
    }
    Py_INCREF(names);
    Py_XSETREF(g_prot_names, names);
    Py_XINCREF(exempt);
    Py_XSETREF(g_exempt_names, exempt);
    if (codes == Py_None)
        Py_CLEAR(g_prot_codes);
    else {
        Py_INCREF(codes);
        Py_XSETREF(g_prot_codes, codes);
    }
    g_prot_gen++; /* every cached verdict is stale now */
    Py_RETURN_NONE;
}
TC_LOCKED_2(PyObject *, mod_set_protection, PyObject *, PyObject *)

/* _set_deferral_report(report, cap): call report(scope) at the exit of a
 * scope whose interrupt waited longer than `cap` seconds for protected
 * code (once per scope, shielded); report None turns it off. */
static PyObject *mod_set_deferral_report_locked(PyObject *m, PyObject *args)
{
    PyObject *report;
    double cap;
    (void)m;
    if (!PyArg_ParseTuple(args, "Od:_set_deferral_report", &report, &cap))
        return NULL;
    if (report != Py_None && !PyCallable_Check(report)) {
        PyErr_SetString(PyExc_TypeError, "_set_deferral_report(): report must be callable");
        return NULL;
    }
    if (!(cap >= 0.0 && cap < 1e9)) {
        PyErr_SetString(PyExc_ValueError, "_set_deferral_report(): cap must be >= 0 seconds");
        return NULL;
    }
    g_defer_cap_ns = (int64_t)(cap * 1e9);
    if (report == Py_None)
        Py_CLEAR(g_defer_report);
    else {
        Py_INCREF(report);
        Py_XSETREF(g_defer_report, report);
    }
    Py_RETURN_NONE;
}
TC_LOCKED_2(PyObject *, mod_set_deferral_report, PyObject *, PyObject *)

static PyObject *mod_delivery_mode_locked(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    return PyUnicode_FromString(g_hook_mode == HOOK_TRACE        ? "trace"
                                : g_hook_mode == HOOK_MONITORING ? "monitoring"
                                                                 : "async");
}
TC_LOCKED_2(PyObject *, mod_delivery_mode, PyObject *, PyObject *)

/* _anticipation() -> (lead, switch, crowd) in seconds: how long before a
 * deadline the watchdog asks for the GIL, the switch interval it plans with,
 * and how much longer than that it has lately waited (accel_anticipation.c;
 * the lead includes it, capped). */
static PyObject *mod_anticipation(PyObject *m, PyObject *unused)
{
    int64_t lead, sw, crowd;
    (void)m;
    (void)unused;
    anticipation_figures(&lead, &sw, &crowd);
    return Py_BuildValue("(ddd)", (double)lead / TC_NS_PER_S_F, (double)sw / TC_NS_PER_S_F,
                         (double)crowd / TC_NS_PER_S_F);
}

/* _events_cost() -> (prearm lead, switch cost) in seconds: how long before a
 * deadline the watchdog arms the hook free-threaded (0 with a GIL), and how
 * long switching the delivery events on or off lately took (tc_deliver.c:
 * g_events_cost_ns; 0 on 3.11, which has no events to switch). */
static PyObject *mod_events_cost(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    return Py_BuildValue("(dd)", (double)prearm_lead() / TC_NS_PER_S_F,
                         (double)atomic_load(&g_events_cost_ns) / TC_NS_PER_S_F);
}

static PyObject *mod_watchdog_running_locked(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    return PyBool_FromLong(wd_running());
}
TC_LOCKED_2(PyObject *, mod_watchdog_running, PyObject *, PyObject *)

/* Start the watchdog again if any live slot has an armed deadline (after a
 * fork, in parent or child).  GIL held. */
static PyObject *mod_ensure_watchdog_locked(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    int need = 0;
    tc_slot *dead = NULL;
    pthread_mutex_lock(&g_mu);
    for (tc_slot *s = g_slots; s != NULL; s = s->next) {
        if (s->alive && atomic_load(&s->deadline) != TC_NEVER)
            need = 1;
        if (!s->alive && (s->pending != NULL || s->hooked) && dead == NULL)
            dead = s;
    }
    pthread_mutex_unlock(&g_mu);
    /* A delivery that was pending in a thread that did not survive the fork
     * (or has exited) is withdrawn, so the delivery hook -- on 3.12+ the
     * process-wide monitoring events -- does not stay armed for ever.  One
     * per pass, outside g_mu (deliver_cancel may call Python). */
    while (dead != NULL) {
        (void)deliver_cancel(dead);
        dead = NULL;
        pthread_mutex_lock(&g_mu);
        for (tc_slot *s = g_slots; s != NULL && dead == NULL; s = s->next)
            if (!s->alive && (s->pending != NULL || s->hooked))
                dead = s;
        pthread_mutex_unlock(&g_mu);
    }
    hook_idle_off(TC_NEVER); /* free-threaded: those deliveries' events go now */
    if (need && wd_ensure(0) < 0)
        return NULL;
    Py_RETURN_NONE;
}
TC_LOCKED_2(PyObject *, mod_ensure_watchdog, PyObject *, PyObject *)

/* _wait_readable(fd, timeout, control=False) -> bool: wait, without the
 * GIL, until `fd` is readable (or hung up, or invalid) or `timeout` seconds
 * have passed; when it is ready, take the GIL back *urgently*: the watchdog
 * opens the fast window (accel_fast_window.c: wd_urgent_begin), so that in a busy
 * process this thread gets the GIL after a fast switch interval, not a
 * whole one, and keeps it open until this thread's next _wait_readable (or
 * TC_URGENT_MAX_NS).  With `control` (the registry's subscriber socket), the
 * bytes that made it ready are first peeked at for cancels of armed scopes
 * (accelerator remote_relay: remote_relay_on_readable), which are applied
 * at once, without the GIL; if that was all there was, the GIL is taken
 * back without urgency, once the cancelled jobs have had it.  True
 * if fd was ready; False after the timeout or an interrupted poll (the
 * caller loops).  For a thread with urgent work and no deadline of its own:
 * it touches no slot, so a scope around it does not shorten the wait. */
static PyObject *mod_wait_readable(PyObject *m, PyObject *args)
{
    (void)m;
    int fd, r, err = 0, control = 0;
    double timeout;
    if (!PyArg_ParseTuple(args, "id|p:_wait_readable", &fd, &timeout, &control))
        return NULL;
    if (fd < 0) {
        PyErr_Format(PyExc_ValueError, "_wait_readable(): fd must be >= 0, not %d", fd);
        return NULL;
    }
    if (!(timeout >= 0.0 && timeout <= 86400.0)) {
        PyErr_SetString(PyExc_ValueError, "_wait_readable(): timeout must be 0 to 86400 s");
        return NULL;
    }
    struct pollfd p = {.fd = fd, .events = POLLIN, .revents = 0};
    wd_urgent_end(); /* the work since the last ready fd is done */
    Py_BEGIN_ALLOW_THREADS
    r = poll(&p, 1, (int)ceil(timeout * 1e3));
    if (r < 0)
        err = errno;
    else if (r > 0 && control && remote_relay_on_readable(fd))
        ; /* nothing urgent left: the jobs go first */
    else if (r > 0)
        wd_urgent_begin();
    Py_END_ALLOW_THREADS
    if (r < 0 && err != EINTR) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyBool_FromLong(r > 0);
}

/* _remote_arm(scope, token): let a cancel naming `token` on the registry's
 * control channel stop `scope` without waiting for the GIL (accel_remote_relay.c).
 * Called in the thread that enters it, before it does. */
static PyObject *mod_remote_arm_locked(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *scope, *token;
    if (!PyArg_ParseTuple(args, "OO:_remote_arm", &scope, &token) || remote_arm(scope, token) < 0)
        return NULL;
    Py_RETURN_NONE;
}
TC_LOCKED_2(PyObject *, mod_remote_arm, PyObject *, PyObject *)

/* _remote_disarm(scope) -> bool: the arm taken back (False: there was none). */
static PyObject *mod_remote_disarm(PyObject *m, PyObject *scope)
{
    (void)m;
    return PyBool_FromLong(remote_disarm(scope));
}

/* _remote_forget(): drop every arm (in a fork child: the parent's jobs). */
static PyObject *mod_remote_forget(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    remote_forget();
    Py_RETURN_NONE;
}

static PyMethodDef mod_methods[] = {
    {"sleep", mod_sleep, METH_O,
     "sleep(seconds): like time.sleep, but ends at this thread's deadline and raises there."},
    {"checkpoint", mod_checkpoint, METH_NOARGS,
     "checkpoint(): raise here if this thread's deadline has passed; else None."},
    {"remaining", mod_remaining, METH_NOARGS,
     "Seconds left before this thread's earliest deadline, or None when unguarded."},
    {"current_deadline", mod_current_deadline, METH_NOARGS,
     "This thread's earliest deadline as a time.monotonic() value, or None."},
    {"current_scope", mod_current, METH_NOARGS,
     "The innermost active scope of this thread, or None."},
    {"shield", mod_shield, METH_NOARGS,
     "shield(): a context manager holding deadline interrupts back until it exits."},
    {"_setup", mod_setup, METH_VARARGS, "Register the exception classes."},
    {"_set_default_hook", mod_set_default_hook, METH_O, "Hook given to every new scope."},
    {"_raise_in_scope", mod_raise_in_scope, METH_VARARGS,
     "Raise an exception class in the thread running an active scope."},
    {"_scope_stacks", mod_scope_stacks, METH_O,
     "_scope_stacks(all): active scopes, a tuple per thread, outermost first."},
    {"_shutdown", mod_shutdown, METH_NOARGS, "Stop and join the watchdog."},
    {"_setup_delivery", mod_setup_delivery, METH_NOARGS,
     "Arm the safe-delivery hook; returns 'trace' or 'monitoring'."},
    {"_set_protection", mod_set_protection, METH_VARARGS,
     "Protected modules (tuple of str), code objects (set or None), exempt modules."},
    {"_set_deferral_report", mod_set_deferral_report, METH_VARARGS,
     "report(scope) at exit when its interrupt waited > cap s for protected code."},
    {"_delivery_mode", mod_delivery_mode, METH_NOARGS,
     "'trace' or 'monitoring' (safe delivery), or 'async' (fallback)."},
    {"_anticipation", mod_anticipation, METH_NOARGS,
     "(lead, switch interval, crowd) in seconds, as the watchdog plans with them."},
    {"_events_cost", mod_events_cost, METH_NOARGS,
     "(pre-arm lead, recent cost of switching delivery events) in seconds."},
    {"_watchdog_running", mod_watchdog_running, METH_NOARGS, "Whether the watchdog runs."},
    {"_ensure_watchdog", mod_ensure_watchdog, METH_NOARGS,
     "Start the watchdog if an armed deadline needs it (after fork)."},
    {"_wait_readable", mod_wait_readable, METH_VARARGS,
     "Wait until fd is readable, then take the GIL back urgently (fast window); "
     "control=True: apply the cancels it carries for armed scopes first."},
    {"_remote_arm", mod_remote_arm, METH_VARARGS,
     "_remote_arm(scope, token): a control-channel cancel naming token stops scope."},
    {"_remote_disarm", mod_remote_disarm, METH_O, "Take a scope's remote arm back."},
    {"_remote_forget", mod_remote_forget, METH_NOARGS, "Drop every remote arm (fork child)."},
    {NULL, NULL, 0, NULL},
};
