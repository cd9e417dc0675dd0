/*
 * accel_remote_relay.c -- accelerator remote_relay: a coordinator's cancel,
 * read off the Redis registry's control channel, applied without waiting
 * for the GIL.  Its hooks and per-slot/per-scope state: tc_accel.h.  Part
 * of the unity build (timeoutcore.c).
 *
 * Why.  A cancel reaches a worker process as a pub/sub message on the
 * registry's subscriber socket.  Applied in Python, it first waits for the
 * subscriber thread to get the GIL and then parses the message at the pace
 * of the fast window's GIL switches, each a turn behind the busy threads
 * (bench_contrib.py test_cancel_to_stop_latency) -- and only then does the
 * watchdog hear of it.  Here
 * the subscriber's wait (tc_module.c: _wait_readable with control=True,
 * remote_relay_on_readable) peeks at the bytes that woke it, still without
 * the GIL; a cancel for a
 * token that this process armed marks the scope and its slot and wakes the
 * watchdog, which fires the slot as it fires a deadline that has passed
 * (the self-fire included: tc_watchdog.c, slot_due_at, through
 * remote_relay_marked_at).  The subscriber
 * still reads and applies the message in Python afterwards, as before, and
 * its cancel() then finds the scope expired.  So this path can only make a
 * cancel earlier: a message it does not recognise, a partial read, a token
 * it has no entry for -- all of it is left to the Python path.  Off
 * (TIMEOUTCORE_ACCEL), nothing is peeked at and nothing marked; the arms
 * below are still kept (the registry makes them either way), unused.
 *
 * Contract.
 *   remote_arm, remote_disarm, remote_forget (the module's _remote_arm,
 *     _remote_disarm, _remote_forget): with the GIL (free-threaded: the core
 *     lock), from the registry; arm in the thread that is about to enter
 *     the scope (its observer's on_enter), disarm from any thread.  An entry
 *     owns a strong reference to its scope, so the scope outlives it.
 *   remote_peek: any thread, WITHOUT the GIL: reads the socket with MSG_PEEK
 *     (it never consumes a byte), and under g_relay.mu only compares tokens
 *     and stores atomics (Scope.relay, tc_slot.relay); then wakes the
 *     watchdog.  It never touches a Python object.
 *   remote_relay_apply: with the GIL / core lock, at fire time (slot_fire,
 *     pc_fire), and in the owner thread as its last shield or exit hook
 *     ends (tc_slot.c: slot_held): a marked scope that is still
 *     on its slot's stack, active and not expired, is cancelled exactly as
 *     DeadlineScope.cancel() does it -- `_cancelled` set, deadline now --
 *     before the due scope is looked for.  A mark for a scope that has
 *     left the stack, or that has not reached it yet, does nothing (the
 *     Python path still cancels it).
 *   g_relay.mu is a leaf lock: nothing else is taken while it is held.
 *   Fork: held across fork() (tc_export.c: atfork, through the
 *   remote_relay_atfork_* hooks); the child's entries
 *   belong to the parent's jobs and are dropped by remote_forget, which the
 *   Python-level after-fork hook calls (it may release references).
 */

/* A registry token: uuid4().hex, 32 lowercase hex digits. */
#define TC_TOKEN_LEN 32
/* How much of the socket's queue a peek looks at: a control message is
 * ~100 bytes; a burst larger than this is left to the Python path. */
#define TC_PEEK_MAX 8192

typedef struct tc_remote {
    struct tc_remote *next;
    PyObject *scope;        /* strong: released by remote_disarm (GIL)  */
    tc_slot *slot;          /* the arming thread's slot (never freed)   */
    char token[TC_TOKEN_LEN];
} tc_remote;

/* The accelerator's state. */
static struct {
    pthread_mutex_t mu;  /* entries (a leaf lock)                    */
    tc_remote *entries;  /* every armed scope                        */
    _Atomic int n;       /* how many, for a look without the mutex   */
} g_relay = {PTHREAD_MUTEX_INITIALIZER, NULL, 0};

/* GIL: arm `scope` to be cancelled by `token` (bytes, TC_TOKEN_LEN hex
 * digits) read off the control channel.  0, or -1 with an error set. */
static int remote_arm(PyObject *scope, PyObject *token)
{
    const char *t;
    if (!PyObject_TypeCheck(scope, (PyTypeObject *)g_scope_type)) {
        PyErr_Format(PyExc_TypeError, "_remote_arm(): a deadline scope is needed, not %.100s",
                     Py_TYPE(scope)->tp_name);
        return -1;
    }
    if (!PyBytes_Check(token) || PyBytes_GET_SIZE(token) != TC_TOKEN_LEN) {
        PyErr_SetString(PyExc_ValueError, "_remote_arm(): the token must be 32 bytes of hex digits");
        return -1;
    }
    t = PyBytes_AS_STRING(token);
    for (int i = 0; i < TC_TOKEN_LEN; i++)
        if (!((t[i] >= '0' && t[i] <= '9') || (t[i] >= 'a' && t[i] <= 'f'))) {
            PyErr_SetString(PyExc_ValueError,
                            "_remote_arm(): the token must be 32 lowercase hex digits");
            return -1;
        }
    tc_slot *s = slot_get(); /* the thread that enters the scope next */
    if (s == NULL)
        return -1;
    tc_remote *e = malloc(sizeof *e);
    if (e == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(e->token, t, TC_TOKEN_LEN);
    e->slot = s;
    e->scope = Py_NewRef(scope);
    atomic_store(&as_scope(scope)->relay.cancel, 0);
    pthread_mutex_lock(&g_relay.mu);
    for (tc_remote *o = g_relay.entries; o != NULL; o = o->next)
        if (o->scope == scope) {
            pthread_mutex_unlock(&g_relay.mu);
            Py_DECREF(e->scope);
            free(e);
            PyErr_SetString(PyExc_ValueError, "_remote_arm(): this scope is armed already");
            return -1;
        }
    e->next = g_relay.entries;
    g_relay.entries = e;
    atomic_fetch_add(&g_relay.n, 1);
    pthread_mutex_unlock(&g_relay.mu);
    return 0;
}

/* GIL: take `scope`'s entry back.  1 if it had one, 0 if not. */
static int remote_disarm(PyObject *scope)
{
    tc_remote *e = NULL;
    pthread_mutex_lock(&g_relay.mu);
    for (tc_remote **pp = &g_relay.entries; *pp != NULL; pp = &(*pp)->next)
        if ((*pp)->scope == scope) {
            e = *pp;
            *pp = e->next;
            atomic_fetch_sub(&g_relay.n, 1);
            break;
        }
    pthread_mutex_unlock(&g_relay.mu);
    if (e == NULL)
        return 0;
    atomic_store(&as_scope(e->scope)->relay.cancel, 0);
    Py_DECREF(e->scope); /* may run a finalizer: no lock of ours is held */
    free(e);
    return 1;
}

/* GIL, in a fork child: drop every entry (the parent's jobs). */
static void remote_forget(void)
{
    pthread_mutex_lock(&g_relay.mu);
    tc_remote *e = g_relay.entries;
    g_relay.entries = NULL;
    atomic_store(&g_relay.n, 0);
    pthread_mutex_unlock(&g_relay.mu);
    while (e != NULL) {
        tc_remote *next = e->next;
        Py_DECREF(e->scope);
        free(e);
        e = next;
    }
}

/* Without the GIL: mark the scope armed under `token` for cancelling.
 * Its slot, or NULL if no scope is armed under it. */
static tc_slot *remote_mark(const char *token)
{
    tc_slot *found = NULL;
    int64_t now = now_ns();
    pthread_mutex_lock(&g_relay.mu);
    for (tc_remote *e = g_relay.entries; e != NULL; e = e->next)
        if (memcmp(e->token, token, TC_TOKEN_LEN) == 0) {
            atomic_store(&as_scope(e->scope)->relay.cancel, 1);
            atomic_store(&e->slot->relay.at, now); /* before the flag: remote_relay_marked_at */
            atomic_store(&e->slot->relay.req, 1);
            found = e->slot;
            break;
        }
    pthread_mutex_unlock(&g_relay.mu);
    if (found) {
        STAT_INC(remote_cancels);
        wd_wake();
    }
    return found;
}

/* RESP: the integer of a "<digits>\r\n" line at *p (after its type byte);
 * advances *p past it.  -1 if incomplete or not a number. */
static long resp_number(const char **p, const char *end)
{
    const char *q = *p;
    long v = 0;
    int neg = 0, digits = 0;
    if (q < end && *q == '-') {
        neg = 1;
        q++;
    }
    while (q < end && *q >= '0' && *q <= '9' && digits < 9) {
        v = v * 10 + (*q++ - '0');
        digits++;
    }
    if (digits == 0 || end - q < 2 || q[0] != '\r' || q[1] != '\n')
        return -1;
    *p = q + 2;
    return neg ? -v : v;
}

/* RESP: a complete bulk string "$<len>\r\n<bytes>\r\n" at *p: its bytes in
 * *data, *len; advances *p past it.  0 if incomplete or something else. */
static int resp_bulk(const char **p, const char *end, const char **data, long *len)
{
    if (*p >= end || **p != '$')
        return 0;
    (*p)++;
    if ((*len = resp_number(p, end)) < 0 || end - *p < *len + 2)
        return 0;
    *data = *p;
    *p += *len + 2;
    return 1;
}

/* A complete cancel payload's token, or NULL.  The registry's Lua script
 * publishes cjson.encode({op='cancel', job=..., token=...}): compact JSON
 * whose string values escape every '"', so `"op":"cancel"` and
 * `"token":"` can only be its own keys, never text inside the job id. */
static const char *payload_cancel_token(const char *d, long n)
{
    static const char op[] = "\"op\":\"cancel\"", key[] = "\"token\":\"";
    const char *t;
    if (memmem(d, (size_t)n, op, sizeof op - 1) == NULL ||
        (t = memmem(d, (size_t)n, key, sizeof key - 1)) == NULL)
        return NULL;
    t += sizeof key - 1;
    if (d + n - t < TC_TOKEN_LEN + 1 || t[TC_TOKEN_LEN] != '"')
        return NULL;
    return t;
}

/* Without the GIL: look at what is queued on the subscriber's socket `fd`
 * (never consuming it) and mark every armed scope a complete cancel message
 * names.  Returns how many it marked if everything complete that was queued
 * was such a cancel (the subscriber's own reading of it is then no longer
 * urgent), their slots in `marked` (the first TC_PEEK_SLOTS); 0 otherwise --
 * including when it could not look. */
#define TC_PEEK_SLOTS 8
static int remote_peek(int fd, tc_slot **marked)
{
    char buf[TC_PEEK_MAX];
    const char *p = buf, *end;
    int handled = 0;
    if (atomic_load(&g_relay.n) == 0)
        return 0;
    ssize_t got = recv(fd, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT);
    if (got <= 0)
        return 0; /* not a socket, nothing yet, an error: the Python path reads it */
    end = buf + got;
    while (p < end) {
        /* A pub/sub push: RESP2 array '*' or RESP3 push '>' of three bulk
         * strings, "message", the channel, the payload.  Anything else (a
         * subscribe confirmation ends in an integer) is the Python path's. */
        const char *kind, *channel, *payload, *token;
        long kind_len, channel_len, payload_len;
        tc_slot *slot;
        if (*p != '*' && *p != '>')
            return 0;
        p++;
        if (resp_number(&p, end) != 3 || !resp_bulk(&p, end, &kind, &kind_len) ||
            !resp_bulk(&p, end, &channel, &channel_len) ||
            !resp_bulk(&p, end, &payload, &payload_len) || kind_len != 7 ||
            memcmp(kind, "message", 7) != 0 ||
            (token = payload_cancel_token(payload, payload_len)) == NULL ||
            (slot = remote_mark(token)) == NULL)
            return 0; /* something for the Python path: urgent as before */
        if (handled < TC_PEEK_SLOTS)
            marked[handled] = slot;
        handled++;
    }
    return handled;
}

/* Without the GIL, after remote_peek marked `n` slots: give their threads
 * the GIL first.  The subscriber would otherwise take it now to read the
 * same messages, which only find the jobs stopped -- a job that sleeps then
 * waits for it to finish, and next to
 * busy threads it is one more thread queued for the GIL.  Waits until each
 * slot's interrupt has been raised, claimed and its exit hooks have run, or
 * TC_REMOTE_YIELD_NS at most (a job in protected code, or blocked). */
static void remote_yield(tc_slot **marked, int n)
{
    int64_t end = now_ns() + TC_REMOTE_YIELD_NS;
    if (n > TC_PEEK_SLOTS)
        n = TC_PEEK_SLOTS;
    for (int i = 0; i < n; i++) {
        tc_slot *s = marked[i];
        while (now_ns() < end && (atomic_load(&s->relay.req) ||
                                  atomic_load(&s->state) == SLOT_INJECTED ||
                                  atomic_load(&s->exit_until) > now_ns()))
            sleep_until(now_ns() + TC_REMOTE_YIELD_STEP_NS);
    }
}

/* -- Hooks (tc_accel.h) ------------------------------------------------------ */

static int remote_relay_on_readable(int fd)
{
    tc_slot *marked[TC_PEEK_SLOTS];
    int handled;
    if (!accel_on(ACCEL_REMOTE_RELAY) || (handled = remote_peek(fd, marked)) <= 0)
        return 0;
    remote_yield(marked, handled); /* nothing urgent left: the jobs go first */
    return 1;
}

static int64_t remote_relay_marked_at(tc_slot *s)
{
    if (!accel_on(ACCEL_REMOTE_RELAY) || !atomic_load(&s->relay.req))
        return TC_NEVER;
    return atomic_load(&s->relay.at);
}

/* Leaves the slot as it was if an exception is being handled here (the
 * next fire applies the marks). */
static void remote_relay_apply(tc_slot *s, int64_t now)
{
    PyObject *name;
    if (!atomic_load(&s->relay.req) || PyErr_Occurred())
        return;
    if ((name = str_cancelled()) == NULL) {
        PyErr_Clear();
        return;
    }
    atomic_store(&s->relay.req, 0);
    for (PyObject *p = s->top; p != NULL; p = as_scope(p)->parent) {
        Scope *sc = as_scope(p);
        if (!atomic_exchange(&sc->relay.cancel, 0) || sc->state != SCOPE_ACTIVE ||
            sc->expired || sc->deadline <= now)
            continue;
        if (PyObject_SetAttr(p, name, Py_True) < 0) { /* what cancel() sets */
            PyErr_Clear();
            continue;
        }
        sc->deadline = now;
        prepare_drop(sc); /* for the old deadline */
    }
    slot_publish(s); /* a new gen in any case: the watchdog plans afresh */
}

/* A leaf lock: taken last, after the core's (tc_export.c: atfork_prepare). */
static void remote_relay_atfork_prepare(void) { pthread_mutex_lock(&g_relay.mu); }

static void remote_relay_atfork_parent(void) { pthread_mutex_unlock(&g_relay.mu); }

/* The entries stay: they are the parent's jobs, dropped by remote_forget,
 * which the Python-level after-fork hook calls (it may release
 * references).  The marks go. */
static void remote_relay_atfork_child(void)
{
    pthread_mutex_unlock(&g_relay.mu);
    for (tc_slot *s = g_slots; s != NULL; s = s->next)
        atomic_store(&s->relay.req, 0);
}

/* At import (tc_accel.h). */
static const char *remote_relay_unsupported(void)
{
    return NULL;
}
