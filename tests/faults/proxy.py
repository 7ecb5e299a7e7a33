"""A loopback TCP proxy that misbehaves on demand, in front of a live server.

Modes (switch at any time with `set_mode`; switching closes the connections open so far, so that a
client's pooled keep-alive connection cannot bypass the new fault):

- "pass": forward both ways.
- "delay": forward, but hold every chunk of the server's answer `delay` seconds (a slow server).
- "hang": accept connections and never answer nor read (requests run into the client's timeout).
- "drop": accept and reset the connection at once (RST).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from types import TracebackType
from typing import Literal

Mode = Literal["pass", "delay", "hang", "drop"]


class FaultProxy:
    def __init__(self, target_port: int, mode: Mode = "pass", delay: float = 0.0) -> None:
        self.target = ("127.0.0.1", target_port)
        self.mode: Mode = mode
        self.delay = delay
        self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port = int(self._listener.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name="fault-proxy", daemon=True)
        self._thread.start()

    def set_mode(self, mode: Mode, delay: float | None = None) -> None:
        with self._lock:
            self.mode = mode
            if delay is not None:
                self.delay = delay
            sockets, self._open = self._open, set()
        for sock in sockets:
            _reset(sock)

    def close(self) -> None:
        self._closed.set()
        self.set_mode("drop")
        with contextlib.suppress(OSError):
            self._listener.close()
        self._thread.join(5)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # internals

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                mode = self.mode
                self._open.add(client)
            if mode == "drop":
                self._forget(client)
                _reset(client)
            elif mode == "hang":
                pass  # kept open, never read nor answered, until the mode changes or the proxy closes
            else:
                threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            self._forget(client)
            _reset(client)
            return
        upstream.settimeout(None)
        with self._lock:
            self._open.add(upstream)
        threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
        self._pump(upstream, client, True)

    def _pump(self, src: socket.socket, dst: socket.socket, answer: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if answer and self.mode == "delay":
                    time.sleep(self.delay)
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            self._forget(sock)
            _reset(sock)

    def _forget(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.discard(sock)


def _reset(sock: socket.socket) -> None:
    """Close with SO_LINGER 0: the peer sees a connection reset, not an orderly end; SHUT_RD first
    wakes a thread of ours blocked in recv() on it."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    with contextlib.suppress(OSError):
        sock.close()
