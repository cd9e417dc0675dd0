"""``DeadlineExecutor``: a ``ThreadPoolExecutor`` whose every task runs under a deadline.

>>> with DeadlineExecutor(8, policy=DeadlinePolicy(limit=0.25)) as pool:
...     fut = pool.submit(work, 1)                       # default policy
...     fut2 = pool.submit_with(0.05, work, 2)           # per-task limit
...     results = list(pool.map(work, items, limits=[0.1, 0.2, ...]))

Per-task limits go through ``submit_with`` / ``map(limits=...)``, never through the task's
own keyword arguments, so they cannot collide. A task past its hard limit ends with
``DeadlineExceeded`` in its future and its worker thread goes straight on to the next task;
so ``shutdown(wait=True)`` waits at most for the running tasks' hard limits (for blocking
calls CPython retries after EINTR, see ``timeoutcore.patch()``), and
``shutdown(cancel_after=S)`` at most ``S`` seconds: then the tasks still running are
cancelled (``DeadlineCancelled`` in their futures; with ``patch()``, the processes they
started are killed and reaped).

Its futures are :class:`DeadlineFuture`: ``cancel()`` stops a task that is already running
(the standard ``Future.cancel()`` cannot), so ``asyncio`` cancels reach the thread when the
pool is a loop's executor (``loop.set_default_executor``, :func:`timeoutcore.to_thread`).
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import CancelledError, Future, InvalidStateError, ThreadPoolExecutor, wait
from typing import Any, Callable, Generic, Optional, TypeVar, Union

from . import _validate
from .policy import DeadlinePolicy
from .scope import checkpoint, thread_deadline

T = TypeVar("T")
Limits = Union[None, float, int, DeadlinePolicy, Mapping[str, Any]]


def as_policy(limits: Limits, default: Optional[DeadlinePolicy]) -> Optional[DeadlinePolicy]:
    """Normalise a limit given as seconds, a mapping, a policy or None (-> ``default``)."""
    if limits is None:
        return default
    if isinstance(limits, DeadlinePolicy):
        return limits
    if isinstance(limits, Mapping):
        return DeadlinePolicy.model_validate(dict(limits))
    if isinstance(limits, bool) or not isinstance(limits, (int, float)):
        raise TypeError(
            "limits must be seconds, a DeadlinePolicy, a mapping of its fields or None, "
            f"not {type(limits).__name__}"
        )
    return DeadlinePolicy(limit=float(limits))


#: The hard limit of a task without one: far enough never to fire (the longest a scope
#: takes, about 9.5 years), and a stop time its waits see, so that
#: ``shutdown(cancel_after=)`` can stop a blocked task too.
NO_LIMIT = _validate.MAX_SECONDS


def _factory(policy: Optional[DeadlinePolicy]) -> Callable[[], Any]:
    """A cheap maker of fresh scopes for ``policy`` (None: no deadline of its own)."""
    if policy is None:
        return functools.partial(thread_deadline, NO_LIMIT)
    kw: dict[str, Any] = {"label": policy.label, "raise_on_timeout": policy.raise_on_timeout}
    if policy.soft is not None:
        kw.update(soft_limit=policy.soft, soft_raise=policy.soft_raise)
    return functools.partial(thread_deadline, policy.hard, **kw)


# The states of concurrent.futures.Future, stable since Python 3.2 and read by its
# module-level wait()/as_completed() through the same private fields used below.
_PENDING = "PENDING"
_RUNNING = "RUNNING"
_CANCELLED = "CANCELLED"
_CANCELLED_AND_NOTIFIED = "CANCELLED_AND_NOTIFIED"
_FINISHED = "FINISHED"


class DeadlineFuture(Future[T], Generic[T]):
    """The future of a :class:`DeadlineExecutor` task: a ``concurrent.futures.Future``
    whose :meth:`cancel` also stops a task that is already running.

    Everything else is the standard future's: ``result()``, ``exception()``,
    ``add_done_callback()``, ``concurrent.futures.wait()``/``as_completed()``, and
    ``asyncio.wrap_future()``, through which an asyncio cancel reaches :meth:`cancel`.
    """

    # Rule: a running task is cancelled by moving the future to CANCELLED_AND_NOTIFIED
    # under its condition and only then cancelling the task's scope; its outcome, which
    # the worker settles later, is then dropped (_settle). The worker drops the scope from
    # the future as the task ends (_ended), before it settles, so cancel() either stops the
    # task (it still held its scope) or finds the task done and returns False -- never
    # both, never a cancel that reaches the worker's own code (a scope that has exited
    # ignores cancel()).
    # Rejected: setting CANCELLED (as Future.cancel() does for a queued task) -- wait()
    # and as_completed() count a future as done only once it is CANCELLED_AND_NOTIFIED,
    # which for a queued task the worker does when it picks the item up; a running task's
    # worker never would. Rejected: reporting the cancel only once the thread has left
    # the task -- cancel() returning True while cancelled() is still False breaks every
    # caller of the standard API (asyncio's wrap_future among them); wait_stopped()
    # gives that moment to those who need it.

    def __init__(self) -> None:
        super().__init__()
        self._scope: Any = None  # the running task's scope; None before and after
        self._item: Optional[Future[None]] = None  # done once the worker left the task
        self._pending: Optional[set[Future[None]]] = None  # the executor's unfinished items
        # The task's outcome, kept from the end of the task until its work item is done.
        self._outcome: Optional[tuple[Any, Optional[BaseException]]] = None

    def cancel(self) -> bool:
        """Cancel the task: a queued one never runs, a running one is stopped in its
        thread (``DeadlineCancelled`` there, at its next bytecode or in any wait that
        ``timeoutcore.patch()`` covers; with ``patch()`` the processes it started are
        killed). Returns True and the future is cancelled at once (``cancelled()``,
        ``done()``; ``result()`` raises ``CancelledError``); the worker thread is free as
        soon as the task has left (:meth:`wait_stopped`). Returns False for a task that
        finished first: it keeps its result."""
        # Rule: the state is read and moved in one hold of the condition. Rejected: handing
        # a task not seen running to Future.cancel() -- it takes the condition again, and
        # a worker that took the task in between left it RUNNING: cancel() returned False
        # and the task ran on (asyncio.to_thread(q.get) under a timeout left a getter
        # blocked that took a later item, 3.14t under load).
        with self._condition:
            if self._state == _FINISHED:
                return False
            if self._state in (_CANCELLED, _CANCELLED_AND_NOTIFIED):
                return True
            if self._state == _PENDING:  # queued: the worker drops it (_start)
                scope = None
                self._state = _CANCELLED
            else:
                scope = self._scope
                if scope is None:
                    return False  # the task has ended; its outcome is being set
                self._state = _CANCELLED_AND_NOTIFIED
                for waiter in self._waiters:
                    waiter.add_cancelled(self)
            self._condition.notify_all()
        if scope is not None:
            scope.cancel("future cancelled")
        self._invoke_callbacks()  # type: ignore[attr-defined]  # Future's, not in typeshed
        return True

    def wait_stopped(self, timeout: Optional[float] = None) -> bool:
        """Wait until no thread runs this task any more: it finished, was stopped by
        :meth:`cancel`, or never started. Returns False if ``timeout`` seconds passed
        first (a cancelled task blocked where no interrupt reaches, e.g. C code that holds
        the GIL)."""
        item = self._item
        if item is None:  # only while submit() has not yet returned
            raise RuntimeError("wait_stopped() on a future that was never submitted")
        try:
            item.exception(timeout)
        except CancelledError:  # dropped unstarted by shutdown(cancel_futures=True)
            pass
        except TimeoutError:
            return False
        return True

    def add_stopped_callback(self, fn: Callable[[Future[None]], object]) -> None:
        """Call ``fn`` once no thread runs this task any more (at once if that is already
        so): in the worker thread as it leaves the task, or in the caller's thread. ``fn``
        gets an internal future, not this one."""
        item = self._item
        if item is None:
            raise RuntimeError("add_stopped_callback() on a future that was never submitted")
        item.add_done_callback(fn)

    def _start(self, scope: Any) -> bool:
        """The worker takes the task: False if it was cancelled while queued (waiters are
        told); else the future is running under ``scope``."""
        # The scope is stored before the state turns RUNNING (under the condition, inside
        # set_running_or_notify_cancel), so a cancel() that sees RUNNING sees the scope.
        self._scope = scope
        if self.set_running_or_notify_cancel():
            return True
        self._scope = None
        return False

    def _ended(self, result: Any, exc: Optional[BaseException]) -> None:
        """In the worker, as the task ends: keep its outcome for :meth:`_item_done`.

        Rule: the future is resolved only once its work item is done. Resolving it wakes
        the thread waiting for the result, which then asks for the GIL; done first, that
        request lands while the worker still finishes the pool's bookkeeping, and with a
        pool of busy workers the extra hand-over of the GIL per task cost more than the
        rest of this class together. Resolved last, the worker's next step is the queue
        wait that releases the GIL anyway, as with a plain ThreadPoolExecutor.
        """
        # With the scope dropped, a cancel() from now on finds RUNNING without a scope and
        # returns False: the task has ended, its outcome is on its way.
        self._scope = None
        self._outcome = (result, exc)

    def _item_done(self, item: Future[None]) -> None:
        """The work item ``item`` is done: the task ran, or the pool dropped it unstarted."""
        pending = self._pending
        if pending is not None:
            pending.discard(item)
        outcome, self._outcome = self._outcome, None
        if outcome is not None:
            self._settle(*outcome)
            return
        # A task that ran has moved its future past PENDING/CANCELLED in run(), which
        # returned before its work item was done, so no lock is needed to tell; the state
        # is left there only when ThreadPoolExecutor.shutdown(cancel_futures=True) dropped
        # the item unstarted, and then waiters must be told here.
        if self._state in (_PENDING, _CANCELLED):
            super().cancel()
            self.set_running_or_notify_cancel()

    def _settle(self, result: Any, exc: Optional[BaseException]) -> None:
        """The task's outcome; dropped if the future was cancelled while it ran (a cancel
        that came first has moved the state on, and the standard future refuses the
        outcome with InvalidStateError -- the task was stopped for it)."""
        try:
            if exc is None:
                self.set_result(result)
            else:
                self.set_exception(exc)
        except InvalidStateError:  # cancelled while running
            pass


class _Running:
    """The scopes of the tasks running now (what ``shutdown(cancel_after=)`` cancels) and
    the work items not yet done (what it waits for first)."""

    # Rule: no lock of our own on a task's path. A set's add/discard/copy are atomic (the
    # GIL; free-threaded, the set's own lock), and run() adds its scope before it reads
    # `cancelling` while cancel() sets `cancelling` before it copies the set: with the
    # set's lock ordering the two, either run() sees the cancel or cancel() sees the scope.
    # Rejected: one lock for both (as before) -- two more lock round trips per task, in a
    # pool whose every task pays them.

    def __init__(self) -> None:
        self.scopes: set[Any] = set()
        self.pending: set[Future[None]] = set()  # work items submitted and not done
        self.cancelling: Optional[str] = None  # set: every task is cancelled, new ones too

    def run(self, future: DeadlineFuture[Any], make: Callable[[], Any], fn: Callable[..., Any],
            args: Any, kwargs: Any) -> None:
        """The work item of one task, in a worker thread: runs ``fn`` under a fresh scope
        and settles ``future``. Never raises: whatever the task raised, the interrupt of
        its deadline or of a cancel included, is claimed inside the scope and goes to the
        future, so nothing reaches the pool's own code."""
        scope = make()
        if not future._start(scope):
            return  # cancelled while queued
        scopes = self.scopes
        scopes.add(scope)
        late = self.cancelling
        if late is not None:
            scope.cancel(late)
        try:
            try:
                with scope:
                    if late is not None:
                        # Started after the cancel: it never runs. (The native core raises
                        # before the block's first line anyway; the fallback engine only at
                        # the block's exit, after a quick task has run.)
                        checkpoint()
                    result = fn(*args, **kwargs)
            finally:
                scopes.discard(scope)
        except BaseException as exc:  # the task's outcome, as ThreadPoolExecutor keeps it
            future._ended(None, exc)
            del exc  # no cycle through the traceback's frame
        else:
            future._ended(result, None)

    def track(self, item: Future[None], future: DeadlineFuture[Any]) -> None:
        """Count the work item ``item`` of ``future`` as unfinished until it is done (its
        task has run, or it was dropped unstarted); then ``future`` learns it too."""
        future._item = item
        future._pending = self.pending
        self.pending.add(item)
        item.add_done_callback(future._item_done)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every submitted task has finished; False when ``timeout`` passed
        first. (No task running is not enough: a worker may be about to take the next one
        from the queue.) Called once no more tasks can be submitted."""
        end = time.monotonic() + timeout
        while True:
            items = [item for item in list(self.pending) if not item.done()]
            if not items:
                return True
            left = end - time.monotonic()
            if left <= 0:
                return False
            wait(items, left)

    def cancel(self, reason: str) -> int:
        self.cancelling = reason
        scopes = list(self.scopes)
        for scope in scopes:
            scope.cancel(reason)
        return len(scopes)


class DeadlineExecutor(ThreadPoolExecutor):
    """A thread pool in which every task runs under ``thread_deadline``.

    ``policy``: the default limits for tasks (seconds, a ``DeadlinePolicy`` or a mapping of
    its fields); ``None`` runs tasks without a deadline unless they bring their own.
    The other arguments are ``ThreadPoolExecutor``'s.
    """

    def __init__(
        self,
        max_workers: Optional[int] = None,
        thread_name_prefix: str = "",
        initializer: Optional[Callable[..., Any]] = None,
        initargs: tuple[Any, ...] = (),
        *,
        policy: Limits = None,
    ) -> None:
        self.policy = as_policy(policy, None)
        self._make = _factory(self.policy)
        self._running = _Running()
        super().__init__(max_workers, thread_name_prefix, initializer, initargs)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> DeadlineFuture[T]:
        """Run ``fn(*args, **kwargs)`` under the default policy; its future's ``cancel()``
        stops it even while it runs (:class:`DeadlineFuture`)."""
        return self._submit(self._make, fn, args, kwargs)

    def submit_with(
        self, limits: Limits, fn: Callable[..., T], /, *args: Any, **kwargs: Any
    ) -> DeadlineFuture[T]:
        """Run ``fn(*args, **kwargs)`` under ``limits`` (seconds, a policy or a mapping)."""
        return self._submit(_factory(as_policy(limits, self.policy)), fn, args, kwargs)

    def map(
        self,
        fn: Callable[..., T],
        *iterables: Iterable[Any],
        timeout: Optional[float] = None,
        chunksize: int = 1,
        limits: Union[Limits, Iterable[Limits]] = None,
    ) -> Iterator[T]:
        """Like ``Executor.map``; ``limits`` is one limit for every item or an iterable
        with one per item. Iterating raises the first failure, as ``Executor.map`` does;
        then, or when the iterator is closed early, the tasks not yet done are cancelled --
        running ones are stopped too (:meth:`DeadlineFuture.cancel`)."""
        if limits is None or isinstance(limits, (int, float, DeadlinePolicy, Mapping)):
            per_item: Iterable[Optional[DeadlinePolicy]] = itertools.repeat(
                as_policy(limits, self.policy)
            )
        else:
            per_item = (as_policy(x, self.policy) for x in limits)
        futures = [
            self._submit(self._make if policy is self.policy else _factory(policy), fn, args, {})
            for policy, args in zip(per_item, zip(*iterables))
        ]
        return _results(futures, timeout)


    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False,
                 cancel_after: Optional[float] = None) -> None:
        """``ThreadPoolExecutor.shutdown``; with ``cancel_after=S`` (seconds, 0 allowed),
        the tasks still running ``S`` seconds after the call are cancelled: each ends with
        :class:`~timeoutcore.DeadlineCancelled` in its future (reason "executor shutdown"),
        and, with ``timeoutcore.patch()``, the processes it started are killed and reaped.
        Queued tasks that had not started run unless ``cancel_futures`` (as in the base
        class); with ``cancel_after`` they too are cancelled if they start in the grace
        period and are still running at its end, and those that start later never run
        (``DeadlineCancelled`` in their futures). ``wait=False`` returns at once and
        cancels from a helper thread."""
        if cancel_after is None:
            super().shutdown(wait=wait, cancel_futures=cancel_futures)
            return
        grace = _validate.seconds(cancel_after, "DeadlineExecutor.shutdown()", "cancel_after",
                                  allow_zero=True)
        super().shutdown(wait=False, cancel_futures=cancel_futures)
        if not wait:
            threading.Thread(target=self._cancel_after, args=(grace,), daemon=True,
                             name="timeoutcore-executor-shutdown").start()
            return
        self._cancel_after(grace)
        super().shutdown(wait=True)

    def _cancel_after(self, grace: float) -> None:
        if not self._running.wait_idle(grace):
            self._running.cancel("executor shutdown")

    def _submit(self, make: Callable[[], Any], fn: Callable[..., T], args: Any,
                kwargs: Any) -> DeadlineFuture[T]:
        # The pool's own work item (a plain future, done once the worker has left the
        # task) carries a DeadlineFuture: ThreadPoolExecutor builds its futures inside
        # submit(), with no way to choose their class.
        future: DeadlineFuture[T] = DeadlineFuture()
        item = super().submit(self._running.run, future, make, fn, args, kwargs)
        self._running.track(item, future)
        return future


def _results(futures: list[DeadlineFuture[T]], timeout: Optional[float]) -> Iterator[T]:
    import time

    end = None if timeout is None else time.monotonic() + timeout
    try:
        for fut in futures:
            yield fut.result(None if end is None else end - time.monotonic())
    finally:
        for fut in futures:
            fut.cancel()
