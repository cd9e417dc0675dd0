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
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Optional, TypeVar, Union

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


class _Running:
    """The scopes of the tasks running now (what ``shutdown(cancel_after=)`` cancels)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.scopes: set[Any] = set()
        self.idle = threading.Condition(self.lock)
        self.cancelling: Optional[str] = None  # set: every task is cancelled, new ones too
        self.unfinished = 0  # futures submitted and not done

    def run(self, make: Callable[[], Any], fn: Callable[..., T], args: Any, kwargs: Any) -> T:
        scope = make()
        with self.lock:
            self.scopes.add(scope)
            late = self.cancelling is not None
            if late:
                scope.cancel(self.cancelling)
        try:
            with scope:
                if late:
                    # Started after the cancel: it never runs. (The native core raises
                    # before the block's first line anyway; the fallback engine only at
                    # the block's exit, after a quick task has run.)
                    checkpoint()
                return fn(*args, **kwargs)
        finally:
            with self.lock:
                self.scopes.discard(scope)

    def track(self, future: Future[Any]) -> None:
        """Count ``future`` as unfinished until it is done (run, failed or cancelled)."""
        with self.lock:
            self.unfinished += 1
        future.add_done_callback(self._finished)

    def _finished(self, future: Future[Any]) -> None:
        with self.lock:
            self.unfinished -= 1
            if not self.unfinished:
                self.idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every submitted task has finished; False when ``timeout`` passed
        first. (No task running is not enough: a worker may be about to take the next one
        from the queue.)"""
        end = time.monotonic() + timeout
        with self.lock:
            while self.unfinished:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.idle.wait(left)
        return True

    def cancel(self, reason: str) -> int:
        with self.lock:
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

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Run ``fn(*args, **kwargs)`` under the default policy."""
        return self._submit(self._make, fn, args, kwargs)

    def submit_with(
        self, limits: Limits, fn: Callable[..., T], /, *args: Any, **kwargs: Any
    ) -> Future[T]:
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
        with one per item. Iterating raises the first failure, as ``Executor.map`` does."""
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
                kwargs: Any) -> Future[T]:
        future = super().submit(self._running.run, make, fn, args, kwargs)
        self._running.track(future)
        return future


def _results(futures: list[Future[T]], timeout: Optional[float]) -> Iterator[T]:
    import time

    end = None if timeout is None else time.monotonic() + timeout
    try:
        for fut in futures:
            yield fut.result(None if end is None else end - time.monotonic())
    finally:
        for fut in futures:
            fut.cancel()
