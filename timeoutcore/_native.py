"""The native engine: the C core built by cffi, wired to the interpreter's life cycle.

Importing this module either yields an :class:`~timeoutcore._engine_api.Engine` (this
module: the C core's functions and types under the interface's names; ``core`` is the raw
module built by ``tc_export``) or raises ImportError; ``timeoutcore._engine`` decides what
to do then.
"""

from __future__ import annotations

import atexit
import os
import sys
from types import CodeType, ModuleType
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Literal, Optional, overload

from . import _fork
from .errors import DeadlineExceeded, _DeadlineInterrupt

if TYPE_CHECKING:
    from ._engine_api import EngineScope, EngineShield, Hook

if not sys.platform.startswith("linux"):
    raise ImportError("the native timeoutcore engine needs Linux (timer_create, SIGEV_THREAD_ID)")
# Free-threaded builds (timeoutcore._engine.FREE_THREADED) load the same core: it runs under
# its own lock there (csrc/tc_lock.h) and declares that it needs no GIL.

try:
    from ._timeoutcore import ffi, lib  # type: ignore[import-not-found]
except ModuleNotFoundError as _exc:
    if _exc.name != f"{__package__}._timeoutcore":
        raise  # the core is there but needs something missing (cffi's backend): say that
    # A pure-Python install (setup.py: TIMEOUTCORE_PURE_PYTHON=1, or a C core that could not
    # be compiled where it was installed) has no C core at all.
    raise ImportError(
        "this timeoutcore installation has no C core (a pure-Python build); on Linux, with "
        "a C compiler: pip install --force-reinstall --no-binary timeoutcore --no-cache-dir "
        "timeoutcore builds it (the build says why when it cannot: pip -v); the pure-Python "
        "engine needs a CPython with the GIL"
    ) from _exc

_MODNAME = "timeoutcore._core"

if lib.tc_export(_MODNAME.encode()) != 0:
    raise ImportError("timeoutcore: the native core failed to initialise (see stderr)")

# Rule: the C core reads a few thread-state fields itself (csrc/tc_compat.h); if the import
# check finds them elsewhere than this build expects -- a wheel meeting a CPython whose
# layout differs -- the core must not run at all: each read would be of a wrong address.
# Nothing has started yet (the watchdog, the signal handler and the timers come with the
# first block). Rejected: turning off only the accelerators that read more of the thread
# state -- the core's own reads stay. TIMEOUTCORE_ENGINE=auto then takes the pure-Python
# engine (with a GIL); =native, or a free-threaded CPython, gets this ImportError.
_refused = lib.tc_accel_core_refused()
if _refused != ffi.NULL:
    _why = ffi.string(_refused).decode()
    import logging

    logging.getLogger("timeoutcore").warning(
        "the C core %s; it does not run on this CPython (the pure-Python engine takes over "
        "where there is a GIL): deadlines still work, later", _why)
    raise ImportError(f"timeoutcore: the C core {_why}; it reads those thread-state fields "
                      "itself, so it does not run on this CPython")

core: ModuleType = sys.modules[_MODNAME]
core._setup(_DeadlineInterrupt, DeadlineExceeded)

# The watchdog must be joined before the interpreter finalises.
atexit.register(core._shutdown)
# fork: stop the watchdog before (no lock held across fork, and os.fork() on 3.12+ does
# not count it as a thread), restart it in parent and child where a deadline is armed.
def _after_fork_in_child() -> None:
    core._remote_forget()  # the parent's jobs' remote arms (csrc/accel_remote_relay.c)
    core._ensure_watchdog()


_fork.register(
    _fork.ENGINE,
    before=core._shutdown,
    after_in_parent=core._ensure_watchdog,
    after_in_child=_after_fork_in_child,
)


# --- the Engine interface (timeoutcore._engine_api): the C functions themselves, so a call
# through it costs what a call of the C module costs.

NAME = "native"
#: CPython 3.15+ raises the pending interrupt in PyErr_CheckSignals (cpython#144748), so the
#: core's signal ends time.sleep, socket calls and select by itself.
INTERRUPTS_RETRIED_CALLS = sys.version_info >= (3, 15)

Scope: type[EngineScope] = core.Scope
Shield: type[EngineShield] = core.Shield
sleep: Callable[[float], None] = core.sleep
checkpoint: Callable[[], None] = core.checkpoint
remaining: Callable[[], Optional[float]] = core.remaining
current_deadline: Callable[[], Optional[float]] = core.current_deadline
current_scope: Callable[[], Optional[EngineScope]] = core.current_scope
shield: Callable[[], EngineShield] = core.shield
#: The C shield never runs Python code: safe around any stdlib wait.
wait_shield: Callable[[], ContextManager[Any]] = core.shield
_set_default_hook: Callable[[Optional[Hook]], None] = core._set_default_hook
_raise_in_scope: Callable[[Any, type[BaseException]], bool] = core._raise_in_scope
scope_stacks: Callable[[bool], list[tuple[EngineScope, ...]]] = core._scope_stacks
wait_readable: Callable[..., bool] = core._wait_readable
remote_disarm: Callable[[Any], bool] = core._remote_disarm


def remote_arm(scope: Any, token: str) -> None:
    """The C core's remote arm; the token travels as the ASCII bytes it is published as."""
    core._remote_arm(scope, token.encode("ascii"))


# --- the latency accelerators (csrc/tc_accel.h), decided once at import -----------------------


def _accel_text(p: Any) -> Optional[str]:
    return None if p == ffi.NULL else str(ffi.string(p).decode())


_ACCELERATORS: dict[str, Optional[str]] = {
    str(_accel_text(lib.tc_accel_name(i))): (
        None if lib.tc_accel_active(i) else _accel_text(lib.tc_accel_why(i))
    )
    for i in range(lib.tc_accel_count())
}


@overload
def accelerators(explain: Literal[False] = False) -> dict[str, bool]: ...
@overload
def accelerators(explain: Literal[True]) -> dict[str, Optional[str]]: ...
def accelerators(explain: bool = False) -> "dict[str, bool] | dict[str, Optional[str]]":
    """The core's latency accelerators, name -> whether it is active in this process.

    Decided once, at import, from this CPython (what it supports), ``TIMEOUTCORE_ACCEL``
    and, for those that use CPython internals, a check of their addresses against the
    interpreter's public API. With ``explain=True``: name -> ``None`` if active, else why
    it is off ("unsupported on this CPython (...)", "switched off by TIMEOUTCORE_ACCEL",
    "failed its import check: ...", "needs <name>, which is off"). Deadlines are delivered
    with any of them off; each only makes some deadlines land sooner.
    """
    if explain:
        return dict(_ACCELERATORS)
    return {name: why is None for name, why in _ACCELERATORS.items()}


_unknown = _accel_text(lib.tc_accel_unknown())
if _unknown:
    import warnings as _warnings

    _warnings.warn(
        f"TIMEOUTCORE_ACCEL: {_unknown!r} names no accelerator (valid: "
        f"{', '.join(_ACCELERATORS)}, or 'all' / 'none'); the other names were applied",
        RuntimeWarning,
        stacklevel=2,
    )


# --- diagnostics of the C core (tests, benchmarks) -------------------------------------------


def internals_check() -> str:
    """The import check of the CPython internals the core may use (csrc/tc_gil_check.c):
    "passed", "not checked" (TIMEOUTCORE_ACCEL asked for no accelerator that uses the GIL
    state's internals; the thread state's fields, which the core reads itself, were checked
    and agreed -- else this module would not have loaded), or "failed its import check:
    <why>". Safe delivery also reads gc.collecting only after "passed"."""
    return str(_accel_text(lib.tc_accel_internals()))


#: The one reason an accelerator is off that is not worth a log line: the user's own choice.
_SWITCHED_OFF = "switched off by TIMEOUTCORE_ACCEL"


def _log_accelerators() -> None:
    """At import: one DEBUG line per accelerator that is off for a reason other than
    TIMEOUTCORE_ACCEL (this CPython, a failed import check, a dependency), and one WARNING
    per import check of CPython internals that failed -- a wheel meeting a CPython whose
    internal layout differs from the one it was built against -- naming the accelerators
    it turned off.

    The DEBUG lines only where ``logging`` is already imported: a plain import must not load
    it (tests/test_layers.py), and without it no handler exists yet that could receive
    them. A WARNING imports it: it must reach stderr even then (logging's last resort)."""
    failed: dict[str, list[str]] = {}
    if internals_check().startswith("failed"):  # also what safe delivery reads (gc.collecting)
        failed[internals_check()] = []
    for name, why in _ACCELERATORS.items():
        if why is not None and why.startswith("failed its import check"):
            failed.setdefault(why, []).append(name)
    if not failed and "logging" not in sys.modules:
        return
    import logging

    log = logging.getLogger("timeoutcore")
    for name, why in _ACCELERATORS.items():
        if why is not None and why != _SWITCHED_OFF:
            log.debug("accelerator %s is off: %s", name, why)
    for why, names in failed.items():
        off = (f"so {', '.join(names)} {'is' if len(names) == 1 else 'are'} off" if names
               else "so safe delivery does without the collector's state")
        log.warning("the C core %s; %s: deadlines still work, some land later "
                    "(timeoutcore.accelerators(explain=True) says why)", why, off)


_log_accelerators()


def stats() -> dict[str, int]:
    """Counters of the native core (live slots and timers, fires, kicks, ...)."""
    raw = ffi.new("struct tc_stats *")
    lib.tc_get_stats(raw)
    return {name: int(getattr(raw, name)) for name, _ in ffi.typeof("struct tc_stats").fields}


def signal_number() -> int:
    """The real-time signal the core uses (0 before the first scope was entered)."""
    return int(lib.tc_signal_number())


def watchdog_native_id() -> int:
    """Kernel thread id of the watchdog thread (0 when it is not running)."""
    return int(lib.tc_watchdog_tid())


def bench_timer_pair(n: int) -> None:
    """Run ``n`` kernel-timer arm+disarm pairs on this thread (benchmarks only)."""
    err = lib.tc_bench_timer_pair(n)
    if err:
        raise OSError(err, os.strerror(err))


def _set_protection(names: tuple[str, ...], codes: "set[CodeType] | None",
                    exempt: tuple[str, ...] = ()) -> None:
    core._set_protection(names, codes, exempt)


# Safe delivery (csrc/tc_deliver.c): interrupts surface at a line boundary outside protected
# code. If the hook cannot be set up (sys.monitoring has no free tool id), delivery falls
# back to plain asynchronous exceptions, and says so once.
try:
    DELIVERY: str = core._setup_delivery()
except Exception as _exc:  # noqa: BLE001 - reported, then the engine works unsafely
    import warnings as _warnings

    DELIVERY = "async"
    _warnings.warn(
        f"timeoutcore: safe delivery is off ({_exc}); deadline interrupts may land inside "
        "the standard library's critical sections",
        RuntimeWarning,
        stacklevel=2,
    )
else:
    from . import _deferral, _unraisable
    from . import protect as _protect

    _protect._install(_set_protection)
    _deferral._install(core._set_deferral_report)
    _unraisable.install()
