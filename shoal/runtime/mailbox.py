"""Mailboxes: whole messages over fixed-size rings.

An ``Outbox`` is the producer end of one ring (one ordered pair of endpoints).
``send`` never blocks: a message that does not fit now waits in a private
FIFO (``pending``) and is flushed, in order, by later ``send``/``flush`` calls;
the owner's event loop keeps calling ``flush`` while it also drains its own
inboxes, so two endpoints with full rings towards each other cannot deadlock.
A message larger than the ring's record limit is cut into a ``FIRST`` fragment,
``MORE`` ones and a ``LAST`` one; fragments of one message are contiguous in
the ring because each ring has one producer.  If an endpoint dies halfway
through a message, its replacement (a new consumer) drops fragments that have
no ``FIRST``, and a surviving consumer drops the half it holds (``reset``).

An ``Inbox`` is the consumer end; ``receive`` returns whole messages.

Rejected: blocking producers (deadlock between two full rings); a shared
overflow segment for big messages (a second allocator to get right).
"""

from __future__ import annotations

from collections import deque

from ..queues import EMPTY, Push
from .wire import Kind

_FIRST = bytes((Kind.FIRST,))
_MORE = bytes((Kind.MORE,))
_LAST = bytes((Kind.LAST,))
_OK = Push.OK
_FIRST_KIND = int(Kind.FIRST)  # a plain int: an enum attribute per record costs ~0.1 us


class Outbox:
    """Producer end of one ring: owner only (one thread or one process at a time)."""

    __slots__ = ("ring", "doorbell", "pending", "limit", "sent")

    def __init__(self, ring, doorbell):
        self.ring = ring
        self.doorbell = doorbell
        self.pending: deque = deque()
        self.limit = ring.max_message - 1
        self.sent = 0

    def send(self, msg: bytes, wake: bool = True) -> None:
        self.sent += 1
        if len(msg) > self.limit:
            self._send_fragments(msg)
        elif self.pending or self.ring.push(msg) is not _OK:
            self.pending.append(msg)
            self.flush()
        if wake:
            self.doorbell.ring()

    def send_many(self, msgs: list) -> None:
        """``send`` each of ``msgs`` in order, ringing the doorbell once (a batch of tasks)."""
        push, limit, pending = self.ring.push, self.limit, self.pending
        self.sent += len(msgs)
        for msg in msgs:
            if len(msg) > limit:
                self._send_fragments(msg)
            elif pending or push(msg) is not _OK:
                pending.append(msg)
        if pending:
            self.flush()
        self.doorbell.ring()

    def _send_fragments(self, msg: bytes) -> None:
        step = self.limit
        view = memoryview(msg)
        n = len(msg)
        for start in range(0, n, step):
            tag = _LAST if start + step >= n else (_FIRST if start == 0 else _MORE)
            self.pending.append(tag + view[start:start + step])
        self.flush()

    def flush(self) -> bool:
        """Push what waits (and wake the consumer if any went); True when nothing is left."""
        pending = self.pending
        push = self.ring.push
        pushed = False
        try:
            while pending:
                if push(pending[0]) is not _OK:
                    return False
                pending.popleft()
                pushed = True
            return True
        finally:
            if pushed:
                self.doorbell.ring()


class Inbox:
    """Consumer end of one ring: owner only."""

    __slots__ = ("ring", "parts", "received")

    def __init__(self, ring):
        self.ring = ring
        self.parts: list | None = None  # fragments of the message being reassembled
        self.received = 0

    def reset(self) -> None:
        """The producer died: drop the half message it was sending."""
        self.parts = None

    def receive(self, max_n: int = 64) -> list:
        ring = self.ring
        if not ring.readable():
            return []
        recs = ring.pop_many(max_n)
        # fragments have the highest kinds, and bytes compare by their first byte first:
        # the largest record tells in one C call whether any record is a fragment
        if self.parts is not None or (recs and max(recs)[0] >= _FIRST_KIND):
            recs = self._reassemble(recs)
        self.received += len(recs)
        return recs

    def receive_one(self):
        """One whole message or EMPTY."""
        while True:
            rec = self.ring.pop()
            if rec is EMPTY:
                return EMPTY
            if rec[0] < Kind.FIRST and self.parts is None:
                self.received += 1
                return rec
            whole = self._reassemble([rec])
            if whole:
                self.received += 1
                return whole[0]

    def _reassemble(self, recs: list) -> list:
        out = []
        for r in recs:
            tag = r[0]
            if tag == Kind.FIRST:
                self.parts = [r[1:]]
            elif tag == Kind.MORE or tag == Kind.LAST:
                if self.parts is None:
                    continue  # the tail of a message whose start a dead consumer took
                self.parts.append(r[1:])
                if tag == Kind.LAST:
                    out.append(b"".join(self.parts))
                    self.parts = None
            else:
                self.parts = None  # a whole message: any half message before it was orphaned
                out.append(r)
        return out
