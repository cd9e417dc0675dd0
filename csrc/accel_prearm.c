/*
 * accel_prearm.c -- accelerator prearm: the delivery hook armed ahead of a
 * deadline, so that the guarded thread fires its own deadline at its first
 * line boundary past it.  Its hooks: tc_accel.h.  Part of the unity build
 * (timeoutcore.c), after tc_wd_fire.c.
 *
 * State: none of its own but the slot's `prearmed` flag, which stays in the
 * slot because it is the core's too -- a delivery sub-state ("the hook is
 * armed ahead") that every fire clears (slot_fire), the scope's exit and
 * deliver_cancel undo, and the planner, wd_notify, placement and the
 * self-fire read.  The cost of switching the delivery events, from which
 * the free-threaded lead is made, is the hook's own measurement
 * (tc_deliver.c: g_events_cost_ns).
 */

/* The watchdog may arm the hook shortly before a deadline (prearm_ahead,
 * below) instead of waiting to act at the deadline itself: with a
 * GIL it has taken the GIL ahead of the deadline anyway (anticipation) and
 * used to hold it up to the deadline, which stalled the whole process and
 * left the guarded thread asleep, to be woken by the GIL hand-off (an OS
 * wake-up, then a cold cache); free-threaded, arming stops the world, which
 * on a busy machine waits for every busy thread to be scheduled.  Pre-armed, the
 * guarded thread, while it runs Python, fires its own deadline at its first
 * line boundary past it (the same slot_fire as the watchdog's, then the
 * same safe-point checks, deliver_here), and nothing waits for another
 * thread.  The watchdog still fires the slot TC_PREARM_GRACE_NS after the
 * deadline if the thread has not (blocked in C, or not scheduled), with
 * its kick.  Whoever is first fires (the state moves to INJECTED under the
 * GIL / core lock); the other finds nothing to do. */

/* How long before a deadline the watchdog arms the hook (free-threaded). */
static int64_t prearm_lead(void)
{
#if TC_FREE_THREADED
    int64_t lead = TC_PREARM_LEAD_STOPS * atomic_load(&g_events_cost_ns);
    return !accel_on(ACCEL_PREARM)        ? 0 /* none: the watchdog comes at the deadline */
           : lead < TC_PREARM_LEAD_MIN_NS ? TC_PREARM_LEAD_MIN_NS
           : lead > TC_PREARM_LEAD_MAX_NS ? TC_PREARM_LEAD_MAX_NS : lead;
#else
    return 0;
#endif
}

/* The hook's test, any thread, no lock: pre-armed and due?  Free-threaded,
 * a pre-armed slot's thread also notes its CPU here for the watchdog
 * (tc_tuning.h: TC_PIN_AHEAD_NS). */
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
 * must get it back within the window, not a whole user interval later
 * behind every busy thread (what a closed window cost such an exit). */
static void prearm_fire(tc_slot *s)
{
    int64_t now = now_ns();
    if (s->pending == NULL && atomic_load(&s->prearmed) && /* else nothing to fire */
        atomic_load(&s->state) == SLOT_ARMED && slot_fire(s, now, 0)) {
        atomic_store(&s->fast_until, now + TC_FAST_HOLD_NS);
        STAT_INC(self_fires);
#if TC_FREE_THREADED
        placement_step_aside();
#endif
    }
}

/* Ahead of slot `s`'s deadline (GIL held / attached, holding no lock of
 * ours): arm the hook so that the thread fires its deadline itself
 * (above).  Returns 1 if armed.  Arming runs
 * Python (3.11: audit hooks; 3.12+: sys.monitoring) and, free-threaded,
 * lets the core lock go: the slot is checked again after, and if its scope
 * ended meanwhile (the exit saw the flag and cleared it) the arm is undone. */
static int prearm_ahead(tc_slot *s, uint64_t gen)
{
    int ok = 0;
    if (g_hook_mode == HOOK_NONE || !accel_on(ACCEL_PREARM))
        return 0;
    TC_CORE_BEGIN_ON(s);
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
                sleeping_tracer_sleep(s, t, atomic_load(&s->deadline)); /* until then */
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
 * holds the GIL anyway, asleep until the deadline (sleeping_tracer_sleep),
 * and the watchdog is not needed before the grace's end.
 * Before wd_notify, which then does not wake it.  Already pre-armed (a
 * nested block with an earlier deadline): the alarm moves to the new
 * deadline.  Costs such a block a tracer set and put back and an alarm
 * set and taken back; blocks with a farther deadline are pre-armed by the
 * watchdog as before.  In a pool under frequent short deadlines it spares
 * the watchdog nearly all its GIL takes and most of the window's open time
 * (bench_contention.py test_cpu_pool_under_deadlines, 3.11). */
static void prearm_on_enter(tc_slot *s, int64_t now)
{
    int64_t d = atomic_load(&s->deadline);
    if (atomic_load(&s->prearmed)) { /* a nested block's earlier deadline */
        (void)sleeping_tracer_follow(s, d);
        return;
    }
    if (g_hook_mode != HOOK_TRACE || !accel_on(ACCEL_PREARM) || s->pending != NULL ||
        atomic_load(&s->shield) != 0 || atomic_load(&s->state) != SLOT_ARMED ||
        d == TC_NEVER || d - now > anticipation_lead())
        return;
    atomic_store(&s->prearmed, 1);
    if (hook_arm(s, PyThreadState_Get()) < 0) {
        atomic_store(&s->prearmed, 0);
        return;
    }
    sleeping_tracer_sleep(s, PyThreadState_Get(), d);
    STAT_INC(prearms);
}
#else
static void prearm_on_enter(tc_slot *s, int64_t now)
{
    (void)s, (void)now;
}
#endif

/* At import (tc_accel.h). */
static const char *prearm_unsupported(void)
{
    return NULL;
}
