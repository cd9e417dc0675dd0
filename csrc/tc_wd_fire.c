/*
 * tc_wd_fire.c -- what the watchdog does ahead of and at a deadline: take
 * the GIL (gil_busy, gil_take), pre-arm the hook (accelerator prearm), and
 * the self-fire's watch of a
 * thread that holds the GIL (accelerator self_fire, TC_SELF_FIRE).  Part of
 * the unity build (timeoutcore.c), after tc_fast_window.c.
 *
 * Who calls what: all of it runs in the watchdog thread, from wd_main
 * (tc_wd_main.c), holding no lock of ours: gil_take without the GIL (it
 * returns holding it), wd_watch without it (it looks at the GIL's holder and
 * queues a pending call, tc_deliver_steps.c: pc_fire), wd_prearm with it (or
 * attached, free-threaded).  slot_self_prearm (3.11)
 * runs in the guarded thread at its scope's entry, GIL held.  pc_prepare
 * runs as a pending call in whichever thread checks its eval breaker.
 * Nothing here runs in a signal handler.
 */

/* Before the watchdog takes the GIL for slot `s`: is a thread other than
 * the slot's own holding it -- the process is busy?  A moment's look
 * (tc_gil_holder).  (The guarded thread itself holding it is the quiet
 * case: 3.11, which has no self-fire, takes the GIL from it.)  The watchdog
 * used to judge that by how long the take lasted (TC_PREARM_QUIET_NS), but
 * next to busy threads the GIL goes to whichever waiter gets it first after
 * a hand-off, and the watchdog, one of four or more, got it within that
 * time often enough to be taken for alone: it then pre-armed and let the
 * GIL go, and at the deadline had to win it again -- some takes lasted
 * many fast-window intervals, and most very late deadlines were fired that
 * late.  Busy, it holds the GIL up to the deadline instead and fires on
 * time (3.11, always pre-armed, decides only whether to prepare the
 * exception).  Spinning for the hand-off as well, to
 * take the GIL the moment it is free, won no more of them (the woken
 * waiter still got gil->mutex first) and was not kept. */
static int gil_busy(tc_slot *s)
{
    const void *holder = NULL;
    return tc_gil_holder(&holder) > 0 && holder != atomic_load(&s->tstate_id);
}

/* Take the GIL with the watchdog's thread state, inside the fast window,
 * for slot `s`.  Returns what gil_busy() said just before. */
static int gil_take(PyThreadState *ts, tc_slot *s)
{
    int busy;
    pthread_mutex_lock(&g_fast_mu);
    atomic_store(&g_wd_taking, 1); /* a claim meanwhile leaves the window open */
    fast_enter_locked();
    pthread_mutex_unlock(&g_fast_mu);
    busy = gil_busy(s);
    PyEval_RestoreThread(ts);
    atomic_store(&g_wd_taking, 0);
    STAT_INC(gil_takes);
    return busy;
}

/* Ahead of slot `s`'s deadline (GIL held / attached, holding no lock of
 * ours): arm the hook so that the thread fires its deadline itself
 * (tc_deliver.c: pre-armed slots).  Returns 1 if armed.  Arming runs
 * Python (3.11: audit hooks; 3.12+: sys.monitoring) and, free-threaded,
 * lets the core lock go: the slot is checked again after, and if its scope
 * ended meanwhile (the exit saw the flag and cleared it) the arm is undone. */
static int wd_prearm(tc_slot *s, uint64_t gen)
{
    int ok = 0;
    if (g_hook_mode == HOOK_NONE || !accel_on(ACCEL_PREARM))
        return 0;
    TC_CORE_BEGIN();
    if (s->alive && atomic_load(&s->gen) == gen && atomic_load(&s->state) == SLOT_ARMED &&
        atomic_load(&s->shield) == 0 && s->pending == NULL && !atomic_load(&s->prearmed) &&
        atomic_load(&s->deadline) != TC_NEVER) {
        PyThreadState *t = slot_tstate(s);
        if (TC_FREE_THREADED || t != NULL) {
            atomic_store(&s->prearmed, 1); /* first: an exit meanwhile undoes it */
            if (hook_arm(s, t) < 0)
                atomic_store(&s->prearmed, 0);
            else if (!atomic_load(&s->prearmed) && s->pending == NULL)
                hook_disarm(s, slot_tstate(s)); /* the scope ended while arming */
            else {
#if TC_HOOK_TRACE
                hook_sleep(s, t, atomic_load(&s->deadline)); /* until the deadline */
#endif
                ok = 1;
            }
        }
    }
    TC_CORE_END();
    if (ok)
        STAT_INC(prearms);
    return ok;
}

#if TC_HOOK_TRACE
/* 3.11, slot s's own thread with the GIL, at a scope's entry (tc_scope.c)
 * that set the slot's deadline: if it is nearer than the lead, the watchdog
 * would take the GIL at once to pre-arm this thread's tracer -- in a busy
 * process opening the fast window for that take, which stayed open to the
 * deadline.  The thread arms its tracer itself instead, here, where it
 * holds the GIL anyway, asleep until the deadline (tc_hook_trace.c:
 * hook_sleep), and the watchdog is not needed before the grace's end.
 * Before wd_notify, which then does not wake it.  Already pre-armed (a
 * nested block with an earlier deadline): the alarm moves to the new
 * deadline.  Costs such a block a tracer set and put back and an alarm
 * set and taken back; blocks with a farther deadline are pre-armed by the
 * watchdog as before.  In a pool under frequent short deadlines it spares
 * the watchdog nearly all its GIL takes and most of the window's open time
 * (bench_contention.py test_cpu_pool_under_deadlines, 3.11). */
static void slot_self_prearm(tc_slot *s, int64_t now)
{
    int64_t d = atomic_load(&s->deadline);
    if (atomic_load(&s->prearmed)) { /* a nested block's earlier deadline */
        (void)hook_alarm_follows(s, d);
        return;
    }
    if (g_hook_mode != HOOK_TRACE || !accel_on(ACCEL_PREARM) || s->pending != NULL ||
        atomic_load(&s->shield) != 0 || atomic_load(&s->state) != SLOT_ARMED ||
        d == TC_NEVER || d - now > atomic_load(&g_lead))
        return;
    atomic_store(&s->prearmed, 1);
    if (hook_arm(s, PyThreadState_Get()) < 0) {
        atomic_store(&s->prearmed, 0);
        return;
    }
    hook_sleep(s, PyThreadState_Get(), d);
    STAT_INC(prearms);
}

#endif

#if TC_SELF_FIRE
/* -- The self-fire (3.12+ with a GIL) ------------------------------------------
 * Finding: in a pool of CPU-bound workers a task's deadline mostly comes
 * while its own thread holds the GIL -- a task starts in its worker's turn,
 * and a turn lasts a switch interval.  Anticipation then took the GIL from
 * the very thread that had to stop, which waited for its turn again while
 * the watchdog held the GIL, pre-armed (events that slow every thread) or
 * kept the fast window open: a pool under frequent short deadlines lost a
 * large share of its throughput (bench_contention.py
 * test_cpu_pool_under_deadlines).  So while the slot's thread holds the GIL ahead of its deadline,
 * the watchdog does not ask for the GIL at all.  It looks at the GIL's
 * holder (tc_gil.c) TC_WATCH_PREPARE_NS ahead, where it asks the thread to
 * build its exception (pc_prepare, below: the prepare hook in the thread itself),
 * and TC_WATCH_SPIN_NS ahead, spins from there, and at the deadline
 * queues pc_fire (tc_deliver_steps.c), which the thread runs at its next breaker
 * check and which raises at its next back-edge: the GIL never changes
 * hands.  A thread seen without the GIL (its turn ended, a blocking call)
 * while another holds it is left to come back (wd_watch: "off the GIL").  A
 * thread that holds on to the GIL TC_WATCH_MAX_NS past its deadline without
 * firing is in protected code (the call keeps asking to be run again, and
 * raises once it is out) or in C code that checks no breaker: it gets its
 * kick once, and is looked at every TC_WATCH_SLOW_NS from then on.  The
 * watched slot's next look is its planned event (slot_due_at), so other
 * slots are served meanwhile.  Pre-armed slots are left to their hook. */
static int pc_prepare(void *arg)
{
    tc_slot *s = (tc_slot *)arg;
    if (s == t_slot && atomic_load(&s->state) == SLOT_ARMED) {
        slot_note_cpu(s); /* for wd_watch's spin, which it precedes (prep_at) */
        prepare_before_due(s, atomic_load(&s->deadline));
    }
    return 0;
}

/* The watch's next look ahead of `until` for a thread off the GIL: half
 * the time left, at least TC_WATCH_POLL_NS, never past `until` -- a thread
 * that takes the GIL back is seen well ahead, with a handful of wake-ups
 * rather than one per poll (each may preempt the thread that runs). */
static int64_t half_way(int64_t now, int64_t until)
{
    int64_t half = (until - now) / 2;
    int64_t at = now + (half > TC_WATCH_POLL_NS ? half : TC_WATCH_POLL_NS);
    return at < until ? at : until;
}

static int watch_again(tc_slot *s, uint64_t gen, int64_t at)
{
    atomic_store(&s->watch_gen, gen);
    atomic_store(&s->watch_at, at);
    return 1;
}

/* Queue pc_fire for slot `s` unless one is queued already (tc_deliver_steps.c:
 * one call per slot).  0, or -1 if CPython's queue is full. */
static int pc_queue(tc_slot *s)
{
    if (atomic_load(&s->pc_queued))
        return 0;
    atomic_store(&s->pc_queued, 1);
    if (tc_add_pending(pc_fire, s) != 0) {
        atomic_store(&s->pc_queued, 0);
        return -1;
    }
    STAT_INC(pending_calls);
    return 0;
}

/* Without the GIL, slot ev due: 1 if it is watched (plan again), 0 if the
 * watchdog must act the usual way. */
static int wd_watch(wd_event ev)
{
    tc_slot *s = ev.slot;
    int64_t now = now_ns();
    if (ev.deadline == TC_NEVER || atomic_load(&s->prearmed))
        goto usual;
    if (!slot_holds_gil(s)) {
        /* A cancel off the control channel (remote_relay) for a thread that
         * waits for the GIL: it is due already, there was no lead to take
         * the GIL ahead.  Rather than queue for the GIL among the busy
         * threads -- a whole turn before the guarded thread's own -- the call
         * goes to the GIL's holder, whoever it is: pc_fire, run in another
         * thread, fires the slot from there as this sweep would
         * (tc_deliver_steps.c).  The usual way if the GIL is free (it comes at once) or if nobody ran
         * the call within TC_WATCH_MAX_NS (a holder in C code that checks no
         * breaker). */
        const void *holder;
        int busy = tc_gil_holder(&holder) == 1, remote = remote_relay_marked_at(s) != TC_NEVER;
        if (now - ev.deadline >= (remote ? TC_WATCH_MAX_NS : TC_WATCH_BACK_NS))
            goto usual;
        if (remote) {
            if (!busy || pc_queue(s) < 0)
                goto usual;
            return watch_again(s, ev.gen, now + TC_WATCH_AFTER_NS);
        }
        /* Off the GIL, while another thread holds it: watched on, not fired
         * from here.  At the deadline it gets its kick (a blocking call is
         * knocked loose), the fast window opens for it (wd_plan), and the
         * watchdog looks every TC_WATCH_AFTER_NS until it holds the GIL
         * again; then it fires itself as above (pc_fire).  Fired from
         * outside instead -- the watchdog queued for the GIL ahead of the
         * deadline, fired it, and from 3.13 handed it to the hook -- the
         * hook's events, which are interpreter-wide, slowed every thread of
         * the pool for as long as the fired one waited for its turn (3.12
         * raises at the back-edge without the hook: deliver_direct).  Watched
         * on, the pool keeps more of its throughput on 3.13 (3.12, with no
         * hook there either way, is unchanged) and the deadline lands sooner
         * next to spinning threads (bench_contention.py
         * test_cpu_pool_under_deadlines and test_contention_overshoot).
         * The usual way takes over if the GIL is free at two looks
         * TC_WATCH_POLL_NS apart -- nobody else wants it: the take is
         * immediate and the pre-arm or the hook slows no other thread -- or
         * if the thread is not back TC_WATCH_BACK_NS after its deadline (C
         * code that runs without the GIL: the hook waits for its return). */
        if (now >= ev.deadline && s->back_gen != ev.gen) {
            s->back_gen = ev.gen; /* once: a blocking call, knocked loose */
            slot_wake_and_kick(s);
            STAT_INC(back_waits);
        }
        if (!busy) {
            if (s->free_gen != ev.gen) {
                s->free_gen = ev.gen;
                s->free_since = now;
            }
            else if (now - s->free_since >= TC_WATCH_POLL_NS)
                goto usual; /* free both times: nobody else wants it */
            return watch_again(s, ev.gen, s->free_since + TC_WATCH_POLL_NS);
        }
        s->free_gen = 0;
        if (now < ev.deadline)
            return watch_again(s, ev.gen, half_way(now, ev.deadline));
        return watch_again(s, ev.gen, now + TC_WATCH_AFTER_NS);
    }
    if (now < ev.deadline) {
        if (ev.deadline - now <= TC_WATCH_PREPARE_NS && s->prepare_gen != ev.gen) {
            s->prepare_gen = ev.gen;
            (void)tc_add_pending(pc_prepare, s); /* full: the exit builds it */
        }
        if (ev.deadline - now > TC_WATCH_SPIN_NS) {
            int64_t spin_at = ev.deadline - TC_WATCH_SPIN_NS;
            int64_t prep_at = ev.deadline - TC_WATCH_PREPARE_NS;
            /* No half-way looks here: the thread holds the GIL, and what
             * the watch has to do next is the prepare, then the spin.  Each
             * look is a wake-up, which on a busy host may preempt the very
             * thread it watches (or one of the pool's): half-way looks
             * cost a CPU pool throughput and bought no latency
             * (benchmarks/bench_contention.py).  A thread that lets
             * the GIL go meanwhile is seen at the prepare's look (off the
             * GIL, above), and a blocking call is knocked loose by its
             * timer's signal at the deadline all the same.  (Not prepared
             * yet: then the prepare's time is still ahead, or it would have
             * been queued just above.) */
            return watch_again(s, ev.gen, s->prepare_gen != ev.gen ? prep_at : spin_at);
        }
        /* Spin to the deadline, unless this is the CPU the thread runs on:
         * there the spin would keep it off the CPU -- sleep instead. */
        if (sched_getcpu() == atomic_load_explicit(&s->cpu, memory_order_relaxed)) {
            STAT_INC(watch_sleeps); /* next look: at the deadline, past this block */
            return watch_again(s, ev.gen, ev.deadline);
        }
        while (now_ns() < ev.deadline && atomic_load(&s->gen) == ev.gen)
            cpu_relax();
        if (!slot_holds_gil(s))
            return watch_again(s, ev.gen, now_ns()); /* off the GIL: look again */
    }
    if (pc_queue(s) < 0)
        goto usual;
    now = now_ns();
    if (now - ev.deadline < TC_WATCH_MAX_NS)
        return watch_again(s, ev.gen, now + TC_WATCH_AFTER_NS);
    /* Still holding the GIL and not fired: in protected code (the call keeps
     * asking to run again), or in C code that checks no breaker -- which the
     * signal may knock loose, once. */
    if (s->kick_gen != ev.gen) {
        s->kick_gen = ev.gen;
        slot_wake_and_kick(s);
    }
    return watch_again(s, ev.gen, now + TC_WATCH_SLOW_NS);
usual:
    atomic_store(&s->watch_at, 0);
    return 0;
}
#endif
