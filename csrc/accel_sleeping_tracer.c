/*
 * accel_sleeping_tracer.c -- accelerator sleeping_tracer (3.11's tracer,
 * TC_HOOK_TRACE): a pre-armed thread's tracer put in place asleep until the
 * deadline, and woken by its own timer's signal.  Its hooks: tc_accel.h;
 * all exist on every build and do nothing without TC_HOOK_TRACE.  Its state
 * is per slot (struct sleeping_tracer_slot, tc_slot.sleeper).  The kernel
 * timer it sets is the slot's own (tc_os.c), shared with the kick and the
 * rescue's backstop: backstop_gen says what it is armed for.  Part of the
 * unity build (timeoutcore.c), after tc_hook_trace.c (it compares with its
 * trace_cb).
 */

#if TC_HOOK_TRACE
/* Why: with a tracer set, 3.11's eval loop sends every instruction of the
 * thread down its tracing path, not only the line events: a CPU loop runs
 * several times slower with ours armed.  A pre-armed thread had it on from
 * the pre-arm -- a lead ahead of the deadline, or the block's entry when
 * the deadline is nearer (prearm_on_enter) -- to the
 * deadline: in a pool under frequent short deadlines, most of what the
 * deadlines cost the pool (bench_contention.py
 * test_cpu_pool_under_deadlines).  So a pre-arm
 * puts the tracer in place asleep (sleeping_tracer_sleep): c_tracefunc is ours, but
 * the thread's cframe->use_tracing -- the byte 3.11 ORs into every opcode --
 * is 0, and the thread's own kernel timer is set for the deadline.  Its
 * signal handler, in the thread, sets the byte (sleeping_tracer_on_signal): the thread
 * traces from its next instruction and fires at its next line; if it does
 * not hold the GIL then, the handler wakes the watchdog, which opens the
 * fast window for it (wd_plan).  The timer is then set again for the
 * watchdog's backstop (tc_tuning.h: TC_BACKSTOP_NS).  A delivery for the
 * slot (hook_arm while hooked) or its disarm wakes the tracer with the GIL
 * (sleeping_tracer_wake).  Without a kernel timer the tracer stays awake.
 *
 * Races.  use_tracing belongs to the thread's innermost eval loop (on its
 * C stack, tstate->cframe), written by CPython with the GIL: by the thread
 * when it enters or leaves an eval loop (copied from, then back to, the
 * enclosing one) and by _PyEval_SetTrace, which another thread may call for
 * it while it waits for the GIL (ours: prearm_ahead, deliver_async).  The
 * handler runs in the thread itself, so against the thread's own code it
 * can only interrupt it: (a) between a new eval loop's copy of the byte and
 * its publishing of its cframe, or between an exit's restoring the old
 * cframe and copying the byte back, a wake-up can be lost -- the fire at the
 * grace's end (the watchdog's, with the GIL) wakes the tracer again; (b)
 * inside _PyEval_SetTrace, which sets the byte last, from the tracer it
 * installs: CPython's own answer wins.  Against another thread: the handler
 * writes only while `dormant` is set, inside `waking`; whoever else touches
 * the thread's tracer (sleeping_tracer_wake, hook_disarm) first clears `dormant`, then
 * waits for `waking` to drop (sequentially consistent atomics: one of the
 * two sees the other), so its write comes after the handler's.  Anything
 * that recomputes the byte early (sys.setprofile, PyThreadState_LeaveTracing
 * in some extension) only makes the thread trace early: the hook checks the
 * deadline at each line and does nothing before it.  The thread state the
 * handler writes to is the one sleeping_tracer_sleep was given, alive while the slot
 * is dormant: only a block running in that thread is pre-armed, and its
 * exit disarms. */

/* GIL, the slot's thread paused or the caller: the tracer is no longer
 * asleep; with `on`, it traces from the thread's next instruction -- set
 * even if the handler has woken it already, since that wake-up may have
 * been lost (above, (a)). */
static void sleeping_tracer_wake(tc_slot *s, PyThreadState *t, int on)
{
    if (atomic_exchange(&s->sleeper.dormant, 0))
        while (atomic_load(&s->sleeper.waking)) /* the thread's handler is writing */
            sched_yield();
    if (on && t != NULL && t->c_tracefunc == trace_cb)
        t->cframe->use_tracing = 255;
}

/* GIL, the slot's thread paused or the caller, right after the pre-arm's
 * hook_arm: put the tracer to sleep until `deadline`.  The alarm holds the
 * slot's timer for its current gen (tc_os.c: timer_set_at), so the
 * watchdog's backstop does not set it again (rescue_arm); the handler
 * does, after the alarm. */
static void sleeping_tracer_sleep(tc_slot *s, PyThreadState *t, int64_t deadline)
{
    if (!accel_on(ACCEL_SLEEPING_TRACER) || !s->hooked || !s->timer_ok || t == NULL ||
        t->c_tracefunc != trace_cb || s->prev_trace != NULL || t->c_profilefunc != NULL ||
        t->tracing || deadline <= now_ns())
        return; /* someone else's tracer or profiler: it traces anyway */
    s->sleeper.ts = t;
    t->cframe->use_tracing = 0;
    atomic_store(&s->sleeper.dormant, 1); /* before the alarm: it may go off at once */
    if (timer_set_at(s, atomic_load(&s->gen), deadline) != 0) {
        sleeping_tracer_wake(s, t, 1); /* no alarm: it stays awake */
        return;
    }
    STAT_INC(tracer_sleeps);
}

/* The slot's thread, in its signal handler (tc_os.c: tc_handler), for any
 * of the slot's timer signals: if its tracer sleeps and the deadline has
 * come, wake it, set the timer for the backstop, and wake the watchdog if
 * the thread must first get the GIL back.  Returns 1 if it woke the
 * tracer.  Async-signal-safe: atomics, a clock read, system calls. */
static int sleeping_tracer_on_signal(tc_slot *s)
{
    int woke = 0;
    int64_t d;
    atomic_store(&s->sleeper.waking, 1);
    if (atomic_load(&s->sleeper.dormant) && (d = atomic_load(&s->deadline)) <= now_ns()) {
        PyThreadState *t = s->sleeper.ts;
        const void *holder = NULL;
        if (t->c_tracefunc == trace_cb)
            __atomic_store_n(&t->cframe->use_tracing, (uint8_t)255, __ATOMIC_RELAXED);
        atomic_store(&s->sleeper.dormant, 0);
        woke = 1;
        STAT_INC(tracer_alarms);
        uint64_t gen = atomic_load(&s->gen);
        if (atomic_load(&s->backstop_gen) == gen) /* the alarm's: now the backstop's */
            (void)timer_set_at(s, gen, d + TC_BACKSTOP_NS);
        if (!(tc_gil_holder(&holder) == 1 && holder == (const void *)t))
            wd_wake();
    }
    atomic_store(&s->sleeper.waking, 0);
    return woke;
}
#else
static void sleeping_tracer_sleep(tc_slot *s, PyThreadState *t, int64_t deadline)
{
    (void)s, (void)t, (void)deadline;
}

/* The slot's thread, in its signal handler: only 3.11's tracer sleeps. */
static int sleeping_tracer_on_signal(tc_slot *s)
{
    (void)s;
    return 0;
}
#endif

/* The slot's effective deadline changed to `d` (tc_slot.c: slot_deadline_set; a
 * reschedule, a cancel, a scope's entry or exit): a sleeping tracer's alarm
 * follows it (a cancel: at once).  Returns 1 if the timer is
 * the alarm's. */
static int sleeping_tracer_follow(tc_slot *s, int64_t d)
{
#if TC_HOOK_TRACE
    return atomic_load(&s->sleeper.dormant) && d != TC_NEVER &&
           timer_set_at(s, atomic_load(&s->gen), d) == 0;
#else
    (void)s;
    (void)d;
    return 0;
#endif
}

static int sleeping_tracer_asleep(tc_slot *s)
{
#if TC_HOOK_TRACE
    return atomic_load(&s->sleeper.dormant);
#else
    (void)s;
    return 0;
#endif
}

/* At import (tc_accel.h). */
static const char *sleeping_tracer_unsupported(void)
{
    return TC_HOOK_TRACE ? NULL : "unsupported on this CPython (3.11's tracer only)";
}
