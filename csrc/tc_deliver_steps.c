/*
 * tc_deliver_steps.c -- the delivery steps over either hook: the decision at
 * a line boundary (deliver_here) and the one entry every deliverer uses --
 * deliver_async, which asks direct delivery first (direct_delivery_try) --
 * with its backstop and its withdrawal (deliver_cancel).  Part of the unity
 * build (timeoutcore.c), after the hooks (tc_hook_trace.c,
 * tc_hook_monitoring.c) and accel_direct_delivery.c.
 *
 * Who calls what, all with the GIL (free-threaded: inside the core lock):
 * deliver_here and deliver_pending_here in the guarded thread, from the
 * hook; deliver_async and deliver_backstop in the
 * deliverer (the watchdog, a cancelling thread,
 * _raise_in_scope's caller) while the slot's thread is paused;
 * deliver_cancel from the scope's exit, a shield, or a cancel from any
 * thread.  Nothing here is async-signal-safe or called from the handler.
 */

/* -- Delivery steps ------------------------------------------------------------ */

/* In the guarded thread, at a line boundary (or `vetted`: at an event whose
 * raise position the caller has checked -- a loop's jump), with something
 * pending: raise it unless protected code is on the stack or the
 * instruction is no safe place (tc_compat.h).
 * Returns -1 with the exception set when it raised (DELIVER_DECIDE: 1,
 * nothing done), else 0. */
/* Is protected code on the stack from `cur` (a new reference, consumed) to
 * scope `scope`'s frame?  Then the delivery waits: the first wait is noted
 * (since when, and the outermost protected frame on `scope`). */
static int stack_defers(tc_slot *s, PyFrameObject *cur, PyObject *scope, int64_t now)
{
    PyObject *where = NULL;
    if (!stack_protected(cur, scope != NULL ? as_scope(scope) : NULL,
                         s->deferred_since == 0 ? &where : NULL))
        return 0;
    if (s->deferred_since == 0) {
        s->deferred_since = now;
        if (scope != NULL && where != NULL)
            Py_XSETREF(as_scope(scope)->deferred_where, where);
        else
            Py_XDECREF(where);
    }
    return 1;
}

static int deliver_here(tc_slot *s, int vetted, int mode)
{
    PyObject *scope = s->pending_scope;
    int64_t now;
    STAT_INC(hook_calls);
    if (atomic_load(&s->shield) > 0)
        return 0; /* the shield's exit delivers */
    PyFrameObject *cur = PyEval_GetFrame(); /* borrowed */
    if (cur == NULL)
        return 0;
    /* Already deferred, and the innermost frame is protected (not the scope's
     * own): wait.  The common case while deferred, and cheap; the walk below
     * makes frame objects up the stack, so it runs once to say where, and
     * when the innermost frame is unprotected. */
    if (s->deferred_since != 0 &&
        (scope == NULL || !(is_scope_frame(cur, as_scope(scope)) || is_owner_frame(cur, as_scope(scope)))) &&
        frame_protected(cur)) {
        STAT_INC(hook_defers);
        return 0;
    }
    if (tc_at_with_exit(cur) || tc_in_with_enter_gap(cur) ||
        (!vetted && tc_uncovered_no_raise(cur, PyFrame_GetLasti(cur))))
        return 0; /* the next line boundary will do */
    if (tc_gc_collecting())
        return 0; /* a finalizer the collector runs: raised there, the interrupt would
                     only be reported as ignored (and a report hook hit in turn) */
    if (interrupt_in_flight_here())
        return 0; /* already on its way out; if swallowed, this one follows */
    now = now_ns();
#if TC_FREE_THREADED
    /* With a GIL the watchdog asked this before it sent (slot_reinject);
     * free-threaded it cannot, and sends: the hook asks here. */
    if (s->pending == g_interrupt && interrupt_held(s, now))
        return 0; /* kept by the body, to be raised again */
#endif
    Py_INCREF(cur);
    if (stack_defers(s, cur, scope, now)) {
        STAT_INC(hook_defers);
        return 0;
    }
    if (s->pending == NULL || s->pending_scope != scope)
        return 0; /* changed during the walk (free-threaded: the core lock may
                     be suspended there); the next boundary decides again */
    if (mode == DELIVER_DECIDE)
        return 1;
    STAT_INC(hook_raises);
    deliver_pending_here(s);
    return -1;
}

/* In the owner thread, at a line boundary the hook judged safe or at an
 * explicit raise point (checkpoint(), a wait's step, a shield's exit): raise
 * what is pending right here.  The caller returns NULL. */
static void deliver_pending_here(tc_slot *s)
{
    PyObject *scope = s->pending_scope, *exc = s->pending;
    int64_t now = now_ns();
    s->pending = NULL;
    s->pending_scope = NULL;
    atomic_store(&s->pending_any, 0);
    hook_disarm(s, PyThreadState_Get());
    if (scope != NULL) {
        if (s->deferred_since != 0)
            as_scope(scope)->deferred_ns += now - s->deferred_since;
        as_scope(scope)->delivered_at = now;
    }
    s->deferred_since = 0;
    if (exc != g_interrupt && scope != NULL && scope == s->soft_scope)
        s->soft_frame = PyEval_GetFrame(); /* where a drop of it would start (tc_unraisable.c) */
    PyErr_SetNone(exc);
    Py_DECREF(exc);
}

/* The thread state of the slot's thread (GIL held), or NULL if it is gone.
 * Free-threaded: never looked up for another thread (tc_lock.h); the hook
 * needs none there, and liveness is the slot's `alive`. */
static PyThreadState *slot_tstate(tc_slot *s)
{
#if TC_FREE_THREADED
    return s == t_slot ? PyThreadState_Get() : NULL;
#else
    return s == t_slot ? PyThreadState_Get() : slot_find_tstate(s);
#endif
}

/* Make `exc` (a class) surface in the slot's thread for `scope` at its next
 * safe point.  A pending hard interrupt is never replaced by anything else.
 * Returns 1 if delivery is under way, 0 if the thread is gone. */
static int deliver_async(tc_slot *s, PyObject *exc, PyObject *scope)
{
    PyThreadState *t = slot_tstate(s);
    if (direct_delivery_try(s, t, exc, scope)) /* accelerator direct_delivery */
        return 1;
#if TC_FREE_THREADED
    if (s != t_slot && !atomic_load(&s->alive))
        return 0;
#else
    if (t == NULL)
        return 0;
#endif
    if (g_hook_mode != HOOK_NONE) {
        if (s->pending == g_interrupt && exc != g_interrupt)
            return 1;
        Py_INCREF(exc);
        Py_XSETREF(s->pending, exc);
        s->pending_scope = scope;
        atomic_store(&s->pending_any, 1);
#if TC_FREE_THREADED
        /* Armed when the core lock is let go (tc_lock.h: core_after). */
        if (core_held() && (t_arm_due == NULL || t_arm_due == s)) {
            t_arm_due = s;
            return 1;
        }
#endif
        if (hook_arm(s, t) == 0) {
            if (s->pending == NULL) /* taken back while arming let the core lock go */
                hook_disarm(s, t);
            return 1;
        }
        Py_CLEAR(s->pending); /* no hook: fall back below */
        s->pending_scope = NULL;
        atomic_store(&s->pending_any, 0);
    }
    STAT_INC(async_fallbacks);
    PyThreadState_SetAsyncExc(s->ident, exc);
    s->async_pending = 1;
    return 1;
}

#if TC_FREE_THREADED
/* The outermost TC_CORE_END, after the core lock is let go: arm the hook
 * for the delivery a region left in t_arm_due.  Outside the lock, the slot
 * may have changed meanwhile: arm only if something is still pending, and
 * disarm again if it was taken back during the arm.  If arming fails (no
 * sys.monitoring tool), the delivery waits for an explicit point or the
 * scope's exit; counted as an async fallback. */
static void core_after(void)
{
    tc_slot *s = t_arm_due;
    int kick = t_kick_due;
    t_arm_due = NULL;
    t_kick_due = 0;
    if (s == NULL || !atomic_load(&s->pending_any))
        return;
    if (hook_arm(s, NULL) < 0)
        STAT_INC(async_fallbacks);
    else if (!atomic_load(&s->pending_any))
        hook_disarm(s, NULL);
    if (kick)
        slot_wake_and_kick(s);
}
#endif

/* The watchdog's backstop, at each re-injection time while a delivery is
 * still pending, and _raise_in_scope's once it sent a soft exception, which
 * the watchdog never re-sends (GIL held, the thread paused).  It never
 * raises: checking the stack from here and raising asynchronously decides
 * nothing, because the thread runs on (a C call that released the GIL
 * returns) and meets the asynchronous exception at its next eval-breaker
 * check, often inside protected code (on 3.11 it leaked Semaphore and
 * handler locks in the integrity hammer, tests/test_integrity.py; none
 * without it).  It only makes sure the hook can still see the thread
 * (hook_nudge). */
static void deliver_backstop(tc_slot *s)
{
    if (s->pending == NULL || !s->hooked)
        return;
#if TC_HOOK_TRACE
    PyThreadState *t = slot_find_tstate(s);
    if (t == NULL)
        return;
    STAT_INC(backstops);
    hook_nudge(s, t);
#else
    STAT_INC(backstops);
    hook_nudge(s, NULL); /* nothing to do there (no thread state needed) */
#endif
}

/* Withdraw what was sent and has not surfaced yet.  Returns the time it had
 * been deferred (ns), for the scope's record. */
static int64_t deliver_cancel(tc_slot *s)
{
    int64_t deferred = s->deferred_since != 0 ? now_ns() - s->deferred_since : 0;
    atomic_store(&s->prearmed, 0);
    if (s->pending != NULL || s->hooked) {
        Py_CLEAR(s->pending);
        s->pending_scope = NULL;
        atomic_store(&s->pending_any, 0);
        hook_disarm(s, slot_tstate(s));
    }
    s->deferred_since = 0;
    if (s->async_pending) {
        /* Only when something was sent this way and is still there: clearing
         * with nothing pending leaves the eval breaker tripped (3.11, 3.12:
         * for the whole interpreter, until some thread consumes an
         * asynchronous exception: a direct delivery's exit that cleared the
         * consumed one made the next deadline next to busy threads later).  Free-threaded, another
         * thread's state is not looked at (tc_lock.h). */
        PyThreadState *t = slot_tstate(s);
        if (t == NULL ? TC_FREE_THREADED && atomic_load(&s->alive) : tc_async_exc_waiting(t))
            PyThreadState_SetAsyncExc(s->ident, NULL);
        s->async_pending = 0;
    }
    return deferred;
}
