/*
 * tc_accel.h -- the latency accelerators: which exist, and whether each is
 * on.  The core delivers every deadline with all of them off (later, never
 * lost); each one only makes some deadlines land sooner.  Decided once at
 * import (tc_accel.c: accel_setup, GIL held) from three things: whether
 * this build supports it (tc_compat.h's switches), TIMEOUTCORE_ACCEL, and,
 * for those that use CPython internals, the import check of their addresses
 * (tc_gil_check.c).  Read anywhere after that, by any thread and from the
 * signal handler: a plain int written before the watchdog, any kernel timer
 * or any hook exists.
 *
 * Where each is switched (the point where the core decides to use it):
 *   anticipation     tc_watchdog.c: refresh_switch_interval (no lead: the
 *                    watchdog asks for the GIL at the deadline; so no
 *                    requeue and no holding the GIL up to it either)
 *   fast_window      tc_compat.h: tc_switch_setup (no interval address: the
 *                    window, the exit linger and urgent takes do nothing)
 *   self_fire        tc_wd_main.c: wd_main, before wd_watch
 *   prearm           tc_wd_fire.c: wd_prearm, slot_self_prearm;
 *                    tc_deliver.c: prearm_lead (free-threaded: no lead)
 *   sleeping_tracer  tc_hook_trace.c: hook_sleep
 *   direct_delivery  tc_deliver_steps.c: deliver_async, before deliver_direct
 *   prepare          tc_wd_fire.c: wd_prepare
 *   placement        tc_wd_main.c: wd_place, wd_step_aside
 *   rescue           tc_os.c: timer_backstop (no backstop timer armed);
 *                    tc_watchdog.c: wd_rescue
 *   remote_relay     tc_module.c: _wait_readable, before remote_peek
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
    ACCEL_N
};

static int g_accel_on[ACCEL_N]; /* accel_setup, once, before any reader */

static inline int accel_on(int a) { return g_accel_on[a]; }

static int accel_setup(void); /* tc_accel.c: at import, GIL held */

#endif /* TC_ACCEL_H */
