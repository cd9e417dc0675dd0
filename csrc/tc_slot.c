/*
 * tc_slot.c -- per-thread slots, their scope stacks, and the delivery state
 * machine.  Part of the unity build (timeoutcore.c).
 *
 * Delivery, one named function per step (the safe point itself is
 * tc_deliver.c's; nothing outside these two files raises into a thread):
 *   slot_fire        a due scope fires: mark it, INJECTED, then raise here
 *                    (owner thread) or slot_inject (another thread);
 *   slot_inject      send it: pending until the thread's next safe line
 *                    boundary (deliver_async), wake the thread's sleep, then
 *                    kick it with the signal ("inject first, then kick": the
 *                    deliverer holds the GIL, so the thread meets the pending
 *                    interrupt as soon as it runs);
 *   slot_reinject    the body swallowed it: send it again, unless it is
 *                    still pending, or being raised or handled right now;
 *   slot_take_back   withdraw a sent interrupt that has not surfaced (the
 *                    block is ending, or a shield starts);
 *   slot_raise_here  raise synchronously in the owner thread, taking back a
 *                    pending copy first so it is never delivered twice;
 *   slot_claim       the scope that fired is exiting: it claims the
 *                    interrupt (taken back, slot IDLE);
 *   slot_deliver_held  a shield or exit hook ends: deliver what was held.
 * Everything here runs with the GIL (free-threaded: inside the core lock,
 * tc_lock.h), except slot_release (thread exit).
 */

/* -- The scope stack ---------------------------------------------------------- */

/* Earliest own deadline on the stack. */
static int64_t stack_min(PyObject *top)
{
    int64_t m = TC_NEVER;
    for (PyObject *p = top; p != NULL; p = as_scope(p)->parent)
        if (as_scope(p)->deadline < m)
            m = as_scope(p)->deadline;
    return m;
}

/* Outermost scope whose own deadline has passed at `now`, or NULL. */
static PyObject *stack_due(PyObject *top, int64_t now)
{
    PyObject *due = NULL;
    for (PyObject *p = top; p != NULL; p = as_scope(p)->parent)
        if (as_scope(p)->deadline <= now)
            due = p;
    return due;
}

/* Publish the slot's effective deadline after any change to its stack. */
static void slot_publish(tc_slot *s)
{
    int64_t d = stack_min(s->top);
    atomic_store(&s->deadline, d);
    if (atomic_load(&s->state) != SLOT_INJECTED)
        atomic_store(&s->state, d == TC_NEVER ? SLOT_IDLE : SLOT_ARMED);
    atomic_fetch_add(&s->gen, 1);
    if (!sleeping_tracer_follow(s, d))
        timer_backstop_off(s); /* for the deadline it had: wd_notify arms anew */
    wd_notify(s, d, 0);
}

/* The attribute DeadlineScope.cancel() sets, which makes the exception a
 * DeadlineCancelled (read by tc_scope.c, set by accel_remote_relay.c):
 * interned once and kept.  NULL with an error set if it cannot be made.  GIL / core lock. */
static PyObject *str_cancelled(void)
{
    static PyObject *name;
    if (name == NULL)
        name = PyUnicode_InternFromString("_cancelled");
    return name;
}

/* Mark a scope popped from the stack without its __exit__ as done. */
static void scope_forget(Scope *sc)
{
    sc->parent = NULL;
    sc->state = SCOPE_DONE;
    sc->slot = NULL;
    if (sc->exited == 0)
        sc->exited = now_ns();
    Py_CLEAR(sc->frame); /* the stack still holds a reference: no finalizer */
    Py_CLEAR(sc->owner);
    prepare_drop(sc); /* it holds the scope: a cycle, else */
    sc->iframe = NULL;
}

/* Drop every scope on the slot's stack (a previous owner's leftovers). */
static void stack_clear(tc_slot *s)
{
    PyObject *p = s->top;
    s->top = NULL;
    s->fired = NULL;
    while (p != NULL) {
        PyObject *parent = as_scope(p)->parent;
        scope_forget(as_scope(p));
        Py_DECREF(p);
        p = parent;
    }
}

/* Pop the scopes above `target` whose __exit__ never ran (CPython 3.13.0 can
 * skip with-exits, cpython#130279).  Returns the number popped. */
static void slot_take_back(tc_slot *s);

static int stack_pop_stale_above(tc_slot *s, PyObject *target)
{
    int n = 0;
    while (s->top != NULL && s->top != target) {
        PyObject *p = s->top;
        s->top = as_scope(p)->parent;
        /* what was on its way to the stale scope goes with it (pending_scope
         * is borrowed: it must not outlive the scope) */
        if (s->pending_scope == p || s->fired == p)
            slot_take_back(s);
        if (s->fired == p)
            s->fired = NULL;
        scope_forget(as_scope(p));
        Py_DECREF(p);
        STAT_INC(stale_scopes);
        n++;
    }
    return n;
}

/* -- Delivery state machine --------------------------------------------------- */

/* Withdraw; the time it waited for protected code goes to the scope it was
 * for. */
static void slot_take_back(tc_slot *s)
{
    PyObject *scope = s->pending_scope;
    int64_t deferred = deliver_cancel(s);
    if (scope != NULL)
        as_scope(scope)->deferred_ns += deferred;
}

static void slot_inject(tc_slot *s, PyObject *exc, PyObject *scope)
{
    if (!deliver_async(s, exc, scope))
        return; /* its thread is gone */
    if (s == t_slot)
        return; /* the owner thread (a scope entered past its deadline): it runs,
                 * there is no wait to wake or call to knock loose */
#if TC_FREE_THREADED
    if (t_arm_due == s) {
        t_kick_due = 1; /* core_after: arm the hook, then wake and kick (tc_lock.h) */
        return;
    }
#endif
    slot_wake_and_kick(s);
}

/* Wake the thread's sleep(), then signal it (knocks a blocking call loose). */
static void slot_wake_and_kick(tc_slot *s)
{
    atomic_fetch_add(&s->wake, 1);
    futex_wake_all(&s->wake);
    kick(s);
}

/* Raise the interrupt synchronously; the caller returns NULL. */
static PyObject *slot_raise_here(tc_slot *s)
{
    slot_take_back(s);
    PyErr_SetNone(g_interrupt);
    return NULL;
}

/* Fire the outermost due scope, unless shielded.  `local`: we are the owner
 * thread; the error is set and the caller returns NULL.  Returns 1 if an
 * interrupt was raised (or set), 0 if nothing was due. */
static int slot_fire(tc_slot *s, int64_t now, int local)
{
    remote_relay_apply(s, now); /* a cancel off the control channel: due now */
    PyObject *due = stack_due(s->top, now);
    if (due == NULL || atomic_load(&s->shield) > 0)
        return 0;
    atomic_store(&s->prearmed, 0); /* fired: the hook stays armed for the delivery */
    if (s->fired == NULL) {
        s->fired = due;
        as_scope(due)->expired = 1;
        as_scope(due)->fired_at = now;
    }
    atomic_store(&s->state, SLOT_INJECTED);
    s->reinject_step = TC_REINJECT_FIRST_NS;
    atomic_store(&s->reinject_at, now + s->reinject_step);
    STAT_INC(fires);
    if (local)
        slot_raise_here(s);
    else {
        if (s != t_slot) /* another thread delivers: it will want the GIL soon */
            atomic_store(&s->fast_until, now + TC_FAST_HOLD_NS); /* accel_fast_window.c */
        slot_inject(s, g_interrupt, s->fired);
    }
    return 1;
}

/* The body may have swallowed the interrupt: raise it again (watchdog). */
static void slot_reinject(tc_slot *s, int64_t now)
{
    if (atomic_load(&s->shield) > 0 || s->fired == NULL)
        return;
    if (s->reinject_step < TC_REINJECT_MAX_NS)
        s->reinject_step *= 2;
    atomic_store(&s->reinject_at, now + s->reinject_step);
    if (s->pending != NULL) {
        /* not swallowed: still waiting for a safe point */
        deliver_backstop(s);
        return;
    }
#if TC_FREE_THREADED
    /* Another thread's exception state cannot be read here (tc_lock.h): send
     * it; the hook, in the thread, waits while the interrupt is being raised
     * or handled (deliver_here), and the scope's exit takes it back. */
    if (!atomic_load(&s->alive))
        return;
#else
    PyThreadState *t = slot_find_tstate(s);
    if (t == NULL || interrupt_in_flight(t))
        return;
#endif
    STAT_INC(reinjections);
    slot_inject(s, g_interrupt, s->fired);
}

static void slot_claim(tc_slot *s)
{
    atomic_store(&s->fast_until, 0);
    s->fired = NULL;
    atomic_store(&s->state, SLOT_IDLE);
    slot_take_back(s);
}

/* A shield or an exit hook ended with an interrupt held back: deliver it
 * here, synchronously -- fire now if the watchdog held off, else raise the
 * fired one again.  Returns NULL with the error set. */
static PyObject *slot_deliver_held(tc_slot *s, int64_t now)
{
    if (s->fired == NULL && slot_fire(s, now, 1))
        return NULL;
    atomic_store(&s->reinject_at, now + s->reinject_step);
    return slot_raise_here(s);
}

/* In the owner thread, at a point where raising is safe: raise if the
 * interrupt is pending for this thread or its deadline has passed.  Returns
 * 1 with the error set, else 0. */
static int slot_check(tc_slot *s)
{
    int64_t now;
    if (s == NULL || s->top == NULL || atomic_load(&s->shield) > 0)
        return 0;
    if (atomic_load(&s->state) == SLOT_INJECTED && s->fired != NULL) {
        slot_raise_here(s);
        return 1;
    }
    if (s->pending != NULL) { /* a soft exception on its way: here it is */
        deliver_pending_here(s);
        return 1;
    }
    now = now_ns();
    return atomic_load(&s->deadline) <= now && slot_fire(s, now, 1);
}

/* -- Stale scopes (3.13, cpython#130279) -------------------------------------- */

#if TC_TRACK_FRAMES
/* Is `frame` on the stack that starts at `cur` (a new reference, consumed)? */
static int frame_running(PyObject *frame, PyFrameObject *cur)
{
    while (cur != NULL) {
        PyFrameObject *back;
        if ((PyObject *)cur == frame) {
            Py_DECREF(cur);
            return 1;
        }
        back = PyFrame_GetBack(cur);
        Py_DECREF(cur);
        cur = back;
    }
    return 0;
}

/* A wrapper scope's owner (tc_guarded.c) has returned, and `cur` (a new
 * reference, consumed) is the thread's innermost frame: the owner becomes
 * the nearest caller of the old one that still runs (a finished frame
 * object keeps its caller), so a scope entered through a helper function
 * -- whose frame was taken for the owner -- stays with the code that
 * called it.  Returns 0 if none of them runs (stale).  The price: a wrapper
 * scope whose with statement's exit 3.13 skipped is dropped only when that
 * statement's caller returns. */
static int scope_rehome(Scope *sc, PyFrameObject *cur)
{
    PyFrameObject *f = PyFrame_GetBack((PyFrameObject *)sc->owner);
    while (f != NULL) {
        PyFrameObject *back;
        Py_XINCREF(cur);
        if (frame_running((PyObject *)f, cur)) {
            Py_XDECREF(cur);
            Py_XSETREF(sc->owner, (PyObject *)f); /* the reference moves here */
            return 1;
        }
        back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    Py_XDECREF(cur);
    return 0;
}

/* Drop the scopes whose with statement's frame no longer runs in the thread
 * whose innermost frame is `cur` (a new reference, consumed): the outermost
 * such scope and everything above it.  Returns 1 if anything was dropped;
 * the caller publishes. */
static int slot_prune_stale(tc_slot *s, PyFrameObject *cur)
{
    PyObject *stale = NULL;
    for (PyObject *p = s->top; p != NULL; p = as_scope(p)->parent) {
        PyObject *f = as_scope(p)->owner != NULL ? as_scope(p)->owner : as_scope(p)->frame;
        if (f == NULL)
            continue;
        Py_XINCREF(cur);
        if (frame_running(f, cur))
            continue;
        Py_XINCREF(cur);
        if (as_scope(p)->owner == NULL || !scope_rehome(as_scope(p), cur))
            stale = p; /* keep going: the outermost one counts */
    }
    Py_XDECREF(cur);
    if (stale == NULL)
        return 0;
    stack_pop_stale_above(s, stale); /* everything above it */
    s->top = as_scope(stale)->parent; /* and the stale scope itself */
    if (s->fired == stale)
        s->fired = NULL;
    scope_forget(as_scope(stale));
    Py_DECREF(stale);
    STAT_INC(stale_scopes);
    if (s->fired == NULL && atomic_load(&s->state) == SLOT_INJECTED) {
        slot_take_back(s);
        atomic_store(&s->state, SLOT_IDLE);
    }
    return 1;
}
#endif

/* -- Slot registry -------------------------------------------------------------- */

/* pthread key destructor: the owning thread is exiting.  No GIL here.  The
 * kernel timer goes now; Python objects left on a stack whose exits never
 * ran (3.13.0) are released when the slot is reused, with the GIL. */
static void slot_release(void *p)
{
    tc_slot *s = (tc_slot *)p;
    if (s == NULL)
        return;
    pthread_mutex_lock(&g_mu);
    timer_drop(s);
    atomic_store(&s->deadline, TC_NEVER);
    atomic_store(&s->state, SLOT_IDLE);
    atomic_fetch_add(&s->gen, 1);
    if (s->alive) {
        s->alive = 0;
        STAT_DEC(slots_live);
    }
    pthread_mutex_unlock(&g_mu);
}

/* Set OSError(err, "timeoutcore: timer_create failed ...") as the error. */
static void raise_timer_error(int err)
{
    PyObject *exc = PyObject_CallFunction(
        PyExc_OSError, "is", err,
        err == EAGAIN ? "timeoutcore: timer_create failed for this thread: too many timers "
                        "(RLIMIT_SIGPENDING reached)"
                      : "timeoutcore: timer_create failed for this thread");
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
}

/* The calling thread's slot, created on first use (GIL held).  NULL with a
 * Python exception when the handler or the timer cannot be set up: then
 * nothing is left armed and the slot stays free for reuse. */
static tc_slot *slot_get(void)
{
    tc_slot *s = t_slot;
    int err;
    if (s != NULL)
        return s;
    if (g_interrupt == NULL || g_exceeded == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "timeoutcore: _setup() was not called");
        return NULL;
    }
    if (install_handler() < 0)
        return NULL;
    pthread_mutex_lock(&g_mu);
    for (s = g_slots; s != NULL; s = s->next)
        if (!s->alive)
            break;
    if (s == NULL) {
        s = (tc_slot *)calloc(1, sizeof *s);
        if (s == NULL) {
            pthread_mutex_unlock(&g_mu);
            PyErr_NoMemory();
            return NULL;
        }
        atomic_store(&s->deadline, TC_NEVER);
        s->next = g_slots;
        g_slots = s;
    }
    s->tid = (pid_t)syscall(SYS_gettid);
    s->ident = PyThread_get_thread_ident();
    atomic_store(&s->tstate_id, (const void *)PyThreadState_Get());
    atomic_store(&s->state, SLOT_IDLE);
    atomic_store(&s->deadline, TC_NEVER);
    atomic_store(&s->shield, 0);
    atomic_store(&s->cpu, -1);
    atomic_fetch_add(&s->gen, 1);
    if ((err = timer_make(s)) != 0) {
        pthread_mutex_unlock(&g_mu);
        raise_timer_error(err);
        return NULL;
    }
    s->alive = 1;
    STAT_INC(slots_live);
    pthread_mutex_unlock(&g_mu);
    stack_clear(s); /* leftovers of a previous owner, if any */
    (void)deliver_cancel(s);
    if ((err = pthread_setspecific(g_key, s)) != 0) {
        slot_release(s);
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        return NULL;
    }
    t_slot = s;
    return s;
}
