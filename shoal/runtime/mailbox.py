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

Urgent messages (the driver's cancel handshake, ``LocalBackend._probe``): an outbox
made with ``reserve`` keeps that many bytes of its ring free for ``send_urgent``, which
pushes a small message *ahead of* the pending FIFO.  Only messages whose effect does not
depend on their order may jump (a cancel-if-queued: "drop this id if it comes up"): the
handshake needs the message in the ring before the driver reads the workers' status
slots, and behind a backlog it would sit in ``pending`` while the worker ran the task.

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
_FULL = Push.FULL
_FIRST_KIND = int(Kind.FIRST)  # a plain int: an enum attribute per record costs ~0.1 us
_LAST_KIND = int(Kind.LAST)


class Outbox:
    """Producer end of one ring: owner only (one thread or one process at a time).

    Messages that wait in ``pending`` are numbered (``queued``: how many ever waited;
    ``left``: how many have left, pushed or withdrawn): a caller that kept the number
    ``send`` returned knows whether its message still waits (``waiting``) and may take
    it back (``withdraw``) — the driver's ``cancel()`` of a task still in its outbox."""

    __slots__ = ("ring", "doorbell", "pending", "limit", "sent", "push", "room",
                 "queued", "left", "withdrawn")

    def __init__(self, ring, doorbell, reserve: int = 0):
        self.ring = ring
        self.doorbell = doorbell
        self.pending: deque = deque()
        self.limit = ring.max_message - 1
        self.sent = 0
        self.queued = 0  # messages that ever waited in pending (a fragmented one counts once)
        self.left = 0  # ... of which have left it (pushed whole, or withdrawn)
        self.withdrawn: set[int] = set()  # id() of waiting messages to drop, not push
        self.push = ring.push
        self.room = None  # ring bytes ordinary messages may fill (None: all)
        if reserve:
            # At most a quarter of the ring is reserved: a record of the largest size then
            # still fits an empty ring with the reserve left free (no message waits forever).
            cap = ring.capacity
            self.room = room = cap - min(reserve, cap // 4)
            used, produced, ring_push = ring.used_bytes, ring.produced, ring.push

            def push(msg, _full=_FULL):
                # the bytes ring.push will take: 8 + len rounded up to 8, plus the end of
                # the data area it skips when the record does not fit there (a wrap)
                need = 15 + len(msg) & ~7
                pos = produced() & (cap - 1)
                if pos + need > cap:
                    need += cap - pos
                if used() + need > room:
                    return _full
                return ring_push(msg)

            self.push = push

    def send(self, msg: bytes, wake: bool = True) -> int:
        """Send ``msg``; its number in ``pending`` if it waits there, else 0."""
        self.sent += 1
        waits = 0
        if len(msg) > self.limit:
            waits = self._send_fragments(msg)
        elif self.pending or self.push(msg) is not _OK:
            self.pending.append(msg)
            self.queued = waits = self.queued + 1
            self.flush()
        if wake:
            self.doorbell.ring()
        return waits

    def send_urgent(self, msgs: list) -> bool:
        """Push small order-free messages into the ring now, ahead of ``pending``
        (the reserve keeps room for them), and ring the doorbell (a full fence): all of
        them, or none and False when the ring has no room (its consumer is stuck)."""
        ring = self.ring
        if not self.room_for(msgs):
            return False
        for m in msgs:
            if ring.push(m) is not _OK:  # pragma: no cover - the room was checked
                raise RuntimeError("urgent message did not fit its reserved room")
        self.sent += len(msgs)
        self.doorbell.ring()
        return True

    def room_for(self, msgs: list) -> bool:
        """Whether ``send_urgent(msgs)`` would fit now (only this producer fills the ring)."""
        ring = self.ring
        return ring.capacity - ring.used_bytes() >= sum(2 * len(m) + 32 for m in msgs)

    def send_many(self, msgs: list) -> int:
        """``send`` each of ``msgs`` in order, ringing the doorbell once (a batch of tasks).
        Returns how many of them (the last ones) wait in ``pending``: numbers
        ``queued - k + 1 .. queued``."""
        push, limit, pending = self.push, self.limit, self.pending
        self.sent += len(msgs)
        room = self.room
        if room is not None and not pending:
            # one room check for the whole batch, then the ring's own push (the hot path;
            # a message over ``limit`` is fragmented into pending below whatever push is)
            if self.ring.used_bytes() + 2 * sum(map(len, msgs)) + 32 * len(msgs) <= room:
                push = self.ring.push
        waiting = 0
        for msg in msgs:
            if len(msg) > limit:
                self._send_fragments(msg, flush=False)
                waiting += 1
            elif pending or push(msg) is not _OK:
                pending.append(msg)
                waiting += 1
        if waiting:
            self.queued += waiting
            self.flush()
        self.doorbell.ring()
        return waiting

    def _send_fragments(self, msg: bytes, flush: bool = True) -> int:
        step = self.limit
        view = memoryview(msg)
        n = len(msg)
        for start in range(0, n, step):
            tag = _LAST if start + step >= n else (_FIRST if start == 0 else _MORE)
            self.pending.append(tag + view[start:start + step])
        if not flush:
            return 0
        self.queued += 1
        self.flush()
        return self.queued

    def waiting(self, number: int) -> bool:
        """Whether the message ``send`` numbered ``number`` still waits in ``pending``."""
        return number > self.left

    def withdraw(self, msg: bytes) -> None:
        """Drop ``msg`` (waiting, whole, not fragmented) when its turn comes."""
        self.withdrawn.add(id(msg))

    def clear(self) -> None:
        """Drop everything waiting (its consumer died)."""
        self.left = self.queued
        self.pending.clear()
        self.withdrawn.clear()

    def flush(self) -> bool:
        """Push what waits (and wake the consumer if any went); True when nothing is left."""
        pending = self.pending
        push = self.push
        withdrawn = self.withdrawn
        pushed = False
        try:
            while pending:
                rec = pending[0]
                if withdrawn and id(rec) in withdrawn:
                    withdrawn.discard(id(rec))
                    pending.popleft()
                    self.left += 1
                    continue
                if push(rec) is not _OK:
                    return False
                pending.popleft()
                pushed = True
                kind = rec[0]
                if kind < _FIRST_KIND or kind == _LAST_KIND:
                    self.left += 1
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
