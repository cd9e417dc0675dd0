"""fork(): the one place that registers with ``os.register_at_fork``.

A child process has none of its parent's threads: no watchdog, no soft timer, no
callback pool, no Redis subscriber. Every module that owns such a thread registers its
fork callbacks here, under its layer, and they run in a defined order -- by layer
(:data:`ENGINE`, then :data:`FEATURE`, then :data:`CONTRIB`), in registration order within
a layer -- in all three phases:

* ``before``: the engine stops its watchdog first, so no deadline fires into the fork
  while the upper layers prepare (no library lock is held across fork);
* ``after_in_parent`` / ``after_in_child``: the engine is whole again (watchdog, thread
  state) before the features that build on it start their own threads.

``os.register_at_fork`` itself would run "before" callbacks in reverse registration order,
which would make the order depend on which module happened to be imported first.

A callback that raises is reported on stderr (as ``os.register_at_fork`` reports it) and
does not stop the others.
"""

from __future__ import annotations

import os
import sys
from typing import Callable, Optional

ENGINE = 0
FEATURE = 1
CONTRIB = 2

Callback = Callable[[], object]

_phases: dict[str, list[tuple[int, int, Callback]]] = {
    "before": [], "after_in_parent": [], "after_in_child": [],
}


def register(
    layer: int,
    *,
    before: Optional[Callback] = None,
    after_in_parent: Optional[Callback] = None,
    after_in_child: Optional[Callback] = None,
) -> None:
    """Run these callbacks around every ``os.fork()`` of this process, in ``layer``'s turn
    (:data:`ENGINE`, :data:`FEATURE` or :data:`CONTRIB`; see the module docstring)."""
    for phase, fn in (("before", before), ("after_in_parent", after_in_parent),
                      ("after_in_child", after_in_child)):
        if fn is not None:
            callbacks = _phases[phase]
            callbacks.append((layer, len(callbacks), fn))
            callbacks.sort(key=lambda entry: entry[:2])


def _run(phase: str) -> None:
    for _, _, fn in list(_phases[phase]):
        try:
            fn()
        except Exception:  # noqa: BLE001 - reported; the other layers still run
            import traceback

            print(f"timeoutcore: fork callback {fn!r} ({phase}) failed:", file=sys.stderr)
            traceback.print_exc()


os.register_at_fork(
    before=lambda: _run("before"),
    after_in_parent=lambda: _run("after_in_parent"),
    after_in_child=lambda: _run("after_in_child"),
)
