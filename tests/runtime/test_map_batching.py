"""``Pilot.map``'s adaptive batch size: the pure policy (``mapping.batch_size`` and
``mapping.batch_cap``), then real pilots: results right and in order for tiny items
and for items of about a millisecond, and every batch small enough to travel as one
ring record (fragmented batches made 10^6 tiny items and 2 KB strings up to 2x slower;
``benchmarks/run.py --only map_defaults`` measures it)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import shoal
from shoal.backends.local.backend import MAP_RECORD_SHARE
from shoal.runtime import mapping
from shoal.runtime.mapping import FIRST_BATCH, MAX_BATCH, TARGET_S, batch_cap, batch_size

BIG = 1 << 40  # a byte budget that never binds


# --- the policy ------------------------------------------------------------------


def test_first_batches_hold_first_batch_items_until_a_duration_is_measured():
    assert batch_size(None, None, MAX_BATCH, BIG) == FIRST_BATCH
    assert batch_size(None, None, 10, BIG) == 10  # a short input's cap still wins


def test_a_batch_lasts_about_the_target_at_the_measured_rate():
    assert batch_size(1e-3, 8.0, MAX_BATCH, BIG) == round(TARGET_S / 1e-3)  # 1 ms items: 5
    assert batch_size(10.0, 8.0, MAX_BATCH, BIG) == 1  # slower than the target: one item
    assert batch_size(5e-8, 5.0, MAX_BATCH, BIG) == MAX_BATCH  # tiny items: the cap
    assert batch_size(5e-8, 5.0, 1250, BIG) == 1250  # 10^4 items on 2 workers: ceil(n / 8)


def test_a_batch_stays_within_its_byte_budget():
    record = 128 << 10
    assert batch_size(5e-8, 5.0, MAX_BATCH, record) == record // 5  # tiny ints
    assert batch_size(5e-8, 2000.0, MAX_BATCH, record) == record // 2000  # 2 KB strings
    assert batch_size(None, 2000.0, MAX_BATCH, record) == record // 2000  # before any duration
    assert batch_size(5e-8, float(record * 4), MAX_BATCH, record) == 1  # one huge item still goes


def test_the_cap_is_four_batches_per_worker_when_the_length_is_known():
    assert batch_cap(None, 2) == MAX_BATCH
    assert batch_cap(10_000, 2) == 1250
    assert batch_cap(10_001, 2) == 1251
    assert batch_cap(3, 8) == 1
    assert batch_cap(10**9, 2) == MAX_BATCH


rates = st.one_of(st.none(), st.floats(1e-12, 1e3))
sizes = st.one_of(st.none(), st.floats(0.5, 1e9))


@given(rates, sizes, st.integers(1, MAX_BATCH), st.integers(1, 1 << 30))
def test_a_batch_holds_one_item_to_cap(per_item, item_bytes, cap, budget):
    size = batch_size(per_item, item_bytes, cap, budget)
    assert 1 <= size <= cap
    if item_bytes and size > 1:
        assert size * item_bytes <= budget


@given(st.floats(1e-12, 1e3), st.floats(1e-12, 1e3), st.floats(0.5, 1e6), st.integers(1, MAX_BATCH))
def test_slower_or_bigger_items_never_get_bigger_batches(a, b, item_bytes, cap):
    slow, fast = max(a, b), min(a, b)
    assert batch_size(slow, item_bytes, cap, 1 << 20) <= batch_size(fast, item_bytes, cap, 1 << 20)
    assert batch_size(fast, item_bytes * 2, cap, 1 << 20) <= batch_size(fast, item_bytes, cap, 1 << 20)


# --- real pilots -----------------------------------------------------------------


def inc(x):
    return x + 1


def spin_inc(x, steps=20_000):
    """About a millisecond of CPU (a spin, not a sleep), then ``x + 1``."""
    s = 0
    for i in range(steps):
        s += i
    return x + 1


def _spy_batches(pilot) -> list:
    """Record the pickled size of every map batch the pilot's backend submits (the
    submission itself is the backend's own)."""
    backend = pilot._backend
    seen = []
    submit = backend.submit

    def recording_submit(fn, args=(), kwargs=None, *rest, **kw):
        if args and isinstance(args[0], mapping.Batch):
            seen.append((args[0].n, len(args[0].blob)))
        return submit(fn, args, kwargs, *rest, **kw)

    backend.submit = recording_submit
    return seen


@pytest.mark.parametrize("fn, n", [(inc, 300_000), (spin_inc, 300)], ids=["tiny", "about-1ms"])
def test_map_default_results_are_right_and_ordered(fn, n):
    with shoal.Pilot(2) as pilot:
        seen = _spy_batches(pilot)
        assert list(pilot.map(fn, range(n))) == list(range(1, n + 1))
        assert sorted(pilot.map(fn, range(n), ordered=False)) == list(range(1, n + 1))
        assert sum(k for k, _ in seen) == 2 * n  # every item in exactly one batch
        if fn is inc:
            assert max(k for k, _ in seen) > FIRST_BATCH  # the batches grew once timed


def first_byte(b: bytes) -> int:
    return b[0]


@pytest.mark.parametrize("fn, items", [(inc, range(1_000_000)),
                                       (first_byte, [bytes([i % 251]) * 2000 for i in range(5000)])],
                         ids=["10^6 ints", "2 KB strings"])
def test_every_batch_travels_as_one_ring_record(fn, items):
    """Before: 10^6 ints went in batches of 65,536 (330 KB pickled) and 2 KB strings in
    batches of 128, then 625 (1.25 MB): over the ring's 256 KiB record limit, cut into
    fragments and reassembled on the worker.  Batches cut to fit keep the input's order."""
    with shoal.Pilot(2) as pilot:
        limit = pilot._backend.matrix.ring(0, 1).max_message // MAP_RECORD_SHARE
        seen = _spy_batches(pilot)
        assert list(pilot.map(fn, items)) == list(map(fn, items))
        assert seen and max(b for _, b in seen) <= limit, max(seen, key=lambda s: s[1])
        assert sum(k for k, _ in seen) == len(items)
