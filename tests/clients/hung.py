"""A loopback provider that accepts every connection, reads every request, and never answers.

What a provider that hangs looks like to a client: the TCP connection opens, the HTTP
request is sent and read whole, and no byte comes back. :class:`HungProvider` serves the
Anthropic and OpenAI paths alike on 127.0.0.1 from one thread (a selector, so the threads
it adds are one whatever the number of connections), and notes for each connection when
it opened, which path it asked for, and when the client closed it: how long a hung
request lived is read from the server's side. It stops itself after ``lifetime`` seconds
and on leaving its ``with`` block, closing every connection it still holds.

Loaded by path from the tests that use it (not a test module).
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any


@dataclass
class Connection:
    """One connection the server accepted: when it opened, the request line it read (once
    the headers arrived) and when the client closed it (``None`` while open)."""

    opened: float
    request_line: str | None = None
    closed: float | None = None
    received: bytes = b""

    @property
    def path(self) -> str | None:
        """The path of the request (``POST /v1/messages HTTP/1.1`` gives ``/v1/messages``)."""
        if self.request_line is None:
            return None
        parts = self.request_line.split()
        return parts[1] if len(parts) > 1 else None

    def lived(self) -> float | None:
        """Seconds from opening to the client's close (``None`` while open)."""
        return None if self.closed is None else self.closed - self.opened


class HungProvider:
    """A provider that never answers: ``kind`` (``"anthropic"`` or ``"openai"``) only
    chooses the :attr:`base_url` an SDK is given."""

    def __init__(self, kind: str, *, lifetime: float = 120.0) -> None:
        self.kind = kind
        self.connections: list[Connection] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._stop = threading.Event()
        self._lifetime = lifetime
        self._thread = threading.Thread(target=self._serve, name="hung-provider", daemon=True)

    @property
    def base_url(self) -> str:
        """The URL to give the SDK as ``base_url``."""
        host, port = self._listener.getsockname()[:2]
        root = f"http://{host}:{port}"
        return root + "/v1" if self.kind == "openai" else root

    def snapshot(self) -> list[Connection]:
        """The connections so far (copies, so they do not change under the caller)."""
        with self._lock:
            return [Connection(c.opened, c.request_line, c.closed) for c in self.connections]

    def requests(self) -> list[Connection]:
        """The connections that carried a request (whose request line arrived)."""
        return [c for c in self.snapshot() if c.request_line is not None]

    def open_requests(self) -> int:
        """How many requests are still held open by their clients."""
        return sum(1 for c in self.requests() if c.closed is None)

    def wait_all_closed(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for the clients to close every connection."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if all(c.closed is not None for c in self.snapshot()):
                return True
            time.sleep(0.01)
        return all(c.closed is not None for c in self.snapshot())

    def _serve(self) -> None:
        end = time.monotonic() + self._lifetime
        while not self._stop.is_set() and time.monotonic() < end:
            for key, _ in self._selector.select(timeout=0.01):
                if key.data is None:
                    self._accept()
                else:
                    self._read(key.fileobj, key.data)
        self._close_all()

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except BlockingIOError:
            return
        sock.setblocking(False)
        connection = Connection(opened=time.monotonic())
        with self._lock:
            self.connections.append(connection)
        self._selector.register(sock, selectors.EVENT_READ, connection)

    def _read(self, sock: Any, connection: Connection) -> None:
        try:
            data = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client closed the connection: the hung request ended
            with self._lock:
                connection.closed = time.monotonic()
            self._selector.unregister(sock)
            sock.close()
            return
        connection.received += data
        if connection.request_line is None and b"\r\n" in connection.received:
            line = connection.received.split(b"\r\n", 1)[0].decode("latin-1")
            with self._lock:
                connection.request_line = line

    def _close_all(self) -> None:
        for key in list(self._selector.get_map().values()):
            self._selector.unregister(key.fileobj)
            key.fileobj.close()  # type: ignore[union-attr]
        self._selector.close()

    def __enter__(self) -> HungProvider:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
