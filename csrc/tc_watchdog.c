/*
 * tc_watchdog.c -- the one watchdog pthread: its schedule of every armed
 * slot, and the fire-time sweep.  Part of the unity build (timeoutcore.c).
 * This file: its shared state, the planner (wd_plan) and the sweep
 * (wd_sweep); then tc_wd_fire.c (taking the GIL, and the lead: what the
 * accelerators do with it before the deadline) and tc_wd_main.c (the
 * loop, start and stop).  The
 * accelerators it calls at named points are in accel_*.c (tc_accel.h).
 *
 * The watchdog plans WITHOUT the GIL (wd_plan reads the slots' atomics under
 * g_mu), sleeps on a futex until the next event, then takes the GIL and acts
 * (wd_sweep).  It never holds g_mu while it waits for the GIL; it takes g_mu
 * while holding the GIL.  It has all signals blocked but its own faults (so
 * that faulthandler can report one), timer slack 1 ns, and
 * one thread state of its own, made once and reused.
 *
 * Free-threaded (TC_FREE_THREADED): there is no GIL to wait for, so no
 * anticipation, no requeue and no fast window -- the watchdog sleeps to the
 * deadline itself, attaches its thread state (immediate, unless a
 * stop-the-world is under way), acts on each due slot inside the core lock
 * (tc_lock.h) and detaches again.  A slot's thread may be exiting meanwhile:
 * slot_fire/slot_reinject go by the slot's `alive` flag, never by its
 * thread state.
 */

static pthread_t g_wd;
static _Atomic int g_wd_running;          /* set with the GIL / core lock;
                                              the per-block path reads it */
static _Atomic int g_wd_stop;
static _Atomic uint32_t g_wd_seq;         /* futex word to wake it        */
static _Atomic int64_t g_wd_planned = 0;  /* when it means to act next    */
static _Atomic int64_t g_wd_wake_at = 0;  /* when its current sleep ends  */
static _Atomic int g_wd_tid;              /* its kernel thread id         */
static _Atomic int64_t g_wd_seen_at = 0;  /* when it last planned (awake) */
static _Atomic uint32_t g_wd_ready;       /* it has its thread state      */
static int wd_running(void) { return g_wd_running; }

static void wd_wake(void)
{
    atomic_fetch_add(&g_wd_seq, 1);
    futex_wake_all(&g_wd_seq);
}

/* Slot s's deadline may have moved earlier: wake the watchdog if it means to
 * sleep past the moment it must ask for the GIL (free-threaded: pre-arm).
 * The watchdog may not get a CPU (tc_tuning.h: TC_BACKSTOP_NS), and then
 * cannot arm the slot's backstop itself: it is armed here first when the
 * watchdog must be woken (a futex wake is paid anyway), or when it is
 * overdue -- its planned moment has passed, so it is busy, or starved.  An
 * entry that finds it asleep until a later moment costs no system call:
 * the watchdog arms the backstop when it plans for it.  (Arming at every
 * entry of a near deadline was rejected: it made such a block several
 * times dearer, for a tail no better beyond the noise.)  `now`: the caller's
 * clock reading, or 0. */
static void wd_notify(tc_slot *s, int64_t deadline, int64_t now)
{
    if (deadline == TC_NEVER)
        return;
    int64_t planned = atomic_load(&g_wd_planned);
    /* a slot its own thread pre-armed (prearm_on_enter) needs no lead: the
     * watchdog looks at the deadline (wd_plan), or, while its tracer sleeps,
     * at the grace's end (the alarm wakes the tracer, the handler the
     * watchdog if need be) */
    int64_t need = !atomic_load(&s->prearmed) ? deadline - anticipation_lead() - prearm_lead()
                   : sleeping_tracer_asleep(s) ? deadline + TC_PREARM_GRACE_NS
                                              : deadline;
    int wake = need < planned;
    if (atomic_load(&s->alive) && (wake || planned <= (now != 0 ? now : now_ns())))
        rescue_arm(s, atomic_load(&s->gen), deadline);
    if (wake)
        wd_wake();
}

typedef struct {
    tc_slot *slot;
    uint64_t gen;
    int64_t at;       /* when to act                            */
    int64_t deadline; /* the deadline behind it (ARMED), or NEVER */
} wd_event;

/* When a slot next needs the watchdog (TC_NEVER: not), from its atomics. */
static int64_t slot_due_at(tc_slot *s, int64_t lead, int *st_out, int64_t *deadline_out)
{
    int st = atomic_load(&s->state);
    int64_t d = atomic_load(&s->deadline);
    *st_out = st;
    *deadline_out = d;
    if (st == SLOT_ARMED && d != TC_NEVER) {
        /* A cancel off the control channel (accelerator remote_relay): a
         * deadline that has passed, with no lead (the fire applies it). */
        int64_t r = remote_relay_marked_at(s);
        int remote = r != TC_NEVER;
        if (r < d)
            *deadline_out = d = r;
        int64_t w = self_fire_look_at(s); /* watched by the self-fire */
        if (w != 0)
            return w;
        if (remote)
            return d;
        return atomic_load(&s->prearmed) ? d + TC_PREARM_GRACE_NS /* prearm_ahead */
                                         : d - lead - prearm_lead() - self_fire_lead();
    }
    if (st == SLOT_INJECTED)
        return atomic_load(&s->reinject_at);
    return TC_NEVER;
}

/* Does slot s's thread hold the GIL (a moment's look, without the GIL)? */
static int slot_holds_gil(tc_slot *s)
{
    const void *holder = NULL;
    return tc_gil_holder(&holder) == 1 && holder == atomic_load(&s->tstate_id);
}

/* Earliest thing to do, and in *fast_until the latest moment a fired,
 * unclaimed interrupt keeps the fast window open (0: none).  Holds g_mu
 * briefly; the watchdog calls it without the GIL, a claiming exit
 * (fast_close_after_claim) with it. */
static wd_event wd_plan(int64_t *fast_until, int64_t *look_at)
{
    wd_event ev = {NULL, 0, TC_NEVER, TC_NEVER};
    int64_t lead = anticipation_lead(), now = now_ns();
    *fast_until = 0;
    *look_at = TC_NEVER;
    pthread_mutex_lock(&g_mu);
    for (tc_slot *s = g_slots; s != NULL; s = s->next) {
        int st;
        int64_t d, at;
        if (!s->alive)
            continue;
        fast_window_plan(s, now, fast_until, look_at); /* accel_fast_window.c */
        if (atomic_load(&s->shield) > 0)
            continue;
        uint64_t gen = atomic_load(&s->gen);
        at = slot_due_at(s, lead, &st, &d);
        if (at < ev.at) {
            ev.slot = s;
            ev.gen = gen;
            ev.at = at;
            ev.deadline = st == SLOT_ARMED ? d : TC_NEVER;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return ev;
}

#if TC_TRACK_FRAMES
/* Is the slot due now (its deadline or its re-injection time passed)? */
static int slot_due_now(tc_slot *s, int64_t now)
{
    int st;
    int64_t d;
    return slot_due_at(s, 0, &st, &d) <= now;
}

/* Drop slot `s`'s scopes whose frame is gone (GIL held, g_mu not held). */
static void wd_prune_slot(tc_slot *s)
{
    PyThreadState *t = slot_find_tstate(s);
    int gc, pruned;
    if (t == NULL)
        return;
    gc = frames_look_begin(); /* tc_internal.h */
    pruned = slot_prune_stale(s, PyThreadState_GetFrame(t));
    frames_look_end(gc);
    if (pruned)
        slot_publish(s);
}

/* Before acting on due slots, drop scopes whose frame is gone (3.13).  g_mu
 * is released around each prune, because dropping a scope may run arbitrary
 * finalizers; the walk goes on from the same slot, which stays valid (slots
 * are never freed).  Slots added meanwhile are at the head: the next round
 * sees them.  No cap on the number of due slots. */
static void wd_prune(int64_t now)
{
    pthread_mutex_lock(&g_mu);
    for (tc_slot *s = g_slots; s != NULL; s = s->next) {
        if (!s->alive || !slot_due_now(s, now))
            continue;
        pthread_mutex_unlock(&g_mu);
        wd_prune_slot(s);
        pthread_mutex_lock(&g_mu);
    }
    pthread_mutex_unlock(&g_mu);
}
#endif

/* With the GIL: handle every slot that is due now.  g_mu is held only to
 * walk the list, never while a slot is acted on: firing arms the delivery
 * hook (3.11: _PyEval_SetTrace runs audit hooks; 3.12+: sys.monitoring
 * instruments code, which allocates and may collect garbage), i.e. Python
 * code that may give the GIL away -- and a thread that then enters its
 * first scope would wait for g_mu while holding the GIL the watchdog waits
 * for.  Acting without g_mu is safe: slots are never freed, and a slot's
 * thread cannot finish dying (its thread state is deleted with the GIL,
 * before its kernel timer goes) while the watchdog holds the GIL;
 * slot_fire/slot_reinject check that the thread state still exists. */
#define TC_SWEEP_BATCH 64
static void wd_sweep(int64_t now)
{
    tc_slot *due[TC_SWEEP_BATCH];
    int n, more;
#if TC_TRACK_FRAMES
    wd_prune(now);
#endif
    do {
        n = 0;
        more = 0;
        pthread_mutex_lock(&g_mu);
        for (tc_slot *s = g_slots; s != NULL; s = s->next) {
            if (!s->alive)
                continue;
            if ((slot_fire_due(s, now) && !self_fire_owns(s)) ||
                (atomic_load(&s->state) == SLOT_INJECTED && atomic_load(&s->reinject_at) <= now)) {
                if (n == TC_SWEEP_BATCH) {
                    more = 1;
                    break;
                }
                due[n++] = s;
            }
        }
        pthread_mutex_unlock(&g_mu);
        for (int i = 0; i < n; i++) {
            tc_slot *s = due[i];
            TC_CORE_BEGIN_ON(s);
            /* again, in the core: its owner may have moved on */
            if (s->alive && !slot_fire(s, now, 0) && atomic_load(&s->state) == SLOT_INJECTED &&
                atomic_load(&s->reinject_at) <= now)
                slot_reinject(s, now);
            TC_CORE_END();
        }
    } while (more);
}

