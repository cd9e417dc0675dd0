/*
 * timeoutcore.c -- the unity build of the native core: the one compiled
 * unit, which includes each part in order, so that `static` helpers and
 * inlining work across them while each concern has its own file.  The
 * contract is in timeoutcore.h; structs, fields and their locks in
 * tc_internal.h; every tuning constant in tc_tuning.h; every
 * CPython-version switch in tc_compat.h.
 *
 *   tc_accel.c            which latency accelerators are on, and why one
 *                         is off
 *   tc_os.c               clock, futex, signal handler, per-thread timers,
 *                         kick
 *   tc_guarded.c          which code a scope guards (wrapper scopes), code
 *                         no interrupt may surface in
 *   accel_frame_address.c  accelerator frame_address: the with
 *                         statement's frame known by its address
 *   tc_deliver.c          safe delivery: the rule, protected code
 *   tc_hook_trace.c       the hook on 3.11: a per-thread tracer
 *   accel_sleeping_tracer.c  accelerator sleeping_tracer: 3.11's tracer
 *                         asleep until the deadline
 *   tc_hook_monitoring.c  the hook on 3.12+: a sys.monitoring tool
 *   accel_direct_delivery.c  accelerator direct_delivery: an interrupt
 *                         sent at a paused thread's back-edge, no hook
 *   tc_deliver_steps.c    the decision at a line boundary, deliver_async
 *   tc_slot.c             slots, scope stacks, the delivery state machine
 *   tc_unraisable.c       an interrupt CPython dropped: learn where, resend
 *   accel_anticipation.c  accelerator anticipation: the watchdog's lead
 *   tc_watchdog.c         the watchdog's state, schedule and fire-time
 *                         sweep
 *   accel_placement_rescue.c  accelerators placement and rescue: where
 *                         the watchdog thread runs
 *   accel_fast_window.c   accelerator fast_window: the switch interval
 *                         lowered while a deadline needs the GIL
 *   tc_wd_fire.c          taking the GIL
 *   accel_prearm.c        accelerator prearm: the hook armed ahead, the
 *                         thread fires its own deadline
 *   accel_prepare.c       accelerator prepare: the exception built ahead
 *   accel_self_fire.c     accelerator self_fire: the decision at the
 *                         thread's own breaker check; with a GIL, the watch
 *                         of a thread that holds it, and its pending call
 *   accel_self_fire_trigger.c  ... free-threaded: the trigger that takes
 *                         the decision to that one thread
 *   accel_self_fire_probe.c  ... and its import check
 *   tc_wd_main.c          the watchdog's loop, start and stop
 *   accel_remote_relay.c  accelerator remote_relay: remote cancels read
 *                         off the registry's control channel
 *   tc_scope.c            the Scope type: construction, enter and exit
 *                         (they keep the GIL)
 *   tc_scope_views.c      the Scope type's other methods and views
 *   tc_module.c           the Shield type, module functions
 *   tc_export.c           fork, cffi entry points
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "tc_internal.h"

#include "tc_accel.c"
#include "tc_os.c"
#include "tc_guarded.c"
#include "accel_frame_address.c"
#include "tc_deliver.c"
#include "tc_hook_trace.c"
#include "accel_sleeping_tracer.c"
#include "tc_hook_monitoring.c"
#include "accel_direct_delivery.c"
#include "tc_deliver_steps.c"
#include "tc_slot.c"
#include "tc_unraisable.c"
#include "accel_anticipation.c"
#include "tc_watchdog.c"
#include "accel_placement_rescue.c"
#include "accel_fast_window.c"
#include "tc_wd_fire.c"
#include "accel_prearm.c"
#include "accel_prepare.c"
#include "accel_self_fire.c"
#include "accel_self_fire_trigger.c"
#include "accel_self_fire_probe.c"
#include "tc_wd_main.c"
#include "accel_remote_relay.c"
#include "tc_scope.c"
#include "tc_scope_views.c"
#include "tc_module.c"
#include "tc_export.c"
