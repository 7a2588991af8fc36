"""The web server: uvicorn serving a Starlette app from one daemon thread.

The socket is bound here (not by uvicorn), so port 0 yields the real port before
``start`` returns and the address is known to be ours; ``close`` stops the
server, waits for its thread and closes the socket, so the port is free the
moment ``close`` returns.  Open event streams are ended by the app itself (it
sees ``source.closed``) and uvicorn's graceful shutdown is bounded.

Rejected: ``http.server`` (hand-rolled HTTP: no streaming without threads per
client, no keep-alive); a subprocess (the sampler reads the pilot's state in
this process).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import socket
import struct
import termios
import threading
import time
import weakref

DEFAULT_HOST = "127.0.0.1"
_ADVICE = {errno.EADDRINUSE: " (another program has it: choose another port, or 0 for any free one)",
           errno.EACCES: " (ports below 1024 need root: choose a port >= 1024, or 0)",
           errno.EADDRNOTAVAIL: " (not an address of this machine: leave the host out for 127.0.0.1)"}
_SERVING: weakref.WeakSet = weakref.WeakSet()  # this process's servers (for the fork hook)


def _forked_child() -> None:
    """A forked child (multiprocessing's fork, a DataLoader worker...) inherits the listening
    socket but not the thread serving it: closing the child's copy keeps the port the
    parent's alone, so the parent's ``close`` frees it (else it stayed bound, and a client
    connecting after it got no "refused", only a request that hung)."""
    for server in list(_SERVING):
        try:
            server.sock.close()
        except OSError:
            pass


os.register_at_fork(after_in_child=_forked_child)


def parse_address(value) -> tuple[str, int]:
    """``dashboard=`` as (host, port): an int port on 127.0.0.1, or ``"HOST:PORT"``."""
    if isinstance(value, bool):
        raise TypeError(f"dashboard= takes a port (0: any free one) or 'HOST:PORT', got {value!r}")
    if isinstance(value, int):
        host, port = DEFAULT_HOST, value
    elif isinstance(value, str) and ":" in value:
        host, _, port_text = value.rpartition(":")
        host = host.strip("[]") or DEFAULT_HOST
        try:
            port = int(port_text)
        except ValueError:
            raise ValueError(f"dashboard={value!r}: the port after ':' is not a number") from None
    else:
        raise TypeError(f"dashboard= takes a port (0: any free one) or 'HOST:PORT', got {value!r}")
    if not 0 <= port <= 65535:
        raise ValueError(f"dashboard port must be 0..65535, got {port}")
    return host, port


def _bounded_h11(connections: dict):
    """uvicorn's h11 protocol with a small write buffer per connection: the ASGI ``send`` of
    a stream waits once SEND_HIGH_WATER bytes are buffered (asyncio's default is 64 KiB),
    so what a client that stops reading costs the driver is bounded by that plus one
    slice (broadcast.py).  A class made here because uvicorn is an optional import."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    from .broadcast import SEND_HIGH_WATER

    class BoundedH11Protocol(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            transport.set_write_buffer_limits(high=SEND_HIGH_WATER)
            connections[self.client] = transport  # by peer: what scope["client"] names

        def connection_lost(self, exc) -> None:
            if connections.get(self.client) is self.transport:
                del connections[self.client]
            super().connection_lost(exc)

    return BoundedH11Protocol


class WebServer:
    """uvicorn in a thread: ``start()`` once, ``close()`` once (idempotent)."""

    def __init__(self, app, host: str = DEFAULT_HOST, port: int = 0):
        import uvicorn

        self.connections: dict = {}  # peer (host, port) -> transport, kept by the protocol
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind((host, port))
        except OSError as exc:  # taken, not ours, no such address: one line naming it
            self.sock.close()
            raise OSError(exc.errno, f"dashboard: cannot listen on {host}:{port}: {exc.strerror}"
                          f"{_ADVICE.get(exc.errno, '')}") from None
        self.sock.listen(128)
        self.sock.set_inheritable(False)
        self.host, self.port = self.sock.getsockname()[:2]
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                loop="asyncio", http=_bounded_h11(self.connections), ws="none",
                                timeout_graceful_shutdown=2, timeout_keep_alive=2)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._serve, name="shoal-dashboard", daemon=True)
        self.error: BaseException | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        _SERVING.add(self)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def abort(self, client) -> None:
        """Reset the connection from ``client`` (its ASGI ``scope["client"]``) now, dropping
        what its transport and the kernel still buffer for it (a stream that fell behind;
        broadcast.py): a plain close would queue its FIN behind the bytes the client never
        reads, and the connection would stay open.  Runs in the server's loop."""
        transport = self.connections.get(client)
        if transport is None:
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:  # a reset, not a FIN queued behind what it never read:
            with contextlib.suppress(OSError):  # the kernel's copy is freed too
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()

    def unsent(self, client) -> int:
        """Bytes the kernel holds for ``client`` that it has not read yet (Linux: SIOCOUTQ;
        0 where that cannot be asked).  Loopback accepts megabytes per connection before a
        send blocks: this is how far behind a page that stopped reading already is."""
        transport = self.connections.get(client)
        sock = transport.get_extra_info("socket") if transport is not None else None
        if sock is None:
            return 0
        try:
            return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
        except OSError:
            return 0

    def reset_all(self, timeout: float = 2.0) -> None:
        """Reset every open connection (any thread): at close, the streams of pages that
        stopped reading, whose FIN would otherwise wait behind what they never read."""
        loop, done = self.loop, threading.Event()
        if loop is None or loop.is_closed():
            return

        def reset() -> None:
            for client in list(self.connections):
                self.abort(client)
            done.set()

        with contextlib.suppress(RuntimeError):  # the loop just ended: nothing is open
            loop.call_soon_threadsafe(reset)
            done.wait(timeout)

    def _serve(self) -> None:
        try:
            asyncio.run(self._serve_here())
        except BaseException as exc:  # noqa: BLE001 - reported by start()/close()
            self.error = exc

    async def _serve_here(self) -> None:
        self.loop = asyncio.get_running_loop()
        await self.server.serve(sockets=[self.sock])

    def start(self, timeout: float = 10.0) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"dashboard server did not start: {self.error!r}")
            time.sleep(0.01)

    def close(self) -> None:
        self.server.should_exit = True
        if self.thread.is_alive():
            self.thread.join(10.0)
        try:
            self.sock.close()
        except OSError:
            pass
