/*
 * tc_accel.c -- deciding, once at import, which accelerators are on
 * (tc_accel.h lists them and where each is switched), and saying why one
 * is off.  Part of the unity build (timeoutcore.c).
 *
 * TIMEOUTCORE_ACCEL, read once here: unset, empty or "all" -- every
 * accelerator this build supports; "none" -- none; else a comma-separated
 * list of names -- those, and no other.  A name that is none of ours is
 * reported (tc_accel_unknown: the Python layer warns, naming the valid
 * ones) and the rest is applied: a typo must not cost an import, and an
 * environment written for a later version that has more accelerators must
 * still load.
 *
 * The internals (tc_gil.c) are checked, and used, only if an accelerator
 * that needs them is asked for ("all" does, even on a build where none of
 * them is supported: safe delivery's hook also reads gc.collecting, and
 * free-threaded builds have none of those three).  With none asked for,
 * nothing is read or written through a private address, exactly as after
 * a failed check: the hook then does without gc.collecting, and an
 * interrupt it raises inside a finalizer the collector runs is lost there
 * and sent again at the re-injection (tc_unraisable.c sees it dropped).
 * The thread-state check (tc_gil_check.c: tstate_check) runs whatever was
 * asked: it reads only the importing thread's own state, the fields the
 * core reads anyway, and writes nothing but through public calls.  The
 * fields only one accelerator reads (direct_delivery: the exception state;
 * frame_address: the current frame) are checked only where it is asked
 * for and supported, and a mismatch turns that one off.
 */

#include "tc_gil_check.c" /* its thread-state part: tstate_check */

#define TC_ACCEL_WHY_MAX 200

static const char *const g_accel_names[ACCEL_N] = {
    "anticipation", "fast_window", "self_fire", "prearm",    "sleeping_tracer",
    "direct_delivery", "prepare", "placement", "rescue", "remote_relay", "frame_address",
};

/* Off in this build, and why (NULL: supported): each accelerator's own
 * answer (tc_accel.h: <name>_unsupported, from tc_compat.h's switches). */
static const char *(*const g_accel_unsupported[ACCEL_N])(void) = {
    anticipation_unsupported,    fast_window_unsupported, self_fire_unsupported,
    prearm_unsupported,          sleeping_tracer_unsupported, direct_delivery_unsupported,
    prepare_unsupported,         placement_unsupported,   rescue_unsupported,
    remote_relay_unsupported,    frame_address_unsupported,
};

static const char *accel_unsupported(int a) { return g_accel_unsupported[a](); }

/* Reads or writes CPython internals through tc_gil.c. */
static int accel_uses_internals(int a)
{
    return a == ACCEL_FAST_WINDOW || a == ACCEL_SELF_FIRE || a == ACCEL_DIRECT_DELIVERY;
}

/* Works only with another one on (-1: none needed).  With a GIL the
 * pre-arm happens when the watchdog has the GIL ahead of the deadline,
 * which only anticipation gives it; the sleeping tracer and the placement
 * are for pre-armed slots. */
static int accel_needs(int a)
{
    if (a == ACCEL_PREARM && !TC_FREE_THREADED)
        return ACCEL_ANTICIPATION;
    if (a == ACCEL_PREPARE && TC_FREE_THREADED) /* the thread builds it: prepare_in_thread */
        return g_accel_on[ACCEL_SELF_FIRE] ? ACCEL_SELF_FIRE : ACCEL_PREARM;
    if (a == ACCEL_SLEEPING_TRACER || a == ACCEL_PLACEMENT)
        return ACCEL_PREARM;
    return -1;
}

static const char *g_accel_why[ACCEL_N]; /* NULL while on */
static char g_accel_failed[TC_ACCEL_WHY_MAX];  /* "failed its import check: ..." */
static char g_tstate_failed[TC_ACCEL_WHY_MAX]; /* the same, of the thread-state check:
                                                  the core itself then does not run */
static char g_exc_state_failed[TC_ACCEL_WHY_MAX]; /* the same, of the exception-state
                                                  check: direct_delivery is off */
static char g_frame_failed[TC_ACCEL_WHY_MAX];  /* the same, of the frame-address
                                                  check: frame_address is off */
static char g_accel_needs_why[ACCEL_N][64];    /* "needs X, which is off" */
static char g_self_fire_failed[TC_ACCEL_WHY_MAX]; /* self_fire's own check (self_fire_check) */
static char g_accel_unknown[256];              /* names none of ours, comma-separated */
static const char *g_internals = "not checked"; /* the import check: "passed", or why not */

/* Which TIMEOUTCORE_ACCEL asks for, into `asked` (all, none, or a list). */
static void accel_parse(int asked[ACCEL_N])
{
    const char *env = getenv("TIMEOUTCORE_ACCEL");
    char buf[512], *save = NULL, *tok;
    size_t len;
    for (int a = 0; a < ACCEL_N; a++)
        asked[a] = 1;
    g_accel_unknown[0] = '\0';
    if (env == NULL)
        return;
    len = strlen(env);
    if (len >= sizeof(buf))
        len = sizeof(buf) - 1;
    for (size_t i = 0; i < len; i++)
        buf[i] = (char)(env[i] >= 'A' && env[i] <= 'Z' ? env[i] - 'A' + 'a' : env[i]);
    buf[len] = '\0';
    tok = buf + strspn(buf, " \t");
    if (*tok == '\0' || strcmp(tok, "all") == 0)
        return;
    for (int a = 0; a < ACCEL_N; a++)
        asked[a] = 0;
    if (strcmp(tok, "none") == 0)
        return;
    for (tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        int found = 0;
        char *end;
        tok += strspn(tok, " \t");
        end = tok + strlen(tok);
        while (end > tok && (end[-1] == ' ' || end[-1] == '\t'))
            *--end = '\0';
        if (*tok == '\0')
            continue;
        for (int a = 0; a < ACCEL_N; a++)
            if (strcmp(tok, g_accel_names[a]) == 0)
                asked[a] = found = 1;
        if (!found) {
            size_t used = strlen(g_accel_unknown);
            (void)snprintf(g_accel_unknown + used, sizeof(g_accel_unknown) - used, "%s%s",
                           used > 0 ? "," : "", tok);
        }
    }
}

/* At import (tc_export.c: export_locked), GIL held: decide every flag,
 * then set up the switch interval's address (tc_compat.h) -- or leave it
 * unset, which is what turns the fast window off.  Returns 0. */
static int accel_setup(void)
{
    int asked[ACCEL_N], internals = 0, internals_ok = 0;
    char why[TC_ACCEL_WHY_MAX - 32];
    accel_parse(asked);
    /* The thread-state check runs whatever was asked: the core reads those
     * fields itself, so a mismatch keeps the whole core from running
     * (tc_accel_core_refused; timeoutcore._native refuses to load) -- no
     * accelerator needs turning off for it. */
    why[0] = '\0';
    if (!tstate_check(why, sizeof(why)))
        (void)snprintf(g_tstate_failed, sizeof(g_tstate_failed), "failed its import check: %s",
                       why);
    /* Another thread's exception state: read by direct_delivery alone. */
    why[0] = '\0';
    if (asked[ACCEL_DIRECT_DELIVERY] && direct_delivery_unsupported() == NULL &&
        !tstate_exceptions_check(why, sizeof(why)))
        (void)snprintf(g_exc_state_failed, sizeof(g_exc_state_failed),
                       "failed its import check: %s", why);
    /* The thread's current-frame address: read by frame_address alone. */
    why[0] = '\0';
    if (asked[ACCEL_FRAME_ADDRESS] && frame_address_unsupported() == NULL &&
        !frame_address_check(why, sizeof(why)))
        (void)snprintf(g_frame_failed, sizeof(g_frame_failed), "failed its import check: %s",
                       why);
    for (int a = 0; a < ACCEL_N; a++)
        if (asked[a] && accel_uses_internals(a)) /* even unsupported: the hook's gc test */
            internals = 1;
    why[0] = '\0';
    if (internals && !(internals_ok = tc_gil_setup(why, sizeof(why))))
        (void)snprintf(g_accel_failed, sizeof(g_accel_failed), "failed its import check: %s", why);
    if (internals)
        g_internals = internals_ok ? "passed" : g_accel_failed;
    for (int a = 0; a < ACCEL_N; a++) {
        const char *off = accel_unsupported(a);
        if (off == NULL && !asked[a])
            off = "switched off by TIMEOUTCORE_ACCEL";
        if (off == NULL && accel_uses_internals(a) && !internals_ok)
            off = g_accel_failed;
        if (off == NULL && a == ACCEL_DIRECT_DELIVERY && g_exc_state_failed[0] != '\0')
            off = g_exc_state_failed;
        if (off == NULL && a == ACCEL_FRAME_ADDRESS && g_frame_failed[0] != '\0')
            off = g_frame_failed;
        g_accel_why[a] = off;
        g_accel_on[a] = off == NULL;
    }
    /* Its mechanism, tried once (free-threaded: accel_self_fire_trigger.c). */
    why[0] = '\0';
    if (g_accel_on[ACCEL_SELF_FIRE] && !self_fire_check(why, sizeof(why))) {
        (void)snprintf(g_self_fire_failed, sizeof(g_self_fire_failed),
                       "failed its import check: %s", why);
        g_accel_why[ACCEL_SELF_FIRE] = g_self_fire_failed;
        g_accel_on[ACCEL_SELF_FIRE] = 0;
    }
    /* Free-threaded, the pre-arm switches the hook's events on ahead of a
     * deadline, for every thread; the self-fire needs none.  Rejected: the
     * pre-arm by default there, the self-fire only when named -- a CPU pool
     * whose deadlines fired often lost more than half its speed to the
     * events, and with its own rounds and the prepare's trigger the
     * self-fire lands deadlines as early or earlier, quiet or next to busy
     * threads (docs: accelerators, study ft-self-queue). */
    if (TC_FREE_THREADED && g_accel_on[ACCEL_SELF_FIRE] && g_accel_on[ACCEL_PREARM]) {
        g_accel_why[ACCEL_PREARM] = "off while self_fire is on (free-threaded builds)";
        g_accel_on[ACCEL_PREARM] = 0;
    }
    for (int a = 0; a < ACCEL_N; a++) { /* dependencies come earlier in the list */
        int need = accel_needs(a);
        if (g_accel_on[a] && need >= 0 && !g_accel_on[need]) {
            (void)snprintf(g_accel_needs_why[a], sizeof(g_accel_needs_why[a]),
                           "needs %s, which is off", g_accel_names[need]);
            g_accel_why[a] = g_accel_needs_why[a];
            g_accel_on[a] = 0;
        }
    }
    tc_switch_setup(accel_on(ACCEL_FAST_WINDOW));
    return 0;
}

/* The accelerators' part of the signal handler (tc_os.c: tc_handler), in
 * slot `s`'s thread, for a signal of its own kernel timer; the core's part
 * is errno and a counter.  With both accelerators below off it does
 * nothing (their hooks return at their first test).
 * Why these two run in the handler, and not in the watchdog or a pending
 * call (the rule for everything else):
 *   - sleeping_tracer (3.11) turns on the tracing byte of the frame data
 *     the thread is running, which lives on that thread's C stack: another
 *     thread may write it only while holding the GIL (as CPython's own
 *     _PyEval_SetTrace does), and the point of the alarm is that nobody
 *     has to win the GIL first; a pending call runs only in the main
 *     thread on 3.11.
 *   - rescue moves the watchdog onto the CPU this thread is running on,
 *     because the watchdog, due, is not getting one: at that moment only
 *     this thread is running here to give it up.
 * What each does there is async-signal-safe (tc_accel.h, at its hook). */
static void accel_on_signal(struct tc_slot *s)
{
    if (!sleeping_tracer_on_signal(s)) /* not the tracer's alarm */
        rescue_on_signal(s);
}

/* cffi entry points (timeoutcore.h), any thread, after tc_export. */
int tc_accel_count(void) { return ACCEL_N; }

const char *tc_accel_name(int i) { return i >= 0 && i < ACCEL_N ? g_accel_names[i] : NULL; }

int tc_accel_active(int i) { return i >= 0 && i < ACCEL_N && g_accel_on[i]; }

const char *tc_accel_why(int i) { return i >= 0 && i < ACCEL_N ? g_accel_why[i] : NULL; }

const char *tc_accel_unknown(void) { return g_accel_unknown; }

const char *tc_accel_internals(void) { return g_internals; }

const char *tc_accel_core_refused(void)
{
    return g_tstate_failed[0] != '\0' ? g_tstate_failed : NULL;
}
