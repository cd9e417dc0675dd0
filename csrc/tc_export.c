/*
 * tc_export.c -- fork handling (pthread_atfork: prepare, parent, child) and
 * the cffi entry points (tc_export, tc_get_stats and the small getters
 * declared in timeoutcore.h).  Part of the unity build (timeoutcore.c),
 * last.
 *
 * Who calls what: the atfork handlers run in the forking thread around
 * fork(); the child handler runs in the child where only that thread exists,
 * unlocks the mutexes the prepare handler took (g_mu, the fast window's,
 * the remote relay's), and otherwise uses raw system calls and plain stores.  The
 * tc_* entry points are called by cffi WITHOUT the GIL, from any thread;
 * tc_export takes the GIL itself, the others read relaxed atomics or plain
 * ints set at import.  None is a signal handler.
 */

/* ------------------------------------------------------------------------ */
/* fork                                                                     */

static void atfork_prepare(void)
{
    pthread_mutex_lock(&g_mu);
    fast_window_atfork_prepare(); /* never held together with g_mu elsewhere */
    remote_relay_atfork_prepare(); /* a leaf lock: this order is free */
}

static void atfork_parent(void)
{
    remote_relay_atfork_parent();
    fast_window_atfork_parent();
    pthread_mutex_unlock(&g_mu);
}

/* In the child, right after fork(), where only the forking thread exists:
 * the watchdog and every other thread are gone, and so are the parent's
 * kernel timers (they are not inherited).  g_mu and the fast window's were taken by
 * this same thread in atfork_prepare, so unlocking them is valid; besides that, only
 * raw syscalls and plain stores.  (Python-level work -- restarting the
 * watchdog -- is done later by _ensure_watchdog from os.register_at_fork.) */
static void atfork_child(void)
{
    remote_relay_atfork_child(); /* its marks; its entries: _remote_forget, after fork */
    self_fire_atfork_child();
    fast_window_atfork_child();
    pthread_mutex_unlock(&g_mu);
    wd_forget_after_fork();
    atomic_store(&g_st.timers_live, 0);
    atomic_store(&g_st.slots_live, 0);
    for (tc_slot *s = g_slots; s != NULL; s = s->next) {
        s->timer_ok = 0;
        atomic_store(&s->backstop_gen, 0);
        atomic_store(&s->exit_until, 0);
        if (s == t_slot && s->alive) {
            s->tid = (pid_t)syscall(SYS_gettid);
            STAT_INC(slots_live);
            (void)timer_make(s); /* without a timer, kick() uses tgkill */
        }
        else {
            s->alive = 0;
            atomic_store(&s->deadline, TC_NEVER);
            atomic_store(&s->state, SLOT_IDLE);
            atomic_fetch_add(&s->gen, 1);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Entry points for cffi (called without the GIL)                          */

static struct PyModuleDef g_moddef = {
    PyModuleDef_HEAD_INIT, NULL, "timeoutcore native core", -1, NULL, NULL, NULL, NULL, NULL,
};

static int export_locked(const char *modname)
{
    PyObject *mod, *t;
    if (!g_key_ok) {
        if (pthread_key_create(&g_key, slot_release) != 0) {
            PyErr_SetString(PyExc_RuntimeError, "timeoutcore: pthread_key_create failed");
            return -1;
        }
        g_key_ok = 1;
        if (pthread_atfork(atfork_prepare, atfork_parent, atfork_child) != 0) {
            PyErr_SetString(PyExc_RuntimeError, "timeoutcore: pthread_atfork failed");
            return -1;
        }
    }
    accel_setup(); /* which accelerators are on; the switch interval's address */
    g_moddef.m_name = modname;
    mod = PyModule_Create(&g_moddef);
    if (mod == NULL)
        return -1;
#if TC_FREE_THREADED
    /* Safe without the GIL (tc_lock.h).  The module is put in sys.modules by
     * hand, not imported, so this is a declaration for tools that look. */
    if (PyUnstable_Module_SetGIL(mod, Py_MOD_GIL_NOT_USED) < 0)
        goto fail;
#endif
    if (PyModule_AddFunctions(mod, mod_methods) < 0)
        goto fail;
    if (g_scope_type == NULL && (g_scope_type = scope_type_make()) == NULL)
        goto fail;
    if (g_shield_type == NULL && (g_shield_type = PyType_FromSpec(&Shield_spec)) == NULL)
        goto fail;
    Py_INCREF(g_scope_type);
    if (PyModule_AddObject(mod, "Scope", g_scope_type) < 0) {
        Py_DECREF(g_scope_type);
        goto fail;
    }
    Py_INCREF(g_shield_type);
    if (PyModule_AddObject(mod, "Shield", g_shield_type) < 0) {
        Py_DECREF(g_shield_type);
        goto fail;
    }
    t = PyImport_GetModuleDict();
    if (PyDict_SetItemString(t, modname, mod) < 0)
        goto fail;
    Py_DECREF(mod);
    return 0;
fail:
    Py_DECREF(mod);
    return -1;
}

int tc_export(const char *modname)
{
    PyGILState_STATE gs = PyGILState_Ensure();
    int r = export_locked(modname);
    if (r < 0)
        PyErr_Print();
    PyGILState_Release(gs);
    return r;
}

void tc_get_stats(struct tc_stats *o)
{
    o->slots_live = atomic_load(&g_st.slots_live);
    o->timers_live = atomic_load(&g_st.timers_live);
    o->fires = atomic_load(&g_st.fires);
    o->reinjections = atomic_load(&g_st.reinjections);
    o->kicks = atomic_load(&g_st.kicks);
    o->signals_seen = atomic_load(&g_st.signals_seen);
    o->watchdog_wakeups = atomic_load(&g_st.watchdog_wakeups);
    o->gil_takes = atomic_load(&g_st.gil_takes);
    o->requeues = atomic_load(&g_st.requeues);
    o->stale_scopes = atomic_load(&g_st.stale_scopes);
    o->hook_raises = atomic_load(&g_st.hook_raises);
    o->hook_defers = atomic_load(&g_st.hook_defers);
    o->hook_calls = atomic_load(&g_st.hook_calls);
    o->backstops = atomic_load(&g_st.backstops);
    o->async_fallbacks = atomic_load(&g_st.async_fallbacks);
    o->fast_windows = atomic_load(&g_st.fast_windows);
    o->rewait_errors = atomic_load(&g_st.rewait_errors);
    o->gil_holds = atomic_load(&g_st.gil_holds);
    o->prepared = atomic_load(&g_st.prepared);
    o->direct_raises = atomic_load(&g_st.direct_raises);
    o->pending_calls = atomic_load(&g_st.pending_calls);
    o->pending_raises = atomic_load(&g_st.pending_raises);
    o->pending_handovers = atomic_load(&g_st.pending_handovers);
    o->watch_sleeps = atomic_load(&g_st.watch_sleeps);
    o->remote_cancels = atomic_load(&g_st.remote_cancels);
    o->remote_relays = atomic_load(&g_st.remote_relays);
    o->exit_lingers = atomic_load(&g_st.exit_lingers);
    o->pins = atomic_load(&g_st.pins);
    o->rescues = atomic_load(&g_st.rescues);
    o->tracer_sleeps = atomic_load(&g_st.tracer_sleeps);
    o->tracer_alarms = atomic_load(&g_st.tracer_alarms);
    o->back_waits = atomic_load(&g_st.back_waits);
    o->exit_expiries = atomic_load(&g_st.exit_expiries);
    o->due_relays = atomic_load(&g_st.due_relays);
    o->dropped = atomic_load(&g_st.dropped);
    o->dropped_learned = atomic_load(&g_st.dropped_learned);
    o->bad_moves = atomic_load(&g_st.bad_moves);
    o->fast_ns = atomic_load(&g_st.fast_ns);
    o->prearms = atomic_load(&g_st.prearms);
    o->self_fires = atomic_load(&g_st.self_fires);
    o->hooked_now = 0;
    pthread_mutex_lock(&g_mu);
    for (tc_slot *s = g_slots; s != NULL; s = s->next)
        if (atomic_load(&s->hooked))
            o->hooked_now++;
    pthread_mutex_unlock(&g_mu);
}

int tc_signal_number(void) { return g_signo; }

int tc_watchdog_tid(void) { return wd_running() ? atomic_load(&g_wd_tid) : 0; }

int tc_bench_timer_pair(long n) { return timer_bench_pairs(t_slot, n); }
