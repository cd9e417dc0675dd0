/*
 * tc_gil.c -- where the interpreter keeps its GIL switch interval (3.12+).
 * The one file of the core compiled with Py_BUILD_CORE: a unit of its own,
 * so that CPython's internal headers (shipped with the public ones) touch
 * nothing else.
 *
 * Why: the watchdog lowers the switch interval while a deadline is due or
 * an interrupt on its way (tc_watchdog.c: the fast window), so that the
 * thread that must stop gets the GIL within a fraction of a millisecond
 * even when other threads are busy.  Up to 3.11 the interval is
 * runtime-global and _PyEval_Set/GetSwitchInterval work from any thread;
 * from 3.12 it lives in the interpreter's GIL state (PEP 684) and those
 * functions need a current thread state, which the watchdog has only while
 * it holds the GIL -- the very thing it is waiting for.  So the address of
 * that field is taken once, with the GIL, in the importing thread
 * (tc_gil_interval_addr), and the watchdog reads and writes the unsigned
 * long there without the GIL.  CPython reads it without a lock too
 * (take_gil copies it at the start of each wait): an aligned word, never
 * torn; a waiter that read the old value uses it for one more wait.
 *
 * Contract: tc_gil_interval_addr() with the GIL held, in a thread of the
 * interpreter that imports the module; returns NULL on 3.11 (use the
 * functions) or when the interpreter has no GIL state of its own.
 */
#define Py_BUILD_CORE 1
#include <Python.h>

#if PY_VERSION_HEX >= 0x030C0000
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wundef" /* mimalloc's headers (3.13+) */
#include "internal/pycore_interp.h"
#pragma GCC diagnostic pop
#endif

__attribute__((visibility("hidden"))) unsigned long *tc_gil_interval_addr(void);

unsigned long *tc_gil_interval_addr(void)
{
#if PY_VERSION_HEX >= 0x030C0000 && !defined(Py_GIL_DISABLED)
    PyInterpreterState *interp = PyInterpreterState_Get();
    return interp->ceval.gil != NULL ? &interp->ceval.gil->interval : NULL;
#else
    return NULL;
#endif
}
