/*
 * timeoutcore.h -- the contract of the native deadline core.
 *
 * WHAT IT DOES
 *   Gives any Python thread a hard deadline.  Each guarded thread owns one
 *   *slot* (thread-local, never freed, recycled after the thread exits) and
 *   one POSIX timer created once with timer_create(CLOCK_MONOTONIC,
 *   SIGEV_THREAD_ID -> that thread, a real-time signal).  Entering a scope
 *   stores the deadline in the slot (no system call); one *watchdog* pthread
 *   keeps its own schedule of every armed slot.  Shortly before a deadline the
 *   watchdog asks for the GIL (anticipation: one switch interval + a lead), at
 *   the deadline it raises the internal interrupt in the guarded thread with
 *   PyThreadState_SetAsyncExc, and only then fires that thread's timer so the
 *   signal knocks a blocking system call loose ("inject first, then kick").
 *   It re-injects while the block swallows the interrupt.  The scope exit
 *   claims the interrupt and turns it into DeadlineExceeded.
 *
 * THREADS, GIL AND LOCKS
 *   - Scope/shield __enter__/__exit__, sleep() and everything else in the
 *     Python module built by tc_export() run in the calling (guarded) thread
 *     WITH the GIL held, and never release it between "block finished" and
 *     "disarmed and pending interrupt cleared": that is what keeps an
 *     interrupt from surfacing after a block has exited.  They are plain
 *     PyCFunctions, never cffi `lib` calls (cffi drops the GIL around those).
 *   - The slot's scope stack (Python objects) is touched only with the GIL.
 *     The slot's deadline/state/generation are atomics, written by the owner
 *     thread with the GIL, read by the watchdog without it.
 *   - The watchdog never holds the registry mutex while it waits for the GIL.
 *     It may take the mutex while holding the GIL (to check a slot is alive).
 *     The thread-exit destructor takes only the mutex, never the GIL.
 *   - The functions declared below (the cffi `lib`) are called by cffi WITHOUT
 *     the GIL; tc_export() takes it itself.  They may be called from any
 *     thread.
 *
 * ASYNC-SIGNAL-SAFETY
 *   The signal handler only saves errno, bumps a relaxed atomic counter in the
 *   slot named by si_value (slots are never freed) and restores errno.  Its one
 *   purpose is to exist: installed without SA_RESTART, it makes the blocking
 *   system call of the guarded thread fail with EINTR.  Decisions are taken
 *   from the slot's state, never from the signal, so a stale or late signal is
 *   harmless.  The pthread_atfork child handler only uses async-signal-safe
 *   calls (raw syscalls, plain stores).
 *
 * RESOURCES AND THEIR OWNERS
 *   - kernel timer: created with the slot, deleted by the pthread key
 *     destructor when its thread exits (timer_create fails with EAGAIN past
 *     RLIMIT_SIGPENDING: reported as OSError, nothing left armed);
 *   - watchdog: started lazily at the first armed deadline, stopped and joined
 *     by tc_shutdown (registered with atexit), forgotten in a fork child and
 *     restarted there on demand (os.register_at_fork calls _after_fork_child);
 *   - signal handler: installed once; refused (never clobbered) if someone
 *     else already handles the chosen signal (env TIMEOUTCORE_SIGNAL).
 */
#ifndef TIMEOUTCORE_H
#define TIMEOUTCORE_H

#include <stdint.h>

/* cdef-begin (everything up to cdef-end is read by cffi's cdef) */

/* Counters kept by the core; monotonic, process-wide, relaxed. */
struct tc_stats {
    uint64_t slots_live;       /* threads that own a live slot now          */
    uint64_t timers_live;      /* kernel timers that exist now              */
    uint64_t fires;            /* interrupts raised (watchdog + local)      */
    uint64_t reinjections;     /* re-raised because the body swallowed them */
    uint64_t kicks;            /* thread-directed signals sent              */
    uint64_t signals_seen;     /* signals that reached our handler          */
    uint64_t watchdog_wakeups; /* times the watchdog woke to look around    */
    uint64_t gil_takes;        /* times the watchdog took the GIL           */
    uint64_t requeues;         /* GIL handed back to be retaken later       */
    uint64_t stale_scopes;     /* scopes cleaned up whose exit never ran    */
};

/* Build the Python-facing module (types Scope and Shield, functions sleep,
 * remaining, ...) and register it in sys.modules under `modname`.  Takes the
 * GIL itself.  Returns 0, or -1 with a Python exception set (then cffi
 * prints it; the caller checks the return value). */
int tc_export(const char *modname);

/* Copy the counters.  Any thread, no GIL needed. */
void tc_get_stats(struct tc_stats *out);

/* The signal number in use, or 0 before the first scope was entered. */
int tc_signal_number(void);

/* Kernel thread id of the watchdog, or 0 when it is not running. */
int tc_watchdog_tid(void);

/* Benchmark helper: `n` arm+disarm pairs of this thread's kernel timer (what
 * arming at every block entry would cost).  Returns 0 or an errno. */
int tc_bench_timer_pair(long n);

/* cdef-end */

#endif /* TIMEOUTCORE_H */
