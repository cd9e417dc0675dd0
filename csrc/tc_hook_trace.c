/*
 * tc_hook_trace.c -- the delivery hook on 3.11 (TC_HOOK_TRACE): a per-thread
 * C tracer, its opcode-event backstop for loops that jump to themselves, the
 * drain of 3.11's stale async-exception flag, and the sleeping tracer
 * (accelerator sleeping_tracer).  Part of the unity build (timeoutcore.c),
 * after tc_deliver.c; the whole file is empty unless TC_HOOK_TRACE.
 *
 * Who calls what: trace_cb runs IN THE GUARDED THREAD, with the GIL, at its
 * line (and, when asked, opcode) events and calls deliver_here
 * (tc_deliver_steps.c).  hook_arm/hook_disarm/hook_nudge/hook_sleep/
 * hook_wake run with the GIL, in the deliverer (the watchdog, a cancelling
 * thread) while the slot's thread is paused, or in that thread itself.
 * hook_wake_here is the one function here called from the signal handler
 * (tc_os.c: tc_handler), in the slot's thread: async-signal-safe -- atomics,
 * a clock read, a relaxed read of the GIL's holder, timer_settime, a futex
 * wake, and one byte store into the thread's own cframe (Races, below).  hook_drain runs in the watchdog with
 * the GIL and no lock of ours.
 */

#if TC_HOOK_TRACE
/* 3.11's stale async-exception flag.  3.11 keeps one interpreter-wide
 * "an async exception is pending" bit (ceval.pending.async_exc, part of the
 * eval breaker) that only a thread *consuming* its async exception clears;
 * PyThreadState_SetAsyncExc(id, NULL) sets it as well, and it stays set
 * while an async exception waits in a thread blocked in a C call.  Stale,
 * the eval breaker stays tripped for the whole interpreter -- a slowdown
 * without a tracer, but with one (ours) a spin: 3.11's DO_TRACING checks
 * the breaker at a RESUME before it advances, handles "nothing", and
 * dispatches the same RESUME again (seen: a deferred delivery in the main
 * thread spun at a function entry after the pure-Python engine had cleared
 * an exception; tests/test_integrity.py).  The core itself never
 * leaves the bit stale (it raises from the hook, not with SetAsyncExc), so
 * only the backstop -- a hard delivery still pending at a re-injection
 * time -- asks for a drain, and the watchdog, holding no lock of ours
 * (Python code may drop the GIL), raises an async exception in its own
 * thread and consumes it in an empty call: the consume clears the bit and
 * recomputes the breaker.  Not at every arm: if the drain's call gives the
 * GIL away (a waiter's drop request), the bit is set by the drain itself
 * until the watchdog gets the GIL back, and a hooked thread spins that long
 * (a loop that logs paid for it in its tail latency).  A soft
 * exception has no backstop: a stale bit holds it until the scope's hard
 * deadline brings one.  Another thread's real pending async exception stays
 * in its thread state and is met at its next breaker trip (what CPython
 * does with two of them anyway). */
static int g_drain_due;              /* GIL: a drain was asked for          */
static PyObject *g_drain_fn;         /* lambda: None                        */

static void hook_drain_request(void) { g_drain_due = 1; }

static void hook_drain(void)
{
    PyObject *et, *ev, *tb, *r;
    unsigned long me = PyThread_get_thread_ident();
    if (!g_drain_due || g_drain_fn == NULL)
        return;
    g_drain_due = 0;
    PyErr_Fetch(&et, &ev, &tb);
    if (PyThreadState_SetAsyncExc(me, PyExc_RuntimeError) == 1) {
        r = PyObject_CallNoArgs(g_drain_fn); /* its RESUME consumes it */
        if (r != NULL) { /* not consumed: take it back, try next time */
            Py_DECREF(r);
            (void)PyThreadState_SetAsyncExc(me, NULL);
            g_drain_due = 1;
        }
        PyErr_Clear();
    }
    PyErr_Restore(et, ev, tb);
}

/* Is frame `f` about to run a JUMP_BACKWARD (a loop's back-edge)? */
static int at_back_edge(PyFrameObject *f)
{
    return tc_opcode_at(f, PyFrame_GetLasti(f)) == JUMP_BACKWARD;
}

/* Opcode events of the frame the backstop chose are ours alone. */
static void op_frame_clear(tc_slot *s)
{
    if (s->op_frame == NULL)
        return;
    if (PyObject_SetAttrString(s->op_frame, "f_trace_opcodes", Py_False) < 0)
        PyErr_Clear();
    Py_CLEAR(s->op_frame);
}

static int trace_cb(PyObject *obj, PyFrameObject *frame, int what, PyObject *arg)
{
    tc_slot *s = t_slot;
    (void)obj;
    if (s == NULL)
        return 0;
    if (what == PyTrace_OPCODE && (PyObject *)frame == s->op_frame) {
        /* Turned on by the backstop for a loop without line events
         * (`while True: pass` jumps to itself, which 3.11 does not trace):
         * raise at its back-edge, where the eval breaker would have. */
        if (s->pending != NULL && at_back_edge(frame))
            return deliver_here(s, 1, DELIVER_RAISE);
        return 0;
    }
    if (s->prev_trace != NULL && s->prev_trace(s->prev_traceobj, frame, what, arg) != 0)
        return -1; /* the thread's own tracer raised */
    if (what == PyTrace_LINE && prearm_due(s))
        prearm_fire(s);
    if (what == PyTrace_LINE && s->pending != NULL)
        return deliver_here(s, 0, DELIVER_RAISE);
    return 0;
}

/* -- The sleeping tracer (3.11) -----------------------------------------------
 * Why: with a tracer set, 3.11's eval loop sends every instruction of the
 * thread down its tracing path, not only the line events: a CPU loop runs
 * several times slower with ours armed.  A pre-armed thread had it on from
 * the pre-arm -- a lead ahead of the deadline, or the block's entry when
 * the deadline is nearer (tc_wd_fire.c: slot_self_prearm) -- to the
 * deadline: in a pool under frequent short deadlines, most of what the
 * deadlines cost the pool (bench_contention.py
 * test_cpu_pool_under_deadlines).  So a pre-arm
 * puts the tracer in place asleep (hook_sleep): c_tracefunc is ours, but
 * the thread's cframe->use_tracing -- the byte 3.11 ORs into every opcode --
 * is 0, and the thread's own kernel timer is set for the deadline.  Its
 * signal handler, in the thread, sets the byte (hook_wake_here): the thread
 * traces from its next instruction and fires at its next line; if it does
 * not hold the GIL then, the handler wakes the watchdog, which opens the
 * fast window for it (wd_plan).  The timer is then set again for the
 * watchdog's backstop (tc_tuning.h: TC_BACKSTOP_NS).  A delivery for the
 * slot (hook_arm while hooked) or its disarm wakes the tracer with the GIL
 * (hook_wake).  Without a kernel timer the tracer stays awake.
 *
 * Races.  use_tracing belongs to the thread's innermost eval loop (on its
 * C stack, tstate->cframe), written by CPython with the GIL: by the thread
 * when it enters or leaves an eval loop (copied from, then back to, the
 * enclosing one) and by _PyEval_SetTrace, which another thread may call for
 * it while it waits for the GIL (ours: wd_prearm, deliver_async).  The
 * handler runs in the thread itself, so against the thread's own code it
 * can only interrupt it: (a) between a new eval loop's copy of the byte and
 * its publishing of its cframe, or between an exit's restoring the old
 * cframe and copying the byte back, a wake-up can be lost -- the fire at the
 * grace's end (the watchdog's, with the GIL) wakes the tracer again; (b)
 * inside _PyEval_SetTrace, which sets the byte last, from the tracer it
 * installs: CPython's own answer wins.  Against another thread: the handler
 * writes only while `dormant` is set, inside `waking`; whoever else touches
 * the thread's tracer (hook_wake, hook_disarm) first clears `dormant`, then
 * waits for `waking` to drop (sequentially consistent atomics: one of the
 * two sees the other), so its write comes after the handler's.  Anything
 * that recomputes the byte early (sys.setprofile, PyThreadState_LeaveTracing
 * in some extension) only makes the thread trace early: the hook checks the
 * deadline at each line and does nothing before it.  The thread state the
 * handler writes to is the one hook_sleep was given, alive while the slot
 * is dormant: only a block running in that thread is pre-armed, and its
 * exit disarms. */

/* GIL, the slot's thread paused or the caller: the tracer is no longer
 * asleep; with `on`, it traces from the thread's next instruction -- set
 * even if the handler has woken it already, since that wake-up may have
 * been lost (above, (a)). */
static void hook_wake(tc_slot *s, PyThreadState *t, int on)
{
    if (atomic_exchange(&s->dormant, 0))
        while (atomic_load(&s->waking)) /* the thread's handler is writing */
            sched_yield();
    if (on && t != NULL && t->c_tracefunc == trace_cb)
        t->cframe->use_tracing = 255;
}

/* GIL, the slot's thread paused or the caller, right after the pre-arm's
 * hook_arm: put the tracer to sleep until `deadline`.  The alarm holds the
 * slot's timer for its current gen (tc_os.c: timer_set_at), so the
 * watchdog's backstop does not set it again (rescue_arm); the handler
 * does, after the alarm. */
static void hook_sleep(tc_slot *s, PyThreadState *t, int64_t deadline)
{
    if (!accel_on(ACCEL_SLEEPING_TRACER) || !s->hooked || !s->timer_ok || t == NULL ||
        t->c_tracefunc != trace_cb || s->prev_trace != NULL || t->c_profilefunc != NULL ||
        t->tracing || deadline <= now_ns())
        return; /* someone else's tracer or profiler: it traces anyway */
    s->sleep_ts = t;
    t->cframe->use_tracing = 0;
    atomic_store(&s->dormant, 1); /* before the alarm: it may go off at once */
    if (timer_set_at(s, atomic_load(&s->gen), deadline) != 0) {
        hook_wake(s, t, 1); /* no alarm: it stays awake */
        return;
    }
    STAT_INC(tracer_sleeps);
}

/* The slot's thread, in its signal handler (tc_os.c: tc_handler), for any
 * of the slot's timer signals: if its tracer sleeps and the deadline has
 * come, wake it, set the timer for the backstop, and wake the watchdog if
 * the thread must first get the GIL back.  Returns 1 if it woke the
 * tracer.  Async-signal-safe: atomics, a clock read, system calls. */
static int hook_wake_here(tc_slot *s)
{
    int woke = 0;
    int64_t d;
    atomic_store(&s->waking, 1);
    if (atomic_load(&s->dormant) && (d = atomic_load(&s->deadline)) <= now_ns()) {
        PyThreadState *t = s->sleep_ts;
        const void *holder = NULL;
        if (t->c_tracefunc == trace_cb)
            __atomic_store_n(&t->cframe->use_tracing, (uint8_t)255, __ATOMIC_RELAXED);
        atomic_store(&s->dormant, 0);
        woke = 1;
        STAT_INC(tracer_alarms);
        uint64_t gen = atomic_load(&s->gen);
        if (atomic_load(&s->backstop_gen) == gen) /* the alarm's: now the backstop's */
            (void)timer_set_at(s, gen, d + TC_BACKSTOP_NS);
        if (!(tc_gil_holder(&holder) == 1 && holder == (const void *)t))
            wd_wake();
    }
    atomic_store(&s->waking, 0);
    return woke;
}

static int hook_arm(tc_slot *s, PyThreadState *t)
{
    if (s->hooked) {
        hook_wake(s, t, 1); /* a delivery: a sleeping tracer must trace */
        return 0;
    }
    if (t->c_tracefunc == trace_cb)
        return -1; /* inconsistent: never chain to ourselves */
    s->prev_trace = t->c_tracefunc;
    s->prev_traceobj = t->c_traceobj;
    Py_XINCREF(s->prev_traceobj);
    /* The thread's own trace object stays in place, so sys.gettrace() still
     * returns it (a debugger that saves and restores it keeps it). */
    if (_PyEval_SetTrace(t, trace_cb, s->prev_traceobj) < 0) {
        PyErr_Clear();
        s->prev_trace = NULL;
        Py_CLEAR(s->prev_traceobj);
        return -1;
    }
    s->hooked = 1;
    return 0;
}

static void hook_disarm(tc_slot *s, PyThreadState *t)
{
    if (!s->hooked)
        return;
    hook_wake(s, t, 0); /* the handler leaves it alone from here */
    s->hooked = 0;
    op_frame_clear(s);
    /* If the thread replaced our tracer meanwhile (sys.settrace), theirs
     * stays; else the one we found is put back. */
    if (t != NULL && t->c_tracefunc == trace_cb &&
        _PyEval_SetTrace(t, s->prev_trace, s->prev_traceobj) < 0)
        PyErr_Clear();
    s->prev_trace = NULL;
    Py_CLEAR(s->prev_traceobj);
}

/* Backstop (watchdog, GIL held, thread `t` paused): still pending.  If the
 * thread replaced our tracer (sys.settrace), chain to the new one; and turn
 * on opcode events for its innermost frame, in case it loops without line
 * boundaries.  Nothing is raised from here: the hook decides, in the
 * thread. */
static void hook_nudge(tc_slot *s, PyThreadState *t)
{
    PyFrameObject *f;
    hook_drain_request(); /* still pending: a stale flag may be what holds it */
    hook_wake(s, t, 1);   /* a sleeping tracer's lost wake-up (above) */
    if (t->c_tracefunc != trace_cb) {
        s->hooked = 0;
        op_frame_clear(s);
        s->prev_trace = NULL;
        Py_CLEAR(s->prev_traceobj);
        if (hook_arm(s, t) < 0)
            return;
    }
    if ((f = PyThreadState_GetFrame(t)) == NULL)
        return;
    if ((PyObject *)f == s->op_frame) {
        Py_DECREF(f);
        return;
    }
    op_frame_clear(s);
    {
        PyObject *was = PyObject_GetAttrString((PyObject *)f, "f_trace_opcodes");
        int on = was == Py_True;
        Py_XDECREF(was);
        PyErr_Clear();
        if (on) { /* someone traces its opcodes already: leave it alone */
            Py_DECREF(f);
            return;
        }
    }
    if (PyObject_SetAttrString((PyObject *)f, "f_trace_opcodes", Py_True) < 0) {
        PyErr_Clear();
        Py_DECREF(f);
        return;
    }
    s->op_frame = (PyObject *)f; /* the reference moves here */
}

static int64_t hook_idle_off_at(int64_t next_event, int64_t now)
{
    (void)next_event;
    (void)now;
    return TC_NEVER;
}
static void hook_idle_off(int64_t now) { (void)now; }

static int hook_setup(void)
{
    PyObject *g = PyDict_New(), *r = NULL;
    if (g != NULL && PyDict_SetItemString(g, "__builtins__", PyEval_GetBuiltins()) == 0)
        r = PyRun_String("lambda: None", Py_eval_input, g, g);
    Py_XDECREF(g);
    if (r == NULL)
        return -1;
    g_drain_fn = r;
    return 0;
}

#endif /* TC_HOOK_TRACE */
