"""The Redis deadline registry, with a worker process and a coordinator over a real Redis."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from timeoutcore import _json as orjson  # whichever JSON engine is active
import pytest

redis = pytest.importorskip("redis")

import timeoutcore  # noqa: E402
from conftest import LATE  # noqa: E402
from redis_server import RedisServer, wait_for_job  # noqa: E402

from timeoutcore.contrib.redis import DeadlineRegistry, JobNotFound  # noqa: E402

WORKER = str(Path(__file__).with_name("registry_worker.py"))


def new_prefix() -> str:
    return f"tc-test-{uuid.uuid4().hex[:12]}"


class Worker:
    """A registry_worker.py process; ``results()`` waits for its JSON lines."""

    def __init__(self, url: str, prefix: str, *jobs: str, margin: float = 5.0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, WORKER, url, prefix, str(margin), *jobs],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ),
        )

    def results(self, timeout: float = 30.0) -> tuple[list[dict[str, Any]], str]:
        out, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, err.decode()
        return [orjson.loads(line) for line in out.splitlines()], err.decode()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=10)


class InThread:
    """A job in a thread of this process: ``registry.deadline(job, seconds)`` around a
    timeoutcore.sleep(30); ``scope`` and ``exc`` (its DeadlineExceeded) once it ended."""

    def __init__(self, registry: DeadlineRegistry, job: str, seconds: float) -> None:
        self.scope = registry.deadline(job, seconds)
        self.exc: Any = None
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        try:
            with self.scope:
                timeoutcore.sleep(30)
        except timeoutcore.DeadlineExceeded as exc:
            self.exc = exc

    def join(self) -> InThread:
        self.thread.join(10)
        assert not self.thread.is_alive()
        return self


@pytest.fixture
def registry(redis_url: str) -> Iterator[DeadlineRegistry]:
    reg = DeadlineRegistry.from_url(redis_url, prefix=new_prefix())
    yield reg
    reg.close()


def wait_gone(registry: DeadlineRegistry, job: str, timeout: float) -> float:
    start = time.monotonic()
    for _ in range(int(timeout / 0.01)):
        if registry.get(job) is None:
            return time.monotonic() - start
        time.sleep(0.01)
    raise AssertionError(f"job {job} still registered after {timeout} s")


def test_list_shows_live_jobs_from_another_process(redis_url: str,
                                                   registry: DeadlineRegistry) -> None:
    worker = Worker(redis_url, registry.prefix, "list-a:5:1.0:sleep")
    info = wait_for_job(registry, "list-a")
    listed = registry.jobs()
    assert [j.job for j in listed] == ["list-a"]
    assert info.pid == worker.proc.pid and info.label == "list-a" and info.limit == 5.0
    assert 3.5 < info.remaining <= 5.0 and info.state == "running"
    assert abs(info.deadline - info.started - 5.0) < 1e-3
    (result,), _ = worker.results()
    assert result["status"] == "completed"
    assert registry.jobs() == []  # deleted when the block exited, not left to the TTL
    assert registry.client.zcard(f"{registry.prefix}:jobs") == 0


def test_extend_lets_the_job_outlive_its_original_deadline(redis_url: str,
                                                           registry: DeadlineRegistry) -> None:
    # The extension must reach the worker before its original deadline: a limit of 1.5 s
    # leaves it over a second however slow the machine; the body runs past that deadline.
    worker = Worker(redis_url, registry.prefix, "ext-a:1.5:2.0:spin")
    before = wait_for_job(registry, "ext-a")
    left = registry.extend("ext-a", 2.0)
    assert left > before.remaining + 1.5
    after = registry.get("ext-a")
    assert after is not None and after.deadline == pytest.approx(before.deadline + 2.0)
    (result,), _ = worker.results()
    assert result["status"] == "completed" and result["elapsed"] >= 2.0


def test_extend_then_the_extended_deadline_still_holds(redis_url: str,
                                                       registry: DeadlineRegistry) -> None:
    # a limit of 1.5 s: the extension lands before the original deadline on a slow machine too
    worker = Worker(redis_url, registry.prefix, "ext-b:1.5:30:sleep")
    wait_for_job(registry, "ext-b")
    registry.extend("ext-b", 0.3)
    (result,), _ = worker.results()
    assert result["status"] == "timed_out" and result["error"] == "DeadlineExceeded"
    assert 1.8 <= result["elapsed"] < 1.8 + LATE


def test_an_extension_a_resync_applies_counts_from_the_armed_deadline(
        redis_url: str, registry: DeadlineRegistry) -> None:
    # The extension reaches this process only through a resync (what a listener does after
    # (re)subscribing): the script publishes it on a channel nobody reads. The key was
    # written before the scope was armed, so mapping its deadline onto this host's clock
    # put the extended deadline up to ~0.6 ms early; the extension's seconds do not. The
    # limit leaves the resync over a second to land before the original deadline.
    other = DeadlineRegistry.from_url(redis_url, prefix=registry.prefix)
    out: dict[str, float] = {}
    armed = threading.Event()

    def job() -> None:
        scope = registry.deadline("resync-ext", 1.2)
        try:
            with scope:
                armed.set()
                timeoutcore.sleep(5)
        except timeoutcore.DeadlineExceeded:
            pass
        out["elapsed"] = scope.elapsed()

    t = threading.Thread(target=job)
    t.start()
    assert armed.wait(5)
    other._extend(keys=[other._key("resync-ext"), other._index],
                  args=["resync-ext", "0.300000", f"{other.margin:.6f}", f"{other.channel}-unread"])
    registry._resync()
    t.join(10)
    other.close()
    assert 1.5 <= out["elapsed"] < 1.5 + LATE


@pytest.mark.parametrize("kind", ["spin", "sleep", "recv"])
def test_cancel_stops_the_job_at_once(redis_url: str, registry: DeadlineRegistry,
                                      kind: str) -> None:
    worker = Worker(redis_url, registry.prefix, f"cancel-{kind}:30:30:{kind}")
    wait_for_job(registry, f"cancel-{kind}")
    time.sleep(0.1)
    sent = time.monotonic()  # CLOCK_MONOTONIC: one clock for both processes
    assert registry.cancel(f"cancel-{kind}") is True
    (result,), _ = worker.results()
    assert result["status"] == "cancelled" and result["error"] == "DeadlineCancelled"
    assert result["stopped"] - sent < 0.05 + LATE
    assert registry.get(f"cancel-{kind}") is None


def test_cancel_wins_over_a_later_extend(registry: DeadlineRegistry) -> None:
    coordinator = DeadlineRegistry.from_url(_url(registry), prefix=registry.prefix)
    job = InThread(registry, "cancel-extend", 5.0)
    wait_for_job(coordinator, "cancel-extend")
    assert coordinator.cancel("cancel-extend")
    # Refused either way: while the job's entry is still there, as "being cancelled"; once
    # the job has already stopped (a cancel reaches a sleeping job in under a millisecond),
    # as not found at all.
    with pytest.raises(JobNotFound, match="being cancelled|'cancel-extend'"):
        coordinator.extend("cancel-extend", 5)
    job.join()
    assert type(job.exc).__name__ == "DeadlineCancelled"
    assert job.scope.result.status == "cancelled"
    coordinator.close()


def test_decorator_form_gives_every_call_its_own_entry(registry: DeadlineRegistry) -> None:
    """One observer, a scope per call: each call is published under a token of its own, so a
    cancel aimed at one call can never stop a later one."""
    key = f"{registry.prefix}:job:per-call"
    tokens: list[bytes] = []

    @registry.deadline("per-call", 5.0)
    def call() -> None:
        tokens.append(registry.client.hget(key, "token"))

    call()
    assert registry.get("per-call") is None
    call()
    assert registry.get("per-call") is None
    assert len(tokens) == 2 and None not in tokens and tokens[0] != tokens[1]


def test_malformed_control_messages_do_not_stop_the_listener(registry: DeadlineRegistry) -> None:
    coordinator = DeadlineRegistry.from_url(_url(registry), prefix=registry.prefix)
    job = InThread(registry, "after-garbage", 5.0)
    wait_for_job(coordinator, "after-garbage")
    for junk in (b"not json", b'{"op":"cancel","job":[1],"token":"x"}',
                 b'{"op":"extend","job":"after-garbage","token":"x","seconds":null}', b"[]"):
        registry.client.publish(registry.channel, junk)
    assert coordinator.cancel("after-garbage")
    job.join()
    assert type(job.exc).__name__ == "DeadlineCancelled"
    coordinator.close()


def test_a_client_without_socket_timeout_is_refused(redis_url: str) -> None:
    with pytest.raises(ValueError, match="socket_timeout"):
        DeadlineRegistry(redis.Redis.from_url(redis_url))


def test_extend_and_cancel_of_unknown_jobs(registry: DeadlineRegistry) -> None:
    assert registry.cancel("no-such-job") is False
    with pytest.raises(JobNotFound):
        registry.extend("no-such-job", 1.0)


def test_key_expires_after_a_killed_worker(redis_url: str, registry: DeadlineRegistry) -> None:
    # TTL = limit + margin: long enough that the key is still there once the worker is
    # killed and reaped, however slow the machine (the test waits for it to expire)
    worker = Worker(redis_url, registry.prefix, "killed:1.2:30:spin", margin=0.3)
    info = wait_for_job(registry, "killed")
    worker.proc.send_signal(signal.SIGKILL)
    worker.kill()
    ttl = registry.client.pttl(f"{registry.prefix}:job:killed")
    assert 0 < ttl <= 1500
    gone_after = wait_gone(registry, "killed", timeout=5.0)
    assert gone_after < info.remaining + 0.3 + 1.0
    assert registry.client.zcard(f"{registry.prefix}:jobs") == 1  # the index entry is stale...
    assert registry.jobs() == []
    assert registry.client.zcard(f"{registry.prefix}:jobs") == 0  # ...and jobs() dropped it


def test_redis_stopped_mid_job(tmp_path: Path) -> None:
    """The local deadline still holds, later jobs run and are limited, one warning. A job
    expected to complete gets a limit far above its body: how fast it runs does not matter."""
    server = RedisServer(tmp_path).start()
    try:
        coordinator = DeadlineRegistry.from_url(server.url, prefix=new_prefix())
        worker = Worker(server.url, coordinator.prefix,
                        "down-a:1.0:30:sleep", "down-b:0.3:30:spin", "down-c:2.0:0.05:spin")
        wait_for_job(coordinator, "down-a")
        server.stop()
        results, err = worker.results()
    finally:
        server.stop()
    assert [r["status"] for r in results] == ["timed_out", "timed_out", "completed"]
    assert 1.0 <= results[0]["elapsed"] < 1.0 + LATE
    assert 0.3 <= results[1]["elapsed"] < 0.3 + LATE
    assert err.count("registry unavailable") == 1, err


def test_redis_down_from_the_start(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)  # never started: connection refused
    worker = Worker(server.url, new_prefix(), "none-a:0.3:30:sleep", "none-b:2.0:0.01:spin")
    results, err = worker.results()
    assert [r["status"] for r in results] == ["timed_out", "completed"]
    assert err.count("registry unavailable") == 1, err


def test_in_process_cancel_and_extend_from_other_threads(registry: DeadlineRegistry) -> None:
    coordinator = DeadlineRegistry.from_url(_url(registry), prefix=registry.prefix)
    # The extension lands well before the original 1.2 s, and the cancel well before the
    # extended deadline, however slow the machine.
    job = InThread(registry, "inproc", 1.2)
    wait_for_job(coordinator, "inproc")
    coordinator.extend("inproc", 2.0)
    while job.scope.elapsed() < 1.4 and job.thread.is_alive():
        time.sleep(0.01)
    assert job.thread.is_alive()  # past the original 1.2 s
    assert coordinator.cancel("inproc")
    job.join()
    assert type(job.exc).__name__ == "DeadlineCancelled"
    assert job.scope.result.status == "cancelled"
    assert job.scope.cancelled()
    coordinator.close()


def _url(registry: DeadlineRegistry) -> str:
    kw = registry.client.connection_pool.connection_kwargs
    return f"redis://{kw['host']}:{kw['port']}/{kw.get('db', 0)}"


def test_bad_input_is_refused_and_leaves_nothing_armed(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, socket_timeout=1.0)
    with pytest.raises(TypeError, match="redis.Redis"):
        DeadlineRegistry("redis://nowhere")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="margin"):
        DeadlineRegistry(client, margin=-1)
    with pytest.raises(ValueError, match="prefix"):
        DeadlineRegistry(client, prefix="")
    reg = DeadlineRegistry(client, prefix=new_prefix())
    with pytest.raises(ValueError, match="job id"):
        reg.deadline("", 1.0)
    with pytest.raises(ValueError, match="seconds"):
        reg.extend("x", -1)
    with pytest.raises(TypeError, match="seconds"):
        reg.extend("x", "1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="soft"):
        reg.deadline("x", 1.0, soft=2.0)
    with pytest.raises(ValueError, match="needs a deadline"):
        reg.deadline("x", None)  # type: ignore[arg-type]
    assert timeoutcore.current_scope() is None
    assert reg._listener is None  # nothing started for refused input


def test_status_and_exception_of_a_remote_cancel_survive_json_and_pickle(
        registry: DeadlineRegistry) -> None:
    import pickle

    scope = registry.deadline("roundtrip", 5.0)
    threading.Timer(0.1, scope.cancel).start()
    with pytest.raises(timeoutcore.DeadlineExceeded) as info:
        with scope:
            timeoutcore.sleep(5)
    again = pickle.loads(pickle.dumps(info.value))
    assert type(again).__name__ == "DeadlineCancelled" and "cancelled" in str(again)
    result = timeoutcore.DeadlineResult.from_json(scope.result.to_json())
    assert result.status == "cancelled"
