/*
 * tc_wd_main.c -- the watchdog thread's loop (wd_main: plan, sleep, fire;
 * before it sleeps, the placement and rescue hooks,
 * accel_placement_rescue.c), and its lifecycle: start (wd_ensure), stop and
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
        int64_t fast_until, fu2, look_at, look2;
        if (atomic_load(&g_wd_stop)) {
            fast_leave();
            PyEval_RestoreThread(ts);
            break;
        }
        uint32_t seen = atomic_load(&g_wd_seq);
        wd_event ev = wd_plan(&fast_until, &look_at);
        atomic_store(&g_wd_planned, ev.at < look_at ? ev.at : look_at);
        /* Dekker with wd_notify: a deadline stored before our store above
         * is seen by this second look; one stored after sees our plan. */
        wd_event ev2 = wd_plan(&fu2, &look2);
        if (ev2.at < ev.at)
            ev = ev2;
        if (look2 < look_at)
            look_at = look2;
        atomic_store(&g_wd_planned, ev.at < look_at ? ev.at : look_at);
        if (fu2 > fast_until)
            fast_until = fu2;
        if ((fu2 = fast_window_urgent_until()) > fast_until)
            fast_until = fu2;
        int64_t t0 = now_ns(), off_at = hook_idle_off_at(ev.at, t0);
        atomic_store(&g_wd_seen_at, t0);
        if (off_at <= t0) { /* free-threaded: idle delivery events go (tc_hook_monitoring.c) */
            PyEval_RestoreThread(ts);
            hook_idle_off(t0);
            ts = PyEval_SaveThread();
            continue;
        }
        if (ev.at > t0) {
            int64_t wake = ev.at < off_at ? ev.at : off_at;
            if (look_at < wake) /* a pre-armed deadline: the window's look */
                wake = look_at;
            if (fast_until > t0) { /* an interrupt on its way: keep it open */
                fast_enter();
                if (fast_until < wake)
                    wake = fast_until;
            }
            else
                fast_leave();
#if TC_FREE_THREADED
            wake = placement_before_sleep(ev.slot, ev.deadline, ev.at, wake, t0);
#endif
            rescue_before_sleep(ev.slot, ev.gen, ev.deadline);
            STAT_INC(watchdog_wakeups);
            atomic_store(&g_wd_wake_at, wake);
            (void)futex_wait_until(&g_wd_seq, seen, wake); /* any return: plan again */
            atomic_store(&g_wd_wake_at, 0);
            continue;
        }
        if (atomic_load(&ev.slot->gen) != ev.gen)
            continue; /* it changed while we looked: plan again */
        if (self_fire_watch(ev.slot, ev.gen, ev.deadline))
            continue; /* its thread holds the GIL: it fires itself */

        int busy = gil_take(ts, ev.slot);
        if (atomic_load(&g_wd_stop)) {
            fast_leave();
            break;
        }
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
         * of the world waits for each busy thread to be scheduled), while
         * the exit it speeds up is short already. */
        int quiet = !TC_FREE_THREADED && !busy && t1 - t0 < TC_PREARM_QUIET_NS;
        if (ev.deadline != TC_NEVER)
            anticipation_learn(t1 - t0);
        if (ev.deadline != TC_NEVER && ev.deadline > t1 && atomic_load(&ev.slot->gen) == ev.gen) {
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
                wd_prune_slot(ev.slot);
#endif
            if (may_prearm && prearm_ahead(ev.slot, ev.gen)) {
                if (quiet)
                    prepare_before_due(ev.slot, ev.deadline);
                anticipation_refresh();
                ts = PyEval_SaveThread();
                continue;
            }
        }
        /* Not pre-armed (3.12+, no hook, or the slot changed): with a GIL,
         * act at the deadline itself, holding the GIL up to it. */
        if (!TC_FREE_THREADED && ev.deadline != TC_NEVER && ev.deadline > t1 &&
            atomic_load(&ev.slot->gen) == ev.gen) {
            if (!busy && t1 - t0 < anticipation_switch_ns() / TC_REQUEUE_QUICK_DIV &&
                ev.deadline - t1 > TC_REQUEUE_MIN_LEFT_NS) {
                /* The GIL came easily: the body releases it often (I/O).
                 * Holding it for the rest of the lead would stall the body;
                 * give it back and come again just before the deadline. */
                STAT_INC(requeues);
                ts = PyEval_SaveThread();
                sleep_until(ev.deadline - TC_REQUEUE_EARLY_NS);
                (void)gil_take(ts, ev.slot);
                if (atomic_load(&g_wd_stop)) {
                    fast_leave();
                    break;
                }
            }
            /* Hold the GIL up to the deadline: the body cannot run now, so
             * the interrupt lands when it resumes. */
            if (atomic_load(&ev.slot->gen) == ev.gen) {
                STAT_INC(gil_holds);
                if (quiet)
                    prepare_before_due(ev.slot, ev.deadline);
                sleep_until(ev.deadline);
            }
        }
        wd_sweep(now_ns());
        hook_drain(); /* outside g_mu: it runs Python code (tc_hook_trace.c) */
        anticipation_refresh();
        ts = PyEval_SaveThread();
    }
    /* Here we hold the GIL: release the thread state made above with it. */
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
