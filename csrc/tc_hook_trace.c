/*
 * tc_hook_trace.c -- the delivery hook on 3.11 (TC_HOOK_TRACE): a per-thread
 * C tracer, its opcode-event backstop for loops that jump to themselves, the
 * drain of 3.11's stale async-exception flag.  The tracer put to sleep
 * until the deadline is accelerator sleeping_tracer
 * (accel_sleeping_tracer.c), which this file wakes through its hook
 * (sleeping_tracer_wake).  Part of the unity build (timeoutcore.c), after
 * tc_deliver.c; the whole file is empty unless TC_HOOK_TRACE.
 *
 * Who calls what: trace_cb runs IN THE GUARDED THREAD, with the GIL, at its
 * line (and, when asked, opcode) events and calls deliver_here
 * (tc_deliver_steps.c).  hook_arm/hook_disarm/hook_nudge run with the GIL,
 * in the deliverer (the watchdog, a cancelling thread) while the slot's
 * thread is paused, or in that thread itself.  hook_drain runs in the
 * watchdog with the GIL and no lock of ours.  Nothing here runs in the
 * signal handler (the sleeping tracer's alarm does:
 * accel_sleeping_tracer.c).
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

static int hook_arm(tc_slot *s, PyThreadState *t)
{
    if (s->hooked) {
        sleeping_tracer_wake(s, t, 1); /* a delivery: a sleeping tracer must trace */
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
    sleeping_tracer_wake(s, t, 0); /* the handler leaves it alone from here */
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
    sleeping_tracer_wake(s, t, 1); /* a sleeping tracer's lost wake-up */
    if (t->c_tracefunc != trace_cb) {
        s->hooked = 0;
        op_frame_clear(s);
        s->prev_trace = NULL;
        Py_CLEAR(s->prev_traceobj);
        if (hook_arm(s, t) < 0)
            return;
    }
    {
        int gc = frames_look_begin(); /* tc_internal.h */
        f = PyThreadState_GetFrame(t);
        frames_look_end(gc);
    }
    if (f == NULL)
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
