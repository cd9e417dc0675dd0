"""timeoutcore: hard time limits for any Python thread.

``with thread_deadline(0.25): ...`` stops the block at 0.25 s with ``DeadlineExceeded``
in the thread that runs it -- a pool worker as well as the main thread.

``import timeoutcore`` loads the engine and the core API only. The features built on
pydantic and JSON (results, policies, the executor, ``run()``, metrics) are loaded the
first time one of their names is used (PEP 562), so a plain ``with thread_deadline(s):``
never imports them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import _hooks
from ._engine import ENGINE

if TYPE_CHECKING or ENGINE == "native":  # the two engines' functions have one signature
    from ._native import accelerators
else:
    from ._fallback import accelerators
from .blocking import acquire, bounded_wait, socket_timeout, wait_readable, wait_writable
from .errors import DeadlineCancelled, DeadlineExceeded, SoftDeadlineExceeded
from .patch import is_patched, patch, patched_targets, unpatch
from ._deferral import deferral_log_cap, set_deferral_log_cap
from .protect import (
    is_protected_module,
    protect_module,
    protected,
    protected_modules,
    unprotect_module,
)
from .scope import (
    DeadlineScope,
    checkpoint,
    current_deadline,
    current_scope,
    remaining,
    shield,
    sleep,
    thread_deadline,
    thread_deadline_at,
)

if TYPE_CHECKING:
    from . import metrics
    from ._json import ENGINE as JSON_ENGINE
    from .aio import to_thread
    from .executor import DeadlineExecutor, DeadlineFuture
    from .interrupt import interrupt_with
    from .metrics import Metrics
    from .policy import DeadlinePolicy, PolicyTable, set_policy_table
    from .results import DeadlineResult, ResultLog
    from .shutdown import ShutdownHandler, active_scopes, cancel_all, handle_sigterm
    from .subprocess import RunResult, run

__version__ = "0.1.0"

# name -> (module, attribute; "" for the module itself), imported on first use
_LAZY: dict[str, tuple[str, str]] = {
    "JSON_ENGINE": ("._json", "ENGINE"),
    "metrics": (".metrics", ""),
    "Metrics": (".metrics", "Metrics"),
    "DeadlineExecutor": (".executor", "DeadlineExecutor"),
    "DeadlineFuture": (".executor", "DeadlineFuture"),
    "to_thread": (".aio", "to_thread"),
    "interrupt_with": (".interrupt", "interrupt_with"),
    "DeadlinePolicy": (".policy", "DeadlinePolicy"),
    "PolicyTable": (".policy", "PolicyTable"),
    "set_policy_table": (".policy", "set_policy_table"),
    "DeadlineResult": (".results", "DeadlineResult"),
    "ResultLog": (".results", "ResultLog"),
    "RunResult": (".subprocess", "RunResult"),
    "ShutdownHandler": (".shutdown", "ShutdownHandler"),
    "active_scopes": (".shutdown", "active_scopes"),
    "cancel_all": (".shutdown", "cancel_all"),
    "handle_sigterm": (".shutdown", "handle_sigterm"),
    "run": (".subprocess", "run"),
}


def __getattr__(name: str) -> Any:
    """The lazily loaded public names (see :data:`_LAZY`); cached once loaded."""
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    module = importlib.import_module(module_name, __name__)
    value = getattr(module, attr) if attr else module
    globals()[name] = value
    return value


# What the scope layer reaches of the features above it, plugged in here -- the package
# root, above every layer -- so that no lower module imports an upper one. Each loader
# imports its feature on first use.


def _build_result(scope: Any) -> Any:
    from .results import build_result

    return build_result(scope)


def _soft_register(scope: Any, when: float) -> None:
    from .soft import timer

    timer.register(scope, when)


def _policy_table() -> Any:
    from .policy import policy_table

    return policy_table()


_hooks.features.build_result = _build_result
_hooks.features.soft_register = _soft_register
_hooks.features.policy_table = _policy_table


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def set_default_result_log(result_log: ResultLog | None) -> None:
    """Append the result of *every* guarded block to ``result_log`` (None: stop)."""
    _hooks.set_default_result_log(result_log)


__all__ = [
    "ENGINE",
    "JSON_ENGINE",
    "DeadlineCancelled",
    "DeadlineExceeded",
    "DeadlineExecutor",
    "DeadlineFuture",
    "DeadlinePolicy",
    "DeadlineResult",
    "DeadlineScope",
    "Metrics",
    "PolicyTable",
    "ResultLog",
    "RunResult",
    "ShutdownHandler",
    "SoftDeadlineExceeded",
    "accelerators",
    "acquire",
    "active_scopes",
    "bounded_wait",
    "cancel_all",
    "checkpoint",
    "current_deadline",
    "current_scope",
    "deferral_log_cap",
    "handle_sigterm",
    "interrupt_with",
    "is_patched",
    "is_protected_module",
    "metrics",
    "patch",
    "patched_targets",
    "protect_module",
    "protected",
    "protected_modules",
    "remaining",
    "run",
    "set_deferral_log_cap",
    "set_default_result_log",
    "set_policy_table",
    "shield",
    "sleep",
    "socket_timeout",
    "to_thread",
    "thread_deadline",
    "thread_deadline_at",
    "unpatch",
    "unprotect_module",
    "wait_readable",
    "wait_writable",
    "__version__",
]
