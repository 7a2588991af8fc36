"""Scheduling policy: victim order, redirect-push placement, steal backoff."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.runtime.policy import Placement, victim_order

layouts = st.lists(st.integers(0, 3), min_size=1, max_size=24)


@given(layouts, st.data(), st.integers(0, 2**32))
def test_victim_order_is_permutation_same_node_first(node_of, data, seed):
    me = data.draw(st.integers(0, len(node_of) - 1))
    order = victim_order(me, node_of, random.Random(seed))
    assert sorted(order) == [w for w in range(len(node_of)) if w != me]
    distances = [abs(node_of[w] - node_of[me]) for w in order]
    assert distances == sorted(distances)  # same node (0) first, then nearer nodes
    keys = [(abs(node_of[w] - node_of[me]), node_of[w]) for w in order]
    assert keys == sorted(keys)  # equal distance: lower node id first, nodes contiguous


@given(layouts, st.integers(0, 2**32))
def test_victim_order_reproducible(node_of, seed):
    a = victim_order(0, node_of, random.Random(seed))
    assert a == victim_order(0, node_of, random.Random(seed))


def test_victim_order_varies_with_seed():
    node_of = [0] * 8 + [1] * 8
    orders = {tuple(victim_order(0, node_of, random.Random(seed))) for seed in range(20)}
    assert len(orders) > 1
    for order in orders:
        assert set(order[:7]) == set(range(1, 8))


def test_victim_order_examples():
    assert victim_order(0, [0], random.Random(0)) == []
    # me=2 sits on node 1 alone; nodes 0 and 2 are both at distance 1 (lower id first).
    order = victim_order(2, [0, 0, 1, 2, 3], random.Random(0))
    assert sorted(order[:2]) == [0, 1] and order[2:] == [3, 4]
    order = victim_order(0, [1, 0, 1, 2], random.Random(0))
    assert order == [2, 1, 3]
    with pytest.raises(ValueError):
        victim_order(5, [0, 0], random.Random(0))


def _burst(p, count, preferred=None):
    chosen = []
    for _ in range(count):
        w = p.choose(preferred)
        p.submitted(w)
        chosen.append(w)
    return chosen


@given(layouts, st.integers(0, 200), st.integers(0, 2**32))
def test_burst_spreads_evenly(node_of, count, seed):
    p = Placement(node_of, random.Random(seed))
    _burst(p, count)
    loads = [p.load(w) for w in range(len(node_of))]
    assert sum(loads) == count
    assert max(loads) - min(loads) <= 1


def test_ties_round_robin_without_submitted_events():
    p = Placement([0, 0, 0, 1], random.Random(0))
    picks = [p.choose(0) for _ in range(6)]
    assert sorted(picks[:3]) == [0, 1, 2] and picks[3:] == picks[:3]


def test_respects_preferred_node():
    p = Placement([0, 0, 1, 1], random.Random(0))
    assert set(_burst(p, 6, preferred=1)) == {2, 3}  # within threshold 2: no redirect
    assert [p.load(w) for w in range(4)] == [0, 0, 3, 3]


def test_redirects_when_preferred_node_overloaded():
    p = Placement([0, 0, 1, 1], random.Random(0), redirect_threshold=2)
    _burst(p, 6, preferred=1)
    w = p.choose(1)  # node 1 min load 3 exceeds global min 0 by 3 > 2
    assert w in (0, 1)
    p.finished(2)
    p.finished(3)
    assert p.choose(1) in (2, 3)  # back within threshold


@given(st.integers(0, 3), st.integers(0, 2**32), st.lists(st.integers(0, 1), max_size=200))
def test_preferred_node_bounded_imbalance(threshold, seed, prefs):
    p = Placement([0, 0, 1, 1, 1], random.Random(seed), redirect_threshold=threshold)
    for pref in prefs:
        w = p.choose(pref)
        node_min = min(p.load(x) for x in range(5) if p.node_of(x) == pref)
        global_min = min(p.load(x) for x in range(5))
        if node_min - global_min <= threshold:
            assert p.node_of(w) == pref and p.load(w) == node_min
        else:
            assert p.load(w) == global_min
        p.submitted(w)


def test_preferred_none_uses_least_loaded_node_per_worker():
    p = Placement([0, 1, 1, 1], random.Random(0))
    p.submitted(0)
    p.submitted(1)
    assert p.node_of(p.choose()) == 1  # node 0: 1/1 per worker, node 1: 1/3


def test_remove_and_add():
    p = Placement([0, 0, 1], random.Random(0))
    p.submitted(0)
    p.remove(1)
    assert _burst(p, 2, preferred=0) == [0, 0]  # node 0 has only worker 0 left
    assert p.choose(0) == 2  # load 3 exceeds the global min 0 by > 2: redirected
    with pytest.raises(ValueError):
        p.load(1)
    with pytest.raises(ValueError):
        p.submitted(1)
    p.add(1)
    assert p.load(1) == 0 and p.node_of(1) == 0
    assert p.choose(0) == 1
    p.add(3, node=1)
    assert p.node_of(3) == 1 and p.load(3) == 0
    with pytest.raises(ValueError):
        p.add(3)  # already live
    with pytest.raises(ValueError):
        p.add(7)  # new index needs a node
    for w in range(4):
        p.remove(w)
    with pytest.raises(LookupError):
        p.choose()


def test_removed_node_redirects_globally():
    p = Placement([0, 1], random.Random(0))
    p.remove(1)
    assert p.choose(1) == 0
    with pytest.raises(ValueError):
        p.choose(9)


def test_finished_without_load_is_an_error():
    p = Placement([0], random.Random(0))
    with pytest.raises(ValueError):
        p.finished(0)


@settings(max_examples=200)
@given(
    st.lists(st.tuples(st.sampled_from("sfrac"), st.integers(0, 5), st.integers(0, 2),
                       st.sampled_from([1, 1, 2, 7]))),
    st.integers(0, 2**32),
    st.sampled_from([[0, 0, 1, 1, 2, 2], [0] * 6]),
)
def test_placement_model(ops, seed, node_of):
    """Random event sequences (single and bulk load changes: a batch of tasks pushed or
    settled at once) against a plain-dict model of the loads."""
    p = Placement(node_of, random.Random(seed))
    loads: dict[int, int] = dict.fromkeys(range(6), 0)
    for op, w, node, n in ops:
        if op == "s" and w in loads:
            p.submitted(w, n)
            loads[w] += n
        elif op == "f" and loads.get(w):
            n = min(n, loads[w])
            p.finished(w, n)
            loads[w] -= n
        elif op == "r" and w in loads:
            p.remove(w)
            del loads[w]
        elif op == "a" and w not in loads:
            p.add(w)
            loads[w] = 0
        elif op == "c" and loads:
            node %= max(node_of) + 1
            chosen = p.choose(node)
            live = [x for x in loads if node_of[x] == node]
            gmin = min(loads.values())
            if live and min(loads[x] for x in live) - gmin <= p.redirect_threshold:
                assert node_of[chosen] == node
                assert loads[chosen] == min(loads[x] for x in live)
            else:
                assert loads[chosen] == gmin
        for x, load in loads.items():
            assert p.load(x) == load
        assert p.min_load() == (min(loads.values()) if loads else 0)


def test_placement_single_node_fast_path_survives_a_second_node():
    """One node: node buckets are not kept (hot path); a worker on a new node rebuilds them."""
    import random

    from shoal.runtime.policy import Placement

    p = Placement([0, 0], random.Random(1))
    for _ in range(3):
        p.submitted(p.choose())
    p.add(2, node=1)
    assert sorted(p.load(w) for w in range(3)) == [0, 1, 2]
    assert p.choose(preferred_node=1) == 2
    assert p.choose() == 2  # node 1 is the least loaded per worker
    p.remove(0)
    p.finished(1) if p.load(1) else None
    assert p.choose(preferred_node=0) == 1
