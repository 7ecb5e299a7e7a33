"""Run the API under uvicorn: bind the port before anything announces it, and drop clients that hold a
connection open without completing a request.

uvicorn times out only idle keep-alive connections (`timeout_keep_alive`, after a response): a client
that connects and sends nothing, or half a request line, or a body that stalls, holds a connection and
its buffers for as long as it likes (measured: 300 such connections held for 20 s). The
protocol here adds the two timeouts of nginx's `client_header_timeout` / `client_body_timeout`: the
request head must be complete within `request_timeout` seconds of its first byte (or of the connection),
and a body may pause no longer than that between two reads.

`serve` stops cleanly, with exit status 0, on SIGTERM (docker stop, systemd, Kubernetes) and SIGINT
whatever disposition the parent left them in; with workers, their Prometheus counters are shared
through a PROMETHEUS_MULTIPROC_DIR (monitor.telemetry).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import os
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

DEFAULT_KEEP_ALIVE: Final = 5
"""Seconds an idle keep-alive connection stays open (uvicorn's default, set explicitly)."""
DEFAULT_REQUEST_TIMEOUT: Final = 10.0
"""Seconds for a request head to arrive, and the longest pause inside a request body."""
_TIMEOUT_BODY: Final = b"request not sent in time\n"
TIMEOUT_RESPONSE: Final = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(_TIMEOUT_BODY), _TIMEOUT_BODY)
)


def bind(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A listening TCP socket on host:port (port 0: a free one). Raises OSError (port in use, no such
    address) before the server is announced. Listening at once means a client that reads the
    announcement and connects is queued, never refused, while the workers start."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(True)  # worker processes serve the same socket
    return sock


def _base_protocol() -> type[asyncio.Protocol]:
    """uvicorn's `auto` choice: httptools when installed, else h11."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # pragma: no cover - httptools comes with uvicorn[standard]
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return H11Protocol
    return HttpToolsProtocol


class _RequestTimeout:
    """Mixin over a uvicorn HTTP protocol. Uses its `transport`, `cycle` (the request being served:
    None before the first head, `response_complete` once answered, `more_body` while the body is still
    arriving) and `flow` (whether uvicorn paused reading because the app is slow to consume)."""

    transport: asyncio.Transport
    cycle: Any
    flow: Any

    def __init__(self, *args: Any, request_timeout: float = DEFAULT_REQUEST_TIMEOUT, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._request_timeout = request_timeout
        self._timer: asyncio.TimerHandle | None = None
        self._head_bytes = False
        """Whether part of a request head arrived (a timed-out client gets a 408, an idle one is closed)."""

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)  # type: ignore[misc]
        if self._gone():
            self._cancel()
        elif self._awaiting_head():
            self._head_bytes = True
            if self._timer is None:  # a deadline for the whole head: trickling bytes do not extend it
                self._arm()
        elif self.cycle.more_body:  # reading the body: the timer measures the pause since this read
            self._head_bytes = False
            self._cancel()
            self._arm()
        else:  # the whole request is in: the app's time is not limited here
            self._head_bytes = False
            self._cancel()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        super().connection_lost(exc)  # type: ignore[misc]

    def _gone(self) -> bool:
        """Closed, or handed to another protocol (a WebSocket upgrade)."""
        protocol: object = self.transport.get_protocol()
        return self.transport.is_closing() or protocol is not self

    def _awaiting_head(self) -> bool:
        return self.cycle is None or bool(self.cycle.response_complete)

    def _arm(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(self._request_timeout, self._expired)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if self._gone():
            return
        if self._awaiting_head():
            if self._head_bytes:
                self.transport.write(TIMEOUT_RESPONSE)
            self.transport.close()
        elif self.cycle.more_body and not self.cycle.response_complete:
            if self.flow.read_paused:  # the app, not the client, is behind
                self._arm()
            else:
                self.transport.close()  # the app's receive() then sees http.disconnect


@functools.cache
def _protocol_class() -> type[asyncio.Protocol]:
    base = _base_protocol()
    return type(f"TimedOut{base.__name__}", (_RequestTimeout, base), {"__module__": __name__})


def timed_out_protocol(*args: Any, **kwargs: Any) -> asyncio.Protocol:
    """uvicorn's HTTP protocol with the request timeouts (module docstring); picklable for workers."""
    return _protocol_class()(*args, **kwargs)


def serve(
    app: Any,
    sock: socket.socket,
    *,
    workers: int = 1,
    factory: bool = False,
    log_level: str | None = None,
    keep_alive: int = DEFAULT_KEEP_ALIVE,
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
) -> None:
    """Serve `app` (an ASGI app, or an import string with `factory`) on the bound socket `sock` until
    interrupted; `workers` > 1 forks worker processes that share it (`app` must then be a string)."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        factory=factory,
        workers=workers,
        log_level=log_level,
        timeout_keep_alive=keep_alive,
        http=functools.partial(timed_out_protocol, request_timeout=request_timeout),  # type: ignore[arg-type]
    )
    server = uvicorn.Server(config)
    with _stop_on_signals():
        if workers > 1:
            # older uvicorn releases take the worker entry point, newer ones build it themselves
            extra = {"target": server.run} if "target" in inspect.signature(Multiprocess).parameters else {}
            with _shared_metrics_dir():
                Multiprocess(config, sockets=[sock], **extra).run()
        else:
            server.run(sockets=[sock])


STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM)


def _stop_requested(signum: int, frame: object) -> None:
    """Stands in for the parent's disposition while serving: uvicorn installs its own handlers while it
    runs and, once shut down, re-raises the signal to the handler it found. With SIG_DFL that killed
    the process by SIGTERM (status 143, a failure to docker and systemd) or KeyboardInterrupt (130)
    after a clean shutdown; with SIG_IGN (a job started in the background) the stop was silently
    dropped before uvicorn took over. The shutdown is already done when this runs: nothing to do."""


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return
    previous = {sig: signal.signal(sig, _stop_requested) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _shared_metrics_dir() -> Iterator[None]:
    """PROMETHEUS_MULTIPROC_DIR for the worker processes (they inherit the environment): the one given,
    emptied (stale files of an earlier run would be added in), or a private one removed afterwards."""
    given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if given:
        Path(given).mkdir(parents=True, exist_ok=True)
        for stale in Path(given).glob("*.db"):
            stale.unlink()
        yield
        return
    path = tempfile.mkdtemp(prefix="lldmon-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    try:
        yield
    finally:
        os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
        shutil.rmtree(path, ignore_errors=True)
