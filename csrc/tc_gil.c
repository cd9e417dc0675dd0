/*
 * tc_gil.c -- the interpreter's GIL state: where its switch interval lives
 * (3.12+), and its waiters (3.11+).  The one file of the core compiled with
 * Py_BUILD_CORE: a unit of its own, so that CPython's internal headers
 * (shipped with the public ones) touch nothing else.
 *
 * Why: the watchdog lowers the switch interval while a deadline is due or
 * an interrupt on its way (accel_fast_window.c), so that the
 * thread that must stop gets the GIL within a fraction of a millisecond
 * even when other threads are busy.
 *
 * The interval.  Up to 3.11 it is runtime-global and
 * _PyEval_Set/GetSwitchInterval work from any thread; from 3.12 it lives in
 * the interpreter's GIL state (PEP 684) and those functions need a current
 * thread state, which the watchdog has only while it holds the GIL -- the
 * very thing it is waiting for.  So the GIL state's address is taken once,
 * with the GIL, in the importing thread (tc_gil_setup), and the watchdog
 * reads and writes the unsigned long there without the GIL.  CPython reads
 * it without a lock too: an aligned word, never torn.
 *
 * The waiters.  take_gil() copies the interval at the start of each timed
 * wait on gil->cond and asks the holder to drop the GIL only when that wait
 * times out (Python/ceval_gil.c, 3.11-3.14 alike).  A thread that was
 * already waiting when the window opened therefore waits out the old
 * interval -- up to 5 ms -- before anyone asks the holder to let go: with
 * busy threads that is most of a deadline's lateness.  tc_gil_rewait() wakes every waiter so
 * that each starts its wait again with the interval now in force.  A
 * condition variable may always wake spuriously, and take_gil() loops until
 * the GIL is free, so to CPython this is a spurious wake-up: nobody takes
 * the GIL because of it.  It broadcasts with gil->mutex held, the mutex
 * take_gil() holds from reading the interval to waiting: a waiter has then
 * either read the new interval or is waiting and is woken.
 *
 * Who holds the GIL, and a call to run at a breaker check (3.12+).  A thread
 * that holds the GIL when its deadline comes can fire it itself, with no GIL
 * hand-off at all (accel_self_fire.c: wd_watch, pc_fire): the watchdog
 * looks at the GIL state's `locked` and `last_holder` -- atomics
 * that CPython's own waiters read without the GIL too -- and, while that
 * thread holds it, queues a call with _PyEval_AddPendingCall, the function
 * behind Py_AddPendingCall (callable from any thread, with or without the
 * GIL: it exists for signal handlers), asking for any thread rather than
 * the main one only.  Whichever thread next checks its eval breaker runs it,
 * with the GIL; the call itself looks whether it is in the right thread.
 * (3.11 runs pending calls in the main thread only: not used there.)
 *
 * Two facts for a delivery decided outside the thread (tc_deliver_steps.c:
 * deliver_direct): whether a garbage collection is running in the
 * interpreter (gc.collecting: a thread paused inside one may run finalizers
 * before it meets an asynchronous exception), and the main thread's ident
 * (the runtime's main_thread: signal handlers run there, at the same
 * breaker check).  Both are read with the GIL held; CPython writes them
 * with it.
 *
 * A drop request (tc_gil_drop_requested): a waiter whose wait ran out has
 * asked the holder to let the GIL go at its next breaker check -- 3.11 and
 * 3.12 keep it in the interpreter's eval state, 3.13+ as a bit of the
 * holder's own eval breaker.  Read by the holder, with the GIL.
 *
 * Contract: tc_gil_setup(why, n) once, GIL held, in a thread of the
 * importing interpreter, first: it checks the addresses above against
 * public truth (tc_gil_check.c); 1 if all held, else 0 with the reason in
 * `why`, and then every function below but tc_iframe_code touches no
 * internal field (no interval address; rewait, drop request, gc.collecting,
 * main thread 0; holder -1; pending call refused).  interval_addr, rewait,
 * holder, add_pending: any thread, with or without the GIL; never rewait
 * from a signal handler (a mutex); it returns 0 or the failed pthread
 * call's errno (nothing woken).  drop_requested with the GIL (0 without a
 * GIL).  tc_iframe_code() with the GIL held (free-threaded: attached), for
 * the caller's own current frame; no setup needed (the thread-state check,
 * tc_gil_check.c, compares it with PyFrame_GetCode() at import).
 *
 * One more fact that needs a private structure on 3.11 and on the free-
 * threaded build: the code object an interpreter frame runs, when no frame
 * object exists for it (making one costs a scope's entry more than the rest
 * of it; tc_scope.c asks whether the code entering a scope is a wrapper's
 * __enter__) -- 3.12+ with a GIL asks the unstable API; free-threaded, its
 * new reference costs more than the field's read (tc_iframe_code).
 */
#define Py_BUILD_CORE 1
#include <Python.h>
#include <pthread.h>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wundef" /* mimalloc's headers (3.13+) */
#if PY_VERSION_HEX >= 0x030C0000
#include "internal/pycore_interp.h"
#ifdef Py_GIL_DISABLED
#include "internal/pycore_interpframe.h" /* _PyFrame_GetCode */
#endif
#include "internal/pycore_runtime.h" /* _PyRuntime.main_thread */
#include "internal/pycore_ceval.h"   /* _PyEval_AddPendingCall */
#else
#include "internal/pycore_runtime.h" /* 3.11: _PyRuntime.ceval.gil */
#include "internal/pycore_frame.h"   /* 3.11: _PyInterpreterFrame.f_code */
#endif
#pragma GCC diagnostic pop

#define TC_HIDDEN __attribute__((visibility("hidden")))
TC_HIDDEN int tc_gil_setup(char *why, size_t n);
TC_HIDDEN unsigned long *tc_gil_interval_addr(void);
TC_HIDDEN int tc_gil_rewait(void);
TC_HIDDEN int tc_gc_collecting(void);
TC_HIDDEN unsigned long tc_main_thread(void);
TC_HIDDEN int tc_gil_holder(const void **holder);
TC_HIDDEN int tc_add_pending(int (*func)(void *), void *arg);
TC_HIDDEN /* The bit of a thread state's eval_breaker that asks for an asynchronous
 * exception (3.13+: the breaker is per thread), or 0.  Not used as given:
 * the self-fire's import check (accel_self_fire_trigger.c: trigger_check)
 * takes it only if PyThreadState_SetAsyncExc is seen to set it. */
uintptr_t tc_async_exc_bit(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    return (uintptr_t)_PY_ASYNC_EXCEPTION_BIT;
#else
    return 0;
#endif
}

int tc_gil_drop_requested(void);
TC_HIDDEN PyCodeObject *tc_iframe_code(void *iframe);
TC_HIDDEN uintptr_t tc_async_exc_bit(void);

/* Set once at import (GIL held), and only if the import check held. */
static PyInterpreterState *g_interp;
#ifndef Py_GIL_DISABLED
static struct _gil_runtime_state *g_gil;
#endif

static int gil_check(PyInterpreterState *interp, char *why, size_t n); /* tc_gil_check.c */

int tc_gil_setup(char *why, size_t n)
{
    PyInterpreterState *interp = PyInterpreterState_Get();
    if (!gil_check(interp, why, n))
        return 0;
    g_interp = interp;
#if !defined(Py_GIL_DISABLED) && PY_VERSION_HEX >= 0x030C0000
    g_gil = interp->ceval.gil;
#elif !defined(Py_GIL_DISABLED)
    g_gil = &_PyRuntime.ceval.gil;
#endif
    return 1;
}

unsigned long *tc_gil_interval_addr(void)
{
#ifndef Py_GIL_DISABLED
    return g_gil != NULL ? &g_gil->interval : NULL;
#else
    return NULL;
#endif
}

int tc_gil_rewait(void)
{
#ifndef Py_GIL_DISABLED
    int err, err2;
    if (g_gil == NULL)
        return 0;
    if ((err = pthread_mutex_lock(&g_gil->mutex)) != 0)
        return err;
    err = pthread_cond_broadcast(&g_gil->cond);
    err2 = pthread_mutex_unlock(&g_gil->mutex);
    return err != 0 ? err : err2;
#else
    return 0;
#endif
}

int tc_gc_collecting(void)
{
    return g_interp != NULL && g_interp->gc.collecting != 0;
}

unsigned long tc_main_thread(void)
{
    return g_interp != NULL ? _PyRuntime.main_thread : 0;
}

/* Is the GIL held (1) or free (0) right now, and by which thread state
 * (*holder: to compare with a known one, never to use -- it may be gone by
 * the time the caller looks)?  -1 without a GIL state.  No lock: a moment's
 * picture, which the caller must be ready to find out of date. */
int tc_gil_holder(const void **holder)
{
#ifndef Py_GIL_DISABLED
    if (g_gil == NULL)
        return -1;
#if PY_VERSION_HEX >= 0x030D0000
    *holder = _Py_atomic_load_ptr_relaxed(&g_gil->last_holder);
    return _Py_atomic_load_int_relaxed(&g_gil->locked) != 0;
#else
    *holder = (const void *)_Py_atomic_load_relaxed(&g_gil->last_holder);
    return _Py_atomic_load_relaxed(&g_gil->locked) != 0;
#endif
#else
    *holder = NULL;
    return -1;
#endif
}

/* Queue func(arg) for the next thread of the interpreter to check its eval
 * breaker, whichever it is (3.12+).  Returns 0, or -1 if the queue is full
 * or this CPython cannot (3.11, no GIL). */
int tc_add_pending(int (*func)(void *), void *arg)
{
#if defined(Py_GIL_DISABLED) || PY_VERSION_HEX < 0x030C0000
    (void)func;
    (void)arg;
    return -1;
#elif PY_VERSION_HEX >= 0x030D0000
    return g_interp != NULL &&
                   _PyEval_AddPendingCall(g_interp, func, arg, 0) == _Py_ADD_PENDING_SUCCESS
               ? 0
               : -1;
#else
    return g_interp != NULL && _PyEval_AddPendingCall(g_interp, func, arg, 0) == 0 ? 0 : -1;
#endif
}

int tc_gil_drop_requested(void)
{
#if defined(Py_GIL_DISABLED)
    return 0;
#elif PY_VERSION_HEX >= 0x030D0000
    return g_gil != NULL && _Py_eval_breaker_bit_is_set(PyThreadState_Get(), _PY_GIL_DROP_REQUEST_BIT);
#else
    return g_interp != NULL && _Py_atomic_load_relaxed(&g_interp->ceval.gil_drop_request) != 0;
#endif
}

/* The code object that interpreter frame `iframe` runs (borrowed: a running
 * frame holds its code), or NULL.  GIL held, `iframe` the caller's own
 * current frame (tc_compat.h: tc_current_iframe).  3.12+ through the
 * unstable API made for this, but free-threaded; 3.11 has none and reads
 * the field.  Free-threaded, the unstable API's new reference is an atomic
 * increment and decrement of a count that every thread running the same
 * code shares (a code object is owned by the thread that made it): on
 * every scope's entry, what stopped two threads' blocks from scaling.
 * There the field is read as CPython's own inline does.  Used by the
 * accelerator frame_address alone, whose import check compares it with
 * PyFrame_GetCode() (tc_gil_check.c: frame_address_check); a mismatch
 * turns that accelerator off. */
PyCodeObject *tc_iframe_code(void *iframe)
{
    PyObject *code;
    if (iframe == NULL)
        return NULL;
#ifdef Py_GIL_DISABLED
    code = (PyObject *)_PyFrame_GetCode((struct _PyInterpreterFrame *)iframe);
#elif PY_VERSION_HEX >= 0x030C0000
    code = (PyObject *)PyUnstable_InterpreterFrame_GetCode((struct _PyInterpreterFrame *)iframe);
    Py_XDECREF(code); /* the running frame keeps its own reference */
#else
    code = (PyObject *)((_PyInterpreterFrame *)iframe)->f_code;
#endif
    return code != NULL && PyCode_Check(code) ? (PyCodeObject *)code : NULL;
}

#include "tc_gil_check.c"
