/*
 * tc_compat.h -- every CPython-version switch of the core, in one place.
 *
 * The rest of the core calls the helpers below and never tests
 * PY_VERSION_HEX itself.  Each switch cites the CPython change it follows.
 * Supported: CPython 3.11 to 3.14 (3.15 by design, untested).  Free-threaded
 * builds are refused at import by timeoutcore/_engine (not validated yet).
 *
 * Private CPython fields read here, and by whom:
 *   - PyThreadState.thread_id (all versions): the watchdog, with the GIL,
 *     to find the thread state of a slot's thread (tc_find_tstate);
 *   - PyThreadState.curexc_type (3.11) / .current_exception (3.12+) and
 *     PyThreadState.exc_info->exc_value chain (3.11+): the watchdog, with the
 *     GIL, to see whether an interrupt is being raised or handled in a thread
 *     before it re-injects (tc_interrupt_in_flight).
 * Private functions: _PyEval_Get/SetSwitchInterval (3.11 only, see below).
 */
#ifndef TC_COMPAT_H
#define TC_COMPAT_H

#if PY_VERSION_HEX < 0x030B0000
#error "timeoutcore supports CPython 3.11 and later"
#endif

/* -- Stale scopes (3.13 only) ------------------------------------------------
 * CPython 3.13 can leave a frame without running its with-exits when an
 * exception is raised at the back-edge of a `while <cond>:` loop
 * (cpython#130279; 3.11, 3.12 and 3.14 are not affected).  There each scope
 * remembers the frame of its with statement, so a scope whose frame no
 * longer runs can be found and dropped instead of firing into unrelated
 * code (tc_slot.c: slot_prune_stale). */
#if PY_VERSION_HEX >= 0x030D0000 && PY_VERSION_HEX < 0x030E0000
#define TC_TRACK_FRAMES 1
#else
#define TC_TRACK_FRAMES 0
#endif

/* -- Lowering the switch interval while the watchdog waits (3.11 only) -------
 * Up to 3.11 the switch interval is runtime-global state that
 * _PyEval_SetSwitchInterval changes without a thread state; the watchdog
 * lowers it to TC_FAST_SWITCH_US while it waits for the GIL and puts the
 * user's value back once it holds it (tc_watchdog.c: gil_take).  From 3.12
 * the GIL and its interval are per interpreter (PEP 684) and the setter
 * needs a current thread state (a first try without one crashed), so there
 * the user's own sys.setswitchinterval() is the knob. */
#if PY_VERSION_HEX < 0x030C0000
#define TC_LOWER_SWITCH 1
#else
#define TC_LOWER_SWITCH 0
#endif

static inline int tc_lower_switch_supported(void) { return TC_LOWER_SWITCH; }

#if TC_LOWER_SWITCH
static inline unsigned long tc_switch_interval_us(void) { return _PyEval_GetSwitchInterval(); }
static inline void tc_set_switch_interval_us(unsigned long us)
{
    _PyEval_SetSwitchInterval(us);
}
#else
static inline unsigned long tc_switch_interval_us(void) { return 0; }
static inline void tc_set_switch_interval_us(unsigned long us) { (void)us; }
#endif

/* -- The exception a thread is raising right now ------------------------------
 * 3.12 keeps the raised exception as one object, tstate->current_exception
 * (gh-101578); 3.11 still has the (curexc_type, value, traceback) triple.
 * Returns 1 if it is an instance (3.12+) or subclass (3.11) of `cls`.  Read
 * with the GIL held: the target thread cannot run meanwhile. */
static inline int tc_raising(PyThreadState *t, PyObject *cls)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *v = t->current_exception;
    return v != NULL && PyObject_TypeCheck(v, (PyTypeObject *)cls);
#else
    PyObject *tp = t->curexc_type;
    return tp != NULL && PyType_Check(tp) &&
           PyType_IsSubtype((PyTypeObject *)tp, (PyTypeObject *)cls);
#endif
}

/* The exception being handled (except/finally/__exit__) at each level of
 * the thread's exc_info chain; 3.11 stores only the value there
 * (bpo-45711).  Returns 1 if any is an instance of `cls`.  GIL held. */
static inline int tc_handling(PyThreadState *t, PyObject *cls)
{
    for (_PyErr_StackItem *it = t->exc_info; it != NULL; it = it->previous_item) {
        PyObject *v = it->exc_value;
        if (v != NULL && v != Py_None && PyObject_TypeCheck(v, (PyTypeObject *)cls))
            return 1;
    }
    return 0;
}

/* The thread state whose thread_id is `ident`, in the current thread's
 * interpreter, or NULL.  GIL held (thread states are unlinked only by
 * threads that hold it). */
static inline PyThreadState *tc_find_tstate(unsigned long ident)
{
    PyInterpreterState *interp = PyThreadState_GetInterpreter(PyThreadState_Get());
    for (PyThreadState *t = PyInterpreterState_ThreadHead(interp); t != NULL;
         t = PyThreadState_Next(t))
        if (t->thread_id == ident)
            return t;
    return NULL;
}

#endif /* TC_COMPAT_H */
