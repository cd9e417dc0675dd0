"""patch(): every patched socket and TLS wait hears every stop -- ``cancel()``, an earlier
``reschedule()``, ``cancel_all()``, a ``soft_raise`` soft limit -- whatever the socket's own
timeout, and that timeout keeps its own meaning.

The rule these tests hold the socket patches to: with a socket timeout of 5 s inside a 30 s
scope, a stop that comes while the call waits ends it within ``PROMPT`` (2 s, a loaded
machine's margin; the old design woke only at the socket's 5 s), with the stop's own
exception; afterwards the socket's timeout is what it was, bytes the peer sends later are
read by the next call, and no descriptor is left behind. A socket timeout shorter than the
scope still raises ``socket.timeout``, counted from the call's start.

TLS runs against a real ``ssl`` server on loopback with default settings: TLS 1.3 and its
session tickets, records without application data that make the client's socket readable
while a read has nothing to return (the case a readiness wait followed by a blocking
OpenSSL read missed).
"""

from __future__ import annotations

import errno
import os
import select
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any, Callable, Optional

import pytest

import timeoutcore
from timeoutcore import (
    DeadlineCancelled,
    DeadlineExceeded,
    SoftDeadlineExceeded,
    thread_deadline,
)
from timeoutcore.patch import is_patched, patch, unpatch

SOCK_TIMEOUT = 5.0  # the socket's own timeout in the stop tests
HARD = 30.0  # the scope's deadline in the stop tests
PROMPT = 2.0  # a stop reaches the wait within this (< SOCK_TIMEOUT: the old design failed)
ACT_AFTER = 0.2  # the trigger acts this long after the worker is about to call
SOFT_AT = 0.3  # the soft limit of the "soft" trigger, from the scope's entry
TRIGGERS = ["cancel", "earlier", "cancel_all", "soft"]
TIMEOUTS = [SOCK_TIMEOUT, None]  # a socket with a timeout, and a blocking one
EXPECTED = {"cancel": "cancelled", "cancel_all": "cancelled", "earlier": "hard",
            "soft": "soft"}


@pytest.fixture(autouse=True)
def patched() -> Iterator[None]:
    patch()
    yield
    unpatch()
    assert not is_patched()


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.fixture(autouse=True)
def no_fd_left() -> Iterator[None]:
    """Every test closes what it opened; the worker threads' wake-up eventfds go with them."""
    before = _fds()
    yield
    left = _fds() - before
    assert not left, f"descriptors left open: {sorted(left)}"


def _worker(fn: Callable[[], None]) -> threading.Thread:
    t = threading.Thread(target=fn, daemon=True)  # a stuck worker fails, never hangs
    t.start()
    return t


def _join(*threads: threading.Thread) -> None:
    for t in threads:
        t.join(HARD + 10)
        assert not t.is_alive(), "a thread of the test did not finish"


def stop_during(trigger: str, call: Callable[[], Any]) -> float:
    """Run ``call()`` in a worker thread inside a 30 s scope and stop it with ``trigger``
    from another thread (``ACT_AFTER`` s after the worker is about to call; "soft": a
    ``soft_raise`` soft limit at ``SOFT_AT``). Asserts the block ended with the trigger's
    exception; returns the seconds from the stop's due time to that exception."""
    extra: dict[str, Any] = ({"soft_limit": SOFT_AT, "soft_raise": True}
                             if trigger == "soft" else {})
    scope = thread_deadline(HARD, **extra)
    about_to_call = threading.Event()
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            with scope:
                about_to_call.set()
                try:
                    call()
                except SoftDeadlineExceeded:
                    box["outcome"] = "soft"
                else:
                    box["outcome"] = "returned"
                box["at"] = time.monotonic()
        except DeadlineCancelled:
            box["outcome"], box["at"] = "cancelled", time.monotonic()
        except DeadlineExceeded:
            box["outcome"], box["at"] = "hard", time.monotonic()
        except BaseException as exc:  # noqa: BLE001 - handed to the assertion below
            box["outcome"], box["at"] = exc, time.monotonic()

    def act() -> None:
        about_to_call.wait(HARD)
        # By now the worker waits in the call on any machine but a very loaded one; a
        # worker that starts late finds the stop passed, which the call must hear too.
        time.sleep(ACT_AFTER)
        now = time.monotonic()
        if trigger == "cancel":
            scope.cancel()
        elif trigger == "earlier":
            box["due"] = now + 0.2
            scope.reschedule(box["due"])
        elif trigger == "cancel_all":
            box["cancelled"] = timeoutcore.cancel_all()
        box.setdefault("due", now)

    threads = [_worker(work)]
    if trigger != "soft":
        threads.append(_worker(act))
    _join(*threads)
    assert box.get("outcome") == EXPECTED[trigger], box.get("outcome")
    if trigger == "cancel_all":
        assert scope in box["cancelled"]
    # The soft limit counts from the scope's entry (scope.entered_at, monotonic), not from
    # any later moment the worker could note: a loaded machine can pause it in between.
    # Only the upper bound is this file's rule for it: the waits' soft stop time is taken
    # by the engine's enter hook, before entered_at is stamped (the first soft scope of a
    # process loads the soft timer in between), so it may come that much before this due.
    due = scope.entered_at + SOFT_AT if trigger == "soft" else box["due"]
    late = float(box["at"] - due)
    earliest = -SOFT_AT if trigger == "soft" else -0.05
    assert earliest < late < PROMPT, f"the stop reached the call {late:.2f} s after it was due"
    return late


def timed_out_after(timeout: float, call: Callable[[], Any]) -> float:
    """``call()`` in a worker thread inside a 30 s scope must raise ``socket.timeout`` (the
    socket's own ``timeout``, the earlier one), not a stop; returns the seconds it took."""
    box: dict[str, Any] = {}

    def work() -> None:
        scope = thread_deadline(HARD)
        with scope:
            t0 = time.monotonic()
            try:
                call()
            except socket.timeout as exc:
                box["took"] = time.monotonic() - t0
                box["exc"] = exc
        box["expired"] = scope.expired()

    _join(_worker(work))
    assert "exc" in box, "the socket's own timeout did not fire"
    assert box["expired"] is False
    took = float(box["took"])
    assert timeout <= took < timeout + PROMPT, took
    return took


# --- plain sockets ---------------------------------------------------------------------------


@pytest.mark.parametrize("timeout", TIMEOUTS, ids=["timeout5", "blocking"])
@pytest.mark.parametrize("trigger", TRIGGERS)
@pytest.mark.parametrize("method", ["recv", "recv_into", "recvfrom", "recvfrom_into"])
def test_receive_hears_the_stop(trigger: str, timeout: Optional[float], method: str) -> None:
    a, b = socket.socketpair()
    with a, b:
        a.settimeout(timeout)
        buf = bytearray(10)
        calls: dict[str, Callable[[], Any]] = {
            "recv": lambda: a.recv(10),
            "recv_into": lambda: a.recv_into(buf),
            "recvfrom": lambda: a.recvfrom(10),
            "recvfrom_into": lambda: a.recvfrom_into(buf),
        }
        stop_during(trigger, calls[method])
        assert a.gettimeout() == timeout
        b.sendall(b"after")  # nothing was consumed: the next call reads exactly this
        assert a.recv(100) == b"after"


@pytest.mark.parametrize("timeout", TIMEOUTS, ids=["timeout5", "blocking"])
@pytest.mark.parametrize("trigger", ["cancel", "earlier"])
def test_sendall_to_a_peer_that_does_not_read(trigger: str, timeout: Optional[float]) -> None:
    a, b = socket.socketpair()
    with a, b:
        a.settimeout(timeout)
        stop_during(trigger, lambda: a.sendall(b"x" * (64 << 20)))
        assert a.gettimeout() == timeout


def test_callers_own_dontwait_is_answered_at_once() -> None:
    """A blocking socket called with the caller's own ``MSG_DONTWAIT`` inside a scope: the
    ``BlockingIOError`` is the answer, at once, as outside a scope -- not a wait."""
    r, peer = socket.socketpair()  # r: nothing to read
    a, b = socket.socketpair()  # a: its send queue full (b never reads)
    with r, peer, a, b:
        a.setblocking(False)
        with pytest.raises(BlockingIOError):
            for _ in range(1 << 16):
                a.send(b"x" * 65536)
        a.setblocking(True)
        dontwait = socket.MSG_DONTWAIT
        calls: list[Callable[[], Any]] = [
            lambda: r.recv(10, dontwait),
            lambda: r.recv_into(bytearray(10), 0, dontwait),
            lambda: r.recv_into(bytearray(10), flags=dontwait),
            lambda: r.recvfrom(10, dontwait),
            lambda: r.recvfrom_into(bytearray(10), 0, dontwait),
            lambda: a.send(b"x", dontwait),
            lambda: a.sendall(b"x", dontwait),
        ]
        box: dict[str, Any] = {}

        def work() -> None:
            with thread_deadline(HARD):
                t0 = time.monotonic()
                out = []
                for call in calls:
                    try:
                        call()
                        out.append("returned")
                    except BlockingIOError:
                        out.append("EAGAIN")
                box["out"], box["took"] = out, time.monotonic() - t0

        _join(_worker(work))
        assert box["out"] == ["EAGAIN"] * len(calls)
        assert box["took"] < PROMPT
        assert r.gettimeout() is None and a.gettimeout() is None


def test_udp_receive_hears_cancel() -> None:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with u, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
        u.bind(("127.0.0.1", 0))
        u.settimeout(SOCK_TIMEOUT)
        stop_during("cancel", lambda: u.recvfrom(100))
        peer.sendto(b"after", u.getsockname())
        assert u.recvfrom(100)[0] == b"after"


@pytest.mark.parametrize("timeout", TIMEOUTS, ids=["timeout5", "blocking"])
@pytest.mark.parametrize("trigger", ["cancel", "cancel_all"])
def test_accept_hears_the_stop(trigger: str, timeout: Optional[float]) -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    with srv:
        srv.settimeout(timeout)
        stop_during(trigger, srv.accept)
        assert srv.gettimeout() == timeout
        with socket.create_connection(srv.getsockname()):
            conn, _ = srv.accept()  # the pending connection was left for the next call
            conn.close()


@pytest.fixture
def full_listener() -> Iterator[tuple[str, int]]:
    """A listener whose backlog is full: the kernel does not complete new handshakes, so a
    connect() to it waits (skipped where the kernel completes them anyway)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    addr = srv.getsockname()
    fillers = []
    try:
        for _ in range(8):
            s = socket.socket()
            fillers.append(s)
            s.setblocking(False)
            if s.connect_ex(addr) not in (0, errno.EINPROGRESS):
                break
        time.sleep(0.05)
        with socket.socket() as probe:
            probe.settimeout(0.2)
            try:
                probe.connect(addr)
                pytest.skip("the kernel completed a connection past the backlog")
            except OSError:
                pass
        yield addr
    finally:
        for s in fillers:
            s.close()
        srv.close()


@pytest.mark.parametrize("timeout", TIMEOUTS, ids=["timeout5", "blocking"])
@pytest.mark.parametrize("trigger", ["cancel", "earlier"])
@pytest.mark.parametrize("ex", [False, True], ids=["connect", "connect_ex"])
def test_connect_hears_the_stop(full_listener: tuple[str, int], trigger: str,
                                timeout: Optional[float], ex: bool) -> None:
    with socket.socket() as c:
        c.settimeout(timeout)
        stop_during(trigger, lambda: c.connect_ex(full_listener) if ex
                    else c.connect(full_listener))
        assert c.gettimeout() == timeout


def test_connect_keeps_its_own_timeout(full_listener: tuple[str, int]) -> None:
    with socket.socket() as c, socket.socket() as c2:
        c.settimeout(0.5)
        timed_out_after(0.5, lambda: c.connect(full_listener))
        assert c.gettimeout() == 0.5
        c2.settimeout(0.5)
        box: list[int] = []
        _join(_worker(lambda: _in_scope(lambda: box.append(c2.connect_ex(full_listener)))))
        assert box == [errno.EWOULDBLOCK]  # what CPython's connect_ex returns at its timeout


def _in_scope(fn: Callable[[], None]) -> None:
    with thread_deadline(HARD):
        fn()


def test_connect_outcomes_inside_a_scope() -> None:
    """A connection that completes, and one refused: the results of the originals."""
    srv = socket.create_server(("127.0.0.1", 0))
    addr = srv.getsockname()
    refused = socket.create_server(("127.0.0.1", 0))
    gone = refused.getsockname()
    refused.close()
    out: dict[str, Any] = {}

    def work() -> None:
        with thread_deadline(HARD):
            for timeout in TIMEOUTS:
                with socket.socket() as c:
                    c.settimeout(timeout)
                    out[f"ok {timeout}"] = (c.connect(addr), c.gettimeout())
                with socket.socket() as c:
                    c.settimeout(timeout)
                    out[f"ex {timeout}"] = c.connect_ex(gone)
                with socket.socket() as c:
                    c.settimeout(timeout)
                    try:
                        c.connect(gone)
                    except ConnectionRefusedError as exc:
                        out[f"refused {timeout}"] = exc.errno

    with srv:
        _join(_worker(work))
        for _ in TIMEOUTS:
            srv.accept()[0].close()
    for timeout in TIMEOUTS:
        assert out[f"ok {timeout}"] == (None, timeout)
        assert out[f"ex {timeout}"] == errno.ECONNREFUSED
        assert out[f"refused {timeout}"] == errno.ECONNREFUSED


def test_receive_keeps_its_own_timeout() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.settimeout(0.5)
        timed_out_after(0.5, lambda: a.recv(10))
        assert a.gettimeout() == 0.5
        b.sendall(b"after")
        assert a.recv(100) == b"after"


def test_sendall_timeout_is_the_whole_call() -> None:
    """CPython's sendall: the socket's timeout bounds the whole call, from its start."""
    a, b = socket.socketpair()
    with a, b:
        a.settimeout(0.5)
        timed_out_after(0.5, lambda: a.sendall(b"x" * (64 << 20)))
        assert a.gettimeout() == 0.5


# --- TLS ----------------------------------------------------------------------------------


class TlsPair:
    """A client TLS socket and the server's side of it over loopback, both handshaken;
    the server uses default settings (TLS 1.3, session tickets on)."""

    def __init__(self, cert: str, key: str, handshake: bool = True) -> None:
        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ctx.load_cert_chain(cert, key)
        self.client_ctx = ssl.create_default_context(cafile=cert)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.server: Any = None
        self.client: Any = None
        if not handshake:
            return
        box: dict[str, Any] = {}

        def serve() -> None:
            conn, _ = self.listener.accept()
            try:
                box["server"] = server_ctx.wrap_socket(conn, server_side=True)
            except BaseException:
                conn.close()
                raise

        t = _worker(serve)
        try:
            self.client = self.client_ctx.wrap_socket(
                socket.create_connection(self.listener.getsockname()),
                server_hostname="127.0.0.1")
        finally:
            _join(t)
        self.server = box["server"]

    def close(self) -> None:
        for s in (self.client, self.server, self.listener):
            if s is not None:
                s.close()


@pytest.fixture
def tls(tls_files: tuple[str, str]) -> Iterator[TlsPair]:
    pair = TlsPair(*tls_files)
    yield pair
    pair.close()


def _session_tickets_waiting(client: Any) -> bool:
    """The TLS 1.3 case: the client's socket is readable, yet no application data is
    waiting -- the server's session tickets arrived after the handshake."""
    readable = select.select([client], [], [], PROMPT)[0]
    return bool(readable) and client.pending() == 0


@pytest.mark.parametrize("timeout", TIMEOUTS, ids=["timeout5", "blocking"])
@pytest.mark.parametrize("trigger", TRIGGERS)
def test_tls_read_hears_the_stop(tls: TlsPair, trigger: str, timeout: Optional[float]) -> None:
    assert tls.client.version() == "TLSv1.3"
    assert _session_tickets_waiting(tls.client)
    tls.client.settimeout(timeout)
    stop_during(trigger, lambda: tls.client.recv(10))
    assert tls.client.gettimeout() == timeout
    tls.server.sendall(b"after")
    assert tls.client.recv(100) == b"after"


@pytest.mark.parametrize("trigger", ["cancel", "cancel_all"])
def test_tls_read_into_hears_the_stop(tls: TlsPair, trigger: str) -> None:
    tls.client.settimeout(SOCK_TIMEOUT)
    buf = bytearray(10)
    stop_during(trigger, lambda: tls.client.recv_into(buf))
    tls.server.sendall(b"after")
    assert tls.client.recv_into(buf) == 5 and bytes(buf[:5]) == b"after"


def test_tls_read_keeps_its_own_timeout(tls: TlsPair) -> None:
    assert _session_tickets_waiting(tls.client)
    tls.client.settimeout(0.5)
    timed_out_after(0.5, lambda: tls.client.recv(10))
    assert tls.client.gettimeout() == 0.5
    tls.server.sendall(b"after")
    assert tls.client.recv(100) == b"after"


def test_tls_exchange_inside_a_scope(tls: TlsPair) -> None:
    """Normal traffic through the non-blocking attempts: nothing lost, nothing reordered."""
    payload = os.urandom(3 << 20)
    got: list[bytes] = []

    def echo() -> None:
        tls.server.settimeout(HARD)
        data = b""
        while len(data) < len(payload):
            data += tls.server.recv(1 << 16)
        tls.server.sendall(data)

    def client() -> None:
        with thread_deadline(HARD):
            tls.client.settimeout(SOCK_TIMEOUT)
            tls.client.sendall(payload)
            data = b""
            while len(data) < len(payload):
                data += tls.client.recv(1 << 16)
            got.append(data)

    _join(_worker(echo), _worker(client))
    assert got == [payload]
    assert tls.client.gettimeout() == SOCK_TIMEOUT


@pytest.mark.parametrize("timeout", TIMEOUTS, ids=["timeout5", "blocking"])
@pytest.mark.parametrize("trigger", ["cancel", "earlier"])
def test_tls_write_hears_the_stop(tls: TlsPair, trigger: str, timeout: Optional[float]) -> None:
    tls.client.settimeout(timeout)
    stop_during(trigger, lambda: tls.client.sendall(b"x" * (64 << 20)))
    assert tls.client.gettimeout() == timeout


@pytest.mark.parametrize("timeout", TIMEOUTS, ids=["timeout5", "blocking"])
@pytest.mark.parametrize("trigger", ["cancel", "cancel_all"])
def test_tls_handshake_hears_the_stop(tls_files: tuple[str, str], trigger: str,
                                      timeout: Optional[float]) -> None:
    """The server accepts the connection and never speaks TLS."""
    pair = TlsPair(*tls_files, handshake=False)
    try:
        raw = socket.create_connection(pair.listener.getsockname())
        pair.server = pair.listener.accept()[0]
        raw.settimeout(timeout)
        pair.client = pair.client_ctx.wrap_socket(raw, server_hostname="127.0.0.1",
                                                  do_handshake_on_connect=False)
        stop_during(trigger, pair.client.do_handshake)
        assert pair.client.gettimeout() == timeout
    finally:
        pair.close()


def test_tls_unwrap_hears_cancel(tls: TlsPair) -> None:
    """unwrap() sends close_notify and waits for the peer's, which never comes."""
    tls.client.settimeout(SOCK_TIMEOUT)
    stop_during("cancel", tls.client.unwrap)
    assert tls.client.gettimeout() == SOCK_TIMEOUT


# --- a real client library -----------------------------------------------------------------


@pytest.mark.parametrize("trigger", ["cancel", "cancel_all"])
def test_redis_blocking_pop_hears_the_stop(redis_url: str, trigger: str) -> None:
    """redis-py with ``socket_timeout=5``: a BLPOP waiting forever is stopped promptly, the
    connection is dropped (its reply will never be read), and the client goes on working."""
    redis = pytest.importorskip("redis")
    key = f"timeoutcore-test-sock-{os.getpid()}-{trigger}"
    client = redis.Redis.from_url(redis_url, socket_timeout=SOCK_TIMEOUT)
    try:
        client.delete(key)
        stop_during(trigger, lambda: client.blpop([key], timeout=0))
        client.rpush(key, b"v")
        box: list[Any] = []
        _join(_worker(lambda: _in_scope(lambda: box.append(client.blpop([key], timeout=5)))))
        assert box == [(key.encode(), b"v")]
        assert client.ping() is True
    finally:
        client.delete(key)
        client.close()
        client.connection_pool.disconnect()
