/*
 * timeoutcore.c -- per-thread slots and timers, the signal handler, the
 * watchdog, and the scope/shield types whose enter/exit keep the GIL.
 * The contract (threads, GIL, async-signal-safety) is in timeoutcore.h.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <linux/futex.h>

#include "timeoutcore.h"

#define NS_PER_S 1000000000LL
#define TC_NEVER INT64_MAX

/* Kernel ABI for timer_create with SIGEV_THREAD_ID.  glibc spells the target
 * field sigev_notify_thread_id (a macro), musl differs; using the syscall with
 * the kernel's own layout works with every libc. */
#ifndef SIGEV_THREAD_ID
#define SIGEV_THREAD_ID 4
#endif
struct tc_ksigevent {
    union sigval value;
    int signo;
    int notify;
    int tid;
    int pad[11]; /* the kernel's sigevent is 64 bytes */
};

/* ------------------------------------------------------------------------ */
/* Slots                                                                    */

enum { SLOT_IDLE = 0, SLOT_ARMED = 1, SLOT_INJECTED = 2 };

typedef struct tc_slot {
    struct tc_slot *next;          /* registry list, under g_mu            */
    int alive;                     /* owned by a running thread; g_mu      */
    pid_t tid;                     /* kernel thread id                     */
    unsigned long ident;           /* threading.get_ident()                */
    int timer_ok;
    int timer_id;                  /* kernel timer id                      */
    _Atomic int64_t deadline;      /* earliest deadline on the stack, ns   */
    _Atomic uint64_t gen;          /* bumped on every change               */
    _Atomic int state;             /* SLOT_*                               */
    _Atomic int shield;            /* shield depth                         */
    _Atomic int64_t reinject_at;   /* next re-injection when INJECTED      */
    int64_t reinject_step;
    _Atomic uint32_t wake;         /* futex word for sleep()               */
    _Atomic uint64_t signals;      /* bumped by the signal handler         */
    _Atomic uint32_t raised;       /* bumped when another exception was
                                      raised in the thread (soft limit)     */
    /* GIL-protected */
    PyObject *top;                 /* innermost active scope (strong)      */
    PyObject *fired;               /* scope whose deadline fired (borrowed:
                                      it is on the stack while set)        */
} tc_slot;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static tc_slot *g_slots;                 /* every slot ever made, g_mu */
static pthread_key_t g_key;
static int g_key_ok;
static __thread tc_slot *t_slot;

static int g_signo;                      /* 0 until installed */
static atomic_int_fast64_t g_lead = 6000000; /* anticipation, ns */
static atomic_int_fast64_t g_switch = 5000000; /* switch interval, ns */

static struct {
    _Atomic uint64_t slots_live, timers_live, fires, reinjections, kicks,
        signals_seen, watchdog_wakeups, gil_takes, requeues, stale_scopes;
} g_st;
#define STAT_INC(f) atomic_fetch_add_explicit(&g_st.f, 1, memory_order_relaxed)
#define STAT_DEC(f) atomic_fetch_sub_explicit(&g_st.f, 1, memory_order_relaxed)

/* Python objects, set by _setup(); owned by the module */
static PyObject *g_interrupt;   /* internal BaseException subclass */
static PyObject *g_default_hook; /* given to every new scope, or NULL */
static PyObject *g_exceeded;    /* DeadlineExceeded */

static inline int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * NS_PER_S + ts.tv_nsec;
}

static inline struct timespec to_ts(int64_t ns)
{
    struct timespec ts;
    ts.tv_sec = (time_t)(ns / NS_PER_S);
    ts.tv_nsec = (long)(ns % NS_PER_S);
    return ts;
}

/* Wait on a futex word until woken, `abs` (CLOCK_MONOTONIC) passes or a
 * signal arrives.  Returns 0 or the errno (ETIMEDOUT, EINTR, EAGAIN). */
static int futex_wait_until(_Atomic uint32_t *w, uint32_t seen, int64_t abs)
{
    struct timespec ts, *tsp = NULL;
    if (abs != TC_NEVER) {
        ts = to_ts(abs);
        tsp = &ts;
    }
    long r = syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_BITSET | FUTEX_PRIVATE_FLAG,
                     seen, tsp, NULL, FUTEX_BITSET_MATCH_ANY);
    return r == -1 ? errno : 0;
}

static void futex_wake_all(_Atomic uint32_t *w)
{
    /* FUTEX_WAKE only fails for a bad address, which this is not. */
    (void)syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE | FUTEX_PRIVATE_FLAG, INT32_MAX,
                  NULL, NULL, 0);
}

/* ------------------------------------------------------------------------ */
/* The signal handler: async-signal-safe, tiny.                             */

static void tc_handler(int signo, siginfo_t *si, void *uc)
{
    int saved = errno;
    (void)signo;
    (void)uc;
    if (si != NULL && si->si_code == SI_TIMER && si->si_value.sival_ptr != NULL) {
        tc_slot *s = (tc_slot *)si->si_value.sival_ptr;
        atomic_fetch_add_explicit(&s->signals, 1, memory_order_relaxed);
    }
    STAT_INC(signals_seen);
    errno = saved;
}

/* Parse TIMEOUTCORE_SIGNAL: "", "SIGRTMIN+3", "RTMIN+3", "SIGRTMAX-2", "40". */
static int parse_signal(const char *s, int *out)
{
    char *end;
    long base = 0, off = 0;
    if (s == NULL || *s == '\0') {
        *out = SIGRTMIN + 3;
        return 0;
    }
    if (strncmp(s, "SIG", 3) == 0)
        s += 3;
    if (strncmp(s, "RTMIN", 5) == 0) {
        base = SIGRTMIN;
        s += 5;
    }
    else if (strncmp(s, "RTMAX", 5) == 0) {
        base = SIGRTMAX;
        s += 5;
    }
    if (base != 0 && *s == '\0') {
        *out = (int)base;
        return 0;
    }
    errno = 0;
    off = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0')
        return -1;
    if (base == 0 && (s[0] == '+' || s[0] == '-'))
        return -1;
    *out = (int)(base + off);
    return 0;
}

/* Called with the GIL, once. */
static int install_handler(void)
{
    struct sigaction old, sa;
    int signo;
    const char *env = getenv("TIMEOUTCORE_SIGNAL");

    if (g_signo != 0)
        return 0;
    if (parse_signal(env, &signo) < 0 || signo < 1 || signo >= NSIG || signo == SIGKILL ||
        signo == SIGSTOP) {
        PyErr_Format(PyExc_ValueError,
                     "TIMEOUTCORE_SIGNAL=%s is not a usable signal: give a number, or "
                     "SIGRTMIN+k / SIGRTMAX-k (default SIGRTMIN+3)",
                     env);
        return -1;
    }
    if (sigaction(signo, NULL, &old) != 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    if ((old.sa_flags & SA_SIGINFO) ? old.sa_sigaction != tc_handler
                                    : old.sa_handler != SIG_DFL) {
        PyErr_Format(PyExc_RuntimeError,
                     "timeoutcore: signal %d already has a handler installed by someone "
                     "else; it is not replaced. Choose a free signal with the environment "
                     "variable TIMEOUTCORE_SIGNAL (e.g. SIGRTMIN+5)",
                     signo);
        return -1;
    }
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = tc_handler;
    sa.sa_flags = SA_SIGINFO; /* no SA_RESTART: blocking calls must see EINTR */
    sigemptyset(&sa.sa_mask);
    if (sigaction(signo, &sa, NULL) != 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    g_signo = signo;
    return 0;
}

static int timer_make(tc_slot *s)
{
    struct tc_ksigevent ev;
    int id = -1;
    memset(&ev, 0, sizeof ev);
    ev.value.sival_ptr = s;
    ev.signo = g_signo;
    ev.notify = SIGEV_THREAD_ID;
    ev.tid = s->tid;
    if (syscall(SYS_timer_create, CLOCK_MONOTONIC, &ev, &id) != 0)
        return errno;
    s->timer_id = id;
    s->timer_ok = 1;
    STAT_INC(timers_live);
    return 0;
}

static void timer_drop(tc_slot *s)
{
    if (s->timer_ok) {
        /* Fails only for an invalid id; then there is nothing to delete. */
        if (syscall(SYS_timer_delete, s->timer_id) == 0)
            STAT_DEC(timers_live);
        s->timer_ok = 0;
    }
}

/* Send the thread-directed signal now, through the thread's own timer so the
 * handler sees si_value.  Falls back to tgkill. */
static void kick(tc_slot *s)
{
    if (s->timer_ok) {
        struct itimerspec its;
        memset(&its, 0, sizeof its);
        its.it_value.tv_nsec = 1;
        if (syscall(SYS_timer_settime, s->timer_id, 0, &its, NULL) == 0) {
            STAT_INC(kicks);
            return;
        }
    }
    if (syscall(SYS_tgkill, getpid(), s->tid, g_signo) == 0)
        STAT_INC(kicks);
}

/* pthread key destructor: the owning thread is exiting.  No GIL here. */
static void slot_release(void *p)
{
    tc_slot *s = (tc_slot *)p;
    if (s == NULL)
        return;
    pthread_mutex_lock(&g_mu);
    timer_drop(s);
    atomic_store(&s->deadline, TC_NEVER);
    atomic_store(&s->state, SLOT_IDLE);
    atomic_fetch_add(&s->gen, 1);
    if (s->alive) {
        s->alive = 0;
        STAT_DEC(slots_live);
    }
    pthread_mutex_unlock(&g_mu);
    /* Python objects still on a stack whose exits never ran (see the 3.13.0
     * note in scope_enter) are released when the slot is reused, with the
     * GIL. */
}

static void stack_clear(tc_slot *s);

/* The calling thread's slot, created on first use.  GIL held. */
static tc_slot *slot_get(void)
{
    tc_slot *s = t_slot;
    int err;
    if (s != NULL)
        return s;
    if (install_handler() < 0)
        return NULL;
    pthread_mutex_lock(&g_mu);
    for (s = g_slots; s != NULL; s = s->next)
        if (!s->alive)
            break;
    if (s == NULL) {
        s = (tc_slot *)calloc(1, sizeof *s);
        if (s == NULL) {
            pthread_mutex_unlock(&g_mu);
            PyErr_NoMemory();
            return NULL;
        }
        atomic_store(&s->deadline, TC_NEVER);
        s->next = g_slots;
        g_slots = s;
    }
    s->alive = 1;
    s->tid = (pid_t)syscall(SYS_gettid);
    s->ident = PyThread_get_thread_ident();
    atomic_store(&s->state, SLOT_IDLE);
    atomic_store(&s->deadline, TC_NEVER);
    atomic_store(&s->shield, 0);
    atomic_fetch_add(&s->gen, 1);
    STAT_INC(slots_live);
    err = timer_make(s);
    if (err != 0) {
        s->alive = 0;
        STAT_DEC(slots_live);
        pthread_mutex_unlock(&g_mu);
        errno = err;
        PyErr_Format(PyExc_OSError,
                     "timeoutcore: timer_create failed for this thread: %s%s", strerror(err),
                     err == EAGAIN ? " (too many timers: RLIMIT_SIGPENDING reached)" : "");
        /* an OSError with errno set, for callers that look */
        {
            PyObject *et, *ev, *tb;
            PyErr_Fetch(&et, &ev, &tb);
            Py_XDECREF(et);
            Py_XDECREF(ev);
            Py_XDECREF(tb);
            PyObject *msg = PyUnicode_FromFormat(
                "timeoutcore: timer_create failed for this thread: %s%s", strerror(err),
                err == EAGAIN ? " (too many timers: RLIMIT_SIGPENDING reached)" : "");
            if (msg != NULL) {
                PyObject *exc = PyObject_CallFunction(PyExc_OSError, "iO", err, msg);
                Py_DECREF(msg);
                if (exc != NULL) {
                    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
                    Py_DECREF(exc);
                }
            }
        }
        return NULL;
    }
    pthread_mutex_unlock(&g_mu);
    stack_clear(s); /* leftovers of a previous owner, if any */
    if (pthread_setspecific(g_key, s) != 0) {
        PyErr_SetString(PyExc_RuntimeError, "timeoutcore: pthread_setspecific failed");
        slot_release(s);
        return NULL;
    }
    t_slot = s;
    return s;
}

/* ------------------------------------------------------------------------ */
/* The watchdog                                                             */

static pthread_t g_wd;
static int g_wd_running;                 /* GIL-protected               */
static _Atomic int g_wd_stop;
static _Atomic uint32_t g_wd_seq;        /* futex word to wake it       */
static _Atomic int64_t g_wd_planned = 0; /* when it means to wake next  */
static _Atomic int g_wd_tid;             /* its kernel thread id        */

static void wd_wake(void)
{
    atomic_fetch_add(&g_wd_seq, 1);
    futex_wake_all(&g_wd_seq);
}

/* Tell the watchdog about a slot whose deadline may have moved earlier. */
static inline void wd_notify(int64_t deadline)
{
    if (deadline != TC_NEVER && deadline - atomic_load(&g_lead) < atomic_load(&g_wd_planned))
        wd_wake();
}

/* CPython 3.13 can leave a frame without running its with-exits when an
 * exception is raised at the back-edge of a `while <cond>:` loop
 * (cpython#130279).  There, each scope remembers the frame of its with
 * statement, so that a scope whose frame is no longer running can be found
 * and dropped instead of firing into unrelated code. */
#if PY_VERSION_HEX >= 0x030D0000 && PY_VERSION_HEX < 0x030E0000
#define TC_TRACK_FRAMES 1
#else
#define TC_TRACK_FRAMES 0
#endif

typedef struct Scope Scope;
struct Scope {
    PyObject_HEAD
    PyObject *label;
    PyObject *parent;      /* enclosing scope on this thread while active */
    tc_slot *slot;
    double seconds;        /* relative limit; NAN for absolute/none */
    int64_t deadline;      /* own absolute deadline (ns) or TC_NEVER */
    int64_t entered;       /* ns */
    int64_t exited;        /* ns, 0 while active */
    int64_t fired_at;      /* ns when the interrupt was raised, 0 if never */
    int state;             /* SCOPE_NEW / SCOPE_ACTIVE / SCOPE_DONE */
    int raise_on_timeout;
    int expired;           /* this scope's deadline fired */
    int has_deadline_arg;  /* deadline given at construction (absolute) */
    int soft_pending;      /* _raise_in_scope() raised into this block */
    pid_t native_id;       /* kernel thread id of the thread that entered it */
    PyObject *hook;        /* hook(scope, "enter"|"exit", exc) or NULL */
    PyObject *exit_exc;    /* the exception the block ended with, or NULL */
    unsigned long ident;   /* thread that entered it */
#if TC_TRACK_FRAMES
    PyObject *frame;       /* frame of the with statement, while active */
#endif
};
enum { SCOPE_NEW = 0, SCOPE_ACTIVE = 1, SCOPE_DONE = 2 };

static inline Scope *as_scope(PyObject *o) { return (Scope *)o; }

/* Earliest own deadline on the stack.  GIL held. */
static int64_t stack_min(PyObject *top)
{
    int64_t m = TC_NEVER;
    for (PyObject *p = top; p != NULL; p = as_scope(p)->parent)
        if (as_scope(p)->deadline < m)
            m = as_scope(p)->deadline;
    return m;
}

/* Outermost scope whose own deadline has passed at `now`.  GIL held. */
static PyObject *stack_due(PyObject *top, int64_t now)
{
    PyObject *due = NULL;
    for (PyObject *p = top; p != NULL; p = as_scope(p)->parent)
        if (as_scope(p)->deadline <= now)
            due = p;
    return due;
}

/* Publish the slot's effective deadline after any change to its stack. */
static void slot_publish(tc_slot *s)
{
    int64_t d = stack_min(s->top);
    atomic_store(&s->deadline, d);
    if (atomic_load(&s->state) != SLOT_INJECTED)
        atomic_store(&s->state, d == TC_NEVER ? SLOT_IDLE : SLOT_ARMED);
    atomic_fetch_add(&s->gen, 1);
    wd_notify(d);
}

/* Raise the interrupt synchronously in the owner thread (GIL held), taking
 * back any copy the watchdog left pending: a pending one would be raised
 * again at the next instruction -- on 3.9/3.10 possibly the first one of a
 * with-handler, skipping that __exit__. */
static PyObject *raise_here(tc_slot *s)
{
    if (atomic_load(&s->state) == SLOT_INJECTED)
        PyThreadState_SetAsyncExc(s->ident, NULL);
    PyErr_SetNone(g_interrupt);
    return NULL;
}

/* Mark the outermost due scope as fired and raise the interrupt in the
 * slot's thread.  GIL held.  `local`: we are that thread, set the error
 * directly (caller returns NULL); else inject asynchronously and kick. */
#if PY_VERSION_HEX < 0x030A0000
static PyThreadState *find_tstate(unsigned long ident);
static int in_with_exit_gap(PyThreadState *t);
#endif

static int fire(tc_slot *s, int64_t now, int local)
{
    PyObject *due = stack_due(s->top, now);
    if (due == NULL || atomic_load(&s->shield) > 0)
        return 0;
#if PY_VERSION_HEX < 0x030A0000
    if (!local) {
        PyThreadState *t = find_tstate(s->ident);
        if (t != NULL && in_with_exit_gap(t)) {
            STAT_INC(requeues);
            return 0; /* still ARMED and due: the watchdog comes straight back */
        }
    }
#endif
    if (s->fired == NULL) {
        s->fired = due;
        as_scope(due)->expired = 1;
        as_scope(due)->fired_at = now;
    }
    atomic_store(&s->state, SLOT_INJECTED);
    s->reinject_step = 2000000; /* 2 ms, doubling to 100 ms */
    atomic_store(&s->reinject_at, now + s->reinject_step);
    STAT_INC(fires);
    if (local) {
        raise_here(s);
        return 1;
    }
    PyThreadState_SetAsyncExc(s->ident, g_interrupt);
    atomic_fetch_add(&s->wake, 1);
    futex_wake_all(&s->wake);
    kick(s);
    return 1;
}

/* The thread state of `ident`, or NULL.  GIL held (thread states are only
 * unlinked by threads holding the GIL). */
static PyThreadState *find_tstate(unsigned long ident)
{
    PyThreadState *me = PyThreadState_Get();
    PyInterpreterState *interp = PyThreadState_GetInterpreter(me);
    for (PyThreadState *t = PyInterpreterState_ThreadHead(interp); t != NULL;
         t = PyThreadState_Next(t))
        if (t->thread_id == ident)
            return t;
    return NULL;
}

#if PY_VERSION_HEX < 0x030C0000
static int is_interrupt_type(PyObject *t)
{
    return t != NULL && t != Py_None && PyType_Check(t) &&
           PyType_IsSubtype((PyTypeObject *)t, (PyTypeObject *)g_interrupt);
}
#endif

static int is_interrupt_value(PyObject *v)
{
    return v != NULL && v != Py_None && PyObject_TypeCheck(v, (PyTypeObject *)g_interrupt);
}

/* Is our interrupt being raised, or handled (except/finally/__exit__), in
 * that thread right now?  Then it has not been swallowed and must not be
 * raised again: on 3.9/3.10 a second one landing on the first instruction of
 * a with-handler would skip that __exit__.  GIL held; reads the target's
 * thread state, which cannot change while we hold the GIL. */
static int interrupt_in_flight(PyThreadState *t)
{
#if PY_VERSION_HEX >= 0x030C0000
    if (is_interrupt_value(t->current_exception))
        return 1;
#else
    if (is_interrupt_type(t->curexc_type))
        return 1;
#endif
    for (_PyErr_StackItem *it = t->exc_info; it != NULL; it = it->previous_item) {
#if PY_VERSION_HEX < 0x030B0000
        if (is_interrupt_type(it->exc_type))
            return 1;
#endif
        if (is_interrupt_value(it->exc_value))
            return 1;
    }
    return 0;
}

#if PY_VERSION_HEX < 0x030A0000
#include "frameobject.h"
#include "opcode.h"
/* CPython 3.9 checks the eval breaker right after POP_BLOCK of a with
 * statement's normal exit, before it calls __exit__: an asynchronous
 * exception raised there leaves the block without its __exit__.  A thread
 * parked at that check has f_lasti on the POP_BLOCK and the exit call
 * sequence next.  The watchdog (holding the GIL) does not inject into that
 * state; it tries again a moment later, once the exit has run. */
static int in_with_exit_gap(PyThreadState *t)
{
    PyFrameObject *f = t->frame;
    if (f == NULL || f->f_lasti < 0)
        return 0;
    PyObject *code = f->f_code->co_code;
    Py_ssize_t n = PyBytes_GET_SIZE(code), i = f->f_lasti;
    const unsigned char *c = (const unsigned char *)PyBytes_AS_STRING(code);
    return i + 9 < n && c[i] == POP_BLOCK && c[i + 2] == LOAD_CONST && c[i + 4] == DUP_TOP &&
           c[i + 6] == DUP_TOP && c[i + 8] == CALL_FUNCTION && c[i + 9] == 3;
}
#endif

static void reinject(tc_slot *s, int64_t now)
{
    PyThreadState *t;
    if (atomic_load(&s->shield) > 0 || s->fired == NULL)
        return;
    if (s->reinject_step < 100000000)
        s->reinject_step *= 2;
    atomic_store(&s->reinject_at, now + s->reinject_step);
    t = find_tstate(s->ident);
    if (t == NULL || interrupt_in_flight(t))
        return;
#if PY_VERSION_HEX < 0x030A0000
    if (in_with_exit_gap(t)) {
        atomic_store(&s->reinject_at, now + 50000);
        return;
    }
#endif
    PyThreadState_SetAsyncExc(s->ident, g_interrupt);
    STAT_INC(reinjections);
    atomic_fetch_add(&s->wake, 1);
    futex_wake_all(&s->wake);
    kick(s);
}

typedef struct {
    tc_slot *slot;
    uint64_t gen;
    int64_t at;        /* when to act */
    int64_t deadline;  /* the deadline behind it (armed) */
} wd_event;

/* Earliest thing to do.  Holds g_mu briefly, never the GIL. */
static wd_event wd_plan(void)
{
    wd_event ev = {NULL, 0, TC_NEVER, TC_NEVER};
    int64_t lead = atomic_load(&g_lead);
    pthread_mutex_lock(&g_mu);
    for (tc_slot *s = g_slots; s != NULL; s = s->next) {
        int st;
        int64_t at, d;
        if (!s->alive || atomic_load(&s->shield) > 0)
            continue;
        uint64_t gen = atomic_load(&s->gen);
        st = atomic_load(&s->state);
        d = atomic_load(&s->deadline);
        if (st == SLOT_ARMED && d != TC_NEVER)
            at = d - lead;
        else if (st == SLOT_INJECTED)
            at = atomic_load(&s->reinject_at);
        else
            continue;
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
static int prune_stale(tc_slot *s, PyFrameObject *cur);

/* Before acting on due slots: drop scopes whose frame is gone (3.13).  Done
 * without g_mu: dropping a scope may run arbitrary finalizers. */
static void wd_prune(int64_t now)
{
    tc_slot *due[64];
    int n = 0;
    pthread_mutex_lock(&g_mu);
    for (tc_slot *s = g_slots; s != NULL && n < 64; s = s->next) {
        int st = atomic_load(&s->state);
        if (s->alive && ((st == SLOT_ARMED && atomic_load(&s->deadline) <= now) ||
                         (st == SLOT_INJECTED && atomic_load(&s->reinject_at) <= now)))
            due[n++] = s;
    }
    pthread_mutex_unlock(&g_mu);
    for (int i = 0; i < n; i++) {
        PyThreadState *t = find_tstate(due[i]->ident);
        if (t != NULL && prune_stale(due[i], PyThreadState_GetFrame(t)))
            slot_publish(due[i]);
    }
}
#endif

/* With the GIL: handle every slot that is due now. */
static void wd_sweep(int64_t now)
{
#if TC_TRACK_FRAMES
    wd_prune(now);
#endif
    pthread_mutex_lock(&g_mu);
    for (tc_slot *s = g_slots; s != NULL; s = s->next) {
        if (!s->alive)
            continue;
        int st = atomic_load(&s->state);
        if (st == SLOT_ARMED && atomic_load(&s->deadline) <= now)
            fire(s, now, 0);
        else if (st == SLOT_INJECTED && atomic_load(&s->reinject_at) <= now)
            reinject(s, now);
    }
    pthread_mutex_unlock(&g_mu);
}

static void sleep_until(int64_t t)
{
    struct timespec ts = to_ts(t);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

static void refresh_switch_interval(void)
{
    /* With the GIL.  Keeps the lead one switch interval + 1 ms. */
    PyObject *r = PyObject_CallMethod(PySys_GetObject("modules") ?
                                          PyDict_GetItemString(PySys_GetObject("modules"), "sys") :
                                          NULL,
                                      "getswitchinterval", NULL);
    if (r == NULL) {
        PyErr_Clear();
        return;
    }
    double v = PyFloat_AsDouble(r);
    Py_DECREF(r);
    if (v > 0 && v < 10.0) {
        int64_t sw = (int64_t)(v * 1e9);
#if TC_LOWER_SWITCH
        if (sw > (int64_t)TC_FAST_SWITCH_US * 1000)
            sw = (int64_t)TC_FAST_SWITCH_US * 1000; /* what gil_take() waits */
        atomic_store(&g_lead, sw + 300000);
#else
        atomic_store(&g_lead, sw + 1000000);
#endif
        atomic_store(&g_switch, sw);
    }
}

/* On 3.9-3.11 the switch interval is global runtime state, settable without
 * a thread state: the watchdog lowers it to TC_FAST_SWITCH_US while it waits
 * for the GIL, so the holder is asked to drop the GIL after 200 us instead of
 * 5 ms and other CPU-bound threads cannot keep it queued for whole turns (the
 * contention case: p50 tens of ms -> a few ms).  The user's value is put back
 * as soon as the watchdog holds the GIL, unless they changed it meanwhile.
 * From 3.12 the interval lives in the interpreter and needs a thread state,
 * so there the user's own sys.setswitchinterval() is the knob. */
#define TC_FAST_SWITCH_US 200UL
#if PY_VERSION_HEX < 0x030C0000
#define TC_LOWER_SWITCH 1
#else
#define TC_LOWER_SWITCH 0
#endif

static void gil_take(PyThreadState *ts)
{
#if TC_LOWER_SWITCH
    unsigned long saved = _PyEval_GetSwitchInterval();
    int lowered = saved > TC_FAST_SWITCH_US;
    if (lowered)
        _PyEval_SetSwitchInterval(TC_FAST_SWITCH_US);
    PyEval_RestoreThread(ts);
    if (lowered && _PyEval_GetSwitchInterval() == TC_FAST_SWITCH_US)
        _PyEval_SetSwitchInterval(saved);
#else
    PyEval_RestoreThread(ts);
#endif
    STAT_INC(gil_takes);
}

static void *wd_main(void *arg)
{
    (void)arg;
    PyGILState_STATE gs;
    PyThreadState *ts;

    (void)prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0); /* precise wake-ups */
    atomic_store(&g_wd_tid, (int)syscall(SYS_gettid));
    gs = PyGILState_Ensure();
    ts = PyEval_SaveThread();

    for (;;) {
        if (atomic_load(&g_wd_stop)) {
            PyEval_RestoreThread(ts);
            break;
        }
        uint32_t seen = atomic_load(&g_wd_seq);
        wd_event ev = wd_plan();
        atomic_store(&g_wd_planned, ev.at);
        /* Dekker with wd_notify: a deadline stored before our store above
         * is seen by this second look; one stored after sees our plan. */
        wd_event ev2 = wd_plan();
        if (ev2.at < ev.at) {
            ev = ev2;
            atomic_store(&g_wd_planned, ev.at);
        }
        int64_t t0 = now_ns();
        if (ev.at > t0) {
            STAT_INC(watchdog_wakeups);
            futex_wait_until(&g_wd_seq, seen, ev.at);
            continue;
        }
        if (atomic_load(&ev.slot->gen) != ev.gen)
            continue; /* it changed while we looked: plan again */

        gil_take(ts);
        if (atomic_load(&g_wd_stop))
            break;
        int64_t t1 = now_ns();
        if (ev.deadline != TC_NEVER && ev.deadline > t1 &&
            atomic_load(&ev.slot->gen) == ev.gen) {
            int64_t sw = atomic_load(&g_switch);
            if (t1 - t0 < sw / 2 && ev.deadline - t1 > 300000) {
                /* The GIL came easily: the body releases it often (I/O).
                 * Holding it for the rest of the lead would stall the body;
                 * give it back and come again just before the deadline. */
                STAT_INC(requeues);
                ts = PyEval_SaveThread();
                sleep_until(ev.deadline - 200000);
                gil_take(ts);
                if (atomic_load(&g_wd_stop))
                    break;
            }
            /* Hold the GIL up to the deadline: the body cannot run now, so
             * the interrupt lands when it resumes. */
            if (atomic_load(&ev.slot->gen) == ev.gen)
                sleep_until(ev.deadline);
        }
        wd_sweep(now_ns());
        refresh_switch_interval();
        ts = PyEval_SaveThread();
    }
    /* Here we hold the GIL: release the thread state made above with it. */
    PyGILState_Release(gs);
    return NULL;
}

/* Start the watchdog if it is not running.  GIL held. */
static int wd_ensure(void)
{
    sigset_t all, old;
    int err;
    if (g_wd_running)
        return 0;
    refresh_switch_interval();
    atomic_store(&g_wd_stop, 0);
    atomic_store(&g_wd_planned, 0);
    sigfillset(&all);
    if ((err = pthread_sigmask(SIG_SETMASK, &all, &old)) != 0) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    err = pthread_create(&g_wd, NULL, wd_main, NULL);
    (void)pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err != 0) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    g_wd_running = 1;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Stack maintenance                                                        */

/* Drop every scope on the slot's stack (a previous owner's leftovers or a
 * stale stack).  GIL held. */
static void stack_clear(tc_slot *s)
{
    PyObject *p = s->top;
    s->top = NULL;
    s->fired = NULL;
    while (p != NULL) {
        Scope *sc = as_scope(p);
        PyObject *parent = sc->parent;
        sc->parent = NULL;
        sc->state = SCOPE_DONE;
        sc->slot = NULL;
#if TC_TRACK_FRAMES
        Py_CLEAR(sc->frame);
#endif
        Py_DECREF(p);
        p = parent;
    }
}

/* Pop scopes above `target` whose __exit__ never ran (CPython 3.13.0 can skip
 * with-exits when an exception is raised at a loop back-edge,
 * cpython#130279).  Returns the number popped.  GIL held. */
static int pop_stale_above(tc_slot *s, PyObject *target)
{
    int n = 0;
    while (s->top != NULL && s->top != target) {
        PyObject *p = s->top;
        Scope *sc = as_scope(p);
        s->top = sc->parent;
        sc->parent = NULL;
        sc->state = SCOPE_DONE;
        sc->exited = now_ns();
#if TC_TRACK_FRAMES
        Py_CLEAR(sc->frame);
#endif
        if (s->fired == p)
            s->fired = NULL;
        Py_DECREF(p);
        STAT_INC(stale_scopes);
        n++;
    }
    return n;
}

#if TC_TRACK_FRAMES
/* Is `frame` on the stack that starts at `cur` (a new reference, consumed)? */
static int frame_running(PyObject *frame, PyFrameObject *cur)
{
    while (cur != NULL) {
        PyFrameObject *back;
        if ((PyObject *)cur == frame) {
            Py_DECREF(cur);
            return 1;
        }
        back = PyFrame_GetBack(cur);
        Py_DECREF(cur);
        cur = back;
    }
    return 0;
}

/* Drop the scopes whose with statement's frame is no longer running in the
 * thread whose innermost frame is `cur` (new reference, consumed): the
 * outermost such scope and everything above it.  GIL held.  Returns 1 if
 * anything was dropped. */
static int prune_stale(tc_slot *s, PyFrameObject *cur)
{
    PyObject *stale = NULL;
    for (PyObject *p = s->top; p != NULL; p = as_scope(p)->parent) {
        PyObject *f = as_scope(p)->frame;
        Py_XINCREF(cur);
        if (f != NULL && !frame_running(f, cur))
            stale = p; /* keep going: the outermost one counts */
    }
    Py_XDECREF(cur);
    if (stale == NULL)
        return 0;
    pop_stale_above(s, stale);           /* everything above it */
    s->top = as_scope(stale)->parent;    /* and the stale scope itself: its */
    as_scope(stale)->parent = NULL;      /* reference moves to the slot    */
    as_scope(stale)->state = SCOPE_DONE;
    Py_CLEAR(as_scope(stale)->frame);
    as_scope(stale)->slot = NULL;
    if (s->fired == stale)
        s->fired = NULL;
    Py_DECREF(stale);
    STAT_INC(stale_scopes);
    if (s->fired == NULL && atomic_load(&s->state) == SLOT_INJECTED) {
        PyThreadState_SetAsyncExc(s->ident, NULL);
        atomic_store(&s->state, SLOT_IDLE);
    }
    return 1;
}
#endif

/* Clear a pending interrupt that we raised and nobody consumed yet. */
static void clear_injected(tc_slot *s)
{
    s->fired = NULL;
    atomic_store(&s->state, SLOT_IDLE);
    PyThreadState_SetAsyncExc(s->ident, NULL);
}

/* ------------------------------------------------------------------------ */
/* Scope type                                                               */

static PyObject *g_scope_type;
static PyObject *g_shield_type;

/* Parse a positive finite number of seconds; NULL/None -> NAN.  Names the
 * argument in the error. */
static int parse_seconds(PyObject *o, const char *fn, const char *arg, double *out,
                         int allow_zero)
{
    double v;
    if (o == NULL || o == Py_None) {
        *out = NAN;
        return 0;
    }
    if (PyBool_Check(o) || !(PyFloat_Check(o) || PyLong_Check(o))) {
        PyErr_Format(PyExc_TypeError,
                     "%s: %s must be a number of seconds (int or float) or None, not %.100s",
                     fn, arg, Py_TYPE(o)->tp_name);
        return -1;
    }
    v = PyFloat_AsDouble(o);
    if (v == -1.0 && PyErr_Occurred())
        return -1;
    if (!isfinite(v) || v < 0 || (!allow_zero && v == 0)) {
        PyErr_Format(PyExc_ValueError, "%s: %s must be a %s finite number of seconds, got %R",
                     fn, arg, allow_zero ? "non-negative" : "positive", o);
        return -1;
    }
    if (v > 3.0e8) {
        PyErr_Format(PyExc_ValueError, "%s: %s is too large (%R s; at most 3e8)", fn, arg, o);
        return -1;
    }
    *out = v;
    return 0;
}

/* Absolute time.monotonic() value -> ns. */
static int parse_when(PyObject *o, const char *fn, int64_t *out)
{
    double v;
    if (PyBool_Check(o) || !(PyFloat_Check(o) || PyLong_Check(o))) {
        PyErr_Format(PyExc_TypeError,
                     "%s: when must be a time.monotonic() value (int or float), not %.100s", fn,
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    v = PyFloat_AsDouble(o);
    if (v == -1.0 && PyErr_Occurred())
        return -1;
    if (!isfinite(v) || v < 0 || v > 9.0e9) {
        PyErr_Format(PyExc_ValueError, "%s: when must be a finite time.monotonic() value, got %R",
                     fn, o);
        return -1;
    }
    *out = (int64_t)llround(v * 1e9);
    return 0;
}

static int Scope_init(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"seconds", "label", "raise_on_timeout", "deadline", NULL};
    PyObject *seconds = Py_None, *label = Py_None, *deadline = Py_None;
    int raise_on_timeout = 1;
    Scope *sc = as_scope(self);
    double v;

    PyObject *known = kw, *extras = NULL;
    int r;

    if (sc->state != SCOPE_NEW || sc->entered != 0) {
        PyErr_SetString(PyExc_RuntimeError, "a deadline scope cannot be re-initialised");
        return -1;
    }
    if (kw != NULL && PyDict_GET_SIZE(kw) > 0) {
        /* Keywords this type does not know (soft=..., on_soft=...) go to the
         * Python subclass's _init_extras(); the plain path stays in C. */
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        while (PyDict_Next(kw, &pos, &key, &value)) {
            int is_known = 0;
            for (char **k = kwlist; *k != NULL; k++)
                if (PyUnicode_CompareWithASCIIString(key, *k) == 0)
                    is_known = 1;
            if (is_known)
                continue;
            if (extras == NULL) {
                if ((extras = PyDict_New()) == NULL || (known = PyDict_Copy(kw)) == NULL)
                    goto fail;
            }
            if (PyDict_SetItem(extras, key, value) < 0 || PyDict_DelItem(known, key) < 0)
                goto fail;
        }
    }
    r = PyArg_ParseTupleAndKeywords(args, known, "|O$OpO:thread_deadline", kwlist, &seconds,
                                    &label, &raise_on_timeout, &deadline);
    if (known != kw)
        Py_DECREF(known);
    known = kw;
    if (!r)
        goto fail;
    if (parse_seconds(seconds, "thread_deadline()", "seconds", &v, 0) < 0)
        goto fail;
    if (label != Py_None && !PyUnicode_Check(label)) {
        PyErr_Format(PyExc_TypeError, "thread_deadline(): label must be a str or None, not %.100s",
                     Py_TYPE(label)->tp_name);
        goto fail;
    }
    sc->seconds = v;
    sc->deadline = TC_NEVER;
    sc->has_deadline_arg = 0;
    if (deadline != Py_None) {
        if (!isnan(v)) {
            PyErr_SetString(PyExc_TypeError,
                            "thread_deadline(): give either seconds or deadline, not both");
            goto fail;
        }
        if (parse_when(deadline, "thread_deadline_at()", &sc->deadline) < 0)
            goto fail;
        sc->has_deadline_arg = 1;
    }
    sc->raise_on_timeout = raise_on_timeout;
    Py_INCREF(label);
    Py_XSETREF(sc->label, label);
    Py_XINCREF(g_default_hook);
    Py_XSETREF(sc->hook, g_default_hook);
    if (extras != NULL) {
        PyObject *res = PyObject_CallMethod(self, "_init_extras", "O", extras);
        Py_DECREF(extras);
        if (res == NULL)
            return -1;
        Py_DECREF(res);
    }
    return 0;
fail:
    if (known != kw)
        Py_DECREF(known);
    Py_XDECREF(extras);
    return -1;
}

static int Scope_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(as_scope(self)->label);
    Py_VISIT(as_scope(self)->parent);
    Py_VISIT(as_scope(self)->hook);
    Py_VISIT(as_scope(self)->exit_exc);
#if TC_TRACK_FRAMES
    Py_VISIT(as_scope(self)->frame);
#endif
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static int Scope_clear(PyObject *self)
{
    Py_CLEAR(as_scope(self)->label);
    Py_CLEAR(as_scope(self)->parent);
    Py_CLEAR(as_scope(self)->hook);
    Py_CLEAR(as_scope(self)->exit_exc);
#if TC_TRACK_FRAMES
    Py_CLEAR(as_scope(self)->frame);
#endif
    return 0;
}

static void Scope_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    Scope_clear(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyObject *Scope_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *self = PyType_GenericNew(type, args, kw);
    if (self != NULL) {
        Scope *sc = as_scope(self);
        sc->seconds = NAN;
        sc->deadline = TC_NEVER;
        sc->raise_on_timeout = 1;
        Py_INCREF(Py_None);
        sc->label = Py_None;
    }
    return self;
}

static PyObject *Scope_enter(PyObject *self, PyObject *unused)
{
    Scope *sc = as_scope(self);
    tc_slot *s;
    int64_t now;
    (void)unused;

    if (sc->state != SCOPE_NEW) {
        PyErr_SetString(PyExc_RuntimeError,
                        sc->state == SCOPE_ACTIVE
                            ? "this deadline scope is already active; scopes are not re-entrant"
                            : "this deadline scope was already used; scopes are not reusable "
                              "(create a new one, or use it as a decorator)");
        return NULL;
    }
    s = t_slot;
    if (s == NULL && (s = slot_get()) == NULL)
        return NULL;
#if TC_TRACK_FRAMES
    {
        PyFrameObject *f = PyEval_GetFrame();
        if (s->top != NULL) {
            Py_XINCREF(f);
            if (prune_stale(s, f))
                slot_publish(s);
        }
        Py_XINCREF(f);
        Py_XSETREF(sc->frame, (PyObject *)f);
    }
#endif
    if (s->top != NULL && atomic_load(&s->state) == SLOT_INJECTED && s->fired != NULL &&
        PyErr_Occurred() == NULL) {
        /* An enclosing scope has fired and the body carried on (it swallowed
         * the interrupt).  Nothing new may start inside it: raise again. */
        return raise_here(s);
    }
    if (sc->hook != NULL) {
        /* Before anything is armed: if the hook fails, nothing is left. */
        PyObject *r = PyObject_CallFunction(sc->hook, "OsO", self, "enter", Py_None);
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
    }
    now = now_ns();
    if (!sc->has_deadline_arg)
        sc->deadline = isnan(sc->seconds) ? TC_NEVER : now + (int64_t)(sc->seconds * 1e9);
    if (!g_wd_running && sc->deadline != TC_NEVER && wd_ensure() < 0)
        return NULL;
    sc->entered = now;
    sc->state = SCOPE_ACTIVE;
    sc->slot = s;
    sc->ident = s->ident;
    sc->native_id = s->tid;
    Py_XSETREF(sc->parent, s->top); /* steals the slot's reference */
    Py_INCREF(self);
    s->top = self;
    if (sc->deadline <= now && atomic_load(&s->shield) == 0) {
        /* Already past: the watchdog fires at once (raising here would
         * escape: the with statement has not started its block yet). */
        slot_publish(s);
    }
    else if (sc->deadline < atomic_load(&s->deadline) || s->top == self) {
        atomic_store(&s->deadline, sc->deadline < atomic_load(&s->deadline)
                                       ? sc->deadline
                                       : atomic_load(&s->deadline));
        if (atomic_load(&s->state) != SLOT_INJECTED)
            atomic_store(&s->state,
                         atomic_load(&s->deadline) == TC_NEVER ? SLOT_IDLE : SLOT_ARMED);
        atomic_fetch_add(&s->gen, 1);
        wd_notify(sc->deadline);
    }
    Py_INCREF(self);
    return self;
}

/* Build DeadlineExceeded for `self` and set it as the current error. */
static void raise_exceeded(PyObject *self, int interrupt_was_in_flight)
{
    PyObject *exc = PyObject_CallFunctionObjArgs(g_exceeded, self, NULL);
    if (exc == NULL)
        return;
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc); /* a subclass when cancelled */
    if (interrupt_was_in_flight) {
        /* "raise DeadlineExceeded from None": the internal interrupt is noise. */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        PyErr_NormalizeException(&et, &ev, &tb);
        if (ev != NULL)
            PyException_SetCause(ev, NULL);
        PyErr_Restore(et, ev, tb);
    }
    Py_DECREF(exc);
}

/* Call the scope's hook at exit, shielded: the block is over, no deadline
 * interrupt may land in the hook.  A failing hook is reported as unraisable.
 * Returns 1 if an enclosing scope's interrupt was held back meanwhile. */
static int run_exit_hook(tc_slot *s, PyObject *self, PyObject *exc)
{
    PyObject *hook = as_scope(self)->hook, *r, *et, *ev, *tb;
    int held;
    atomic_fetch_add(&s->shield, 1);
    if (s->fired != NULL && atomic_load(&s->state) == SLOT_INJECTED)
        PyThreadState_SetAsyncExc(s->ident, NULL);
    PyErr_Fetch(&et, &ev, &tb);
    Py_INCREF(hook);
    r = PyObject_CallFunction(hook, "OsO", self, "exit", exc);
    if (r == NULL)
        PyErr_WriteUnraisable(hook);
    Py_XDECREF(r);
    Py_DECREF(hook);
    PyErr_Restore(et, ev, tb);
    atomic_fetch_sub(&s->shield, 1);
    atomic_fetch_add(&s->gen, 1);
    held = s->fired != NULL || (s->top != NULL && stack_due(s->top, now_ns()) != NULL);
    if (!held)
        wd_notify(atomic_load(&s->deadline));
    return held;
}

static PyObject *Scope_exit(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Scope *sc = as_scope(self);
    tc_slot *s = t_slot;
    PyObject *exc_type = nargs > 0 ? args[0] : Py_None;
    int claimed = 0, in_flight;
    int64_t now;

    if (sc->state != SCOPE_ACTIVE) {
        PyErr_SetString(PyExc_RuntimeError, "__exit__ of a deadline scope that is not active");
        return NULL;
    }
    if (s == NULL || sc->slot != s) {
        PyErr_SetString(PyExc_RuntimeError,
                        "a deadline scope must be exited in the thread that entered it");
        return NULL;
    }
    /* From here to the end no bytecode runs and the GIL is never released:
     * the interrupt cannot land after this point. */
    now = now_ns();
    pop_stale_above(s, self);
    s->top = sc->parent; /* the slot's reference moves to the parent */
    sc->parent = NULL;
    sc->state = SCOPE_DONE;
    sc->exited = now;
    sc->slot = NULL;
#if TC_TRACK_FRAMES
    Py_CLEAR(sc->frame); /* no finalizer can run: the with statement holds it */
#endif
    if (s->fired == self) {
        claimed = 1;
        clear_injected(s);
    }
    else if (atomic_load(&s->state) == SLOT_INJECTED && s->fired == NULL) {
        atomic_store(&s->state, SLOT_IDLE); /* a shielded or stale leftover */
    }
    if (sc->soft_pending) {
        /* A soft-limit exception raised into the block and not delivered
         * must not land after it.  (A pending interrupt of an enclosing scope
         * cleared with it is raised again by the watchdog.) */
        sc->soft_pending = 0;
        PyThreadState_SetAsyncExc(s->ident, NULL);
    }
    slot_publish(s);
    if (nargs > 1 && args[1] != Py_None) {
        Py_INCREF(args[1]);
        Py_XSETREF(sc->exit_exc, args[1]);
    }
    in_flight = exc_type != Py_None && PyType_Check(exc_type) &&
                PyObject_IsSubclass(exc_type, g_interrupt) == 1;
    if (sc->hook != NULL && run_exit_hook(s, self, nargs > 1 ? args[1] : Py_None)) {
        /* an enclosing deadline passed while the hook ran (shielded): deliver it
         * now, and make it fire first if the watchdog held off, so that the
         * enclosing scope claims its interrupt at its own exit */
        Py_DECREF(self);
        if (s->fired == NULL)
            fire(s, now_ns(), 1);
        else
            raise_here(s);
        return NULL;
    }
    if (!claimed && s->top != NULL && stack_due(s->top, now) != NULL && s->fired == NULL &&
        atomic_load(&s->shield) == 0) {
        /* An enclosing deadline passed meanwhile: it fires now, here. */
        Py_DECREF(self);
        fire(s, now, 1);
        return NULL;
    }
    Py_DECREF(self); /* the slot's reference */
    if (claimed) {
        if (!sc->raise_on_timeout)
            Py_RETURN_TRUE;
        raise_exceeded(self, in_flight);
        return NULL;
    }
    Py_RETURN_FALSE;
}

static PyObject *ns_to_float(int64_t ns)
{
    if (ns == TC_NEVER)
        Py_RETURN_NONE;
    return PyFloat_FromDouble((double)ns / 1e9);
}

static PyObject *Scope_when(PyObject *self, PyObject *unused)
{
    (void)unused;
    Scope *sc = as_scope(self);
    if (sc->state == SCOPE_NEW && !sc->has_deadline_arg)
        Py_RETURN_NONE;
    return ns_to_float(sc->deadline);
}

static PyObject *Scope_reschedule(PyObject *self, PyObject *when)
{
    Scope *sc = as_scope(self);
    int64_t d;
    if (when == Py_None)
        d = TC_NEVER;
    else if (parse_when(when, "reschedule()", &d) < 0)
        return NULL;
    if (sc->state == SCOPE_DONE) {
        PyErr_SetString(PyExc_RuntimeError, "reschedule() on a scope that has exited");
        return NULL;
    }
    sc->deadline = d;
    if (sc->state == SCOPE_NEW) {
        sc->has_deadline_arg = 1;
        sc->seconds = NAN;
        Py_RETURN_NONE;
    }
    tc_slot *s = sc->slot;
    if (s != NULL && s->fired == NULL) {
        slot_publish(s);
        if (t_slot == s && d <= now_ns() && atomic_load(&s->shield) == 0) {
            fire(s, now_ns(), 1);
            return NULL;
        }
    }
    Py_RETURN_NONE;
}

static PyObject *Scope_expired(PyObject *self, PyObject *unused)
{
    (void)unused;
    return PyBool_FromLong(as_scope(self)->expired);
}

static PyObject *Scope_remaining(PyObject *self, PyObject *unused)
{
    (void)unused;
    Scope *sc = as_scope(self);
    if (sc->deadline == TC_NEVER || (sc->state == SCOPE_NEW && !sc->has_deadline_arg)) {
        if (sc->state == SCOPE_NEW && !isnan(sc->seconds))
            return PyFloat_FromDouble(sc->seconds);
        Py_RETURN_NONE;
    }
    int64_t end = sc->state == SCOPE_DONE ? sc->exited : now_ns();
    int64_t r = sc->deadline - end;
    return PyFloat_FromDouble(r > 0 ? (double)r / 1e9 : 0.0);
}

static PyObject *Scope_elapsed(PyObject *self, PyObject *unused)
{
    (void)unused;
    Scope *sc = as_scope(self);
    if (sc->state == SCOPE_NEW)
        return PyFloat_FromDouble(0.0);
    int64_t end = sc->state == SCOPE_DONE ? sc->exited : now_ns();
    return PyFloat_FromDouble((double)(end - sc->entered) / 1e9);
}

static PyObject *Scope_get_label(PyObject *self, void *c)
{
    (void)c;
    Py_INCREF(as_scope(self)->label);
    return as_scope(self)->label;
}

static PyObject *Scope_get_limit(PyObject *self, void *c)
{
    (void)c;
    Scope *sc = as_scope(self);
    if (!isnan(sc->seconds))
        return PyFloat_FromDouble(sc->seconds);
    if (sc->deadline == TC_NEVER || sc->state == SCOPE_NEW)
        Py_RETURN_NONE;
    return PyFloat_FromDouble((double)(sc->deadline - sc->entered) / 1e9);
}

static PyObject *Scope_get_overshoot(PyObject *self, void *c)
{
    (void)c;
    Scope *sc = as_scope(self);
    if (!sc->expired || sc->state != SCOPE_DONE)
        Py_RETURN_NONE;
    int64_t o = sc->exited - sc->deadline;
    return PyFloat_FromDouble(o > 0 ? (double)o / 1e9 : 0.0);
}

static PyObject *Scope_get_fired_at(PyObject *self, void *c)
{
    (void)c;
    if (!as_scope(self)->expired)
        Py_RETURN_NONE;
    return ns_to_float(as_scope(self)->fired_at);
}

static PyObject *Scope_get_entered_at(PyObject *self, void *c)
{
    (void)c;
    if (as_scope(self)->state == SCOPE_NEW)
        Py_RETURN_NONE;
    return ns_to_float(as_scope(self)->entered);
}

static PyObject *Scope_get_exited_at(PyObject *self, void *c)
{
    (void)c;
    if (as_scope(self)->state != SCOPE_DONE || as_scope(self)->exited == 0)
        Py_RETURN_NONE;
    return ns_to_float(as_scope(self)->exited);
}

static PyObject *Scope_get_active(PyObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(as_scope(self)->state == SCOPE_ACTIVE);
}

static PyObject *Scope_get_used(PyObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(as_scope(self)->state != SCOPE_NEW);
}

static PyObject *Scope_get_raise(PyObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(as_scope(self)->raise_on_timeout);
}

static PyObject *Scope_get_native_id(PyObject *self, void *c)
{
    (void)c;
    if (as_scope(self)->state == SCOPE_NEW)
        Py_RETURN_NONE;
    return PyLong_FromLong((long)as_scope(self)->native_id);
}

static PyObject *Scope_get_exit_exc(PyObject *self, void *c)
{
    (void)c;
    PyObject *e = as_scope(self)->exit_exc;
    if (e == NULL)
        Py_RETURN_NONE;
    Py_INCREF(e);
    return e;
}

static PyObject *Scope_get_hook(PyObject *self, void *c)
{
    (void)c;
    PyObject *h = as_scope(self)->hook;
    if (h == NULL)
        Py_RETURN_NONE;
    Py_INCREF(h);
    return h;
}

static int Scope_set_hook(PyObject *self, PyObject *value, void *c)
{
    (void)c;
    if (as_scope(self)->state == SCOPE_DONE) {
        PyErr_SetString(PyExc_RuntimeError, "a scope's hook cannot be set after it exited");
        return -1;
    }
    if (value != NULL && value != Py_None && !PyCallable_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "_hook must be callable or None");
        return -1;
    }
    if (value == Py_None)
        value = NULL;
    Py_XINCREF(value);
    Py_XSETREF(as_scope(self)->hook, value);
    return 0;
}

static PyObject *Scope_get_thread_ident(PyObject *self, void *c)
{
    (void)c;
    if (as_scope(self)->state == SCOPE_NEW)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLong(as_scope(self)->ident);
}

static PyMethodDef Scope_methods[] = {
    {"__enter__", Scope_enter, METH_NOARGS, "Arm the deadline; returns the scope."},
    {"__exit__", (PyCFunction)(void (*)(void))Scope_exit, METH_FASTCALL,
     "Disarm; turn this scope's interrupt into DeadlineExceeded."},
    {"when", Scope_when, METH_NOARGS,
     "The absolute deadline as a time.monotonic() value, or None."},
    {"reschedule", Scope_reschedule, METH_O,
     "Move the deadline to `when` (time.monotonic() seconds, or None for no deadline)."},
    {"expired", Scope_expired, METH_NOARGS, "True once this scope's deadline has fired."},
    {"remaining", Scope_remaining, METH_NOARGS,
     "Seconds left before the deadline (0.0 once passed), or None without one."},
    {"elapsed", Scope_elapsed, METH_NOARGS, "Seconds since the scope was entered."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Scope_getset[] = {
    {"label", Scope_get_label, NULL, "The label given at construction, or None.", NULL},
    {"limit", Scope_get_limit, NULL, "The limit in seconds, or None.", NULL},
    {"overshoot", Scope_get_overshoot, NULL,
     "Seconds between the deadline and the moment the block was left, if it fired.", NULL},
    {"fired_at", Scope_get_fired_at, NULL,
     "time.monotonic() when the interrupt was raised, or None.", NULL},
    {"entered_at", Scope_get_entered_at, NULL, "time.monotonic() at entry, or None.", NULL},
    {"exited_at", Scope_get_exited_at, NULL, "time.monotonic() at exit, or None.", NULL},
    {"active", Scope_get_active, NULL, "True between enter and exit.", NULL},
    {"used", Scope_get_used, NULL, "True once entered.", NULL},
    {"raise_on_timeout", Scope_get_raise, NULL, "Whether expiry raises DeadlineExceeded.",
     NULL},
    {"native_id", Scope_get_native_id, NULL,
     "Kernel thread id of the thread that entered it, or None.", NULL},
    {"exit_exception", Scope_get_exit_exc, NULL,
     "The exception the block ended with (as passed to __exit__), or None.", NULL},
    {"_hook", Scope_get_hook, Scope_set_hook,
     "Internal: hook(scope, 'enter'|'exit', exc), called around the block.", NULL},
    {"thread_ident", Scope_get_thread_ident, NULL,
     "threading.get_ident() of the thread that entered it, or None.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Scope_slots[] = {
    {Py_tp_doc, "Native deadline scope (use timeoutcore.thread_deadline)."},
    {Py_tp_new, Scope_new},
    {Py_tp_init, Scope_init},
    {Py_tp_dealloc, Scope_dealloc},
    {Py_tp_traverse, Scope_traverse},
    {Py_tp_clear, Scope_clear},
    {Py_tp_methods, Scope_methods},
    {Py_tp_getset, Scope_getset},
    {0, NULL},
};

static PyType_Spec Scope_spec = {
    "timeoutcore._core.Scope",
    sizeof(Scope),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    Scope_slots,
};

/* ------------------------------------------------------------------------ */
/* Shield: hold interrupts back; deliver at exit                            */

typedef struct {
    PyObject_HEAD
    tc_slot *slot;
    int state;
} Shield;

static PyObject *Shield_enter(PyObject *self, PyObject *unused)
{
    (void)unused;
    Shield *sh = (Shield *)self;
    tc_slot *s;
    if (sh->state != 0) {
        PyErr_SetString(PyExc_RuntimeError, "a shield is not reusable");
        return NULL;
    }
    s = t_slot;
    if (s == NULL && (s = slot_get()) == NULL)
        return NULL;
    sh->slot = s;
    sh->state = 1;
    if (atomic_fetch_add(&s->shield, 1) == 0 && atomic_load(&s->state) == SLOT_INJECTED &&
        s->fired != NULL) {
        /* A raised-but-undelivered interrupt must not land in the shield:
         * take it back; shield exit delivers it. */
        PyThreadState_SetAsyncExc(s->ident, NULL);
    }
    atomic_fetch_add(&s->gen, 1);
    Py_INCREF(self);
    return self;
}

static PyObject *Shield_exit(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)args;
    (void)nargs;
    Shield *sh = (Shield *)self;
    tc_slot *s = sh->slot;
    if (sh->state != 1 || s != t_slot) {
        PyErr_SetString(PyExc_RuntimeError,
                        "shield exited twice or in another thread than it was entered");
        return NULL;
    }
    sh->state = 2;
    if (atomic_fetch_sub(&s->shield, 1) == 1) {
        int64_t now = now_ns();
        atomic_fetch_add(&s->gen, 1);
        if (s->fired != NULL || stack_due(s->top, now) != NULL) {
            /* Deliver what was held back, here, synchronously. */
            if (s->fired == NULL)
                fire(s, now, 1);
            else {
                atomic_store(&s->reinject_at, now + s->reinject_step);
                raise_here(s);
            }
            return NULL;
        }
        wd_notify(atomic_load(&s->deadline));
    }
    Py_RETURN_FALSE;
}

static PyMethodDef Shield_methods[] = {
    {"__enter__", Shield_enter, METH_NOARGS, "Hold interrupts back."},
    {"__exit__", (PyCFunction)(void (*)(void))Shield_exit, METH_FASTCALL,
     "Deliver a held-back interrupt."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot Shield_slots[] = {
    {Py_tp_doc, "Context manager during which deadline interrupts are held back."},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_methods, Shield_methods},
    {0, NULL},
};

static PyType_Spec Shield_spec = {
    "timeoutcore._core.Shield",
    sizeof(Shield),
    0,
    Py_TPFLAGS_DEFAULT,
    Shield_slots,
};

/* ------------------------------------------------------------------------ */
/* Module functions                                                         */

/* sleep(seconds): ends at the current thread's deadline and raises there. */
static PyObject *mod_sleep(PyObject *m, PyObject *arg)
{
    (void)m;
    double secs;
    int64_t target, until, now;
    tc_slot *s = t_slot;
    if (parse_seconds(arg, "sleep()", "seconds", &secs, 1) < 0)
        return NULL;
    if (isnan(secs)) {
        PyErr_SetString(PyExc_TypeError, "sleep(): seconds must be a number, not None");
        return NULL;
    }
    target = now_ns() + (int64_t)(secs * 1e9);
    uint32_t raised0 = s != NULL ? atomic_load(&s->raised) : 0;
    for (;;) {
        int64_t dl = TC_NEVER;
        uint32_t seen = 0;
        int err;
        if (s != NULL) {
            seen = atomic_load(&s->wake);
            if (atomic_load(&s->shield) == 0) {
                if (atomic_load(&s->state) == SLOT_INJECTED && s->fired != NULL)
                    return raise_here(s);
                dl = atomic_load(&s->deadline);
            }
        }
        until = dl < target ? dl : target;
        Py_BEGIN_ALLOW_THREADS
        if (s != NULL)
            err = futex_wait_until(&s->wake, seen, until);
        else {
            struct timespec ts = to_ts(until);
            err = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        }
        Py_END_ALLOW_THREADS
        (void)err;
        if (PyErr_CheckSignals() < 0)
            return NULL;
        now = now_ns();
        if (s != NULL && atomic_load(&s->raised) != raised0)
            Py_RETURN_NONE; /* a soft-limit exception is pending: let it land */
        if (s != NULL && atomic_load(&s->shield) == 0) {
            if (atomic_load(&s->state) == SLOT_INJECTED && s->fired != NULL)
                return raise_here(s);
            if (atomic_load(&s->deadline) <= now && fire(s, now, 1))
                return NULL;
        }
        if (now >= target)
            Py_RETURN_NONE;
    }
}

/* checkpoint(): raise the interrupt here if this thread's deadline has
 * passed (or has fired and was swallowed); else return None.  For waits that
 * end by their own timeout at the deadline. */
static PyObject *mod_checkpoint(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    tc_slot *s = t_slot;
    if (s == NULL || s->top == NULL || atomic_load(&s->shield) > 0)
        Py_RETURN_NONE;
    if (atomic_load(&s->state) == SLOT_INJECTED && s->fired != NULL)
        return raise_here(s);
    int64_t now = now_ns();
    if (atomic_load(&s->deadline) <= now && fire(s, now, 1))
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *mod_remaining(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    tc_slot *s = t_slot;
    if (s == NULL || s->top == NULL)
        Py_RETURN_NONE;
    int64_t d = atomic_load(&s->deadline);
    if (d == TC_NEVER)
        Py_RETURN_NONE;
    int64_t r = d - now_ns();
    return PyFloat_FromDouble(r > 0 ? (double)r / 1e9 : 0.0);
}

/* current_deadline(): this thread's effective (earliest) deadline as a
 * time.monotonic() value, or None when no scope with a deadline is active. */
static PyObject *mod_current_deadline(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    tc_slot *s = t_slot;
    if (s == NULL || s->top == NULL)
        Py_RETURN_NONE;
    return ns_to_float(atomic_load(&s->deadline));
}

static PyObject *mod_current(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    tc_slot *s = t_slot;
    if (s == NULL || s->top == NULL)
        Py_RETURN_NONE;
    Py_INCREF(s->top);
    return s->top;
}

static PyObject *mod_shield(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    return PyObject_CallNoArgs(g_shield_type);
}

/* _set_default_hook(hook or None): every scope created from now on gets it. */
static PyObject *mod_set_default_hook(PyObject *m, PyObject *hook)
{
    (void)m;
    if (hook != Py_None && !PyCallable_Check(hook)) {
        PyErr_SetString(PyExc_TypeError, "the default hook must be callable or None");
        return NULL;
    }
    if (hook == Py_None)
        Py_CLEAR(g_default_hook);
    else {
        Py_INCREF(hook);
        Py_XSETREF(g_default_hook, hook);
    }
    Py_RETURN_NONE;
}

/* _raise_in_scope(scope, exc_type) -> bool: raise exc_type asynchronously in
 * the thread running `scope`, if the scope is still active, not shielded and
 * its deadline has not fired.  Atomic with respect to the scope's exit (both
 * hold the GIL); the exit takes back an undelivered one. */
static PyObject *mod_raise_in_scope(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *scope, *exc;
    Scope *sc;
    tc_slot *s;
    if (!PyArg_ParseTuple(args, "OO:_raise_in_scope", &scope, &exc))
        return NULL;
    if (!PyObject_TypeCheck(scope, (PyTypeObject *)g_scope_type)) {
        PyErr_SetString(PyExc_TypeError, "_raise_in_scope() needs a deadline scope");
        return NULL;
    }
    if (!PyType_Check(exc) || !PyType_IsSubtype((PyTypeObject *)exc,
                                                 (PyTypeObject *)PyExc_BaseException)) {
        PyErr_SetString(PyExc_TypeError, "_raise_in_scope() needs an exception class");
        return NULL;
    }
    sc = as_scope(scope);
    s = sc->slot;
    if (sc->state != SCOPE_ACTIVE || s == NULL || atomic_load(&s->shield) > 0 ||
        atomic_load(&s->state) == SLOT_INJECTED)
        Py_RETURN_FALSE;
    if (PyThreadState_SetAsyncExc(s->ident, exc) != 1)
        Py_RETURN_FALSE;
    sc->soft_pending = 1;
    atomic_fetch_add(&s->raised, 1);
    atomic_fetch_add(&s->wake, 1);
    futex_wake_all(&s->wake);
    kick(s);
    Py_RETURN_TRUE;
}

static PyObject *mod_setup(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *interrupt, *exceeded;
    if (!PyArg_ParseTuple(args, "OO:_setup", &interrupt, &exceeded))
        return NULL;
    Py_INCREF(interrupt);
    Py_XSETREF(g_interrupt, interrupt);
    Py_INCREF(exceeded);
    Py_XSETREF(g_exceeded, exceeded);
    Py_RETURN_NONE;
}

/* Stop and join the watchdog (atexit).  Safe to call more than once. */
static PyObject *mod_shutdown(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    if (g_wd_running) {
        int err;
        atomic_store(&g_wd_stop, 1);
        wd_wake();
        Py_BEGIN_ALLOW_THREADS
        err = pthread_join(g_wd, NULL);
        Py_END_ALLOW_THREADS
        g_wd_running = 0;
        if (err != 0) {
            errno = err;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
    }
    Py_RETURN_NONE;
}

static PyObject *mod_watchdog_running(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    return PyBool_FromLong(g_wd_running);
}

/* Start the watchdog again if any live slot has an armed deadline (after a
 * fork, in parent or child).  GIL held. */
static PyObject *mod_ensure_watchdog(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    int need = 0;
    pthread_mutex_lock(&g_mu);
    for (tc_slot *s = g_slots; s != NULL; s = s->next)
        if (s->alive && atomic_load(&s->deadline) != TC_NEVER)
            need = 1;
    pthread_mutex_unlock(&g_mu);
    if (need && wd_ensure() < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef mod_methods[] = {
    {"sleep", mod_sleep, METH_O,
     "sleep(seconds): like time.sleep, but ends at this thread's deadline and raises there."},
    {"checkpoint", mod_checkpoint, METH_NOARGS,
     "checkpoint(): raise here if this thread's deadline has passed; else None."},
    {"remaining", mod_remaining, METH_NOARGS,
     "Seconds left before this thread's earliest deadline, or None when unguarded."},
    {"current_deadline", mod_current_deadline, METH_NOARGS,
     "This thread's earliest deadline as a time.monotonic() value, or None."},
    {"current_scope", mod_current, METH_NOARGS,
     "The innermost active scope of this thread, or None."},
    {"shield", mod_shield, METH_NOARGS,
     "shield(): a context manager holding deadline interrupts back until it exits."},
    {"_setup", mod_setup, METH_VARARGS, "Register the exception classes."},
    {"_set_default_hook", mod_set_default_hook, METH_O, "Hook given to every new scope."},
    {"_raise_in_scope", mod_raise_in_scope, METH_VARARGS,
     "Raise an exception class in the thread running an active scope."},
    {"_shutdown", mod_shutdown, METH_NOARGS, "Stop and join the watchdog."},
    {"_watchdog_running", mod_watchdog_running, METH_NOARGS, "Whether the watchdog runs."},
    {"_ensure_watchdog", mod_ensure_watchdog, METH_NOARGS,
     "Start the watchdog if an armed deadline needs it (after fork)."},
    {NULL, NULL, 0, NULL},
};

/* ------------------------------------------------------------------------ */
/* fork                                                                     */

static void atfork_prepare(void) { pthread_mutex_lock(&g_mu); }
static void atfork_parent(void) { pthread_mutex_unlock(&g_mu); }

static void atfork_child(void)
{
    /* Async-signal-safe only.  The watchdog and every other thread are gone;
     * so are the parent's kernel timers (they are not inherited). */
    pthread_mutex_init(&g_mu, NULL);
    g_wd_running = 0;
    atomic_store(&g_wd_planned, 0);
    atomic_store(&g_st.timers_live, 0);
    atomic_store(&g_st.slots_live, 0);
    for (tc_slot *s = g_slots; s != NULL; s = s->next) {
        s->timer_ok = 0;
        if (s == t_slot && s->alive) {
            s->tid = (pid_t)syscall(SYS_gettid);
            STAT_INC(slots_live);
            (void)timer_make(s); /* without a timer, kick() uses tgkill */
        }
        else {
            s->alive = 0;
            atomic_store(&s->deadline, TC_NEVER);
            atomic_store(&s->state, SLOT_IDLE);
            atomic_fetch_add(&s->gen, 1);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Entry points for cffi (called without the GIL)                          */

static struct PyModuleDef g_moddef = {
    PyModuleDef_HEAD_INIT, NULL, "timeoutcore native core", -1, NULL, NULL, NULL, NULL, NULL,
};

static int export_locked(const char *modname)
{
    PyObject *mod, *t;
    if (!g_key_ok) {
        if (pthread_key_create(&g_key, slot_release) != 0) {
            PyErr_SetString(PyExc_RuntimeError, "timeoutcore: pthread_key_create failed");
            return -1;
        }
        g_key_ok = 1;
        if (pthread_atfork(atfork_prepare, atfork_parent, atfork_child) != 0) {
            PyErr_SetString(PyExc_RuntimeError, "timeoutcore: pthread_atfork failed");
            return -1;
        }
    }
    g_moddef.m_name = modname;
    mod = PyModule_Create(&g_moddef);
    if (mod == NULL)
        return -1;
    if (PyModule_AddFunctions(mod, mod_methods) < 0)
        goto fail;
    if (g_scope_type == NULL && (g_scope_type = PyType_FromSpec(&Scope_spec)) == NULL)
        goto fail;
    if (g_shield_type == NULL && (g_shield_type = PyType_FromSpec(&Shield_spec)) == NULL)
        goto fail;
    Py_INCREF(g_scope_type);
    if (PyModule_AddObject(mod, "Scope", g_scope_type) < 0) {
        Py_DECREF(g_scope_type);
        goto fail;
    }
    Py_INCREF(g_shield_type);
    if (PyModule_AddObject(mod, "Shield", g_shield_type) < 0) {
        Py_DECREF(g_shield_type);
        goto fail;
    }
    t = PyImport_GetModuleDict();
    if (PyDict_SetItemString(t, modname, mod) < 0)
        goto fail;
    Py_DECREF(mod);
    return 0;
fail:
    Py_DECREF(mod);
    return -1;
}

int tc_export(const char *modname)
{
    PyGILState_STATE gs = PyGILState_Ensure();
    int r = export_locked(modname);
    if (r < 0)
        PyErr_Print();
    PyGILState_Release(gs);
    return r;
}

void tc_get_stats(struct tc_stats *o)
{
    o->slots_live = atomic_load(&g_st.slots_live);
    o->timers_live = atomic_load(&g_st.timers_live);
    o->fires = atomic_load(&g_st.fires);
    o->reinjections = atomic_load(&g_st.reinjections);
    o->kicks = atomic_load(&g_st.kicks);
    o->signals_seen = atomic_load(&g_st.signals_seen);
    o->watchdog_wakeups = atomic_load(&g_st.watchdog_wakeups);
    o->gil_takes = atomic_load(&g_st.gil_takes);
    o->requeues = atomic_load(&g_st.requeues);
    o->stale_scopes = atomic_load(&g_st.stale_scopes);
}

int tc_signal_number(void) { return g_signo; }

int tc_watchdog_tid(void) { return g_wd_running ? atomic_load(&g_wd_tid) : 0; }

int tc_bench_timer_pair(long n)
{
    tc_slot *s = t_slot;
    struct itimerspec on, off;
    if (s == NULL || !s->timer_ok)
        return ENOENT;
    memset(&on, 0, sizeof on);
    memset(&off, 0, sizeof off);
    for (long i = 0; i < n; i++) {
        int64_t d = now_ns() + 3600 * NS_PER_S;
        on.it_value = to_ts(d);
        if (syscall(SYS_timer_settime, s->timer_id, TIMER_ABSTIME, &on, NULL) != 0)
            return errno;
        if (syscall(SYS_timer_settime, s->timer_id, 0, &off, NULL) != 0)
            return errno;
    }
    return 0;
}
