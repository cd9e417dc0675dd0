/*
 * tc_wd_fire.c -- what the watchdog does ahead of and at a deadline: take
 * the GIL (gil_busy, gil_take), and the lead (wd_lead): what the
 * accelerators do once it holds the GIL before the deadline -- the pre-arm
 * (accel_prearm.c), the exception prepared (accel_prepare.c), the GIL given
 * back or held (anticipation, accel_anticipation.c).  Part of the unity
 * build (timeoutcore.c), after accel_fast_window.c.
 *
 * Who calls what: all of it runs in the watchdog thread, from wd_fire
 * (tc_wd_main.c), holding no lock of ours: gil_take without the GIL (it
 * returns holding it); wd_lead with the GIL, which it may give away and
 * take back (requeue) or give away for good (it says which).  Nothing
 * here runs in a signal handler.
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




/* What wd_lead did: nothing more to do ahead (fire now: the sweep), acted
 * ahead and released the GIL (plan again), or saw the watchdog stopping
 * (it holds the GIL). */
enum { WD_LEAD_FIRE = 0, WD_LEAD_DONE = 1, WD_LEAD_STOP = 2 };

/* The watchdog holds the GIL for event `ev`, planned at `t0`; `busy`: what
 * gil_take said.  Ahead of the deadline the accelerators act (anticipation
 * brought the watchdog here early): pre-arm and let go, or hold the GIL up
 * to the deadline.  With every accelerator off the event is the deadline
 * itself, and this only waits out a wake-up that came early. */
static int wd_lead(const wd_event *ev, int busy, int64_t t0, PyThreadState **ts)
{
    int64_t t1 = now_ns();
    /* The GIL came at once (within a fast interval or two: at most the
     * guarded thread was queued for it).  Only then, and with
     * TC_PREPARE_MIN_LEFT_NS to spare, does the watchdog prepare the
     * exception (prepare_before_due): that runs Python, which gives the GIL away
     * when a waiter has waited a whole interval -- in a crowded process
     * the watchdog would then queue for it again behind every other
     * thread; here at most the guarded thread runs meanwhile, before its
     * deadline, and the watchdog retakes the GIL one fast interval later.
     * (Running Python may also run a garbage collection, and with it
     * finalizers, on the watchdog's thread.)  Free-threaded
     * it never prepares: next to spinning threads, preparing made some
     * deliveries wait far longer than their deadline (cause not
     * isolated; the watchdog's Python work in a process where every stop
     * of the world waits for each busy thread to be scheduled); the
     * thread prepares for itself there (accel_prepare.c:
     * prepare_in_thread). */
    int quiet = !TC_FREE_THREADED && !busy && t1 - t0 < TC_PREARM_QUIET_NS;
    if (ev->deadline != TC_NEVER)
        anticipation_learn(t1 - t0);
    if (ev->deadline == TC_NEVER || ev->deadline <= t1 || atomic_load(&ev->slot->gen) != ev->gen)
        return WD_LEAD_FIRE;
    /* Early: pre-arm, and let the thread run on to fire its deadline
     * itself (tc_deliver.c: pre-armed slots); 3.12+ with a GIL only
     * if the GIL was free and came quickly (tc_tuning.h:
     * TC_PREARM_QUIET_NS). */
    int may_prearm = TC_PREARM_ALWAYS || quiet;
#if TC_TRACK_FRAMES
    /* 3.13: the thread will fire by itself, past wd_sweep's prune --
     * drop the scopes whose exit was skipped first (a change bumps
     * the slot's gen: the pre-arm below then declines). */
    if (may_prearm)
        wd_prune_slot(ev->slot);
#endif
    if (may_prearm && prearm_ahead(ev->slot, ev->gen)) {
        if (quiet)
            prepare_before_due(ev->slot, ev->deadline);
        anticipation_refresh();
        *ts = PyEval_SaveThread();
        return WD_LEAD_DONE;
    }
    /* Not pre-armed (3.12+, no hook, or the slot changed): with a GIL,
     * act at the deadline itself, holding the GIL up to it. */
    if (TC_FREE_THREADED || atomic_load(&ev->slot->gen) != ev->gen)
        return WD_LEAD_FIRE;
    if (!busy && t1 - t0 < anticipation_switch_ns() / TC_REQUEUE_QUICK_DIV &&
        ev->deadline - t1 > TC_REQUEUE_MIN_LEFT_NS) {
        /* The GIL came easily: the body releases it often (I/O).
         * Holding it for the rest of the lead would stall the body;
         * give it back and come again just before the deadline. */
        STAT_INC(requeues);
        *ts = PyEval_SaveThread();
        sleep_until(ev->deadline - TC_REQUEUE_EARLY_NS);
        (void)gil_take(*ts, ev->slot);
        if (atomic_load(&g_wd_stop))
            return WD_LEAD_STOP;
    }
    /* Hold the GIL up to the deadline: the body cannot run now, so
     * the interrupt lands when it resumes. */
    if (atomic_load(&ev->slot->gen) == ev->gen) {
        STAT_INC(gil_holds);
        if (quiet)
            prepare_before_due(ev->slot, ev->deadline);
        sleep_until(ev->deadline);
    }
    return WD_LEAD_FIRE;
}
