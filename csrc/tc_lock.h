/*
 * tc_lock.h -- what stands in for the GIL on free-threaded CPython (PEP 703,
 * 3.14t): the core lock.  Included by tc_internal.h.
 *
 * With a GIL, every guarantee of the core rests on one fact: the functions
 * of the Python-facing module, the watchdog's sweep and the delivery hook
 * all hold the GIL, so each runs atomically with respect to the others up to
 * the next point where Python code may give the GIL away (a Python call, a
 * blocking wait).  The code is written for exactly that: "no bytecode runs
 * between the block's end and the disarm", "the watchdog fires only a scope
 * still on the stack", "a pending delivery and its scope change together".
 *
 * Without a GIL those same regions run inside one critical section on one
 * process-wide PyMutex, g_core_mu (PyCriticalSection_BeginMutex, 3.14's
 * public API).  A critical section has the GIL's semantics rather than a
 * plain mutex's: it is held while the thread runs and *suspended* whenever
 * the thread detaches (blocks on a lock, waits in Py_BEGIN_ALLOW_THREADS,
 * is stopped for a stop-the-world), then re-taken before the thread goes on.
 * That is what makes it safe to keep every existing region as it is:
 *   - no deadlock with stop-the-world (sys.monitoring.set_events and the
 *     garbage collector pause every thread: a thread waiting for g_core_mu
 *     is detached, and one holding it detaches in turn when it must wait);
 *   - no self-deadlock: a finalizer run by a Py_DECREF inside a region that
 *     enters a scope of its own nests the section (skipped when the same
 *     mutex is the innermost section, else resumed after a suspension);
 *   - the points where another thread may slip in are exactly those where
 *     another thread could have taken the GIL, which the code handles
 *     already.
 * One process-wide lock, not one per slot: a scope's fields are written by
 * its owner and, through fire/cancel/reschedule, by other threads; pending
 * deliveries, the protected set, the hook's event mask and the slot
 * registry are shared -- a per-slot lock would need a second lock for all of
 * those and an ordering between them.  What it costs: each scope enter and
 * exit takes it once, uncontended a compare-and-swap and a release
 * (benchmarks/bench_overhead.py on 3.14t beside 3.14); threads that enter and
 * exit in parallel serialise only for those few hundred nanoseconds, never
 * while Python code runs: the regions end the section around every call of
 * Python code they make (a scope's hooks, DeadlineExceeded's constructor)
 * with core_yield()/core_resume(), as the GIL would be released there.
 *
 * Where it is taken (TC_CORE_BEGIN/TC_CORE_END pair in one function):
 *   every method and getter of Scope and Shield, every function of the
 *   module that reads or writes core state, the watchdog around each slot it
 *   acts on (never while it plans or sleeps), and the delivery hook once its
 *   lock-free test (slot->pending_any) says its own thread has something
 *   pending.  Other threads' thread states are never read on a free-threaded
 *   build (they may be freed at any moment): liveness is the slot's `alive`
 *   flag, and whether an interrupt is in flight is judged by the hook, in
 *   the thread itself.
 *
 * Besides: g_arm_mu, a plain PyMutex held across the hook's event-mask
 * change (tc_hook_monitoring.c: hook_arm), so that the count of armed threads and
 * the events sys.monitoring has on stay in step.  The arm itself -- a
 * set_events, which stops the world -- is never made inside the core lock:
 * a delivery inside a region only notes its slot (t_arm_due), and the
 * outermost TC_CORE_END arms it after the lock is let go (core_after).  A
 * thread that waits for a PyMutex held by one that waits for the world to
 * stop spins with sched_yield before it parks, which on an oversubscribed
 * machine lasts many scheduler ticks.  The wake-up and the signal that follow
 * a delivery ("inject first, then kick") are sent there too, after the arm:
 * a thread woken or signalled while the lock is held may preempt its holder
 * and then spin for the lock it needs at its exit.
 *
 * With the GIL all of these are no-ops and the code compiles to what it was.
 */
#ifndef TC_LOCK_H
#define TC_LOCK_H

#if TC_FREE_THREADED

static PyMutex g_core_mu;                    /* the core lock                  */
static PyMutex g_arm_mu;                     /* the hook's event mask          */
static __thread PyCriticalSection *t_core_cs; /* this thread's innermost one    */
static __thread struct tc_slot *t_arm_due;   /* a hook to arm once it is let go */
static __thread int t_kick_due;              /* ... and then wake and kick it   */
static void core_after(void);                /* tc_deliver_steps.c             */

#define TC_CORE_BEGIN()                                                             \
    PyCriticalSection tc_cs_;                                                       \
    PyCriticalSection *tc_cs_prev_ = t_core_cs;                                     \
    PyCriticalSection_BeginMutex(&tc_cs_, &g_core_mu);                              \
    t_core_cs = &tc_cs_

#define TC_CORE_END()                                                               \
    do {                                                                            \
        t_core_cs = tc_cs_prev_;                                                    \
        PyCriticalSection_End(&tc_cs_);                                             \
        if (tc_cs_prev_ == NULL && t_arm_due != NULL)                               \
            core_after();                                                           \
    } while (0)

/* Around a call of Python code inside a region: the GIL would be released
 * there, so the core lock is too.  The region's section is the innermost
 * one at that point (nothing in between leaves one open).  Meanwhile the
 * thread is outside any region: one the Python code opens is outermost, and
 * its end runs core_after. */
typedef PyCriticalSection *tc_yielded;

static inline tc_yielded core_yield(void)
{
    tc_yielded c = t_core_cs;
    if (c != NULL)
        PyCriticalSection_End(c);
    t_core_cs = NULL;
    return c;
}

static inline void core_resume(tc_yielded c)
{
    if (c != NULL)
        PyCriticalSection_BeginMutex(c, &g_core_mu);
    t_core_cs = c;
}

#define TC_ARM_LOCK() PyMutex_Lock(&g_arm_mu)
#define TC_ARM_UNLOCK() PyMutex_Unlock(&g_arm_mu)

#else /* with the GIL */

#define TC_CORE_BEGIN() ((void)0)
#define TC_CORE_END() ((void)0)
typedef int tc_yielded;
static inline tc_yielded core_yield(void) { return 0; }
static inline void core_resume(tc_yielded c) { (void)c; }
#define TC_ARM_LOCK() ((void)0)
#define TC_ARM_UNLOCK() ((void)0)

#endif

/* Wrappers: `name` runs `name##_locked` inside the core lock. */
#define TC_LOCKED_2(ret, name, T1, T2)                                              \
    static ret name(T1 a1, T2 a2)                                                   \
    {                                                                               \
        ret r;                                                                      \
        TC_CORE_BEGIN();                                                            \
        r = name##_locked(a1, a2);                                                  \
        TC_CORE_END();                                                              \
        return r;                                                                   \
    }

#define TC_LOCKED_3(ret, name, T1, T2, T3)                                          \
    static ret name(T1 a1, T2 a2, T3 a3)                                            \
    {                                                                               \
        ret r;                                                                      \
        TC_CORE_BEGIN();                                                            \
        r = name##_locked(a1, a2, a3);                                              \
        TC_CORE_END();                                                              \
        return r;                                                                   \
    }

#endif /* TC_LOCK_H */
