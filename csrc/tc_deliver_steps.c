/*
 * tc_deliver_steps.c -- the delivery steps over either hook: the decision at
 * a line boundary (deliver_here), the self-fire's pending call (accelerator
 * self_fire, TC_SELF_FIRE), and the one entry every deliverer uses --
 * deliver_async, which asks direct delivery first (direct_delivery_try) --
 * with its backstop and its withdrawal (deliver_cancel).  Part of the unity
 * build (timeoutcore.c), after the hooks (tc_hook_trace.c,
 * tc_hook_monitoring.c) and accel_direct_delivery.c.
 *
 * Who calls what, all with the GIL (free-threaded: inside the core lock):
 * deliver_here and deliver_pending_here in the guarded thread, from the
 * hook; pc_fire in whichever thread next checks its eval breaker (it acts
 * only in the slot's own thread); deliver_async and deliver_backstop in the
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
 * Returns -1 with the exception set when it raised (DELIVER_ASYNC_SELF: 0,
 * the exception on its way; DELIVER_DECIDE: 1, nothing done), else 0. */
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
    PyThreadState *me = PyThreadState_Get();
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
    if (interrupt_in_flight(me))
        return 0; /* already on its way out; if swallowed, this one follows */
    now = now_ns();
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
    deliver_pending(s, mode == DELIVER_ASYNC_SELF);
    return mode == DELIVER_ASYNC_SELF ? 0 : -1;
}

/* In the owner thread, at an explicit raise point (checkpoint(), a wait's
 * step, a shield's exit): raise what is pending right here.  The caller
 * returns NULL. */
static void deliver_pending_here(tc_slot *s) { deliver_pending(s, 0); }

/* ... or, with `async_self`, as an asynchronous exception of this very
 * thread, which its eval loop raises at its next breaker check (3.12's JUMP
 * callback, see mon_jump). */
static void deliver_pending(tc_slot *s, int async_self)
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
    if (async_self)
        (void)PyThreadState_SetAsyncExc(PyThread_get_thread_ident(), exc);
    else
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

#if TC_SELF_FIRE
/* -- The self-fire: a pending call at the thread's own breaker check (3.12+) --
 * A thread that holds the GIL at its deadline fires it itself (tc_wd_fire.c:
 * wd_watch): the watchdog queues this call (tc_gil.c: tc_add_pending), and
 * whichever thread next checks its eval breaker runs it, with the GIL.  In
 * any thread but the slot's own it does nothing.  In the slot's own thread,
 * with the deadline due: at a loop's back-edge outside protected code
 * (tc_compat.h: tc_breaker_back_edge; the stack as direct delivery
 * judges it), it fires and returns -1, so that the interrupt surfaces at that very
 * instruction; at any other check (a call that just returned, a function's
 * RESUME) it queues itself again for the next one -- the same check runs it
 * again at once, up to CPython's per-check limit, which the remembered place
 * makes cheap.  Inside protected code, or while the collector runs (it may
 * run finalizers in this very check, after this call), it waits that way as
 * long as it takes (recording a deferral as the hook does); elsewhere, after
 * TC_PC_MAX_DECLINES checks none of which was a usable back-edge (code
 * without loops), it fires for the hook, which raises at the next line
 * boundary.
 *
 * Race analysis.  Everything here runs with the GIL, in the slot's own
 * thread; the watchdog, without the GIL, only sets pc_queued and queues the
 * call, one at a time (pc_fire below; a call that finds nothing due or
 * fires nothing more is harmless anyway).  A call that runs after the scope
 * ended, or in another thread, finds the slot not ARMED, or not its own,
 * and only clears pc_queued (in another thread it may fire a remote cancel:
 * pc_fire_for); the watchdog queues again while the thread holds the GIL,
 * and otherwise fires the usual way (it then holds the GIL: the states move
 * under it).  Slots are never freed, so `arg` stays valid. */
static PyObject *stack_due(PyObject *top, int64_t now); /* tc_slot.c */
#if TC_TRACK_FRAMES
static int slot_prune_stale(tc_slot *s, PyFrameObject *cur); /* tc_slot.c */
static void slot_publish(tc_slot *s);                       /* tc_slot.c */
#endif

/* pc_fire in a thread other than the slot's: if the slot is due -- a cancel
 * off the control channel (tc_wd_fire.c: wd_watch queued the call for the
 * GIL's holder), or its own deadline, passed while its thread was the
 * holder -- fire it from here, as the watchdog's sweep would with the GIL
 * (Scope.reschedule does the same from the thread that cancels): the
 * interrupt goes to the slot's thread by the usual delivery, to surface at
 * a safe point there; nothing is raised in this thread.
 * Why the deadline too: the slot's thread declines the call at checks that
 * are no usable back-edge (a C call's return) and queues it again; when it
 * then lets the GIL go, the thread that takes it runs the call.  Doing
 * nothing here dropped the fire (the call is the only one queued, and the
 * watchdog, having queued it, looks again only later): a block whose C call
 * outlived its deadline next to one busy thread ran on to its exit (issue
 * 36, item 1).  Not yet due (a deadline moved later meanwhile): nothing. */
#if TC_TRACK_FRAMES
static void wd_prune_slot(tc_slot *s); /* tc_watchdog.c */
#endif
static void pc_fire_for(tc_slot *s)
{
    int64_t now = now_ns();
    if (!s->alive || atomic_load(&s->state) != SLOT_ARMED || atomic_load(&s->shield) > 0 ||
        s->pending != NULL ||
        (remote_relay_marked_at(s) == TC_NEVER && atomic_load(&s->deadline) > now))
        return;
#if TC_TRACK_FRAMES
    wd_prune_slot(s); /* the sweep's first step (3.13) */
#endif
    int remote = remote_relay_marked_at(s) != TC_NEVER;
    if (slot_fire(s, now, 0)) {
        if (remote)
            STAT_INC(remote_relays);
        else
            STAT_INC(due_relays);
    }
}

/* The self-fire gives up on this deadline: fired for the hook, which raises
 * at the next line boundary (or the loop's head).  Returns 0 for pc_fire. */
static int pc_to_hook(tc_slot *s, int64_t now)
{
    s->pc_frame = NULL;
    (void)slot_fire(s, now, 0);
    return 0;
}

static int pc_fire_here(tc_slot *s, int *again)
{
    PyFrameObject *cur;
    PyObject *due;
    int64_t now;
    if (s != t_slot) {
        pc_fire_for(s);
        return 0;
    }
    if (atomic_load(&s->state) != SLOT_ARMED || atomic_load(&s->shield) > 0 ||
        s->pending != NULL || (cur = PyEval_GetFrame()) == NULL)
        return 0;
    remote_relay_apply(s, now_ns()); /* a cancel off the control channel: due now */
    if (s->pc_gen != atomic_load(&s->gen)) { /* a new deadline: count afresh */
        s->pc_gen = atomic_load(&s->gen);
        s->pc_frame = NULL;
        s->pc_declines = 0;
    }
    if ((const void *)cur != s->pc_frame || PyFrame_GetLasti(cur) != s->pc_lasti) {
        int usable = 0, back;
#if TC_TRACK_FRAMES
        Py_INCREF(cur); /* consumed */
        if (slot_prune_stale(s, cur))
            slot_publish(s);
#endif
        now = now_ns();
        if ((due = stack_due(s->top, now)) == NULL)
            return 0;
        if (tc_gc_collecting())
            usable = 1; /* a finalizer the collector runs (deliver_here): wait, uncounted */
        else if ((back = tc_breaker_back_edge(cur)) < 0) {
            /* A loop's back-edge whose raise would not land in the loop's
             * handler: this loop's check never becomes usable.  The hook
             * now (it raises at the loop's head), not after the declines:
             * its back-edge and its calls' checks take turns, each
             * resetting the wait. */
            STAT_INC(pending_handovers);
            return pc_to_hook(s, now);
        }
        else if (back > 0 && !interrupt_in_flight(PyThreadState_Get())) {
            usable = 1;
            Py_INCREF(cur); /* consumed */
            if (!stack_defers(s, cur, due, now)) {
                int64_t deferred = s->deferred_since != 0 ? now - s->deferred_since : 0;
                if (slot_fire(s, now, 1)) { /* takes back: deferred_since goes */
                    s->pc_frame = NULL;
                    if (s->fired != NULL) {
                        as_scope(s->fired)->delivered_at = now;
                        as_scope(s->fired)->deferred_ns += deferred;
                    }
                    STAT_INC(pending_raises);
                    return -1;
                }
            }
        }
        if (!usable && ++s->pc_declines > TC_PC_MAX_DECLINES)
            return pc_to_hook(s, now);
        s->pc_frame = (const void *)cur;
        s->pc_lasti = PyFrame_GetLasti(cur);
        s->pc_waiting = usable;
        s->pc_since = now;
    }
    else if (!s->pc_waiting && now_ns() - s->pc_since > TC_PC_SAME_NS) {
        /* Declined here already, and here again, check after check: a loop
         * whose only breaker check is no usable back-edge (`while <cond>:`
         * on 3.13, cpython#130279) would never see the raise.  The hook
         * takes over (it raises at the loop's next line). */
        return pc_to_hook(s, now_ns());
    }
    *again = 1;
    return 0;
}

/* The pending call itself.  pc_queued is set by whoever queues it (the
 * watchdog, with it clear) and stays set while a call is queued or running:
 * a call that asks to run again queues itself with the flag still set, and
 * only a call that does not -- or whose queueing fails (full: the watchdog
 * decides) -- clears it.  So there is never more than one call per slot in
 * CPython's queue: with the flag cleared on entry instead, a watchdog look
 * while a call ran added a second one, and calls that each queue themselves
 * again never shrink in number -- a thread deferred long in protected code
 * filled 3.12's queue (32 calls), and the next look found it full. */
static int pc_fire(void *arg)
{
    tc_slot *s = (tc_slot *)arg;
    int again = 0;
    int r = pc_fire_here(s, &again);
    if (!again || tc_add_pending(pc_fire, s) != 0)
        atomic_store(&s->pc_queued, 0);
    return r;
}
#endif

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
        if (t_core_cs != NULL && (t_arm_due == NULL || t_arm_due == s)) {
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
 * still pending (GIL held, the thread paused).  It never raises: checking
 * the stack from here and raising asynchronously decides nothing, because
 * the thread runs on (a C call that released the GIL returns) and meets the
 * asynchronous exception at its next eval-breaker check, often inside
 * protected code (on 3.11 it leaked Semaphore and handler locks in the
 * integrity hammer, tests/test_integrity.py; none without it).  It only makes sure the hook can
 * still see the thread (hook_nudge). */
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
        if (t == NULL ? TC_FREE_THREADED && atomic_load(&s->alive) : t->async_exc != NULL)
            PyThreadState_SetAsyncExc(s->ident, NULL);
        s->async_pending = 0;
    }
    return deferred;
}
