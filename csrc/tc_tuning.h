/*
 * tc_tuning.h -- every tuning constant of the core, in one table.
 *
 * A tuning constant is a number the core would work with at any other
 * sensible value: it moves latency or cost, never correctness.  Grouped by
 * the accelerator that uses it (names as in tc_accel.h), or "core" when the
 * core alone uses it.  Each entry: what it bounds and why (one line), and
 * the benchmark that shows its effect (benchmarks/<file> <test>; the
 * cases of bench_accelerators.py are named after "case:").  Almost all were
 * settled on one machine class (2 vCPUs, up to 3 or 7 spinning threads):
 * re-measure with those benchmarks before changing one, and put the figures
 * in the commit message and the benchmark's result file, not here.
 *
 * Not here: units (TC_NS_PER_S), argument bounds the Python engine shares
 * (TC_MAX_SECONDS), sizes of buffers and batches (accel_remote_relay.c,
 * tc_watchdog.c: TC_SWEEP_BATCH), and whatever a CPython version decides (tc_compat.h).
 * Included by tc_internal.h.
 */
#ifndef TC_TUNING_H
#define TC_TUNING_H

/* -- core --------------------------------------------------------------------- */

/* Re-injection while a body swallows the interrupt: the first retry soon,
 * doubling so that a body that keeps swallowing costs the watchdog little.
 * Bench: none (a body that swallows is a correctness case: tests/test_scope.py). */
#define TC_REINJECT_FIRST_NS 2000000LL      /* 2 ms                          */
#define TC_REINJECT_MAX_NS 100000000LL      /* 100 ms                        */
/* How long an interrupt the body still holds -- caught and kept to be
 * raised again later -- holds its re-injection back (tc_slot.c:
 * interrupt_held): one that is handed on (a hook caller's loop) goes within
 * microseconds, a stall of a loaded machine included; one that is kept for
 * good (a log handler holding the record) must not make the block run on
 * for ever.  Bench: none (a bound on a correctness case:
 * tests/test_scope.py). */
#define TC_REINJECT_HELD_MAX_NS 1000000000LL /* 1 s                          */
/* The switch interval assumed until sys.getswitchinterval() is first read:
 * CPython's own default.  Bench: none (CPython's value). */
#define TC_SWITCH_DEFAULT_NS 5000000LL      /* 5 ms                          */
/* The watchdog's time slice (tc_os.c: os_short_slice).  On Linux 6.12+ a
 * woken fair-class thread preempts the running one only if its slice is
 * shorter: with the default slice the watchdog, woken at a deadline, waited
 * for a CPU behind the busy threads.  It runs for microseconds at a time;
 * with a GIL its wait is for the GIL, which this does not change.  Bench:
 * bench_contention.py test_contention_overshoot (free-threaded). */
#define TC_WD_SLICE_NS 100000ULL            /* 100 us                        */
/* The longest a scope's entry waits, GIL released, for the watchdog it has
 * just started to be ready (tc_wd_main.c: wd_ensure): a bound on a first
 * entry's stall, long past any start seen.  Bench: none (a bound on a
 * failure, never reached in a run). */
#define TC_WD_READY_MAX_NS 50000000LL       /* 50 ms                         */
/* 3.12+: the watchdog switches the delivery events off only once no hook
 * was armed for this long (hook_idle_off): free-threaded, every switch
 * stops the world, and deadlines firing close together arm without one.
 * Bench: bench_accelerators.py case: cpu_pool (3.14t). */
#define TC_EVENTS_HOLD_NS 5000000LL         /* 5 ms                          */
/* Free-threaded: line boundaries the hook skips, rather than park, while
 * another thread holds the core lock (hook_core_busy); then it waits, so a
 * lock held over and over cannot starve it.  Bench: bench_contention.py
 * test_contention_overshoot (3.14t). */
#define TC_HOOK_MAX_SKIPS 256
/* How long switching the delivery events lately took: a maximum that decays
 * by 1/TC_EVENTS_COST_DECAY a switch (tc_hook_monitoring.c: events_learn).
 * Bench: bench_accelerators.py case: hogs3 (3.14t). */
#define TC_EVENTS_COST_DECAY 8

/* -- anticipation ------------------------------------------------------------- */

/* Lead = one switch interval (the longest a holder keeps the GIL once asked)
 * plus this margin for the watchdog's own wake-up.  Bench:
 * bench_overshoot.py test_overshoot (CPU loop in a worker, quiet). */
#define TC_LEAD_MARGIN_NS 1000000LL         /* 1 ms                          */
/* With the fast window the lead is its short interval plus this margin,
 * generous beside it: pre-arming takes the GIL only for a moment, so a
 * watchdog woken late or kept waiting for the GIL still pre-arms in time.
 * Where it holds the GIL up to the deadline instead (3.12+, crowded) the
 * early part stalls the process, but there the GIL rarely comes early.
 * Bench: bench_contention.py test_contention_overshoot. */
#define TC_LEAD_MARGIN_FAST_NS 800000LL     /* 800 us                        */
/* ... plus, in a crowded process, how much longer the watchdog lately
 * waited for the GIL (accel_anticipation.c: crowd_ns), capped here so a burst
 * cannot make the watchdog hold the GIL long before a deadline.  Bench:
 * bench_contention.py test_contention_overshoot (7 spinning). */
#define TC_LEAD_CROWD_MAX_NS 3000000LL      /* 3 ms                          */
/* The crowd is a running average over about this many waits
 * (anticipation_learn): one slow take does not move the lead much.
 * Bench: bench_contention.py test_contention_overshoot. */
#define TC_CROWD_WEIGHT 8
/* Requeue: a GIL that came in less than 1/TC_REQUEUE_QUICK_DIV of a switch
 * interval says the body releases it often (I/O-ish); if the deadline is
 * still more than TC_REQUEUE_MIN_LEFT_NS away, give it back and retake it
 * TC_REQUEUE_EARLY_NS before the deadline, so that a body about to finish
 * in time is not stopped early.  Bench: bench_overshoot.py test_overshoot
 * (sleep and C-call workloads). */
#define TC_REQUEUE_QUICK_DIV 2
#define TC_REQUEUE_MIN_LEFT_NS 300000LL     /* 300 us                        */
#define TC_REQUEUE_EARLY_NS 200000LL        /* 200 us                        */

/* -- fast_window ---------------------------------------------------------------- */

/* The switch interval while a deadline needs the GIL: short enough that the
 * watchdog, then the fired thread, get it soon next to busy threads; the
 * whole process switches more often meanwhile.  Bench: bench_contention.py
 * test_contention_overshoot and test_cpu_pool_under_deadlines (its cost). */
#define TC_FAST_SWITCH_US 200UL             /* 200 us                        */
/* How long after a fire the window stays open for an interrupt not yet
 * claimed: a delivery takes well under this once the thread runs; one that
 * waits longer is deferred or blocked, and the process should not pay for
 * fast switches meanwhile.  Bench: bench_contention.py
 * test_cpu_pool_under_deadlines. */
#define TC_FAST_HOLD_NS 20000000LL          /* 20 ms                         */
/* How long the window stays open after the exit that claimed an interrupt
 * returned (tc_scope.c: Scope_exit): the thread has yet to reach the
 * caller's handler, and closed at once the window made a thread that gave
 * the GIL away queue again at the user's interval.  Bench:
 * bench_contention.py test_contention_overshoot. */
#define TC_EXIT_LINGER_NS 1000000LL         /* 1 ms                          */
/* The longest the window stays open for a thread that took the GIL back for
 * urgent work (tc_module.c: _wait_readable) and has not said it is done: a
 * registry message read, parsed and applied is a little Python.  Bench:
 * bench_contrib.py test_cancel_to_stop_latency. */
#define TC_URGENT_MAX_NS 20000000LL         /* 20 ms                         */

/* -- prearm --------------------------------------------------------------------- */

/* Where the armed hook costs only the guarded thread (3.11's per-thread
 * tracer) or arming stops the world anyway (free-threaded), the watchdog
 * always pre-arms.  With a GIL on 3.12+ the events are interpreter-wide:
 * from the pre-arm to the deadline every thread runs instrumented code.
 * Alone, that costs only the guarded thread's own lines and saves the GIL
 * hand-over at the deadline; in a crowded process it costs every thread
 * more than holding the GIL up to the deadline does.  So there it pre-arms
 * only when the process is quiet (TC_PREARM_QUIET_NS, tc_wd_fire.c:
 * gil_busy).  Bench: bench_accelerators.py case: quiet and case: cpu_pool. */
#define TC_PREARM_ALWAYS (TC_HOOK_TRACE || TC_FREE_THREADED)
/* 3.12+ with a GIL: the GIL counts as quiet if it came within this long of
 * asking (nobody else queued for it).  Bench: bench_accelerators.py case:
 * cpu_pool. */
#define TC_PREARM_QUIET_NS 400000LL         /* 400 us                        */
/* The watchdog fires a pre-armed slot itself only this long after its
 * deadline: a thread running Python has fired itself by then; one that is
 * blocked in C or waiting for a CPU gets the watchdog's fire and kick.
 * Bench: bench_overshoot.py test_overshoot (C-call workload). */
#define TC_PREARM_GRACE_NS 100000LL         /* 100 us                        */
/* Free-threaded (tc_deliver.c: prearm_lead): arming switches sys.monitoring
 * events on, which stops the world, and a stop holds every thread -- the
 * guarded one too -- until each running thread reached a safe point; on an
 * oversubscribed machine that waits for the OS to schedule each busy
 * thread, in steps of the scheduler tick.  So the hook is armed
 * TC_PREARM_LEAD_STOPS times the longest recent stop ahead of a deadline,
 * between these bounds, and the stop is over well before the deadline.
 * Bench: bench_contention.py test_contention_overshoot (3.14t). */
#define TC_PREARM_LEAD_STOPS 2
#define TC_PREARM_LEAD_MIN_NS 10000000LL    /* 10 ms                         */
#define TC_PREARM_LEAD_MAX_NS 50000000LL    /* 50 ms                         */

/* -- self_fire ------------------------------------------------------------------ */

/* While a guarded thread holds the GIL ahead of its deadline, the watchdog
 * looks at the GIL's holder every TC_WATCH_POLL_NS instead of taking it and
 * spins the last TC_WATCH_SPIN_NS (a sleep wakes up late by about that);
 * past the deadline it looks every TC_WATCH_AFTER_NS until the thread has
 * fired, every TC_WATCH_SLOW_NS after TC_WATCH_MAX_NS; a due thread off
 * the GIL is watched for TC_WATCH_BACK_NS at most, then fired the usual
 * way -- and so, free-threaded, is one parked in futex() (round_asleep).
 * Bench: bench_contention.py test_contention_overshoot (3.12+). */
#define TC_WATCH_POLL_NS 100000LL           /* 100 us                        */
#define TC_WATCH_SPIN_NS 100000LL           /* 100 us                        */
#define TC_WATCH_AFTER_NS 30000LL           /* 30 us                         */
#define TC_WATCH_MAX_NS 2000000LL           /* 2 ms                          */
#define TC_WATCH_BACK_NS 5000000LL          /* 5 ms                          */
#define TC_WATCH_SLOW_NS 1000000LL          /* 1 ms                          */
/* Checks at no usable back-edge (code without loops) the pending call
 * accepts before it arms the hook instead.  Bench: bench_contention.py
 * test_contention_overshoot (3.12+). */
#define TC_PC_MAX_DECLINES 64
/* ... and a call that keeps running at the same unusable place (a loop
 * whose only breaker check is there) hands over after this long: each
 * check runs it again, and 3.12 spends microseconds a check on it; counted
 * as declines instead, such a loop waited for all of them.  Bench:
 * bench_accelerators.py case: quiet (3.12). */
#define TC_PC_SAME_NS 100000LL              /* 100 us                        */

/* -- prepare -------------------------------------------------------------------- */

/* The self-fire asks the thread to build its exception this long before
 * the deadline (prepare_before_due in the thread), so that it is ready
 * when due.
 * Bench: bench_contention.py test_contention_overshoot (3.12+). */
#define TC_WATCH_PREPARE_NS 450000LL        /* 450 us                        */
/* The exception is prepared (by the watchdog, or free-threaded by the
 * thread itself) only if at least this long is left: building it takes up
 * to about this when its code has gone cold.  Bench:
 * bench_overshoot.py test_overshoot. */
#define TC_PREPARE_MIN_LEFT_NS 300000LL     /* 300 us                        */

/* -- placement ------------------------------------------------------------------ */

/* Free-threaded (accel_placement_rescue.c: placement_before_sleep).  With more busy threads than
 * CPUs the guarded thread is off its CPU at a random instant about half the
 * time, and then waits for the scheduler's tick behind a busy thread.  The
 * watchdog's wake-up at the grace's end is a scheduling point, but only on
 * the CPU it wakes on: woken on the guarded thread's CPU it preempts the
 * busy thread there (its short slice, TC_WD_SLICE_NS), and when it sleeps
 * again the fair scheduler picks the thread that waited longest, the
 * guarded one.  So TC_PIN_AHEAD_NS before such a deadline the watchdog
 * moves to the CPU the thread's hook last ran on (the slot's `cpu`), and
 * back to its own CPU set once the block has claimed the interrupt and
 * nothing pre-armed is next.  Bench: bench_contention.py
 * test_contention_overshoot (3.14t). */
#define TC_PIN_AHEAD_NS 1000000LL           /* 1 ms                          */
/* ... and once it has fired such a deadline the thread may not be the
 * fair scheduler's pick yet (it ran last: the busy thread is owed its turn
 * first); each time the watchdog goes to sleep on that CPU is a new pick,
 * so while the interrupt waits for the thread it wakes every
 * TC_PIN_NUDGE_NS, for at most TC_PIN_NUDGE_FOR_NS (two scheduler ticks at
 * HZ=250); without, those deliveries waited for the re-injection.  Bench:
 * bench_contention.py test_contention_overshoot (3.14t). */
#define TC_PIN_NUDGE_NS 500000LL            /* 500 us                        */
#define TC_PIN_NUDGE_FOR_NS 8000000LL       /* 8 ms                          */

/* -- rescue --------------------------------------------------------------------- */

/* The watchdog's backstop (accel_placement_rescue.c: rescue_on_signal).  A watchdog woken on
 * the other CPU may be runnable there and not run -- a kernel thread holding
 * that CPU is not preempted -- while the guarded thread holds this one.  So
 * the thread's own kernel timer is armed this long past the deadline (by
 * the watchdog before it sleeps for it, and by a block entry that wakes the
 * watchdog or finds it overdue); if it expires before the watchdog ran
 * since the deadline, its handler, in the guarded thread, moves the
 * watchdog to its own CPU and yields to it; the watchdog acts and goes back
 * to its own CPU set before it sleeps again.  Long enough that a watchdog
 * that runs never needs it.  Bench: bench_overshoot.py test_overshoot (the
 * tail of a short deadline in a quiet worker); the rescue itself is pinned
 * by tests/accelerators/test_rescue.py (a watchdog behind a real-time hog). */
#define TC_BACKSTOP_NS 300000LL             /* 300 us                        */

/* -- remote_relay --------------------------------------------------------------- */

/* After marking remote cancels the subscriber lets the GIL go to the
 * cancelled jobs first, checking every TC_REMOTE_YIELD_STEP_NS, for at most
 * TC_REMOTE_YIELD_NS (a job in protected code, or blocked, holds it no
 * longer).  Bench: bench_contrib.py test_cancel_to_stop_latency. */
#define TC_REMOTE_YIELD_NS 5000000LL        /* 5 ms                          */
#define TC_REMOTE_YIELD_STEP_NS 100000LL    /* 100 us                        */

#endif /* TC_TUNING_H */
