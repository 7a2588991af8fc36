"""One encoding per sample, shared by every event stream; a stream that falls behind is dropped.

How a sample reaches N open pages::

    sources ──state()──► Broadcaster (one task in the server's loop, 4 ticks a second)
                          │ the state changed: encode it once (JSON bytes, in a thread)
                          ▼
            Stream.pending = the same bytes object, for every stream (latest wins)
                          ▼
            each stream's pump sends it (gzip-compressed once, too, for the clients
            that take it) in SLICE_BYTES pieces; the connection's transport buffers
            at most SEND_HIGH_WATER bytes before the pump waits

A stream holds at most one sample it has not started to send (a newer one replaces
it: every sample is the whole state, so a slow page skips samples and loses
nothing) and one it is sending.  Those are shared objects; what is the stream's own
is the transport's buffer and one slice in flight, so memory per stream is bounded
(~32-48 KiB) whatever the state's size or the client's speed.  A stream that has not
finished taking one sample for ``stall_s`` seconds (a client that connected and
never reads, a suspended laptop), or whose send is blocked while the kernel holds more
than KERNEL_BACKLOG bytes it has not read (loopback takes megabytes per connection
before a send blocks: that copying is what a stalled page costs), is dropped: its connection is aborted (the
buffered bytes freed at once) and its id remembered, so when the browser reconnects
(``EventSource`` does, sending ``Last-Event-ID``) the first event tells it why.  At
most ``max_streams`` streams are open at once; past that ``/events`` answers 503
with a line saying so, and the page falls back to polling ``/api/state``.

``/api/state`` answers from the same cache: a request between two samples costs a
lookup, not an encoding.

Rejected: a queue per client (a stalled client grew it without bound, or needed a
policy to discard from the middle of it, when only the newest state matters);
encoding per client (200 pages re-encoded a 100 KB state 200 times a sample: the
pilot's tiny-task rate fell to a small fraction, docs/benchmarks.md); counting bytes the kernel accepted (loopback
absorbs megabytes per connection before anything blocks, so a byte budget would
not see a stalled client for minutes, while the time a sample has been waiting
does); sending deltas (smaller frames, but a page that missed one would need a
resync protocol; the full state keeps every event self-contained); compressing per
stream (a deflate context per page, and the compression paid per page: the shared
blocks of ``gzip_block`` cost one compression per sample); a gzip trailer (its CRC
covers what this stream got, so it is per stream; a stream ends after its ``end``
event, which the page has acted on).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import os
import secrets
import time
import zlib

from .._json import dumps

SLICE_BYTES = 16 * 1024  # a sample goes out in pieces this big: the transport buffers at most one
SEND_HIGH_WATER = 16 * 1024  # the connection's write buffer before the pump waits (server.py)
KERNEL_BACKLOG = 1 << 20  # bytes in the kernel a stream has not read, on top of a blocked send
TICK_S = 0.25  # how often the sources' seqs are looked at
DROPPED_REMEMBERED = 1024  # ids of dropped streams kept for their reconnect notice
MAX_STREAMS_ENV = "SHOAL_DASHBOARD_MAX_STREAMS"
DEFAULT_MAX_STREAMS = 256


GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # RFC 1952, no name, no time


def gzip_block(data: bytes) -> bytes:
    """``data`` as deflate blocks that need nothing before them: a fresh compressor, ended
    by a sync flush (byte-aligned, not final).  Such blocks concatenate into one valid
    deflate stream in any order, so every stream after its own ``GZIP_HEADER`` sends the
    same bytes, compressed once per sample (a state of JSON shrinks to a small fraction,
    and the bytes the kernel copies per page with it)."""
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH)


def max_streams_from(value: int | None) -> int:
    """``value``, else ``$SHOAL_DASHBOARD_MAX_STREAMS``, else 256; a clear error when bad."""
    where = "max_streams"
    if value is None:
        text = os.environ.get(MAX_STREAMS_ENV)
        if text is None:
            return DEFAULT_MAX_STREAMS
        where = f"${MAX_STREAMS_ENV}"
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{where}={text!r}: must be a whole number of event streams >= 1") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}={value!r}: must be a whole number of event streams >= 1")
    return value


class StreamsFull(Exception):
    """``max_streams`` event streams are open already."""


@dataclasses.dataclass(eq=False)
class Stream:
    """One open ``/events`` connection, as the broadcaster sees it."""

    token: str
    client: tuple | None  # the peer (host, port): what the server aborts
    wake: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    gzip: bool = False  # the client takes Content-Encoding: gzip (then the gzip blocks go)
    pending: tuple[bytes, bytes] | None = None  # the newest sample not yet started (shared)
    final: bool = False  # pending is the last sample: end the stream after it
    sending_since: float | None = None  # monotonic time the sample in flight was started
    dropped: str | None = None  # why the server gave up on it
    ending: bool = False  # the server is closing
    sent: int = 0
    skipped: int = 0  # samples replaced before this stream started them


class Broadcaster:
    """Samples ``snapshot()`` for every open stream at once; see the module docstring.

    ``abort(client)`` closes a dropped stream's connection at once (the server's);
    ``stopping()`` true ends every stream.  All methods run in the server's loop.
    """

    def __init__(self, snapshot, *, abort=lambda client: None, unsent=lambda client: 0,
                 stopping=lambda: False, max_streams: int = DEFAULT_MAX_STREAMS,
                 stall_s: float = 10.0):
        self.snapshot = snapshot
        self.abort = abort
        self.unsent = unsent
        self.stopping = stopping
        self.max_streams = max_streams
        self.stall_s = stall_s
        self.streams: set[Stream] = set()
        self.dropped: collections.OrderedDict[str, dict] = collections.OrderedDict()
        self.drops = 0  # streams dropped since the start (for tests and the benchmark)
        self.encodings = 0  # samples encoded since the start
        self._key = None
        self._json: bytes = b""
        self._frames: tuple[bytes, bytes] = (b"", b"")
        self._closed = False
        self._lock: asyncio.Lock | None = None
        self._task: asyncio.Task | None = None

    # -- the shared sample -----------------------------------------------------------
    def _sample(self):
        """(key, json bytes, closed), encoding only when the sources' seqs moved (a thread)."""
        state = self.snapshot()
        key = tuple(s.get("seq") for s in state.values() if isinstance(s, dict)) + (state["closed"],)
        if key != self._key:
            self._json = dumps(state, compact=True).encode()
            frame = b"data: " + self._json + b"\n\n"
            self._frames = (frame, gzip_block(frame))
            self._key, self._closed = key, bool(state["closed"])
            self.encodings += 1
        return self._key, self._json, self._closed

    def frames(self) -> tuple[bytes, bytes]:
        """The latest sample as an event: (plain, as a gzip block), both shared."""
        return self._frames

    async def current(self):
        """The latest (key, json bytes, closed); encodes at most once per change."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            return await asyncio.to_thread(self._sample)

    # -- streams ---------------------------------------------------------------------
    def subscribe(self, client, last_event_id: str | None) -> tuple[Stream, dict | None]:
        """A new stream, and the drop notice for the one it replaces (``Last-Event-ID``)."""
        if len(self.streams) >= self.max_streams:
            raise StreamsFull(len(self.streams))
        stream = Stream(secrets.token_urlsafe(9), client)
        self.streams.add(stream)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        notice = self.dropped.pop(last_event_id, None) if last_event_id else None
        return stream, notice

    def unsubscribe(self, stream: Stream) -> None:
        self.streams.discard(stream)

    def drop(self, stream: Stream, reason: str) -> None:
        """Give up on ``stream``: abort its connection, remember why for its reconnect."""
        stream.dropped = reason
        self.streams.discard(stream)
        self.drops += 1
        self.dropped[stream.token] = {"reason": reason, "at": time.time(), "sent": stream.sent,
                                      "skipped": stream.skipped}
        while len(self.dropped) > DROPPED_REMEMBERED:
            self.dropped.popitem(last=False)
        stream.wake.set()
        self.abort(stream.client)

    async def _run(self) -> None:
        """The one sampling task: while streams are open, hand each new sample to all."""
        last = None
        while self.streams:
            if self.stopping():
                for s in list(self.streams):
                    s.ending = True
                    s.wake.set()
                return
            key, body, closed = await self.current()
            now = time.monotonic()
            frame = None
            if key != last:
                last = key
                frame = self.frames()
            for s in list(self.streams):
                if s.sending_since is not None and now - s.sending_since > self.stall_s:
                    self.drop(s, f"it had not taken a sample for {self.stall_s:g} s "
                                 f"(a page that stopped reading, or a connection too slow for "
                                 f"{len(body) // 1024 + 1} KiB a sample)")
                elif frame is not None and s.sending_since is not None \
                        and self.unsent(s.client) > KERNEL_BACKLOG:
                    self.drop(s, f"it had {KERNEL_BACKLOG // 2**20} MiB sent and not read "
                                 "(a page that stopped reading)")
                elif frame is not None:
                    if s.pending is not None:
                        s.skipped += 1
                    s.pending, s.final = frame, closed
                    s.wake.set()
            if closed:
                return  # every stream has the last sample; the pumps end after it
            await asyncio.sleep(TICK_S)
