"""Mailboxes over a real ring: whole messages in order, whatever mix of small, fragmented
(larger than a ring record) and batched (``send_many``) sends, and a ring that fills."""

from __future__ import annotations

import random

import pytest

from shoal.queues import RingMatrix
from shoal.runtime.mailbox import Inbox, Outbox


@pytest.mark.parametrize("native", [None, False])
def test_messages_arrive_whole_and_in_order(native):
    rng = random.Random(5)
    with RingMatrix(2, 1 << 14, 1 << 12, native=native) as m:
        out = Outbox(m.ring(0, 1), m.doorbell(1))
        box = Inbox(m.ring(0, 1))
        sent, got = [], []
        for i in range(400):
            size = rng.choice([1, 20, 200, out.limit, out.limit + 1, 3 * out.limit + 7])
            msgs = [bytes([1 + (i % 200)]) + rng.randbytes(size) for _ in range(rng.randint(1, 4))]
            if rng.random() < 0.5:
                out.send_many(msgs)
            else:
                for msg in msgs:
                    out.send(msg)
            sent += msgs
            if rng.random() < 0.3:  # the consumer lags: the ring fills, the outbox holds the rest
                got += box.receive(rng.randint(1, 64))
            out.flush()
        while len(got) < len(sent):
            out.flush()
            got += box.receive(256)
        assert got == sent
        assert out.sent == len(sent)


@pytest.mark.parametrize("native", [None, False])
def test_a_reserved_outbox_lets_urgent_messages_jump_and_takes_back_waiting_ones(native):
    """The driver's cancel path (issue 13): ordinary sends leave the reserve free, so an
    urgent message gets into a ring a lagging consumer has filled, ahead of the backlog;
    a message still waiting can be withdrawn (never delivered) by its number; whole and
    fragmented messages still arrive in order, and the ring's marks say what was read."""
    rng = random.Random(11)
    with RingMatrix(2, 1 << 14, 1 << 12, native=native) as m:
        ring = m.ring(0, 1)
        out = Outbox(ring, m.doorbell(1), reserve=ring.capacity // 4)
        box = Inbox(m.ring(0, 1))
        msgs = [bytes([1]) + rng.randbytes(rng.choice([10, 100, 500, out.limit + 9])) for _ in range(120)]
        numbers = [out.send(msg) for msg in msgs]
        assert out.pending and ring.used_bytes() <= out.room, "the backlog must leave the reserve free"
        waiting = [i for i, n in enumerate(numbers) if n and out.waiting(n)]
        assert waiting
        gone = [i for i in waiting[1::3] if len(msgs[i]) <= out.limit]
        for i in gone:
            out.withdraw(msgs[i])
        urgent = [bytes([2, j]) for j in range(20)]
        assert out.send_urgent(urgent)
        mark = ring.produced()
        assert not ring.reached(mark)
        got = []
        while not ring.reached(mark):
            got += box.receive(7)
        assert urgent[-1] in got, "an urgent message waited behind the backlog"
        while out.pending or ring.readable():
            out.flush()
            got += box.receive(64)
        assert [g for g in got if g[0] == 2] == urgent
        assert [g for g in got if g[0] == 1] == [msg for i, msg in enumerate(msgs) if i not in gone]
        assert all(not out.waiting(n) for n in numbers if n)
        assert ring.consumed() == ring.produced()
