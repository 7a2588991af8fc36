"""Hypothesis stateful test: a Ring against a deque model (small capacity, many wraps).

The producer and consumer sides may use different implementations (pure and
native) over the same memory, which also checks that their layouts agree.
"""
from __future__ import annotations

from collections import deque

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from shoal.queues import EMPTY, Push, Ring, Segment, _impl

CAP = 4096
MAX = CAP // 4


def _need(n: int) -> int:
    return 8 + ((n + 7) & ~7)


class RingModel(RuleBasedStateMachine):
    producer_native = False
    consumer_native = False

    @initialize()
    def setup(self):
        self.seg = Segment.create(Ring.footprint(CAP))
        self.prod = Ring.initialise(self.seg.buf, 0, CAP, native=self.producer_native)
        self.cons = Ring(self.seg.buf, 0, CAP, native=self.consumer_native)
        self.model: deque[tuple[bytes, int]] = deque()  # (payload, bytes it took incl. wrap waste)
        self.head = 0
        self.tail = 0
        self.count = 0
        self.wraps = 0

    def teardown(self):
        if hasattr(self, "seg"):
            self.prod.close()
            self.cons.close()
            self.seg.close()

    def _fits(self, n: int) -> tuple[bool, int]:
        need = _need(n)
        pos = self.tail % CAP
        free = CAP - (self.tail - self.head)
        total = need + (CAP - pos if pos + need > CAP else 0)
        return total <= free, total

    @rule(size=st.one_of(st.integers(0, 64), st.integers(0, MAX)))
    def push(self, size):
        self.count += 1
        payload = (self.count.to_bytes(4, "little") * (size // 4 + 1))[:size]
        fits, total = self._fits(size)
        result = self.prod.push(payload)
        if fits:
            assert result is Push.OK
            if total != _need(size):
                self.wraps += 1
            self.model.append((payload, total))
            self.tail += total
        else:
            assert result is Push.FULL, "FULL only when the record really does not fit"
            assert self.model, "an empty ring always takes max_message"

    @rule(size=st.integers(MAX + 1, MAX + 64))
    def push_oversize(self, size):
        with pytest.raises(ValueError, match=f"{size} bytes"):
            self.prod.push(bytes(size))

    @rule()
    def pop(self):
        got = self.cons.pop()
        if not self.model:
            assert got is EMPTY
        else:
            payload, total = self.model.popleft()
            assert got == payload
            self.head += total

    @precondition(lambda self: self.model)
    @rule(max_n=st.integers(0, 70))
    def pop_many(self, max_n):
        got = self.cons.pop_many(max_n)
        expect = [self.model.popleft() for _ in range(min(max_n, len(self.model)))]
        assert got == [p for p, _ in expect]
        self.head += sum(t for _, t in expect)

    @invariant()
    def counters_agree(self):
        if not hasattr(self, "seg"):
            return
        assert self.prod.used_bytes() == self.cons.used_bytes() == self.tail - self.head
        assert self.cons.readable() == bool(self.model)
        buf = self.seg.buf
        assert int.from_bytes(buf[0:8], "little") == self.head
        assert int.from_bytes(buf[64:72], "little") == self.tail


_SETTINGS = settings(
    max_examples=60,
    stateful_step_count=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _case(producer: bool, consumer: bool):
    cls = type(
        f"Model_{'native' if producer else 'pure'}_{'native' if consumer else 'pure'}",
        (RingModel,),
        {"producer_native": producer, "consumer_native": consumer},
    )
    return _SETTINGS(cls).TestCase


native_ok = pytest.mark.skipif(not _impl.NATIVE_AVAILABLE, reason="shoal.queues._native not built")

TestPurePure = _case(False, False)
TestNativeNative = native_ok(_case(True, True))
TestPureProducerNativeConsumer = native_ok(_case(False, True))
TestNativeProducerPureConsumer = native_ok(_case(True, False))
