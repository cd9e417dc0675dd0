"""A pytest-timeout backend: a test over ``--timeout`` fails, and the session goes on.

Off unless asked for::

    pytest -p timeoutcore.contrib.pytest --timeout=30

(or ``addopts = "-p timeoutcore.contrib.pytest"`` and ``timeout = 30`` in the pytest
configuration). It implements pytest-timeout's own hooks for "alternative timeout
implementation strategies", ``pytest_timeout_set_timer`` and ``pytest_timeout_cancel_timer``,
so pytest-timeout keeps deciding *which* limit applies (``--timeout``, the ``timeout`` ini
value, ``PYTEST_TIMEOUT``, ``@pytest.mark.timeout``, ``timeout_func_only``) and *when* the
timer is set and cancelled (around the whole protocol -- setup, call, teardown -- or around
the call with ``func_only``). This module decides *how*: instead of SIGALRM (main thread
only) or a timer thread that ends the process, every phase runs under a
:func:`~timeoutcore.thread_deadline_at` scope with the test's deadline, in the thread that
runs it -- the main thread, a pytest-xdist worker's, a pytest-run-parallel worker thread
(``timeoutcore.contrib._pytest_parallel``). ``--timeout-method`` is not consulted: this
backend replaces both methods.

At the deadline:

* the phase is interrupted wherever the test's (or fixture's) code is -- ``except
  Exception`` cannot keep it running -- and fails with pytest-timeout's message,
  ``Timeout (>Ns) from pytest-timeout.``, followed by the stacks of the other threads (in
  the failure's text, so JUnit XML and xdist's controller show them too);
* like pytest-timeout's signal method the timer is then spent: the later phases -- the
  fixtures' teardown -- run without it, and the session goes on to the next test;
* escalation: a test still running ``grace`` seconds after its deadline (a C call that
  never returns) gets pytest-timeout's thread method: stack dump, then ``os._exit(1)``
  (:mod:`timeoutcore.contrib._pytest_escalation`). So a run never hangs.

Blocking calls: ``timeoutcore.patch()`` is applied at ``pytest_configure`` unless the ini
value ``timeoutcore_patch = false``: ``time.sleep``, socket and TLS reads, queue and event
waits, ``subprocess`` waits then stop at the deadline (a test module's ``from time import
sleep`` runs after ``pytest_configure``, so it gets the patched function). A database query
stops with :func:`timeoutcore.contrib.db.guard` around it, as anywhere else.

pytest's own modules are not protected code (:mod:`timeoutcore.protect`): the phase's
scope is entered in a pluggy wrapper, which pluggy resumes from the frame that runs the
phase, so every pytest and pluggy frame under the test counts as inside the block, and a
protected one there would hold the interrupt back until the phase ends -- a CPU loop in a
test would never be stopped. The price: a deadline that lands in the few pytest lines that
register a fixture's teardown right after the fixture's setup code ran can lose that one
teardown (a timeout during setup only; a timeout in the test body never does).

Debugging: as pytest-timeout does, no deadline is set while a debugger is detected (unless
``--timeout-disable-debugger-detection``), and entering pdb (``breakpoint()``, ``--pdb``)
lifts the running test's deadline and escalation.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generator, Literal, Optional

import pytest

import timeoutcore
from timeoutcore import DeadlineExceeded, DeadlineScope

from . import _pytest_parallel
from ._pytest_escalation import Escalation

if TYPE_CHECKING:
    import pytest_timeout

__all__ = ["DEFAULT_GRACE"]

#: Seconds a test may run past its deadline before the process is ended.
DEFAULT_GRACE = 5.0

_GRACE_HELP = (
    "timeoutcore backend: seconds a test may run past its --timeout deadline (a C call that "
    f"never returns) before the stacks are dumped and the process ends (default {DEFAULT_GRACE:g})"
)
_PATCH_HELP = (
    "timeoutcore backend: apply timeoutcore.patch() so that sleeps, socket, queue and "
    "subprocess waits stop at the deadline (default true)"
)


@dataclass
class _Timer:
    """One test's deadline, from ``pytest_timeout_set_timer`` to ``cancel_timer``."""

    settings: Any  # pytest_timeout.Settings
    when: float  # time.monotonic() deadline
    spent: bool = False  # fired once, or cancelled: the later phases run without it
    in_workers: bool = False  # pytest-run-parallel runs the call in threads of its own


_BOOL: Literal["bool"] = "bool"  # a name, not a literal "bool": mypy reads that as a type
_TIMER = pytest.StashKey[_Timer]()
_PLUGIN = pytest.StashKey["_Backend"]()
_LABEL = "pytest "


class _Backend:
    """The session's state: the escalation watcher, what configure changed (undone at
    unconfigure), and the phase each thread runs under a deadline now."""

    def __init__(self, config: pytest.Config, grace: float) -> None:
        self.config = config
        self.grace = grace
        self.escalation = Escalation()
        self.patched = False
        self.lock = threading.Lock()
        # thread ident -> (item, timer, scope) while that thread runs a guarded phase
        self.active: dict[int, tuple[pytest.Item, _Timer, DeadlineScope]] = {}

    def close(self) -> None:
        self.escalation.close()
        if self.patched:
            timeoutcore.unpatch()


def _grace(config: pytest.Config) -> float:
    raw = config.getoption("timeoutcore_grace")
    where = "--timeoutcore-grace"
    if raw is None:
        raw = config.getini("timeoutcore_grace")
        where = "the timeoutcore_grace ini value"
    if raw in (None, ""):
        return DEFAULT_GRACE
    try:
        grace = float(raw)
    except (TypeError, ValueError):
        raise pytest.UsageError(f"{where} must be a number of seconds, got {raw!r}") from None
    if not 0 <= grace < float("inf"):
        raise pytest.UsageError(f"{where} must be finite and >= 0, got {raw!r}")
    return grace


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("timeout")
    group.addoption("--timeoutcore-grace", dest="timeoutcore_grace", default=None,
                    metavar="SECONDS", help=_GRACE_HELP)
    parser.addini("timeoutcore_grace", _GRACE_HELP)
    parser.addini("timeoutcore_patch", _PATCH_HELP, type=_BOOL, default=True)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.hasplugin("timeout"):
        raise pytest.UsageError(
            "timeoutcore.contrib.pytest is a backend for pytest-timeout, which is not "
            "installed or was disabled (-p no:timeout)"
        )
    backend = _Backend(config, _grace(config))
    if config.getini("timeoutcore_patch") and not timeoutcore.is_patched():
        timeoutcore.patch()
        backend.patched = True
    config.stash[_PLUGIN] = backend


def pytest_unconfigure(config: pytest.Config) -> None:
    backend = config.stash.get(_PLUGIN, None)
    if backend is not None:
        del config.stash[_PLUGIN]
        backend.close()


def pytest_report_header(config: pytest.Config) -> str:
    backend = config.stash[_PLUGIN]
    return (f"timeout backend: timeoutcore (engine {timeoutcore.ENGINE}, grace "
            f"{backend.grace:g}s, patch {'on' if timeoutcore.is_patched() else 'off'})")


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    # trylast: after pytest-run-parallel's own (tryfirst) hook has wrapped the tests
    for item in _pytest_parallel.guard_workers(session.items, _WORKER_HOOKS):
        item.stash[_PARALLEL] = True


_PARALLEL = pytest.StashKey[bool]()


def _debugging(settings: Any) -> bool:
    import pytest_timeout

    return not settings.disable_debugger_detection and bool(pytest_timeout.is_debugging())


@pytest.hookimpl(optionalhook=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: pytest_timeout.Settings) -> bool:
    """Arm ``item``'s deadline (``settings.timeout`` seconds from now) and its escalation;
    each phase then runs under it (:func:`_guard_phase`). Returns True: pytest-timeout's
    own timer is not set."""
    backend = item.config.stash[_PLUGIN]
    if _debugging(settings):
        return True
    timer = _Timer(settings=settings, when=time.monotonic() + float(settings.timeout),
                   in_workers=item.stash.get(_PARALLEL, False))
    item.stash[_TIMER] = timer
    backend.escalation.arm(id(item), timer.when + backend.grace,
                           lambda: _escalate(backend, item, timer))
    return True


@pytest.hookimpl(optionalhook=True)
def pytest_timeout_cancel_timer(item: pytest.Item) -> bool:
    """Spend ``item``'s deadline (the phases after this run without it) and disarm its
    escalation. Also called for a test that never had a timer (a skip in setup): a no-op
    then. Returns True: pytest-timeout's own cancel is not called."""
    timer = item.stash.get(_TIMER, None)
    if timer is not None:
        del item.stash[_TIMER]
        timer.spent = True
        item.config.stash[_PLUGIN].escalation.disarm(id(item))
    return True


def pytest_enter_pdb(config: pytest.Config) -> None:
    """A debugger session in a guarded phase: lift that test's deadline and escalation."""
    backend = config.stash.get(_PLUGIN, None)
    if backend is None:
        return
    with backend.lock:
        entry = backend.active.get(threading.get_ident())
    if entry is not None:
        item, timer, scope = entry
        timer.spent = True
        backend.escalation.disarm(id(item))
        scope.reschedule(None)


def _failure_text(backend: _Backend, timer: _Timer) -> str:
    """pytest-timeout's failure message, then the stacks of the other threads as its signal
    method dumps them (the escalation watcher's left out)."""
    import pytest_timeout

    lines = [pytest_timeout.PYTEST_FAILURE_MESSAGE % timer.settings.timeout]
    skip = {threading.get_ident()}
    watcher = backend.escalation.thread
    if watcher is not None and watcher.ident is not None:
        skip.add(watcher.ident)
    names = {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        if ident in skip:
            continue
        lines.append(f"{'~' * 20} Stack of {names.get(ident, '<unknown>')} ({ident}) {'~' * 20}")
        lines.append("".join(traceback.format_stack(frame)).rstrip("\n"))
    return "\n".join(lines)


def _guarded(item: pytest.Item, timer: _Timer) -> Generator[None, None, None]:
    """The body of every guarded region: enter ``timer``'s deadline in this thread, yield
    once (the region runs), leave it; a deadline of ours that fired becomes
    pytest-timeout's failure (``pytest.fail``) and spends the timer.

    A generator rather than a context manager so that the pluggy wrappers below can yield
    from it: the phase's implementations run while the wrapper is suspended at its yield,
    so the scope is entered before that yield and left when pluggy resumes the wrapper with
    the phase's result or exception (thrown into this generator by the ``yield from``)."""
    __tracebackhide__ = True
    backend = item.config.stash[_PLUGIN]
    scope = timeoutcore.thread_deadline_at(timer.when, label=f"{_LABEL}{item.nodeid}")
    ident = threading.get_ident()
    with backend.lock:
        backend.active[ident] = (item, timer, scope)
    try:
        with scope:
            yield
    except DeadlineExceeded as exc:
        if exc.scope is not scope:
            raise  # a deadline of the test's own
        timer.spent = True
        # The failure carries the traceback of the interrupt -- from the line of the test
        # (or fixture) where it surfaced -- rather than this frame's, and no chain: the
        # report reads as pytest-timeout's signal method's.
        interrupt = exc.__context__ if exc.__context__ is not None else exc
        failure = pytest.fail.Exception(_failure_text(backend, timer), pytrace=True)
        raise failure.with_traceback(interrupt.__traceback__) from None
    finally:
        with backend.lock:
            backend.active.pop(ident, None)


def _needs_guard(item: pytest.Item, timer: Optional[_Timer]) -> bool:
    backend = item.config.stash[_PLUGIN]
    return timer is not None and not timer.spent and threading.get_ident() not in backend.active


def _worker_enter(item: pytest.Item) -> Optional[DeadlineScope]:
    """In a pytest-run-parallel worker thread: a new scope with the item's deadline, for
    the caller to enter around the test function itself, or None (no deadline, or spent)."""
    timer = item.stash.get(_TIMER, None)
    if timer is None or not _needs_guard(item, timer):
        return None
    backend = item.config.stash[_PLUGIN]
    scope = timeoutcore.thread_deadline_at(timer.when, label=f"{_LABEL}{item.nodeid}")
    with backend.lock:
        backend.active[threading.get_ident()] = (item, timer, scope)
    return scope


def _worker_leave(item: pytest.Item, scope: DeadlineScope, exc: Optional[BaseException]) -> None:
    """After :func:`_worker_enter`'s scope was left; ``exc`` what it raised. Raises the
    timeout's failure when that was this scope's deadline."""
    __tracebackhide__ = True
    backend = item.config.stash[_PLUGIN]
    with backend.lock:
        entry = backend.active.pop(threading.get_ident(), None)
    if isinstance(exc, DeadlineExceeded) and exc.scope is scope and entry is not None:
        timer = entry[1]
        timer.spent = True
        interrupt = exc.__context__ if exc.__context__ is not None else exc
        failure = pytest.fail.Exception(_failure_text(backend, timer), pytrace=True)
        raise failure.with_traceback(interrupt.__traceback__) from None


_WORKER_HOOKS = _pytest_parallel.Hooks(enter=_worker_enter, leave=_worker_leave)


def _guard_phase(item: pytest.Item, when: str) -> Generator[None, Any, Any]:
    __tracebackhide__ = True
    timer = item.stash.get(_TIMER, None)
    if timer is None or not _needs_guard(item, timer) or (when == "call" and timer.in_workers):
        # in_workers: the call's worker threads carry the deadline; this thread only joins
        # them (stopping it would leave them running into the teardown)
        return (yield)
    region = _guarded(item, timer)
    next(region)
    try:
        result = yield
    except BaseException as exc:
        region.throw(exc)
        raise
    try:
        next(region)
    except StopIteration:
        pass
    return result


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _guard_phase(item, "setup"))


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _guard_phase(item, "call"))


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _guard_phase(item, "teardown"))


def _escalate(backend: _Backend, item: pytest.Item, timer: _Timer) -> None:
    """On the watcher thread, ``grace`` seconds after a deadline the test did not stop at:
    pytest-timeout's thread method (dump the stacks, ``os._exit(1)``)."""
    import pytest_timeout

    sys.stderr.write(
        f"\ntimeoutcore: {item.nodeid} is still running {backend.grace:g}s after its "
        f"{timer.settings.timeout:g}s timeout; ending the process (pytest-timeout's thread "
        "method)\n"
    )
    sys.stderr.flush()
    pytest_timeout.timeout_timer(item, timer.settings)
