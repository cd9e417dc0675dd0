/*
 * tc_deliver.c -- safe delivery: where a fired interrupt surfaces.  Part of
 * the unity build (timeoutcore.c).
 *
 * Why: an asynchronous exception surfaces at the guarded thread's next
 * eval-breaker check, wherever that is -- inside logging.Handler.acquire()
 * just after the lock was taken, in Condition.__enter__, half-way through
 * Queue or Future bookkeeping -- and leaves a lock held or an invariant
 * broken for the whole process (bpo-29988: CPython will not make that safe
 * in general).  So the interrupt is not raised by PyThreadState_SetAsyncExc.
 * The deliverer (the watchdog, with the GIL) stores it in the slot as
 * *pending* and arms a hook that runs IN THE GUARDED THREAD at its next line
 * boundary (tc_compat.h: a per-thread C tracer on 3.11, a sys.monitoring
 * tool on 3.12+).  There the decision is taken at the moment of delivery:
 * if any frame from the innermost up to (not including) the frame of the
 * scope's with statement runs protected code, the interrupt waits for the
 * next line boundary; otherwise the hook disarms itself and raises it there,
 * as if the line had raised it.  A line boundary is also never inside a
 * `with` statement's own set-up, so the 3.14 gap between __enter__ and the
 * block's handler (gh-148874) is never hit.
 *
 * Protected code: modules named by the Python layer (_set_protection: a
 * module and its submodules, by the frame's __name__) and code objects the
 * user protected.  A scope whose frame is not on the stack (a generator that
 * yielded inside its with) is bounded by its owner frame (tc_guarded.c: the
 * frame that resumes such wrappers) when that is on the stack, so protected
 * code anywhere between the two holds the interrupt back; with neither on
 * the stack, the innermost frame decides (stack_protected).
 *
 * The watchdog never raises into the thread itself while the hook is armed
 * (deliver_backstop): a stack it checks from outside is not the stack the
 * thread will be on when an asynchronous exception surfaces.  On 3.11, where
 * a loop that jumps to itself has no line event, it turns on opcode events
 * for the thread's innermost frame, and the hook raises at that frame's
 * back-edge -- still decided in the thread.
 *
 * Explicit raise points -- timeoutcore.sleep(), checkpoint(), a shield's
 * exit, a scope's enter or exit -- still raise synchronously: they are where
 * the caller asked for it.  Without a hook (set-up failed, or sys.monitoring
 * had no free tool id) delivery falls back to PyThreadState_SetAsyncExc.
 * All of this runs with the GIL -- on a free-threaded build inside the core
 * lock (tc_lock.h), which the hook takes only after a lock-free look at its
 * own slot's pending_any.  There the check stays the thread's own: no
 * thread ever reads another thread's frames (they could be changing, or
 * freed, under it), so the stack walk below needs no stop-the-world.
 */

enum { HOOK_NONE = 0, HOOK_TRACE = 1, HOOK_MONITORING = 2 };

static int g_hook_mode = HOOK_NONE;  /* set by _setup_delivery              */
static PyObject *g_prot_names;       /* tuple of str: protected modules     */
static PyObject *g_exempt_names;     /* tuple of str: modules under those that
                                        are not (the more specific wins)    */
static PyObject *g_prot_codes;       /* set of code objects, or NULL        */
static Py_ssize_t g_extra = -1;      /* co_extra index of the verdict cache */
static uintptr_t g_prot_gen = 1;     /* bumped when the protected set changes */
static PyObject *g_defer_report;     /* report(scope) at exit, or NULL      */
static int64_t g_defer_cap_ns;       /* ... when deferred longer than this  */

/* -- Protected code ---------------------------------------------------------- */

/* Length of the longest entry of `names` that is `name` or a package of it,
 * or -1. */
static Py_ssize_t longest_match(PyObject *names, PyObject *name)
{
    Py_ssize_t n = names != NULL ? PyTuple_GET_SIZE(names) : 0;
    Py_ssize_t ln = PyUnicode_GET_LENGTH(name), best = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *p = PyTuple_GET_ITEM(names, i);
        Py_ssize_t lp = PyUnicode_GET_LENGTH(p);
        if (lp <= best || ln < lp || PyUnicode_Tailmatch(name, p, 0, lp, -1) != 1)
            continue;
        if (ln == lp || PyUnicode_READ_CHAR(name, lp) == '.')
            best = lp;
    }
    return best;
}

/* Module `name` is protected: a protected entry covers it, and no exempt
 * entry more specific than that one. */
static int name_protected(PyObject *name)
{
    Py_ssize_t prot = longest_match(g_prot_names, name);
    return prot >= 0 && longest_match(g_exempt_names, name) <= prot;
}

/* Does frame `f` run protected code?  The verdict is cached on the code
 * object itself, in a co_extra slot of ours (the per-code-object store
 * CPython offers tools, tc_compat.h): (generation << 2) | 2 | verdict, so a
 * change of the protected set (a new generation) invalidates every entry at
 * once, and a lookup costs no hashing (a code object's hash covers its
 * contents).  Without a slot (all 255 taken) every call decides afresh. */
static int frame_protected(PyFrameObject *f)
{
    PyCodeObject *code = PyFrame_GetCode(f);
    void *extra = NULL;
    int r = 0;
    if (g_extra >= 0 && tc_code_get_extra((PyObject *)code, g_extra, &extra) == 0 &&
        extra != NULL && ((uintptr_t)extra >> 2) == g_prot_gen) {
        Py_DECREF(code);
        return (int)((uintptr_t)extra & 1);
    }
    PyErr_Clear();
    if (code_protected_by_name(code) || code_dropped_once(code)) /* tc_guarded.c */
        r = 1;
    else if (g_prot_codes != NULL && PySet_Contains(g_prot_codes, (PyObject *)code) == 1)
        r = 1;
    else {
        PyObject *globals = PyFrame_GetGlobals(f);
        PyObject *name = globals != NULL ? PyDict_GetItemWithError(globals, g_name_key) : NULL;
        if (name != NULL && PyUnicode_Check(name))
            r = name_protected(name);
        Py_XDECREF(globals);
    }
    PyErr_Clear();
    if (g_extra >= 0 &&
        tc_code_set_extra((PyObject *)code, g_extra, (void *)((g_prot_gen << 2) | 2u | (uintptr_t)r)) < 0)
        PyErr_Clear();
    Py_DECREF(code);
    return r;
}

/* "file:line in function" for a frame (new reference, or NULL). */
static PyObject *frame_where(PyFrameObject *f)
{
    PyCodeObject *code = PyFrame_GetCode(f);
    PyObject *s = PyUnicode_FromFormat("%U:%d in %U", code->co_filename,
                                       PyFrame_GetLineNumber(f), code->co_qualname);
    Py_DECREF(code);
    if (s == NULL)
        PyErr_Clear();
    return s;
}

/* Is `f` the frame whose with statement entered scope `sc` (tc_compat.h)? */
static int is_scope_frame(PyFrameObject *f, Scope *sc)
{
#if TC_IFRAME_ID
    if (sc->owner != NULL) /* the wrapper returns, and another frame may take its
                              address: its frame object, held, is the identity */
        return (PyObject *)f == sc->frame;
    return sc->iframe != NULL && tc_frame_iframe(f) == sc->iframe;
#else
    return sc->frame != NULL && (PyObject *)f == sc->frame;
#endif
}

/* Is `f` the frame of the code that scope `sc` guards for a wrapper
 * (tc_guarded.c)? */
static int is_owner_frame(PyFrameObject *f, Scope *sc)
{
    return sc->owner != NULL && (PyObject *)f == sc->owner;
}

/* Would an exception raised at `f`'s current instruction leave `f` (no
 * handler of its own covers it)? */
static int tc_leaves_test(PyCodeObject *code, const unsigned char *b, Py_ssize_t n, int off)
{
    (void)b;
    (void)n;
    return tc_exc_handler(code, off / 2) < 0;
}

/* Is protected code running between `cur` (the innermost frame, a new
 * reference, consumed) and the frame of scope `sc` (exclusive; NULL: none)?
 * The frame is the one whose code entered the scope, or once that has
 * returned, a wrapper scope's owner (tc_guarded.c); the entering frame of a
 * wrapper scope counts as protected where an exception would leave it.
 * On 1, *where (if not NULL and still NULL) gets the outermost protected
 * frame's description. */
static int stack_protected(PyFrameObject *cur, Scope *sc, PyObject **where)
{
    PyFrameObject *outer = NULL; /* outermost protected, strong */
    int innermost, found = 0, named = 0;
    if (cur == NULL)
        return 0;
    innermost = frame_protected(cur);
    while (cur != NULL) {
        PyFrameObject *back;
        if (sc != NULL && is_scope_frame(cur, sc)) {
            found = 1;
            if (sc->owner != NULL && tc_ask_code(cur, PyFrame_GetLasti(cur), tc_leaves_test, 0)) {
                Py_INCREF(cur);
                Py_XSETREF(outer, cur);
            }
            break;
        }
        if (sc != NULL && is_owner_frame(cur, sc)) {
            found = 1;
            break;
        }
        if (frame_protected(cur)) {
            PyCodeObject *code = PyFrame_GetCode(cur);
            named |= code_protected_by_name(code);
            Py_DECREF(code);
            Py_INCREF(cur);
            Py_XSETREF(outer, cur);
        }
        back = PyFrame_GetBack(cur);
        Py_DECREF(cur);
        cur = back;
    }
    Py_XDECREF(cur);
    /* No bound on the stack (a generator's scope while it is suspended, a
     * scope whose entering code and owner have both returned -- entered
     * through a helper function): the innermost frame decides, and an exit,
     * an entry or a finalizer anywhere on the stack (tc_guarded.c): the
     * block's own code cannot be told from the code around it, but an
     * exit is never the block. */
    int r = found ? outer != NULL : innermost || named;
    if (r && where != NULL && *where == NULL && outer != NULL)
        *where = frame_where(outer);
    Py_XDECREF(outer);
    return r;
}

/* Is our interrupt being raised, or handled (except/finally/__exit__), in
 * thread `t` now (GIL held; free-threaded: `t` is the caller's own)?  Then
 * it was not swallowed, and raising it again would tear the handler that is
 * cleaning up. */
static int interrupt_in_flight(PyThreadState *t)
{
    return tc_raising(t, g_interrupt) || tc_handling(t, g_interrupt);
}

/* -- The hook: per-thread tracer (3.11) or sys.monitoring tool (3.12+) ---------- */

/* How deliver_here acts once it has decided to raise. */
enum {
    DELIVER_RAISE = 0,      /* raise here                                  */
    DELIVER_ASYNC_SELF = 1, /* as an async exception of this thread (3.12) */
    DELIVER_DECIDE = 2      /* only say so (3.13.0-3.13.14: mon_jump)      */
};
static int deliver_here(tc_slot *s, int vetted, int mode);
static void deliver_pending(tc_slot *s, int async_self);
static void deliver_pending_here(tc_slot *s);
static int slot_fire(tc_slot *s, int64_t now, int local); /* tc_slot.c */
#if TC_FREE_THREADED
static void wd_step_aside(void); /* tc_watchdog.c */
#endif

/* -- Pre-armed slots ----------------------------------------------------------
 * The watchdog may arm the hook shortly before a deadline (wd_prearm,
 * tc_watchdog.c) instead of waiting to act at the deadline itself: with a
 * GIL it has taken the GIL ahead of the deadline anyway (anticipation) and
 * used to hold it up to the deadline, which stalled the whole process and
 * left the guarded thread asleep, to be woken by the GIL hand-off (~0.1 ms
 * on this machine class, then a cold cache); free-threaded, arming stops
 * the world, which on a busy machine takes milliseconds.  Pre-armed, the
 * guarded thread, while it runs Python, fires its own deadline at its first
 * line boundary past it (the same slot_fire as the watchdog's, then the
 * same safe-point checks, deliver_here), and nothing waits for another
 * thread.  The watchdog still fires the slot TC_PREARM_GRACE_NS after the
 * deadline if the thread has not (blocked in C, or not scheduled), with
 * its kick.  Whoever is first fires (the state moves to INJECTED under the
 * GIL / core lock); the other finds nothing to do. */

/* How long switching the delivery events lately took: a maximum that decays
 * by an eighth a switch.  Free-threaded, each switch stops the world, and
 * the watchdog pre-arms twice that long ahead of a deadline (prearm_lead),
 * so that the stop is over -- and the guarded thread runs again -- before
 * the deadline; with a GIL a switch is cheap and only reported.  Written by
 * whoever switched (a lost update between two of them only costs one
 * sample). */
static _Atomic int64_t g_events_cost_ns;

/* How long before a deadline the watchdog arms the hook (free-threaded). */
static int64_t prearm_lead(void)
{
#if TC_FREE_THREADED
    int64_t lead = 2 * atomic_load(&g_events_cost_ns);
    return !accel_on(ACCEL_PREARM)        ? 0 /* none: the watchdog comes at the deadline */
           : lead < TC_PREARM_LEAD_MIN_NS ? TC_PREARM_LEAD_MIN_NS
           : lead > TC_PREARM_LEAD_MAX_NS ? TC_PREARM_LEAD_MAX_NS : lead;
#else
    return 0;
#endif
}

/* The slot's own thread notes the CPU it runs on, for the watchdog
 * (sched_getcpu reads the kernel's rseq area, a load; stored only when it
 * changed). */
static inline void slot_note_cpu(tc_slot *s)
{
    int cpu = sched_getcpu();
    if (cpu != atomic_load_explicit(&s->cpu, memory_order_relaxed))
        atomic_store_explicit(&s->cpu, cpu, memory_order_relaxed);
}

/* The hook's test, any thread, no lock: pre-armed and due?  Free-threaded,
 * a pre-armed slot's thread also notes its CPU here for the watchdog
 * (tc_internal.h: TC_PIN_AHEAD_NS). */
static inline int prearm_due(tc_slot *s)
{
    if (!atomic_load(&s->prearmed))
        return 0;
#if TC_FREE_THREADED
    slot_note_cpu(s);
#endif
    return atomic_load(&s->shield) == 0 && atomic_load(&s->deadline) <= now_ns();
}

/* Owner thread, GIL / core lock: fire a pre-armed, due slot here.  Pending
 * here: no kick.  The fast window stays open until the exit claims it (it
 * is open for the pre-arm's grace already): the exit runs Python -- the
 * exception's construction -- and a thread asked to give the GIL away there
 * must get it back within the window (measured, 3.12.1 with 3 spinning
 * threads: an exit of 5.4 ms after a self-fire when the window had closed). */
static void prearm_fire(tc_slot *s)
{
    int64_t now = now_ns();
    if (s->pending == NULL && atomic_load(&s->prearmed) && /* else nothing to fire */
        atomic_load(&s->state) == SLOT_ARMED && slot_fire(s, now, 0)) {
        atomic_store(&s->fast_until, now + TC_FAST_HOLD_NS);
        STAT_INC(self_fires);
#if TC_FREE_THREADED
        wd_step_aside();
#endif
    }
}

/* The slot's effective deadline changed to `d` (tc_slot.c: slot_publish; a
 * reschedule, a cancel, a scope's entry or exit): a sleeping tracer's alarm
 * (3.11, below) follows it (a cancel: at once).  Returns 1 if the timer is
 * the alarm's. */
static int hook_alarm_follows(tc_slot *s, int64_t d)
{
#if TC_HOOK_TRACE
    return atomic_load(&s->dormant) && d != TC_NEVER &&
           timer_set_at(s, atomic_load(&s->gen), d) == 0;
#else
    (void)s;
    (void)d;
    return 0;
#endif
}

#if !TC_HOOK_TRACE
/* The slot's thread, in its signal handler: only 3.11's tracer sleeps. */
static int hook_wake_here(tc_slot *s)
{
    (void)s;
    return 0;
}
#endif

#if TC_HOOK_TRACE
/* 3.11's stale async-exception flag.  3.11 keeps one interpreter-wide
 * "an async exception is pending" bit (ceval.pending.async_exc, part of the
 * eval breaker) that only a thread *consuming* its async exception clears;
 * PyThreadState_SetAsyncExc(id, NULL) sets it as well, and it stays set
 * while an async exception waits in a thread blocked in a C call.  Stale,
 * the eval breaker stays tripped for the whole interpreter -- a slowdown
 * without a tracer, but with one (ours) a spin: 3.11's DO_TRACING checks
 * the breaker at a RESUME before it advances, handles "nothing", and
 * dispatches the same RESUME again (measured: a deferred delivery in the
 * main thread spun at a function entry after the pure-Python engine had
 * cleared an exception; tests/test_integrity.py).  The core itself never
 * leaves the bit stale (it raises from the hook, not with SetAsyncExc), so
 * only the backstop -- a hard delivery still pending at a re-injection
 * time -- asks for a drain, and the watchdog, holding no lock of ours
 * (Python code may drop the GIL), raises an async exception in its own
 * thread and consumes it in an empty call: the consume clears the bit and
 * recomputes the breaker.  Not at every arm: if the drain's call gives the
 * GIL away (a waiter's drop request), the bit is set by the drain itself
 * until the watchdog gets the GIL back, and a hooked thread spins that long
 * (measured: a 5 ms p90 for a loop that logs, gone without it).  A soft
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
 * at a quarter of its speed with ours armed (3.11.7, 2000 alternated blocks
 * of 0.5 ms).  A pre-armed thread had it on from the pre-arm -- a lead
 * ahead of the deadline, or the block's entry when the deadline is nearer
 * (tc_watchdog.c: slot_self_prearm) -- to the deadline: in a pool of 4
 * workers with a 1 ms deadline on every 4th 2 ms task, most of what the
 * deadlines cost the pool (0.83x its throughput without).  So a pre-arm
 * puts the tracer in place asleep (hook_sleep): c_tracefunc is ours, but
 * the thread's cframe->use_tracing -- the byte 3.11 ORs into every opcode --
 * is 0, and the thread's own kernel timer is set for the deadline.  Its
 * signal handler, in the thread, sets the byte (hook_wake_here): the thread
 * traces from its next instruction and fires at its next line; if it does
 * not hold the GIL then, the handler wakes the watchdog, which opens the
 * fast window for it (wd_plan).  The timer is then set again for the
 * watchdog's backstop (tc_internal.h: TC_BACKSTOP_NS).  A delivery for the
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
 * watchdog's backstop does not set it again (timer_backstop); the handler
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

#else /* sys.monitoring */

static PyObject *g_set_events;       /* sys.monitoring.set_events          */
static int g_tool = -1;              /* our tool id                         */
static long g_events;                /* LINE | JUMP                         */
static _Atomic int g_armed;          /* threads with the hook armed         */

#if TC_JUMP_DEFER_BUILD
/* 3.13.0-3.13.14: raising at a jump's target (tc_compat.h: the JUMP bug).
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
 * Returns 1 if it took the delivery on (3.13.0-3.13.14), 0 if the caller
 * raises as usual. */
static int jump_defer(tc_slot *s, PyObject *code, long to, int vetted)
{
    if (!g_jump_defer)
        return 0;
    if (deliver_here(s, vetted, DELIVER_DECIDE) == 1 && s->insn_code == NULL &&
        insn_events(code, 1) == 0) {
        Py_INCREF(code);
        s->insn_code = code;
        s->insn_at = to;
    }
    return 1;
}
#else
static inline void insn_off(tc_slot *s) { (void)s; }
static inline int jump_defer(tc_slot *s, PyObject *code, long to, int vetted)
{
    (void)s;
    (void)code;
    (void)to;
    (void)vetted;
    return 0;
}
#endif

static void events_learn(int64_t took) /* g_events_cost_ns, above */
{
    int64_t c = atomic_load(&g_events_cost_ns);
    c -= c / 8;
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
 * until the OS has scheduled every busy thread once (measured on 2 cores
 * with 3 spinning threads: 2-6 ms a call, against 0.02 ms on an idle one).
 * So (1) the core lock is let go during the call (core_yield: the guarded
 * thread's hook must not wait behind it; the state it protects is
 * re-checked after, deliver_async), and (2) the events are switched off
 * lazily: the last disarm only notes the time, and the watchdog switches
 * them off once no hook has been armed for TC_EVENTS_HOLD_NS
 * (hook_idle_off) -- the delivering thread never waits for a stop of the
 * world on its way out, and deadlines firing close together arm without
 * one. */
#define TC_EVENTS_HOLD_NS 5000000LL
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
     * sched_yield 40 times before it parks: on an oversubscribed machine
     * ~55 ms, measured).  Events stay on; an arm meanwhile finds them on, and
     * hook_idle_off (under g_arm_mu) switches them off only while g_armed is
     * 0, so a stale idle time is harmless. */
    if (atomic_exchange(&s->hooked, 0) && atomic_fetch_sub(&g_armed, 1) == 1) {
        atomic_store(&g_events_idle_at, now_ns());
        if (s == t_slot)
            wd_step_aside(); /* not woken on this thread's CPU: tc_watchdog.c */
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
 * is released to was measured to wait for the CPU for up to ~60 ms (2 cores,
 * 3 spinning threads: a 50 ms deadline landed 57 ms late), while an
 * unparked one keeps running.  After TC_HOOK_MAX_SKIPS boundaries in a row
 * it waits after all, so a lock held over and over cannot starve it. */
#define TC_HOOK_MAX_SKIPS 256
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

/* LINE callback (code, line). */
static PyObject *mon_line(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    tc_slot *s = t_slot;
    int r = 0;
    (void)m;
    (void)args;
    (void)nargs;
    /* Every thread calls this while any delivery is pending: the test of
     * its own slot needs no lock. */
    if (s == NULL || (!atomic_load(&s->pending_any) && !prearm_due(s)) || hook_core_busy(s))
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
    if (s == NULL || (!atomic_load(&s->pending_any) && !prearm_due(s)) || nargs < 3)
        Py_RETURN_NONE;
    long from = PyLong_AsLong(args[1]), to = PyLong_AsLong(args[2]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    /* An exception raised here is attributed to the jump's target (the loop
     * head); a target that cannot raise may lie outside the handler of the
     * loop's with/try (tc_compat.h) -- except in a loop that jumps to
     * itself, whose jump is the only instruction it runs.  The jump itself
     * is no measure: 3.13 leaves a loop's closing JUMP_BACKWARD out of the
     * handlers' ranges (`with lock: while cond(): pass` on one line), and
     * judged by it such a loop was never stopped (tests/test_integrity.py).
     * 3.12 raises at the jump itself (TC_JUMP_RAISE_BROKEN): judged there. */
    int vetted = to == from || !TC_JUMP_RAISE_BROKEN;
    if (to <= from) {
        PyFrameObject *f = PyEval_GetFrame(); /* borrowed */
        if ((f != NULL && to != from && tc_uncovered_no_raise(f, (int)to)) || hook_core_busy(s))
            Py_RETURN_NONE;
        TC_CORE_BEGIN();
        prearm_fire(s);
        if (s->pending != NULL && !jump_defer(s, args[0], to, vetted))
            r = deliver_here(s, vetted, TC_JUMP_RAISE_BROKEN ? DELIVER_ASYNC_SELF : DELIVER_RAISE);
        TC_CORE_END();
        if (r < 0)
            return NULL;
    }
    Py_RETURN_NONE;
}

#if TC_JUMP_DEFER_BUILD
/* INSTRUCTION callback (code, offset), 3.13.0-3.13.14 only, switched on by
 * mon_jump for one instruction: the jump's target, where the interrupt it
 * decided on is raised (tc_compat.h).  Any thread running that code calls
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

/* Backstop: LINE and backward JUMP events cover every loop of bytecode, so
 * there is nothing to add. */
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
    long line, jump;
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
    g_events = line | jump;
    rc = 0;
done:
    Py_XDECREF(r);
    Py_XDECREF(cb);
    Py_XDECREF(events);
    Py_XDECREF(mon);
    return rc;
}
#endif

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
    return s == t_slot ? PyThreadState_Get() : tc_find_tstate(s->ident);
#endif
}

#if TC_DIRECT_BACK_EDGE
/* -- Direct delivery at a back-edge (3.11, 3.12) --------------------------------
 * Why: the hook costs every thread while it is armed on 3.12 (its events are
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
 * GIL), so it resumes at the instruction judged.  Exceptions to "first
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
    int ok;
    if (s == t_slot || t == NULL || s->pending != NULL || s->async_pending ||
        s->ident == tc_main_thread() || tc_gc_collecting() || interrupt_in_flight(t))
        return 0;
    if ((f = PyThreadState_GetFrame(t)) == NULL)
        return 0;
    ok = tc_back_edge_in_loop(f);
    if (ok) {
        Py_INCREF(f); /* stack_protected consumes one */
        ok = !stack_protected(f, scope != NULL ? as_scope(scope) : NULL, NULL);
    }
    Py_DECREF(f);
    if (!ok || PyThreadState_SetAsyncExc(s->ident, g_interrupt) != 1)
        return 0;
    s->async_pending = 1;
    hook_disarm(s, t); /* armed ahead (pre-armed): nothing left for it */
    STAT_INC(direct_raises);
    return 1;
}
#endif

#if TC_SELF_FIRE
/* -- The self-fire: a pending call at the thread's own breaker check (3.12+) --
 * A thread that holds the GIL at its deadline fires it itself (tc_watchdog.c:
 * wd_watch): the watchdog queues this call (tc_gil.c: tc_add_pending), and
 * whichever thread next checks its eval breaker runs it, with the GIL.  In
 * any thread but the slot's own it does nothing.  In the slot's own thread,
 * with the deadline due: at a loop's back-edge outside protected code
 * (tc_compat.h: tc_breaker_back_edge; the stack as deliver_direct judges
 * it), it fires and returns -1, so that the interrupt surfaces at that very
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
 * off the control channel (tc_watchdog.c: wd_watch queued the call for the
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
        s->pending != NULL || (!atomic_load(&s->remote_req) && atomic_load(&s->deadline) > now))
        return;
#if TC_TRACK_FRAMES
    wd_prune_slot(s); /* the sweep's first step (3.13) */
#endif
    int remote = atomic_load(&s->remote_req);
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
    slot_apply_remote(s, now_ns()); /* a cancel off the control channel: due now */
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
 * again never shrink in number -- a thread deferred 100 ms in protected code
 * filled 3.12's queue of 32, and the next look found it full. */
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
#if TC_DIRECT_BACK_EDGE
    if (exc == g_interrupt && accel_on(ACCEL_DIRECT_DELIVERY) && deliver_direct(s, t, scope))
        return 1;
#endif
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
 * protected code -- measured on 3.11: leaked Semaphore and handler locks in
 * the integrity hammer, gone without it.  It only makes sure the hook can
 * still see the thread (hook_nudge). */
static void deliver_backstop(tc_slot *s)
{
    if (s->pending == NULL || !s->hooked)
        return;
#if TC_HOOK_TRACE
    PyThreadState *t = tc_find_tstate(s->ident);
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
         * asynchronous exception; measured: a direct delivery's exit that
         * cleared the consumed one made the next deadline next to 3 spinning
         * threads ~0.3 ms later at the median).  Free-threaded, another
         * thread's state is not looked at (tc_lock.h). */
        PyThreadState *t = slot_tstate(s);
        if (t == NULL ? TC_FREE_THREADED && atomic_load(&s->alive) : t->async_exc != NULL)
            PyThreadState_SetAsyncExc(s->ident, NULL);
        s->async_pending = 0;
    }
    return deferred;
}
