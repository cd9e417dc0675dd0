/*
 * accel_self_fire_trigger.c -- accelerator self_fire on a free-threaded
 * build (TC_SELF_FIRE_TRIGGER): how the watchdog makes the guarded thread,
 * and no other, run the self-fire's decision (accel_self_fire.c:
 * pc_fire_here) at its own next eval-breaker check, and how an interrupt
 * decided there surfaces at that very instruction.  Its state is the
 * slot's struct self_fire_slot (tc_accel.h): the next round's two triggers
 * and the round under way (struct self_fire_round).  Part of the unity
 * build (timeoutcore.c), after accel_self_fire.c.
 *
 * Why: the core's delivery switches sys.monitoring events on, and they are
 * interpreter-wide: every thread of a pool runs instrumented -- free-
 * threaded, a CPU loop at a small fraction of its speed -- for as long as a
 * delivery is pending, and each switch stops the world.  A pending call is
 * no way out there: CPython sets its bit in every thread's breaker, and
 * whichever thread checks first runs it.
 *
 * The mechanism (CPython 3.14t, Python/ceval_gil.c: _Py_HandlePending;
 * Python/brc.c).  Each thread's breaker is a word of its own.  An object
 * whose last reference another thread drops goes back to the thread that
 * made it (biased reference counting: queued, and that thread's merge bit
 * set), which deallocates it at its next breaker check.  That check, in the
 * same pass, then raises an asynchronous exception, if the copy of the
 * breaker it took at its start has that bit.  The bit cannot come from the
 * watchdog: a spinning thread checks every few nanoseconds, and takes (and
 * clears) it alone at a check between the watchdog's two steps -- nearly
 * always, in the first measurement.  So a round takes two triggers, A and
 * B, both made by the slot's thread at a block's entry (trigger_new):
 *   1. at the deadline the watchdog drops A (round_step);
 *   2. the thread deallocates A at its next check, pass P1 (round_a_here):
 *      it queues B to itself -- _Py_DecRefShared, the path a drop by
 *      another thread takes, puts B in its own merge queue and sets its own
 *      merge bit: B is merged at its next pass P2 -- then sets its own
 *      asynchronous-exception bit, with no exception (an atomic or on its
 *      own breaker word: PyThreadState_SetAsyncExc would also drop an
 *      exception another library sent).  P1 took its copy before that: the
 *      bit is for P2, whose copy has both;
 *   3. at P2 the thread deallocates B (round_b_here): with its bit set, the
 *      decision runs -- at a loop's back-edge outside protected code it
 *      fires, sets the interrupt as its own asynchronous exception and
 *      clears the bit again; P2 then raises it at that instruction.
 *      Anywhere else (a function's start, a call just returned) it starts
 *      the next round itself: a new A queued to itself, which queues a new
 *      B (round_restart).  The thread goes on deciding at its own checks,
 *      with no watchdog, until it fires or the decision hands the deadline
 *      to the hook (pc_fire_here counts its declines; protected code).
 *      Its rounds take 3 checks and 2 in turn (A lets one check pass
 *      first: `hops`): a loop whose checks alternate between a call's
 *      return and its back-edge met a round of 2 at the call every time,
 *      and ran on to the hook.  A B whose decision could not run (its bit
 *      taken by another setter, an error set, the core's own region) asks
 *      the watchdog for a new round instead (watch_at: now).
 * Rejected: the watchdog dropping B as well, once the thread said A had
 * arrived (A waiting for it, bounded).  Each round then needed the
 * watchdog to run twice, and next to threads that keep every CPU busy the
 * wake-up between was most of a deadline's lateness; a decision that did
 * not fire cost two more.
 * Ahead of the deadline the watch wakes early: TC_WATCH_PREPARE_NS ahead it
 * drops a third trigger, P, whose deallocation in the thread builds the
 * scope's DeadlineExceeded there (prepare_here; accelerator prepare), so
 * that the exit finds it built and its code warm; TC_WATCH_SPIN_NS ahead
 * it spins to the deadline (a sleep wakes up late by about that), unless
 * it runs on the thread's CPU.
 * Cleared, the bit keeps the interrupt from surfacing in anything that runs
 * between B's merge and P2's look (objects merged after B, a collection and
 * its finalizers): their own breaker checks no longer see it.
 *
 * Race analysis.  Rounds are numbered (the watchdog numbers A and B as it
 * starts one, the thread a B it queues again): an A or B of an earlier
 * round does nothing, and B counts only if its own round's A (or B before
 * it) set the bit (`armed`).  That bit is set by the thread itself, after
 * B is queued and before P2 starts -- nothing of the thread runs between,
 * the queueing is C code -- so every pass that can merge B (P2, or one
 * nested in Python code P1 runs after A: a finalizer's) took its copy
 * after the bit was set: a B that finds its round armed and the bit set is
 * in a pass that will raise.  (Without the numbers, a B of a round given
 * up, still queued, was merged after a later round's A in the same pass,
 * found the bit set, and its interrupt waited for a pass that never came:
 * the import check hung one run in twenty.)  Should the queueing fail
 * (CPython then merges B at once, in the queueing call), B runs before
 * `armed` is set, finds its round unarmed and asks the watchdog again.
 * Other setters of the bit (PyThreadState_SetAsyncExc from elsewhere, our
 * exit's take-back) may make P1 take it instead: B then finds it clear and
 * asks again.  The round's phase is never idle while the thread starts its
 * own rounds, so the watchdog starts none meanwhile; it still looks at
 * a thread whose round is under way, and hands the deadline to the core if
 * the thread went to sleep (a system call, a lock: round_asleep) with a B
 * queued, which only its next check would merge.  A trigger
 * deallocated in another thread (a collection merges every thread's queue
 * with the world stopped; the thread has exited), or at its thread's exit,
 * only ends the round: the watch starts the next with the spare A, and
 * hands the deadline to the core when no trigger is left, or TC_WATCH_MAX_NS
 * after its first round.  An A deallocated in its own thread outside a
 * breaker check (a collection that thread runs) queues B all the same: no
 * pass had the bit yet, and B's is the thread's next check.  A trigger acts
 * only for the thread and slot that made it (a slot reused drops its old
 * ones).  The interrupt, once set, is raised by P2; the slot's
 * async_pending has the scope's exit take it back should it not surface.
 * The watchdog takes the triggers inside the core lock and the slot's
 * lock, the thread makes them inside either (tc_lock.h), and B's
 * deallocation decides inside the core lock, as the hook does.
 *
 * The import check (accel_self_fire_probe.c: trigger_check) confirms all
 * of it on this interpreter before self_fire is on.
 */

#if TC_SELF_FIRE_TRIGGER

enum {
    ROUND_IDLE = 0,   /* no round (the thread may ask for one)             */
    ROUND_SENT_A = 1, /* the watchdog dropped A                            */
    ROUND_SENT_B = 2, /* the thread queued a B to itself, for its next check */
};

/* P: the prepare's (trigger_watch).  A2: a spare A, for a round whose A a
 * collection took (deallocated in the collecting thread: the round ends) --
 * without it the watch had no trigger left and handed the deadline to the
 * hook (measured).  Its kind is TRIG_A. */
enum { TRIG_A = 0, TRIG_B = 1, TRIG_P = 2, TRIG_A2 = 3, TRIG_COUNT = 4 };

typedef struct {
    PyObject_HEAD
    tc_slot *slot;                 /* NULL: the import check's            */
    struct self_fire_round *round; /* the round it belongs to             */
    unsigned long ident;           /* the thread that made it             */
    int kind;                      /* TRIG_*                              */
    int hops;                      /* A: checks to let pass before B      */
    uint64_t no;                   /* its round (set by the dropping side) */
} sf_trigger;

static uintptr_t g_trigger_bit; /* the breaker's async-exception bit (trigger_check) */

static void trigger_dealloc(PyObject *o);

static PyTypeObject g_trigger_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "timeoutcore._core._SelfFireTrigger",
    .tp_basicsize = sizeof(sf_trigger),
    .tp_dealloc = trigger_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "timeoutcore internal: dropped by the watchdog, deallocated by its thread.",
};

/* A trigger made by (and owned by) the calling thread, or NULL without an
 * error set (the self-fire then waits for the next one). */
static PyObject *trigger_new(tc_slot *s, struct self_fire_round *rd, int kind)
{
    sf_trigger *t = PyObject_New(sf_trigger, &g_trigger_type);
    if (t == NULL) {
        PyErr_Clear();
        return NULL;
    }
    t->slot = s;
    t->round = rd;
    t->ident = PyThread_get_thread_ident();
    t->kind = kind;
    t->hops = 0;
    t->no = 0;
    return (PyObject *)t;
}

/* Drop `o` from a thread that does not own it (the watchdog, the check's
 * helper), detached on entry and on return. */
static void trigger_drop(PyObject *o)
{
    PyGILState_STATE g = PyGILState_Ensure();
    Py_DECREF(o); /* queued to its thread: deallocated there */
    PyGILState_Release(g);
}

/* The dropping side: number a new round's A and B; its phase ROUND_SENT_A. */
static void round_number(struct self_fire_round *rd, PyObject *a, PyObject *b)
{
    uint64_t no = atomic_fetch_add(&rd->seq, 1) + 1;
    ((sf_trigger *)a)->no = no;
    ((sf_trigger *)b)->no = no;
    atomic_store(&rd->phase, ROUND_SENT_A);
}

/* The thread, attached, at a breaker check (A's, or a B's that goes on):
 * queue B (its own, numbered `no`) to itself, then set its own bit for the
 * pass that merges B (above).  The phase is ROUND_SENT_B. */
static void round_send_b(struct self_fire_round *rd, PyObject *b, uint64_t no)
{
    ((sf_trigger *)b)->no = no;
    _Py_DecRefShared(b); /* queued to this very thread (or, should that fail, merged now) */
    atomic_store(&rd->armed, no);
    tc_own_breaker_set(PyThreadState_Get(), g_trigger_bit);
}

/* The slot's thread, inside the core lock or its slot's lock: both
 * triggers of the next round made, and the prepare's if it is on (any that
 * could not be: the watch hands over, the exit builds the exception). */
static void trigger_make(tc_slot *s)
{
    for (int k = TRIG_A; k < TRIG_COUNT; k++)
        if (s->self_fire.trigger[k] == NULL && (k != TRIG_P || accel_on(ACCEL_PREPARE)))
            s->self_fire.trigger[k] = trigger_new(s, &s->self_fire.round, k == TRIG_A2 ? TRIG_A : k);
}

/* The slot's thread: the watchdog looks at the slot at once (the planner
 * plans it at watch_at). */
static void watch_now(tc_slot *s)
{
    atomic_store(&s->self_fire.watch_at, now_ns());
    wd_wake();
}

/* The slot's thread, its round over without a decision: the next round's
 * triggers, and the watchdog asked for it at once. */
static void round_again(tc_slot *s)
{
    TC_CORE_BEGIN();
    trigger_make(s);
    TC_CORE_END();
    watch_now(s);
}

/* A, in its thread, during a pass P1 of its breaker check: queue the
 * round's B for P2 (above).  `s`: NULL for the check's. */
static void round_a_here(tc_slot *s, struct self_fire_round *rd, uint64_t no, int hops)
{
    int expected = ROUND_SENT_A;
    PyObject *b;
    if (no != atomic_load(&rd->seq))
        return; /* a round given up: nothing to do */
    if (PyEval_GetFrame() == NULL) {
        /* At its exit: the round ends, and the watch hands the deadline
         * over -- no trigger is made here.  Not a collection's test:
         * gc.collecting is the interpreter's, set while any thread
         * collects, and the others run on meanwhile (all but the marking
         * is done with the world running).  Ending the round there handed
         * the deadline of a thread merely running beside a collection to
         * the hook.  A collection this thread runs deallocates A after the
         * world's stop, outside a check: B's pass is this thread's next
         * check all the same, and a finalizer's check waits there
         * (pc_fire_here). */
        if (atomic_compare_exchange_strong(&rd->phase, &expected, ROUND_IDLE) && s != NULL)
            wd_wake();
        return;
    }
    if (hops > 0 && atomic_load(&rd->phase) == ROUND_SENT_A) {
        sf_trigger *next = (sf_trigger *)trigger_new(s, rd, TRIG_A);
        if (next != NULL) { /* a check passed: the same A, one hop fewer */
            next->no = no;
            next->hops = hops - 1;
            _Py_DecRefShared((PyObject *)next);
            return;
        }
    }
    if (!atomic_compare_exchange_strong(&rd->phase, &expected, ROUND_SENT_B))
        return; /* handed over meanwhile (round_asleep): B stays for the next round */
    if ((b = atomic_exchange(&rd->b, NULL)) == NULL) {
        atomic_store(&rd->phase, ROUND_IDLE); /* the slot was reused meanwhile */
        return;
    }
    round_send_b(rd, b, no);
}

/* B, in its thread: 1 if its queueing set the bit (round_send_b), and the
 * bit is still set -- then the pass deallocating B raises an asynchronous
 * exception set now (above).  A B of an earlier round (given up, and
 * merged with a later round's A) never counts. */
static int round_b_armed(struct self_fire_round *rd, uint64_t no, PyThreadState *ts)
{
    uint64_t armed = no;
    if (!atomic_compare_exchange_strong(&rd->armed, &armed, 0))
        return 0;
    return (tc_own_breaker(ts) & g_trigger_bit) != 0;
}

/* -- The self-fire's rounds ------------------------------------------------------ */

/* B, in the slot's thread, the round to go on: the next round, A' queued to
 * itself (above).  Not B' at once: this very pass, whose copy has the bit,
 * clears it after the merge -- B' would find it clear.  0 if the triggers
 * could not be made (the watchdog starts the round). */
static int round_restart(struct self_fire_round *rd, tc_slot *s)
{
    PyObject *a = trigger_new(s, rd, TRIG_A), *b = a != NULL ? trigger_new(s, rd, TRIG_B) : NULL, *old;
    if (b == NULL) {
        Py_XDECREF(a); /* never numbered: its deallocation does nothing */
        return 0;
    }
    if ((old = atomic_exchange(&rd->b, b)) != NULL) {
        ((sf_trigger *)old)->no = 0; /* ours, never sent */
        Py_DECREF(old);
    }
    round_number(rd, a, b);
    ((sf_trigger *)a)->hops = (rd->restarts++ & 1) == 0; /* 3 checks, 2, 3, ... */
    _Py_DecRefShared(a); /* queued to this very thread (or, should that fail, merged now) */
    return 1;
}

/* B, in the slot's thread, at its breaker check P2 (or, rarely, its exit or
 * a collection it runs): decide, and raise here or go on (above). */
static void round_b_here(tc_slot *s, uint64_t no)
{
    PyThreadState *ts = PyThreadState_Get();
    struct self_fire_round *rd = &s->self_fire.round;
    PyObject *raised = NULL;
    int again = 0, r = 0;
    int bit = round_b_armed(rd, no, ts);
    int live = PyEval_GetFrame() != NULL; /* not its exit (a collection: pc_fire_here waits) */
    /* ... nor inside a region of the core's own (a finalizer that code ran:
     * the slot's state is half-changed there): the next round decides. */
    int usable = live && PyErr_Occurred() == NULL && !core_held();
    if (no != atomic_load(&rd->seq))
        return; /* an earlier round's: that one is over */
    TC_CORE_BEGIN();
    if (bit && usable)
        r = pc_fire_here(s, &again); /* bounded: its declines hand over to the hook */
    else
        again = live && atomic_load(&s->state) == SLOT_ARMED;
    if (r < 0) {
        raised = PyErr_GetRaisedException(); /* the interrupt: P2 raises it instead */
        s->async_pending = 1; /* taken back by the exit should it not surface */
    }
    TC_CORE_END();
    if (raised != NULL) {
        atomic_store(&rd->phase, ROUND_IDLE);
        (void)PyThreadState_SetAsyncExc(PyThread_get_thread_ident(), (PyObject *)Py_TYPE(raised));
        tc_own_breaker_clear(ts, g_trigger_bit);
        Py_DECREF(raised);
        return;
    }
    if (again && bit && usable && round_restart(rd, s))
        return;
    atomic_store(&rd->phase, ROUND_IDLE);
    if (again)
        round_again(s); /* the watchdog starts the next round */
}

/* P, in the slot's thread, at a breaker check ahead of the deadline of gen
 * `gen`: the exception built now (accel_prepare.c), where Python may run --
 * not at its exit, in a collection, with an error set or inside the core's
 * own region (the exit then builds it). */
static void prepare_here(tc_slot *s, uint64_t gen)
{
    slot_note_cpu(s); /* for the watch's spin, which follows (trigger_watch) */
    if (gen == atomic_load(&s->gen) && PyEval_GetFrame() != NULL && !tc_gc_collecting() &&
        PyErr_Occurred() == NULL && !core_held())
        prepare_in_thread(s);
}

/* The import check's side (accel_self_fire_probe.c). */
static void probe_b_here(uint64_t no);
static void probe_elsewhere(void);

static void trigger_dealloc(PyObject *o)
{
    sf_trigger *t = (sf_trigger *)o;
    tc_slot *s = t->slot;
    struct self_fire_round *rd = t->round;
    unsigned long ident = t->ident;
    int kind = t->kind, t_hops = t->hops;
    uint64_t no = t->no;
    Py_TYPE(o)->tp_free(o);
    if (no == 0)
        return; /* never sent (a slot reused, the check's leftovers) */
    if (kind == TRIG_P) { /* `no`: the gen it was dropped for */
        if (ident == PyThread_get_thread_ident() && s == t_slot)
            prepare_here(s, no);
        return;
    }
    if (ident != PyThread_get_thread_ident() || (s != NULL && s != t_slot)) {
        if (no == atomic_load(&rd->seq)) {
            atomic_store(&rd->phase, ROUND_IDLE); /* elsewhere: the round is over */
            if (s != NULL)
                wd_wake();
        }
        if (s == NULL)
            probe_elsewhere();
    }
    else if (kind == TRIG_A)
        round_a_here(s, rd, no, t_hops);
    else if (s == NULL)
        probe_b_here(no);
    else
        round_b_here(s, no);
}

/* The watchdog, detached, no lock, the slot due: start a round.  1 if it
 * did or a round is under way, 0 if the slot moved on (plan again), -1 if
 * there are no triggers (the usual way). */
static int round_step(tc_slot *s, uint64_t gen)
{
    struct self_fire_round *rd = &s->self_fire.round;
    PyObject *a = NULL;
    int started = 0, moved = 0;
    PyGILState_STATE g;
    if (atomic_load(&rd->phase) != ROUND_IDLE)
        return 1;
    g = PyGILState_Ensure();
    TC_CORE_BEGIN_ON(s);
    moved = !s->alive || atomic_load(&s->gen) != gen || atomic_load(&s->state) != SLOT_ARMED;
    int k = s->self_fire.trigger[TRIG_A] != NULL ? TRIG_A : TRIG_A2;
    if (!moved && s->self_fire.trigger[k] != NULL &&
        (atomic_load(&rd->b) != NULL || s->self_fire.trigger[TRIG_B] != NULL)) {
        a = s->self_fire.trigger[k];
        s->self_fire.trigger[k] = NULL;
        if (atomic_load(&rd->b) == NULL) { /* else a given-up round's, never sent */
            atomic_store(&rd->b, s->self_fire.trigger[TRIG_B]);
            s->self_fire.trigger[TRIG_B] = NULL;
        }
        round_number(rd, a, atomic_load(&rd->b));
        started = 1;
    }
    TC_CORE_END();
    PyGILState_Release(g);
    if (!started)
        return moved ? 0 : -1;
    trigger_drop(a);
    STAT_INC(pending_calls);
    return 1;
}

/* A watched slot whose A (or B) waits for its thread's next check: keep waiting
 * while the thread runs or waits for a CPU -- its check comes as soon as it
 * runs, and the hook's events would slow every thread meanwhile -- but not
 * for a thread asleep in a system call or a lock (or one whose state cannot
 * be read): the round needs two checks in a row, and such a thread, kicked
 * loose, may block again in between (a read() retried after EINTR).  That
 * round is given up (its A, merged later, does nothing) and the core fires
 * the slot: the scope is marked expired now, and the hook raises once the
 * thread is back.  A thread parked in futex() -- how CPython's own locks
 * wait, a stop of the world's included -- is asleep only if still parked
 * after the watchdog attached (which waits out a stop of the world) and
 * TC_WATCH_BACK_NS after it was first seen parked in this round (a stop
 * that is being asked for parks each thread as it comes, and lasts until
 * the last one has; the watchdog's attach then waits for nothing).  Handed
 * over at once, the deadline of a thread beside a collection went to the
 * hook (measured); a lock's waiter is fired a few milliseconds later.  1 to
 * hand over, 0 not (yet). */
static int round_asleep(tc_slot *s, int phase)
{
    struct self_fire_round *rd = &s->self_fire.round;
    uint64_t seq = atomic_load(&rd->seq);
    int expected = phase;
    int64_t now;
    PyGILState_STATE g;
    if (thread_runnable(s->tid) == 1)
        return 0;
    if (thread_in_futex(s->tid) == 1) {
        g = PyGILState_Ensure(); /* detached on entry: waits out a stop of the world */
        PyGILState_Release(g);
        if (thread_runnable(s->tid) == 1)
            return 0;
        now = now_ns();
        if (rd->parked_in != seq) {
            rd->parked_in = seq;
            rd->parked_at = now;
        }
        if (now - rd->parked_at < TC_WATCH_BACK_NS)
            return 0;
    }
    return atomic_compare_exchange_strong(&rd->phase, &expected, ROUND_IDLE);
}

/* The watchdog, detached, no lock, TC_WATCH_PREPARE_NS or less ahead of the
 * slot's deadline: drop P, once a gen -- its thread builds the exception at
 * its next check (prepare_here), as the pending call does with a GIL. */
static void prepare_step(tc_slot *s, uint64_t gen)
{
    PyObject *p = NULL;
    PyGILState_STATE g;
    if (s->self_fire.prepare_gen == gen || !accel_on(ACCEL_PREPARE))
        return;
    s->self_fire.prepare_gen = gen;
    g = PyGILState_Ensure();
    TC_CORE_BEGIN_ON(s);
    if (s->alive && atomic_load(&s->gen) == gen && atomic_load(&s->state) == SLOT_ARMED) {
        p = s->self_fire.trigger[TRIG_P];
        s->self_fire.trigger[TRIG_P] = NULL;
    }
    TC_CORE_END();
    if (p != NULL) {
        ((sf_trigger *)p)->no = gen;
        Py_DECREF(p); /* queued to its thread */
    }
    PyGILState_Release(g);
}

/* The watch (self_fire_watch), detached: up to the deadline, nothing; from
 * it, a round whenever none is under way, and the kick once (a blocking
 * call knocked loose).  A round whose trigger waits for its thread's next
 * check is cut short only for a thread asleep (round_asleep).  The usual
 * way when the watchdog's rounds have gone on for TC_WATCH_MAX_NS without a
 * decision, or with no triggers. */
static int trigger_watch(tc_slot *s, uint64_t gen, int64_t deadline)
{
    int64_t now = now_ns();
    int phase = atomic_load(&s->self_fire.round.phase), r;
    if (deadline == TC_NEVER || atomic_load(&s->prearmed))
        goto usual;
    if (now < deadline) {
        /* Ahead of it (the planner comes self_fire_lead early): the
         * prepare's P, then -- a sleep wakes up late by about
         * TC_WATCH_SPIN_NS -- a spin over the last of it, unless on the CPU
         * the thread ran on at P, which the spin would keep it off (as
         * wd_watch does with a GIL).  Noted there, not at every entry: the
         * per-block path stays as it was; without prepare, s->cpu says
         * nothing and the watch spins. */
        if (deadline - now > TC_WATCH_SPIN_NS) {
            prepare_step(s, gen);
            return watch_again(s, gen, deadline - TC_WATCH_SPIN_NS);
        }
        if (sched_getcpu() == atomic_load_explicit(&s->cpu, memory_order_relaxed))
            return watch_again(s, gen, deadline);
        while ((now = now_ns()) < deadline && atomic_load(&s->gen) == gen)
            cpu_relax();
        if (atomic_load(&s->gen) != gen)
            return watch_again(s, gen, now); /* the block ended: stale, planned again */
    }
    if (phase == ROUND_SENT_A || phase == ROUND_SENT_B) { /* its next check: A's, or B's */
        if (round_asleep(s, phase))
            goto hand_over;
        /* The thread goes on by itself (round_b_here starts its next round):
         * a look meanwhile is a wake-up that may take the very CPU the
         * thread waits for, and is only for a thread gone to sleep. */
        return watch_again(s, gen, now + TC_WATCH_SLOW_NS);
    }
    /* Counted from the first round, not from the deadline: next to threads
     * that keep every CPU busy the watchdog itself wakes milliseconds late,
     * and handing over then, before any round, switched the hook's
     * interpreter-wide events on for the whole pool (measured). */
    if (phase == ROUND_IDLE && s->self_fire.kick_gen == gen &&
        now - s->self_fire.kicked_at >= TC_WATCH_MAX_NS)
        goto hand_over;
    (void)watch_again(s, gen, now + TC_WATCH_AFTER_NS); /* before the round: its reply may come first */
    /* The kick after the round's start: a blocking call kicked loose first
     * was back in it, or on its way there, when A was not met -- seen
     * running then, it was left a slow look late (measured).  Asleep in a
     * system call (round_asleep), it is handed over at once: looked at
     * again later instead, a blocking call's deadline landed a millisecond
     * later (measured). */
    if ((r = round_step(s, gen)) < 0 ||
        (r > 0 && (phase = atomic_load(&s->self_fire.round.phase)) == ROUND_SENT_A &&
         round_asleep(s, phase)))
        goto hand_over; /* no triggers, or A not met and its thread asleep */
    if (r > 0 && s->self_fire.kick_gen != gen) {
        s->self_fire.kick_gen = gen;
        s->self_fire.kicked_at = now;
        slot_wake_and_kick(s);
    }
    return 1;
hand_over:
    STAT_INC(pending_handovers);
usual:
    atomic_store(&s->self_fire.watch_at, 0);
    return 0;
}
#endif /* TC_SELF_FIRE_TRIGGER */

/* -- Hooks (tc_accel.h) ------------------------------------------------------ */

static int64_t self_fire_lead(void)
{
    if (!TC_SELF_FIRE_TRIGGER || !accel_on(ACCEL_SELF_FIRE))
        return 0;
    return accel_on(ACCEL_PREPARE) ? TC_WATCH_PREPARE_NS : TC_WATCH_SPIN_NS;
}

static int self_fire_owns(tc_slot *s)
{
#if TC_SELF_FIRE_TRIGGER
    return self_fire_look_at(s) != 0;
#else
    (void)s;
    return 0;
#endif
}

static void self_fire_on_enter(tc_slot *s)
{
#if TC_SELF_FIRE_TRIGGER
    if (!accel_on(ACCEL_SELF_FIRE))
        return;
    if (s->self_fire.trigger[TRIG_A] == NULL || s->self_fire.trigger[TRIG_B] == NULL ||
        s->self_fire.trigger[TRIG_A2] == NULL ||
        (s->self_fire.trigger[TRIG_P] == NULL && accel_on(ACCEL_PREPARE)))
        trigger_make(s);
#else
    (void)s;
#endif
}

static void self_fire_slot_reuse(tc_slot *s)
{
#if TC_SELF_FIRE_TRIGGER
    /* its maker's: deallocated here, doing nothing */
    for (int k = TRIG_A; k < TRIG_COUNT; k++)
        Py_CLEAR(s->self_fire.trigger[k]);
    PyObject *b = atomic_exchange(&s->self_fire.round.b, NULL);
    if (b != NULL) {
        ((sf_trigger *)b)->no = 0; /* a round given up numbered it: it does nothing now */
        Py_DECREF(b);
    }
    atomic_store(&s->self_fire.round.phase, ROUND_IDLE);
#else
    (void)s;
#endif
}
