/*
 * tc_hook_monitoring.c -- the delivery hook on 3.12+ (not TC_HOOK_TRACE): a
 * sys.monitoring tool whose LINE and JUMP callbacks (from 3.13 PY_START,
 * with the LINE callback: tc_compat.h; and, where
 * TC_JUMP_DEFER_BUILD, INSTRUCTION events on one code object) run at the
 * guarded thread's line boundaries and loop jumps.  Part of the unity build
 * (timeoutcore.c), after tc_hook_trace.c; the whole file is empty when
 * TC_HOOK_TRACE.
 *
 * Who calls what: mon_line/mon_jump/mon_insn run IN THE GUARDED THREAD, with
 * the GIL (free-threaded: they take the core lock only after a lock-free
 * look at their own slot's pending_any, hook_core_busy), and call
 * deliver_here (tc_deliver_steps.c).  hook_arm/hook_disarm switch the
 * interpreter-wide events on and off under g_arm_mu (tc_lock.h), from the
 * deliverer or the slot's thread; free-threaded, the watchdog switches them
 * off once idle (hook_idle_off).  Nothing here runs in a signal handler
 * (with this hook, sleeping_tracer_on_signal returns 0).
 */

#if !TC_HOOK_TRACE /* sys.monitoring */

static PyObject *g_set_events;       /* sys.monitoring.set_events          */
static int g_tool = -1;              /* our tool id                         */
static long g_events;                /* LINE | JUMP (| PY_START)            */
static _Atomic int g_armed;          /* threads with the hook armed         */

#if TC_JUMP_DEFER_BUILD
/* 3.12, 3.13.0-3.13.14: raising at a jump's target (tc_compat.h: the JUMP bug).
 * GIL held, the slot's own thread; a disarm may come from another. */
static PyObject *g_set_local_events; /* sys.monitoring.set_local_events    */
static long g_insn_event;            /* INSTRUCTION                         */
static int g_jump_defer;             /* this interpreter needs it           */

/* Switch our INSTRUCTION events on `code` on (1) or off (0). */
static int insn_events(PyObject *code, int on)
{
    PyObject *r = PyObject_CallFunction(g_set_local_events, "iOl", g_tool, code,
                                        on ? g_insn_event : 0L);
    if (r == NULL) {
        PyErr_Clear();
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

/* The slot's INSTRUCTION events go (if it has any). */
static void insn_off(tc_slot *s)
{
    PyObject *code = s->insn_code;
    if (code == NULL)
        return;
    s->insn_code = NULL;
    (void)insn_events(code, 0); /* on failure: a callback that finds nothing to do */
    Py_DECREF(code);
}

/* In the JUMP callback, with something pending: decide, and if it is to be
 * raised, switch on INSTRUCTION events for `code` to raise at `to` (mon_insn).
 * Returns 1 if it took the delivery on (3.12, 3.13.0-3.13.14), 0 if the
 * caller raises as usual. */
static int jump_defer(tc_slot *s, PyObject *code, long to)
{
    if (!g_jump_defer)
        return 0;
    if (deliver_here(s, 1, DELIVER_DECIDE) == 1 && s->insn_code == NULL &&
        insn_events(code, 1) == 0) {
        Py_INCREF(code);
        s->insn_code = code;
        s->insn_at = to;
    }
    return 1;
}
#else
static inline void insn_off(tc_slot *s) { (void)s; }
static inline int jump_defer(tc_slot *s, PyObject *code, long to)
{
    (void)s;
    (void)code;
    (void)to;
    return 0;
}
#endif

static void events_learn(int64_t took) /* g_events_cost_ns, above */
{
    int64_t c = atomic_load(&g_events_cost_ns);
    c -= c / TC_EVENTS_COST_DECAY;
    atomic_store(&g_events_cost_ns, took > c ? took : c);
}

static int set_events(long mask)
{
    int64_t t0 = now_ns();
    PyObject *r = PyObject_CallFunction(g_set_events, "il", g_tool, mask);
    events_learn(now_ns() - t0);
    if (r == NULL) {
        PyErr_Clear();
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

/* g_armed, each slot's `hooked` and the events switched on change together
 * under g_arm_mu (tc_lock.h; nothing with the GIL), so that an arm and a
 * disarm never overtake each other's event change.
 *
 * Free-threaded: every set_events stops the world, and a stop waits until
 * each running thread reaches a safe point -- on an oversubscribed machine
 * until the OS has scheduled every busy thread once: milliseconds a call,
 * where an idle machine takes microseconds.
 * So (1) the core lock is let go during the call (core_yield: the guarded
 * thread's hook must not wait behind it; the state it protects is
 * re-checked after, deliver_async), and (2) the events are switched off
 * lazily: the last disarm only notes the time, and the watchdog switches
 * them off once no hook has been armed for TC_EVENTS_HOLD_NS
 * (hook_idle_off) -- the delivering thread never waits for a stop of the
 * world on its way out, and deadlines firing close together arm without
 * one. */
static int g_events_on;              /* the events are switched on (g_arm_mu) */
static _Atomic int64_t g_events_idle_at; /* free-threaded: when the last hook
                                            was disarmed, 0 if armed or off */

static int hook_arm(tc_slot *s, PyThreadState *t)
{
    int r = 0;
    (void)t;
    TC_ARM_LOCK();
    if (!s->hooked) {
        if (!g_events_on) {
            tc_yielded y = core_yield();
            r = set_events(g_events);
            core_resume(y);
            g_events_on = r == 0;
        }
        if (r == 0) {
            atomic_fetch_add(&g_armed, 1);
            s->hooked = 1;
            atomic_store(&g_events_idle_at, 0);
        }
    }
    TC_ARM_UNLOCK();
    return r;
}

static void hook_disarm(tc_slot *s, PyThreadState *t)
{
    (void)t;
    insn_off(s);
#if TC_FREE_THREADED
    /* Without g_arm_mu: the delivering thread must not wait behind an arm
     * whose stop of the world is under way (a contended PyMutex spins with
     * sched_yield 40 times before it parks, which on an oversubscribed
     * machine lasts many scheduler ticks).  Events stay on; an arm meanwhile finds them on, and
     * hook_idle_off (under g_arm_mu) switches them off only while g_armed is
     * 0, so a stale idle time is harmless. */
    if (atomic_exchange(&s->hooked, 0) && atomic_fetch_sub(&g_armed, 1) == 1) {
        atomic_store(&g_events_idle_at, now_ns());
        if (s == t_slot)
            placement_step_aside(); /* not woken on this thread's CPU */
        wd_wake(); /* it plans the switch-off */
    }
#else
    TC_ARM_LOCK();
    if (s->hooked) {
        s->hooked = 0;
        if (--g_armed == 0) /* on failure the events stay on: slower, not wrong */
            g_events_on = set_events(0) < 0;
    }
    TC_ARM_UNLOCK();
#endif
}

/* When the watchdog should switch idle events off (TC_NEVER: nothing to do),
 * given when it next has something to do: if that comes within the hold or
 * within one pre-arm lead of the switch-off, the events stay on for it --
 * off and on again would be two stops of the world for nothing.  Any
 * thread, no lock. */
static int64_t hook_idle_off_at(int64_t next_event, int64_t now)
{
    int64_t idle = atomic_load(&g_events_idle_at), lead = prearm_lead();
    if (idle == 0 || atomic_load(&g_armed) > 0) /* armed since: its disarm stamps it again */
        return TC_NEVER;
    int64_t off = idle + TC_EVENTS_HOLD_NS;
    if (next_event != TC_NEVER &&
        next_event - (off > now ? off : now) < (lead > TC_EVENTS_HOLD_NS ? lead : TC_EVENTS_HOLD_NS))
        return TC_NEVER;
    return off;
}

/* Watchdog, attached, holding no lock of ours: switch the events off if no
 * hook has been armed since hook_idle_off_at(). */
static void hook_idle_off(int64_t now)
{
    TC_ARM_LOCK();
    int64_t idle = atomic_load(&g_events_idle_at);
    if (g_events_on && g_armed == 0 && idle != 0 && now >= idle + TC_EVENTS_HOLD_NS) {
        g_events_on = set_events(0) < 0;
        atomic_store(&g_events_idle_at, 0);
    }
    TC_ARM_UNLOCK();
}

/* Free-threaded: the hook does not wait for the core lock while another
 * thread holds it (a watchdog pass, a cancel): it tries again at the next
 * line boundary, which comes within nanoseconds.  Waiting would park the
 * thread, and on an oversubscribed machine a parked thread that the lock
 * is released to may wait for a CPU for longer than the deadline it
 * delivers, while an unparked one keeps running.  After TC_HOOK_MAX_SKIPS boundaries in a row
 * it waits after all, so a lock held over and over cannot starve it. */
static inline int hook_core_busy(tc_slot *s)
{
#if TC_FREE_THREADED
    if (!PyMutex_IsLocked(&g_core_mu) || ++s->hook_skips > TC_HOOK_MAX_SKIPS) {
        s->hook_skips = 0;
        return 0;
    }
    return 1;
#else
    (void)s;
    return 0;
#endif
}

/* Has the slot of this thread something for the hook to do now?  Every
 * thread calls the hook while any delivery is pending: the test of its own
 * slot needs no lock.  Free-threaded, a pre-armed slot not yet due has its
 * exception built here once, ahead of the deadline (prepare_in_thread). */
static inline int hook_wanted(tc_slot *s)
{
    if (s == NULL)
        return 0;
    if (atomic_load(&s->pending_any) || prearm_due(s))
        return 1;
#if TC_FREE_THREADED
    if (atomic_load(&s->prearmed))
        prepare_in_thread(s);
#endif
    return 0;
}

/* LINE callback (code, line); from 3.13 the PY_START callback (code,
 * offset) too: arguments unused. */
static PyObject *mon_line(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    tc_slot *s = t_slot;
    int r = 0;
    (void)m;
    (void)args;
    (void)nargs;
    if (!hook_wanted(s) || hook_core_busy(s))
        Py_RETURN_NONE;
    TC_CORE_BEGIN();
    prearm_fire(s);
    if (s->pending != NULL)
        r = deliver_here(s, 0, DELIVER_RAISE);
    TC_CORE_END();
    if (r < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* JUMP callback (code, from, to): a backward jump is a line boundary too
 * (a one-line loop has no LINE event). */
static PyObject *mon_jump(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    tc_slot *s = t_slot;
    int r = 0;
    (void)m;
    if (nargs < 3 || !hook_wanted(s))
        Py_RETURN_NONE;
    long from = PyLong_AsLong(args[1]), to = PyLong_AsLong(args[2]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    /* An exception raised for this jump is attributed to its target (the
     * loop head): raised here, or on 3.12 and 3.13.0-3.13.14 at the target
     * itself, from its INSTRUCTION event (tc_compat.h).  A target that cannot
     * raise may lie outside the handler of the loop's with/try (tc_compat.h)
     * -- except in a loop that jumps to itself, whose jump is the only
     * instruction it runs.  The jump itself is no measure: 3.12 and 3.13
     * leave a loop's closing JUMP_BACKWARD out of the handlers' ranges (`with
     * lock: while cond(): pass` on one line), and judged by it such a loop
     * was never stopped (tests/test_integrity.py). */
    if (to <= from) {
        PyFrameObject *f = PyEval_GetFrame(); /* borrowed */
        if ((f != NULL && to != from && tc_uncovered_no_raise(f, (int)to)) || hook_core_busy(s))
            Py_RETURN_NONE;
        TC_CORE_BEGIN();
        prearm_fire(s);
        if (s->pending != NULL && !jump_defer(s, args[0], to))
            r = deliver_here(s, 1, DELIVER_RAISE);
        TC_CORE_END();
        if (r < 0)
            return NULL;
    }
    Py_RETURN_NONE;
}

#if TC_JUMP_DEFER_BUILD
/* INSTRUCTION callback (code, offset), 3.12 and 3.13.0-3.13.14 only,
 * switched on by mon_jump for one instruction: the jump's target, where the
 * interrupt it decided on is raised (tc_compat.h).  Any thread running that code calls
 * it meanwhile; only the slot's own thread acts. */
static PyObject *mon_insn(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    tc_slot *s = t_slot;
    int r = 0;
    (void)m;
    if (s == NULL || s->insn_code == NULL || nargs < 2 || args[0] != s->insn_code)
        Py_RETURN_NONE;
    long at = PyLong_AsLong(args[1]);
    if (at == -1 && PyErr_Occurred())
        PyErr_Clear();
    TC_CORE_BEGIN();
    insn_off(s); /* the target or past it: once either way */
    if (at == s->insn_at && s->pending != NULL)
        r = deliver_here(s, 1, DELIVER_RAISE); /* its checks again, at the target */
    TC_CORE_END();
    if (r < 0)
        return NULL;
    Py_RETURN_NONE;
}
#endif

/* 3.12+: a stale async-exception bit only costs time (instrumented RESUME
 * advances before it handles the breaker); 3.13+ keeps it per thread. */
static void hook_drain(void) {}

/* Backstop: LINE and backward JUMP events cover every loop of bytecode, and
 * PY_START (3.13+) every call of Python code from a loop in C, so there is
 * nothing to add.  A loop in C that calls no Python code at all is beyond
 * any hook (docs: what stops). */
static void hook_nudge(tc_slot *s, PyThreadState *t)
{
    (void)s;
    (void)t;
}

static PyMethodDef g_mon_line_def = {"_on_line", (PyCFunction)(void (*)(void))mon_line,
                                     METH_FASTCALL, "timeoutcore delivery hook (LINE)."};
static PyMethodDef g_mon_jump_def = {"_on_jump", (PyCFunction)(void (*)(void))mon_jump,
                                     METH_FASTCALL, "timeoutcore delivery hook (JUMP)."};
#if TC_JUMP_DEFER_BUILD
static PyMethodDef g_mon_insn_def = {"_on_instruction", (PyCFunction)(void (*)(void))mon_insn,
                                     METH_FASTCALL, "timeoutcore delivery hook (INSTRUCTION)."};
#endif

/* Claim a free sys.monitoring tool id and register the callbacks.  Returns
 * 0, or -1 with an exception set. */
static int hook_setup(void)
{
    static const int candidates[] = {4, 3};
    PyObject *mon = NULL, *events = NULL, *cb = NULL, *r = NULL;
    long line, jump, start = 0;
    int rc = -1;

    mon = PyImport_ImportModule("sys");
    if (mon != NULL)
        Py_SETREF(mon, PyObject_GetAttrString(mon, "monitoring"));
    if (mon == NULL || (events = PyObject_GetAttrString(mon, "events")) == NULL)
        goto done;
    if ((r = PyObject_GetAttrString(events, "LINE")) == NULL)
        goto done;
    line = PyLong_AsLong(r);
    Py_SETREF(r, PyObject_GetAttrString(events, "JUMP"));
    if (r == NULL)
        goto done;
    jump = PyLong_AsLong(r);
#if TC_HOOK_PY_START
    Py_SETREF(r, PyObject_GetAttrString(events, "PY_START"));
    if (r == NULL)
        goto done;
    start = PyLong_AsLong(r);
#endif
    Py_CLEAR(r);
    for (size_t i = 0; i < sizeof candidates / sizeof candidates[0] && g_tool < 0; i++) {
        r = PyObject_CallMethod(mon, "get_tool", "i", candidates[i]);
        if (r == NULL)
            goto done;
        if (r == Py_None) {
            Py_SETREF(r, PyObject_CallMethod(mon, "use_tool_id", "is", candidates[i],
                                             "timeoutcore"));
            if (r == NULL)
                goto done;
            g_tool = candidates[i];
        }
        Py_CLEAR(r);
    }
    if (g_tool < 0) {
        PyErr_SetString(PyExc_RuntimeError,
                        "sys.monitoring tool ids 3 and 4 are both in use by other tools");
        goto done;
    }
    if ((cb = PyCFunction_New(&g_mon_line_def, NULL)) == NULL)
        goto done;
    if ((r = PyObject_CallMethod(mon, "register_callback", "ilO", g_tool, line, cb)) == NULL)
        goto done;
    Py_CLEAR(r);
    if (start != 0) {
        if ((r = PyObject_CallMethod(mon, "register_callback", "ilO", g_tool, start, cb)) == NULL)
            goto done;
        Py_CLEAR(r);
    }
    Py_SETREF(cb, PyCFunction_New(&g_mon_jump_def, NULL));
    if (cb == NULL)
        goto done;
    if ((r = PyObject_CallMethod(mon, "register_callback", "ilO", g_tool, jump, cb)) == NULL)
        goto done;
    if ((g_set_events = PyObject_GetAttrString(mon, "set_events")) == NULL)
        goto done;
#if TC_JUMP_DEFER_BUILD
    if ((g_jump_defer = tc_jump_raise_deferred())) {
        Py_CLEAR(r);
        if ((r = PyObject_GetAttrString(events, "INSTRUCTION")) == NULL)
            goto done;
        g_insn_event = PyLong_AsLong(r);
        Py_SETREF(cb, PyCFunction_New(&g_mon_insn_def, NULL));
        if (cb == NULL)
            goto done;
        Py_SETREF(r, PyObject_CallMethod(mon, "register_callback", "ilO", g_tool, g_insn_event, cb));
        if (r == NULL ||
            (g_set_local_events = PyObject_GetAttrString(mon, "set_local_events")) == NULL)
            goto done;
    }
#endif
    g_events = line | jump | start;
    rc = 0;
done:
    Py_XDECREF(r);
    Py_XDECREF(cb);
    Py_XDECREF(events);
    Py_XDECREF(mon);
    return rc;
}
#endif
