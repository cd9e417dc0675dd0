/*
 * tc_wd_fire.c -- what the watchdog does ahead of and at a deadline: take
 * the GIL (gil_busy, gil_take), and pre-arm the hook (accelerator prearm).  Part of
 * the unity build (timeoutcore.c), after accel_fast_window.c.
 *
 * Who calls what: all of it runs in the watchdog thread, from wd_main
 * (tc_wd_main.c), holding no lock of ours: gil_take without the GIL (it
 * returns holding it), wd_prearm with it (or attached, free-threaded).
 * slot_self_prearm (3.11) runs in the guarded thread at its scope's entry,
 * GIL held.  Nothing here runs in a signal handler.
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
    fast_window_take_begin();
    busy = gil_busy(s);
    PyEval_RestoreThread(ts);
    fast_window_take_end();
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
 * holds the GIL anyway, asleep until the deadline (tc_hook_trace.c:
 * sleeping_tracer_sleep), and the watchdog is not needed before the grace's end.
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

#endif

