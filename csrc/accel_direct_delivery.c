/*
 * accel_direct_delivery.c -- accelerator direct_delivery (3.11 and 3.12,
 * TC_DIRECT_BACK_EDGE): an interrupt sent to a thread paused at a loop's
 * back-edge goes by PyThreadState_SetAsyncExc, judged safe from here, and
 * no delivery hook is armed for it.  Its hook: tc_accel.h
 * (direct_delivery_try, called first by deliver_async).  No state of its
 * own: what it sends is the core's fallback asynchronous exception
 * (tc_slot.async_pending), which the claiming exit takes back as it takes
 * the fallback's.  Part of the unity build (timeoutcore.c), after the
 * hooks and before tc_deliver_steps.c.
 */

#if TC_DIRECT_BACK_EDGE
/* Is our interrupt being raised or handled in thread `t` (GIL held, `t`
 * paused)?  This accelerator judges another thread from here, so it reads
 * that thread's exception state (tc_compat.h: tc_raising, tc_handling;
 * checked at import, tc_gil_check.c), which the core never does. */
static int interrupt_in_flight_in(PyThreadState *t)
{
    return tc_raising(t, g_interrupt) || tc_handling(t, g_interrupt);
}

/* Why: the hook costs every thread while it is armed on 3.12 (its events are
 * interpreter-wide), and in a busy pool the fired thread may wait for the
 * GIL with the events on all that time -- the largest part of what frequent
 * deadlines cost a pool there.  But a thread that is paused at a loop's back-edge -- the
 * usual place for a CPU loop that was asked to let the GIL go -- will meet a
 * pending asynchronous exception first thing when it has the GIL back, at
 * that very instruction (tc_compat.h: tc_back_edge_in_loop).  So the place
 * where it will surface is known now, and the safe-delivery checks can be
 * made from here, on a stack that cannot change: the thread is paused and we
 * hold the GIL.  If they pass, the interrupt goes by
 * PyThreadState_SetAsyncExc and no hook is armed.
 *
 * Race analysis.  Writers of the thread's async_exc: this function and
 * deliver_cancel (the scope's exit, a shield, a cancel from any thread),
 * both with the GIL; CPython's own SetAsyncExc callers likewise.  The thread
 * reads it only with the GIL, in _Py_HandlePending after it took the GIL
 * back.  Between the checks below and the store it cannot run (we hold the
 * GIL, and the collector is off while we look at its frames, so no
 * finalizer of ours lets the GIL go: tc_internal.h, frames_look_begin), so
 * it resumes at the instruction judged.  Exceptions to "first
 * thing": a thread paused elsewhere in _Py_HandlePending -- in a Python
 * signal handler (main thread only: excluded), in a pending call (main
 * thread only on 3.11-3.12), or in a garbage collection whose C finalizer
 * let the GIL go (a collection running: excluded), which could run Python
 * finalizers before the check.  A thread paused at JUMP_BACKWARD cannot be
 * anywhere else: that instruction calls nothing but the breaker's handling.
 * The exit that claims the interrupt (slot_claim) takes an unconsumed one
 * back, as for the fallback without a hook (async_pending).  GIL held, any
 * thread but the slot's own; returns 1 if sent. */
static int deliver_direct(tc_slot *s, PyThreadState *t, PyObject *scope)
{
    PyFrameObject *f;
    int ok, gc;
    if (s == t_slot || t == NULL || s->pending != NULL || s->async_pending ||
        s->ident == tc_main_thread() || tc_gc_collecting() || interrupt_in_flight_in(t))
        return 0;
    gc = frames_look_begin(); /* the judgement holds only if the GIL stays */
    if ((f = PyThreadState_GetFrame(t)) == NULL) {
        frames_look_end(gc);
        return 0;
    }
    ok = tc_back_edge_in_loop(f);
    if (ok) {
        Py_INCREF(f); /* stack_protected consumes one */
        ok = !stack_protected(f, scope != NULL ? as_scope(scope) : NULL, NULL);
    }
    Py_DECREF(f);
    frames_look_end(gc);
    if (!ok || PyThreadState_SetAsyncExc(s->ident, g_interrupt) != 1)
        return 0;
    s->async_pending = 1;
    hook_disarm(s, t); /* armed ahead (pre-armed): nothing left for it */
    STAT_INC(direct_raises);
    return 1;
}
#endif

static int direct_delivery_try(tc_slot *s, PyThreadState *t, PyObject *exc, PyObject *scope)
{
#if TC_DIRECT_BACK_EDGE
    return exc == g_interrupt && accel_on(ACCEL_DIRECT_DELIVERY) && deliver_direct(s, t, scope);
#else
    (void)s, (void)t, (void)exc, (void)scope;
    return 0;
#endif
}

/* At import (tc_accel.h). */
static const char *direct_delivery_unsupported(void)
{
    return TC_DIRECT_BACK_EDGE ? NULL : "unsupported on this CPython (3.11 and 3.12 only)";
}
