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
