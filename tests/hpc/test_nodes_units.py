"""A multi-node allocation's nodes and node-aware reservation (shoal/patterns/ensemble/nodes.py),
pure; default suite.  The end-to-end runs over several hosts are tests/hpc/test_multihost.py."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shoal.patterns.ensemble import nodes
from shoal.patterns.ensemble.nodes import NodeSpec


@pytest.mark.parametrize("text, counts", [("2(x3),1", [2, 2, 2, 1]), ("16", [16]), ("4,8", [4, 8]),
                                          ("1(x2)", [1, 1])])
def test_expand_counts(text, counts):
    assert nodes.expand_counts(text) == counts


@pytest.mark.parametrize("text", ["2(x", "x3", "2(3)", "a"])
def test_expand_counts_refuses_malformed(text):
    with pytest.raises(ValueError, match="malformed SLURM CPU count list"):
        nodes.expand_counts(text)


def test_slurm_nodes_from_a_job_environment():
    env = {"SLURM_JOB_NODELIST": "h[1-3],h5", "SLURM_JOB_CPUS_PER_NODE": "2(x3),1",
           "SLURM_MEM_PER_NODE": "1024"}
    got = nodes.slurm_nodes(env)
    assert [(n.name, n.cores) for n in got] == [("h1", 2), ("h2", 2), ("h3", 2), ("h5", 1)]
    assert all(n.memory == 1 << 30 for n in got)
    one = nodes.slurm_nodes({"SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_JOB_CPUS_PER_NODE": "8"})
    assert [(n.name, n.cores) for n in one] == [("gpu01", 8), ("gpu02", 8)]
    assert nodes.slurm_nodes({}) == ()
    with pytest.raises(ValueError, match="names 3 nodes but SLURM_JOB_CPUS_PER_NODE gives 2"):
        nodes.slurm_nodes({"SLURM_JOB_NODELIST": "h[1-3]", "SLURM_JOB_CPUS_PER_NODE": "2,2"})


def test_pbs_nodes_count_each_hosts_slot_lines(tmp_path):
    f = tmp_path / "nodefile"
    f.write_text("n1\nn1\nn2\nn1\nn3\nn3\n")
    assert nodes.pbs_nodes(f.read_text()) == (NodeSpec("n1", 3), NodeSpec("n2", 1), NodeSpec("n3", 2))


NODES = (NodeSpec("h1", 4, 8 << 30), NodeSpec("h2", 8, 4 << 30), NodeSpec("h3", 2, 16 << 30))


def test_a_task_no_node_can_hold_is_refused_naming_it_and_the_largest_node():
    assert nodes.refusal("p.s.t", 8, 0, NODES) is None
    assert nodes.refusal("p.s.t", 9, 0, NODES) == ("task p.s.t asks for 9 cores but the largest "
                                                   "node, h2, has 8 cores and 4G")
    # 6 cores fit h2, 8G fits h1 and h3, no node has both
    why = nodes.refusal("p.s.t", 6, 8 << 30, NODES)
    assert "asks for 6 cores and 8G but no node has both" in why and "h2" in why
    assert nodes.refusal("p.s.t", 2, 16 << 30, NODES) is None  # h3


def test_mpi_ranks_may_spread_but_a_rank_may_not():
    assert nodes.refusal("m", 1, 0, NODES, ranks=7, cores_per_rank=2) is None  # 2 + 4 + 1 ranks
    why = nodes.refusal("m", 1, 0, NODES, ranks=8, cores_per_rank=2)
    assert "asks for 8 ranks of 2 cores but the 3 nodes hold 7 such ranks" in why
    assert "9 cores per rank but the largest node, h2" in nodes.refusal("m", 1, 0, NODES, ranks=1,
                                                                        cores_per_rank=9)


def test_place_is_best_fit():
    free = {"a": [0, 1, 2, 3], "b": [4, 5], "c": [6, 7, 8]}
    assert nodes.place(2, free) == ("b", (4, 5))
    assert nodes.place(3, free) == ("c", (6, 7, 8))
    assert nodes.place(5, free) is None


free_st = st.dictionaries(st.sampled_from(["h1", "h2", "h3", "h4"]),
                          st.integers(0, 8), min_size=1).map(
    lambda d: {h: list(range(i * 100, i * 100 + n)) for i, (h, n) in enumerate(sorted(d.items()))})


@given(free_st, st.integers(1, 12), st.integers(1, 4))
def test_place_ranks_never_gives_a_core_twice_and_uses_only_free_ones(free, ranks, cpr):
    p = nodes.place_ranks(ranks, cpr, free)
    room = sum(len(c) // cpr for c in free.values())
    if p is None:
        assert room < ranks
        return
    per_rank = p.rank_cpus()
    flat = [c for r in per_rank for c in r]
    assert len(per_rank) == ranks and len(flat) == len(set(flat)) == ranks * cpr
    owner = {c: h for h, cpus in free.items() for c in cpus}
    for r in per_rank:  # every rank's cores are free cores of one node
        assert len({owner[c] for c in r}) == 1
    if any(len(c) >= ranks * cpr for c in free.values()):
        assert len(p.hosts) == 1  # one node when one has room
