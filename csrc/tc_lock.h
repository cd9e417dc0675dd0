/*
 * tc_lock.h -- what stands in for the GIL on free-threaded CPython (PEP 703,
 * 3.14t): the core lock, and the per-block path's locks.  Included by
 * tc_internal.h.
 *
 * With a GIL, every guarantee of the core rests on one fact: the functions
 * of the Python-facing module, the watchdog's sweep and the delivery hook
 * all hold the GIL, so each runs atomically with respect to the others up to
 * the next point where Python code may give the GIL away (a Python call, a
 * blocking wait).  The code is written for exactly that: "no bytecode runs
 * between the block's end and the disarm", "the watchdog fires only a scope
 * still on the stack", "a pending delivery and its scope change together".
 *
 * Without a GIL those same regions run inside a critical section on the
 * process-wide PyMutex g_core_mu (PyCriticalSection_BeginMutex, 3.14's
 * public API), the per-block path excepted (below).  A critical section has the GIL's semantics rather than a
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
 * One core lock for what is shared, and one lock per slot for the
 * per-block path.  The core lock (g_core_mu) guards the shared state:
 * pending deliveries, the protected set, the hook's event mask, the slot
 * registry, the watchdog's plan.  A slot's lock (its `mu`) guards that slot
 * and the scopes on its stack against *other* threads; each scope has a
 * lock of its own too (its `mu`), for the time it is on no stack.  The rule
 * (what every region below keeps):
 *   - the slot's own thread may touch its slot and its scopes holding the
 *     core lock alone: its own per-block path cannot run meanwhile (one
 *     thread), and every other thread's region on them holds the core lock
 *     too;
 *   - any other thread touches slot `s` (the watchdog's fire, a cancel, a
 *     raise into a scope) holding the core lock AND s->mu
 *     (TC_CORE_BEGIN_ON), and a scope through TC_SCOPE_BEGIN: the core lock
 *     and the lock of the slot the scope is on, or the scope's own if none;
 *   - the per-block path (tc_scope.c: a plain entry or exit) holds the
 *     scope's lock and its slot's, and no core lock (TC_OWN_BEGIN).  It is
 *     taken only when the entry or exit touches nothing shared: no hook, no
 *     fire, no pending or armed delivery, nothing due -- conditions it tests
 *     under those two locks, falling back to the core lock otherwise.  Two
 *     threads entering and exiting blocks then share no lock at all.  (A
 *     plain entry nested in its own thread's region -- a finalizer's block
 *     -- finds its slot's lock free: only core-lock holders of other
 *     threads take it, and this thread holds the core lock.)
 * A scope's `slot` changes only with both its own and its slot's lock held
 * (a plain entry or exit) or the core lock and its slot's (any other), so
 * that TC_SCOPE_BEGIN, holding the core lock and one of those two, reads it
 * steadily.  A region that needs two locks takes them in one two-mutex
 * critical section (PyCriticalSection2_BeginMutex, public since 3.14),
 * which orders them; nested regions cannot deadlock, since a thread that
 * waits for any of them suspends every section it holds (above).
 * Rejected: one per-slot lock for everything, the shared state under
 * further locks -- every delivery would then take them in some order while
 * holding a slot's, and the suspension that keeps critical sections free of
 * deadlock would break the atomicity the delivery code relies on; the
 * per-block path is where threads meet, so that is the one kept off the
 * core lock.  What the core lock costs elsewhere: each region takes it
 * once, uncontended a compare-and-swap and a release; regions serialise
 * only for those few hundred nanoseconds, never while Python code runs: the
 * regions end the section around every call of Python code they make (a
 * scope's hooks, DeadlineExceeded's constructor) with
 * core_yield()/core_resume(), as the GIL would be released there.
 *
 * Where it is taken (a TC_*_BEGIN/TC_CORE_END pair in one function):
 *   every method and getter of Scope (TC_SCOPE_BEGIN; entry and exit: the
 *   per-block path first) and Shield, every function of the module that
 *   reads or writes core state, the watchdog around each slot it acts on
 *   (TC_CORE_BEGIN_ON; never while it plans or sleeps), and the delivery
 *   hook once its lock-free test (slot->pending_any) says its own thread
 *   has something pending.  Other threads' thread states are never read on a free-threaded
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
static __thread struct tc_slot *t_arm_due;   /* a hook to arm once it is let go */
static __thread int t_kick_due;              /* ... and then wake and kick it   */
static void core_after(void);                /* tc_deliver_steps.c             */

/* One region: its section and the mutexes it holds (m2 == m1: one), so
 * that core_yield/core_resume can let them go and take them back. */
typedef struct tc_region {
    PyCriticalSection2 cs;
    PyMutex *m1, *m2;
} tc_region;
static __thread tc_region *t_region;        /* this thread's innermost one    */

static inline void region_begin(tc_region *r, PyMutex *m1, PyMutex *m2)
{
    r->m1 = m1;
    r->m2 = m2;
    PyCriticalSection2_BeginMutex(&r->cs, m1, m2); /* m1 == m2: one section */
}

#define TC_REGION_BEGIN_(how)                                                       \
    tc_region tc_r_;                                                                \
    tc_region *tc_r_prev_ = t_region;                                               \
    how;                                                                            \
    t_region = &tc_r_

#define TC_CORE_BEGIN() TC_REGION_BEGIN_(region_begin(&tc_r_, &g_core_mu, &g_core_mu))
#define TC_CORE_BEGIN_ON(s) TC_REGION_BEGIN_(region_begin(&tc_r_, &g_core_mu, &(s)->mu))
#define TC_SCOPE_BEGIN(sc) TC_REGION_BEGIN_(scope_region_begin(&tc_r_, (sc)))
#define TC_OWN_BEGIN(sc, s) TC_REGION_BEGIN_(region_begin(&tc_r_, &(sc)->mu, &(s)->mu))

#define TC_CORE_END()                                                               \
    do {                                                                            \
        t_region = tc_r_prev_;                                                      \
        PyCriticalSection2_End(&tc_r_.cs);                                          \
        if (tc_r_prev_ == NULL && t_arm_due != NULL)                                \
            core_after();                                                           \
    } while (0)

/* Around a call of Python code inside a region: the GIL would be released
 * there, so the region's locks are too.  The region's section is the
 * innermost one at that point (nothing in between leaves one open).
 * Meanwhile the thread is outside any region: one the Python code opens is
 * outermost, and its end runs core_after. */
typedef tc_region *tc_yielded;

static inline tc_yielded core_yield(void)
{
    tc_region *r = t_region;
    if (r != NULL)
        PyCriticalSection2_End(&r->cs);
    t_region = NULL;
    return r;
}

static inline void core_resume(tc_yielded r)
{
    if (r != NULL)
        region_begin(r, r->m1, r->m2);
    t_region = r;
}

/* TC_SCOPE_BEGIN (tc_slot.c): the core lock and the lock of the slot `sc`
 * is on, or its own while it is on none. */
struct Scope;
static void scope_region_begin(tc_region *r, struct Scope *sc);

/* Is this thread inside a region? */
static inline int core_held(void) { return t_region != NULL; }

#define TC_ARM_LOCK() PyMutex_Lock(&g_arm_mu)
#define TC_ARM_UNLOCK() PyMutex_Unlock(&g_arm_mu)

#else /* with the GIL */

#define TC_CORE_BEGIN() ((void)0)
#define TC_CORE_BEGIN_ON(s) ((void)0)
#define TC_SCOPE_BEGIN(sc) ((void)0)
#define TC_OWN_BEGIN(sc, s) ((void)0)
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

/* Wrappers for a Scope's methods and getters: `name` runs `name##_locked`
 * inside TC_SCOPE_BEGIN(self). */
#define TC_SCOPE_LOCKED_2(ret, name, T2)                                            \
    static ret name(PyObject *a1, T2 a2)                                            \
    {                                                                               \
        ret r;                                                                      \
        TC_SCOPE_BEGIN(as_scope(a1));                                               \
        r = name##_locked(a1, a2);                                                  \
        TC_CORE_END();                                                              \
        return r;                                                                   \
    }

#define TC_SCOPE_LOCKED_3(ret, name, T2, T3)                                        \
    static ret name(PyObject *a1, T2 a2, T3 a3)                                     \
    {                                                                               \
        ret r;                                                                      \
        TC_SCOPE_BEGIN(as_scope(a1));                                               \
        r = name##_locked(a1, a2, a3);                                              \
        TC_CORE_END();                                                              \
        return r;                                                                   \
    }

#endif /* TC_LOCK_H */
