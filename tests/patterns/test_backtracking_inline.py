"""backtracking.count inlines an ``accept`` that is one ``return <expression>`` over its
own parameters (shapes.inlined): which functions qualify, that the inlined expression
counts and evaluates exactly what the call did, and that its errors are the function's
own (true path, the function's frame)."""

from __future__ import annotations

import functools
import importlib
import sys
import traceback

import numpy as np
import pytest

import shoal
from shoal.patterns import SearchError, backtracking
from shoal.patterns.search import control as C
from shoal.patterns.search import engine as E
from shoal.patterns.search import model as M
from shoal.patterns.search import shapes
from shoal.workloads.nqueens import OEIS_A000170

LIMIT = 3


pytestmark = pytest.mark.usefixtures("both_count_loops")  # (tests/conftest.py)


def is_solution(n, node):
    return node[0] == n


def documented(n, node):
    """A docstring does not stop it."""
    return node[0] == n and not node[1] & 1


def calls_len(n, node):
    return len(node) == n


def reads_global(node):
    return node[0] == LIMIT


def has_default(node, n=3):
    return node[0] == n


def two_statements(n, node):
    k = node[0]
    return k == n


def five(a, b, c, d, node):
    return node[0] == a + b + c + d


def six(a, b, c, d, e, node):
    return node[0] == a + b + c + d + e


def identity(f):
    return f


@identity
def decorated(n, node):
    return node[0] == n


def keyword_only(node, *, n):
    return node[0] == n


def _closure():
    m = 3

    def inner(node):
        return node[0] == m
    return inner


@pytest.mark.parametrize("fn, want", [
    (functools.partial(is_solution, 8), "(child[0] == accept_a0)"),
    (functools.partial(documented, 8), "(child[0] == accept_a0 and (not child[1] & 1))"),
    (functools.partial(calls_len, 8), None),  # a call: len may be anything there
    (reads_global, None),  # a global can change while the search runs
    (has_default, None),
    (functools.partial(two_statements, 8), None),
    (functools.partial(decorated, 8), None),
    (functools.partial(keyword_only, n=3), None),
    (lambda node: node[0] == 3, None),
    (_closure(), None),
    (functools.partial(is_solution, 8, (1, 0, 0, 0)), None),  # takes no child: not an accept
    (len, None),
    (functools.partial(five, 1, 2, 3, 4), "(child[0] == accept_a0 + accept_a1 + accept_a2 + accept_a3)"),
    # five bound arguments: _call calls the partial itself, so the loop has no names for them
    (functools.partial(six, 1, 2, 3, 4, 5), None),
])
def test_which_accepts_are_inlined(fn, want):
    assert shapes.inlined(fn, "accept") == want


def test_a_function_whose_file_changed_is_not_inlined(tmp_path, monkeypatch):
    """The source must compile to the function's own bytecode: an edited file (or one
    made at run time, with no file) is never inlined from the wrong text."""
    (tmp_path / "acc_mod.py").write_text("def acc(n, node):\n    return node[0] == n\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("acc_mod")
    try:
        assert shapes.inlined(functools.partial(mod.acc, 4), "accept") == "(child[0] == accept_a0)"
        shapes._INLINED.clear()
        (tmp_path / "acc_mod.py").write_text("def acc(n, node):\n    return node[0] != n\n")
        assert shapes.inlined(functools.partial(mod.acc, 4), "accept") is None
        ns: dict = {}
        exec("def made(n, node):\n    return node[0] == n\n", ns)
        assert shapes.inlined(functools.partial(ns["made"], 4), "accept") is None
    finally:
        sys.modules.pop("acc_mod", None)
        shapes._INLINED.clear()


def tree(path):  # an irregular tree: a node's children by its path
    k = 3 if len(path) < 2 else (len(path) + sum(path)) % 4
    return [] if len(path) >= 6 else [path + (i,) for i in range(k)]


class Node:
    """A node whose reads are counted: the inlined expression must read what the call reads."""

    __slots__ = ("path",)
    reads = 0

    def __init__(self, path):
        self.path = path

    @property
    def last(self):
        Node.reads += 1
        if self.path == (1, 0, 2, 1):
            raise ValueError("bad node")
        return self.path[-1] if self.path else -1


def gen_children(node):
    for p in tree(node.path):
        yield Node(p)


def odd_last(node):
    return node.last % 2 == 1


def safe_odd(node):
    return node.path[-1:] == (1,)


def _count(accept, monkeypatch, inline: bool):
    monkeypatch.setattr(shapes, "INLINE", inline)
    spec = M.SearchSpec(root=Node(()), children=gen_children, goal=M.Goal.COUNT, control=None,
                        accept=accept)
    ex = E.Explorer(spec, (), np.zeros((2, C.CONTROL_COLUMNS), dtype=np.int64), 0, split=False)
    ex.dfs(spec.root)
    return ex.tally.count, ex.tally.nodes


def _all(path=()):
    yield path
    for p in tree(path):
        yield from _all(p)


def test_inlined_accept_counts_and_reads_as_the_call(monkeypatch):
    want = sum(1 for p in _all() if p[-1:] == (1,))
    seen = []
    orig = shapes.inlined
    monkeypatch.setattr(shapes, "inlined", lambda fn, name: seen.append(orig(fn, name)) or seen[-1])
    assert _count(safe_odd, monkeypatch, True) == (want, sum(1 for _ in _all()))
    assert seen and seen[-1] == "(child.path[-1:] == (1,))"
    assert _count(safe_odd, monkeypatch, False) == (want, sum(1 for _ in _all()))


def test_inlined_accept_error_is_the_functions_own(monkeypatch):
    """The inlined expression raises at node (1, 0, 2, 1): the loop calls the function, whose
    error names the true path and carries the function's frame; the reads before the
    error are those of the plain call, plus that one call."""
    assert shapes.inlined(odd_last, "accept") == "(child.last % 2 == 1)"
    got = {}
    for inline in (True, False):
        Node.reads = 0
        with pytest.raises(SearchError, match=r"accept\(\) raised ValueError\('bad node'\) at "
                                              r"node path \(1, 0, 2, 1\)") as err:
            _count(odd_last, monkeypatch, inline)
        cause = err.value.__cause__
        frames = [f.name for f in traceback.extract_tb(cause.__traceback__)]
        assert "odd_last" in frames and frames[-1] == "last"
        got[inline] = Node.reads
    assert got[True] == got[False] + 1  # the failed inline read, then the call's


def test_nqueens_on_a_pilot_with_the_inlined_accept():
    """The example's model (accept inlined) on real workers, splitting: OEIS counts."""
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "examples"))
    import search_nqueens as nq

    assert shapes.inlined(functools.partial(nq.is_solution, 9), "accept") is not None
    with shoal.Pilot(workers=2) as pilot:
        for n in (6, 9):
            got = backtracking.count(pilot, nq.ROOT, functools.partial(nq.children, n),
                                     accept=functools.partial(nq.is_solution, n), stats=True)
            assert got == OEIS_A000170[n]


@pytest.mark.parametrize("bad", [(0,), (0, 1), (1, 0, 2), (1, 0, 2, 1), (1, 2, 0, 0, 1)])
@pytest.mark.parametrize("who", ["accept", "children"])
@pytest.mark.parametrize("inline", [True, False])
def test_errors_name_the_true_path_at_every_depth(monkeypatch, bad, who, inline):
    """An error at a node of any depth, raised by accept (inlined or called) or while
    listing its children, names that node's path."""
    monkeypatch.setattr(shapes, "INLINE", inline)

    class Bad(Node):
        __slots__ = ()

        @property
        def last(self):
            if who == "accept" and self.path == bad:
                raise ValueError("bad node")
            return self.path[-1] if self.path else -1

    def kids(node):
        if who == "children" and node.path == bad:
            raise ValueError("bad node")
        for p in tree(node.path):
            yield Bad(p)

    spec = M.SearchSpec(root=Bad(()), children=kids, goal=M.Goal.COUNT, control=None,
                        accept=odd_last)
    ex = E.Explorer(spec, (), np.zeros((2, C.CONTROL_COLUMNS), dtype=np.int64), 0, split=False)
    path = ", ".join(map(str, bad)) + ("," if len(bad) == 1 else "")
    with pytest.raises(SearchError, match=rf"{who}\(\) raised ValueError\('bad node'\) at "
                                          rf"node path \({path}\)"):
        ex.dfs(spec.root)


def _inline_flag() -> bool:
    return shapes.INLINE


def test_workers_inherit_the_switch_that_turns_inlining_off(monkeypatch):
    """SHOAL_SEARCH_INLINE=0 (bench_search.py --no-inline) reaches the workers, which start
    with the driver's environment; the count is the same either way."""
    monkeypatch.setenv("SHOAL_SEARCH_INLINE", "0")
    with shoal.Pilot(workers=1) as pilot:
        assert pilot.submit(_inline_flag).result() is False
        got = backtracking.count(pilot, Node(()), gen_children, accept=safe_odd)
    assert got == sum(1 for p in _all() if p[-1:] == (1,))
