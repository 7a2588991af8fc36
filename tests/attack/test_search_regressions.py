"""Regression tests for search-skeleton findings (F4, F6-F9: checkpoints, progress line, chunked
searches, docs that contradicted behaviour), and for nodes of a class of the driver's ``__main__`` in chunked searches (found while fixing F4).

Each test failed before its fix (F8's and F9's pin behaviour that was already right: F8 was
a docstring that said otherwise, F9 did not reproduce at f328666).
Real pilots with real worker processes throughout; a real pseudo-terminal for the line.
"""

from __future__ import annotations

import io
import math
import os
import subprocess
import sys
import textwrap

import pytest

import shoal
from shoal.patterns import SearchError, backtracking, branch_and_bound
from shoal.runtime.progress import BOARD

COORDINATIONS = ["sequential", "depth-bounded", "budget", "stack-stealing", "indexed"]


@pytest.fixture(scope="module")
def pilot2():
    with shoal.Pilot(workers=2) as p:
        yield p


def _kids(node):  # the binary tree of depth 6: 127 nodes, 64 leaves
    return [node + (i,) for i in range(2)] if len(node) < 6 else []


def _kids_late(node):  # fails at one leaf's parent, after most of the tree
    if node == (1, 1, 1, 1, 1):
        raise ValueError("late boom")
    return _kids(node)


def _leaf_sum(node):  # an optimum 0 at (0,) * 6; inner nodes are no solution
    return sum(node) if len(node) == 6 else 99


def _sum(node):
    return sum(node)


# --- F9: solutions() takes what count() takes ----------------------------------------------

def test_solutions_takes_a_local_lambda_as_count_does(pilot2):
    accept = lambda n: len(n) == 6  # noqa: E731  (a local object: plain pickle refuses it)
    assert backtracking.count(pilot2, (), _kids, accept=accept) == 64
    got = sorted(backtracking.solutions(pilot2, (), _kids, accept, chunk_nodes=5))
    assert got == sorted(n for n in _all(()) if len(n) == 6)
    kids = lambda n: _kids(n)  # noqa: E731
    assert len(list(backtracking.solutions(pilot2, (), kids, accept, window=1, chunk_nodes=3))) == 64


def _all(node):
    yield node
    for k in _kids(node):
        yield from _all(k)


# --- F4's fix: units travel as bytes; a __main__ class must still reach the workers ---------

_MAIN_NODES = textwrap.dedent("""
    import os, sys, tempfile
    from dataclasses import dataclass
    import shoal
    from shoal.patterns import backtracking, branch_and_bound

    @dataclass(frozen=True)
    class Node:  # a class of __main__: workers cannot import it, it must travel by value
        path: tuple

    def kids(n):
        return [Node(n.path + (i,)) for i in range(3)] if len(n.path) < 5 else []

    d = tempfile.mkdtemp()
    with shoal.Pilot(2) as p:
        got = list(backtracking.solutions(p, Node(()), kids, lambda n: len(n.path) == 5,
                                          chunk_nodes=7))
        print(len(got), all(type(n) is Node for n in got))
        print(backtracking.count(p, Node(()), kids, checkpoint=os.path.join(d, "c"),
                                 checkpoint_interval=0.001))
        r = branch_and_bound.maximise(p, Node(()), kids, lambda n: sum(n.path), lambda n: 99,
                                      checkpoint=os.path.join(d, "m"))
        print(r.value, type(r.node) is Node, os.listdir(d))
""")


def test_chunked_searches_send_nodes_of_a_main_class_by_value(tmp_path):
    """Before: the chunks' units (solutions() since F4's fix, every checkpointed search since
    round five's #4) were pickled by the driver into bytes, by reference to ``__main__.Node``,
    which a worker (another ``__main__``) cannot load: "AttributeError: Can't get attribute
    'Node' on <module 'shoal.runtime.worker'>"; the runtime sends such arguments by value."""
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    r = subprocess.run([sys.executable, "-c", _MAIN_NODES], capture_output=True, text=True,
                       timeout=100, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[:3] == ["243 True", "364", "10 True []"]


# --- F6: progress= when the search fails; "-0" ---------------------------------------------

@pytest.mark.parametrize("coordination", ["sequential", "stack-stealing"])
def test_a_failed_search_ends_its_progress_line_and_its_record(pilot2, coordination):
    """Before: no final line (the output was empty, or the last periodic line), and the
    dashboard's last record said ``state: running``."""
    out = io.StringIO()
    with pytest.raises(SearchError, match="late boom"):
        backtracking.count(pilot2, (), _kids_late, progress=out, coordination=coordination)
    text = out.getvalue()
    assert text.endswith(" (failed)\n"), repr(text)
    assert BOARD.records("search")[-1]["state"] == "failed"
    backtracking.count(pilot2, (), _kids, progress=out)  # the pilot goes on; a clean run
    assert out.getvalue().endswith(" (done)\n")
    assert BOARD.records("search")[-1]["state"] == "done"


def test_a_failed_search_ends_its_terminal_line_before_the_traceback(pilot2):
    """On a terminal the line is redrawn in place ("\\r"); before, a failure left it open and
    the traceback began on it.  A real pseudo-terminal: the line must end with a newline."""
    master, slave = os.openpty()
    try:
        tty = os.fdopen(slave, "w")
        assert tty.isatty()
        with pytest.raises(SearchError, match="late boom"):
            backtracking.count(pilot2, (), _kids_late, progress=tty)
        tty.close()
        data = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the slave is closed and everything is read
                break
            if not chunk:
                break
            data += chunk
    finally:
        os.close(master)
    assert data.endswith(b"(failed)\r\n"), data  # (the tty writes "\n" as "\r\n")


def test_minimise_with_an_optimum_of_zero_shows_0_not_minus_0(pilot2):
    out = io.StringIO()
    r = branch_and_bound.minimise(pilot2, (), _kids, _leaf_sum, _sum, progress=out)
    assert r.value == 0 and r.path == (0,) * 6
    last = out.getvalue().splitlines()[-1]
    assert "incumbent 0  " in last and "-0" not in last, last
    rec = BOARD.records("search")[-1]
    assert rec["incumbent"] == 0 and math.copysign(1.0, rec["incumbent"]) == 1.0


# --- F7: a negative kernel count; bools for counts ------------------------------------------

def _negative_kernel(node):
    return -5


@pytest.mark.parametrize("coordination", COORDINATIONS)
def test_a_negative_kernel_count_is_refused_naming_the_node(pilot2, coordination):
    """Before: added in (``kernel=lambda n: -5`` counted -17 on this kind of tree)."""
    with pytest.raises(SearchError, match=r"kernel\(\) raised ValueError\(.*-5, a negative count"
                                          r".* at node path \(\d, \d\) \(node \(\d, \d\)\)"):
        backtracking.count(pilot2, (), _kids, kernel=_negative_kernel, kernel_depth=2,
                           coordination=coordination)
    with pytest.raises(SearchError, match=r"negative count.* at node path \(.*\) \(node "):
        backtracking.count(pilot2, (), _kids, kernel=_negative_kernel, kernel_depth=0,
                           coordination=coordination)


def test_a_zero_kernel_count_is_fine(pilot2):
    assert backtracking.count(pilot2, (), _kids, kernel=lambda n: 0, kernel_depth=2) == 3


@pytest.mark.parametrize("name", ["spawn_depth", "budget", "kernel_depth", "checkpoint_interval"])
def test_a_bool_for_a_number_option_is_refused_by_every_option_alike(pilot2, name, tmp_path):
    """Before: spawn_depth=True and budget=True ran as 1, where kernel_depth=True and
    checkpoint_interval=True were refused."""
    kw = {name: True}
    if name == "kernel_depth":
        kw["kernel"] = _negative_kernel
    if name == "checkpoint_interval":
        kw["checkpoint"] = str(tmp_path / "c")
    with pytest.raises(ValueError, match=f"{name}.*got True"):
        backtracking.count(pilot2, (), _kids, **kw)


@pytest.mark.parametrize("name", ["window", "chunk_nodes", "chunk_solutions"])
@pytest.mark.parametrize("value", [True, 0, 2.5])
def test_solutions_refuses_a_bool_or_a_non_int_chunk_size(pilot2, name, value):
    with pytest.raises(ValueError, match=f"{name} must be an int >= 1.*got {value!r}"):
        backtracking.solutions(pilot2, (), _kids, _is_leaf, **{name: value})


def _is_leaf(node):
    return len(node) == 6


def test_maximise_refuses_a_bool_reference_count_and_spawn_depth(pilot2):
    with pytest.raises(ValueError, match="reference_nodes must be an int >= 1.*got True"):
        branch_and_bound.maximise(pilot2, (), _kids, _sum, _sum, reference_nodes=True)
    with pytest.raises(ValueError, match="spawn_depth must be an int >= 0, got True"):
        branch_and_bound.maximise(pilot2, (), _kids, _sum, _sum, spawn_depth=True)


# --- F8: a tree with no feasible node ------------------------------------------------------

def _minus_inf(node):
    return -math.inf


def _plus_inf(node):
    return math.inf


def _zero(node):
    return 0


@pytest.mark.parametrize("coordination", COORDINATIONS)
def test_a_tree_with_no_feasible_node_gives_no_node_as_documented(pilot2, coordination):
    """Every objective -inf (maximise) or +inf (minimise), the usual way to mark a node
    infeasible: no node, value ``initial`` (None without one), as Result's docstring now
    says; before it said value None only "when the tree had no node at all"."""
    r = branch_and_bound.maximise(pilot2, (), _kids, _minus_inf, _zero, coordination=coordination)
    assert (r.value, r.node, r.path) == (None, None, None) and r.stats.nodes > 1
    r = branch_and_bound.minimise(pilot2, (), _kids, _plus_inf, _zero, coordination=coordination)
    assert (r.value, r.node, r.path) == (None, None, None)
    r = branch_and_bound.maximise(pilot2, (), _kids, _minus_inf, _zero, initial=-7,
                                  coordination=coordination)
    assert (r.value, r.node, r.path) == (-7, None, None)
    assert "infeasible" in branch_and_bound.Result.__doc__


def _dist_boom(a, b):
    if a == 7 or b == 7:
        raise ValueError("pair boom")
    return float(abs(a - b))


def test_a_failed_all_pairs_ends_its_dashboard_record_too(pilot2):
    """The same Ticker (shoal/patterns/_progress.py) drives all_pairs' record: an exception
    left it ``state: running`` (``__exit__`` skipped the final record)."""
    from shoal.patterns import all_pairs

    with pytest.raises(Exception, match="pair boom"):
        all_pairs.compute(pilot2, list(range(20)), _dist_boom, tile=4)
    assert BOARD.records("all_pairs")[-1]["state"] == "failed"
