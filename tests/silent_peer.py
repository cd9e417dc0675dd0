"""A loopback TCP peer that accepts every connection and never sends a byte: what a hung
HTTP server, database or broker looks like to a client that is waiting for an answer."""

from __future__ import annotations

import selectors
import socket
import threading
from types import TracebackType
from typing import Optional


class SilentPeer:
    """Listens on 127.0.0.1 (an ephemeral port); a thread accepts each connection and holds
    it open until :meth:`close`, so a client connects at once and then waits in its read,
    however many connections the tests open (a listener that never accepts would leave
    later clients waiting in ``connect`` once the kernel's backlog is full)."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.host, self.port = self._listener.getsockname()[:2]
        self.url = f"http://{self.host}:{self.port}/"
        self._wake_r, self._wake_w = socket.socketpair()
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, name="silent-peer", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(self._listener, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while True:
                for key, _ in sel.select():
                    if key.fileobj is self._wake_r:
                        return
                    conn, _ = self._listener.accept()
                    self._held.append(conn)

    def close(self) -> None:
        """Stop accepting and close every held connection and the listener."""
        self._wake_w.send(b"x")
        self._thread.join()
        for s in (*self._held, self._listener, self._wake_r, self._wake_w):
            s.close()
        self._held.clear()

    def __enter__(self) -> SilentPeer:
        return self

    def __exit__(self, et: Optional[type[BaseException]], e: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()
