/*
 * accel_self_fire.c -- accelerator self_fire (3.12+, TC_SELF_FIRE): a
 * thread fires its deadline itself, at its own eval-breaker check; this
 * file has the decision there (pc_fire_here) and, with a GIL, the way to it
 * (free-threaded: accel_self_fire_trigger.c).  With a GIL, a thread that
 * holds the GIL at its deadline fires it in a pending call, and the GIL
 * never changes hands.  Two halves: the watchdog's watch of the thread (wd_watch,
 * without the GIL: it looks at the GIL's holder, asks the thread to prepare
 * its exception, spins, and queues the call) and the call itself (pc_fire,
 * with the GIL, in whichever thread checks its breaker next).  Its hooks:
 * tc_accel.h.  Its state is per slot only (struct self_fire_slot,
 * tc_slot.self_fire): the watch's next look and the generation it is valid
 * for, the generations it acted on, and the call's remembered place.  The
 * slot's thread state (tstate_id) it compares with the GIL's holder is the
 * core's: the fast window's plan and the thread-state lookup use it too.
 * Part of the unity build (timeoutcore.c), after tc_wd_fire.c and
 * accel_prepare.c.
 */

#if TC_SELF_FIRE
/* -- The self-fire: a pending call at the thread's own breaker check (3.12+) --
 * A thread that holds the GIL at its deadline fires it itself (wd_watch,
 * below): the watchdog queues this call (tc_gil.c: tc_add_pending), and
 * whichever thread next checks its eval breaker runs it, with the GIL.  In
 * any thread but the slot's own it does nothing.  In the slot's own thread,
 * with the deadline due: at a loop's back-edge outside protected code
 * (tc_compat.h: tc_breaker_back_edge; the stack as direct delivery
 * judges it), it fires and returns -1, so that the interrupt surfaces at
 * that very instruction; at any other check (a call that just returned, a function's
 * RESUME) it queues itself again for the next one -- the same check runs it
 * again at once, up to CPython's per-check limit, which the remembered place
 * makes cheap.  While the collector runs (it may run finalizers in this
 * very check, after this call), it waits that way as long as it takes.  At
 * a back-edge inside protected code it records the deferral and fires for
 * the hook, which waits for the protected call to return; elsewhere, after
 * TC_PC_MAX_DECLINES checks none of which was a usable back-edge (code
 * without loops), it fires for the hook too, which raises at the next line
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

/* pc_fire in a thread other than the slot's: if the slot is due -- a cancel
 * off the control channel (wd_watch queued the call for the
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
    s->self_fire.pc_frame = NULL;
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
    if (s->self_fire.pc_gen != atomic_load(&s->gen)) { /* a new deadline: count afresh */
        s->self_fire.pc_gen = atomic_load(&s->gen);
        s->self_fire.pc_frame = NULL;
        s->self_fire.pc_declines = 0;
    }
    if ((const void *)cur != s->self_fire.pc_frame ||
        PyFrame_GetLasti(cur) != s->self_fire.pc_lasti) {
        int usable = 0, back;
#if TC_TRACK_FRAMES
        Py_INCREF(cur); /* consumed */
        if (slot_prune_stale(s, cur))
            slot_publish(s);
#endif
        now = now_ns();
        if ((due = stack_due(s->top, now)) == NULL)
            return 0;
        if (tc_gc_collecting()) {
            /* A finalizer the collector runs (deliver_here): wait, uncounted,
             * and not noted as this place's answer -- once the collection is
             * over the same place decides afresh.  Noted, a loop with one
             * check (its back-edge) waited there for ever. */
            *again = 1;
            return 0;
        }
        if ((back = tc_breaker_back_edge(cur)) < 0) {
            /* A loop's back-edge whose raise would not land in the loop's
             * handler: this loop's check never becomes usable.  The hook
             * now (it raises at the loop's head), not after the declines:
             * its back-edge and its calls' checks take turns, each
             * resetting the wait. */
            STAT_INC(pending_handovers);
            return pc_to_hook(s, now);
        }
        else if (back > 0 && !interrupt_in_flight_here()) {
            usable = 1;
            Py_INCREF(cur); /* consumed */
            if (stack_defers(s, cur, due, now)) {
                /* Protected code holds it back (the deferral is noted): the
                 * hook waits now.  Rejected: asking to run again here -- at
                 * a protected loop's every back-edge the call ran once more,
                 * and the protected call in progress took twice as long or
                 * more; the hook's wait costs that code far less (its
                 * innermost protected frame is one test). */
                STAT_INC(pending_handovers);
                return pc_to_hook(s, now);
            }
            int64_t deferred = s->deferred_since != 0 ? now - s->deferred_since : 0;
            if (slot_fire(s, now, 1)) { /* takes back: deferred_since goes */
                s->self_fire.pc_frame = NULL;
                if (s->fired != NULL) {
                    as_scope(s->fired)->delivered_at = now;
                    as_scope(s->fired)->deferred_ns += deferred;
                }
                STAT_INC(pending_raises);
                return -1;
            }
        }
        if (!usable && ++s->self_fire.pc_declines > TC_PC_MAX_DECLINES)
            return pc_to_hook(s, now);
        s->self_fire.pc_frame = (const void *)cur;
        s->self_fire.pc_lasti = PyFrame_GetLasti(cur);
        s->self_fire.pc_waiting = usable;
        s->self_fire.pc_since = now;
    }
    else if (!s->self_fire.pc_waiting && now_ns() - s->self_fire.pc_since > TC_PC_SAME_NS) {
        /* Declined here already, and here again, check after check: a loop
         * whose only breaker check is no usable back-edge (`while <cond>:`
         * on 3.13, cpython#130279) would never see the raise.  The hook
         * takes over (it raises at the loop's next line). */
        return pc_to_hook(s, now_ns());
    }
    *again = 1;
    return 0;
}

/* The watch looks at the slot again at `at` (the planner: self_fire_look_at).
 * Returns 1, for the watch's caller. */
static int watch_again(tc_slot *s, uint64_t gen, int64_t at)
{
    atomic_store(&s->self_fire.watch_gen, gen);
    atomic_store(&s->self_fire.watch_at, at);
    return 1;
}

#if !TC_SELF_FIRE_TRIGGER
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
        atomic_store(&s->self_fire.pc_queued, 0);
    return r;
}

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
 * queues pc_fire (above), which the thread runs at its next breaker
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

/* Queue pc_fire for slot `s` unless one is queued already (one call per
 * slot: pc_fire).  0, or -1 if CPython's queue is full. */
static int pc_queue(tc_slot *s)
{
    if (atomic_load(&s->self_fire.pc_queued))
        return 0;
    atomic_store(&s->self_fire.pc_queued, 1);
    if (tc_add_pending(pc_fire, s) != 0) {
        atomic_store(&s->self_fire.pc_queued, 0);
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
         * (pc_fire_for, above).  The usual way if the GIL is free (it comes
         * at once) or if nobody ran the call within TC_WATCH_MAX_NS (a
         * holder in C code that checks no breaker). */
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
        if (now >= ev.deadline && s->self_fire.back_gen != ev.gen) {
            s->self_fire.back_gen = ev.gen; /* once: a blocking call, knocked loose */
            slot_wake_and_kick(s);
            STAT_INC(back_waits);
        }
        if (!busy) {
            if (s->self_fire.free_gen != ev.gen) {
                s->self_fire.free_gen = ev.gen;
                s->self_fire.free_since = now;
            }
            else if (now - s->self_fire.free_since >= TC_WATCH_POLL_NS)
                goto usual; /* free both times: nobody else wants it */
            return watch_again(s, ev.gen, s->self_fire.free_since + TC_WATCH_POLL_NS);
        }
        s->self_fire.free_gen = 0;
        if (now < ev.deadline)
            return watch_again(s, ev.gen, half_way(now, ev.deadline));
        return watch_again(s, ev.gen, now + TC_WATCH_AFTER_NS);
    }
    if (now < ev.deadline) {
        if (ev.deadline - now <= TC_WATCH_PREPARE_NS && s->self_fire.prepare_gen != ev.gen) {
            s->self_fire.prepare_gen = ev.gen;
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
            return watch_again(s, ev.gen, s->self_fire.prepare_gen != ev.gen ? prep_at : spin_at);
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
    if (s->self_fire.kick_gen != ev.gen) {
        s->self_fire.kick_gen = ev.gen;
        slot_wake_and_kick(s);
    }
    return watch_again(s, ev.gen, now + TC_WATCH_SLOW_NS);
usual:
    atomic_store(&s->self_fire.watch_at, 0);
    return 0;
}
#endif /* !TC_SELF_FIRE_TRIGGER */
#endif /* TC_SELF_FIRE */

#if TC_SELF_FIRE_TRIGGER
static int trigger_watch(tc_slot *s, uint64_t gen, int64_t deadline); /* accel_self_fire_trigger.c */
#endif

/* -- Hooks (tc_accel.h) ------------------------------------------------------ */

static int self_fire_watch(tc_slot *s, uint64_t gen, int64_t deadline)
{
#if TC_SELF_FIRE_TRIGGER
    return accel_on(ACCEL_SELF_FIRE) && atomic_load(&s->state) == SLOT_ARMED &&
           trigger_watch(s, gen, deadline);
#elif TC_SELF_FIRE
    wd_event ev = {s, gen, deadline, deadline};
    return accel_on(ACCEL_SELF_FIRE) && atomic_load(&s->state) == SLOT_ARMED && wd_watch(ev);
#else
    (void)s, (void)gen, (void)deadline;
    return 0;
#endif
}

static int64_t self_fire_look_at(tc_slot *s)
{
    int64_t w;
    if (!accel_on(ACCEL_SELF_FIRE))
        return 0;
    w = atomic_load(&s->self_fire.watch_at);
    return w != 0 && atomic_load(&s->self_fire.watch_gen) == atomic_load(&s->gen) ? w : 0;
}

/* In the fork child: the parent's watch and queued calls are gone. */
static void self_fire_atfork_child(void)
{
    for (tc_slot *s = g_slots; s != NULL; s = s->next) {
        atomic_store(&s->self_fire.watch_at, 0);
        atomic_store(&s->self_fire.pc_queued, 0);
        atomic_store(&s->self_fire.round.phase, 0); /* its triggers stay theirs */
    }
}

/* At import (tc_accel.h). */
static const char *self_fire_unsupported(void)
{
    return TC_SELF_FIRE ? NULL : "unsupported on this CPython (3.12+ only)";
}
