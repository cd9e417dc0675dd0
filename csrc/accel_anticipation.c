/*
 * accel_anticipation.c -- accelerator anticipation: with a GIL, the
 * watchdog asks for the GIL one switch interval (plus a margin, plus the
 * crowd it has lately queued behind) before a deadline, so that it holds
 * the GIL at the deadline instead of starting to wait for it there.  This
 * file keeps the lead and what it is made of; the core reads it at named
 * points (tc_accel.h): the planner and wd_notify (when to wake for a
 * slot), the 3.11 self pre-arm (a deadline nearer than the lead), and the
 * watchdog's loop, which learns the crowd from each take and, with the GIL
 * come early, either gives it back until just before the deadline
 * (requeue) or holds it up to the deadline -- that part is the watchdog's
 * lead (tc_wd_fire.c: wd_lead): it is what the core does whenever it holds
 * the GIL ahead of a deadline, and with the lead 0 it is not reached.  Off (or
 * free-threaded), the lead is 0.  Part of the unity build (timeoutcore.c),
 * before tc_watchdog.c.
 */

/* The accelerator's state: written by the watchdog (and wd_ensure, GIL
 * held), read by any thread without a lock. */
static struct {
    _Atomic int64_t lead;      /* how long before a deadline it asks for
                                  the GIL (0: at the deadline)            */
    _Atomic int64_t switch_ns; /* the switch interval it plans with       */
    /* How much longer than one switch interval the watchdog has lately
     * waited for the GIL ahead of a deadline (an average over the last
     * ~TC_CROWD_WEIGHT waits): ~0 in a quiet process, the queue in front of
     * it in a crowded one.  With a GIL the lead grows by it
     * (anticipation_refresh, at most TC_LEAD_CROWD_MAX_NS), so that the
     * watchdog is at the deadline in time; free-threaded there is no lead,
     * and it is only reported. */
    _Atomic int64_t crowd_ns;
} g_ant = {TC_SWITCH_DEFAULT_NS + TC_LEAD_MARGIN_NS, TC_SWITCH_DEFAULT_NS, 0};

static void anticipation_learn(int64_t waited)
{
    int64_t extra = waited - atomic_load(&g_ant.switch_ns), c = atomic_load(&g_ant.crowd_ns);
    atomic_store(&g_ant.crowd_ns, c + ((extra > 0 ? extra : 0) - c) / TC_CROWD_WEIGHT);
}

/* With the GIL: keep the lead one switch interval + a margin (with the
 * accelerator off: 0, the GIL asked for at the deadline).  Free-threaded:
 * no GIL to ask for, so no lead at all. */
static void anticipation_refresh(void)
{
#if TC_FREE_THREADED
    atomic_store(&g_ant.lead, 0);
    atomic_store(&g_ant.switch_ns, 0);
    return;
#endif
    /* sys.getswitchinterval from the sys module's dict: no import (no import
     * lock for the watchdog) and nothing the collector tracks is made.
     * Rejected: PyImport_GetModule("sys") -- its check of the module's spec
     * made and dropped an AttributeError at every pass, which could start a
     * collection, and so run arbitrary finalizers, in the watchdog. */
    double v = 0.0;
    PyObject *fn = PySys_GetObject("getswitchinterval"); /* borrowed */
    PyObject *r = fn != NULL ? PyObject_CallNoArgs(fn) : NULL;
    if (r != NULL) {
        v = PyFloat_AsDouble(r);
        Py_DECREF(r);
    }
    if (PyErr_Occurred())
        PyErr_Clear();
    if (!(v > 0 && v < 10.0))
        return;
    int64_t sw = (int64_t)(v * 1e9), margin = TC_LEAD_MARGIN_NS;
    /* Inside the fast window the value read is ours; in whole microseconds
     * (the float of 200 us converts to 199999 ns). */
    if (tc_lower_switch_supported() && (unsigned long)((sw + 500) / 1000) >= TC_FAST_SWITCH_US) {
        sw = (int64_t)TC_FAST_SWITCH_US * 1000; /* what gil_take() waits */
        margin = TC_LEAD_MARGIN_FAST_NS;
    }
    int64_t crowd = atomic_load(&g_ant.crowd_ns); /* no anticipation: the GIL asked for at the deadline */
    atomic_store(&g_ant.lead, !accel_on(ACCEL_ANTICIPATION) ? 0
                          : sw + margin + (crowd < TC_LEAD_CROWD_MAX_NS ? crowd : TC_LEAD_CROWD_MAX_NS));
    atomic_store(&g_ant.switch_ns, sw);
}

static int64_t anticipation_lead(void) { return atomic_load(&g_ant.lead); }

static int64_t anticipation_switch_ns(void) { return atomic_load(&g_ant.switch_ns); }

static void anticipation_figures(int64_t *lead, int64_t *switch_ns, int64_t *crowd_ns)
{
    *lead = atomic_load(&g_ant.lead);
    *switch_ns = atomic_load(&g_ant.switch_ns);
    *crowd_ns = atomic_load(&g_ant.crowd_ns);
}

/* At import (tc_accel.h). */
static const char *anticipation_unsupported(void)
{
    return TC_FREE_THREADED ? "unsupported on this CPython (free-threaded: no GIL)" : NULL;
}
