/*
 * tc_wd_main.c -- the watchdog thread's loop (wd_main: plan, sleep, fire;
 * before it sleeps, the placement and rescue hooks,
 * accel_placement_rescue.c; before it fires, the lead, tc_wd_fire.c), and its lifecycle: start (wd_ensure), stop and
 * join (wd_stop), forget after fork.  Part of the unity build
 * (timeoutcore.c), after tc_wd_fire.c.
 *
 * Who calls what: wd_main runs in the watchdog thread, which has
 * all signals blocked but its own faults (wd_ensure) and one thread state
 * of its own; it plans without the
 * GIL and takes it only to act (tc_watchdog.c).  wd_ensure and wd_stop run with the GIL
 * (released while waiting or joining); wd_forget_after_fork in the fork
 * child, where no other thread exists.  Nothing here runs in a signal
 * handler.
 */

/* One look at every slot, as wd_main's plan. */
typedef struct {
    wd_event ev;        /* the earliest thing to do                         */
    int64_t fast_until; /* the fast window stays open until then (0: shut)  */
    int64_t look_at;    /* look again then, without acting (the window's)   */
    int64_t t0;         /* when it looked                                   */
    int64_t off_at;     /* free-threaded: idle delivery events go then      */
} wd_plan_t;

/* Plan: look twice (Dekker with wd_notify: a deadline stored before our
 * first g_wd_planned store is seen by the second look; one stored after
 * sees our plan), and publish the moment we mean to act. */
static void wd_plan_now(wd_plan_t *p)
{
    int64_t fu2, look2;
    p->ev = wd_plan(&p->fast_until, &p->look_at);
    atomic_store(&g_wd_planned, p->ev.at < p->look_at ? p->ev.at : p->look_at);
    wd_event ev2 = wd_plan(&fu2, &look2);
    if (ev2.at < p->ev.at)
        p->ev = ev2;
    if (look2 < p->look_at)
        p->look_at = look2;
    atomic_store(&g_wd_planned, p->ev.at < p->look_at ? p->ev.at : p->look_at);
    if (fu2 > p->fast_until)
        p->fast_until = fu2;
    if ((fu2 = fast_window_urgent_until()) > p->fast_until)
        p->fast_until = fu2;
    p->t0 = now_ns();
    p->off_at = hook_idle_off_at(p->ev.at, p->t0);
    atomic_store(&g_wd_seen_at, p->t0);
}

/* Sleep until the plan's next moment (keeping the fast window open while an
 * interrupt is on its way), or until woken; either way the caller plans
 * again.  No GIL. */
static void wd_sleep(const wd_plan_t *p, uint32_t seen)
{
    int64_t wake = p->ev.at < p->off_at ? p->ev.at : p->off_at;
    if (p->look_at < wake) /* a pre-armed deadline: the window's look */
        wake = p->look_at;
    if (p->fast_until > p->t0) {
        fast_enter();
        if (p->fast_until < wake)
            wake = p->fast_until;
    }
    else
        fast_leave();
#if TC_FREE_THREADED
    wake = placement_before_sleep(p->ev.slot, p->ev.deadline, p->ev.at, wake, p->t0);
#endif
    rescue_before_sleep(p->ev.slot, p->ev.gen, p->ev.deadline);
    STAT_INC(watchdog_wakeups);
    atomic_store(&g_wd_wake_at, wake);
    (void)futex_wait_until(&g_wd_seq, seen, wake);
    atomic_store(&g_wd_wake_at, 0);
}

/* Fire: the plan's moment has come.  Take the GIL, let the accelerators
 * act ahead of the deadline (wd_lead), then fire and re-send whatever is
 * due (wd_sweep).  Called without the GIL; returns 1 having released it
 * again (*ts), 0 holding it because the watchdog is stopping. */
static int wd_fire(const wd_plan_t *p, PyThreadState **ts)
{
    const wd_event *ev = &p->ev;
    if (atomic_load(&ev->slot->gen) != ev->gen)
        return 1; /* it changed while we looked: plan again */
    if (self_fire_watch(ev->slot, ev->gen, ev->deadline))
        return 1; /* its thread holds the GIL: it fires itself */
    int busy = gil_take(*ts, ev->slot);
    if (atomic_load(&g_wd_stop))
        return 0;
    switch (wd_lead(ev, busy, p->t0, ts)) {
    case WD_LEAD_DONE:
        return 1;
    case WD_LEAD_STOP:
        return 0;
    default:
        break;
    }
    wd_sweep(now_ns());
    hook_drain(); /* outside g_mu: it runs Python code (tc_hook_trace.c) */
    anticipation_refresh();
    *ts = PyEval_SaveThread();
    return 1;
}

/* The watchdog thread: plan, sleep, fire. */
static void *wd_main(void *arg)
{
    (void)arg;
    PyGILState_STATE gs;
    PyThreadState *ts;

    /* Precise wake-ups; failure only costs precision. */
    (void)prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    /* A short slice: woken at a deadline, it preempts a busy thread at once
     * instead of waiting for the CPU behind it (tc_tuning.h:
     * TC_WD_SLICE_NS).  Failure (an old kernel ignores it; a sandbox may
     * refuse it) only costs precision. */
    (void)os_short_slice(TC_WD_SLICE_NS);
#if TC_FREE_THREADED
    placement_watchdog_start();
#endif
    rescue_watchdog_start();
    atomic_store(&g_wd_tid, (int)syscall(SYS_gettid));
    gs = PyGILState_Ensure();
    ts = PyEval_SaveThread();
    atomic_store(&g_wd_ready, 1);
    futex_wake_all(&g_wd_ready);

    for (;;) {
        wd_plan_t p;
        if (atomic_load(&g_wd_stop)) {
            PyEval_RestoreThread(ts);
            break;
        }
        uint32_t seen = atomic_load(&g_wd_seq);
        wd_plan_now(&p);
        if (p.off_at <= p.t0) { /* free-threaded: idle delivery events go (tc_hook_monitoring.c) */
            PyEval_RestoreThread(ts);
            hook_idle_off(p.t0);
            ts = PyEval_SaveThread();
        }
        else if (p.ev.at > p.t0)
            wd_sleep(&p, seen);
        else if (!wd_fire(&p, &ts))
            break;
    }
    /* Here we hold the GIL: release the thread state made above with it. */
    fast_leave();
    PyGILState_Release(gs);
    return NULL;
}

/* Start the watchdog if it is not running.  GIL held.  Its signal mask
 * blocks everything but faults of its own: the core's signal must only
 * reach guarded threads.
 * `wait`: a block is about to start -- let the GIL go until the watchdog is
 * ready (below).  (Not in a fork child's restart: that thread runs on at
 * once, as it did in the parent.) */
static int wd_ensure(int wait)
{
    sigset_t all, old;
    int err;
    if (g_wd_running)
        return 0;
    anticipation_refresh();
    atomic_store(&g_wd_stop, 0);
    atomic_store(&g_wd_planned, 0);
    atomic_store(&g_wd_ready, 0);
    sigfillset(&all);
    /* ... but a fault of its own: blocked, the kernel kills the process
     * without running any handler, so faulthandler's report (which names
     * the crashing thread and dumps every thread's stack) never comes.
     * These are raised by the faulting thread itself, never by our timer. */
    (void)sigdelset(&all, SIGSEGV); /* a valid signal number: cannot fail */
    (void)sigdelset(&all, SIGBUS);
    (void)sigdelset(&all, SIGILL);
    (void)sigdelset(&all, SIGFPE);
    (void)sigdelset(&all, SIGABRT);
    if ((err = pthread_sigmask(SIG_SETMASK, &all, &old)) != 0)
        goto fail;
    err = pthread_create(&g_wd, NULL, wd_main, NULL);
    (void)pthread_sigmask(SIG_SETMASK, &old, NULL); /* restoring a valid mask */
    if (err != 0)
        goto fail;
    g_wd_running = 1;
#if !TC_FREE_THREADED
    /* The watchdog takes the GIL once as it starts (its thread state), and
     * the caller -- about to run a body under a deadline -- would hold it
     * for a switch interval: the process's first deadline was then late by
     * up to that, several times a short deadline.  So
     * the caller lets it go until the watchdog is ready; bounded, for a
     * start that can never take the GIL (a thread started during
     * finalization is ended there). */
    if (wait) {
        int64_t until = now_ns() + TC_WD_READY_MAX_NS;
        Py_BEGIN_ALLOW_THREADS
        while (!atomic_load(&g_wd_ready) && now_ns() < until)
            (void)futex_wait_until(&g_wd_ready, 0, until);
        Py_END_ALLOW_THREADS
    }
#else
    (void)wait; /* nothing to wait for: the watchdog needs no GIL to start */
#endif
    return 0;
fail:
    errno = err;
    PyErr_SetFromErrno(PyExc_OSError);
    return -1;
}

/* Stop and join the watchdog (GIL held; released while joining).  Returns
 * 0 or an errno from pthread_join. */
static int wd_stop(void)
{
    int err = 0;
    if (!g_wd_running)
        return 0;
    atomic_store(&g_wd_stop, 1);
    wd_wake();
    Py_BEGIN_ALLOW_THREADS
    err = pthread_join(g_wd, NULL);
    Py_END_ALLOW_THREADS
    g_wd_running = 0;
    atomic_store(&g_wd_tid, 0); /* gone: a late backstop moves nothing */
    return err;
}

/* After fork, in the child (no other thread exists): forget the watchdog. */
static void wd_forget_after_fork(void)
{
    fast_window_after_fork();
    g_wd_running = 0;
    atomic_store(&g_wd_tid, 0); /* the parent's: never moved from here */
    atomic_store(&g_wd_seen_at, 0);
    atomic_store(&g_wd_ready, 0);
#if TC_FREE_THREADED
    placement_after_fork();
#endif
    atomic_store(&g_wd_planned, 0);
}
