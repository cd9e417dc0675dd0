/*
 * accel_placement_rescue.c -- accelerators placement and rescue: where the
 * watchdog thread runs.  Its hooks: tc_accel.h.  Part of the unity build
 * (timeoutcore.c), after tc_watchdog.c.
 *
 * One file for two accelerators because they are one mechanism: both move
 * the watchdog's CPU affinity, and on a free-threaded build a rescue is one
 * more placement, under the same try-lock and recorded in the same place
 * (g_cpu.place), so that the next placement knows where the watchdog is.
 * Each is still switched on its own (accel_on), and with both off the
 * watchdog never changes its affinity.
 *   placement (free-threaded only): before it sleeps for a pre-armed
 *     slot's fire at the grace's end, the watchdog moves to the CPU that
 *     slot's thread last ran on (placement_before_sleep), and a guarded
 *     thread that fires or raises its own deadline moves it off its CPU
 *     (placement_step_aside).
 *   rescue: before it sleeps, the watchdog arms the due slot's backstop
 *     timer (rescue_before_sleep, rescue_arm); its signal in the guarded
 *     thread, if the watchdog has not planned since the deadline, moves the
 *     starved watchdog to that thread's CPU (rescue_on_signal); the
 *     watchdog goes back before it sleeps again.
 * The slot's timer and its backstop_gen are the core's (tc_os.c: the kick
 * and, on 3.11, the sleeping tracer's alarm use the same kernel timer, and
 * the field says what it is armed for); the CPU a thread last ran on
 * (tc_slot.cpu) is shared with the self-fire's spin.
 */

/* Where the watchdog runs: this file's state. */
#if TC_FREE_THREADED
#define TC_CPUS_OWN (-1)
#define TC_CPUS_AWAY(k) (-2 - (k))
#endif
static struct {
#if TC_FREE_THREADED
    cpu_set_t own;            /* its set when it left TC_CPUS_OWN         */
    _Atomic int place;        /* TC_CPUS_OWN, a CPU, or TC_CPUS_AWAY(k)   */
    _Atomic int busy;         /* the placement's try-lock                 */
    tc_slot *pin_slot;        /* the watchdog's: the slot it moved for,   */
    int64_t pin_fired_at;     /* ... and when it first saw it fired       */
#else
    cpu_set_t rescue_own;     /* its set before the first rescue ...      */
    _Atomic int rescued;      /* ... which has not been undone            */
    _Atomic int rescue_busy;  /* the rescuers' try-lock                   */
#endif
    cpu_set_t start;          /* the watchdog's set at its start          */
    _Atomic int start_known;  /* ... read (rescue_watchdog_start)         */
} g_cpu = {
#if TC_FREE_THREADED
    .place = TC_CPUS_OWN,
#endif
    .start_known = 0,
};

/* Where the watchdog runs (free-threaded builds only: tc_tuning.h,
 * TC_PIN_AHEAD_NS): g_cpu.place is TC_CPUS_OWN (its own CPU set), a CPU k >= 0
 * (k only) or TC_CPUS_AWAY(k) (its set but k), and always says what its
 * affinity is: it changes only together with the affinity, under
 * g_cpu.busy -- a try-lock the watchdog (place_self) and a guarded thread
 * that fired its own deadline or raises a fired one (place_push_away) hold
 * for one or two system calls each, and that neither waits for: the other
 * is moving it, and only precision is lost.  g_cpu.own is the watchdog's
 * set when it left TC_CPUS_OWN, read then, so a later change of the
 * process's affinity by the user is respected; written before g_cpu.place
 * leaves TC_CPUS_OWN. */
#if TC_FREE_THREADED

static inline int place_lock(void) { return atomic_exchange(&g_cpu.busy, 1) == 0; }
static inline void place_unlock(void) { atomic_store(&g_cpu.busy, 0); }

/* The watchdog at its start, the atfork child: on its own set, unlocked. */
static void place_init(void)
{
    atomic_store(&g_cpu.place, TC_CPUS_OWN);
    place_unlock();
}

/* The CPU set that `place` stands for; 0 if there is none (a CPU outside
 * the watchdog's set, or nothing but it). */
static int place_set(int place, cpu_set_t *set)
{
    int k = place >= 0 ? place : TC_CPUS_AWAY(place); /* AWAY is its own inverse */
    *set = g_cpu.own;
    if (place == TC_CPUS_OWN)
        return 1;
    if (k >= CPU_SETSIZE || !CPU_ISSET(k, &g_cpu.own))
        return 0;
    if (place >= 0) {
        CPU_ZERO(set);
        CPU_SET(k, set);
        return 1;
    }
    CPU_CLR(k, set);
    return CPU_COUNT(set) > 0;
}

/* Move the watchdog -- thread `tid`, 0 from the watchdog itself -- to
 * `place`: the CPU set place_set gives for it, or `set` if not NULL.
 * Returns 0, or an errno (busy: another thread is moving it; EINVAL: no
 * such place); it then stays where it is. */
static int place_move(pid_t tid, int place, const cpu_set_t *set)
{
    cpu_set_t placed;
    int err = 0;
    if (atomic_load(&g_cpu.place) == place)
        return 0;
    if (!place_lock())
        return EBUSY;
    if (atomic_load(&g_cpu.place) == TC_CPUS_OWN &&
        sched_getaffinity(tid, sizeof g_cpu.own, &g_cpu.own) != 0)
        err = errno;
    else if (set == NULL && !place_set(place, &placed))
        err = EINVAL;
    else if (sched_setaffinity(tid, sizeof placed, set != NULL ? set : &placed) != 0)
        err = errno;
    else
        atomic_store(&g_cpu.place, place);
    place_unlock();
    return err;
}

/* The watchdog: run where `place` says. */
static int place_self(int place) { return place_move(0, place, NULL); }

/* A guarded thread on `cpu` that has just fired its own deadline or raises
 * a fired one, any lock held: if the watchdog `tid` waits on this CPU, move
 * it off (one system call) -- its wake-up at the grace's end, or one the
 * block's exit asks for, would otherwise preempt this very thread, which
 * then waits a tick behind a busy one. */
static void place_push_away(pid_t tid, int cpu)
{
    cpu_set_t set;
    if (tid <= 0 || cpu < 0 || atomic_load(&g_cpu.place) != cpu || !place_lock())
        return;
    if (atomic_load(&g_cpu.place) == cpu && place_set(TC_CPUS_AWAY(cpu), &set) &&
        sched_setaffinity(tid, sizeof set, &set) == 0)
        atomic_store(&g_cpu.place, TC_CPUS_AWAY(cpu));
    place_unlock();
}
#endif

/* -- The watchdog's rescue (tc_tuning.h: TC_BACKSTOP_NS) -------------------
 * The backstop's signal handler, in a guarded thread on `cpu` (async-signal-
 * safe: a few system calls), moves a starved watchdog `tid` to that CPU --
 * one it started with, whatever its affinity is at that moment (rescue_move:
 * 0, or an errno) -- and the watchdog goes back before it sleeps again
 * (rescue_undo).
 *
 * Free-threaded, where the watchdog has a placement of its own (g_cpu.place,
 * above): the move is one more placement, under the same try-lock, and
 * placement_before_sleep, which runs before every sleep, decides where it goes next.
 * With a GIL: g_cpu.rescue_busy is a try-lock only rescuers hold, never
 * across a move of the watchdog by itself -- a thread that changes its own affinity
 * may be migrated in that call onto the very CPU it is starved on, and stay
 * there, mid-call, for as long; with a lock held, no later rescue could move
 * it.  Either way, a rescue that finds the lock taken gives up (EBUSY:
 * another move is under way). */

/* Hook: the watchdog, as it starts: note its CPU set. */
static void rescue_watchdog_start(void)
{
#if !TC_FREE_THREADED
    atomic_store(&g_cpu.rescued, 0);
    atomic_store(&g_cpu.rescue_busy, 0);
#endif
    atomic_store(&g_cpu.start_known, sched_getaffinity(0, sizeof g_cpu.start, &g_cpu.start) == 0);
}

static int rescue_move(pid_t tid, int cpu)
{
    cpu_set_t set;
    int err = 0;
    if (tid <= 0 || cpu < 0 || cpu >= CPU_SETSIZE || !atomic_load(&g_cpu.start_known) ||
        !CPU_ISSET(cpu, &g_cpu.start))
        return EINVAL;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
#if TC_FREE_THREADED
    if (atomic_load(&g_cpu.place) == cpu)
        return EALREADY;
    err = place_move(tid, cpu, &set); /* a CPU it started with, even outside its own set */
#else
    if (atomic_exchange(&g_cpu.rescue_busy, 1))
        return EBUSY;
    if (!atomic_load(&g_cpu.rescued) &&
        sched_getaffinity(tid, sizeof g_cpu.rescue_own, &g_cpu.rescue_own) != 0)
        err = errno;
    else if (sched_setaffinity(tid, sizeof set, &set) != 0)
        err = errno;
    else
        atomic_store(&g_cpu.rescued, 1);
    atomic_store(&g_cpu.rescue_busy, 0);
#endif
    return err;
}

/* The watchdog, before it sleeps: back to its own set after a rescue
 * (free-threaded: placement_before_sleep does, from g_cpu.own). */
static void rescue_undo(void)
{
#if !TC_FREE_THREADED
    cpu_set_t own;
    if (!atomic_load(&g_cpu.rescued) || atomic_exchange(&g_cpu.rescue_busy, 1))
        return;
    own = g_cpu.rescue_own;
    atomic_store(&g_cpu.rescued, 0);
    atomic_store(&g_cpu.rescue_busy, 0);
    /* Fails only for a set with no allowed CPU (the user changed the
     * process's affinity meanwhile): it then stays where the rescue put it. */
    (void)sched_setaffinity(0, sizeof own, &own);
#endif
}

/* -- Hooks (tc_accel.h) ------------------------------------------------------ */

#if TC_FREE_THREADED
static void placement_watchdog_start(void) { place_init(); }

static void placement_after_fork(void)
{
    place_init(); /* no watchdog to move until the child's starts */
    g_cpu.pin_slot = NULL;
    g_cpu.pin_fired_at = 0;
}

/* Where the watchdog waits (tc_tuning.h: TC_PIN_AHEAD_NS), decided before
 * it sleeps until `wake` for its next event, at `at`, for slot `s`'s
 * `deadline`.  For a pre-armed slot's fire at the
 * grace's end: on the CPU its thread's hook last ran on, from
 * TC_PIN_AHEAD_NS before the deadline (an earlier wake-up, returned, to move
 * then: the CPU is fresh, and the move's own scheduling is over well before
 * the deadline).  Once that slot has fired, where it is until the block has
 * claimed the interrupt: when the watchdog fired it, its going to sleep
 * there is what lets the thread back on that CPU.  (Moving off at once was
 * rejected: the delivery then waited scheduler ticks instead of a moment.)
 * The thread itself moves the watchdog off its CPU when it fires
 * its own deadline or raises a fired one (placement_step_aside): a wake-up
 * there -- at the grace's end, or the one the hook's disarm asks for --
 * would preempt it on its way out, and it would wait a tick behind a busy
 * thread (a block that raised on time then reached its caller late).
 * Otherwise: its own CPU set.  Rejected: the thread moving the sleeping
 * watchdog to its CPU at its first pre-armed line, so that the watchdog
 * never moves itself while it runs -- fewer deadlines landed promptly than
 * with the watchdog moving itself.  Returns when to wake. */
static int64_t placement_before_sleep(tc_slot *s, int64_t deadline, int64_t at, int64_t wake,
                                      int64_t now)
{
    int place = atomic_load(&g_cpu.place);
    if (!accel_on(ACCEL_PLACEMENT))
        return wake;
    if (s != NULL && deadline != TC_NEVER && at == deadline + TC_PREARM_GRACE_NS &&
        atomic_load(&s->prearmed) && atomic_load(&s->state) == SLOT_ARMED) {
        int64_t pin_at = deadline - TC_PIN_AHEAD_NS;
        int cpu = atomic_load(&s->cpu);
        if (now < pin_at)
            return wake < pin_at ? wake : pin_at;
        if (cpu >= 0 && cpu != place && place_self(cpu) == 0)
            STAT_INC(pins);
        g_cpu.pin_slot = s;
        g_cpu.pin_fired_at = 0;
        return wake;
    }
    if (g_cpu.pin_slot != NULL && atomic_load(&g_cpu.pin_slot->state) == SLOT_INJECTED) {
        /* fired: where it is until the block has claimed it, and while the
         * interrupt waits for its thread, asleep there again and again */
        if (g_cpu.pin_fired_at == 0)
            g_cpu.pin_fired_at = now;
        if (atomic_load(&g_cpu.pin_slot->pending_any) &&
            now - g_cpu.pin_fired_at < TC_PIN_NUDGE_FOR_NS && wake > now + TC_PIN_NUDGE_NS)
            wake = now + TC_PIN_NUDGE_NS;
        return wake;
    }
    g_cpu.pin_slot = NULL;
    g_cpu.pin_fired_at = 0;
    (void)place_self(TC_CPUS_OWN);
    return wake;
}

static void placement_step_aside(void)
{
    if (accel_on(ACCEL_PLACEMENT))
        place_push_away((pid_t)atomic_load(&g_wd_tid), sched_getcpu());
}
#endif

/* Arm the slot's timer to expire TC_BACKSTOP_NS past `deadline`, the
 * deadline of its generation `gen`, unless it is armed for that gen already
 * (rescue_on_signal). */
static void rescue_arm(tc_slot *s, uint64_t gen, int64_t deadline)
{
    if (!accel_on(ACCEL_RESCUE) || !s->timer_ok || deadline == TC_NEVER ||
        atomic_exchange(&s->backstop_gen, gen) == gen)
        return;
    (void)timer_set_at(s, gen, deadline + TC_BACKSTOP_NS); /* failed: no backstop, as before */
}

/* The backstop's signal handler, in slot s's thread (tc_os.c: tc_handler;
 * async-signal-safe: atomics and system calls).  If the signal is s's
 * backstop -- armed for its current gen, which has not fired -- and the
 * watchdog has not planned since the deadline, it is starved of a CPU:
 * move it to this thread's (rescue_move) and wake it; it preempts this
 * thread there, acts, and goes back to its own CPU set before it sleeps
 * again.  A watchdog waiting for the GIL (or holding it up to the deadline)
 * is moved too, which only costs it a migration. */
static void rescue_on_signal(tc_slot *s)
{
    uint64_t gen = atomic_load(&s->backstop_gen);
    unsigned cpu = 0;
    if (!accel_on(ACCEL_RESCUE) || gen == 0 || gen != atomic_load(&s->gen) ||
        atomic_load(&s->state) != SLOT_ARMED ||
        atomic_load(&g_wd_seen_at) >= atomic_load(&s->deadline))
        return;
    if (syscall(SYS_getcpu, &cpu, NULL, NULL) != 0)
        return;
    int moved = rescue_move((pid_t)atomic_load(&g_wd_tid), (int)cpu) == 0;
    wd_wake();
    if (moved) {
        STAT_INC(rescues);
        (void)sched_yield();
    }
}

/* Before the watchdog sleeps for slot s's deadline of generation `gen`:
 * back to its own CPU set after a rescue, and the slot's backstop, armed
 * once per gen. */
static void rescue_before_sleep(tc_slot *s, uint64_t gen, int64_t deadline)
{
    rescue_undo();
    if (s != NULL && deadline != TC_NEVER && atomic_load(&s->backstop_gen) != gen) {
        pthread_mutex_lock(&g_mu); /* the timer lives while the slot does */
        if (s->alive)
            rescue_arm(s, gen, deadline);
        pthread_mutex_unlock(&g_mu);
    }
}

/* At import (tc_accel.h). */
static const char *placement_unsupported(void)
{
    return TC_FREE_THREADED ? NULL : "unsupported on this CPython (free-threaded builds only)";
}

/* At import (tc_accel.h). */
static const char *rescue_unsupported(void)
{
    return NULL;
}
