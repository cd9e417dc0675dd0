/*
 * accel_fast_window.c -- accelerator fast_window: the switch interval
 * lowered while the watchdog, then a fired thread, needs the GIL, and the
 * urgent windows of threads that take the GIL back to apply a registry
 * cancel.  Its hooks: tc_accel.h; its switch: the interval's address
 * (tc_compat.h: tc_switch_setup, tc_lower_switch_supported), without which
 * every hook here does nothing.  Part of the unity build (timeoutcore.c),
 * after tc_watchdog.c.
 *
 * State: g_fast (below) and this thread's urgent mark.  The slot's
 * fast_until, exit_until and linger_until stay in the slot: they are the
 * core's record of a fired interrupt on its way and of a claiming exit
 * running its hooks, which the watchdog's plan reads for its looks and for
 * the window alike (and the remote relay's yield, for the exit).
 *
 * Who calls what: the watchdog opens and closes the window (fast_enter,
 * fast_leave), with or without the GIL; a scope's exit that claims its
 * interrupt (tc_scope.c: Scope_exit, GIL held) closes or re-opens it
 * (fast_after_claim); wd_urgent_begin/wd_urgent_end run in any thread
 * without the GIL (tc_module.c: _wait_readable).  g_fast.mu guards the
 * window's state; the interval itself is written through tc_gil.c.  Nothing
 * here runs in a signal handler.
 */

/* -- The fast window ---------------------------------------------------------
 * With other CPU-bound threads, a thread gets the GIL once its holder has
 * been asked to drop it, one switch interval after a waiter started waiting
 * (5 ms by default), and then only if the OS picks it among the waiters: a
 * deadline in a busy pool lands several switch intervals late
 * (bench_contention.py).  So from the moment the watchdog
 * starts asking for the GIL for a deadline (`lead` before it) until the
 * fired interrupt is claimed at the scope's exit -- or TC_FAST_HOLD_NS after
 * the fire, if the thread is blocked or deferred in protected code -- the
 * switch interval is TC_FAST_SWITCH_US: the watchdog, then the guarded
 * thread, each get the GIL within about one short interval.  Outside
 * the window the user's value is back (unless they set one meanwhile: then
 * theirs stays), and it is put back when the watchdog stops (exit, fork).
 * Cost: more GIL switches for the whole process while a window is open
 * (benchmarks/bench_contention.py: pool throughput).  The watchdog opens and
 * closes it; a scope's exit that claims its interrupt closes it too when
 * nothing else needs it, or opens it when its thread is about to give the
 * GIL away (fast_after_claim), so g_fast.mu guards its state, and
 * g_fast.flag lets others look without the mutex. */
static struct {
    pthread_mutex_t mu;       /* the next three                           */
    int on;
    unsigned long saved;      /* the interval to put back                 */
    int64_t since;            /* when it was lowered                      */
    _Atomic int flag;         /* `on`, for a look without the mutex       */
    /* The watchdog is waiting for the GIL (gil_take), in the window. */
    _Atomic int wd_taking;
    /* Threads that took the GIL back for work that must not wait a whole
     * switch interval (wd_urgent_begin) keep the window open until they are
     * done (wd_urgent_end), or at most until urgent_until. */
    _Atomic int urgent_n;
    _Atomic int64_t urgent_until;
} g_fast = {.mu = PTHREAD_MUTEX_INITIALIZER};
static _Thread_local int t_urgent; /* this thread is one of them          */

static void fast_enter_locked(void)
{
    unsigned long cur;
    if (g_fast.on || !tc_lower_switch_supported())
        return;
    if ((cur = tc_switch_interval_us()) <= TC_FAST_SWITCH_US)
        return; /* the user runs a short interval already */
    g_fast.saved = cur;
    /* The waiters wait the new interval at once (tc_gil.c); if waking them
     * fails, each waits out its current wait first: later, not wrong. */
    if (tc_set_switch_interval_us(TC_FAST_SWITCH_US, 1) != 0)
        STAT_INC(rewait_errors);
    g_fast.on = 1;
    g_fast.since = now_ns();
    STAT_INC(fast_windows);
    atomic_store(&g_fast.flag, 1);
}

/* Whether the interval found at the window's end is still the window's: the
 * value it set, or that value written back through sys -- code that saves
 * sys.getswitchinterval() inside the window and restores it (a common
 * save/restore around some work) stores 199 us, not 200: sys reads the
 * interval as 1e-6 * us (0.00019999999999999998) and stores (unsigned
 * long)(1e6 * seconds), which truncates to 199.  Taken for the user's own
 * setting, that value stayed for good: below the window's, so no window
 * opened again and the whole process ran at the window's interval. */
static int fast_interval_is_ours(unsigned long cur)
{
    const double sys_read = 1e-6 * (double)TC_FAST_SWITCH_US;
    return cur == TC_FAST_SWITCH_US || cur == (unsigned long)(1e6 * sys_read);
}

/* With `rewait`, the waiters wait the user's interval afresh (tc_gil.c): a
 * short wait that began before this would otherwise ask the holder to let
 * go within TC_FAST_SWITCH_US -- often the thread whose interrupt was just
 * claimed, on its way to its handler, which then queued for the GIL at the
 * user's interval behind every busy thread.  No waiter, no wake-up: only a
 * busy process pays for it.  Without (the fork child: no other thread, and
 * the GIL's mutex may be in any state there), a plain store. */
static void fast_leave_locked(int rewait)
{
    if (!g_fast.on)
        return;
    if (fast_interval_is_ours(tc_switch_interval_us()) &&
        tc_set_switch_interval_us(g_fast.saved, rewait) != 0)
        STAT_INC(rewait_errors);
    g_fast.on = 0;
    atomic_fetch_add_explicit(&g_st.fast_ns, (uint64_t)(now_ns() - g_fast.since),
                              memory_order_relaxed);
    atomic_store(&g_fast.flag, 0);
}

static void fast_enter(void)
{
    pthread_mutex_lock(&g_fast.mu);
    fast_enter_locked();
    pthread_mutex_unlock(&g_fast.mu);
}

static void fast_leave(void)
{
    pthread_mutex_lock(&g_fast.mu);
    fast_leave_locked(1);
    pthread_mutex_unlock(&g_fast.mu);
}

/* The planner (tc_watchdog.c: wd_plan, under g_mu; the watchdog's without
 * the GIL, fast_close_after_claim's with it), for
 * each live slot `s` at `now`: until when it keeps the window open
 * (raises *fast_until) and when the watchdog should look again without
 * acting (lowers *look_at). */
static void fast_window_plan(tc_slot *s, int64_t now, int64_t *fast_until, int64_t *look_at)
{
    int64_t fu, keep = atomic_load(&s->exit_until);
    /* A fired interrupt on its way, or the exit that claimed it running
     * its hooks (tc_scope.c: Scope_exit): its thread must get the GIL
     * back soon whenever it lets it go.  While it holds it, nobody else
     * need switch faster: the watchdog looks again after half the time
     * since the fire or claim (at least TC_WATCH_POLL_NS; a thread
     * deferred in protected code costs it a few looks, not a window).
     * Opening it at every look instead kept it open for most of each
     * deadline in a busy pool whose deadlines their own threads fire:
     * the look came before the claim. */
    if (atomic_load(&s->state) == SLOT_INJECTED && (fu = atomic_load(&s->fast_until)) > keep)
        keep = fu;
    if (keep > now && tc_lower_switch_supported() && slot_holds_gil(s)) {
        int64_t since = now - (keep - TC_FAST_HOLD_NS), again = since / 2;
        again = now + (again > TC_WATCH_POLL_NS ? again : TC_WATCH_POLL_NS);
        if (again < *look_at)
            *look_at = again;
    }
    else if (keep > *fast_until)
        *fast_until = keep;
    if ((fu = atomic_load(&s->linger_until)) > *fast_until) /* fast_after_claim */
        *fast_until = fu;
    /* pre-armed: from its deadline, a thread that does not hold the GIL
     * must get it soon (if it has not fired by the grace's end, the
     * watchdog's fire takes over); one that holds it fires at its next
     * line, and nobody else need switch faster for it.  Before the
     * deadline the window stays shut for it: the watchdog looks again
     * at the deadline itself (look_at) -- or, for a sleeping tracer,
     * the thread's alarm handler wakes it if the thread is off the GIL
     * (sleeping_tracer_on_signal).  No window, no look
     * (free-threaded). */
    if (atomic_load(&s->state) == SLOT_ARMED && atomic_load(&s->prearmed)) {
        int64_t d = atomic_load(&s->deadline);
        if (d > now) {
            if (d < *look_at && !sleeping_tracer_asleep(s) && tc_lower_switch_supported())
                *look_at = d;
        }
        else if ((fu = d + TC_PREARM_GRACE_NS) > *fast_until && !slot_holds_gil(s))
            *fast_until = fu;
    }
    /* due, watched, its thread off the GIL: it must get it back soon */
    if (atomic_load(&s->state) == SLOT_ARMED && !atomic_load(&s->prearmed) &&
        self_fire_look_at(s) != 0 && (fu = atomic_load(&s->deadline)) <= now && fu + TC_WATCH_BACK_NS > *fast_until &&
        !slot_holds_gil(s))
        *fast_until = fu + TC_WATCH_BACK_NS;
    /* a cancel off the control channel: its thread will want the GIL */
    if (atomic_load(&s->state) == SLOT_ARMED &&
        (fu = remote_relay_marked_at(s)) != TC_NEVER &&
        (fu += TC_FAST_HOLD_NS) > *fast_until)
        *fast_until = fu;
}

/* A scope's exit has claimed its interrupt (GIL held, any thread): close the
 * window here if nothing else keeps it open, instead of waking the watchdog
 * to do it -- a futex wake of a thread on another CPU costs the exiting
 * thread an inter-processor interrupt (in a VM, a large part of a quiet
 * block's whole exit).  Returns 0 if the watchdog
 * must decide (it has something due now, or another thread needs the
 * window: then the caller wakes it).  The watchdog's own plan may have been
 * made before the claim: the sequence bump makes a futex wait it has not
 * started yet return at once, so it plans again, and one it has started
 * runs to its planned time, which finds the window closed. */
static int fast_close_after_claim(void)
{
    int64_t fast_until, look_at, now;
    wd_event ev;
    int closed;
    if (!atomic_load(&g_fast.flag))
        return 1;
    ev = wd_plan(&fast_until, &look_at);
    now = now_ns();
    if (fast_until > now || ev.at <= now)
        return 0;
    /* g_fast.wd_taking is set under g_fast.mu (gil_take): a take that starts
     * after this keeps the window it opens. */
    pthread_mutex_lock(&g_fast.mu);
    closed = !atomic_load(&g_fast.wd_taking) && atomic_load(&g_fast.urgent_n) == 0;
    if (closed)
        fast_leave_locked(1);
    pthread_mutex_unlock(&g_fast.mu);
    if (!closed)
        return 0;
    atomic_fetch_add(&g_wd_seq, 1);
    /* an urgent thread that came meanwhile: the woken watchdog opens it again */
    return atomic_load(&g_fast.urgent_n) == 0;
}

/* The exit that claimed an interrupt is about to return (GIL held, the
 * slot's own thread).  If no waiter has asked for the GIL, the window
 * closes now if nothing else keeps it (fast_close_after_claim; closing
 * restarts the waiters' waits at the user's interval: fast_leave_locked).
 * If one has, this thread gives the GIL away at its next breaker check, on
 * its way to the caller's handler, and must get it back within the window:
 * it stays open -- or opens -- for TC_EXIT_LINGER_NS (tc_tuning.h), and
 * the watchdog closes it then.  The watchdog is woken only if it means to
 * sleep well past that (a futex wake of a thread on another CPU costs the
 * exiting thread an inter-processor interrupt); else the sequence bump
 * makes a wait it has not started yet return at once, and one it has
 * started ends soon enough. */
static void fast_after_claim(tc_slot *s)
{
    int64_t until, wake;
    if (!tc_lower_switch_supported() || !tc_gil_drop_requested()) {
        atomic_store(&s->exit_until, 0);
        if (!fast_close_after_claim())
            wd_wake(); /* it closes the fast window */
        return;
    }
    STAT_INC(exit_lingers);
    until = now_ns() + TC_EXIT_LINGER_NS;
    atomic_store(&s->linger_until, until);
    atomic_store(&s->exit_until, 0);
    fast_enter();
    wake = atomic_load(&g_wd_wake_at);
    if (wake > until + TC_EXIT_LINGER_NS) /* 0 while it is awake */
        wd_wake();
    else
        atomic_fetch_add(&g_wd_seq, 1);
}

/* Without the GIL, any thread: open the fast window for this thread, which
 * is about to take the GIL back to act on something urgent (the registry's
 * subscriber with a cancel to apply), until it calls wd_urgent_end or at
 * most TC_URGENT_MAX_NS.  Its own take_gil() may already wait the old
 * interval: opening the window wakes it (tc_gil.c), so it asks the holder to
 * let go after the fast interval.  The window stays open while it applies
 * the message: every GIL release on the way (a socket read) would
 * otherwise cost it a whole switch interval to come back. */
static void wd_urgent_begin(void)
{
    int64_t until = now_ns() + TC_URGENT_MAX_NS;
    int64_t cur = atomic_load(&g_fast.urgent_until);
    while (cur < until && !atomic_compare_exchange_weak(&g_fast.urgent_until, &cur, until))
        ;
    if (!t_urgent) {
        t_urgent = 1;
        atomic_fetch_add(&g_fast.urgent_n, 1);
    }
    wd_wake();
}

/* Any thread: this thread's urgent work is done (nothing if it had none);
 * the watchdog closes the window if nothing else keeps it open. */
static void wd_urgent_end(void)
{
    if (!t_urgent)
        return;
    t_urgent = 0;
    if (atomic_fetch_sub(&g_fast.urgent_n, 1) == 1)
        wd_wake();
}

/* -- Hooks for the watchdog's GIL take, its loop, fork (tc_accel.h) --------- */

static void fast_window_take_begin(void)
{
    pthread_mutex_lock(&g_fast.mu);
    atomic_store(&g_fast.wd_taking, 1); /* a claim meanwhile leaves the window open */
    fast_enter_locked();
    pthread_mutex_unlock(&g_fast.mu);
}

static void fast_window_take_end(void) { atomic_store(&g_fast.wd_taking, 0); }

static int64_t fast_window_urgent_until(void)
{
    return atomic_load(&g_fast.urgent_n) > 0 ? atomic_load(&g_fast.urgent_until) : 0;
}

static void fast_window_atfork_prepare(void) { pthread_mutex_lock(&g_fast.mu); }

static void fast_window_atfork_parent(void) { pthread_mutex_unlock(&g_fast.mu); }

static void fast_window_atfork_child(void) { pthread_mutex_unlock(&g_fast.mu); }

/* The fork child, after fast_window_atfork_child (only this thread). */
static void fast_window_after_fork(void)
{
    fast_leave_locked(0); /* the child starts with the user's interval */
    atomic_store(&g_fast.urgent_until, 0);
    atomic_store(&g_fast.urgent_n, 0); /* only this thread is left: its own mark goes too */
    t_urgent = 0;
}

/* At import (tc_accel.h). */
static const char *fast_window_unsupported(void)
{
    return TC_FREE_THREADED ? "unsupported on this CPython (free-threaded: no GIL)" : NULL;
}
