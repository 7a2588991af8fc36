"""Simple-cycle enumeration (examples/search_cycles.py) against networkx.simple_cycles:
random digraphs and networkx's bundled graphs, all cycles and bounded by length, through
backtracking.count on real workers, through the plain recursion, and through Johnson's
algorithm written in the example."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import networkx as nx
import pytest

import shoal

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "examples") not in sys.path:  # before any pilot starts: workers inherit sys.path
    sys.path.append(str(ROOT / "examples"))

import search_cycles as sc  # noqa: E402


def nx_count(g: nx.DiGraph, length_bound=None) -> int:
    return sum(1 for _ in nx.simple_cycles(g, length_bound=length_bound))


def random_graphs(count: int, seed: int):
    """(name, DiGraph) pairs: G(n, p) digraphs of 1..9 vertices, some with self-loops."""
    rng = random.Random(seed)
    for i in range(count):
        n, p = rng.randint(1, 9), rng.random()
        g = nx.gnp_random_graph(n, p, seed=rng.randrange(1 << 30), directed=True)
        if i % 3 == 0:
            g.add_edges_from((v, v) for v in list(g)[: i % 4])
        yield f"G({n},{p:.2f})#{i}", g


def bundled_graphs():
    """(name, DiGraph, length bound) from networkx's generators and bundled data."""
    yield "karate club, both directions", nx.karate_club_graph().to_directed(), 4
    yield "Florentine families, both directions", nx.florentine_families_graph().to_directed(), 5
    yield "complete digraph K6", nx.complete_graph(6, nx.DiGraph), None
    yield "directed cycle C7", nx.cycle_graph(7, nx.DiGraph), None
    yield "Petersen, both directions", nx.petersen_graph().to_directed(), 6
    yield "random tournament (no 2-cycles)", nx.tournament.random_tournament(8, seed=3), None
    yield "gn growing network (a DAG)", nx.gn_graph(30, seed=2), None


@pytest.fixture(scope="module")
def pilot2():
    with shoal.Pilot(workers=2) as p:
        yield p


def test_the_plain_recursion_and_johnson_count_what_networkx_counts():
    """Sequential, in this process: every bound from 0 up, and Johnson's blocking."""
    for name, g in random_graphs(25, seed=31):
        for bound in (None, 0, 1, 2, 3, 5):
            want = nx_count(g, bound)
            assert sc.count_sequential(sc.from_networkx(g, bound)) == want, (name, bound)
        assert sc.count_johnson(sc.from_networkx(g)) == nx_count(g), name


def test_the_plain_recursion_counts_what_networkx_counts_on_bundled_graphs():
    for name, g, bound in bundled_graphs():
        assert sc.count_sequential(sc.from_networkx(g, bound)) == nx_count(g, bound), name


def test_the_skeleton_counts_what_networkx_counts_on_two_workers(pilot2):
    """Two searches (each a pilot round trip): the disjoint union of the random graphs,
    all cycles, and of the bundled ones, cycles of at most 5 vertices; a union's cycles
    are its parts' (each graph alone: the heavy test below)."""
    randoms = nx.disjoint_union_all([g for _, g in random_graphs(6, 7)])
    bundled = nx.disjoint_union_all([g for _, g, _ in bundled_graphs()])
    for g, bound in ((randoms, None), (bundled, 5)):
        assert sc.count_cycles(pilot2, sc.from_networkx(g, bound)) == nx_count(g, bound)


def test_each_graph_alone_on_two_workers(pilot2):
    graphs = [(name, g, 4 if i % 2 else None) for i, (name, g) in enumerate(random_graphs(4, 7))]
    for name, g, bound in graphs + list(bundled_graphs()):
        got = sc.count_cycles(pilot2, sc.from_networkx(g, bound))
        assert got == nx_count(g, bound), (name, bound)


def test_a_graph_of_thousands_of_cycles_is_split_between_workers(pilot2):
    """Work is stolen below the start vertices: more than one task ran, the count holds."""
    g = nx.gnp_random_graph(10, 0.5, seed=4, directed=True)
    want = nx_count(g)
    got = sc.count_cycles(pilot2, sc.from_networkx(g), stats=True, spawn_depth=3)
    assert got == want and want > 1000
    assert got.stats.tasks > 1


def test_every_node_extends_to_a_cycle():
    """The reach set is Johnson-style blocking: no node is a dead end, so the search
    visits at most (cycles x vertices) paths -- each node lies on a counted cycle."""
    nxg = nx.gnp_random_graph(9, 0.3, seed=5, directed=True)
    g = sc.from_networkx(nxg)

    def check(node) -> int:
        kids = list(sc.children(g, node))
        below = sum(check(c) for c in kids) + (1 if sc.closes(node) else 0)
        if node is not sc.ROOT:
            assert below >= 1, node
        return below

    assert check(sc.ROOT) == nx_count(nxg)


def test_bad_inputs_are_refused_with_one_line_naming_them():
    with pytest.raises(ValueError, match="undirected"):
        sc.from_networkx(nx.cycle_graph(4))
    with pytest.raises(ValueError, match="length_bound must be None or an int >= 0, not -1"):
        sc.from_edges(range(3), [(0, 1)], -1)
    with pytest.raises(ValueError, match="length_bound .* not 2.5"):
        sc.from_edges(range(3), [(0, 1)], 2.5)
    with pytest.raises(ValueError, match=r"edge \(0, 7\) is not a pair of the given vertices"):
        sc.from_edges(range(3), [(0, 1), (0, 7)])
    with pytest.raises(ValueError, match="not distinct"):
        sc.from_edges([1, 1], [])
    with pytest.raises(ValueError, match="unsound under a length bound"):
        sc.count_johnson(sc.from_edges(range(3), [(0, 1), (1, 0)], 2))


def test_a_larger_random_digraph_on_two_workers(pilot2):
    """Tens of thousands of cycles, all and bounded (heavy: networkx takes seconds)."""
    g = nx.gnp_random_graph(12, 0.4, seed=8, directed=True)
    for bound in (None, 6):
        got = sc.count_cycles(pilot2, sc.from_networkx(g, bound), stats=True)
        assert got == nx_count(g, bound) and got.stats.tasks > 1
