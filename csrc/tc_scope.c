/*
 * tc_scope.c -- the Scope type behind thread_deadline(): argument parsing,
 * construction, __enter__ and __exit__.  Part of the unity build
 * (timeoutcore.c); its other methods, the read-only views and the type's
 * spec follow in tc_scope_views.c.
 *
 * __enter__ and __exit__ run in the guarded thread with the GIL and never
 * release it between "the block finished" and "disarmed, pending interrupt
 * taken back": no bytecode runs there, so the interrupt cannot surface after
 * the block.  The only Python code they call is the scope's hook, before
 * arming (enter) and after disarming, shielded (exit), and DeadlineExceeded's
 * constructor at the very end.
 * Free-threaded: __enter__ and __exit__ run inside the core lock, which is
 * let go around those three calls as the GIL could be -- or, when
 * enter_is_plain / exit_is_plain hold, inside the scope's and its slot's
 * locks alone, which none of those calls needs (the per-block path,
 * tc_lock.h).  Scope_init takes the core lock only to read a default hook.
 */

/* Parse a positive finite number of seconds; NULL/None -> NAN.  Names the
 * argument in the error. */
static int parse_seconds(PyObject *o, const char *fn, const char *arg, double *out,
                         int allow_zero)
{
    double v;
    if (o == NULL || o == Py_None) {
        *out = NAN;
        return 0;
    }
    if (PyBool_Check(o) || !(PyFloat_Check(o) || PyLong_Check(o))) {
        PyErr_Format(PyExc_TypeError,
                     "%s: %s must be a number of seconds (int or float) or None, not %.100s",
                     fn, arg, Py_TYPE(o)->tp_name);
        return -1;
    }
    v = PyFloat_AsDouble(o);
    if (v == -1.0 && PyErr_Occurred())
        return -1;
    if (!isfinite(v) || v < 0 || (!allow_zero && v == 0)) {
        PyErr_Format(PyExc_ValueError, "%s: %s must be a %s finite number of seconds, got %R",
                     fn, arg, allow_zero ? "non-negative" : "positive", o);
        return -1;
    }
    if (v > TC_MAX_SECONDS) {
        PyErr_Format(PyExc_ValueError, "%s: %s is too large (%R s; at most 3e8)", fn, arg, o);
        return -1;
    }
    *out = v;
    return 0;
}

/* Absolute time.monotonic() value -> ns. */
static int parse_when(PyObject *o, const char *fn, int64_t *out)
{
    double v;
    if (PyBool_Check(o) || !(PyFloat_Check(o) || PyLong_Check(o))) {
        PyErr_Format(PyExc_TypeError,
                     "%s: when must be a time.monotonic() value (int or float), not %.100s", fn,
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    v = PyFloat_AsDouble(o);
    if (v == -1.0 && PyErr_Occurred())
        return -1;
    if (!isfinite(v) || v < 0 || v > TC_MAX_MONOTONIC) {
        PyErr_Format(PyExc_ValueError, "%s: when must be a finite time.monotonic() value, got %R",
                     fn, o);
        return -1;
    }
    *out = (int64_t)llround(v * TC_NS_PER_S_F);
    return 0;
}

static int Scope_init(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"seconds", "label", "raise_on_timeout", "deadline", NULL};
    PyObject *seconds = Py_None, *label = Py_None, *deadline = Py_None;
    int raise_on_timeout = 1;
    Scope *sc = as_scope(self);
    double v;

    PyObject *known = kw, *extras = NULL;
    int r;

    if (sc->state != SCOPE_NEW || sc->entered != 0) {
        PyErr_SetString(PyExc_RuntimeError, "a deadline scope cannot be re-initialised");
        return -1;
    }
    if (kw != NULL && PyDict_GET_SIZE(kw) > 0) {
        /* Keywords this type does not know (soft=..., on_soft=...) go to the
         * Python subclass's _init_extras(); the plain path stays in C. */
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        while (PyDict_Next(kw, &pos, &key, &value)) {
            int is_known = 0;
            for (char **k = kwlist; *k != NULL; k++)
                if (PyUnicode_CompareWithASCIIString(key, *k) == 0)
                    is_known = 1;
            if (is_known)
                continue;
            if (extras == NULL) {
                if ((extras = PyDict_New()) == NULL || (known = PyDict_Copy(kw)) == NULL)
                    goto fail;
            }
            if (PyDict_SetItem(extras, key, value) < 0 || PyDict_DelItem(known, key) < 0)
                goto fail;
        }
    }
    r = PyArg_ParseTupleAndKeywords(args, known, "|O$OpO:thread_deadline", kwlist, &seconds,
                                    &label, &raise_on_timeout, &deadline);
    if (known != kw)
        Py_DECREF(known);
    known = kw;
    if (!r)
        goto fail;
    if (parse_seconds(seconds, "thread_deadline()", "seconds", &v, 0) < 0)
        goto fail;
    if (label != Py_None && !PyUnicode_Check(label)) {
        PyErr_Format(PyExc_TypeError, "thread_deadline(): label must be a str or None, not %.100s",
                     Py_TYPE(label)->tp_name);
        goto fail;
    }
    sc->seconds = v;
    sc->deadline = TC_NEVER;
    sc->has_deadline_arg = 0;
    if (deadline != Py_None) {
        if (!isnan(v)) {
            PyErr_SetString(PyExc_TypeError,
                            "thread_deadline(): give either seconds or deadline, not both");
            goto fail;
        }
        if (parse_when(deadline, "thread_deadline_at()", &sc->deadline) < 0)
            goto fail;
        sc->has_deadline_arg = 1;
    }
    sc->raise_on_timeout = raise_on_timeout;
    Py_INCREF(label);
    Py_XSETREF(sc->label, label);
    if (__atomic_load_n(&g_default_hook, __ATOMIC_ACQUIRE) != NULL) {
        /* Only then the core lock (g_default_hook may be replaced
         * meanwhile): threads that make scopes share no lock here. */
        TC_CORE_BEGIN();
        Py_XINCREF(g_default_hook);
        Py_XSETREF(sc->hook, g_default_hook);
        TC_CORE_END();
    }
    else
        Py_CLEAR(sc->hook);
    if (extras != NULL) {
        PyObject *res = PyObject_CallMethod(self, "_init_extras", "O", extras);
        Py_DECREF(extras);
        if (res == NULL)
            return -1;
        Py_DECREF(res);
    }
    return 0;
fail:
    if (known != kw)
        Py_XDECREF(known); /* NULL when PyDict_Copy failed */
    Py_XDECREF(extras);
    return -1;
}

static int Scope_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(as_scope(self)->label);
    Py_VISIT(as_scope(self)->parent);
    Py_VISIT(as_scope(self)->hook);
    Py_VISIT(as_scope(self)->exit_exc);
    Py_VISIT(as_scope(self)->frame);
    Py_VISIT(as_scope(self)->owner);
    Py_VISIT(as_scope(self)->deferred_where);
    Py_VISIT(prepare_peek(as_scope(self)));
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static int Scope_clear(PyObject *self)
{
    Py_CLEAR(as_scope(self)->label);
    Py_CLEAR(as_scope(self)->parent);
    Py_CLEAR(as_scope(self)->hook);
    Py_CLEAR(as_scope(self)->exit_exc);
    Py_CLEAR(as_scope(self)->frame);
    Py_CLEAR(as_scope(self)->owner);
    Py_CLEAR(as_scope(self)->deferred_where);
    prepare_drop(as_scope(self));
    return 0;
}

static void Scope_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    Scope_clear(self);
    tp->tp_free(self);
#if !TC_FREE_THREADED /* a static type there: subtype_dealloc drops a subclass's */
    Py_DECREF(tp);
#endif
}

static PyObject *Scope_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *self = PyType_GenericNew(type, args, kw);
    if (self != NULL) {
        Scope *sc = as_scope(self);
        sc->seconds = NAN;
        sc->deadline = TC_NEVER;
        sc->raise_on_timeout = 1;
        Py_INCREF(Py_None);
        sc->label = Py_None;
    }
    return self;
}

/* A scope entered a second time: the error, and 1; 0 if it is new. */
static int scope_not_new(Scope *sc)
{
    if (sc->state == SCOPE_NEW)
        return 0;
    PyErr_SetString(PyExc_RuntimeError,
                    sc->state == SCOPE_ACTIVE
                        ? "this deadline scope is already active; scopes are not re-entrant"
                        : "this deadline scope was already used; scopes are not reusable "
                          "(create a new one, or use it as a decorator)");
    return 1;
}

/* What __exit__ was given (__enter__: nothing). */
typedef struct {
    PyObject *const *args;
    Py_ssize_t nargs;
} scope_args;

/* The entry, in the entering thread, inside the core lock or (all of
 * enter_is_plain holding) the per-block path's locks.  `now`: the time of
 * entry, or 0 to read it after the scope's hook. */
static PyObject *scope_enter(PyObject *self, const scope_args *a, int64_t now)
{
    (void)a;
    Scope *sc = as_scope(self);
    tc_slot *s;

    if (scope_not_new(sc))
        return NULL;
    /* The first block with a deadline starts the watchdog -- before anything
     * of the block is set up or its time counts: wd_ensure lets the GIL go
     * until the watchdog is ready (another thread may enter this same scope
     * meanwhile: look again).  (The per-block path found it running.) */
    if (now == 0 && !wd_running() &&
        (sc->has_deadline_arg ? sc->deadline != TC_NEVER : !isnan(sc->seconds))) {
        if (wd_ensure(1) < 0 || scope_not_new(sc))
            return NULL;
    }
    s = t_slot;
    if (s == NULL && (s = slot_get()) == NULL)
        return NULL;
    self_fire_on_enter(s); /* free-threaded: its trigger for this deadline */
    PyThreadState *me = PyThreadState_Get();
#if !TC_FREE_THREADED /* there another thread's state is never looked up */
    slot_note_tstate(s, me); /* tc_internal.h */
#endif
    /* The with statement's frame: its address (accelerator), or else its
     * object, made now if it has none (the core: public API). */
    int enters = frame_address_enter(&sc->frame_address, me);
    if (enters < 0) {
        PyFrameObject *f = PyEval_GetFrame(); /* borrowed */
        enters = frame_code_enters(f); /* tc_guarded.c */
#if TC_TRACK_FRAMES
        if (s->top != NULL) {
            Py_XINCREF(f);
            if (slot_prune_stale(s, f))
                slot_publish(s);
        }
#endif
        Py_XINCREF(f);
        Py_XSETREF(sc->frame, (PyObject *)f);
    }
    if (enters)
        scope_find_owner(sc); /* tc_guarded.c: wrapper scopes */
    if (s->top != NULL && atomic_load(&s->state) == SLOT_INJECTED && s->fired != NULL &&
        s->pending == NULL && PyErr_Occurred() == NULL) {
        /* An enclosing scope has fired and the body carried on (it swallowed
         * the interrupt).  Nothing new may start inside it: raise again. */
        return slot_raise_here(s);
    }
    if (sc->hook != NULL) {
        /* Before anything is armed: if the hook fails, nothing is left. */
        PyObject *hook = sc->hook, *r;
        Py_INCREF(hook);
        tc_yielded y = core_yield();
        r = PyObject_CallFunction(hook, "OsO", self, "enter", Py_None);
        core_resume(y);
        Py_DECREF(hook);
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
    }
    if (now == 0)
        now = now_ns();
    if (!sc->has_deadline_arg)
        sc->deadline = isnan(sc->seconds) ? TC_NEVER : now + (int64_t)(sc->seconds * TC_NS_PER_S_F);
    sc->entered = now;
    sc->state = SCOPE_ACTIVE;
    sc->slot = s;
    sc->ident = s->ident;
    sc->native_id = s->tid;
    Py_XSETREF(sc->parent, s->top); /* steals the slot's reference */
    Py_INCREF(self);
    s->top = self;
    if (sc->deadline <= now && atomic_load(&s->shield) == 0) {
        /* Already past (cancelled before entry, a deadline in the past): fire
         * now, as the watchdog would.  Raising here would escape (the with
         * statement has not started its block yet), so the interrupt goes
         * pending: it is raised at the block's first safe line boundary, or
         * claimed at its exit.  Left to the watchdog's next pass, a body that
         * ends first would end normally. */
        slot_publish(s);
        (void)slot_fire(s, now, 0);
    }
    else {
        int64_t was = atomic_load(&s->deadline);
        slot_deadline_set(s, sc->deadline < was ? sc->deadline : was, now, 1);
    }
    Py_INCREF(self);
    return self;
}

/* May this entry take the per-block path (tc_lock.h): under the scope's
 * and its slot's locks, at `now`, does scope_enter touch nothing shared?
 * No hook to call, no watchdog to start, no interrupt on the slot to raise
 * again, and no deadline already past (it would fire). */
static int enter_is_plain(Scope *sc, tc_slot *s, const scope_args *a, int64_t now)
{
    (void)a;
    if (sc->state != SCOPE_NEW || sc->hook != NULL || s->fired != NULL ||
        atomic_load(&s->state) == SLOT_INJECTED)
        return 0;
    if (sc->has_deadline_arg)
        return sc->deadline == TC_NEVER || (sc->deadline > now && wd_running());
    return isnan(sc->seconds) || wd_running();
}

/* Run `step` (scope_enter, scope_exit) for `self` in its own thread: on the
 * per-block path if `plain` says it may, decided under that path's locks
 * with the time it gives the step; else inside the core lock, the step
 * reading the time itself.  With the GIL, always the latter (no lock). */
static PyObject *scope_run(PyObject *self, const scope_args *a,
                           int (*plain)(Scope *, tc_slot *, const scope_args *, int64_t),
                           PyObject *(*step)(PyObject *, const scope_args *, int64_t))
{
    PyObject *r;
#if TC_FREE_THREADED
    tc_slot *s = t_slot;
    /* A scope with a hook never takes the per-block path (both tests say
     * so under its locks); this look without them only spares a hooked
     * block -- every block, with metrics on -- taking them for nothing. */
    if (s != NULL && __atomic_load_n(&as_scope(self)->hook, __ATOMIC_RELAXED) == NULL) {
        int fast;
        TC_OWN_BEGIN(as_scope(self), s);
        int64_t now = now_ns();
        fast = plain(as_scope(self), s, a, now);
        r = fast ? step(self, a, now) : NULL;
        TC_CORE_END();
        if (fast)
            return r;
    }
#else
    (void)plain;
#endif
    TC_CORE_BEGIN();
    r = step(self, a, 0);
    TC_CORE_END();
    return r;
}

static PyObject *Scope_enter(PyObject *self, PyObject *unused)
{
    scope_args a = {NULL, 0};
    (void)unused;
    return scope_run(self, &a, enter_is_plain, scope_enter);
}

/* Was the scope cancel()led (its Python class's `_cancelled`, which makes
 * the exception a DeadlineCancelled)?  1, 0, or -1 with an error set. */
static int scope_cancelled(PyObject *self)
{
    PyObject *v = NULL, *name = str_cancelled();
    int r;
    if (name == NULL)
        return -1;
    if ((r = tc_optional_attr(self, name, &v)) <= 0)
        return r;
    r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* Build DeadlineExceeded for `self` and set it as the current error. */
static void raise_exceeded(PyObject *self, int interrupt_was_in_flight, PyObject *exc)
{
    /* Prepared ahead (accelerator prepare): only its figures are taken again
     * (its __init__, as the constructor would), which skips the allocation,
     * and runs code the watchdog has just run -- the exit of a block that
     * spun for a while otherwise finds all of it cold (building the
     * exception then costs many times what it costs warm).  Without one, or if the scope was
     * cancelled since (a cancel meeting the exit: the class changes), it is
     * built here.  Steals `exc` (the scope's `prepared`, taken at its exit). */
    PyObject *args = NULL;
    int failed = 0;
    if (exc != NULL && scope_cancelled(self) != 0) {
        failed = PyErr_Occurred() != NULL;
        Py_CLEAR(exc);
    }
    tc_yielded y = core_yield(); /* Python code; the scope is done, nothing armed for it */
    if (exc != NULL && ((args = PyTuple_Pack(1, self)) == NULL ||
                        Py_TYPE(exc)->tp_init(exc, args, NULL) < 0)) {
        failed = 1;
        Py_CLEAR(exc);
    }
    Py_XDECREF(args);
    if (exc == NULL) {
        if (failed)
            PyErr_Clear(); /* the constructor below reports the same failure */
        exc = PyObject_CallFunctionObjArgs(g_exceeded, self, NULL);
    }
    core_resume(y);
    if (exc == NULL)
        return;
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc); /* a subclass when cancelled */
    if (interrupt_was_in_flight) {
        /* "raise DeadlineExceeded from None": the internal interrupt is noise. */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        PyErr_NormalizeException(&et, &ev, &tb);
        if (ev != NULL)
            PyException_SetCause(ev, NULL);
        PyErr_Restore(et, ev, tb);
    }
    Py_DECREF(exc);
}

/* Call the scope's hook at exit -- hook(scope, "exit", exc), or with `exc`
 * NULL the deferral report, report(scope) -- shielded: the block is over, no
 * deadline interrupt may land in it.  A failing hook is reported as
 * unraisable.  Returns 1 if an enclosing scope's interrupt was held back
 * meanwhile. */
static int run_exit_hook(tc_slot *s, PyObject *hook, PyObject *self, PyObject *exc)
{
    PyObject *r, *et, *ev, *tb;
    int held;
    atomic_fetch_add(&s->shield, 1);
    if (s->fired != NULL && atomic_load(&s->state) == SLOT_INJECTED)
        slot_take_back(s);
    PyErr_Fetch(&et, &ev, &tb);
    Py_INCREF(hook);
    tc_yielded y = core_yield(); /* shielded: nothing is raised into the thread meanwhile */
    r = exc != NULL ? PyObject_CallFunction(hook, "OsO", self, "exit", exc)
                    : PyObject_CallOneArg(hook, self);
    core_resume(y);
    if (r == NULL)
        PyErr_WriteUnraisable(hook);
    Py_XDECREF(r);
    Py_DECREF(hook);
    PyErr_Restore(et, ev, tb);
    atomic_fetch_sub(&s->shield, 1);
    atomic_fetch_add(&s->gen, 1);
    /* Inside an enclosing shield nothing is held here: that shield's exit
     * delivers it. */
    held = atomic_load(&s->shield) == 0 && slot_held(s, now_ns());
    if (!held)
        wd_notify(s, atomic_load(&s->deadline), 0);
    return held;
}

/* The exit, in the entering thread, inside the core lock or (all of
 * exit_is_plain holding) the per-block path's locks; `now`: the time of
 * exit, or 0 to read it here. */
static PyObject *scope_exit(PyObject *self, const scope_args *a, int64_t now)
{
    PyObject *const *args = a->args;
    Py_ssize_t nargs = a->nargs;
    Scope *sc = as_scope(self);
    tc_slot *s = t_slot;
    PyObject *exc_type = nargs > 0 ? args[0] : Py_None;
    int claimed = 0, in_flight;

    if (sc->state != SCOPE_ACTIVE) {
        PyErr_SetString(PyExc_RuntimeError, "__exit__ of a deadline scope that is not active");
        return NULL;
    }
    if (s == NULL || sc->slot != s) {
        PyErr_SetString(PyExc_RuntimeError,
                        "a deadline scope must be exited in the thread that entered it");
        return NULL;
    }
    /* From here to the end no bytecode runs and the GIL is never released:
     * the interrupt cannot land after this point. */
    if (now == 0)
        now = now_ns();
    if (stack_pop_stale_above(s, self) > 0)
        slot_publish(s); /* a fired one among them left the slot IDLE: ARMED
                          * again (this scope is still on the stack) before
                          * the backstop below may fire it */
    s->top = sc->parent; /* the slot's reference moves to the parent */
    sc->parent = NULL;
    sc->state = SCOPE_DONE;
    sc->exited = now;
    sc->slot = NULL;
    Py_CLEAR(sc->frame); /* no finalizer can run: the with statement holds it */
    Py_CLEAR(sc->owner); /* ... and the guarded code's frame is running */
    /* raise_exceeded takes it; any other way out drops it (it holds the scope:
     * a cycle, until then) -- an exception has no finalizer */
    PyObject *prepared = prepare_take(sc);
    frame_address_leave(&sc->frame_address);
    if (atomic_load(&s->prearmed) && s->pending == NULL) {
        /* ended before its deadline, or before the thread fired it: what
         * the watchdog armed ahead goes (tc_deliver.c: pre-armed slots) */
        (void)deliver_cancel(s);
    }
    if (s->fired == NULL && sc->deadline <= now && atomic_load(&s->shield) == 0 &&
        (s->top == NULL || stack_due(s->top, now) == NULL)) {
        /* The backstop: a block still running when its deadline passed ends
         * expired, even if nobody fired it -- the watchdog or the self-fire
         * may reach the thread only after this exit (a C call that held the
         * GIL to the block's end, next to a busy thread).  Marked fired
         * here, it is claimed below as any fire that met the exit.  Not
         * inside a shield (what a shield holds, nothing fires), and not when
         * an enclosing scope is due too: that one fires below, the outermost
         * due scope first, as everywhere. */
        s->fired = self;
        sc->expired = 1;
        sc->fired_at = now;
        slot_to(s, SLOT_INJECTED);
        STAT_INC(exit_expiries);
    }
    if (s->fired == self) {
        claimed = 1;
        slot_claim(s);
        /* The window stays open while the exit hooks run: they may do I/O
         * (the Redis registry deletes the job's key: a round trip whose two
         * GIL hand-backs cost whole switch intervals next to busy threads,
         * and the cancelled job's block exited long after it had stopped) */
        atomic_store(&s->exit_until, now + TC_FAST_HOLD_NS);
    }
    if (sc->soft_pending) {
        /* A soft-limit exception raised into the block and not delivered
         * must not land after it.  (A pending interrupt of an enclosing scope
         * cleared with it is raised again by the watchdog.) */
        sc->soft_pending = 0;
        if (s->pending_scope == self || s->async_pending)
            slot_take_back(s);
    }
    slot_publish(s);
    if (nargs > 1 && args[1] != Py_None) {
        Py_INCREF(args[1]);
        Py_XSETREF(sc->exit_exc, args[1]);
    }
    in_flight = exc_type != Py_None && PyType_Check(exc_type) &&
                PyObject_IsSubclass(exc_type, g_interrupt) == 1;
    if (in_flight && sc->expired && sc->delivered_at == 0)
        sc->delivered_at = now; /* sent asynchronously (tc_deliver.c): surfaced by now */
    int held = 0;
    if (g_defer_report != NULL && sc->deferred_where != NULL && sc->deferred_ns > g_defer_cap_ns)
        held = run_exit_hook(s, g_defer_report, self, NULL);
    /* the scope's own hook runs either way (cleanups, soft timer, results) */
    if (sc->hook != NULL && run_exit_hook(s, sc->hook, self, nargs > 1 ? args[1] : Py_None))
        held = 1;
    if (!claimed || !sc->raise_on_timeout || held)
        Py_CLEAR(prepared);
    if (held) {
        atomic_store(&s->exit_until, 0); /* what it holds for is over */
        /* an enclosing deadline passed while the hook ran (shielded): deliver it
         * now, and make it fire first if the watchdog held off, so that the
         * enclosing scope claims its interrupt at its own exit */
        Py_DECREF(self);
        return slot_deliver_held(s, now_ns());
    }
    if (!claimed && s->top != NULL && stack_due(s->top, now) != NULL && s->fired == NULL &&
        atomic_load(&s->shield) == 0) {
        /* An enclosing deadline passed meanwhile: it fires now, here. */
        Py_DECREF(self);
        slot_fire(s, now, 1);
        return NULL;
    }
    Py_DECREF(self); /* the slot's reference */
    if (claimed) {
        PyObject *r = NULL;
        if (sc->raise_on_timeout)
            raise_exceeded(self, in_flight, prepared);
        else /* abandon silently: swallow our interrupt, never the block's own error */
            r = Py_NewRef(exc_type == Py_None || in_flight ? Py_True : Py_False);
        /* Last, and not at once: the exception's construction runs Python,
         * and so does the caller up to its handler; a thread that gives the
         * GIL away there (a waiter's drop request) must get it back within
         * the window, not after a whole interval behind every busy thread
         * (with the window closed at the claim, at the exit's return or
         * while the exception was built, blocks that left on time reached
         * the caller's `except` several intervals later).  So the window holds while it is
         * built, and lingers if the thread is about to give the GIL away
         * (fast_after_claim). */
        fast_after_claim(s);
        return r;
    }
    Py_RETURN_FALSE;
}

/* May this exit take the per-block path (tc_lock.h): under the scope's and
 * its slot's locks, at `now`, does scope_exit touch nothing shared?  The
 * block ends normally, innermost, before its deadline, with no hook or
 * deferral report to run, nothing fired, pending, pre-armed or raised into
 * it, and no enclosing deadline past (it would fire). */
static int exit_is_plain(Scope *sc, tc_slot *s, const scope_args *a, int64_t now)
{
    if (sc->state != SCOPE_ACTIVE || sc->slot != s || s->top != (PyObject *)sc ||
        (a->nargs > 0 && a->args[0] != Py_None) || sc->hook != NULL || sc->deadline <= now ||
        sc->soft_pending || sc->deferred_where != NULL || sc->prepare.exc != NULL)
        return 0;
    if (s->fired != NULL || s->pending != NULL || s->async_pending ||
        atomic_load(&s->prearmed) || atomic_load(&s->state) == SLOT_INJECTED)
        return 0;
    return sc->parent == NULL || stack_due(sc->parent, now) == NULL;
}

static PyObject *Scope_exit(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    scope_args a = {args, nargs};
    return scope_run(self, &a, exit_is_plain, scope_exit);
}
