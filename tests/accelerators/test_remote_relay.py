"""The remote-cancel relay (csrc/accel_remote_relay.c: remote_relay_on_readable): cancels
read off the registry's control socket without the GIL.

The Redis registry's subscriber waits on its socket with ``_wait_readable(fd, t, True)``;
the core peeks at the queued bytes and cancels the scopes armed under the tokens that
complete cancel messages name. Here the socket is one end of a socketpair and the messages
are written by hand, byte for byte as Redis sends them: what a cancel does, what it must not
do; then the registry's real subscriber over the suite's Redis. Those tests read the relay's
counters and are skipped where it is off. The arms' ownership tests (references, fork) read
no counter and hold with the relay off too: the arm table exists either way.
"""

from __future__ import annotations

import gc
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import FREE_THREADED, burn

import timeoutcore
from timeoutcore import DeadlineCancelled, DeadlineExceeded

from . import accelerated, core, native_only, stats

pytestmark = native_only


def _bulk(data: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(data), data)


def push(payload: bytes, kind: bytes = b"message", channel: bytes = b"tc:control",
         head: bytes = b"*") -> bytes:
    """A pub/sub push as Redis writes it (RESP2 ``*``, RESP3 ``>``)."""
    return head + b"3\r\n" + _bulk(kind) + _bulk(channel) + _bulk(payload)


def cancel_payload(token: str, job: str = "job-1", op: str = "cancel") -> bytes:
    """What the registry's Lua script publishes: cjson's compact JSON."""
    return json.dumps({"op": op, "job": job, "token": token}, separators=(",", ":")).encode()


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    try:
        yield a, b
    finally:
        a.close()
        b.close()


class Job:
    """A thread that arms ``token`` for its scope, enters it and spins until stopped."""

    def __init__(self, token: str, seconds: float = 30.0, sleep: bool = False) -> None:
        self.token = token
        self.scope: Any = timeoutcore.thread_deadline(seconds)
        self.entered = threading.Event()
        self.error: BaseException | None = None
        self.stopped_at: float | None = None
        self.thread = threading.Thread(target=self._run, args=(sleep,), daemon=True)
        self.thread.start()
        assert self.entered.wait(10)

    def _run(self, sleep: bool) -> None:
        core()._remote_arm(self.scope, self.token.encode())
        try:
            with self.scope:
                self.entered.set()
                if sleep:
                    timeoutcore.sleep(60)
                else:
                    while True:
                        burn(1)
        except DeadlineExceeded as e:
            self.stopped_at = time.monotonic()
            self.error = e
        finally:
            core()._remote_disarm(self.scope)

    def join(self, timeout: float = 10.0) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the job was not stopped"


def _deliver(b: socket.socket) -> bool:
    return bool(core()._wait_readable(b.fileno(), 5.0, True))


@pytest.mark.parametrize("head", [b"*", b">"], ids=["resp2", "resp3"])
@accelerated("remote_relay")
def test_a_cancel_on_the_socket_stops_its_job_as_cancel_would(
        pair: tuple[socket.socket, socket.socket], head: bytes) -> None:
    """The job stops with DeadlineCancelled (status ``cancelled``); the message stays on
    the socket for the subscriber to read, and no Python code of this thread ran it."""
    a, b = pair
    token = uuid.uuid4().hex
    job = Job(token)
    before = stats()
    message = push(cancel_payload(token), head=head)
    a.sendall(message)
    assert _deliver(b)
    assert stats()["remote_cancels"] == before["remote_cancels"] + 1  # marked in the wait
    job.join()
    assert type(job.error) is DeadlineCancelled
    assert job.scope.cancelled() and job.scope.result.status == "cancelled"
    b.setblocking(False)
    assert b.recv(4096) == message  # peeked, never consumed


@accelerated("remote_relay")
def test_a_job_asleep_in_the_core_is_woken(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    token = uuid.uuid4().hex
    job = Job(token, sleep=True)
    a.sendall(push(cancel_payload(token)))
    t0 = time.monotonic()
    assert _deliver(b)
    job.join()
    assert type(job.error) is DeadlineCancelled
    assert job.stopped_at is not None and job.stopped_at - t0 < 1.0


@accelerated("remote_relay")
def test_one_read_cancels_every_job_it_names(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    jobs = [Job(uuid.uuid4().hex) for _ in range(3)]
    bystander = Job(uuid.uuid4().hex, seconds=0.5)
    a.sendall(b"".join(push(cancel_payload(j.token, job=f"j{i}")) for i, j in enumerate(jobs)))
    assert _deliver(b)
    for j in jobs:
        j.join()
        assert type(j.error) is DeadlineCancelled
    bystander.join()  # its own deadline, not a cancel
    assert type(bystander.error) is DeadlineExceeded


NOT_A_CANCEL = {
    "extend": lambda t: push(cancel_payload(t, op="extend")),
    "another token": lambda t: push(cancel_payload(uuid.uuid4().hex)),
    "token in the job id": lambda t: push(cancel_payload(
        uuid.uuid4().hex, job=f'x","token":"{t}')),  # escaped by the JSON encoder
    "cut short": lambda t: push(cancel_payload(t))[:-9],
    "not a message": lambda t: push(cancel_payload(t), kind=b"pmessage"),
    "subscribe confirmation": lambda t: b"*3\r\n$9\r\nsubscribe\r\n$10\r\ntc:control\r\n:1\r\n",
    "garbage": lambda t: b"-ERR " + t.encode() + b"\r\n",
    "a cancel after something else": lambda t: (push(cancel_payload(t, op="extend"))
                                                + push(cancel_payload(t))),
}


@pytest.mark.parametrize("case", list(NOT_A_CANCEL), ids=list(NOT_A_CANCEL))
@accelerated("remote_relay")
def test_what_is_not_a_complete_cancel_for_an_armed_token_changes_nothing(
        pair: tuple[socket.socket, socket.socket], case: str) -> None:
    """Nothing is marked (the subscriber's own reading in Python decides), and the wait
    still reports the socket ready. A burst whose first message is something else is left
    whole to the Python path, the cancel in it too."""
    a, b = pair
    token = uuid.uuid4().hex
    job = Job(token, seconds=0.3)
    before = stats()
    a.sendall(NOT_A_CANCEL[case](token))
    assert _deliver(b)
    assert stats()["remote_cancels"] == before["remote_cancels"]
    job.join()
    assert type(job.error) is DeadlineExceeded  # its own deadline, 0.3 s


@accelerated("remote_relay")
def test_a_mark_for_a_scope_that_has_left_does_not_touch_the_next_one(
        pair: tuple[socket.socket, socket.socket]) -> None:
    """The cancel can be read between a scope's exit and its disarm (the registry disarms in
    the exit hook): the thread's next scope runs on to its own deadline."""
    a, b = pair
    token = uuid.uuid4().hex
    native = core()
    box: dict[str, Any] = {}
    go = threading.Event()
    marked = threading.Event()

    def run() -> None:
        first = timeoutcore.thread_deadline(30)
        native._remote_arm(first, token.encode())
        with first:
            pass
        go.set()
        assert marked.wait(10)
        t0 = time.monotonic()
        try:
            with timeoutcore.thread_deadline(0.2):
                while True:
                    burn(1)
        except DeadlineExceeded as e:
            box["error"], box["after"] = e, time.monotonic() - t0
        native._remote_disarm(first)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert go.wait(10)
    before = stats()
    a.sendall(push(cancel_payload(token)))
    assert _deliver(b)
    assert stats()["remote_cancels"] == before["remote_cancels"] + 1
    marked.set()
    thread.join(10)
    assert type(box["error"]) is DeadlineExceeded and box["after"] >= 0.19, box


@pytest.mark.skipif(sys.version_info < (3, 12) or FREE_THREADED,
                    reason="pending calls in any thread: 3.12+ with a GIL")
@accelerated("remote_relay")
@accelerated("self_fire")
def test_next_to_busy_threads_the_gils_holder_fires_the_cancel(
        pair: tuple[socket.socket, socket.socket]) -> None:
    """A job that waits for the GIL when its cancel is read: the watchdog does not queue
    for the GIL behind the busy threads, it asks whichever thread holds it to fire the job
    (csrc/accel_self_fire.c: pc_fire_for). With 3 spinning threads the job holds the GIL a
    quarter of the time, so a trial finds it waiting about one time in six: up to 150 trials
    (they stop at the first relay) make a run that never sees one a broken relay, not luck."""
    a, b = pair
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            burn(1)

    hogs = [threading.Thread(target=spin, daemon=True) for _ in range(3)]
    for h in hogs:
        h.start()
    relayed = 0
    try:
        for _ in range(150):
            token = uuid.uuid4().hex
            job = Job(token)
            time.sleep(0.005)
            before = stats()
            a.sendall(push(cancel_payload(token)))
            assert _deliver(b)
            job.join()
            assert type(job.error) is DeadlineCancelled
            b.setblocking(False)
            b.recv(65536)
            b.setblocking(True)
            relayed += stats()["remote_relays"] > before["remote_relays"]
            if relayed:
                break
    finally:
        stop.set()
        for h in hogs:
            h.join()
    assert relayed, "no cancel was fired by the GIL's holder"


def test_arming_checks_its_arguments_and_owns_one_reference() -> None:
    native = core()
    scope = timeoutcore.thread_deadline(1)
    token = uuid.uuid4().hex.encode()
    with pytest.raises(TypeError, match="deadline scope"):
        native._remote_arm(object(), token)
    for bad in (token.upper(), token[:-1], token + b"0", token.decode()):
        with pytest.raises(ValueError, match="32"):
            native._remote_arm(scope, bad)
    refs = sys.getrefcount(scope)
    native._remote_arm(scope, token)
    assert sys.getrefcount(scope) == refs + 1
    with pytest.raises(ValueError, match="armed already"):
        native._remote_arm(scope, token)
    assert sys.getrefcount(scope) == refs + 1
    assert native._remote_disarm(scope) is True
    assert native._remote_disarm(scope) is False
    assert sys.getrefcount(scope) == refs


def test_a_forgotten_arm_releases_its_scope() -> None:
    """What a fork child does with the parent's arms (timeoutcore._native)."""
    native = core()
    scope = timeoutcore.thread_deadline(1)
    native._remote_arm(scope, uuid.uuid4().hex.encode())
    refs = sys.getrefcount(scope)
    native._remote_forget()
    assert sys.getrefcount(scope) == refs - 1
    assert native._remote_disarm(scope) is False


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_fork_child_starts_without_the_parents_arms() -> None:
    native = core()
    scope = timeoutcore.thread_deadline(1)
    native._remote_arm(scope, uuid.uuid4().hex.encode())
    try:
        gc.collect()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            os._exit(0 if native._remote_disarm(scope) is False else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        assert native._remote_disarm(scope) is True  # the parent's is still there


@accelerated("remote_relay")
def test_the_wait_without_control_only_waits(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    token = uuid.uuid4().hex
    job = Job(token, seconds=0.3)
    before = stats()
    a.sendall(push(cancel_payload(token)))
    assert core()._wait_readable(b.fileno(), 5.0)
    assert stats()["remote_cancels"] == before["remote_cancels"]
    job.join()
    assert type(job.error) is DeadlineExceeded


# -- the registry's real subscriber, over the suite's Redis -----------------------------------


@pytest.fixture
def registry(redis_url: str) -> Iterator[Any]:
    """A registry on the suite's Redis (test_redis_registry.py's, imported only where the
    redis client is installed)."""
    pytest.importorskip("redis")
    from test_redis_registry import new_prefix

    from timeoutcore.contrib.redis import DeadlineRegistry

    reg = DeadlineRegistry.from_url(redis_url, prefix=new_prefix())
    yield reg
    reg.close()


@accelerated("remote_relay")
def test_the_subscribers_wait_applies_a_cancel_off_its_socket(registry: Any) -> None:
    """The subscriber's wait reads the cancel without the GIL and the job stops from there
    (csrc/accel_remote_relay.c); the subscriber's own reading of the message then finds it stopped.
    Same outcome as the Python path: DeadlineCancelled, status ``cancelled``, key gone."""
    from test_redis_registry import InThread, _url
    from redis_server import wait_for_job

    from timeoutcore.contrib.redis import DeadlineRegistry

    coordinator = DeadlineRegistry.from_url(_url(registry), prefix=registry.prefix)
    read = 0
    try:
        # A cancel that arrives while the subscriber is still busy in Python (subscribing,
        # resyncing: a loaded machine) is read the Python way, rightly: up to 3 jobs.
        for n in range(3):
            job = InThread(registry, f"remote-{n}", 30)
            wait_for_job(registry, f"remote-{n}")
            time.sleep(0.3)  # the subscriber is back in its wait
            before = stats()["remote_cancels"]
            assert coordinator.cancel(f"remote-{n}") is True
            job.join()
            assert type(job.exc) is timeoutcore.DeadlineCancelled
            assert job.scope.result.status == "cancelled"
            assert registry.get(f"remote-{n}") is None
            read = stats()["remote_cancels"] - before
            if read:
                break
    finally:
        coordinator.close()
    assert read == 1, "no cancel was read off the subscriber's socket"
