/*
 * timeoutcore.c -- the unity build of the native core: the one compiled
 * unit, which includes each part in order, so that `static` helpers and
 * inlining work across them while each concern has its own file.  The
 * contract is in timeoutcore.h; structs, fields and their locks in
 * tc_internal.h; every CPython-version switch in tc_compat.h.
 *
 *   tc_accel.c     which latency accelerators are on, and why one is off
 *   tc_os.c        clock, futex, signal handler, per-thread timers, kick
 *   tc_deliver.c   safe delivery: the hook that raises at a line boundary
 *                  outside protected code
 *   tc_slot.c      slots, scope stacks, the delivery state machine
 *   tc_watchdog.c  schedule, GIL anticipation, the fire-time sweep
 *   tc_remote.c    remote cancels read off the registry's control channel
 *   tc_scope.c     the Scope type (enter/exit keep the GIL)
 *   tc_module.c    the Shield type, module functions, fork, cffi entry points
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "tc_internal.h"

#include "tc_accel.c"
#include "tc_os.c"
#include "tc_guarded.c"
#include "tc_deliver.c"
#include "tc_slot.c"
#include "tc_unraisable.c"
#include "tc_watchdog.c"
#include "tc_remote.c"
#include "tc_scope.c"
#include "tc_module.c"
