"""Protected code: where a deadline's interrupt never surfaces.

An interrupt that surfaces inside ``logging.Handler.acquire`` just after the lock was
taken, in ``Condition.__enter__``, or half-way through ``Queue``/``Future`` bookkeeping
leaves a lock held or an invariant broken for the whole process: every later log call
hangs, a queue counts wrong, a future never runs its callbacks. So the native core delivers
a fired interrupt at a *line boundary* in the guarded thread, and only when no frame
between the innermost one and the frame of the scope's ``with`` statement runs protected
code; until then it waits (``scope.deferred`` tells for how long, and
``scope.deferred_where`` where). Safety over punctuality: a thread stuck inside protected
code (say, ``queue.Queue.get()`` without ``patch()``) is interrupted when it returns to
your code; with ``patch()`` such waits end at the deadline by themselves, at a point where
no lock is held.

What is protected by default, and why (a module counts with its submodules):

* ``threading``, ``_threading_local``, ``queue``: every lock wrapper, ``Condition``,
  ``Semaphore``, ``Event``, ``Barrier``, ``Thread.join`` and the queues hold a lock or a
  counter across several bytecodes.
* ``logging``: handler locks (``Handler.acquire``/``release``) and the module lock
  (``getLogger``, ``setLevel``, handler lists).
* ``concurrent.futures``: ``Future`` state changes and callbacks, ``wait()``'s waiters,
  the executors' work queues and shutdown locks.
* ``multiprocessing``, ``asyncio``: their queues, locks, feeder threads and thread-safe
  hand-offs (``call_soon_threadsafe``) are built on the same primitives.
* ``subprocess``: ``Popen`` waits, ``communicate`` and the child's bookkeeping (a half-done
  ``_wait`` loses the exit status).
* ``selectors``, ``socketserver``: registration maps that must match the kernel's.
* ``weakref``, ``_weakrefset``: ``WeakValueDictionary``/``WeakSet`` pending-removal
  guards (``_IterationGuard``).
* ``importlib`` (with its frozen ``_frozen_importlib*`` bootstrap) and ``zipimport``: the
  per-module import locks; an import torn half-way leaves a broken module in
  ``sys.modules``.
* ``contextlib``: ``ExitStack`` and ``@contextmanager`` exits (an interrupt there skips the
  remaining exit callbacks).
* ``functools``: ``cached_property``'s lock (3.11).
* ``tempfile``: the lock around its name generator; ``sched``: the scheduler's lock;
  ``warnings``: the filters' state (locked from 3.13).
* ``timeoutcore``: the library's own bookkeeping; its deadline-aware waits raise at their
  own explicit points. Except ``timeoutcore.cli``: the command line's demo workloads
  stand for your code and must be stopped like it (they were held back to their end
  while the whole package was protected: a 750 ms overshoot in the demo).

Protected whatever its module, by its name: code named ``__exit__``, ``__aexit__``,
``__enter__``, ``__aenter__`` or ``__del__``. An exit interrupted half-way skips the rest of
its cleanup (a wrapper's ``__exit__`` never reaches the scope's own exit it was about to
call, and the internal interrupt escapes); an entry interrupted after it took a resource
leaks it, because the ``with`` statement that would release it has not started; a finalizer
run by reference counting is an "unraisable" context, where CPython reports the exception
as ignored and drops it. Also protected: code where CPython once dropped an interrupt (a
weakref callback, any other unraisable context), learned by the core when that happened.
(A scope's own block is never judged by these rules: a scope opened and closed inside an
``__enter__`` still interrupts its block.)

Not protected: the I/O and networking modules (``socket``, ``ssl``, ``http``, ``urllib``,
``select``): interrupting a read or a request is the point, and a torn connection belongs
to the block that is being stopped.
"""

from __future__ import annotations

import threading
import types
from typing import Any, Callable, TypeVar

DEFAULT_PROTECTED: tuple[str, ...] = (
    "threading",
    "_threading_local",
    "queue",
    "logging",
    "concurrent.futures",
    "multiprocessing",
    "asyncio",
    "subprocess",
    "selectors",
    "socketserver",
    "weakref",
    "_weakrefset",
    "importlib",
    "_frozen_importlib",
    "_frozen_importlib_external",
    "zipimport",
    "contextlib",
    "functools",
    "tempfile",
    "sched",
    "warnings",
    "timeoutcore",
)

#: Modules under a protected one that are not protected (the more specific name wins).
DEFAULT_EXEMPT: tuple[str, ...] = ("timeoutcore.cli",)

F = TypeVar("F", bound=Callable[..., Any])
_Apply = Callable[[tuple[str, ...], "set[types.CodeType] | None", tuple[str, ...]], None]

_lock = threading.Lock()
_modules: list[str] = list(DEFAULT_PROTECTED)
_exempt: list[str] = list(DEFAULT_EXEMPT)
_codes: set[types.CodeType] = set()
_apply: _Apply | None = None


def _covers(package: str, name: str) -> bool:
    return name == package or name.startswith(package + ".")


def _install(apply: _Apply) -> None:
    """Called by the engine that delivers safely, with its setter; applies the set now."""
    global _apply
    _apply = apply
    _push()


def _push() -> None:
    if _apply is not None:
        _apply(tuple(_modules), set(_codes) if _codes else None, tuple(_exempt))


def protect_module(name: str) -> None:
    """Protect module ``name`` and its submodules (by ``__name__``), like the standard
    library's lock-holding modules: no deadline interrupt surfaces while its code is on the
    guarded thread's stack."""
    if not isinstance(name, str) or not name or name.startswith(".") or name.endswith("."):
        raise ValueError(f"protect_module(): name must be a dotted module name, got {name!r}")
    with _lock:
        if name in _exempt:
            _exempt.remove(name)
        if name not in _modules:
            _modules.append(name)
        _push()


def unprotect_module(name: str) -> None:
    """Undo :func:`protect_module` (also for a default; at your own risk). For a module
    under a protected package (``unprotect_module("mypkg.jobs")`` while ``mypkg`` is
    protected) it exempts that module and its submodules."""
    with _lock:
        if name in _modules:
            _modules.remove(name)
        if any(_covers(p, name) for p in _modules) and name not in _exempt:
            _exempt.append(name)
        # an exemption under nothing protected any more is gone with it
        _exempt[:] = [e for e in _exempt if any(_covers(p, e) for p in _modules)]
        _push()


def protected_modules() -> tuple[str, ...]:
    """The module names protected now (each with its submodules, except those that
    :func:`is_protected_module` says are exempt)."""
    with _lock:
        return tuple(_modules)


def _rule(name: str, modules: tuple[str, ...], exempt: tuple[str, ...]) -> bool:
    prot = max((len(p) for p in modules if _covers(p, name)), default=-1)
    free = max((len(p) for p in exempt if _covers(p, name)), default=-1)
    return prot >= 0 and free <= prot


def _snapshot() -> tuple[tuple[str, ...], tuple[str, ...], frozenset[types.CodeType]]:
    """The protected modules, exemptions and code objects, read without the lock (for a
    signal handler, which may have interrupted a holder of it; each read is one copy)."""
    return tuple(_modules), tuple(_exempt), frozenset(_codes)


def is_protected_module(name: str) -> bool:
    """Whether code whose ``__name__`` is ``name`` counts as protected: a protected entry
    covers it and no more specific exemption does (the rule the core applies)."""
    with _lock:
        return _rule(name, tuple(_modules), tuple(_exempt))


def protected(fn: F) -> F:
    """Decorator: no deadline interrupt surfaces while a call of ``fn`` is on the guarded
    thread's stack (``fn`` itself and everything it calls).

    The interrupt waits until ``fn`` has returned to unprotected code; ``fn`` is returned
    unchanged (its code object is registered). Use it for your own code that holds a lock
    or an invariant across several statements; for a cleanup block use
    ``timeoutcore.shield()``.
    """
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType):
        raise TypeError(f"protected() needs a Python function, not {type(fn).__name__}")
    with _lock:
        _codes.add(code)
        _push()
    return fn
