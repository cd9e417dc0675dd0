/*
 * tc_slot.c -- per-thread slots, their scope stacks, and the delivery state
 * machine.  Part of the unity build (timeoutcore.c).
 *
 * THE SLOT'S STATE (s->state; written only by slot_to, below)
 *   IDLE      no deadline on the stack, nothing fired;
 *   ARMED     a deadline on the stack (s->deadline is the earliest), not
 *             fired;
 *   INJECTED  a scope on the stack fired, and its exit has not claimed the
 *             interrupt yet: s->fired is that scope.
 *   Invariant, for a live slot: state == INJECTED exactly when s->fired !=
 *   NULL (a dead slot's stack waits for its reuse, which clears both).  Whatever
 *   qualifies a state is a flag of its own, never a state: `prearmed` (an
 *   ARMED slot's hook is armed ahead, accel_prearm.c), `pending` (an
 *   interrupt is on its way to the thread's next safe point, tc_deliver.c),
 *   `shield` (nothing fires or surfaces while > 0).
 *
 *   from       to         by
 *   IDLE       ARMED      slot_deadline_set: a deadline on the stack (enter,
 *                         reschedule, a scope entered past its deadline)
 *   ARMED      IDLE       slot_deadline_set: the last deadline gone (exit,
 *                         reschedule(None))
 *   ARMED      INJECTED   slot_fire (the decision: slot_fire_due; the callers:
 *                         the watchdog's sweep, the thread's own check or
 *                         hook, a cancelling thread, a held interrupt's
 *                         shield or exit hook ending); and the exit's
 *                         backstop (tc_scope.c: Scope_exit), the one fire
 *                         outside slot_fire: its scope has left the stack
 *                         already, nobody fired it, and its deadline passed
 *   INJECTED   IDLE       slot_unfire: the fired scope's exit claimed it
 *                         (slot_claim), or the fired scope left the stack
 *                         without its exit (an exit skipped on 3.13, a
 *                         generator's scope popped by its caller's exit);
 *                         the publish that follows makes it ARMED if a
 *                         deadline is left.  Never straight to ARMED: the
 *                         deadline published then is the fired scope's,
 *                         and the code between (a tracer put back, a
 *                         reference dropped) may let the GIL go -- the
 *                         watchdog's lead would pre-arm a hook for a block
 *                         that is ending.  An IDLE slot nobody acts on.
 *   X          X          any change that keeps the state (a new deadline
 *                         while ARMED; a re-injection while INJECTED)
 *   No other move is made; slot_to counts one that would be (stats:
 *   bad_moves, which the integrity hammer requires to stay 0).  Resets that
 *   need no GIL -- thread exit (slot_release), the fork child, slot reuse --
 *   set IDLE directly: no Python code of that thread can run then.
 *
 * Every change of the slot's deadline goes through slot_deadline_set, the
 * one choke point: it stores the deadline, moves the state, bumps `gen`
 * (whoever planned with the old one plans again) and tells the watchdog.
 *
 * Delivery, one named function per step (the safe point itself is
 * tc_deliver.c's; nothing outside these two files raises into a thread):
 *   slot_fire        a due scope fires: mark it, INJECTED, then raise here
 *                    (owner thread) or slot_inject (another thread);
 *   slot_inject      send it: pending until the thread's next safe line
 *                    boundary (deliver_async), wake the thread's sleep, then
 *                    kick it with the signal ("inject first, then kick": the
 *                    deliverer holds the GIL, so the thread meets the pending
 *                    interrupt as soon as it runs);
 *   slot_reinject    the body swallowed it: send it again, unless it is
 *                    still pending, being raised or handled right now, or
 *                    held (interrupt_held: caught and kept, to be raised
 *                    again later);
 *   slot_take_back   withdraw a sent interrupt that has not surfaced (the
 *                    block is ending, or a shield starts);
 *   slot_raise_here  raise synchronously in the owner thread, taking back a
 *                    pending copy first so it is never delivered twice;
 *   slot_claim       the scope that fired is exiting: it claims the
 *                    interrupt (taken back, slot IDLE);
 *   slot_deliver_held  a shield or exit hook ends: deliver what was held.
 * Everything here runs with the GIL (free-threaded: inside the core lock,
 * tc_lock.h), except slot_release (thread exit).
 */

/* -- The state ---------------------------------------------------------------- */

/* slot_moves[from][to]: the moves of the table above. */
static const unsigned char slot_moves[3][3] = {
    /*               IDLE  ARMED  INJECTED */
    /* IDLE     */ {1, 1, 0},
    /* ARMED    */ {1, 1, 1},
    /* INJECTED */ {1, 0, 1},
};

/* The only writer of s->state with the GIL (the resets above aside).  A
 * slot whose thread is exiting meanwhile (slot_release: alive cleared
 * before its reset) is not judged: the reset is no move of the table. */
static void slot_to(tc_slot *s, int to)
{
    int from = atomic_load(&s->state);
    if (!slot_moves[from][to] && atomic_load(&s->alive))
        STAT_INC(bad_moves);
    atomic_store(&s->state, to);
}

#if TC_FREE_THREADED
/* TC_SCOPE_BEGIN (tc_lock.h).  A scope's `slot` goes from NULL to a slot
 * once (its entry) and back once (its exit), each time with that slot's
 * lock held: read under the core lock and the scope's own lock it is
 * steady, and once seen it is confirmed under the slot's. */
static void scope_region_begin(tc_region *r, Scope *sc)
{
    tc_slot *s;
    region_begin(r, &g_core_mu, &sc->mu);
    while ((s = sc->slot) != NULL) {
        PyCriticalSection2_End(&r->cs);
        region_begin(r, &g_core_mu, &s->mu);
        if (sc->slot == s)
            return;
        PyCriticalSection2_End(&r->cs); /* it exited meanwhile */
        region_begin(r, &g_core_mu, &sc->mu);
    }
}
#endif

/* -- The scope stack ---------------------------------------------------------- */

/* Earliest own deadline on the stack. */
static int64_t stack_min(PyObject *top)
{
    int64_t m = TC_NEVER;
    for (PyObject *p = top; p != NULL; p = as_scope(p)->parent)
        if (as_scope(p)->deadline < m)
            m = as_scope(p)->deadline;
    return m;
}

/* Outermost scope whose own deadline has passed at `now`, or NULL. */
static PyObject *stack_due(PyObject *top, int64_t now)
{
    PyObject *due = NULL;
    for (PyObject *p = top; p != NULL; p = as_scope(p)->parent)
        if (as_scope(p)->deadline <= now)
            due = p;
    return due;
}

/* The choke point: slot s's earliest deadline is now `d` (GIL).  `now`: the
 * caller's clock reading, or 0.  `enter`: a scope was just pushed, so `d`
 * is no later than the deadline before -- the hot path, which leaves the
 * kernel timer alone (a backstop armed for the later deadline belongs to
 * the old gen, and whoever it would wake checks the gen) and lets the
 * entering thread pre-arm itself; any other change disarms the backstop
 * first (wd_notify arms it anew if the watchdog needs it). */
static void slot_deadline_set(tc_slot *s, int64_t d, int64_t now, int enter)
{
    atomic_store(&s->deadline, d);
    if (atomic_load(&s->state) != SLOT_INJECTED)
        slot_to(s, d == TC_NEVER ? SLOT_IDLE : SLOT_ARMED);
    atomic_fetch_add(&s->gen, 1);
    if (enter)
        prearm_on_enter(s, now);
    else if (!sleeping_tracer_follow(s, d))
        timer_backstop_off(s);
    wd_notify(s, d, now);
}

/* Publish the slot's deadline after any change to its stack but a push. */
static void slot_publish(tc_slot *s) { slot_deadline_set(s, stack_min(s->top), 0, 0); }

/* The fired scope is claimed or gone: INJECTED -> IDLE (the table); the
 * caller publishes. */
static void slot_unfire(tc_slot *s)
{
    s->fired = NULL;
    Py_CLEAR(s->sent_ref); /* a weak reference without a callback: no code runs */
    s->held_since = 0;
    if (atomic_load(&s->state) == SLOT_INJECTED)
        slot_to(s, SLOT_IDLE);
}

/* The owner thread (GIL), as the last shield or exit hook ends: is an
 * interrupt held back for here -- one fired, or a deadline passed?  A
 * cancel off the control channel that came meanwhile is applied first: a
 * shield keeps slot_fire, which applies such cancels, away. */
static int slot_held(tc_slot *s, int64_t now)
{
    if (s->fired != NULL)
        return 1;
    remote_relay_apply(s, now);
    return s->top != NULL && stack_due(s->top, now) != NULL;
}

/* The attribute DeadlineScope.cancel() sets, which makes the exception a
 * DeadlineCancelled (read by tc_scope.c, set by accel_remote_relay.c):
 * interned once and kept.  NULL with an error set if it cannot be made.  GIL / core lock. */
static PyObject *str_cancelled(void)
{
    static PyObject *name;
    if (name == NULL)
        name = PyUnicode_InternFromString("_cancelled");
    return name;
}

/* Mark a scope popped from the stack without its __exit__ as done. */
static void scope_forget(Scope *sc)
{
    sc->parent = NULL;
    sc->state = SCOPE_DONE;
    sc->slot = NULL;
    if (sc->exited == 0)
        sc->exited = now_ns();
    Py_CLEAR(sc->frame); /* the stack still holds a reference: no finalizer */
    Py_CLEAR(sc->owner);
    prepare_drop(sc); /* it holds the scope: a cycle, else */
    frame_address_leave(&sc->frame_address);
}

/* Drop every scope on the slot's stack (a previous owner's leftovers). */
static void stack_clear(tc_slot *s)
{
    PyObject *p = s->top;
    s->top = NULL;
    slot_unfire(s);
    while (p != NULL) {
        PyObject *parent = as_scope(p)->parent;
        scope_forget(as_scope(p));
        Py_DECREF(p);
        p = parent;
    }
}

/* Pop the scopes above `target` whose __exit__ never ran (CPython 3.13.0 can
 * skip with-exits, cpython#130279).  Returns the number popped. */
static void slot_take_back(tc_slot *s);

static int stack_pop_stale_above(tc_slot *s, PyObject *target)
{
    int n = 0;
    while (s->top != NULL && s->top != target) {
        PyObject *p = s->top;
        s->top = as_scope(p)->parent;
        /* what was on its way to the stale scope goes with it (pending_scope
         * is borrowed: it must not outlive the scope) */
        if (s->pending_scope == p || s->fired == p)
            slot_take_back(s);
        if (s->fired == p)
            slot_unfire(s); /* the caller publishes */
        scope_forget(as_scope(p));
        Py_DECREF(p);
        STAT_INC(stale_scopes);
        n++;
    }
    return n;
}

/* -- Delivery state machine --------------------------------------------------- */

/* Withdraw; the time it waited for protected code goes to the scope it was
 * for. */
static void slot_take_back(tc_slot *s)
{
    PyObject *scope = s->pending_scope;
    int64_t deferred = deliver_cancel(s);
    if (scope != NULL)
        as_scope(scope)->deferred_ns += deferred;
}

static void slot_inject(tc_slot *s, PyObject *exc, PyObject *scope)
{
    if (!deliver_async(s, exc, scope))
        return; /* its thread is gone */
    if (s == t_slot)
        return; /* the owner thread (a scope entered past its deadline): it runs,
                 * there is no wait to wake or call to knock loose */
#if TC_FREE_THREADED
    if (t_arm_due == s) {
        t_kick_due = 1; /* core_after: arm the hook, then wake and kick (tc_lock.h) */
        return;
    }
#endif
    slot_wake_and_kick(s);
}

/* Wake the thread's sleep(), then signal it (knocks a blocking call loose). */
static void slot_wake_and_kick(tc_slot *s)
{
    atomic_fetch_add(&s->wake, 1);
    futex_wake_all(&s->wake);
    kick(s);
}

/* Raise the interrupt synchronously; the caller returns NULL. */
static PyObject *slot_raise_here(tc_slot *s)
{
    slot_take_back(s);
    PyErr_SetNone(g_interrupt);
    return NULL;
}

/* THE FIRE DECISION, the one place that says whether a slot fires now
 * (slot_fire asks it first; the exit's backstop is the one fire without
 * it, the table says why): ARMED (never
 * fired twice: INJECTED re-sends, slot_reinject), not shielded, and its
 * deadline has passed or a cancel came off the control channel
 * (accelerator remote_relay).  Read without the GIL by the watchdog's
 * sweep to pick its slots, which asks again inside the core. */
static int slot_fire_due(tc_slot *s, int64_t now)
{
    return atomic_load(&s->state) == SLOT_ARMED && atomic_load(&s->shield) == 0 &&
           (atomic_load(&s->deadline) <= now || remote_relay_marked_at(s) != TC_NEVER);
}

/* Fire the outermost due scope, unless shielded.  `local`: we are the owner
 * thread; the error is set and the caller returns NULL.  Returns 1 if an
 * interrupt was raised (or set), 0 if the decision said no (nothing due,
 * shielded, or fired already). */
static int slot_fire(tc_slot *s, int64_t now, int local)
{
    if (!slot_fire_due(s, now))
        return 0;
    remote_relay_apply(s, now); /* a cancel off the control channel: due now */
    PyObject *due = stack_due(s->top, now);
    if (due == NULL)
        return 0;
    atomic_store(&s->prearmed, 0); /* fired: the hook stays armed for the delivery */
    s->fired = due;
    as_scope(due)->expired = 1;
    as_scope(due)->fired_at = now;
    slot_to(s, SLOT_INJECTED);
    s->reinject_step = TC_REINJECT_FIRST_NS;
    atomic_store(&s->reinject_at, now + s->reinject_step);
    STAT_INC(fires);
    if (local)
        slot_raise_here(s);
    else {
        if (s != t_slot) /* another thread delivers: it will want the GIL soon */
            atomic_store(&s->fast_until, now + TC_FAST_HOLD_NS); /* accel_fast_window.c */
        slot_inject(s, g_interrupt, s->fired);
    }
    return 1;
}

/* -- The interrupt the body holds --------------------------------------------- */

/* A re-injection is for a body that swallowed the interrupt.  One that caught
 * it and keeps it, to raise it again later, has not: a hook caller's loop
 * (pluggy's) keeps it in a local while it ends its other wrappers, then
 * throws it into the wrapper that entered the scope.  A second interrupt in
 * between ended that loop early and left the wrapper suspended, its scope
 * entered for good (every later line of the thread then got an interrupt).
 * So the thread's slot keeps a weak reference to the instance sent up the
 * body (interrupt_new); while that instance lives, it is held -- as one
 * being handled is (interrupt_in_flight_here) -- for up to TC_REINJECT_HELD_MAX_NS.
 * Rejected: no bound -- a body that keeps every interrupt and goes on (a log
 * handler that holds the record) would run for ever; and a strong reference
 * -- the instance's traceback holds the frames it left, whose locals'
 * finalizers would wait for the scope's exit and run inside the core. */
static int interrupt_held(tc_slot *s, int64_t now)
{
    if (s->sent_ref == NULL)
        return 0;
    if (!tc_weakref_alive(s->sent_ref)) { /* dropped: swallowed */
        Py_CLEAR(s->sent_ref);
        s->held_since = 0;
        return 0;
    }
    if (s->held_since == 0)
        s->held_since = now;
    return now - s->held_since < TC_REINJECT_HELD_MAX_NS;
}

/* The owner thread has made an interrupt instance: in a thread whose scope
 * fired, it is the one that travels up the body now. */
static void interrupt_note(PyObject *inst)
{
    tc_slot *s = t_slot;
    PyObject *ref;
    if (s == NULL)
        return;
    TC_CORE_BEGIN();
    if (s->fired != NULL) {
        if ((ref = PyWeakref_NewRef(inst, NULL)) != NULL) {
            Py_XSETREF(s->sent_ref, ref);
            s->held_since = 0;
        }
        else
            PyErr_Clear(); /* not noted: re-sent as if dropped */
    }
    TC_CORE_END();
}

/* _DeadlineInterrupt.__new__(cls, *args), installed by _setup: BaseException's,
 * then noted.  CPython makes the instance in the thread that raises it,
 * however it was sent (PyErr_SetNone, an asynchronous exception, 3.11's lazy
 * normalisation at the handler), so every delivery path is covered. */
static PyObject *interrupt_new(PyObject *unused, PyObject *args, PyObject *kw)
{
    (void)unused;
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    PyObject *cls = n > 0 ? PyTuple_GET_ITEM(args, 0) : NULL, *rest, *inst;
    if (cls == NULL || !PyType_Check(cls) ||
        !PyType_IsSubtype((PyTypeObject *)cls, (PyTypeObject *)PyExc_BaseException)) {
        PyErr_SetString(PyExc_TypeError, "_DeadlineInterrupt.__new__() needs an exception class");
        return NULL;
    }
    if ((rest = PyTuple_GetSlice(args, 1, n)) == NULL)
        return NULL;
    inst = ((PyTypeObject *)PyExc_BaseException)->tp_new((PyTypeObject *)cls, rest, kw);
    Py_DECREF(rest);
    if (inst != NULL)
        interrupt_note(inst);
    return inst;
}

static PyMethodDef g_interrupt_new_def = {"__new__", (PyCFunction)(void (*)(void))interrupt_new,
                                          METH_VARARGS | METH_KEYWORDS,
                                          "Make the interrupt; timeoutcore notes it."};

/* Install interrupt_new on the interrupt class (GIL, _setup).  -1 with the
 * error set. */
static int interrupt_setup(PyObject *cls)
{
    PyObject *fn = PyCFunction_New(&g_interrupt_new_def, NULL), *sm;
    int r;
    if (fn == NULL)
        return -1;
    sm = PyStaticMethod_New(fn);
    Py_DECREF(fn);
    if (sm == NULL)
        return -1;
    r = PyObject_SetAttrString(cls, "__new__", sm);
    Py_DECREF(sm);
    return r;
}

/* The body may have swallowed the interrupt: raise it again (watchdog). */
static void slot_reinject(tc_slot *s, int64_t now)
{
    if (atomic_load(&s->shield) > 0 || s->fired == NULL)
        return;
    if (s->reinject_step < TC_REINJECT_MAX_NS)
        s->reinject_step *= 2;
    atomic_store(&s->reinject_at, now + s->reinject_step);
    if (s->pending != NULL) {
        /* not swallowed: still waiting for a safe point */
        deliver_backstop(s);
        return;
    }
    /* Another thread's exception state is not read here (tc_deliver.c:
     * interrupt_in_flight_here): send it; the hook, in the thread, waits
     * while the interrupt is being raised or handled (deliver_here), and the
     * scope's exit takes it back.  Free-threaded, the interrupt it holds
     * cannot be looked at either (it may be freed meanwhile): the hook asks
     * that too. */
    if (!atomic_load(&s->alive) || (!TC_FREE_THREADED && interrupt_held(s, now)))
        return;
    STAT_INC(reinjections);
    slot_inject(s, g_interrupt, s->fired);
}

static void slot_claim(tc_slot *s)
{
    atomic_store(&s->fast_until, 0);
    slot_unfire(s);
    slot_take_back(s);
}

/* A shield or an exit hook ended with an interrupt held back: deliver it
 * here, synchronously -- fire now if the watchdog held off, else raise the
 * fired one again.  Returns NULL with the error set. */
static PyObject *slot_deliver_held(tc_slot *s, int64_t now)
{
    if (s->fired == NULL && slot_fire(s, now, 1))
        return NULL;
    atomic_store(&s->reinject_at, now + s->reinject_step);
    return slot_raise_here(s);
}

/* In the owner thread, at a point where raising is safe: raise if the
 * interrupt is pending for this thread or its deadline has passed.  Returns
 * 1 with the error set, else 0. */
static int slot_check(tc_slot *s)
{
    int64_t now;
    if (s == NULL || s->top == NULL || atomic_load(&s->shield) > 0)
        return 0;
    if (atomic_load(&s->state) == SLOT_INJECTED) {
        slot_raise_here(s);
        return 1;
    }
    if (s->pending != NULL) { /* a soft exception on its way: here it is */
        deliver_pending_here(s);
        return 1;
    }
    now = now_ns();
    return slot_fire(s, now, 1);
}

/* -- Stale scopes (3.13, cpython#130279) -------------------------------------- */

#if TC_TRACK_FRAMES
/* Is `frame` on the stack that starts at `cur` (a new reference, consumed)? */
static int frame_running(PyObject *frame, PyFrameObject *cur)
{
    while (cur != NULL) {
        PyFrameObject *back;
        if ((PyObject *)cur == frame) {
            Py_DECREF(cur);
            return 1;
        }
        back = PyFrame_GetBack(cur);
        Py_DECREF(cur);
        cur = back;
    }
    return 0;
}

/* A wrapper scope's owner (tc_guarded.c) has returned, and `cur` (a new
 * reference, consumed) is the thread's innermost frame: the owner becomes
 * the nearest caller of the old one that still runs (a finished frame
 * object keeps its caller), so a scope entered through a helper function
 * -- whose frame was taken for the owner -- stays with the code that
 * called it.  Returns 0 if none of them runs (stale).  The price: a wrapper
 * scope whose with statement's exit 3.13 skipped is dropped only when that
 * statement's caller returns. */
static int scope_rehome(Scope *sc, PyFrameObject *cur)
{
    PyFrameObject *f = PyFrame_GetBack((PyFrameObject *)sc->owner);
    while (f != NULL) {
        PyFrameObject *back;
        Py_XINCREF(cur);
        if (frame_running((PyObject *)f, cur)) {
            Py_XDECREF(cur);
            Py_XSETREF(sc->owner, (PyObject *)f); /* the reference moves here */
            return 1;
        }
        back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    Py_XDECREF(cur);
    return 0;
}

/* Drop the scopes whose with statement's frame no longer runs in the thread
 * whose innermost frame is `cur` (a new reference, consumed): the outermost
 * such scope and everything above it.  Returns 1 if anything was dropped;
 * the caller publishes. */
static int slot_prune_stale(tc_slot *s, PyFrameObject *cur)
{
    PyObject *stale = NULL;
    for (PyObject *p = s->top; p != NULL; p = as_scope(p)->parent) {
        PyObject *f = as_scope(p)->owner != NULL ? as_scope(p)->owner : as_scope(p)->frame;
        if (f == NULL)
            continue;
        Py_XINCREF(cur);
        if (frame_running(f, cur))
            continue;
        Py_XINCREF(cur);
        if (as_scope(p)->owner == NULL || !scope_rehome(as_scope(p), cur))
            stale = p; /* keep going: the outermost one counts */
    }
    Py_XDECREF(cur);
    if (stale == NULL)
        return 0;
    stack_pop_stale_above(s, stale); /* everything above it */
    s->top = as_scope(stale)->parent; /* and the stale scope itself */
    if (s->fired == stale) {
        slot_take_back(s);
        slot_unfire(s);
    }
    scope_forget(as_scope(stale));
    Py_DECREF(stale);
    STAT_INC(stale_scopes);
    return 1;
}
#endif

/* -- Slot registry -------------------------------------------------------------- */

/* pthread key destructor: the owning thread is exiting.  No GIL here.  The
 * kernel timer goes now; Python objects left on a stack whose exits never
 * ran (3.13.0) are released when the slot is reused, with the GIL. */
static void slot_release(void *p)
{
    tc_slot *s = (tc_slot *)p;
    if (s == NULL)
        return;
    pthread_mutex_lock(&g_mu);
    if (s->alive) { /* first: a fire racing this reset is not judged (slot_to) */
        s->alive = 0;
        STAT_DEC(slots_live);
    }
    timer_drop(s);
    atomic_store(&s->deadline, TC_NEVER);
    atomic_store(&s->state, SLOT_IDLE);
    atomic_fetch_add(&s->gen, 1);
    pthread_mutex_unlock(&g_mu);
}

/* Set OSError(err, "timeoutcore: timer_create failed ...") as the error. */
static void raise_timer_error(int err)
{
    PyObject *exc = PyObject_CallFunction(
        PyExc_OSError, "is", err,
        err == EAGAIN ? "timeoutcore: timer_create failed for this thread: too many timers "
                        "(RLIMIT_SIGPENDING reached)"
                      : "timeoutcore: timer_create failed for this thread");
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
}

/* The calling thread's slot, created on first use (GIL held).  NULL with a
 * Python exception when the handler or the timer cannot be set up: then
 * nothing is left armed and the slot stays free for reuse. */
static tc_slot *slot_get(void)
{
    tc_slot *s = t_slot;
    int err;
    if (s != NULL)
        return s;
    if (g_interrupt == NULL || g_exceeded == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "timeoutcore: _setup() was not called");
        return NULL;
    }
    if (install_handler() < 0)
        return NULL;
    pthread_mutex_lock(&g_mu);
    for (s = g_slots; s != NULL; s = s->next)
        if (!s->alive)
            break;
    if (s == NULL) {
        /* A cache line of its own: its owner writes it on every block,
         * and two threads' slots must not share one. */
        void *mem = NULL;
        size_t size = (sizeof *s + TC_CACHE_LINE - 1) / TC_CACHE_LINE * TC_CACHE_LINE;
        if (posix_memalign(&mem, TC_CACHE_LINE, size) == 0)
            memset(mem, 0, size);
        else
            mem = NULL;
        s = (tc_slot *)mem;
        if (s == NULL) {
            pthread_mutex_unlock(&g_mu);
            PyErr_NoMemory();
            return NULL;
        }
        atomic_store(&s->deadline, TC_NEVER);
        s->next = g_slots;
        g_slots = s;
    }
    s->tid = (pid_t)syscall(SYS_gettid);
    s->ident = PyThread_get_thread_ident();
    slot_note_tstate(s, PyThreadState_Get());
    atomic_store(&s->state, SLOT_IDLE);
    atomic_store(&s->deadline, TC_NEVER);
    atomic_store(&s->shield, 0);
    atomic_store(&s->cpu, -1);
    atomic_fetch_add(&s->gen, 1);
    if ((err = timer_make(s)) != 0) {
        pthread_mutex_unlock(&g_mu);
        raise_timer_error(err);
        return NULL;
    }
    s->alive = 1;
    STAT_INC(slots_live);
    pthread_mutex_unlock(&g_mu);
    stack_clear(s); /* leftovers of a previous owner, if any */
    (void)deliver_cancel(s);
    self_fire_slot_reuse(s);
    if ((err = pthread_setspecific(g_key, s)) != 0) {
        slot_release(s);
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        return NULL;
    }
    t_slot = s;
    return s;
}
