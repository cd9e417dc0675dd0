"""timeoutcore.patch: the stdlib's blocking calls end at the deadline inside a scope, and are
exactly the originals outside one."""

from __future__ import annotations

import errno
import http.server
import os
import queue
import select
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any, Callable

import pytest
from conftest import LATE, expect_deadline, in_thread, needs_gil

import timeoutcore
from timeoutcore import DeadlineExceeded, thread_deadline
from timeoutcore.patch import (
    NATIVE_INTERRUPTS,
    __all__ as patch_all,
    is_patched,
    patch,
    patched_targets,
    unpatch,
)

LIMIT = 0.05
PY = sys.executable


@pytest.fixture(autouse=True)
def _never_leak_the_patch() -> Iterator[None]:
    """Whatever a test does, no patch survives it (other test files see the stdlib)."""
    yield
    unpatch()
    assert not is_patched()
    assert time.sleep is _ORIGINALS["time.sleep"]


_ORIGINALS = {
    "time.sleep": time.sleep,
    "select.select": select.select,
    "select.poll": select.poll,
    "Condition.wait": threading.Condition.wait,
    "Thread.join": threading.Thread.join,
    "Popen.wait": subprocess.Popen.wait,
    "Popen.communicate": subprocess.Popen.communicate,
    "Popen.__init__": subprocess.Popen.__init__,
}


@pytest.fixture
def patched() -> Iterator[None]:
    patch()
    yield
    unpatch()


# --- patch() / unpatch() themselves --------------------------------------------------------


def test_public_names() -> None:
    assert sorted(patch_all) == ["is_patched", "patch", "patched_targets", "unpatch"]


def test_patch_is_idempotent_and_reversible() -> None:
    assert not is_patched() and patched_targets() == ()
    patch()
    targets = patched_targets()
    patch()
    assert patched_targets() == targets and is_patched()
    assert "threading.Condition.wait" in targets and "subprocess.Popen.wait" in targets
    if not NATIVE_INTERRUPTS:
        assert time.sleep is not _ORIGINALS["time.sleep"]
        assert "socket.socket.recv" in targets and "select.poll" in targets
    assert "recv" in vars(socket.socket)
    unpatch()
    unpatch()
    assert not is_patched() and patched_targets() == ()
    for name, obj in _ORIGINALS.items():
        owner, _, attr = name.rpartition(".")
        current = {
            "time": time, "select": select, "Condition": threading.Condition,
            "Thread": threading.Thread, "Popen": subprocess.Popen,
        }[owner]
        assert getattr(current, attr) is obj, name
    # Inherited C methods come back as inherited, not as copies.
    assert "recv" not in vars(socket.socket) and "_accept" not in vars(socket.socket)


def test_unpatch_leaves_a_later_patch_alone() -> None:
    patch()

    def mine(secs: float) -> None:
        raise AssertionError

    time.sleep = mine
    try:
        unpatch()
        assert time.sleep is mine
    finally:
        time.sleep = _ORIGINALS["time.sleep"]


def test_patched_functions_keep_their_names(patched: None) -> None:
    assert time.sleep.__name__ == "sleep"
    assert threading.Condition.wait.__name__ == "wait"
    assert subprocess.Popen.wait.__wrapped__ is _ORIGINALS["Popen.wait"]  # type: ignore[attr-defined]


@pytest.mark.skipif(sys.version_info < (3, 15), reason="CPython 3.15+ only (cpython#144748)")
def test_315_skips_what_cpython_interrupts_itself() -> None:
    patch()
    if timeoutcore.ENGINE == "native":
        assert NATIVE_INTERRUPTS
        assert "time.sleep" not in patched_targets()
        assert time.sleep is _ORIGINALS["time.sleep"]
        # ... and the unpatched sleep is interrupted by the core's signal alone.
        expect_deadline(lambda: time.sleep(1.0))
    assert "subprocess.Popen.wait" in patched_targets()


def test_below_315_every_patch_is_applied() -> None:
    if sys.version_info >= (3, 15):
        pytest.skip("3.15+ skips some patches")
    patch()
    for name in ("time.sleep", "socket.socket.recv", "select.select", "select.poll",
                 "selectors.EpollSelector.select", "threading.Condition.wait"):
        assert name in patched_targets()


# --- inside a scope, in a worker thread: each patched primitive ends at the deadline --------


@pytest.fixture
def sockpair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    srv = socket.create_server(("127.0.0.1", 0))
    yield srv
    srv.close()


def _unpatched_sleep_is_not_interrupted() -> None:
    """The reason for all this: without the patch, time.sleep in a worker runs its course."""
    def body() -> Any:
        t0 = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            with thread_deadline(0.02):
                time.sleep(0.3)
        return time.monotonic() - t0

    assert in_thread(body) >= 0.3


@pytest.mark.skipif(sys.version_info >= (3, 15), reason="CPython 3.15+ interrupts it natively")
def test_without_the_patch_time_sleep_runs_its_course() -> None:
    _unpatched_sleep_is_not_interrupted()


def test_time_sleep(patched: None) -> None:
    expect_deadline(lambda: time.sleep(1.0))


def test_socket_recv_family(patched: None, sockpair: Any) -> None:
    a, _ = sockpair
    expect_deadline(lambda: a.recv(10))
    expect_deadline(lambda: a.recv(10, socket.MSG_PEEK))
    expect_deadline(lambda: a.recv_into(bytearray(10)))
    expect_deadline(lambda: a.recv_into(bytearray(10), 5))
    expect_deadline(lambda: a.recvfrom(10))
    expect_deadline(lambda: a.recvfrom_into(bytearray(10)))


def test_socket_with_a_longer_timeout(patched: None, sockpair: Any) -> None:
    a, _ = sockpair
    a.settimeout(30.0)
    expect_deadline(lambda: a.recv(10))
    assert a.gettimeout() == 30.0


def test_socket_makefile_read(patched: None, sockpair: Any) -> None:
    a, _ = sockpair
    f = a.makefile("rb")
    expect_deadline(lambda: f.read(1))


def test_socket_sendall_and_send(patched: None, sockpair: Any) -> None:
    a, _ = sockpair
    expect_deadline(lambda: a.sendall(b"x" * 20_000_000))
    expect_deadline(lambda: a.send(b"x" * 20_000_000))


def test_socket_sendto_udp(patched: None) -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with a, b:
        a.setblocking(False)
        try:
            for _ in range(10**6):
                a.send(b"x" * 1024)
        except BlockingIOError:
            pass  # the peer's queue is full
        a.setblocking(True)
        expect_deadline(lambda: a.send(b"y"))
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with u:
        u.bind(("127.0.0.1", 0))
        expect_deadline(lambda: u.recvfrom(100))


def test_socket_accept(patched: None, listener: socket.socket) -> None:
    expect_deadline(listener.accept)


def test_socket_connect(patched: None) -> None:
    # A listener whose backlog is full does not complete new handshakes: connect() hangs.
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    addr = srv.getsockname()
    fillers = []
    try:
        for _ in range(8):
            s = socket.socket()
            s.setblocking(False)
            if s.connect_ex(addr) not in (0, errno.EINPROGRESS):
                break
            fillers.append(s)
        time.sleep(0.05)
        probe = socket.socket()
        probe.settimeout(0.2)
        try:
            probe.connect(addr)
            pytest.skip("the kernel completed a connection past the backlog")
        except (socket.timeout, OSError):
            pass
        finally:
            probe.close()
        c = socket.socket()
        with c:
            expect_deadline(lambda: c.connect(addr))
            assert c.gettimeout() is None  # restored
        c2 = socket.socket()
        with c2:
            expect_deadline(lambda: c2.connect_ex(addr))
    finally:
        for s in fillers:
            s.close()
        srv.close()


def test_select_select(patched: None, pipe: Any) -> None:
    expect_deadline(lambda: select.select([pipe[0]], [], []))
    expect_deadline(lambda: select.select([pipe[0]], [], [], 10.0))


def test_select_poll(patched: None, pipe: Any) -> None:
    p = select.poll()
    p.register(pipe[0], select.POLLIN)
    expect_deadline(p.poll)
    expect_deadline(lambda: p.poll(10_000))


@pytest.mark.parametrize("name", ["DefaultSelector", "SelectSelector", "PollSelector"])
def test_selectors(patched: None, pipe: Any, name: str) -> None:
    sel = getattr(selectors, name)()
    with sel:
        sel.register(pipe[0], selectors.EVENT_READ)
        expect_deadline(sel.select)


def test_event_condition_semaphore(patched: None) -> None:
    expect_deadline(threading.Event().wait)
    expect_deadline(lambda: threading.Event().wait(10.0))
    cond = threading.Condition()

    def cond_wait() -> None:
        with cond:
            cond.wait()

    expect_deadline(cond_wait)
    # The lock was re-acquired and released properly: usable again from another thread.
    assert cond.acquire(timeout=1.0)
    cond.release()
    expect_deadline(threading.Semaphore(0).acquire)
    expect_deadline(lambda: threading.BoundedSemaphore(1).acquire() and
                    threading.Semaphore(0).acquire(timeout=10))


def test_queue_get_put(patched: None) -> None:
    q: queue.Queue[int] = queue.Queue()
    expect_deadline(q.get)
    full: queue.Queue[int] = queue.Queue(maxsize=1)
    full.put(1)
    expect_deadline(lambda: full.put(2))
    expect_deadline(lambda: full.put(2, timeout=10.0))
    assert full.get_nowait() == 1 and full.empty()  # its mutex is free


def test_thread_join(patched: None) -> None:
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, args=(10,))
    t.start()
    try:
        expect_deadline(t.join)
        assert t.is_alive()
    finally:
        stop.set()
        t.join()


def test_future_result(patched: None) -> None:
    from concurrent.futures import Future

    expect_deadline(Future().result)


def test_shorter_own_timeouts_are_kept(patched: None, sockpair: Any) -> None:
    a, _ = sockpair

    def body() -> Any:
        a.settimeout(0.05)
        out = []
        with thread_deadline(2.0) as scope:
            t0 = time.monotonic()
            try:
                a.recv(1)
            except socket.timeout as exc:
                out.append(("recv", str(exc), time.monotonic() - t0))
            t0 = time.monotonic()
            out.append(("event", threading.Event().wait(0.05), time.monotonic() - t0))
            t0 = time.monotonic()
            try:
                queue.Queue().get(timeout=0.05)
            except queue.Empty:
                out.append(("queue", "Empty", time.monotonic() - t0))
        return out, scope

    out, scope = in_thread(body)
    assert not scope.expired()
    assert [o[:2] for o in out] == [("recv", "timed out"), ("event", False), ("queue", "Empty")]
    for _, _, took in out:
        assert 0.05 <= took < 0.05 + LATE


def test_results_inside_a_scope_are_the_originals(patched: None, sockpair: Any) -> None:
    a, b = sockpair

    def body() -> Any:
        with thread_deadline(5.0):
            b.sendall(b"hello")
            got = a.recv(10)
            n = b.send(b"world")
            buf = bytearray(5)
            m = a.recv_into(buf)
            ev = threading.Event()
            threading.Timer(0.02, ev.set).start()
            waited = ev.wait()
            q: queue.Queue[int] = queue.Queue()
            threading.Timer(0.02, q.put, args=(7,)).start()
            item = q.get()
            time.sleep(0.01)
            out = subprocess.run([PY, "-c", "print(6*7)"], capture_output=True, check=True)
        return got, n, m, bytes(buf), waited, item, out.stdout.strip()

    assert in_thread(body) == (b"hello", 5, 5, b"world", True, 7, b"42")


def test_shield_makes_patched_calls_run_their_course(patched: None) -> None:
    def body() -> Any:
        t0 = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            with thread_deadline(0.02):
                with timeoutcore.shield():
                    time.sleep(0.1)
                    got = threading.Event().wait(0.05)
                    took = time.monotonic() - t0
        return got, took

    got, took = in_thread(body)
    assert got is False and took >= 0.15


@needs_gil
def test_fallback_engine_is_patched_too() -> None:
    """The pure-Python engine has no signal at all: with patch() its blocking calls end at
    the deadline as well."""
    code = (
        "import queue, threading, time, timeoutcore\n"
        "from timeoutcore import DeadlineExceeded, thread_deadline\n"
        "from timeoutcore.patch import patch\n"
        "assert timeoutcore.ENGINE == 'fallback', timeoutcore.ENGINE\n"
        "patch()\n"
        "took = []\n"
        "def work():\n"
        "    for call in (lambda: time.sleep(2), lambda: queue.Queue().get()):\n"
        "        t0 = time.monotonic()\n"
        "        try:\n"
        "            with thread_deadline(0.05):\n"
        "                call()\n"
        "        except DeadlineExceeded:\n"
        "            took.append(time.monotonic() - t0)\n"
        "t = threading.Thread(target=work)\n"
        "t.start()\n"
        "t.join()\n"
        "print(*took)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(timeoutcore.__file__)))
    env = dict(os.environ, TIMEOUTCORE_ENGINE="fallback",
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    took = [float(x) for x in proc.stdout.split()]
    assert len(took) == 2
    for t in took:
        assert 0.05 <= t < 0.05 + LATE


# --- subprocesses started inside a scope are scope-owned -----------------------------------


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_popen_in_a_scope_gets_its_own_session(patched: None) -> None:
    def body() -> Any:
        with thread_deadline(5.0):
            p = subprocess.Popen([PY, "-c", "import os; print(os.getsid(0))"],
                                 stdout=subprocess.PIPE)
            out, _ = p.communicate()
        return p.pid, int(out)

    pid, sid = in_thread(body)
    assert sid == pid  # its own session (and process group)
    outside = subprocess.Popen([PY, "-c", "import os; print(os.getsid(0))"],
                               stdout=subprocess.PIPE)
    out, _ = outside.communicate()
    assert int(out) == os.getsid(0)  # outside a scope: unchanged


@pytest.mark.parametrize("how", ["wait", "communicate", "run"])
def test_popen_tree_killed_and_reaped_at_the_deadline(patched: None, how: str) -> None:
    # child and grandchild ignore SIGTERM; the child prints the grandchild's pid
    tree = ["sh", "-c", 'trap "" TERM; sleep 60 & echo $!; sleep 60']
    box: dict[str, Any] = {}

    def work() -> None:
        if how == "run":
            r, w = os.pipe()
            box["r"] = r
            subprocess.run(tree, stdout=w)
            return
        p = subprocess.Popen(tree, stdout=subprocess.PIPE)
        box["p"] = p
        box["grandchild"] = int(p.stdout.readline())  # type: ignore[union-attr]
        if how == "wait":
            p.wait()
        else:
            p.communicate()

    if how == "run":
        expect_deadline(work, limit=1.0)
        r = box["r"]
        with os.fdopen(r) as f:
            grandchild = int(f.readline())
    else:
        expect_deadline(work, limit=1.0)
        p = box["p"]
        assert p.returncode == -signal.SIGKILL
        with pytest.raises(ProcessLookupError):
            os.kill(p.pid, 0)  # reaped: not even a zombie
        grandchild = box["grandchild"]
    for _ in range(100):
        if _dead(grandchild):
            break
        time.sleep(0.01)
    assert _dead(grandchild)


def test_popen_started_outside_is_not_killed(patched: None) -> None:
    p = subprocess.Popen([PY, "-c", "import time; time.sleep(30)"])
    try:
        expect_deadline(p.wait)
        assert p.poll() is None  # still running: the scope does not own it
    finally:
        p.kill()
        p.wait()


# --- HTTP in practice ------------------------------------------------------------------------


@pytest.fixture
def silent_server(silent_peer: Any) -> str:
    """The URL of a loopback server that accepts connections and never answers."""
    url: str = silent_peer.url
    return url


def test_urllib_against_a_silent_server(patched: None, silent_server: str) -> None:
    expect_deadline(lambda: urllib.request.urlopen(silent_server))


def test_urllib_with_its_own_timeout(patched: None, silent_server: str) -> None:
    expect_deadline(lambda: urllib.request.urlopen(silent_server, timeout=30))


def test_requests_against_a_silent_server(patched: None, silent_server: str) -> None:
    requests = pytest.importorskip("requests")
    expect_deadline(lambda: requests.get(silent_server))


def test_https_handshake_with_a_silent_server(patched: None, silent_server: str) -> None:
    """TLS: the handshake waits for a ServerHello that never comes."""
    import ssl

    url = silent_server.replace("http://", "https://")
    expect_deadline(lambda: urllib.request.urlopen(url, context=ssl.create_default_context()))


def test_https_server_that_never_answers(patched: None, tls_files: tuple[str, str]) -> None:
    """TLS: the handshake completes, the request is sent, the response never comes. The
    limit gives a loaded machine a second and more for the handshake and the request; the
    deadline then comes while the client waits in the TLS read for the response."""
    import ssl

    cert, key = tls_files
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    srv = socket.create_server(("127.0.0.1", 0))
    held: list[Any] = []
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        for _ in range(1000):
            if stop.is_set():
                return
            try:
                conn, _ = srv.accept()
            except socket.timeout:
                continue
            try:
                held.append(server_ctx.wrap_socket(conn, server_side=True))
            except (ssl.SSLError, OSError):
                conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        url = f"https://127.0.0.1:{srv.getsockname()[1]}/"
        ctx = ssl.create_default_context(cafile=cert)
        expect_deadline(lambda: urllib.request.urlopen(url, context=ctx), limit=2.0)
        assert held, "the TLS handshake did not complete"
    finally:
        stop.set()
        t.join()
        for c in held:
            c.close()
        srv.close()


def test_urllib_answers_normally_inside_a_scope(patched: None) -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"pong"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"

        def body() -> Any:
            with thread_deadline(5.0):
                with urllib.request.urlopen(url) as resp:
                    return resp.read()

        assert in_thread(body) == b"pong"
    finally:
        server.shutdown()
        server.server_close()


# --- outside any scope: exactly the originals ----------------------------------------------
#
# Each case runs once unpatched and once patched; the outcomes (value, or exception type and
# message) must be equal, and the cases that wait check their own timing.


def _outcome(fn: Callable[[], Any]) -> Any:
    try:
        return ("value", fn())
    except BaseException as exc:  # noqa: BLE001 - compared, not swallowed
        return ("raised", type(exc).__name__, str(exc))


def _timed(fn: Callable[[], Any], at_least: float) -> Callable[[], Any]:
    def run() -> Any:
        t0 = time.monotonic()
        try:
            return fn()
        finally:
            took = time.monotonic() - t0
            assert at_least <= took < at_least + LATE, took

    return run


def _sock_case(fn: Callable[[socket.socket, socket.socket], Any]) -> Callable[[], Any]:
    def run() -> Any:
        a, b = socket.socketpair()
        with a, b:
            return fn(a, b)

    return run


def _timeout_recv(a: socket.socket, b: socket.socket) -> Any:
    a.settimeout(0.05)
    return a.recv(1)


def _nonblocking_recv(a: socket.socket, b: socket.socket) -> Any:
    a.setblocking(False)
    return a.recv(1)


def _closed_recv(a: socket.socket, b: socket.socket) -> Any:
    a.close()
    return a.recv(1)


def _roundtrip(a: socket.socket, b: socket.socket) -> Any:
    b.sendall(b"abc" * 1000)
    n = b.send(b"xyz")
    buf = bytearray(10)
    got = [a.recv(5), a.recv_into(buf, 4), bytes(buf[:4]), a.recvfrom(3)[0]]
    return n, got


def _udp(a: Any, b: Any) -> Any:
    u1 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u2 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with u1, u2:
        u2.bind(("127.0.0.1", 0))
        n = u1.sendto(b"ping", u2.getsockname())
        m = u1.sendto(b"pong", 0, u2.getsockname())
        return n, m, u2.recvfrom(10)[0], u2.recv(10)


def _accept_timeout() -> Any:
    srv = socket.create_server(("127.0.0.1", 0))
    with srv:
        srv.settimeout(0.05)
        return srv.accept()


def _accept_ok() -> Any:
    srv = socket.create_server(("127.0.0.1", 0))
    with srv, socket.create_connection(srv.getsockname()) as c:
        conn, addr = srv.accept()
        with conn:
            return conn.gettimeout(), addr == c.getsockname(), type(conn).__name__


def _refused(ex: bool) -> Callable[[], Any]:
    def run() -> Any:
        srv = socket.create_server(("127.0.0.1", 0))
        addr = srv.getsockname()
        srv.close()
        with socket.socket() as c:
            return c.connect_ex(addr) if ex else c.connect(addr)

    return run


def _select_cases() -> dict[str, Callable[[], Any]]:
    def with_pipe(fn: Callable[[int, int], Any]) -> Callable[[], Any]:
        def run() -> Any:
            r, w = os.pipe()
            try:
                return fn(r, w)
            finally:
                os.close(r)
                os.close(w)

        return run

    def poll_case(r: int, w: int, ms: Any, data: bool) -> Any:
        p = select.poll()
        p.register(r, select.POLLIN)
        if data:
            os.write(w, b"x")
        return [(fd == r, ev) for fd, ev in p.poll(ms)]

    def selector_case(r: int, w: int) -> Any:
        with selectors.DefaultSelector() as sel:
            sel.register(r, selectors.EVENT_READ)
            empty = sel.select(0.05)
            os.write(w, b"x")
            return empty, [(k.fd == r, ev) for k, ev in sel.select(0.05)]

    return {
        "select timeout": _timed(with_pipe(lambda r, w: select.select([r], [], [], 0.05)), 0.05),
        "select ready": with_pipe(lambda r, w: (os.write(w, b"x"),
                                                select.select([r], [w], [], 1)[0] == [r])),
        "select zero": with_pipe(lambda r, w: select.select([r], [], [], 0)),
        "select negative": with_pipe(lambda r, w: select.select([r], [], [], -1)),
        "select bad list": lambda: select.select(5, [], []),
        "select bad timeout": lambda: select.select([], [], [], "1"),
        "select arity": lambda: select.select([], []),  # type: ignore[call-arg]
        "poll timeout": _timed(with_pipe(lambda r, w: poll_case(r, w, 50, False)), 0.05),
        "poll ready": with_pipe(lambda r, w: poll_case(r, w, None, True)),
        "poll float": with_pipe(lambda r, w: poll_case(r, w, 0.5, False)),
        "poll bad": with_pipe(lambda r, w: poll_case(r, w, "x", False)),
        "selector": _timed(with_pipe(selector_case), 0.05),
    }


def _threading_cases() -> dict[str, Callable[[], Any]]:
    def cond_wait() -> Any:
        c = threading.Condition()
        with c:
            return c.wait(0.05)

    def cond_unlocked() -> Any:
        return threading.Condition().wait(0.01)

    def queue_get() -> Any:
        return queue.Queue().get(timeout=0.05)

    def queue_put() -> Any:
        q: queue.Queue[int] = queue.Queue(1)
        q.put(1)
        return q.put(2, timeout=0.05)

    def queue_neg() -> Any:
        return queue.Queue().get(timeout=-1)

    def join_running() -> Any:
        stop = threading.Event()
        t = threading.Thread(target=stop.wait, args=(5,))
        t.start()
        try:
            return t.join(0.05), t.is_alive()
        finally:
            stop.set()
            t.join()

    def notified() -> Any:
        ev = threading.Event()
        threading.Timer(0.01, ev.set).start()
        return ev.wait(2.0)

    return {
        "event timeout": _timed(lambda: threading.Event().wait(0.05), 0.05),
        "event set": lambda: (lambda e: (e.set(), e.wait(1)))(threading.Event()),
        "event notified": notified,
        "event zero": lambda: threading.Event().wait(0),
        "event bad timeout": lambda: threading.Event().wait("1"),  # type: ignore[arg-type]
        "condition timeout": _timed(cond_wait, 0.05),
        "condition un-acquired": cond_unlocked,
        "queue get": _timed(queue_get, 0.05),
        "queue put": _timed(queue_put, 0.05),
        "queue negative": queue_neg,
        "semaphore": _timed(lambda: threading.Semaphore(0).acquire(timeout=0.05), 0.05),
        "join running": _timed(join_running, 0.05),
        "join unstarted": lambda: threading.Thread(target=print).join(),
        "join self": lambda: threading.current_thread().join(),
        "lock": lambda: (lambda lk: (lk.acquire(), lk.acquire(timeout=0.01)))(threading.Lock()),
    }


def _subprocess_cases() -> dict[str, Callable[[], Any]]:
    def wait_timeout() -> Any:
        p = subprocess.Popen([PY, "-c", "import time; time.sleep(5)"])
        try:
            return p.wait(timeout=0.05)
        finally:
            p.kill()
            p.wait()

    def communicate_timeout() -> Any:
        p = subprocess.Popen([PY, "-c", "import time; print('a', flush=True); time.sleep(5)"],
                             stdout=subprocess.PIPE)
        try:
            return p.communicate(timeout=0.5)
        except subprocess.TimeoutExpired as exc:
            return "TimeoutExpired", exc.timeout, exc.cmd == p.args
        finally:
            p.kill()
            p.communicate()

    def run_timeout() -> Any:
        try:
            subprocess.run([PY, "-c", "import time; time.sleep(5)"], timeout=0.2)
        except subprocess.TimeoutExpired as exc:  # its message has the time left: varies
            return "TimeoutExpired", round(exc.timeout, 1)
        return None

    def session() -> Any:
        p = subprocess.Popen([PY, "-c", "import os; print(os.getsid(0))"],
                             stdout=subprocess.PIPE)
        return int(p.communicate()[0]) == os.getsid(0)

    return {
        "wait": lambda: subprocess.Popen([PY, "-c", "raise SystemExit(3)"]).wait(),
        "wait timeout": _timed(wait_timeout, 0.05),
        "communicate": lambda: subprocess.Popen(
            [PY, "-c", "import sys; print(sys.stdin.read().upper())"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE).communicate(b"abc"),
        "communicate timeout": communicate_timeout,
        "run": lambda: subprocess.run([PY, "-c", "print(1)"], capture_output=True).stdout,
        "run timeout": run_timeout,
        "check_output": lambda: subprocess.check_output([PY, "-c", "print(2)"]),
        "same session": session,
        "missing program": lambda: subprocess.Popen(["/nonexistent/program"]),
    }


BEHAVIOUR: dict[str, Callable[[], Any]] = {
    "sleep": _timed(lambda: time.sleep(0.05), 0.05),
    "sleep zero": lambda: time.sleep(0),
    "sleep negative": lambda: time.sleep(-1),
    "sleep nan": lambda: time.sleep(float("nan")),
    "sleep str": lambda: time.sleep("1"),  # type: ignore[arg-type]
    "sleep kwargs": lambda: time.sleep(secs=1),  # type: ignore[call-arg]
    "recv timeout": _timed(_sock_case(_timeout_recv), 0.05),
    "recv nonblocking": _sock_case(_nonblocking_recv),
    "recv closed": _sock_case(_closed_recv),
    "recv bad args": _sock_case(lambda a, b: a.recv("x")),  # type: ignore[arg-type]
    "send str": _sock_case(lambda a, b: a.send("x")),  # type: ignore[arg-type]
    "sendall str": _sock_case(lambda a, b: a.sendall("x")),  # type: ignore[arg-type]
    "roundtrip": _sock_case(_roundtrip),
    "udp": _sock_case(_udp),
    "accept timeout": _timed(_accept_timeout, 0.05),
    "accept": _accept_ok,
    "connect refused": _refused(False),
    "connect_ex refused": _refused(True),
    **_select_cases(),
    **_threading_cases(),
    **_subprocess_cases(),
}


@pytest.mark.parametrize("case", sorted(BEHAVIOUR))
def test_outside_a_scope_patched_is_the_original(case: str) -> None:
    fn = BEHAVIOUR[case]
    before = _outcome(fn)
    patch()
    try:
        assert timeoutcore.remaining() is None
        after = _outcome(fn)
    finally:
        unpatch()
    assert after == before


@pytest.mark.parametrize("case", ["sleep", "recv timeout", "event timeout", "queue get",
                                  "select timeout", "poll timeout", "roundtrip", "wait"])
def test_in_a_worker_outside_a_scope_patched_is_the_original(case: str) -> None:
    fn = BEHAVIOUR[case]
    before = in_thread(lambda: _outcome(fn))
    patch()
    try:
        after = in_thread(lambda: _outcome(fn))
    finally:
        unpatch()
    assert after == before


def test_scope_without_deadline_is_outside(patched: None) -> None:
    def body() -> Any:
        with thread_deadline(None):
            assert timeoutcore.remaining() is None
            return _outcome(BEHAVIOUR["event timeout"])

    assert in_thread(body) == ("value", False)
