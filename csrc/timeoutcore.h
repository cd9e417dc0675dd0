/*
 * timeoutcore.h -- the contract of the native deadline core.
 *
 * WHAT IT DOES
 *   Gives any Python thread a hard deadline.  Each guarded thread owns one
 *   *slot* (thread-local, never freed, recycled after its thread exits) and
 *   one POSIX timer created once with timer_create(CLOCK_MONOTONIC,
 *   SIGEV_THREAD_ID -> that thread, a real-time signal).  Entering a scope
 *   stores the deadline in the slot (no system call); one *watchdog* pthread
 *   keeps its own schedule of every armed slot, so a thread that blocks the
 *   signal is still stopped.  Shortly before a deadline the watchdog lowers
 *   the GIL switch interval (the fast window, until the interrupt is claimed)
 *   and asks for the GIL (anticipation: the lowered interval + a margin, with
 *   "requeue" when the GIL came easily); at the deadline it makes the
 *   internal interrupt *pending* in the slot and arms a hook that runs in the
 *   guarded thread at its next line boundary, where it raises only outside
 *   protected code (safe delivery; nothing is raised with
 *   PyThreadState_SetAsyncExc while the hook works), and only then fires that
 *   thread's timer so the signal knocks a blocking system call loose
 *   ("inject first, then kick").  It sends again while the body swallows the
 *   interrupt (not while the body holds it to raise it later: _setup gives
 *   the interrupt class a __new__ that notes each instance for its thread).
 *   The scope that fired claims the interrupt at its exit and raises
 *   DeadlineExceeded.  Where: tc_watchdog.c decides when (and
 *   tc_wd_fire.c, tc_wd_main.c act on it), tc_slot.c runs the delivery
 *   steps (its header lists them), tc_deliver.c and the hook
 *   (tc_hook_trace.c / tc_hook_monitoring.c, tc_deliver_steps.c) decide
 *   where the interrupt surfaces, tc_scope.c makes the exception, tc_gil.c
 *   (its own unit, CPython's internal headers) finds the switch interval
 *   and wakes the GIL's waiters.
 *
 * THE PYTHON-FACING MODULE (built by tc_export, e.g. "timeoutcore._core")
 *   Types Scope (thread_deadline's base) and Shield; functions sleep,
 *   checkpoint, remaining, current_deadline, current_scope, shield; private
 *   _setup, _set_default_hook, _raise_in_scope, _shutdown, _watchdog_running,
 *   _ensure_watchdog, _anticipation, _wait_readable (any thread; the GIL
 *   released while it waits), and for safe delivery _setup_delivery
 *   (once, arms the hook machinery: a tracer on 3.11, a sys.monitoring tool
 *   on 3.12+), _set_protection(names, codes), _set_deferral_report(fn, cap),
 *   _delivery_mode.  Precondition: _setup(interrupt_class, exceeded_class)
 *   is called once, before any scope or shield is entered (entering one
 *   before raises RuntimeError).
 *   Hook protocol: a scope may carry hook(scope, event, exc).  "enter" is
 *   called in the guarded thread before anything is armed (if it raises, the
 *   scope is not entered and nothing is left armed); "exit" after the
 *   deadline is disarmed, shielded from interrupts, before DeadlineExceeded
 *   is raised, with the exception the block ended with (or None); an
 *   exception from it is reported as unraisable.  _set_default_hook(h) gives
 *   h to every scope created afterwards.
 *   One interpreter only: the core's state is process-wide; the module must
 *   be exported and used in the main interpreter (not in subinterpreters).
 *
 * THREADS, GIL AND LOCKS
 *   - Every function of the Python-facing module runs WITH the GIL.  Scope and
 *     Shield __enter__/__exit__, sleep() and checkpoint() run in the guarded
 *     thread and never release the GIL between "block finished" and
 *     "disarmed and pending interrupt taken back": that keeps an interrupt
 *     from surfacing after a block has exited.  They are plain PyCFunctions,
 *     never cffi `lib` calls (cffi drops the GIL around those).
 *   - reschedule() (and so cancel()) and _raise_in_scope() may be called from
 *     any thread; they take effect under the GIL like everything else.
 *   - Slot fields and who writes them, under which lock: tc_internal.h.  In
 *     short: the scope stack (Python objects) only with the GIL; the atomics
 *     deadline/state/gen are written with the GIL by the owner, the watchdog
 *     (fire, re-inject) and any thread through reschedule()/cancel(), and
 *     without it only at thread exit and in the fork child; the watchdog's
 *     planner reads them without the GIL.
 *   - The watchdog never holds the registry mutex (g_mu) while it waits for
 *     the GIL; it may take g_mu while holding the GIL.  The thread-exit
 *     destructor takes only g_mu, never the GIL.
 *   - The delivery hook (tc_hook_*.c) runs in the guarded thread, with the
 *     GIL, from a trace or monitoring callback; it reads the slot's pending
 *     fields, which only GIL holders write.  Whoever delivers (the
 *     watchdog, a cancelling thread, the guarded thread itself) arms it with
 *     the GIL.  The fast window's switch interval is written under
 *     g_fast.mu, with or without the GIL (accel_fast_window.c).
 *   - Free-threaded, the self-fire's triggers (accel_self_fire_trigger.c)
 *     are made by the guarded thread and dropped by the watchdog, attached,
 *     holding no lock; their deallocation runs in the guarded thread at its
 *     eval-breaker check (anywhere else it only ends the round), waits a
 *     bounded time without any lock, and decides inside the core lock.
 *   - The functions declared below (the cffi `lib`) are called by cffi
 *     WITHOUT the GIL, from any thread; tc_export() takes the GIL itself.
 *
 * ASYNC-SIGNAL-SAFETY
 *   The signal handler (tc_os.c: tc_handler) runs in the guarded thread.
 *   Its purpose is to exist: installed without SA_RESTART, it makes the
 *   thread's blocking system call fail with EINTR.  The core's part saves
 *   and restores errno and bumps a relaxed atomic counter -- all it does
 *   with every accelerator off.  For a signal of the thread's own kernel
 *   timer (SI_TIMER, si_value = its slot; slots are never freed) it hands
 *   the slot to the accelerators' part (tc_accel.c: accel_on_signal, which
 *   says why these two cannot move out of the handler), all without a lock,
 *   allocation or Python API call:
 *   - 3.11, the sleeping tracer's alarm (accel_sleeping_tracer.c:
 *     sleeping_tracer_on_signal):
 *     atomic loads and stores on the slot, clock_gettime, one relaxed byte
 *     store into its own thread's cframe->use_tracing (a CPython tracing
 *     field; the races with other writers are set out there), a relaxed
 *     read of the GIL's locked/last_holder (tc_gil.c: tc_gil_holder),
 *     timer_settime to re-arm the timer as the backstop, and a wake of the
 *     watchdog (an atomic add and FUTEX_WAKE);
 *   - the watchdog's backstop (accel_placement_rescue.c:
 *     rescue_on_signal, rescue_move): atomic loads, getcpu, a try-lock (an atomic exchange that
 *     gives up when taken) around sched_getaffinity/sched_setaffinity of
 *     the watchdog thread (it moves it to this CPU), the watchdog's futex
 *     wake, and sched_yield.
 *   timer_settime and clock_gettime are async-signal-safe by POSIX; the
 *   others are raw Linux system calls and atomics, which take no user-space
 *   lock and cannot deadlock with the code they interrupt.  Decisions are
 *   taken from the slot's state, never from the signal, so a stale or late
 *   signal is harmless.  The pthread_atfork child
 *   handler is not a signal handler: it runs in the child right after fork(),
 *   where only the forking thread exists, unlocks the registry mutex that
 *   thread took in the prepare handler, and otherwise uses raw syscalls and
 *   plain stores.
 *
 * CPYTHON INTERNALS
 *   Supported: CPython 3.11-3.14 with the GIL, and free-threaded 3.14t
 *   (where the core lock of tc_lock.h stands in for the GIL in every "with
 *   the GIL" above).  Which private fields and functions are used on which
 *   version: tc_compat.h, the only file that tests PY_VERSION_HEX but for
 *   tc_gil.c (with tc_gil_check.c), the one unit built with the internal
 *   headers.  Every address that unit uses is
 *   checked at import against the interpreter's public API; if one fails,
 *   the accelerators that need them are off and the core runs without them.
 *
 * ACCELERATORS
 *   Every deadline is delivered by the core alone; the latency accelerators
 *   (tc_accel.h: each, and where it is switched) only make some land
 *   sooner.  Which are on is decided once at import: what the build
 *   supports, TIMEOUTCORE_ACCEL (all | none | name,name), the import check.
 *
 * RESOURCES AND THEIR OWNERS
 *   - kernel timer: created with the slot, deleted by the pthread key
 *     destructor when its thread exits (timer_create fails with EAGAIN past
 *     RLIMIT_SIGPENDING: OSError, nothing left armed);
 *   - watchdog: started lazily by the first scope entered with a deadline,
 *     stopped and joined by _shutdown() (registered with atexit, and called
 *     before fork so no lock or thread is carried across it), restarted by
 *     _ensure_watchdog() after fork, in parent and child, where a live slot
 *     has a deadline;
 *   - signal handler: installed once; refused (never clobbered) if someone
 *     else already handles the chosen signal (env TIMEOUTCORE_SIGNAL);
 *   - the lowered switch interval: the watchdog's; put back when no deadline
 *     is due and no fired interrupt is waiting (at most TC_FAST_HOLD_NS after
 *     a fire), and when the watchdog stops (exit, before fork);
 *   - the delivery hook: armed per pending delivery, disarmed when it raises
 *     or the delivery is taken back (block exit, shield); sys.monitoring
 *     events are switched off when no delivery is pending.
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
    uint64_t hook_raises;      /* interrupts raised by the in-thread hook   */
    uint64_t hook_defers;      /* hook calls that found protected code      */
    uint64_t hook_calls;       /* hook calls with something pending         */
    uint64_t backstops;        /* watchdog nudges of a still-pending hook   */
    uint64_t async_fallbacks;  /* raised asynchronously without a hook      */
    uint64_t fast_windows;     /* times the switch interval was lowered     */
    uint64_t fast_ns;          /* ... and the time it stayed lowered (ns)   */
    uint64_t prearms;          /* hooks armed ahead of a deadline           */
    uint64_t self_fires;       /* deadlines a pre-armed thread fired itself */
    uint64_t hooked_now;       /* threads whose delivery hook is armed now  */
    uint64_t rewait_errors;    /* GIL waiters not woken at a window (errno) */
    uint64_t gil_holds;        /* GIL held up to a deadline, not pre-armed  */
    uint64_t prepared;         /* exceptions built by the watchdog ahead    */
    uint64_t direct_raises;    /* interrupts sent to a thread paused at a
                                  back-edge, decided from outside         */
    uint64_t pending_calls;    /* self-fire calls queued for a thread that
                                  held the GIL at its deadline (3.12+)    */
    uint64_t pending_raises;   /* ... deadlines such a call raised        */
    uint64_t pending_handovers; /* ... handed to the hook at once: the loop's
                                  back-edge could not take the raise     */
    uint64_t watch_sleeps;     /* ... deadlines the watchdog slept up to
                                  instead of spinning: it was on the
                                  thread's CPU                            */
    uint64_t remote_cancels;   /* cancels read off the registry's control
                                  channel without the GIL (remote_relay)  */
    uint64_t remote_relays;    /* ... of them fired by the GIL's holder at
                                  the watchdog's request (tc_deliver_steps.c) */
    uint64_t exit_lingers;     /* fired blocks' exits that held the fast
                                  window open past their return: a waiter
                                  had asked for the GIL (fast_window)     */
    uint64_t pins;             /* free-threaded: the watchdog's moves to
                                  a guarded thread's CPU ahead of a
                                  pre-armed deadline (tc_wd_main.c)      */
    uint64_t rescues;          /* the watchdog moved to a guarded thread's
                                  CPU by its backstop timer: it had not
                                  run since the deadline (tc_watchdog.c) */
    uint64_t tracer_sleeps;    /* 3.11: pre-armed tracers put to sleep
                                  until their deadline (tc_hook_trace.c) */
    uint64_t tracer_alarms;    /* ... woken there by the thread's own
                                  timer signal                           */
    uint64_t back_waits;       /* 3.12+: deadlines due while their thread
                                  was off the GIL, left for it to fire
                                  itself once back (tc_wd_fire.c)        */
    uint64_t exit_expiries;    /* blocks whose deadline had passed at their
                                  exit with no fire: expired there, the
                                  backstop (tc_scope.c)                  */
    uint64_t due_relays;       /* 3.12+: deadlines fired by the GIL's holder
                                  that ran the slot's self-fire call in
                                  its stead (tc_deliver_steps.c)         */
    uint64_t dropped;          /* interrupts CPython reported as ignored
                                  (an unraisable context), sent again
                                  (tc_unraisable.c)                      */
    uint64_t dropped_learned;  /* ... code objects learned there         */
    uint64_t bad_moves;        /* slot state changes outside the table of
                                  tc_slot.c: 0 unless the core is wrong  */
};

/* Build the Python-facing module (see above) and register it in sys.modules
 * under `modname`.  Takes the GIL itself.  Returns 0, or -1 after printing
 * the Python exception that made it fail (PyErr_Print, which clears it):
 * the caller raises ImportError. */
int tc_export(const char *modname);

/* Copy the counters.  Any thread, no GIL needed. */
void tc_get_stats(struct tc_stats *out);

/* The signal number in use, or 0 before the first scope was entered. */
int tc_signal_number(void);

/* Kernel thread id of the watchdog, or 0 when it is not running. */
int tc_watchdog_tid(void);

/* The latency accelerators (tc_accel.h), decided at tc_export: how many;
 * the i-th's name; 1 if it is active; why it is off (NULL while active);
 * TIMEOUTCORE_ACCEL's names that are none of them ("" if none); the import
 * check of CPython internals ("passed", "not checked", or why it failed).
 * Any thread, after tc_export. */
int tc_accel_count(void);
const char *tc_accel_name(int i);
int tc_accel_active(int i);
const char *tc_accel_why(int i);
const char *tc_accel_unknown(void);
const char *tc_accel_internals(void);
/* Why the core itself must not run here, or NULL: the thread-state fields it
 * reads (tc_compat.h) failed the import check.  timeoutcore._native then
 * refuses to load, and the pure-Python engine takes over where it can. */
const char *tc_accel_core_refused(void);

/* Benchmark helper: `n` arm+disarm pairs of this thread's kernel timer (what
 * arming at every block entry would cost).  Returns 0 or an errno. */
int tc_bench_timer_pair(long n);

/* cdef-end */

#endif /* TIMEOUTCORE_H */
