/*
 * tc_watchdog.c -- the one watchdog pthread: its schedule of every armed
 * slot, GIL anticipation (with requeue), and the fire-time sweep.  Part of
 * the unity build (timeoutcore.c).
 *
 * The watchdog plans WITHOUT the GIL (wd_plan reads the slots' atomics under
 * g_mu), sleeps on a futex until the next event, then takes the GIL and acts
 * (wd_sweep).  It never holds g_mu while it waits for the GIL; it takes g_mu
 * while holding the GIL.  It has all signals blocked, timer slack 1 ns, and
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
static int g_wd_running;                  /* GIL                          */
static _Atomic int g_wd_stop;
static _Atomic uint32_t g_wd_seq;         /* futex word to wake it        */
static _Atomic int64_t g_wd_planned = 0;  /* when it means to act next    */
static _Atomic int64_t g_wd_wake_at = 0;  /* when its current sleep ends  */
static _Atomic int g_wd_tid;              /* its kernel thread id         */
static _Atomic int64_t g_wd_seen_at = 0;  /* when it last planned (awake) */
static _Atomic uint32_t g_wd_ready;       /* it has its thread state      */
static _Atomic int64_t g_lead = TC_SWITCH_DEFAULT_NS + TC_LEAD_MARGIN_NS;
static _Atomic int64_t g_switch = TC_SWITCH_DEFAULT_NS;
/* How much longer than one switch interval the watchdog has lately waited for
 * the GIL ahead of a deadline (an average over the last ~8 waits, written by
 * the watchdog only): ~0 in a quiet process, the queue in front of it in a
 * crowded one.  With a GIL the lead grows by it (refresh_switch_interval, at
 * most TC_LEAD_CROWD_MAX_NS), so that the watchdog is at the deadline in
 * time; free-threaded there is no lead, and it is only reported. */
static _Atomic int64_t g_crowd_ns;

static void wd_learn_crowd(int64_t waited)
{
    int64_t extra = waited - atomic_load(&g_switch), c = atomic_load(&g_crowd_ns);
    atomic_store(&g_crowd_ns, c + ((extra > 0 ? extra : 0) - c) / 8);
}

static int wd_running(void) { return g_wd_running; }

static void wd_wake(void)
{
    atomic_fetch_add(&g_wd_seq, 1);
    futex_wake_all(&g_wd_seq);
}

/* Is slot s's tracer asleep until its deadline (tc_deliver.c: hook_sleep;
 * any thread, no lock)? */
static inline int slot_asleep(tc_slot *s)
{
#if TC_HOOK_TRACE
    return atomic_load(&s->dormant);
#else
    (void)s;
    return 0;
#endif
}

/* Slot s's deadline may have moved earlier: wake the watchdog if it means to
 * sleep past the moment it must ask for the GIL (free-threaded: pre-arm).
 * The watchdog may not get a CPU (tc_internal.h: TC_BACKSTOP_NS), and then
 * cannot arm the slot's backstop itself: it is armed here first when the
 * watchdog must be woken (a futex wake is paid anyway), or when it is
 * overdue -- its planned moment has passed, so it is busy, or starved.  An
 * entry that finds it asleep until a later moment costs no system call:
 * the watchdog arms the backstop when it plans for it.  (Arming at every
 * entry of a deadline 20 ms away or less cost such a block 0.49 -> 1.85 us,
 * 3.12.1, for a tail no better beyond the noise.)  `now`: the caller's
 * clock reading, or 0. */
static void wd_notify(tc_slot *s, int64_t deadline, int64_t now)
{
    if (deadline == TC_NEVER)
        return;
    int64_t planned = atomic_load(&g_wd_planned);
    /* a slot its own thread pre-armed (slot_self_prearm) needs no lead: the
     * watchdog looks at the deadline (wd_plan), or, while its tracer sleeps,
     * at the grace's end (the alarm wakes the tracer, the handler the
     * watchdog if need be) */
    int64_t need = !atomic_load(&s->prearmed) ? deadline - atomic_load(&g_lead) - prearm_lead()
                   : slot_asleep(s)           ? deadline + TC_PREARM_GRACE_NS
                                              : deadline;
    int wake = need < planned;
    if (atomic_load(&s->alive) && (wake || planned <= (now != 0 ? now : now_ns())))
        timer_backstop(s, atomic_load(&s->gen), deadline);
    if (wake)
        wd_wake();
}

/* The backstop's signal handler, in slot s's thread (tc_os.c: tc_handler;
 * async-signal-safe: atomics and system calls).  If the signal is s's
 * backstop -- armed for its current gen, which has not fired -- and the
 * watchdog has not planned since the deadline, it is starved of a CPU:
 * move it to this thread's (os_rescue) and wake it; it preempts this
 * thread there, acts, and goes back to its own CPU set before it sleeps
 * again.  A watchdog waiting for the GIL (or holding it up to the deadline)
 * is moved too, which only costs it a migration. */
static void wd_rescue(tc_slot *s)
{
    uint64_t gen = atomic_load(&s->backstop_gen);
    unsigned cpu = 0;
    if (!accel_on(ACCEL_RESCUE) || gen == 0 || gen != atomic_load(&s->gen) ||
        atomic_load(&s->state) != SLOT_ARMED ||
        atomic_load(&g_wd_seen_at) >= atomic_load(&s->deadline))
        return;
    if (syscall(SYS_getcpu, &cpu, NULL, NULL) != 0)
        return;
    int moved = os_rescue((pid_t)atomic_load(&g_wd_tid), (int)cpu) == 0;
    wd_wake();
    if (moved) {
        STAT_INC(rescues);
        (void)sched_yield();
    }
}

/* Before the watchdog sleeps for slot s's deadline of generation `gen`: the
 * slot's backstop, armed once per gen. */
static void wd_backstop(tc_slot *s, uint64_t gen, int64_t deadline)
{
    if (s != NULL && deadline != TC_NEVER && atomic_load(&s->backstop_gen) != gen) {
        pthread_mutex_lock(&g_mu); /* the timer lives while the slot does */
        if (s->alive)
            timer_backstop(s, gen, deadline);
        pthread_mutex_unlock(&g_mu);
    }
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
        /* A cancel off the control channel (tc_remote.c): a deadline that
         * has passed, with no lead (the fire applies it: slot_apply_remote). */
        int remote = atomic_load(&s->remote_req);
        int64_t r;
        if (remote && (r = atomic_load(&s->remote_at)) < d)
            *deadline_out = d = r;
        int64_t w = atomic_load(&s->watch_at); /* wd_watch */
        if (w != 0 && atomic_load(&s->watch_gen) == atomic_load(&s->gen))
            return w;
        if (remote)
            return d;
        return atomic_load(&s->prearmed) ? d + TC_PREARM_GRACE_NS /* wd_prearm */
                                         : d - lead - prearm_lead();
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
    int64_t lead = atomic_load(&g_lead), now = now_ns();
    *fast_until = 0;
    *look_at = TC_NEVER;
    pthread_mutex_lock(&g_mu);
    for (tc_slot *s = g_slots; s != NULL; s = s->next) {
        int st;
        int64_t d, at, fu;
        if (!s->alive)
            continue;
        /* A fired interrupt on its way, or the exit that claimed it running
         * its hooks (tc_scope.c: Scope_exit): its thread must get the GIL
         * back soon whenever it lets it go.  While it holds it, nobody else
         * need switch faster: the watchdog looks again after half the time
         * since the fire or claim (at least TC_WATCH_POLL_NS; a thread
         * deferred in protected code costs it a few looks, not a window).
         * Measured, 4 busy workers, 1 ms deadlines, most fired by their own
         * thread: the window had stayed open ~0.9 ms a deadline (3.12.1;
         * 3.11.7 ~0.8), opened by a look made before the claim. */
        {
            int64_t keep = atomic_load(&s->exit_until);
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
        }
        if ((fu = atomic_load(&s->linger_until)) > *fast_until) /* fast_after_claim */
            *fast_until = fu;
        /* pre-armed: from its deadline, a thread that does not hold the GIL
         * must get it soon (if it has not fired by the grace's end, the
         * watchdog's fire takes over); one that holds it fires at its next
         * line, and nobody else need switch faster for it.  Before the
         * deadline the window stays shut for it: the watchdog looks again
         * at the deadline itself (look_at) -- or, for a sleeping tracer,
         * the thread's alarm handler wakes it if the thread is off the GIL
         * (tc_deliver.c: hook_wake_here).  No window, no look
         * (free-threaded). */
        if (atomic_load(&s->state) == SLOT_ARMED && atomic_load(&s->prearmed)) {
            int64_t d = atomic_load(&s->deadline);
            if (d > now) {
                if (d < *look_at && !slot_asleep(s) && tc_lower_switch_supported())
                    *look_at = d;
            }
            else if ((fu = d + TC_PREARM_GRACE_NS) > *fast_until && !slot_holds_gil(s))
                *fast_until = fu;
        }
        /* due, watched, its thread off the GIL: it must get it back soon */
        if (atomic_load(&s->state) == SLOT_ARMED && !atomic_load(&s->prearmed) &&
            atomic_load(&s->watch_at) != 0 && atomic_load(&s->watch_gen) == atomic_load(&s->gen) &&
            (fu = atomic_load(&s->deadline)) <= now && fu + TC_WATCH_BACK_NS > *fast_until &&
            !slot_holds_gil(s))
            *fast_until = fu + TC_WATCH_BACK_NS;
        /* a cancel off the control channel: its thread will want the GIL */
        if (atomic_load(&s->state) == SLOT_ARMED && atomic_load(&s->remote_req) &&
            (fu = atomic_load(&s->remote_at) + TC_FAST_HOLD_NS) > *fast_until)
            *fast_until = fu;
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
    PyThreadState *t = tc_find_tstate(s->ident);
    if (t != NULL && slot_prune_stale(s, PyThreadState_GetFrame(t)))
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

/* An ARMED slot's fire is due: its deadline has passed, or a cancel came
 * off the control channel (tc_remote.c). */
static int slot_fire_due(tc_slot *s, int64_t now)
{
    return atomic_load(&s->deadline) <= now || atomic_load(&s->remote_req);
}

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
            int st = atomic_load(&s->state);
            if ((st == SLOT_ARMED && slot_fire_due(s, now)) ||
                (st == SLOT_INJECTED && atomic_load(&s->reinject_at) <= now)) {
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
            TC_CORE_BEGIN();
            int st = atomic_load(&s->state); /* again: its owner may have moved on */
            if (s->alive) {
                if (st == SLOT_ARMED && slot_fire_due(s, now))
                    slot_fire(s, now, 0);
                else if (st == SLOT_INJECTED && atomic_load(&s->reinject_at) <= now)
                    slot_reinject(s, now);
            }
            TC_CORE_END();
        }
    } while (more);
}

/* With the GIL: keep the lead one switch interval + a margin.
 * Free-threaded: no GIL to ask for, so no lead at all. */
static void refresh_switch_interval(void)
{
#if TC_FREE_THREADED
    atomic_store(&g_lead, 0);
    atomic_store(&g_switch, 0);
    return;
#endif
    /* sys from sys.modules, not an import: no import lock for the watchdog. */
    static PyObject *name; /* interned once, kept: GIL held */
    double v = 0.0;
    if (name == NULL)
        name = PyUnicode_InternFromString("sys");
    PyObject *mod = name != NULL ? PyImport_GetModule(name) : NULL;
    if (mod != NULL) {
        PyObject *r = PyObject_CallMethod(mod, "getswitchinterval", NULL);
        Py_DECREF(mod);
        if (r != NULL) {
            v = PyFloat_AsDouble(r);
            Py_DECREF(r);
        }
    }
    if (PyErr_Occurred())
        PyErr_Clear();
    if (!(v > 0 && v < 10.0))
        return;
    int64_t sw = (int64_t)(v * 1e9), margin = TC_LEAD_MARGIN_NS;
    /* Inside the fast window the value read is ours; in whole microseconds
     * (the float of 200 us converts to 199999 ns). */
    if (tc_lower_switch_supported() && (unsigned long)((sw + 500) / 1000) >= TC_FAST_SWITCH_US) {
        sw = (int64_t)TC_FAST_SWITCH_US * 1000; /* what gil_take() waits */
        margin = TC_LEAD_MARGIN_FAST_NS;
    }
    int64_t crowd = atomic_load(&g_crowd_ns); /* no anticipation: the GIL asked for at the deadline */
    atomic_store(&g_lead, !accel_on(ACCEL_ANTICIPATION) ? 0
                          : sw + margin + (crowd < TC_LEAD_CROWD_MAX_NS ? crowd : TC_LEAD_CROWD_MAX_NS));
    atomic_store(&g_switch, sw);
}

/* -- The fast window ---------------------------------------------------------
 * With other CPU-bound threads, a thread gets the GIL once its holder has
 * been asked to drop it, one switch interval after a waiter started waiting
 * (5 ms by default), and then only if the OS picks it among the waiters: a
 * deadline in a busy pool lands tens of ms late (measured on 3.12: p50 37,
 * p99 119 ms with 3 spinning threads).  So from the moment the watchdog
 * starts asking for the GIL for a deadline (`lead` before it) until the
 * fired interrupt is claimed at the scope's exit -- or TC_FAST_HOLD_NS after
 * the fire, if the thread is blocked or deferred in protected code -- the
 * switch interval is TC_FAST_SWITCH_US: the watchdog, then the guarded
 * thread, each get the GIL within a few fractions of a millisecond.  Outside
 * the window the user's value is back (unless they set one meanwhile: then
 * theirs stays), and it is put back when the watchdog stops (exit, fork).
 * Cost: more GIL switches for the whole process while a window is open
 * (benchmarks/bench_contention.py: pool throughput).  The watchdog opens and
 * closes it; a scope's exit that claims its interrupt closes it too when
 * nothing else needs it, or opens it when its thread is about to give the
 * GIL away (fast_after_claim), so g_fast_mu guards its state, and
 * g_fast_flag lets others look without the mutex. */
static pthread_mutex_t g_fast_mu = PTHREAD_MUTEX_INITIALIZER; /* the next three */
static int g_fast_on;
static unsigned long g_fast_saved;  /* the interval to put back            */
static int64_t g_fast_since;        /* when it was lowered                 */
static _Atomic int g_fast_flag;     /* g_fast_on, for a look without g_fast_mu */
/* The watchdog is waiting for the GIL (gil_take), in the window. */
static _Atomic int g_wd_taking;
/* Threads that took the GIL back for work that must not wait a whole switch
 * interval (wd_urgent_begin) keep the window open until they are done
 * (wd_urgent_end), or at most until g_urgent_until. */
static _Atomic int g_urgent_n;
static _Atomic int64_t g_urgent_until;
static _Thread_local int t_urgent;  /* this thread is one of them          */

static void fast_enter_locked(void)
{
    unsigned long cur;
    if (g_fast_on || !tc_lower_switch_supported())
        return;
    if ((cur = tc_switch_interval_us()) <= TC_FAST_SWITCH_US)
        return; /* the user runs a short interval already */
    g_fast_saved = cur;
    /* The waiters wait the new interval at once (tc_gil.c); if waking them
     * fails, each waits out its current wait first: later, not wrong. */
    if (tc_set_switch_interval_us(TC_FAST_SWITCH_US, 1) != 0)
        STAT_INC(rewait_errors);
    g_fast_on = 1;
    g_fast_since = now_ns();
    STAT_INC(fast_windows);
    atomic_store(&g_fast_flag, 1);
}

/* Whether the interval found at the window's end is still the window's: the
 * value it set, or that value written back through sys -- code that saves
 * sys.getswitchinterval() inside the window and restores it (a common
 * save/restore around some work) stores 199 us, not 200: sys reads the
 * interval as 1e-6 * us (0.00019999999999999998) and stores (unsigned
 * long)(1e6 * seconds), which truncates to 199.  Taken for the user's own
 * setting, that value stayed for good: below the window's, so no window
 * opened again and the whole process ran at ~200 us. */
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
    if (!g_fast_on)
        return;
    if (fast_interval_is_ours(tc_switch_interval_us()) &&
        tc_set_switch_interval_us(g_fast_saved, rewait) != 0)
        STAT_INC(rewait_errors);
    g_fast_on = 0;
    atomic_fetch_add_explicit(&g_st.fast_ns, (uint64_t)(now_ns() - g_fast_since),
                              memory_order_relaxed);
    atomic_store(&g_fast_flag, 0);
}

static void fast_enter(void)
{
    pthread_mutex_lock(&g_fast_mu);
    fast_enter_locked();
    pthread_mutex_unlock(&g_fast_mu);
}

static void fast_leave(void)
{
    pthread_mutex_lock(&g_fast_mu);
    fast_leave_locked(1);
    pthread_mutex_unlock(&g_fast_mu);
}

/* A scope's exit has claimed its interrupt (GIL held, any thread): close the
 * window here if nothing else keeps it open, instead of waking the watchdog
 * to do it -- a futex wake of a thread on another CPU costs the exiting
 * thread ~20 us on this machine class (an inter-processor interrupt in a
 * VM), a third of a quiet block's whole exit.  Returns 0 if the watchdog
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
    if (!atomic_load(&g_fast_flag))
        return 1;
    ev = wd_plan(&fast_until, &look_at);
    now = now_ns();
    if (fast_until > now || ev.at <= now)
        return 0;
    /* g_wd_taking is set under g_fast_mu (gil_take): a take that starts
     * after this keeps the window it opens. */
    pthread_mutex_lock(&g_fast_mu);
    closed = !atomic_load(&g_wd_taking) && atomic_load(&g_urgent_n) == 0;
    if (closed)
        fast_leave_locked(1);
    pthread_mutex_unlock(&g_fast_mu);
    if (!closed)
        return 0;
    atomic_fetch_add(&g_wd_seq, 1);
    /* an urgent thread that came meanwhile: the woken watchdog opens it again */
    return atomic_load(&g_urgent_n) == 0;
}

/* The exit that claimed an interrupt is about to return (GIL held, the
 * slot's own thread).  If no waiter has asked for the GIL, the window
 * closes now if nothing else keeps it (fast_close_after_claim; closing
 * restarts the waiters' waits at the user's interval: fast_leave_locked).
 * If one has, this thread gives the GIL away at its next breaker check, on
 * its way to the caller's handler, and must get it back within the window:
 * it stays open -- or opens -- for TC_EXIT_LINGER_NS (tc_internal.h), and
 * the watchdog closes it then.  The watchdog is woken only if it means to
 * sleep well past that (a futex wake of a thread on another CPU costs the
 * exiting thread ~20 us on this machine class); else the sequence bump
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
    int64_t cur = atomic_load(&g_urgent_until);
    while (cur < until && !atomic_compare_exchange_weak(&g_urgent_until, &cur, until))
        ;
    if (!t_urgent) {
        t_urgent = 1;
        atomic_fetch_add(&g_urgent_n, 1);
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
    if (atomic_fetch_sub(&g_urgent_n, 1) == 1)
        wd_wake();
}

/* Before the watchdog takes the GIL for slot `s`: is a thread other than
 * the slot's own holding it -- the process is busy?  A moment's look
 * (tc_gil_holder).  (The guarded thread itself holding it is the quiet
 * case: 3.11, which has no self-fire, takes the GIL from it.)  The watchdog
 * used to judge that by how long the take lasted (TC_PREARM_QUIET_NS), but
 * next to busy threads the GIL goes to whichever waiter gets it first after
 * a hand-off, and the watchdog, one of four or more, got it within that
 * time often enough to be taken for alone: it then pre-armed and let the
 * GIL go, and at the deadline had to win it again -- 1 take in ~15 lasted
 * 3-12 ms at the fast window's 200 us (3.12.1, 3 spinning threads), and
 * most deadlines more than 8 ms late were fired that late.  Busy, it holds
 * the GIL up to the deadline instead and fires on time (3.11, always
 * pre-armed, decides only whether to prepare the exception).  Spinning for the hand-off as well, to
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
 * holds the GIL anyway, asleep until the deadline (tc_deliver.c:
 * hook_sleep), and the watchdog is not needed before the grace's end.
 * Before wd_notify, which then does not wake it.  Already pre-armed (a
 * nested block with an earlier deadline): the alarm moves to the new
 * deadline.  Costs such a block ~1 us (the tracer set and put back, its
 * alarm set and taken back); blocks with a farther deadline are pre-armed
 * by the watchdog as before.  Measured,
 * 4 workers with a 1 ms deadline on every 4th 2 ms task (3.11.7, the
 * sleeping tracer in both): the watchdog's GIL takes 1.1 -> 0.1 a deadline,
 * the window's share of the time 0.63 -> 0.15. */
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

/* Ahead of slot `s`'s `deadline`, if TC_PREPARE_MIN_LEFT_NS is left (GIL
 * held / attached, holding no lock of ours): build the DeadlineExceeded of
 * the scope that will fire, for its exit to take (tc_scope.c: raise_exceeded).  Building runs Python (the
 * exception's constructor), so the slot is checked again after: if its
 * stack changed meanwhile (an exit, a reschedule or cancel) the exception
 * is dropped.  Costs the watchdog one construction per deadline it
 * prepares; a scope that ends in time drops it at its exit. */
static void wd_prepare(tc_slot *s, int64_t deadline)
{
    PyObject *sc = NULL, *exc;
    uint64_t gen = 0;
    if (g_exceeded == NULL || !accel_on(ACCEL_PREPARE) || deadline - now_ns() <= TC_PREPARE_MIN_LEFT_NS)
        return; /* building it could outlast the time left */
    {
        TC_CORE_BEGIN();
        if (s->alive && atomic_load(&s->state) == SLOT_ARMED && atomic_load(&s->shield) == 0) {
            gen = atomic_load(&s->gen);
            sc = stack_due(s->top, atomic_load(&s->deadline));
            if (sc != NULL && as_scope(sc)->prepared == NULL)
                Py_INCREF(sc);
            else
                sc = NULL;
        }
        TC_CORE_END();
    }
    if (sc == NULL)
        return;
    exc = PyObject_CallOneArg(g_exceeded, sc);
    if (exc == NULL)
        PyErr_Clear();
    {
        TC_CORE_BEGIN();
        if (exc != NULL && s->alive && atomic_load(&s->gen) == gen &&
            as_scope(sc)->state == SCOPE_ACTIVE && as_scope(sc)->prepared == NULL) {
            as_scope(sc)->prepared = exc;
            exc = NULL;
            STAT_INC(prepared);
        }
        TC_CORE_END();
    }
    Py_XDECREF(exc);
    Py_DECREF(sc);
}

#if TC_SELF_FIRE
/* -- The self-fire (3.12+ with a GIL) ------------------------------------------
 * Finding: in a pool of CPU-bound workers a task's deadline mostly comes
 * while its own thread holds the GIL -- a task starts in its worker's turn,
 * and a turn lasts a switch interval.  Anticipation then took the GIL from
 * the very thread that had to stop, which waited for its turn again while
 * the watchdog held the GIL, pre-armed (events that slow every thread) or
 * kept the fast window open: 4 workers, a 1 ms deadline on every 4th task
 * of 2 ms, 3.12.1: 0.70-0.78x the throughput without deadlines, p50 ~1 ms
 * late.  So while the slot's thread holds the GIL ahead of its deadline,
 * the watchdog does not ask for the GIL at all.  It looks at the GIL's
 * holder (tc_gil.c) TC_WATCH_PREPARE_NS ahead, where it asks the thread to
 * build its exception (pc_prepare, below: wd_prepare in the thread itself),
 * and TC_WATCH_SPIN_NS ahead, spins from there, and at the deadline
 * queues pc_fire (tc_deliver.c), which the thread runs at its next breaker
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
        wd_prepare(s, atomic_load(&s->deadline));
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

/* Queue pc_fire for slot `s` unless one is queued already (tc_deliver.c:
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
        /* A cancel off the control channel (tc_remote.c) for a thread that
         * waits for the GIL: it is due already, there was no lead to take
         * the GIL ahead.  Rather than queue for the GIL among the busy
         * threads -- a whole turn before the guarded thread's own (measured,
         * 3.12.1, 3 spinning threads: the watchdog fired 1.2 ms p50 after
         * the cancel was read, the job raised 1.6 ms later) -- the call goes
         * to the GIL's holder, whoever it is: pc_fire, run in another thread,
         * fires the slot from there as this sweep would (tc_deliver.c).  The
         * usual way if the GIL is free (it comes at once) or if nobody ran
         * the call within TC_WATCH_MAX_NS (a holder in C code that checks no
         * breaker). */
        const void *holder;
        int busy = tc_gil_holder(&holder) == 1, remote = atomic_load(&s->remote_req);
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
         * the pool for as long as the fired one waited for its turn (~1 ms
         * p50 in the window; 3.12 raises at the back-edge without the hook:
         * deliver_direct).  Measured, 4 workers, a 1 ms deadline on every
         * 4th 2 ms task (run_cpu_pool), alternated: 3.13.0 0.926 / 0.938 /
         * 0.921x the same work against 0.898 / 0.874 / 0.925; 3.12.1 0.893 /
         * 0.924 / 0.913 against 0.900 / 0.912 / 0.906 (no hook there
         * before either).  With 3 spinning threads (50 ms deadlines, 150
         * trials) p50 1.53 / 1.30 ms against 2.25 / 1.59 (3.13.0 / 3.12.1).
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

#if TC_FREE_THREADED
/* Where the watchdog waits (tc_internal.h: TC_PIN_AHEAD_NS), decided before
 * it sleeps until `wake` for `ev`.  For a pre-armed slot's fire at the
 * grace's end: on the CPU its thread's hook last ran on, from
 * TC_PIN_AHEAD_NS before the deadline (an earlier wake-up, returned, to move
 * then: the CPU is fresh, and the move's own scheduling is over well before
 * the deadline).  Once that slot has fired, where it is until the block has
 * claimed the interrupt: when the watchdog fired it, its going to sleep
 * there is what lets the thread back on that CPU.  (Moving off at once
 * measured far worse: delivered 3-6 ms after the fire, against ~0.1 ms or
 * a tick.)  The thread itself moves the watchdog off its CPU when it fires
 * its own deadline or raises a fired one (wd_step_aside): a wake-up there
 * -- at the grace's end, or the one the hook's disarm asks for -- would
 * preempt it on its way out, and it would wait a tick behind a busy thread
 * (measured: caught ~2 ms after raising on time, 14 trials in 150).
 * Otherwise: its own CPU set.  Tried and not kept: the thread moving the
 * sleeping watchdog to its CPU at its first pre-armed line, so that the
 * watchdog never moves itself while it runs (48-60 % of deadlines within
 * 0.5 ms against 53-72 %, alternated runs).  Returns when to wake. */
static tc_slot *g_pin_slot;   /* the watchdog's: the slot it moved for, */
static int64_t g_pin_fired_at; /* ... and when it first saw it fired */

static int64_t wd_place(wd_event ev, int64_t wake, int64_t now)
{
    tc_slot *s = ev.slot;
    int place = atomic_load(&g_place);
    if (!accel_on(ACCEL_PLACEMENT))
        return wake;
    if (s != NULL && ev.deadline != TC_NEVER && ev.at == ev.deadline + TC_PREARM_GRACE_NS &&
        atomic_load(&s->prearmed) && atomic_load(&s->state) == SLOT_ARMED) {
        int64_t pin_at = ev.deadline - TC_PIN_AHEAD_NS;
        int cpu = atomic_load(&s->cpu);
        if (now < pin_at)
            return wake < pin_at ? wake : pin_at;
        if (cpu >= 0 && cpu != place && os_place(cpu) == 0)
            STAT_INC(pins);
        g_pin_slot = s;
        g_pin_fired_at = 0;
        return wake;
    }
    if (g_pin_slot != NULL && atomic_load(&g_pin_slot->state) == SLOT_INJECTED) {
        /* fired: where it is until the block has claimed it, and while the
         * interrupt waits for its thread, asleep there again and again */
        if (g_pin_fired_at == 0)
            g_pin_fired_at = now;
        if (atomic_load(&g_pin_slot->pending_any) && now - g_pin_fired_at < TC_PIN_NUDGE_FOR_NS &&
            wake > now + TC_PIN_NUDGE_NS)
            wake = now + TC_PIN_NUDGE_NS;
        return wake;
    }
    g_pin_slot = NULL;
    g_pin_fired_at = 0;
    (void)os_place(TC_CPUS_OWN);
    return wake;
}

/* A guarded thread that fired its own pre-armed deadline, or is raising a
 * fired one, any lock held: keep the watchdog off its CPU (os_push_away;
 * nothing unless the watchdog waits there). */
static void wd_step_aside(void)
{
    if (accel_on(ACCEL_PLACEMENT))
        os_push_away((pid_t)atomic_load(&g_wd_tid), sched_getcpu());
}
#endif

static void *wd_main(void *arg)
{
    (void)arg;
    PyGILState_STATE gs;
    PyThreadState *ts;

    /* Precise wake-ups; failure only costs precision. */
    (void)prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    /* A short slice: woken at a deadline, it preempts a busy thread at once
     * instead of waiting for the CPU behind it (tc_internal.h:
     * TC_WD_SLICE_NS).  Failure (an old kernel ignores it; a sandbox may
     * refuse it) only costs precision. */
    (void)os_short_slice(TC_WD_SLICE_NS);
#if TC_FREE_THREADED
    os_place_init();
#endif
    os_place_start();
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
        if (atomic_load(&g_urgent_n) > 0 && (fu2 = atomic_load(&g_urgent_until)) > fast_until)
            fast_until = fu2;
        int64_t t0 = now_ns(), off_at = hook_idle_off_at(ev.at, t0);
        atomic_store(&g_wd_seen_at, t0);
        if (off_at <= t0) { /* free-threaded: idle delivery events go (tc_deliver.c) */
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
            os_rescue_undo(); /* after a rescue: its own set again (wd_rescue) */
#if TC_FREE_THREADED
            wake = wd_place(ev, wake, t0);
#endif
            wd_backstop(ev.slot, ev.gen, ev.deadline);
            STAT_INC(watchdog_wakeups);
            atomic_store(&g_wd_wake_at, wake);
            (void)futex_wait_until(&g_wd_seq, seen, wake); /* any return: plan again */
            atomic_store(&g_wd_wake_at, 0);
            continue;
        }
        if (atomic_load(&ev.slot->gen) != ev.gen)
            continue; /* it changed while we looked: plan again */
#if TC_SELF_FIRE
        if (accel_on(ACCEL_SELF_FIRE) && atomic_load(&ev.slot->state) == SLOT_ARMED && wd_watch(ev))
            continue; /* its thread holds the GIL: it fires itself */
#endif

        int busy = gil_take(ts, ev.slot);
        if (atomic_load(&g_wd_stop)) {
            fast_leave();
            break;
        }
        int64_t t1 = now_ns();
        /* The GIL came at once (within a fast interval or two: at most the
         * guarded thread was queued for it).  Only then, and with
         * TC_PREPARE_MIN_LEFT_NS to spare, does the watchdog prepare the
         * exception (wd_prepare): that runs Python, which gives the GIL away
         * when a waiter has waited a whole interval -- in a crowded process
         * the watchdog would then queue for it again behind every other
         * thread; here at most the guarded thread runs meanwhile, before its
         * deadline, and the watchdog retakes the GIL one fast interval later.
         * (Running Python may also run a garbage collection, and with it
         * finalizers, on the watchdog's thread.)  Free-threaded
         * it never prepares: measured with 3 spinning threads on 2 cores,
         * preparing made 1 delivery in 8 wait ~50 ms (cause not isolated;
         * the watchdog's Python work in a process where every stop of the
         * world waits for each busy thread to be scheduled), while the exit
         * it speeds up is a tenth of a millisecond. */
        int quiet = !TC_FREE_THREADED && !busy && t1 - t0 < TC_PREARM_QUIET_NS;
        if (ev.deadline != TC_NEVER)
            wd_learn_crowd(t1 - t0);
        if (ev.deadline != TC_NEVER && ev.deadline > t1 && atomic_load(&ev.slot->gen) == ev.gen) {
            /* Early: pre-arm, and let the thread run on to fire its deadline
             * itself (tc_deliver.c: pre-armed slots); 3.12+ with a GIL only
             * if the GIL was free and came quickly (tc_internal.h:
             * TC_PREARM_QUIET_NS). */
            int may_prearm = TC_PREARM_ALWAYS || quiet;
#if TC_TRACK_FRAMES
            /* 3.13: the thread will fire by itself, past wd_sweep's prune --
             * drop the scopes whose exit was skipped first (a change bumps
             * the slot's gen: the pre-arm below then declines). */
            if (may_prearm)
                wd_prune_slot(ev.slot);
#endif
            if (may_prearm && wd_prearm(ev.slot, ev.gen)) {
                if (quiet)
                    wd_prepare(ev.slot, ev.deadline);
                refresh_switch_interval();
                ts = PyEval_SaveThread();
                continue;
            }
        }
        /* Not pre-armed (3.12+, no hook, or the slot changed): with a GIL,
         * act at the deadline itself, holding the GIL up to it. */
        if (!TC_FREE_THREADED && ev.deadline != TC_NEVER && ev.deadline > t1 &&
            atomic_load(&ev.slot->gen) == ev.gen) {
            if (!busy && t1 - t0 < atomic_load(&g_switch) / 2 &&
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
                    wd_prepare(ev.slot, ev.deadline);
                sleep_until(ev.deadline);
            }
        }
        wd_sweep(now_ns());
        hook_drain(); /* outside g_mu: it runs Python code (tc_deliver.c) */
        refresh_switch_interval();
        ts = PyEval_SaveThread();
    }
    /* Here we hold the GIL: release the thread state made above with it. */
    PyGILState_Release(gs);
    return NULL;
}

/* Start the watchdog if it is not running.  GIL held.  Its signal mask
 * blocks everything: the core's signal must only reach guarded threads.
 * `wait`: a block is about to start -- let the GIL go until the watchdog is
 * ready (below).  (Not in a fork child's restart: that thread runs on at
 * once, as it did in the parent.) */
static int wd_ensure(int wait)
{
    sigset_t all, old;
    int err;
    if (g_wd_running)
        return 0;
    refresh_switch_interval();
    atomic_store(&g_wd_stop, 0);
    atomic_store(&g_wd_planned, 0);
    atomic_store(&g_wd_ready, 0);
    sigfillset(&all);
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
     * up to that (a 1 ms deadline on a CPU loop in a pool worker: raised
     * 5-16 ms after the entry on 3.11-3.13, 1.4-1.7 ms with the wait).  So
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
    fast_leave_locked(0); /* the child starts with the user's interval */
    g_wd_running = 0;
    atomic_store(&g_wd_tid, 0); /* the parent's: never moved from here */
    atomic_store(&g_wd_seen_at, 0);
    atomic_store(&g_wd_ready, 0);
#if TC_FREE_THREADED
    os_place_init(); /* no watchdog to move until the child's starts */
    g_pin_slot = NULL;
    g_pin_fired_at = 0;
#endif
    atomic_store(&g_wd_planned, 0);
    atomic_store(&g_urgent_until, 0);
    atomic_store(&g_urgent_n, 0); /* only this thread is left: its own mark goes too */
    t_urgent = 0;
}
