/*
 * tc_deliver.c -- safe delivery: where a fired interrupt surfaces.  Part of
 * the unity build (timeoutcore.c).  This file: the rule (below) and the
 * protected-code check (pre-armed slots: accel_prearm.c); the hook itself
 * is in tc_hook_trace.c (3.11) or tc_hook_monitoring.c (3.12+), the
 * decision at a line boundary and every other delivery step in
 * tc_deliver_steps.c.
 *
 * Why: an asynchronous exception surfaces at the guarded thread's next
 * eval-breaker check, wherever that is -- inside logging.Handler.acquire()
 * just after the lock was taken, in Condition.__enter__, half-way through
 * Queue or Future bookkeeping -- and leaves a lock held or an invariant
 * broken for the whole process (bpo-29988: CPython will not make that safe
 * in general).  So the interrupt is not raised by PyThreadState_SetAsyncExc.
 * The deliverer (the watchdog, with the GIL) stores it in the slot as
 * *pending* and arms a hook that runs IN THE GUARDED THREAD at its next line
 * boundary (tc_compat.h: a per-thread C tracer on 3.11, a sys.monitoring
 * tool on 3.12+).  There the decision is taken at the moment of delivery:
 * if any frame from the innermost up to (not including) the frame of the
 * scope's with statement runs protected code, the interrupt waits for the
 * next line boundary; otherwise the hook disarms itself and raises it there,
 * as if the line had raised it.  A line boundary is also never inside a
 * `with` statement's own set-up, so the 3.14 gap between __enter__ and the
 * block's handler (gh-148874) is never hit.
 *
 * Protected code: modules named by the Python layer (_set_protection: a
 * module and its submodules, by the frame's __name__) and code objects the
 * user protected.  A scope whose frame is not on the stack (a generator that
 * yielded inside its with) is bounded by its owner frame (tc_guarded.c: the
 * frame that resumes such wrappers) when that is on the stack, so protected
 * code anywhere between the two holds the interrupt back; with neither on
 * the stack, the innermost frame decides (stack_protected).
 *
 * The watchdog never raises into the thread itself while the hook is armed
 * (deliver_backstop): a stack it checks from outside is not the stack the
 * thread will be on when an asynchronous exception surfaces.  On 3.11, where
 * a loop that jumps to itself has no line event, it turns on opcode events
 * for the thread's innermost frame, and the hook raises at that frame's
 * back-edge -- still decided in the thread.
 *
 * Explicit raise points -- timeoutcore.sleep(), checkpoint(), a shield's
 * exit, a scope's enter or exit -- still raise synchronously: they are where
 * the caller asked for it.  Without a hook (set-up failed, or sys.monitoring
 * had no free tool id) delivery falls back to PyThreadState_SetAsyncExc.
 * All of this runs with the GIL -- on a free-threaded build inside the core
 * lock (tc_lock.h), which the hook takes only after a lock-free look at its
 * own slot's pending_any.  There the check stays the thread's own: no
 * thread ever reads another thread's frames (they could be changing, or
 * freed, under it), so the stack walk below needs no stop-the-world.
 */

enum { HOOK_NONE = 0, HOOK_TRACE = 1, HOOK_MONITORING = 2 };

static int g_hook_mode = HOOK_NONE;  /* set by _setup_delivery              */
static PyObject *g_prot_names;       /* tuple of str: protected modules     */
static PyObject *g_exempt_names;     /* tuple of str: modules under those that
                                        are not (the more specific wins)    */
static PyObject *g_prot_codes;       /* set of code objects, or NULL        */
static Py_ssize_t g_extra = -1;      /* co_extra index of the verdict cache */
static uintptr_t g_prot_gen = 1;     /* bumped when the protected set changes */
static PyObject *g_defer_report;     /* report(scope) at exit, or NULL      */
static int64_t g_defer_cap_ns;       /* ... when deferred longer than this  */

/* -- Protected code ---------------------------------------------------------- */

/* Length of the longest entry of `names` that is `name` or a package of it,
 * or -1. */
static Py_ssize_t longest_match(PyObject *names, PyObject *name)
{
    Py_ssize_t n = names != NULL ? PyTuple_GET_SIZE(names) : 0;
    Py_ssize_t ln = PyUnicode_GET_LENGTH(name), best = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *p = PyTuple_GET_ITEM(names, i);
        Py_ssize_t lp = PyUnicode_GET_LENGTH(p);
        if (lp <= best || ln < lp || PyUnicode_Tailmatch(name, p, 0, lp, -1) != 1)
            continue;
        if (ln == lp || PyUnicode_READ_CHAR(name, lp) == '.')
            best = lp;
    }
    return best;
}

/* Module `name` is protected: a protected entry covers it, and no exempt
 * entry more specific than that one. */
static int name_protected(PyObject *name)
{
    Py_ssize_t prot = longest_match(g_prot_names, name);
    return prot >= 0 && longest_match(g_exempt_names, name) <= prot;
}

/* Does frame `f` run protected code?  The verdict is cached on the code
 * object itself, in a co_extra slot of ours (the per-code-object store
 * CPython offers tools, tc_compat.h): (generation << 2) | 2 | verdict, so a
 * change of the protected set (a new generation) invalidates every entry at
 * once, and a lookup costs no hashing (a code object's hash covers its
 * contents).  Without a slot (all 255 taken) every call decides afresh. */
static int frame_protected(PyFrameObject *f)
{
    PyCodeObject *code = PyFrame_GetCode(f);
    void *extra = NULL;
    int r = 0;
    if (g_extra >= 0 && tc_code_get_extra((PyObject *)code, g_extra, &extra) == 0 &&
        extra != NULL && ((uintptr_t)extra >> 2) == g_prot_gen) {
        Py_DECREF(code);
        return (int)((uintptr_t)extra & 1);
    }
    PyErr_Clear();
    if (code_protected_by_name(code) || code_dropped_once(code)) /* tc_guarded.c */
        r = 1;
    else if (g_prot_codes != NULL && PySet_Contains(g_prot_codes, (PyObject *)code) == 1)
        r = 1;
    else {
        PyObject *globals = PyFrame_GetGlobals(f);
        PyObject *name = globals != NULL ? PyDict_GetItemWithError(globals, g_name_key) : NULL;
        if (name != NULL && PyUnicode_Check(name))
            r = name_protected(name);
        Py_XDECREF(globals);
    }
    PyErr_Clear();
    if (g_extra >= 0 &&
        tc_code_set_extra((PyObject *)code, g_extra, (void *)((g_prot_gen << 2) | 2u | (uintptr_t)r)) < 0)
        PyErr_Clear();
    Py_DECREF(code);
    return r;
}

/* "file:line in function" for a frame (new reference, or NULL). */
static PyObject *frame_where(PyFrameObject *f)
{
    PyCodeObject *code = PyFrame_GetCode(f);
    PyObject *s = PyUnicode_FromFormat("%U:%d in %U", code->co_filename,
                                       PyFrame_GetLineNumber(f), code->co_qualname);
    Py_DECREF(code);
    if (s == NULL)
        PyErr_Clear();
    return s;
}

/* Is `f` the frame whose with statement entered scope `sc` (its address:
 * accel_frame_address.c; else its object, held)? */
static int is_scope_frame(PyFrameObject *f, Scope *sc)
{
    /* A wrapper scope (owner set) is known by its frame object, held: the
     * wrapper returns, and another frame may take its address. */
    int known = sc->owner == NULL ? frame_address_is(&sc->frame_address, f) : -1;
    if (known >= 0)
        return known;
    return sc->frame != NULL && (PyObject *)f == sc->frame;
}

/* Is `f` the frame of the code that scope `sc` guards for a wrapper
 * (tc_guarded.c)? */
static int is_owner_frame(PyFrameObject *f, Scope *sc)
{
    return sc->owner != NULL && (PyObject *)f == sc->owner;
}

/* Would an exception raised at `f`'s current instruction leave `f` (no
 * handler of its own covers it)? */
static int tc_leaves_test(PyCodeObject *code, const unsigned char *b, Py_ssize_t n, int off)
{
    (void)b;
    (void)n;
    return tc_exc_handler(code, off / 2) < 0;
}

/* Is protected code running between `cur` (the innermost frame, a new
 * reference, consumed) and the frame of scope `sc` (exclusive; NULL: none)?
 * The frame is the one whose code entered the scope, or once that has
 * returned, a wrapper scope's owner (tc_guarded.c); the entering frame of a
 * wrapper scope counts as protected where an exception would leave it.
 * On 1, *where (if not NULL and still NULL) gets the outermost protected
 * frame's description. */
static int stack_protected(PyFrameObject *cur, Scope *sc, PyObject **where)
{
    PyFrameObject *outer = NULL; /* outermost protected, strong */
    int innermost, found = 0, named = 0;
    if (cur == NULL)
        return 0;
    innermost = frame_protected(cur);
    while (cur != NULL) {
        PyFrameObject *back;
        if (sc != NULL && is_scope_frame(cur, sc)) {
            found = 1;
            if (sc->owner != NULL && tc_ask_code(cur, PyFrame_GetLasti(cur), tc_leaves_test, 0)) {
                Py_INCREF(cur);
                Py_XSETREF(outer, cur);
            }
            break;
        }
        if (sc != NULL && is_owner_frame(cur, sc)) {
            found = 1;
            break;
        }
        if (frame_protected(cur)) {
            PyCodeObject *code = PyFrame_GetCode(cur);
            named |= code_protected_by_name(code);
            Py_DECREF(code);
            Py_INCREF(cur);
            Py_XSETREF(outer, cur);
        }
        back = PyFrame_GetBack(cur);
        Py_DECREF(cur);
        cur = back;
    }
    Py_XDECREF(cur);
    /* No bound on the stack (a generator's scope while it is suspended, a
     * scope whose entering code and owner have both returned -- entered
     * through a helper function): the innermost frame decides, and an exit,
     * an entry or a finalizer anywhere on the stack (tc_guarded.c): the
     * block's own code cannot be told from the code around it, but an
     * exit is never the block. */
    int r = found ? outer != NULL : innermost || named;
    if (r && where != NULL && *where == NULL && outer != NULL)
        *where = frame_where(outer);
    Py_XDECREF(outer);
    return r;
}

/* Is our interrupt being raised, or handled (except/finally/__exit__), in
 * the calling thread now?  Then it was not swallowed, and raising it again
 * would tear the handler that is cleaning up.  Public API only: the raised
 * exception and the handled one (the innermost, as sys.exc_info() sees it).
 * Rule: only the thread itself asks; another thread's exception state is
 * never read (private fields, and free-threaded not readable at all): the
 * watchdog sends, and the hook waits here (deliver_here).  A handler nested
 * in the interrupt's (its own try/except) hides it; there the interrupt,
 * alive on the outer handler's stack, is held (interrupt_held) for its
 * bound.  Rejected: the handled exception's __context__ chain -- it keeps
 * the interrupt after its handling ended: a block entered in an `except
 * DeadlineExceeded:` never got its own interrupt; and the thread state's
 * exc_info chain -- private fields, which see the same as sys.exc_info()
 * but for a generator level below a suspended generator's own handler. */
static int interrupt_in_flight_here(void)
{
    PyObject *raised = PyErr_Occurred(); /* borrowed; a class on 3.11 */
    PyObject *handled;
    int r;
    if (raised != NULL && PyErr_GivenExceptionMatches(raised, g_interrupt))
        return 1;
    handled = PyErr_GetHandledException(); /* new reference, or NULL */
    r = handled != NULL && PyObject_TypeCheck(handled, (PyTypeObject *)g_interrupt);
    Py_XDECREF(handled);
    return r;
}

/* -- The hook: per-thread tracer (3.11) or sys.monitoring tool (3.12+) ---------- */

/* How deliver_here acts once it has decided to raise. */
enum {
    DELIVER_RAISE = 0, /* raise here                                         */
    DELIVER_DECIDE = 1 /* only say so (3.12, 3.13.0-3.13.14: mon_jump)       */
};
static int deliver_here(tc_slot *s, int vetted, int mode);
static void deliver_pending_here(tc_slot *s);
static int slot_fire(tc_slot *s, int64_t now, int local); /* tc_slot.c */
static int interrupt_held(tc_slot *s, int64_t now);       /* tc_slot.c */

/* -- What the hook measures, and the thread's CPU ----------------------------- */

/* How long switching the delivery events lately took: a maximum that decays
 * by 1/TC_EVENTS_COST_DECAY a switch.  Free-threaded, each switch stops the
 * world, and the watchdog pre-arms TC_PREARM_LEAD_STOPS times that long
 * ahead of a deadline (accel_prearm.c: prearm_lead), so that the stop is
 * over -- and the guarded thread runs again -- before the deadline; with a
 * GIL a switch is cheap and only reported.  Written by whoever switched (a
 * lost update between two of them only costs one sample). */
static _Atomic int64_t g_events_cost_ns;

/* The slot's own thread notes the CPU it runs on, for the watchdog
 * (sched_getcpu reads the kernel's rseq area, a load; stored only when it
 * changed). */
static inline void slot_note_cpu(tc_slot *s)
{
    int cpu = sched_getcpu();
    if (cpu != atomic_load_explicit(&s->cpu, memory_order_relaxed))
        atomic_store_explicit(&s->cpu, cpu, memory_order_relaxed);
}


