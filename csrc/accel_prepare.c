/*
 * accel_prepare.c -- accelerator prepare: the scope's DeadlineExceeded
 * built ahead of its deadline, by the watchdog while it holds the GIL for
 * the slot anyway (or, with the self-fire, by the thread itself in a
 * pending call; free-threaded, by the thread itself at its first hook
 * event once pre-armed), so that the exit that claims the interrupt finds
 * it built and warm (tc_scope.c: raise_exceeded).  Its hooks: tc_accel.h.
 * Part of the unity build (timeoutcore.c), after accel_prearm.c.
 *
 * State: per scope (struct prepare_scope, Scope.prepare): the exception, a
 * strong reference -- it holds the scope, so the scope's GC traverse and
 * clear go through prepare_peek and prepare_drop.  Written and read with
 * the GIL (free-threaded: the core lock).  Whoever changes a scope's
 * deadline drops it (prepare_drop): it was built for the old one.  Per
 * slot (struct prepare_slot, tc_slot.prep), free-threaded: the gen the
 * thread last tried for, its owner's only.  Off, nothing is built, and the
 * exit builds the exception as it would.
 */

/* Ahead of slot `s`'s `deadline`, if TC_PREPARE_MIN_LEFT_NS is left (GIL
 * held / attached, holding no lock of ours): build the DeadlineExceeded of
 * the scope that will fire, for its exit to take (prepare_take).  Building runs Python (the
 * exception's constructor), so the slot is checked again after: if its
 * stack changed meanwhile (an exit, a reschedule or cancel) the exception
 * is dropped.  Costs the watchdog one construction per deadline it
 * prepares; a scope that ends in time drops it at its exit. */
static void prepare_before_due(tc_slot *s, int64_t deadline)
{
    PyObject *sc = NULL, *exc;
    uint64_t gen = 0;
    if (g_exceeded == NULL || !accel_on(ACCEL_PREPARE) || deadline - now_ns() <= TC_PREPARE_MIN_LEFT_NS)
        return; /* building it could outlast the time left */
    {
        TC_CORE_BEGIN_ON(s);
        if (s->alive && atomic_load(&s->state) == SLOT_ARMED && atomic_load(&s->shield) == 0) {
            gen = atomic_load(&s->gen);
            sc = stack_due(s->top, atomic_load(&s->deadline));
            if (sc != NULL && as_scope(sc)->prepare.exc == NULL)
                Py_INCREF(sc);
            else
                sc = NULL;
        }
        TC_CORE_END();
    }
    if (sc == NULL)
        return;
    exc = PyObject_CallOneArg(g_exceeded, sc);
    if (exc == NULL)
        PyErr_Clear();
    {
        TC_CORE_BEGIN_ON(s);
        if (exc != NULL && s->alive && atomic_load(&s->gen) == gen &&
            as_scope(sc)->state == SCOPE_ACTIVE && as_scope(sc)->prepare.exc == NULL) {
            as_scope(sc)->prepare.exc = exc;
            exc = NULL;
            STAT_INC(prepared);
        }
        TC_CORE_END();
    }
    Py_XDECREF(exc);
    Py_DECREF(sc);
}

static PyObject *prepare_take(Scope *sc)
{
    PyObject *exc = sc->prepare.exc;
    sc->prepare.exc = NULL;
    return exc;
}

static void prepare_drop(Scope *sc) { Py_CLEAR(sc->prepare.exc); }

static PyObject *prepare_peek(Scope *sc) { return sc->prepare.exc; }

/* Free-threaded, the watchdog never prepares (tc_wd_fire.c: wd_lead), and
 * without it the exit found its Python cold: the pre-arm switched the
 * hook's events on, and the first run of the exception's constructor in
 * the thread after that ran its code afresh (instrumented again, its
 * specialisations gone) -- the larger part of a quiet deadline's lateness,
 * while the same construction run a second time was cheap.  So the thread
 * builds the exception itself, at its first hook event once pre-armed: well
 * ahead of the deadline (a pre-arm's lead), off the path from deadline to
 * caller, in the thread whose code it warms.  Inside a sys.monitoring
 * callback the constructor's own lines raise no events (CPython does not
 * call a tool back from its own callback), so nothing recurses into the
 * hook.  A pre-armed block that ends before its deadline has built one
 * exception for nothing (the watchdog's prepare costs the same). */
#if TC_FREE_THREADED
static void prepare_in_thread(tc_slot *s)
{
    uint64_t gen = atomic_load(&s->gen);
    if (s->prep.tried_gen == gen || !accel_on(ACCEL_PREPARE))
        return;
    s->prep.tried_gen = gen; /* once, whatever comes of it */
    if (atomic_load(&s->shield) == 0)
        prepare_before_due(s, atomic_load(&s->deadline));
}
#endif

/* At import (tc_accel.h). */
static const char *prepare_unsupported(void)
{
    return NULL;
}
