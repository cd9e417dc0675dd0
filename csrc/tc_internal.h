/*
 * tc_internal.h -- structs, enums, constants and shared state of the core.
 *
 * Included once, by the unity build timeoutcore.c, before the parts (its
 * opening comment lists them, in order).  For each
 * field: who writes it, and under which lock.  "GIL" means the writer holds
 * the GIL -- on a free-threaded build, the core lock (tc_lock.h), which
 * every such region holds instead; g_mu is the slot-registry mutex.
 */
#ifndef TC_INTERNAL_H
#define TC_INTERNAL_H

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>
#include <linux/futex.h>

#include "timeoutcore.h"
#include "tc_compat.h"
#include "tc_tuning.h"
#include "tc_accel.h"
#include "tc_lock.h"

/* -- Constants ------------------------------------------------------------- */
/* Tuning constants (latency and cost, never correctness): tc_tuning.h. */

#define TC_NS_PER_S 1000000000LL
#define TC_NS_PER_S_F 1e9
#define TC_NEVER INT64_MAX                  /* "no deadline", in ns          */

/* Argument bounds in seconds; the pure-Python engine checks the same. */
#define TC_MAX_SECONDS 3.0e8
#define TC_MAX_MONOTONIC 9.0e9

/* tc_bench_timer_pair arms the timer this far ahead, then disarms it. */
#define TC_BENCH_FAR_NS (3600LL * TC_NS_PER_S)

/* -- Slots: one per thread that ever entered a scope or shield -------------- */

/* Delivery state of a slot; tc_slot.c opens with its transition table and
 * is its only writer (slot_to):
 *   IDLE      no deadline on the stack, nothing fired;
 *   ARMED     a deadline is on the stack, not fired;
 *   INJECTED  a scope on the stack fired and is not claimed yet (exactly
 *             when s->fired is set). */
enum { SLOT_IDLE = 0, SLOT_ARMED = 1, SLOT_INJECTED = 2 };

#define TC_CACHE_LINE 64 /* bytes: what two threads' slots must not share */

typedef struct tc_slot {
    /* Written once, at creation, by slot_get (GIL + g_mu); slots are never
     * freed, so a pointer to one stays valid for the life of the process. */
    struct tc_slot *next;          /* registry list                        */
#if TC_FREE_THREADED
    PyMutex mu;                    /* other threads' regions on this slot
                                      and its scopes, and the per-block
                                      path (tc_lock.h)                     */
#endif

    /* g_mu: set by slot_get (GIL), cleared by slot_release at thread exit
     * (no GIL) and by the atfork child handler. */
    _Atomic int alive;             /* owned by a running thread (read
                                      without g_mu by the watchdog and, on
                                      a free-threaded build, as liveness) */
    int timer_ok;                  /* timer_id is a live kernel timer      */
    int timer_id;
    _Atomic uint64_t backstop_gen; /* the gen its timer is armed for as the
                                      watchdog's backstop, 0 if none (any
                                      thread: rescue_arm, the kick, the
                                      sleeping tracer's alarm)             */

    /* slot_get (GIL + g_mu) and the atfork child; read by anyone. */
    pid_t tid;                     /* kernel thread id (gettid)            */
    unsigned long ident;           /* threading.get_ident()                */

    /* Atomics read WITHOUT any lock by the watchdog's planner (wd_plan).
     * Written with the GIL: by the owner (enter, exit, shield, sleep), by
     * the watchdog (fire, reinject) and by any thread through reschedule()
     * or cancel(); without the GIL only by slot_release at thread exit and
     * by the atfork child, when no Python code of that thread can run. */
    _Atomic int64_t deadline;      /* earliest deadline on the stack, ns   */
    _Atomic int64_t exit_until;    /* the claiming exit runs the scope's
                                      exit hooks and builds its exception,
                                      then returns: the window holds for
                                      them until then (0: not)             */
    _Atomic int64_t linger_until;  /* ... and after it returned, if a
                                      waiter had asked for the GIL
                                      (fast_after_claim)                   */
    _Atomic uint64_t gen;          /* bumped on every change of the above  */
    _Atomic int state;             /* SLOT_*, only through slot_to         */
    _Atomic int64_t reinject_at;   /* next re-injection when INJECTED      */
    _Atomic int64_t fast_until;    /* fired: the fast window holds for it
                                      until then (0: not, or claimed)      */
    int64_t reinject_step;         /* GIL                                  */

    /* Owner thread only (GIL); read by the watchdog. */
    _Atomic int shield;            /* shield depth (shield() and exit hooks) */

    /* Futex word the owner's sleep() waits on; bumped (GIL) by whoever
     * injects into this thread. */
    _Atomic uint32_t wake;
    /* Bumped (GIL) by _raise_in_scope (a soft-limit exception raised into the
     * block); sleep() returns so that it lands. */
    _Atomic uint32_t raised;

    /* GIL only. */
    PyObject *top;                 /* innermost active scope (strong ref)  */
    PyObject *fired;               /* scope whose deadline fired (borrowed:
                                      it is on the stack while set)        */
    PyObject *sent_ref;            /* a weak reference to the interrupt's
                                      instance last made for `fired`
                                      (interrupt_new), or NULL; dropped
                                      with `fired` (slot_unfire)           */
    int64_t held_since;            /* when a re-injection first found that
                                      instance still held (0: not yet)     */

    /* Delivery (tc_deliver.c), GIL only: written by whoever delivers (the
     * watchdog, _raise_in_scope's caller) and by the owner at the safe
     * point or when it takes the delivery back. */
    PyObject *pending;             /* exception class to raise at the next
                                      safe line boundary, or NULL (strong) */
    _Atomic int pending_any;       /* pending != NULL, for the hook's test
                                      without the core lock (tc_lock.h)    */
    PyObject *pending_scope;       /* the scope it is for (borrowed: on the
                                      stack while set)                     */
    _Atomic int hooked;            /* the delivery hook is armed for it
                                      (written under g_arm_mu, tc_lock.h)  */
    _Atomic int prearmed;          /* the watchdog armed the hook ahead of
                                      the deadline: the owner fires itself
                                      at its first line boundary past
                                      `deadline` (set by prearm_ahead; cleared
                                      by any fire, by the owner's exit and
                                      by deliver_cancel)                   */
    _Atomic int cpu;               /* the CPU the owner last noted running
                                      on, -1 if none yet: free-threaded, its
                                      pre-armed hook's (placement); with a
                                      GIL, 3.12+, at the self-fire's
                                      prepare (for its watch's spin)       */
    int async_pending;             /* fallback: raised with SetAsyncExc    */
    /* The soft exception last sent (_raise_in_scope), for the unraisable
     * audit hook to know a drop of it (tc_unraisable.c): identities only,
     * compared and never dereferenced -- the scope counts only while it is
     * found on the stack with soft_pending set. */
    _Atomic(const void *) soft_cls; /* its class (its own thread compares
                                      it without the core lock first)      */
    const void *soft_scope;        /* the scope it was sent for            */
    const void *soft_frame;        /* the frame it surfaced in (the hook's
                                      delivery), or NULL                   */
    _Atomic(const void *) tstate_id; /* the thread state its owner last ran
                                      on (slot_note_tstate), compared with
                                      the GIL's holder and with the linked
                                      states, never dereferenced           */
    uint64_t tstate_uid;           /* that state's PyThreadState_GetID (GIL) */
    struct self_fire_slot self_fire; /* accelerator self_fire's        */
    struct remote_relay_slot relay; /* accelerator remote_relay's      */
#if TC_FREE_THREADED
    struct prepare_slot prep;      /* accelerator prepare's (owner thread) */
#endif
    int hook_skips;                /* owner thread: hook_core_busy's count */
    int64_t deferred_since;        /* first time the hook found protected
                                      code on the stack, 0 if not yet      */
#if TC_HOOK_TRACE
    Py_tracefunc prev_trace;       /* the thread's own tracer, chained    */
    PyObject *prev_traceobj;       /* (strong)                            */
    PyObject *op_frame;            /* frame whose opcode events the
                                      backstop turned on (strong), or NULL */
    struct sleeping_tracer_slot sleeper; /* accelerator sleeping_tracer's */
#endif
#if TC_JUMP_DEFER_BUILD
    PyObject *insn_code;           /* code object whose INSTRUCTION events
                                      the JUMP callback switched on, to
                                      raise at `insn_at` (strong), or NULL */
    long insn_at;                  /* the jump's target, a byte offset     */
#endif
} tc_slot;

/* The thread state of the slot's thread, or NULL if it is gone (GIL held;
 * tc_compat.h: tc_find_tstate, never on a free-threaded build). */
#define slot_find_tstate(s) tc_find_tstate(atomic_load(&(s)->tstate_id), (s)->tstate_uid)

/* The owner, GIL held, at its slot's making and at each scope's entry: note
 * the thread state it runs on.  Rule: noted at every entry, because a thread
 * without a Python thread of its own (PyGILState_Ensure/Release around each
 * call, as ctypes callbacks from a foreign thread do) runs each call on a
 * new state, while its slot lasts as long as the OS thread; a block's scopes
 * all run on the state its entry noted.  The state's unique id goes with
 * its address, which a new state may reuse. */
static inline void slot_note_tstate(struct tc_slot *s, PyThreadState *t)
{
    uint64_t uid = PyThreadState_GetID(t);
    if (s->tstate_uid != uid || atomic_load_explicit(&s->tstate_id, memory_order_relaxed) != t) {
        s->tstate_uid = uid;
        atomic_store(&s->tstate_id, (const void *)t);
    }
}

/* Rule: ANOTHER thread's frames are looked at with the collector off (GIL
 * held; the watchdog, a cancelling thread).  PyThreadState_GetFrame and
 * PyFrame_GetBack make frame objects; that allocation may start a
 * collection, whose finalizers run Python code, which may let the GIL go.
 * The other thread then runs on: it may leave the frames being read, or
 * end and free them with its thread state -- and CPython reads the frame
 * right after the allocation (_PyFrame_MakeAndSetFrameObject), so the look
 * itself crashed (a finalizer that slept, a thread that ended meanwhile:
 * tests/test_watchdog.py).  With the collector off, nothing called while
 * looking runs Python code.  Rejected: checking the thread afterwards -- the
 * read that crashes is inside CPython's own call.  PyGC_Disable is public
 * API (3.10+); its previous state is put back, so a collector the program
 * switched off stays off. */
static inline int frames_look_begin(void) { return PyGC_Disable(); }
static inline void frames_look_end(int was)
{
    if (was)
        (void)PyGC_Enable();
}

/* -- Scope: the object behind `with thread_deadline(...)` -------------------- */

enum { SCOPE_NEW = 0, SCOPE_ACTIVE = 1, SCOPE_DONE = 2 };

/* Every field is read and written with the GIL held (free-threaded: under
 * the locks tc_lock.h names), but `relay`. */
typedef struct Scope {
    PyObject_HEAD
#if TC_FREE_THREADED
    PyMutex mu;            /* its lock while on no stack, and with its
                              slot's on the per-block path (tc_lock.h)  */
#endif
    PyObject *label;
    PyObject *parent;      /* enclosing scope on this thread while active  */
    tc_slot *slot;         /* the slot while active, else NULL             */
    double seconds;        /* relative limit; NAN for absolute/none        */
    int64_t deadline;      /* own absolute deadline (ns) or TC_NEVER       */
    int64_t entered;       /* ns                                           */
    int64_t exited;        /* ns, 0 while active                           */
    int64_t fired_at;      /* ns when the interrupt was raised, 0 if never */
    int state;             /* SCOPE_*                                      */
    int raise_on_timeout;
    int expired;           /* this scope's deadline fired                  */
    int has_deadline_arg;  /* deadline given at construction (absolute)    */
    int soft_pending;      /* _raise_in_scope() raised into this block     */
    pid_t native_id;       /* kernel thread id of the entering thread      */
    unsigned long ident;   /* threading.get_ident() of the entering thread */
    PyObject *hook;        /* hook(scope, "enter"|"exit", exc) or NULL     */
    PyObject *exit_exc;    /* the exception the block ended with, or NULL  */
    PyObject *frame;       /* frame object of the with statement, while
                              active: the bound of the protected-code
                              check, and on 3.13 how stale scopes are
                              found; NULL where frame_address knows the
                              frame (but for a wrapper scope: owner set)  */
    struct frame_address_scope frame_address; /* accelerator frame_address's */
    PyObject *owner;       /* entered by a wrapper (tc_guarded.c: wrapper
                              scopes): frame object of the code the wrapper
                              guards, while active; else NULL            */
    int64_t delivered_at;  /* ns when the interrupt surfaced in the body  */
    int64_t deferred_ns;   /* time its delivery waited for protected code */
    PyObject *deferred_where; /* "file:line in function" that held it     */
    struct prepare_scope prepare; /* accelerator prepare's (tc_accel.h)  */
    struct remote_relay_scope relay; /* accelerator remote_relay's:
                              written without the GIL (tc_accel.h)      */
} Scope;

static inline Scope *as_scope(PyObject *o) { return (Scope *)o; }

/* -- Shared state ----------------------------------------------------------- */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER; /* the slot registry */
static tc_slot *g_slots;            /* every slot ever made (g_mu to add)    */
static pthread_key_t g_key;         /* its destructor is slot_release        */
static int g_key_ok;                /* GIL                                   */
static __thread tc_slot *t_slot;    /* this thread's slot, or NULL           */

static int g_signo;                 /* 0 until installed; GIL                */

/* Python objects, set by _setup() (GIL); owned by the module. */
static PyObject *g_interrupt;       /* internal BaseException subclass       */
static PyObject *g_exceeded;        /* DeadlineExceeded                      */
static PyObject *g_default_hook;    /* given to every new scope, or NULL     */
static PyObject *g_scope_type;
static PyObject *g_shield_type;

/* Counters (struct tc_stats); relaxed atomics, any thread. */
static struct {
    _Atomic uint64_t slots_live, timers_live, fires, reinjections, kicks, signals_seen,
        watchdog_wakeups, gil_takes, requeues, stale_scopes, hook_raises, hook_defers,
        hook_calls, backstops, async_fallbacks, fast_windows, fast_ns, prearms, self_fires,
        rewait_errors, gil_holds, prepared, direct_raises, pending_calls, pending_raises,
        pending_handovers, watch_sleeps, remote_cancels, remote_relays, exit_lingers, pins, rescues,
        tracer_sleeps, tracer_alarms, back_waits, exit_expiries, due_relays, dropped,
        dropped_learned, bad_moves;
} g_st;
#define STAT_INC(f) atomic_fetch_add_explicit(&g_st.f, 1, memory_order_relaxed)
#define STAT_DEC(f) atomic_fetch_sub_explicit(&g_st.f, 1, memory_order_relaxed)

/* -- Cross-part prototypes (definitions in the part named) ------------------ */

/* tc_slot.c */
static void slot_wake_and_kick(struct tc_slot *s);

/* tc_watchdog.c */
static void wd_wake(void);
static void wd_notify(struct tc_slot *s, int64_t deadline, int64_t now);
static int wd_ensure(int wait);
static int wd_running(void);

#endif /* TC_INTERNAL_H */
