/*
 * accel_self_fire_probe.c -- accelerator self_fire on a free-threaded
 * build: its import check (trigger_check).  It confirms the mechanism of
 * accel_self_fire_trigger.c on this interpreter before self_fire is on:
 * the bit PyThreadState_SetAsyncExc sets, and whole rounds -- a helper
 * thread plays the watchdog for the importing thread, which spins in a
 * loop, until a B raises, at the loop's back-edge, the exception it set.
 * Its state is g_probe, the importing thread's while the check runs.  Part
 * of the unity build (timeoutcore.c), after accel_self_fire_trigger.c.
 */

#if TC_SELF_FIRE_TRIGGER
/* The check's rounds: how many at most, and for how long in all. */
#define TC_PROBE_ROUNDS 64
#define TC_PROBE_MAX_NS 2000000000LL

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
            if ((g_probe.trig[i][k] = trigger_new(NULL, &g_probe.round, k == 0 ? TRIG_A : TRIG_B)) == NULL) {
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

/* A probe trigger deallocated in another thread (trigger_dealloc). */
static void probe_elsewhere(void) { atomic_fetch_add(&g_probe.elsewhere, 1); }
#endif /* TC_SELF_FIRE_TRIGGER */

/* -- Hooks (tc_accel.h) ------------------------------------------------------ */

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
