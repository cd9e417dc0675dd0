"""The pytest backend under pytest-run-parallel: the test's deadline in its worker threads.

pytest-run-parallel (``--parallel-threads N``, ``@pytest.mark.parallel_threads``,
``--iterations``) replaces a test's function, at ``pytest_collection_finish``, by a wrapper
that starts worker threads, each calling the original function, and joins them; a worker's
``pytest.fail`` is re-raised by the wrapper in the thread that runs the test. A deadline set
in that thread cannot stop the workers: each must enter the deadline itself.

So, after pytest-run-parallel's hook, the original function that its wrapper calls is
replaced -- in the wrapper's closure, the one place the workers look it up -- by one that
enters the item's deadline. Rejected: wrapping the test function before pytest-run-parallel
sees it: it reads the function's source and ``__globals__`` to find thread-unsafe calls,
and would read the wrapper's instead.

pytest-run-parallel's wrapper is recognised by the module its code belongs to and by
``__wrapped__`` (``functools.wraps``); a later release that no longer keeps the original in a closure cell
is reported with one warning, and its tests then run with the deadline in the test's own
thread only.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, Iterable, NamedTuple, Optional

import pytest

from timeoutcore import DeadlineScope

__all__ = ["RUN_PARALLEL_MODULE", "Hooks", "guard_workers"]

RUN_PARALLEL_MODULE = "pytest_run_parallel.plugin"


class Hooks(NamedTuple):
    """What the plugin gives: ``enter(item)`` returns the scope a worker thread enters around
    the test function (or None: run it as it is); ``leave(item, scope, exc)`` is called
    after that scope was left, with what it raised, and may raise the test's failure."""

    enter: Callable[[pytest.Item], Optional[DeadlineScope]]
    leave: Callable[[pytest.Item, DeadlineScope, Optional[BaseException]], None]


def guard_workers(items: Iterable[pytest.Item], hooks: Hooks) -> list[pytest.Item]:
    """For each item whose function pytest-run-parallel wrapped, make its worker threads run
    the original function inside ``hooks.enter(item)``'s scope. Returns those items."""
    done = []
    unknown = False
    for item in items:
        inner = getattr(item, "obj", None)
        original = getattr(inner, "__wrapped__", None)
        # its module by its globals: functools.wraps copied the test's __module__ onto it
        module = getattr(inner, "__globals__", {}).get("__name__")
        if original is None or module != RUN_PARALLEL_MODULE:
            continue
        cells = [c for c in (getattr(inner, "__closure__", None) or ())
                 if _contents(c) is original]
        if len(cells) != 1:
            unknown = True
            continue
        cells[0].cell_contents = _guarded_function(item, original, hooks)
        done.append(item)
    if unknown:
        warnings.warn(
            "timeoutcore.contrib.pytest: this pytest-run-parallel release wraps tests in a "
            "way it does not know; their worker threads run without the test's deadline",
            pytest.PytestWarning,
            stacklevel=2,
        )
    return done


def _contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def _guarded_function(item: pytest.Item, fn: Callable[..., Any], hooks: Hooks) -> Any:
    # The test function is called right inside the ``with``: timeoutcore's own modules are
    # protected code, so a helper frame of ours between the scope's frame and the test's
    # would hold the interrupt back (a CPU loop would never be stopped).
    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        scope = hooks.enter(item)
        if scope is None:
            return fn(*args, **kwargs)
        try:
            with scope:
                result = fn(*args, **kwargs)
        except BaseException as exc:
            hooks.leave(item, scope, exc)
            raise
        hooks.leave(item, scope, None)
        return result

    return guarded
