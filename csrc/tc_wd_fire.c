/*
 * tc_wd_fire.c -- what the watchdog does ahead of and at a deadline: take
 * the GIL (gil_busy, gil_take); the pre-arm it may do then is accelerator
 * prearm (accel_prearm.c).  Part of the unity build (timeoutcore.c), after accel_fast_window.c.
 *
 * Who calls what: all of it runs in the watchdog thread, from wd_main
 * (tc_wd_main.c), holding no lock of ours: gil_take without the GIL (it
 * returns holding it).  Nothing here runs in a signal handler.
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



