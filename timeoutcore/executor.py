"""``DeadlineExecutor``: a ``ThreadPoolExecutor`` whose every task runs under a deadline.

>>> with DeadlineExecutor(8, policy=DeadlinePolicy(limit=0.25)) as pool:
...     fut = pool.submit(work, 1)                       # default policy
...     fut2 = pool.submit_with(0.05, work, 2)           # per-task limit
...     results = list(pool.map(work, items, limits=[0.1, 0.2, ...]))

Per-task limits go through ``submit_with`` / ``map(limits=...)``, never through the task's
own keyword arguments, so they cannot collide. A task past its hard limit ends with
``DeadlineExceeded`` in its future and its worker thread goes straight on to the next task;
so ``shutdown(wait=True)`` waits at most for the running tasks' hard limits (for blocking
calls CPython retries after EINTR, see ``timeoutcore.patch()``).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Optional, TypeVar, Union

from .policy import DeadlinePolicy
from .scope import thread_deadline

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


def _factory(policy: Optional[DeadlinePolicy]) -> Optional[Callable[[], Any]]:
    """A cheap maker of fresh scopes for ``policy`` (None: no deadline)."""
    if policy is None:
        return None
    kw: dict[str, Any] = {"label": policy.label, "raise_on_timeout": policy.raise_on_timeout}
    if policy.soft is not None:
        kw.update(soft_limit=policy.soft, soft_raise=policy.soft_raise)
    return functools.partial(thread_deadline, policy.hard, **kw)


def _run(make: Optional[Callable[[], Any]], fn: Callable[..., T], args: Any, kwargs: Any) -> T:
    if make is None:
        return fn(*args, **kwargs)
    with make():
        return fn(*args, **kwargs)


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
        super().__init__(max_workers, thread_name_prefix, initializer, initargs)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Run ``fn(*args, **kwargs)`` under the default policy."""
        return super().submit(_run, self._make, fn, args, kwargs)

    def submit_with(
        self, limits: Limits, fn: Callable[..., T], /, *args: Any, **kwargs: Any
    ) -> Future[T]:
        """Run ``fn(*args, **kwargs)`` under ``limits`` (seconds, a policy or a mapping)."""
        return super().submit(_run, _factory(as_policy(limits, self.policy)), fn, args, kwargs)

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
            super(DeadlineExecutor, self).submit(
                _run, self._make if policy is self.policy else _factory(policy), fn, args, {}
            )
            for policy, args in zip(per_item, zip(*iterables))
        ]
        return _results(futures, timeout)


def _results(futures: list[Future[T]], timeout: Optional[float]) -> Iterator[T]:
    import time

    end = None if timeout is None else time.monotonic() + timeout
    try:
        for fut in futures:
            yield fut.result(None if end is None else end - time.monotonic())
    finally:
        for fut in futures:
            fut.cancel()
