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
 * the thread went to sleep (a system call, a lock) with a B queued, which
 * only its next check would merge.  A trigger deallocated elsewhere -- in
 * another thread (a collection merges every thread's queue with the world
 * stopped; the thread has exited), or in its thread outside a breaker
 * check (its exit, a collection it runs) -- only ends the round; the watch
 * hands the deadline to the core after TC_WATCH_MAX_NS.  A trigger acts
 * only for the thread and slot that made it (a slot reused drops its old
 * ones).  The interrupt, once set, is raised by P2; the slot's
 * async_pending has the scope's exit take it back should it not surface.
 * The watchdog takes the triggers inside the core lock and the slot's
 * lock, the thread makes them inside either (tc_lock.h), and B's
 * deallocation decides inside the core lock, as the hook does.
 *
 * The import check (trigger_check) confirms all of it on this interpreter
 * before self_fire is on: the bit PyThreadState_SetAsyncExc sets, and whole
 * rounds -- a helper thread plays the watchdog for the importing thread,
 * which spins in a loop, until a B raises, at the loop's back-edge, the
 * exception it set.
 */

#if TC_SELF_FIRE_TRIGGER
#include <fcntl.h>

enum {
    ROUND_IDLE = 0,   /* no round (the thread may ask for one)             */
    ROUND_SENT_A = 1, /* the watchdog dropped A                            */
    ROUND_SENT_B = 2, /* the thread queued a B to itself, for its next check */
};

typedef struct {
    PyObject_HEAD
    tc_slot *slot;                 /* NULL: the import check's            */
    struct self_fire_round *round; /* the round it belongs to             */
    unsigned long ident;           /* the thread that made it             */
    int second;                    /* B                                   */
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
static PyObject *trigger_new(tc_slot *s, struct self_fire_round *rd, int second)
{
    sf_trigger *t = PyObject_New(sf_trigger, &g_trigger_type);
    if (t == NULL) {
        PyErr_Clear();
        return NULL;
    }
    t->slot = s;
    t->round = rd;
    t->ident = PyThread_get_thread_ident();
    t->second = second;
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
 * triggers of the next round made (any that could not be: the watch hands
 * over). */
static void trigger_make(tc_slot *s)
{
    for (int k = 0; k < 2; k++)
        if (s->self_fire.trigger[k] == NULL)
            s->self_fire.trigger[k] = trigger_new(s, &s->self_fire.round, k);
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

/* The import check's rounds: how many at most, and for how long in all. */
#define TC_PROBE_ROUNDS 64
#define TC_PROBE_MAX_NS 2000000000LL

/* A, in its thread, during a pass P1 of its breaker check: queue the
 * round's B for P2 (above).  `s`: NULL for the check's. */
static void round_a_here(tc_slot *s, struct self_fire_round *rd, uint64_t no, int hops)
{
    int expected = ROUND_SENT_A;
    PyObject *b;
    if (no != atomic_load(&rd->seq))
        return; /* a round given up: nothing to do */
    if (tc_gc_collecting() || PyEval_GetFrame() == NULL) {
        /* Merged by a collection this thread runs (the world is stopped:
         * its next check is no pass of ours), or at its exit: the round
         * ends, and the watch hands the deadline over -- no trigger is
         * made here. */
        if (atomic_compare_exchange_strong(&rd->phase, &expected, ROUND_IDLE) && s != NULL)
            wd_wake();
        return;
    }
    if (hops > 0 && atomic_load(&rd->phase) == ROUND_SENT_A) {
        sf_trigger *next = (sf_trigger *)trigger_new(s, rd, 0);
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

/* -- The import check's rounds --------------------------------------------------- */

static struct {
    unsigned long target;      /* the importing thread                  */
    struct self_fire_round round;
    PyObject *trig[TC_PROBE_ROUNDS][2];
    PyObject *raise;           /* set by a B at a back-edge             */
    PyObject *give_up;         /* set the usual way if none did         */
    int lasti;                 /* where it set it                       */
    _Atomic int looping;       /* the target is about to spin           */
    _Atomic int raised;        /* one set `raise`                       */
    _Atomic int elsewhere;     /* one was deallocated in another thread */
} g_probe;

/* A probe B's deallocation: the round is over once it decided (the helper
 * then starts the next, or stops). */
static void probe_b_here(uint64_t no)
{
    PyThreadState *ts = PyThreadState_Get();
    PyFrameObject *f;
    if (round_b_armed(&g_probe.round, no, ts) && !atomic_load(&g_probe.raised) &&
        PyErr_Occurred() == NULL && (f = PyEval_GetFrame()) != NULL &&
        tc_breaker_back_edge(f) == 1) {
        g_probe.lasti = PyFrame_GetLasti(f);
        (void)PyThreadState_SetAsyncExc(g_probe.target, g_probe.raise);
        tc_own_breaker_clear(ts, g_trigger_bit);
        atomic_store(&g_probe.raised, 1);
    }
    if (no == atomic_load(&g_probe.round.seq))
        atomic_store(&g_probe.round.phase, ROUND_IDLE);
}

/* The helper thread: the watchdog's part, round after round, until a B
 * raised; else it stops the loop the usual way. */
static void *probe_helper(void *arg)
{
    (void)arg;
    PyGILState_STATE g = PyGILState_Ensure();
    PyThreadState *ts = PyEval_SaveThread(); /* waits detached: no stop of the world waits on it */
    int64_t until = now_ns() + TC_PROBE_MAX_NS;
    while (!atomic_load(&g_probe.looping) && now_ns() < until)
        cpu_relax();
    for (int i = 0; i < TC_PROBE_ROUNDS && !atomic_load(&g_probe.raised) && now_ns() < until;
         i++) {
        struct self_fire_round *rd = &g_probe.round;
        PyObject *a = g_probe.trig[i][0], *b = g_probe.trig[i][1];
        g_probe.trig[i][0] = g_probe.trig[i][1] = NULL;
        atomic_store(&rd->b, b);
        round_number(rd, a, b);
        trigger_drop(a);
        /* Over when B is deallocated, or A anywhere but at a pass of its
         * thread's: the phase is back to idle. */
        while (atomic_load(&rd->phase) != ROUND_IDLE && now_ns() < until)
            cpu_relax();
        if ((b = atomic_exchange(&rd->b, NULL)) != NULL) {
            ((sf_trigger *)b)->no = 0; /* never sent: its deallocation does nothing */
            trigger_drop(b);
        }
    }
    PyEval_RestoreThread(ts);
    if (!atomic_load(&g_probe.raised))
        (void)PyThreadState_SetAsyncExc(g_probe.target, g_probe.give_up);
    PyGILState_Release(g);
    return NULL;
}

static int probe_fail(char *why, size_t n, const char *what)
{
    (void)snprintf(why, n, "the self-fire's trigger: %s", what);
    return 0;
}

/* Rounds of the whole mechanism (above); 1 if the exception a B set
 * surfaced where it was set, in this thread. */
static int probe_rounds(char *why, size_t n)
{
    static const char src[] = "def probe():\n    while True:\n        pass\n";
    PyObject *ns = NULL, *code = NULL, *fn, *r = NULL, *exc = NULL, *tb = NULL, *at = NULL;
    pthread_t helper;
    int ok = 0, started = 0;
    memset(&g_probe, 0, sizeof g_probe);
    g_probe.target = PyThread_get_thread_ident();
    g_probe.raise = PyErr_NewException("timeoutcore._core._TriggerProbe", NULL, NULL);
    g_probe.give_up = PyErr_NewException("timeoutcore._core._TriggerProbeGaveUp", NULL, NULL);
    if (g_probe.raise == NULL || g_probe.give_up == NULL || (ns = PyDict_New()) == NULL ||
        PyDict_SetItemString(ns, "__builtins__", PyEval_GetBuiltins()) < 0 ||
        (code = Py_CompileString(src, "<timeoutcore probe>", Py_file_input)) == NULL ||
        (r = PyEval_EvalCode(code, ns, ns)) == NULL ||
        (fn = PyDict_GetItemString(ns, "probe")) == NULL) {
        PyErr_Clear();
        ok = probe_fail(why, n, "could not set up its probe");
        goto done;
    }
    Py_CLEAR(r);
    for (int i = 0; i < TC_PROBE_ROUNDS; i++)
        for (int k = 0; k < 2; k++)
            if ((g_probe.trig[i][k] = trigger_new(NULL, &g_probe.round, k)) == NULL) {
                ok = probe_fail(why, n, "could not make its triggers");
                goto done;
            }
    if (pthread_create(&helper, NULL, probe_helper, NULL) != 0) {
        ok = probe_fail(why, n, "could not start its helper thread");
        goto done;
    }
    started = 1;
    atomic_store(&g_probe.looping, 1);
    r = PyObject_CallNoArgs(fn);
    exc = PyErr_GetRaisedException();
    Py_BEGIN_ALLOW_THREADS
    (void)pthread_join(helper, NULL);
    Py_END_ALLOW_THREADS
    started = 0;
    if (exc == NULL || !PyErr_GivenExceptionMatches(exc, g_probe.raise)) {
        ok = probe_fail(why, n, atomic_load(&g_probe.elsewhere) > 0
                                    ? "it was deallocated in another thread"
                                    : "no round raised in the thread that made it");
        goto done;
    }
    tb = PyException_GetTraceback(exc);
    at = tb != NULL ? PyObject_GetAttrString(tb, "tb_lasti") : NULL;
    if (at == NULL || PyLong_AsLong(at) != g_probe.lasti) {
        PyErr_Clear();
        ok = probe_fail(why, n, "its exception surfaced elsewhere than where it was set");
        goto done;
    }
    ok = 1;
done:
    if (started) {
        Py_BEGIN_ALLOW_THREADS
        (void)pthread_join(helper, NULL);
        Py_END_ALLOW_THREADS
    }
    atomic_store(&g_probe.round.phase, ROUND_IDLE);
    for (int i = 0; i < TC_PROBE_ROUNDS; i++)
        for (int k = 0; k < 2; k++)
            Py_CLEAR(g_probe.trig[i][k]); /* ours: deallocated here, raising nothing */
    tc_own_breaker_clear(PyThreadState_Get(), g_trigger_bit); /* nothing left behind */
    Py_XDECREF(at);
    Py_XDECREF(tb);
    Py_XDECREF(exc);
    Py_XDECREF(r);
    Py_XDECREF(code);
    Py_XDECREF(ns);
    Py_CLEAR(g_probe.raise);
    Py_CLEAR(g_probe.give_up);
    return ok;
}

/* At import (tc_accel.c: accel_setup), attached, if self_fire is asked for:
 * 1 if PyThreadState_SetAsyncExc sets the bit of this thread's breaker that
 * the internal headers name, and a round of the mechanism works; else 0
 * with why.  Test hook: TIMEOUTCORE_TEST_CORRUPT_BREAKER_BIT=1 takes the
 * next bit instead: it must be refused. */
static int trigger_check(char *why, size_t n)
{
    PyThreadState *ts = PyThreadState_Get();
    uintptr_t bit = tc_async_exc_bit(), before, after;
    const char *corrupt = getenv("TIMEOUTCORE_TEST_CORRUPT_BREAKER_BIT");
    if (corrupt != NULL && strcmp(corrupt, "1") == 0)
        bit <<= 1;
    if (PyType_Ready(&g_trigger_type) < 0) {
        PyErr_Clear();
        return probe_fail(why, n, "its type could not be readied");
    }
    before = tc_own_breaker(ts);
    if (PyThreadState_SetAsyncExc(PyThread_get_thread_ident(), NULL) != 1)
        return probe_fail(why, n, "PyThreadState_SetAsyncExc did not find this thread");
    after = tc_own_breaker(ts);
    if (bit == 0 || (after & bit) == 0) {
        (void)snprintf(why, n,
                       "the self-fire's trigger: PyThreadState_SetAsyncExc did not set the "
                       "breaker bit %#lx (the breaker went %#lx -> %#lx)",
                       (unsigned long)bit, (unsigned long)before, (unsigned long)after);
        return 0;
    }
    tc_own_breaker_clear(ts, bit);
    g_trigger_bit = bit;
    if (!probe_rounds(why, n)) {
        g_trigger_bit = 0;
        return 0;
    }
    return 1;
}

/* -- The self-fire's rounds ------------------------------------------------------ */

/* B, in the slot's thread, the round to go on: the next round, A' queued to
 * itself (above).  Not B' at once: this very pass, whose copy has the bit,
 * clears it after the merge -- B' would find it clear.  0 if the triggers
 * could not be made (the watchdog starts the round). */
static int round_restart(struct self_fire_round *rd, tc_slot *s)
{
    PyObject *a = trigger_new(s, rd, 0), *b = a != NULL ? trigger_new(s, rd, 1) : NULL, *old;
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
    int live = PyEval_GetFrame() != NULL && !tc_gc_collecting(); /* not its exit, no collection */
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

static void trigger_dealloc(PyObject *o)
{
    sf_trigger *t = (sf_trigger *)o;
    tc_slot *s = t->slot;
    struct self_fire_round *rd = t->round;
    unsigned long ident = t->ident;
    int second = t->second, t_hops = t->hops;
    uint64_t no = t->no;
    Py_TYPE(o)->tp_free(o);
    if (no == 0)
        return; /* never sent (a slot reused, the check's leftovers) */
    if (ident != PyThread_get_thread_ident() || (s != NULL && s != t_slot)) {
        if (no == atomic_load(&rd->seq)) {
            atomic_store(&rd->phase, ROUND_IDLE); /* elsewhere: the round is over */
            if (s != NULL)
                wd_wake();
        }
        if (s == NULL)
            atomic_fetch_add(&g_probe.elsewhere, 1);
    }
    else if (!second)
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
    if (!moved && s->self_fire.trigger[0] != NULL &&
        (atomic_load(&rd->b) != NULL || s->self_fire.trigger[1] != NULL)) {
        a = s->self_fire.trigger[0];
        s->self_fire.trigger[0] = NULL;
        if (atomic_load(&rd->b) == NULL) { /* else a given-up round's, never sent */
            atomic_store(&rd->b, s->self_fire.trigger[1]);
            s->self_fire.trigger[1] = NULL;
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

/* Is thread `tid` of this process running or runnable (1), or asleep -- in
 * a system call, a lock (0)?  -1 if unknown.  Its state is the letter after
 * the command's closing parenthesis in /proc/self/task/<tid>/stat. */
static int thread_runnable(pid_t tid)
{
    char path[64], buf[512], *close_paren;
    ssize_t n;
    int fd;
    (void)snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return -1;
    n = read(fd, buf, sizeof buf - 1);
    (void)close(fd); /* read-only: nothing to lose */
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    if ((close_paren = strrchr(buf, ')')) == NULL || close_paren[1] != ' ')
        return -1;
    return close_paren[2] == 'R';
}

/* A watched slot whose A (or B) waits for its thread's next check: keep waiting
 * while the thread runs or waits for a CPU -- its check comes as soon as it
 * runs, and the hook's events would slow every thread meanwhile -- but not
 * for a thread asleep in a system call or a lock (or one whose state cannot
 * be read): the round needs two checks in a row, and such a thread, kicked
 * loose, may block again in between (a read() retried after EINTR).  That
 * round is given up (its A, merged later, does nothing) and the core fires
 * the slot: the scope is marked expired now, and the hook raises once the
 * thread is back.  1 to hand over. */
static int round_asleep(tc_slot *s, int phase)
{
    int expected = phase;
    return thread_runnable(s->tid) != 1 &&
           atomic_compare_exchange_strong(&s->self_fire.round.phase, &expected, ROUND_IDLE);
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
    if (now < deadline)
        return watch_again(s, gen, deadline);
    if (phase == ROUND_SENT_A || phase == ROUND_SENT_B) { /* its next check: A's, or B's */
        if (round_asleep(s, phase))
            goto hand_over;
        /* The thread goes on by itself (round_b_here starts its next round):
         * a look meanwhile is a wake-up that may take the very CPU the
         * thread waits for, and is only for a thread gone to sleep. */
        return watch_again(s, gen, now + TC_WATCH_SLOW_NS);
    }
    if (phase == ROUND_IDLE && now - deadline >= TC_WATCH_MAX_NS)
        goto hand_over;
    (void)watch_again(s, gen, now + TC_WATCH_AFTER_NS); /* before the round: its reply may come first */
    /* The kick after the round's start: a blocking call kicked loose first
     * was back in it, or on its way there, when A was not met -- seen
     * running then, it was left a slow look late (measured). */
    if ((r = round_step(s, gen)) < 0 ||
        (r > 0 && (phase = atomic_load(&s->self_fire.round.phase)) == ROUND_SENT_A &&
         round_asleep(s, phase)))
        goto hand_over; /* no triggers, or A not met and its thread asleep */
    if (r > 0 && s->self_fire.kick_gen != gen) {
        s->self_fire.kick_gen = gen;
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
    if (accel_on(ACCEL_SELF_FIRE) &&
        (s->self_fire.trigger[0] == NULL || s->self_fire.trigger[1] == NULL))
        trigger_make(s);
#else
    (void)s;
#endif
}

static void self_fire_slot_reuse(tc_slot *s)
{
#if TC_SELF_FIRE_TRIGGER
    /* its maker's: deallocated here, doing nothing */
    Py_CLEAR(s->self_fire.trigger[0]);
    Py_CLEAR(s->self_fire.trigger[1]);
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

static int self_fire_check(char *why, size_t n)
{
#if TC_SELF_FIRE_TRIGGER
    return trigger_check(why, n);
#else
    (void)why;
    (void)n;
    return 1;
#endif
}
