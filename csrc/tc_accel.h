/*
 * tc_accel.h -- the latency accelerators: which exist, whether each is on,
 * and the interface through which the core calls them.
 *
 * What an accelerator is.  The core delivers every deadline with all of
 * them off (later, never lost); each one only makes some deadlines land
 * sooner.  Which are on is decided once at import (tc_accel.c:
 * accel_setup, GIL held) from three things: whether this build supports it
 * (tc_compat.h's switches), TIMEOUTCORE_ACCEL, and, for those that use
 * CPython internals, the import check of their addresses (tc_gil_check.c).
 * accel_on() is read anywhere after that, by any thread and from the
 * signal handler: a plain int written before the watchdog, any kernel
 * timer or any hook exists.
 *
 * The interface (contract).
 *   Where.  Each accelerator lives in csrc/accel_<name>.c (the unity build
 *   includes it; timeoutcore.c lists them) and is called by the core only
 *   through the hooks declared below, at the named points of the core's
 *   path.  A hook whose accelerator is off (or not built: every hook the
 *   core calls unconditionally exists on every build) does nothing and
 *   returns the core's own answer (0, TC_NEVER, the wake-up it was given),
 *   so the core's path reads "core step; accelerator hooks", and with
 *   TIMEOUTCORE_ACCEL=none it is the core alone.  Bookkeeping that only
 *   reports runs either way (anticipation_learn's crowd, the remote arms
 *   the registry makes, the watchdog's start set for a rescue).  A hook
 *   never moves a slot between states itself: a fire is the core's
 *   slot_fire, a deadline change ends in the core's slot_deadline_set, as for
 *   any other caller.
 *   State.  An accelerator's process-wide state is one static struct in its
 *   own file.  What it keeps per slot or per scope is a struct of its own
 *   type, declared below with its hooks and embedded in tc_slot / Scope
 *   (tc_internal.h), because the watchdog without the GIL and the signal
 *   handler find a slot's state with no lookup; only the accelerator's own
 *   file reads or writes those fields (the core clears them only through
 *   the accelerator's fork hook).  Its counters stay in g_st: stats() is
 *   the core's export, and its keys do not change with the file layout.
 *   Tuning constants stay in tc_tuning.h (one table).
 *   Left in the core's structs, because the core reads or writes them
 *   itself: tc_slot.prearmed (a delivery sub-state every fire clears, the
 *   exit and deliver_cancel undo, the planner plans by), fast_until,
 *   exit_until and linger_until (a fired interrupt on its way, a claiming
 *   exit: the planner's looks read them), backstop_gen (the slot's kernel
 *   timer, shared by the kick, the rescue's backstop and the sleeping
 *   tracer's alarm), cpu (written by the thread for placement and the
 *   self-fire's spin), tstate_id and async_pending (the thread-state
 *   lookup; the fallback delivery direct delivery reuses), and the hook's
 *   event-switching cost (tc_deliver.c), from which prearm_lead is made.
 *   Threads, GIL, signals.  Each hook below says who calls it, in which
 *   thread, with or without the GIL (free-threaded: the core lock,
 *   tc_lock.h, wherever "GIL" is written), which of the core's locks may
 *   be held, and whether it may run in the signal handler.  A hook that
 *   runs without the GIL touches no Python object; one called in the
 *   signal handler uses only atomics and async-signal-safe system calls.
 *   Import.  <name>_unsupported(), each in its accelerator's file: at
 *   import (tc_accel.c: accel_setup, GIL held, once), NULL if this build
 *   can have it, else why not ("unsupported on this CPython (...)"), from
 *   tc_compat.h's switches only.  Which ones need CPython internals or
 *   another accelerator is tc_accel.c's (accel_uses_internals,
 *   accel_needs): a decision across accelerators, made in one place.
 *
 * Files: accel_anticipation.c, accel_fast_window.c, accel_self_fire.c (and,
 * free-threaded, accel_self_fire_trigger.c),
 * accel_prearm.c, accel_sleeping_tracer.c, accel_direct_delivery.c,
 * accel_prepare.c, accel_placement_rescue.c (placement and rescue: one
 * mechanism), accel_remote_relay.c, accel_frame_address.c.
 */
#ifndef TC_ACCEL_H
#define TC_ACCEL_H

enum {
    ACCEL_ANTICIPATION,
    ACCEL_FAST_WINDOW,
    ACCEL_SELF_FIRE,
    ACCEL_PREARM,
    ACCEL_SLEEPING_TRACER,
    ACCEL_DIRECT_DELIVERY,
    ACCEL_PREPARE,
    ACCEL_PLACEMENT,
    ACCEL_RESCUE,
    ACCEL_REMOTE_RELAY,
    ACCEL_FRAME_ADDRESS,
    ACCEL_N
};

static int g_accel_on[ACCEL_N]; /* accel_setup, once, before any reader */

static inline int accel_on(int a) { return g_accel_on[a]; }

static int accel_setup(void); /* tc_accel.c: at import, GIL held */

/* At import, GIL held: NULL, or why this build cannot have it. */
static const char *anticipation_unsupported(void);
static const char *fast_window_unsupported(void);
static const char *self_fire_unsupported(void);
static const char *prearm_unsupported(void);
static const char *sleeping_tracer_unsupported(void);
static const char *direct_delivery_unsupported(void);
static const char *prepare_unsupported(void);
static const char *placement_unsupported(void);
static const char *rescue_unsupported(void);
static const char *remote_relay_unsupported(void);
static const char *frame_address_unsupported(void);

struct tc_slot;

/* -- remote_relay (accel_remote_relay.c) -------------------------------------
 * A cancel read off the Redis registry's control channel, applied without
 * the GIL: the subscriber's wait peeks at the reply, marks the armed scope
 * and its slot, and wakes the watchdog, which fires the slot as a deadline
 * that has passed. */

/* Per slot: a scope of it was marked (written by the control channel's
 * reader without the GIL; `at` before `req`). */
struct remote_relay_slot {
    _Atomic int req;
    _Atomic int64_t at;
};

/* Per scope: a cancel for it came off the control channel. */
struct remote_relay_scope {
    _Atomic int cancel;
};

/* The module's _wait_readable(control=True), WITHOUT the GIL, once the
 * subscriber's socket `fd` is readable: mark every armed scope a complete
 * cancel queued there names, and if that was all there was, wait a moment
 * for the cancelled jobs to have the GIL first.  1 if so (the caller takes
 * the GIL back without urgency), 0 if the Python path has work there. */
static int remote_relay_on_readable(int fd);

/* The watchdog's planner and due tests, the self-fire, pc_fire: any thread,
 * with or without the GIL, g_mu may be held; atomics only.  When a relayed
 * cancel made slot `s` due (TC_NEVER: none). */
static int64_t remote_relay_marked_at(struct tc_slot *s);

/* At fire time (slot_fire, pc_fire) and as a shield ends (slot_held), GIL
 * held: turn the marks on slot `s` into cancels, as DeadlineScope.cancel()
 * does them. */
static void remote_relay_apply(struct tc_slot *s, int64_t now);

/* pthread_atfork, in the forking thread (prepare, parent) and in the child
 * where only it exists (child: plain stores on every slot, g_mu's walk
 * without it). */
static void remote_relay_atfork_prepare(void);
static void remote_relay_atfork_parent(void);
static void remote_relay_atfork_child(void);

/* -- anticipation (accel_anticipation.c) ------------------------------------
 * With a GIL, the watchdog asks for the GIL ahead of a deadline by a lead:
 * one switch interval, a margin, and the crowd it lately queued behind.
 * Off, or free-threaded: the lead is 0, the GIL is asked for at the
 * deadline, and so there is no requeue and no holding it up to it. */

/* Any thread, no lock, atomics only: the lead, in ns (0: none). */
static int64_t anticipation_lead(void);

/* The watchdog holding the GIL (and wd_ensure): re-read the switch
 * interval (sys.getswitchinterval, from sys.modules) and set the lead. */
static void anticipation_refresh(void);

/* The watchdog, just after it took the GIL ahead of a deadline: it waited
 * `waited` ns (the crowd's average learns from it). */
static void anticipation_learn(int64_t waited);

/* Any thread: the switch interval it plans with (the requeue's test), and
 * all three figures (the module's _anticipation()). */
static int64_t anticipation_switch_ns(void);
static void anticipation_figures(int64_t *lead, int64_t *switch_ns, int64_t *crowd_ns);

/* -- fast_window (accel_fast_window.c) ---------------------------------------
 * The GIL switch interval lowered while the watchdog, then a fired thread,
 * needs the GIL.  Switched by the interval's address (tc_compat.h:
 * tc_switch_setup, called by accel_setup): without it, tc_lower_switch_
 * supported() is 0 and every hook here does nothing.  The window's mutex
 * is never held together with g_mu. */

/* The planner, under g_mu, with or without the GIL (tc_watchdog.c: wd_plan), for
 * each live slot: until when it keeps the window open, and when to look
 * again without acting (a fired thread holding the GIL needs no window). */
static void fast_window_plan(struct tc_slot *s, int64_t now, int64_t *fast_until,
                             int64_t *look_at);

/* The watchdog, with or without the GIL: open / close the window. */
static void fast_enter(void);
static void fast_leave(void);

/* The watchdog, without the GIL, just before and after it takes the GIL:
 * the window opens for the take, and a claim meanwhile leaves it open. */
static void fast_window_take_begin(void);
static void fast_window_take_end(void);

/* A scope's exit that claimed its interrupt (GIL held, the slot's own
 * thread), about to return: close the window, or keep it open a moment
 * while this thread gives the GIL away on its way out. */
static void fast_after_claim(struct tc_slot *s);

/* Any thread, without the GIL (tc_module.c: _wait_readable): this thread
 * takes the GIL back for urgent work -- open the window until it is done. */
static void wd_urgent_begin(void);
static void wd_urgent_end(void);

/* The watchdog's loop, no GIL: until when urgent takes keep the window
 * open (0: none). */
static int64_t fast_window_urgent_until(void);

/* pthread_atfork (its mutex), and the fork child's watchdog reset (the
 * user's interval back, no urgent thread left). */
static void fast_window_atfork_prepare(void);
static void fast_window_atfork_parent(void);
static void fast_window_atfork_child(void);
static void fast_window_after_fork(void);

/* -- placement, rescue (accel_placement_rescue.c) ----------------------------
 * Where the watchdog thread runs: placement (free-threaded) moves it to the
 * CPU of the thread whose pre-armed deadline it will fire, rescue moves a
 * starved watchdog to the CPU of a guarded thread whose backstop timer
 * fired.  One file: both move the watchdog's affinity, under one lock. */

/* The watchdog thread, as it starts (no GIL). */
static void rescue_watchdog_start(void);

/* The watchdog, before it sleeps for its next event -- slot `s`'s deadline
 * of generation `gen` (s NULL, deadline TC_NEVER: none): back to its own
 * CPU set after a rescue, and the slot's backstop timer armed (g_mu taken
 * briefly).  No GIL. */
static void rescue_before_sleep(struct tc_slot *s, uint64_t gen, int64_t deadline);

/* Any thread, GIL or not, the slot's thread alive (wd_notify: a deadline
 * the watchdog may not wake for in time): arm slot `s`'s backstop timer
 * for its deadline of generation `gen`, once per gen.  One system call. */
static void rescue_arm(struct tc_slot *s, uint64_t gen, int64_t deadline);

/* The signal handler (tc_os.c: tc_handler), in slot `s`'s thread, when the
 * signal came from its timer and was no sleeping tracer's alarm.
 * Async-signal-safe: atomics, getcpu, a try-locked sched_setaffinity of
 * the watchdog, a futex wake, sched_yield. */
static void rescue_on_signal(struct tc_slot *s);

/* -- prearm (accel_prearm.c) -------------------------------------------------
 * The delivery hook armed ahead of a deadline; the guarded thread fires its
 * own deadline at its first line boundary past it, and the watchdog fires
 * it only at the grace's end.  With a GIL it needs anticipation (the
 * watchdog holds the GIL ahead); the sleeping tracer and the placement
 * need it. */

/* The watchdog holding the GIL (free-threaded: attached) ahead of slot
 * `s`'s deadline of generation `gen`, no lock of ours: arm the hook.  1 if
 * armed (the watchdog lets the GIL go and comes back at the grace's end). */
static int prearm_ahead(struct tc_slot *s, uint64_t gen);

/* 3.11, the slot's own thread at a scope's entry that set its deadline,
 * GIL held, before wd_notify: a deadline nearer than the lead is pre-armed
 * here (the tracer asleep until it).  Nothing on other builds. */
static void prearm_on_enter(struct tc_slot *s, int64_t now);

/* Any thread, no lock: how long before a deadline the watchdog arms the
 * hook (free-threaded; 0 with a GIL, or off). */
static int64_t prearm_lead(void);

/* The delivery hook, in the guarded thread, at a line boundary: is the
 * slot pre-armed and due (no lock; free-threaded it notes the thread's CPU
 * for the placement)?  Then prearm_fire, with the GIL / core lock, fires it
 * here. */
static inline int prearm_due(struct tc_slot *s);
static void prearm_fire(struct tc_slot *s);

/* -- sleeping_tracer (accel_sleeping_tracer.c) -------------------------------
 * 3.11: a pre-armed thread's tracer in place but asleep (its cframe's
 * use_tracing 0) until its deadline, when its own timer's signal wakes it.
 * Every hook exists on every build; without TC_HOOK_TRACE they do nothing. */

/* Per slot (3.11 only: embedded under TC_HOOK_TRACE).  `dormant` and
 * `waking` are the handshake with the signal handler (the file's Races). */
struct sleeping_tracer_slot {
    _Atomic int dormant;  /* in place, off until the deadline             */
    _Atomic int waking;   /* the thread's handler is turning it on        */
    PyThreadState *ts;    /* whose (the slot's thread's own)              */
};

/* GIL, right after the pre-arm's hook_arm (the watchdog, or the slot's
 * thread at its scope's entry): put the tracer to sleep until `deadline`,
 * the slot's timer set for it.  Nothing if someone else's tracer or
 * profiler is there, or if the accelerator is off. */
static void sleeping_tracer_sleep(struct tc_slot *s, PyThreadState *t, int64_t deadline);

#if TC_HOOK_TRACE
/* GIL (tc_hook_trace.c: hook_arm, hook_disarm, hook_nudge): no longer
 * asleep; with `on`, it traces from the thread's next instruction. */
static void sleeping_tracer_wake(struct tc_slot *s, PyThreadState *t, int on);
#endif

/* The signal handler (tc_os.c: tc_handler), in slot `s`'s thread, for a
 * signal of its timer: 1 if it was the tracer's alarm (it woke it), 0 if
 * not (the rescue's backstop, a kick).  Async-signal-safe: atomics, a clock
 * read, a relaxed read of the GIL's holder, timer_settime, a futex wake,
 * and one byte store into the thread's own cframe. */
static int sleeping_tracer_on_signal(struct tc_slot *s);

/* GIL (slot_deadline_set, prearm_on_enter): the slot's effective deadline
 * changed to `d`; a sleeping tracer's alarm follows it.  1 if the slot's
 * timer is the alarm's (the core then leaves the backstop alone). */
static int sleeping_tracer_follow(struct tc_slot *s, int64_t d);

/* Any thread, no lock (the planner, wd_notify): is the tracer asleep? */
static int sleeping_tracer_asleep(struct tc_slot *s);

/* -- direct_delivery (accel_direct_delivery.c) -------------------------------
 * 3.11 and 3.12: an interrupt for a thread paused at a loop's back-edge,
 * sent as an asynchronous exception with no delivery hook armed. */

/* deliver_async, first, GIL held, in the deliverer (the watchdog, a
 * cancelling thread), the slot's thread `t` paused: send `exc` for `scope`
 * that way if it is the hard interrupt and the paused thread's place is a
 * safe one.  1 if sent (the core's delivery is then done), 0 if the core
 * delivers as usual. */
static int direct_delivery_try(struct tc_slot *s, PyThreadState *t, PyObject *exc,
                               PyObject *scope);

/* -- self_fire (accel_self_fire.c, accel_self_fire_trigger.c) ----------------
 * 3.12+: a thread fires its deadline itself, at its own eval-breaker check,
 * where the interrupt surfaces at a loop's back-edge.  With a GIL, a thread
 * that holds the GIL at its deadline runs the decision in a pending call,
 * and the watchdog watches it without asking for the GIL; free-threaded, the
 * watchdog hands the thread a trigger object the thread owns, whose
 * deallocation runs the decision there (no interpreter-wide events, no
 * other thread involved). */

/* Per slot.  The watch's fields: the watchdog only (no GIL), watch_at and
 * watch_gen read by the planner too (self_fire_look_at); the call's: the
 * slot's thread, GIL held.  Free-threaded, `trigger` is made by the slot's
 * thread and taken by the watchdog, each inside the core lock or the slot's
 * own lock (tc_lock.h: the owner holds one, the watchdog both). */
/* Free-threaded: a round of two triggers (accel_self_fire_trigger.c). */
struct self_fire_round {
    _Atomic int phase;           /* ROUND_*                                */
    _Atomic uint64_t seq;        /* the latest round's number              */
    _Atomic uint64_t armed;      /* the round whose A set the bit (0: none) */
    PyObject *_Atomic b;         /* the second, once the watchdog has it
                                    (taken by an exchange: no lock)        */
    unsigned restarts;           /* the thread's own rounds (its parity
                                    picks their length), owner thread only */
    uint64_t parked_in;          /* watchdog: the round whose thread it saw
                                    parked in futex() ...                 */
    int64_t parked_at;           /* ... first at this time                */
};

struct self_fire_slot {
    PyObject *trigger[4];        /* free-threaded: the next round's A and
                                    B, P (the prepare's) and a spare A,
                                    made by the slot's thread (or NULL)   */
    struct self_fire_round round;
    _Atomic int pc_queued;       /* pc_fire is queued for it: set by the
                                    watchdog (no GIL), cleared by pc_fire  */
    _Atomic int64_t watch_at;    /* watched: when to look again (0: not);
                                    valid for ...                         */
    _Atomic uint64_t watch_gen;  /* ... this gen                          */
    uint64_t prepare_gen;        /* gen it asked to prepare for           */
    uint64_t kick_gen;           /* gen it kicked while watched ...       */
    int64_t kicked_at;           /* ... at its first round, at this time  */
    uint64_t back_gen;           /* gen it kicked off the GIL, due        */
    uint64_t free_gen;           /* gen it saw the GIL free for ...       */
    int64_t free_since;          /* ... first at this time (0 gen: none)  */
    const void *pc_frame;        /* GIL: where pc_fire last declined      */
    int pc_lasti;
    uint64_t pc_gen;             /* GIL: the gen its declines count for   */
    int pc_declines;             /* GIL: checks that were no usable
                                    back-edge, for that gen               */
    int pc_waiting;              /* GIL: pc_frame is a usable place where
                                    it waits (protected code, the
                                    collector): no count there            */
    int64_t pc_since;            /* GIL: when it first ran at pc_frame    */
};

/* The watchdog, no GIL, at slot `s`'s event for its deadline of
 * generation `gen`, before it takes the GIL: 1 if the self-fire watches
 * the slot (its thread holds the GIL, or will be fired from the GIL's
 * holder) -- the watchdog plans again; 0: it acts the usual way. */
static int self_fire_watch(struct tc_slot *s, uint64_t gen, int64_t deadline);

/* The planner, no GIL, g_mu held; atomics only: when the watch looks at
 * slot `s` next (0: not watched for its current generation). */
static int64_t self_fire_look_at(struct tc_slot *s);

/* The planner: how long ahead of a deadline the watch first looks
 * (free-threaded, to spin to the deadline: trigger_watch), or 0. */
static int64_t self_fire_lead(void);

/* The fork child (only the forking thread exists): the parent's watch and
 * queued calls are gone. */
static void self_fire_atfork_child(void);

/* The watchdog's sweep, g_mu held, atomics only: 1 if slot `s`, due, is left
 * to the self-fire's watch for now (free-threaded: its trigger is on its
 * way; firing it the usual way would switch the hook's events on). */
static int self_fire_owns(struct tc_slot *s);

/* The slot's own thread at a block's entry, inside the core lock or the
 * per-block path's locks: a trigger ready for its next deadline
 * (free-threaded). */
static void self_fire_on_enter(struct tc_slot *s);

/* A slot taken for a new thread (tc_slot.c: slot_get), GIL held, before it
 * is that thread's: a trigger its previous owner made goes. */
static void self_fire_slot_reuse(struct tc_slot *s);

/* At import, GIL held, if self_fire is on: 1 if its mechanism works on this
 * interpreter (free-threaded: trigger_check), else 0 with why in `why`. */
static int self_fire_check(char *why, size_t n);

/* -- prepare (accel_prepare.c) -----------------------------------------------
 * The DeadlineExceeded of the scope that will fire, built ahead of its
 * deadline for its exit to take. */

struct Scope;

/* Per scope: the exception built for its current deadline, or NULL
 * (strong; GIL / core lock). */
struct prepare_scope {
    PyObject *exc;
};

/* Per slot, its owner thread only: the gen it last tried to prepare for
 * itself (free-threaded: prepare_in_thread). */
struct prepare_slot {
    uint64_t tried_gen;
};

/* Ahead of slot `s`'s `deadline`, GIL held (free-threaded: attached),
 * holding no lock of ours: the watchdog holding the GIL for it, or the
 * slot's own thread in the self-fire's pending call.  Runs Python (the
 * exception's constructor); builds nothing with TC_PREPARE_MIN_LEFT_NS or
 * less left. */
static void prepare_before_due(struct tc_slot *s, int64_t deadline);

#if TC_FREE_THREADED
/* Slot `s`'s own thread at a hook event while its slot is pre-armed and
 * not yet due, attached, holding no lock of ours: once per pre-armed
 * deadline, build the exception here (prepare_before_due).  A load and a
 * compare when there is nothing to do. */
static void prepare_in_thread(struct tc_slot *s);
#endif

/* GIL: the scope's exit, which claims its interrupt -- the exception built
 * for it (a new reference, taken from the scope), or NULL. */
static PyObject *prepare_take(struct Scope *sc);

/* GIL: the scope's deadline changed, or it left the stack, or the GC
 * clears it: drop what was built (may run a finalizer). */
static void prepare_drop(struct Scope *sc);

/* GIL: what was built, borrowed (GC traverse, the `_prepared` view). */
static PyObject *prepare_peek(struct Scope *sc);

/* -- frame_address (accel_frame_address.c) ----------------------------------
 * The with statement's frame known by its interpreter frame's address, not
 * by a frame object made at entry.  GIL held (free-threaded: attached), no
 * lock of ours needed; enter and leave in the scope's own thread, is in
 * the delivery's stack walk (the hook, in that thread; with a GIL also
 * direct_delivery's deliverer, while that thread is paused). */

/* Per scope: the address, while the block runs (NULL: not recorded). */
struct frame_address_scope {
    void *iframe;          /* never dereferenced: an identity */
};

/* A scope's entry: record the current frame's address.  1 if the frame
 * runs a wrapper's entering code (tc_guarded.c: code_enters), 0 if not,
 * -1 if off (the core then takes the frame object). */
static int frame_address_enter(struct frame_address_scope *fa, PyThreadState *me);

/* The delivery hook's stack walk: 1 if frame object `f` is the recorded
 * frame, 0 if not, -1 if none was recorded (the core compares objects). */
static int frame_address_is(const struct frame_address_scope *fa, PyFrameObject *f);

/* The scope leaves its thread's stack (exit, or dropped): forget it. */
static void frame_address_leave(struct frame_address_scope *fa);

#if TC_FREE_THREADED
/* The watchdog thread, as it starts, and the fork child (no other thread):
 * on its own CPU set again. */
static void placement_watchdog_start(void);
static void placement_after_fork(void);

/* The watchdog, no GIL, before it sleeps until `wake` for its next event,
 * at `at`, slot `s`'s `deadline`: moves itself where it should wait.
 * Returns when to wake (earlier, to move at the right moment). */
static int64_t placement_before_sleep(struct tc_slot *s, int64_t deadline, int64_t at,
                                      int64_t wake, int64_t now);

/* A guarded thread that fired its own pre-armed deadline, or is raising a
 * fired one, any lock held: keep the watchdog off its CPU (nothing unless
 * the watchdog waits there). */
static void placement_step_aside(void);
#endif

#endif /* TC_ACCEL_H */
