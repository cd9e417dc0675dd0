/*
 * accel_frame_address.c -- accelerator frame_address: the with statement's
 * frame known by its interpreter frame's address, so that a block's entry
 * makes no frame object.  Part of the unity build (timeoutcore.c).
 *
 * What the core does without it.  Safe delivery bounds its stack check by
 * the frame whose with statement entered the scope (tc_deliver.c:
 * is_scope_frame).  The core takes that frame's object at entry
 * (PyEval_GetFrame, public API), which makes one for a frame that has none
 * yet, holds it while the block runs, and asks its code whether the frame
 * is a wrapper's (PyFrame_GetCode).  Always correct; what it costs: making
 * the frame object is a visible share of a block's cost when each block
 * runs in a function call of its own, and free-threaded, PyFrame_GetCode's
 * new reference is an atomic add on a count every thread running that code
 * shares, which stops blocks from scaling across threads.
 *
 * What it does.  The scope records the address of its thread's current
 * _PyInterpreterFrame (tc_compat.h: tc_current_iframe) -- an identity,
 * never dereferenced -- and asks the code that frame runs (tc_gil.c:
 * tc_iframe_code, a borrowed reference) whether it is a wrapper's; the
 * delivery hook, in the thread, compares the address with the f_frame field
 * of the frame objects it walks (made then, at delivery; tc_compat.h:
 * tc_frame_iframe).  A live frame's object points at its stack data, a
 * finished one's at its own copy, so a stale address never matches.  A
 * wrapper scope (tc_guarded.c) is still known by its frame object: once the
 * wrapper has returned another frame may take its address.
 *
 * Private reads: the thread state's current frame, a frame object's
 * f_frame, and on 3.11 and free-threaded builds the frame's code.  Checked
 * at import (tc_gil_check.c: frame_address_check); a mismatch turns this
 * accelerator off, and the core takes the frame object as above.
 *
 * Where: 3.11, 3.12, 3.14 and 3.14t.  Not 3.13, where the core keeps the
 * frame object anyway, to find stale scopes (tc_compat.h: TC_TRACK_FRAMES),
 * so the address would save nothing; not 3.15+, whose frame layout is not
 * mirrored.
 *
 * State: per scope only (struct frame_address_scope, tc_accel.h), written
 * by the scope's own thread and read by the delivery's stack walk, all with
 * the GIL (free-threaded: attached, and only that thread walks its stack).
 */

static const char *frame_address_unsupported(void)
{
#if TC_IFRAME_ID && !TC_TRACK_FRAMES
    return NULL;
#elif TC_TRACK_FRAMES
    return "unsupported on this CPython (3.13 keeps the frame object at entry)";
#else
    return "unsupported on this CPython (3.11, 3.12 and 3.14 only)";
#endif
}

static int frame_address_enter(struct frame_address_scope *fa, PyThreadState *me)
{
#if TC_IFRAME_ID && !TC_TRACK_FRAMES
    if (!accel_on(ACCEL_FRAME_ADDRESS))
        return -1;
    fa->iframe = tc_current_iframe(me); /* tc_compat.h */
    return code_enters(tc_iframe_code(fa->iframe)); /* tc_guarded.c */
#else
    (void)fa, (void)me;
    return -1;
#endif
}

static int frame_address_is(const struct frame_address_scope *fa, PyFrameObject *f)
{
#if TC_IFRAME_ID && !TC_TRACK_FRAMES
    if (fa->iframe == NULL)
        return -1;
    return tc_frame_iframe(f) == fa->iframe;
#else
    (void)fa, (void)f;
    return -1;
#endif
}

static void frame_address_leave(struct frame_address_scope *fa)
{
    fa->iframe = NULL;
}
