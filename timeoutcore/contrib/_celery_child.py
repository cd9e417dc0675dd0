"""The prefork side of ``contrib.celery.install``: what runs inside each pool child.

Celery's prefork pool enforces limits from the parent: SIGUSR1 to the child at the soft
limit, and at the hard limit SIGTERM, then SIGKILL 0.1 s later -- only what unwinds in that
tenth of a second is cleaned up, so the processes a task started are orphaned. Here the
child enforces them itself, a little before the parent would:

* every task body runs in a scope whose hard limit ends :func:`hard_margin` before
  Celery's (the parent counts from when it reads the child's ACK, and checks on its event
  loop); when it fires, the task fails with ``TimeLimitExceeded`` as Celery's would, its
  scope-owned processes are killed and reaped, and the child goes on to the next task.
  Celery's kill stays the backstop for a task stuck where no interrupt reaches it;
* the soft limit is the scope's own (``SoftTimeLimitExceeded`` inside the task, and the
  task's waits end there, killing the child process they wait on); billiard's SIGUSR1 for
  the same limit is then ignored, so the task sees one exception, not two;
* SIGTERM (Celery's hard-limit kill, ``revoke(terminate=True)``, cold shutdown) first kills
  the running task's processes, then does what billiard's handler does (exit);
* SIGUSR2 from the parent (``shutdown_grace`` elapsed) cancels the running task like a
  revoke;
* with ``reap``: the child is a child subreaper, and after each task (contrib.celery) and
  at its exit every descendant it has is killed and reaped.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

from ..shutdown import cancel_soon

#: The signal the parent sends its children when ``shutdown_grace`` has elapsed.
CANCEL_SIGNAL = signal.SIGUSR2
SHUTDOWN_REASON = "worker shutdown: shutdown_grace elapsed"


def hard_margin(hard: float) -> float:
    """How much earlier than Celery's hard limit the child's own one fires: 10 % of it,
    at least 50 ms and at most 1 s, never more than half the limit."""
    return min(max(0.05, 0.1 * hard), 1.0, hard / 2)


class _Child:
    """The pool child's state: the running task's scope, the options."""

    def __init__(self) -> None:
        self.reap = False
        self.scope: Any = None  # the running task's scope
        self.signals_ready = False
        self.previous_term: Any = None


child = _Child()


def _kill_running_tree() -> None:
    from .._patch_subprocess import kill_children

    scope = child.scope
    if scope is not None:
        kill_children(scope)
    if child.reap:
        from .._process_tree import kill_descendants

        kill_descendants()


def _on_term(signum: int, frame: Any) -> None:
    """SIGTERM in a pool child: the task's processes die first, then billiard's own
    handler runs (it exits the child)."""
    try:
        _kill_running_tree()
    finally:
        previous = child.previous_term
        if callable(previous):
            previous(signum, frame)
        else:
            raise SystemExit(-(256 - signum))


def _on_soft(signum: int, frame: Any) -> None:
    """billiard's SIGUSR1 (soft limit): the task's scope delivers the soft limit itself,
    so this one is dropped -- unless no scope of ours with a soft limit runs (then it
    means what billiard means)."""
    if child.scope is None or child.scope.soft_limit is None:
        from celery.exceptions import SoftTimeLimitExceeded

        raise SoftTimeLimitExceeded()


def _on_cancel(signum: int, frame: Any) -> None:
    """SIGUSR2 from the parent: ``shutdown_grace`` elapsed; the running task is cancelled
    (the scope's exit marks it REVOKED, see contrib.celery)."""
    scope = child.scope
    if scope is not None:  # never raises in the handler (see cancel_soon)
        cancel_soon(scope, SHUTDOWN_REASON)


def install_signals() -> None:
    """Once per child, from its first task (billiard sets its own handlers after
    ``worker_process_init``, so this must come later)."""
    if child.signals_ready or threading.current_thread() is not threading.main_thread():
        return
    child.signals_ready = True
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_IGN:  # REMAP_SIGTERM: billiard's children ignore it
        child.previous_term = previous
        signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGUSR1, _on_soft)
    signal.signal(CANCEL_SIGNAL, _on_cancel)  # again: billiard may have reset it


def on_process_init(reap: bool) -> None:
    """``worker_process_init`` in a pool child."""
    child.reap = reap
    signal.signal(CANCEL_SIGNAL, _on_cancel)
    if reap:
        from .._process_tree import become_subreaper

        become_subreaper()


def on_process_shutdown() -> None:
    """``worker_process_shutdown``: the child exits; with ``reap`` its descendants go
    first."""
    if child.reap:
        from .._process_tree import kill_descendants

        kill_descendants()


def begin(scope: Any) -> Any:
    """A task body starts under ``scope`` in the pool child (the handlers are installed
    at the first); returns what :func:`end` needs. The caller enters the scope itself: a
    frame of this package between the ``with`` and the body would hold the interrupt
    back (timeoutcore is protected code)."""
    install_signals()
    previous = child.scope
    child.scope = scope
    return previous


def end(previous: Any) -> None:
    child.scope = previous
