/*
 * tc_os.c -- the operating-system layer: clock, futex, the signal handler,
 * per-thread kernel timers, the kick and a thread's run state.  Part of
 * the unity build
 * (timeoutcore.c); nothing here touches Python objects except
 * install_handler's error reporting (GIL held there).
 */

/* -- Clock and futex --------------------------------------------------------- */

static inline int64_t now_ns(void)
{
    struct timespec ts;
    /* CLOCK_MONOTONIC cannot fail with a valid pointer. */
    (void)clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * TC_NS_PER_S + ts.tv_nsec;
}

static inline struct timespec to_ts(int64_t ns)
{
    struct timespec ts;
    ts.tv_sec = (time_t)(ns / TC_NS_PER_S);
    ts.tv_nsec = (long)(ns % TC_NS_PER_S);
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
    long r = syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_BITSET | FUTEX_PRIVATE_FLAG, seen,
                     tsp, NULL, FUTEX_BITSET_MATCH_ANY);
    return r == -1 ? errno : 0;
}

static void futex_wake_all(_Atomic uint32_t *w)
{
    /* FUTEX_WAKE only fails for a bad address, which this is not. */
    (void)syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE | FUTEX_PRIVATE_FLAG, INT32_MAX, NULL,
                  NULL, 0);
}

/* A busy wait's pause: lets the core's other hardware thread run, and tells
 * the CPU the loop spins. */
static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Sleep until `t` (CLOCK_MONOTONIC), whatever signals arrive meanwhile. */
static void sleep_until(int64_t t)
{
    struct timespec ts = to_ts(t);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

/* -- Scheduling -------------------------------------------------------------- */

/* The kernel's struct sched_attr (uapi linux/sched/types.h; glibc wraps
 * neither it nor the calls before 2.41). */
struct tc_sched_attr {
    uint32_t size, sched_policy;
    uint64_t sched_flags;
    int32_t sched_nice;
    uint32_t sched_priority;
    uint64_t sched_runtime, sched_deadline, sched_period;
    uint32_t sched_util_min, sched_util_max;
};

/* Ask for a time slice of `ns` for the calling thread, its policy and nice
 * value kept (Linux 6.12+: a fair-class thread's sched_runtime is its slice,
 * and a woken thread with a shorter slice than the running one preempts it;
 * older kernels ignore it).  Only for the normal and batch policies.
 * Returns 0, or an errno. */
static int os_short_slice(uint64_t ns)
{
    struct tc_sched_attr a;
    memset(&a, 0, sizeof a);
    if (syscall(SYS_sched_getattr, 0, &a, sizeof a, 0) != 0)
        return errno;
    if (a.sched_policy != SCHED_OTHER && a.sched_policy != SCHED_BATCH)
        return EPERM;
    a.size = sizeof a;
    a.sched_flags = 0;
    a.sched_runtime = ns;
    if (syscall(SYS_sched_setattr, 0, &a, 0) != 0)
        return errno;
    return 0;
}

/* -- The signal handler: async-signal-safe, no lock -------------------------- */

/* Its first purpose is to exist: installed without SA_RESTART, it makes the
 * guarded thread's blocking system call fail with EINTR.  It saves and
 * restores errno and counts the signal (a relaxed atomic).  Its second: a
 * signal from the thread's own timer (si_value: its slot) may be, on 3.11,
 * the alarm that wakes the thread's sleeping tracer at its deadline
 * (sleeping_tracer_on_signal: atomics, a clock read, one byte store
 * into this thread's cframe, timer_settime, a futex wake), or else the
 * watchdog's backstop (rescue_on_signal: atomics, getcpu, a try-locked
 * sched_setaffinity of the watchdog, a futex wake, sched_yield).  No lock,
 * no allocation, no Python API: timeoutcore.h (ASYNC-SIGNAL-SAFETY) says
 * why each step is safe here.  Decisions are taken from the slot's state,
 * never from the signal, so a stale or late signal is harmless. */
static void tc_handler(int signo, siginfo_t *si, void *uc)
{
    int saved = errno;
    (void)signo;
    (void)uc;
    STAT_INC(signals_seen);
    if (si != NULL && si->si_code == SI_TIMER && si->si_value.sival_ptr != NULL)
        accel_on_signal((tc_slot *)si->si_value.sival_ptr); /* tc_accel.c */
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

/* Install the handler once (GIL held).  A signal someone else handles is
 * refused, never clobbered.  Returns 0, or -1 with a Python exception. */
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

/* -- Per-thread kernel timers ------------------------------------------------ */

/* Kernel ABI for timer_create with SIGEV_THREAD_ID.  glibc spells the target
 * field sigev_notify_thread_id (a macro), musl differs; the raw syscall with
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

/* Create the slot's timer, aimed at its thread.  g_mu held (or the atfork
 * child).  Returns 0 or the errno (EAGAIN past RLIMIT_SIGPENDING). */
static int timer_make(tc_slot *s)
{
    struct tc_ksigevent ev;
    int id = -1;
    memset(&ev, 0, sizeof ev);
    ev.signo = g_signo;
    ev.notify = SIGEV_THREAD_ID;
    ev.tid = s->tid;
    ev.value.sival_ptr = s; /* slots are never freed */
    if (syscall(SYS_timer_create, CLOCK_MONOTONIC, &ev, &id) != 0)
        return errno;
    s->timer_id = id;
    s->timer_ok = 1;
    STAT_INC(timers_live);
    return 0;
}

/* Delete the slot's timer.  g_mu held. */
static void timer_drop(tc_slot *s)
{
    if (s->timer_ok) {
        /* Fails only for an invalid id; then there is nothing to delete. */
        if (syscall(SYS_timer_delete, s->timer_id) == 0)
            STAT_DEC(timers_live);
        s->timer_ok = 0;
    }
    atomic_store(&s->backstop_gen, 0);
}

/* Set the slot's timer to expire at `at` (monotonic ns, absolute), for its
 * generation `gen` (backstop_gen).  Any thread, the slot's own signal
 * handler included (one system call).  Returns 0, or -1 (only EINVAL: a
 * timer gone with its thread; backstop_gen is then 0). */
static int timer_set_at(tc_slot *s, uint64_t gen, int64_t at)
{
    struct itimerspec its;
    memset(&its, 0, sizeof its);
    its.it_value = to_ts(at);
    atomic_store(&s->backstop_gen, gen);
    if (syscall(SYS_timer_settime, s->timer_id, TIMER_ABSTIME, &its, NULL) != 0) {
        atomic_store(&s->backstop_gen, 0);
        return -1;
    }
    return 0;
}

/* Take the backstop back, if armed: the slot's deadline changed (its
 * thread, or whoever reschedules it). */
static void timer_backstop_off(tc_slot *s)
{
    struct itimerspec its;
    if (atomic_load(&s->backstop_gen) == 0 || atomic_exchange(&s->backstop_gen, 0) == 0 ||
        !s->timer_ok)
        return;
    memset(&its, 0, sizeof its);
    /* Fails only for an invalid id (a timer gone with its thread). */
    (void)syscall(SYS_timer_settime, s->timer_id, 0, &its, NULL);
}

/* Send the thread-directed signal now, through the thread's own timer (one
 * nanosecond from now); tgkill when the thread has no timer. */
static void kick(tc_slot *s)
{
    atomic_store(&s->backstop_gen, 0); /* the timer is the kick's now */
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

/* `n` arm+disarm pairs of the slot's timer (what eager arming would cost
 * per block).  Returns 0 or an errno. */
static int timer_bench_pairs(tc_slot *s, long n)
{
    struct itimerspec on, off;
    if (s == NULL || !s->timer_ok)
        return ENOENT;
    memset(&on, 0, sizeof on);
    memset(&off, 0, sizeof off);
    for (long i = 0; i < n; i++) {
        on.it_value = to_ts(now_ns() + TC_BENCH_FAR_NS);
        if (syscall(SYS_timer_settime, s->timer_id, TIMER_ABSTIME, &on, NULL) != 0)
            return errno;
        if (syscall(SYS_timer_settime, s->timer_id, 0, &off, NULL) != 0)
            return errno;
    }
    return 0;
}

/* -- Thread state (accelerator self_fire, free-threaded) ---------------------- */

#if TC_SELF_FIRE_TRIGGER
#include <fcntl.h>

/* /proc/self/task/<tid>/<name>, NUL-terminated, into buf: its length, or
 * -1 (unreadable, or empty). */
static ssize_t task_file(pid_t tid, const char *name, char *buf, size_t size)
{
    char path[64];
    ssize_t n;
    int fd;
    (void)snprintf(path, sizeof path, "/proc/self/task/%d/%s", (int)tid, name);
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return -1;
    n = read(fd, buf, size - 1);
    (void)close(fd); /* read-only: nothing to lose */
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    return n;
}

/* Is thread `tid` of this process running or runnable (1), or asleep -- in
 * a system call, a lock (0)?  -1 if unknown.  Its state is the letter after
 * the command's closing parenthesis in its stat file. */
static int thread_runnable(pid_t tid)
{
    char buf[512], *close_paren;
    if (task_file(tid, "stat", buf, sizeof buf) < 0)
        return -1;
    if ((close_paren = strrchr(buf, ')')) == NULL || close_paren[1] != ' ')
        return -1;
    return close_paren[2] == 'R';
}

/* Is thread `tid` of this process, asleep, waiting in futex() (1) -- which
 * is how CPython's own locks park, a stop of the world's included -- or in
 * another system call (0)?  -1 if unknown.  The number at the start of its
 * syscall file. */
static int thread_in_futex(pid_t tid)
{
    char buf[64];
    long nr;
    if (task_file(tid, "syscall", buf, sizeof buf) < 0 ||
        sscanf(buf, "%ld", &nr) != 1) /* "running" */
        return -1;
#ifdef SYS_futex_waitv
    if (nr == SYS_futex_waitv)
        return 1;
#endif
    return nr == SYS_futex;
}
#endif
