"""Bad bound and objective values deep in the tree, and models whose reads the loop inlines.

The recursive branch-and-bound loop (shapes.py) checks a value only on its rare
branches: a bound where it prunes, an objective where it would improve the incumbent.
Comparisons are written so that NaN (every comparison False) lands on those branches,
and a value that cannot be compared or negated (None, str) raises there and is named by
``BnBLoop.rec_bad_value``.  These tests put each bad value at one node two levels down
(the root and its children are fine, so the value reaches the loops, not the driver's
checks) under every coordination, maximising and minimising, with and without
``prune_level``, and assert the error names the value and the node's path.
"""

from __future__ import annotations

import functools
import math
import operator
from fractions import Fraction
from typing import NamedTuple

import numpy as np
import pytest
import search_apps as apps

import shoal
from shoal.patterns import branch_and_bound
from shoal.patterns.search import shapes

BAD_AT = (1, 2)  # the node (a tree3 path) that returns the bad value


@pytest.fixture(scope="module")
def pilot2():
    with shoal.Pilot(workers=2) as p:
        yield p


def bad_bound(bad, sign, node):
    return bad if node == BAD_AT else sign * 10


def bad_objective(bad, sign, node):
    return bad if node == BAD_AT else sign * len(node)


def objective(sign, node):
    return sign * len(node)


def bound(sign, node):
    return sign * 10


BAD = {"nan": (float("nan"), "NaN"), "numpy-nan": (np.float64("nan"), "NaN"),
       "none": (None, r"None \(NoneType\)"), "str": ("ten", r"'ten' \(str\)")}


def _run(pilot, sense: str, obj, bnd, **options):
    search = branch_and_bound.maximise if sense == "max" else branch_and_bound.minimise
    return search(pilot, (), apps.tree3, obj, bnd, **options)


@pytest.mark.no_leak_check
@pytest.mark.parametrize("prune_level", [False, True])
@pytest.mark.parametrize("sense", ["max", "min"])
@pytest.mark.parametrize("bad", list(BAD))
@pytest.mark.parametrize("coordination", apps.COORDINATIONS)
def test_bad_bound_deep_is_refused_naming_the_node(pilot2, coordination, bad, sense, prune_level):
    value, shown = BAD[bad]
    sign = 1 if sense == "max" else -1
    with pytest.raises(TypeError, match=rf"bound\(\) returned {shown} at node path \(1, 2\)"):
        _run(pilot2, sense, functools.partial(objective, sign),
             functools.partial(bad_bound, value, sign), coordination=coordination,
             prune_level=prune_level)


@pytest.mark.no_leak_check
@pytest.mark.parametrize("sense", ["max", "min"])
@pytest.mark.parametrize("bad", list(BAD))
@pytest.mark.parametrize("coordination", apps.COORDINATIONS)
def test_bad_objective_deep_is_refused_naming_the_node(pilot2, coordination, bad, sense):
    value, shown = BAD[bad]
    sign = 1 if sense == "max" else -1
    with pytest.raises(TypeError, match=rf"objective\(\) returned {shown} at node path \(1, 2\)"):
        _run(pilot2, sense, functools.partial(bad_objective, value, sign),
             functools.partial(bound, sign), coordination=coordination)


def bool_objective(node):
    return len(node) == 1 if node else 0  # True on the root's children: 1 beats the root's 0


@pytest.mark.no_leak_check
@pytest.mark.parametrize("coordination", apps.COORDINATIONS)
def test_bool_objective_that_would_improve_is_refused(pilot2, coordination):
    with pytest.raises(TypeError, match=r"objective\(\) returned True \(bool\) at node path \(\d,\)"):
        branch_and_bound.maximise(pilot2, (), apps.tree3, bool_objective,
                                  functools.partial(bound, 1), coordination=coordination)


def other_numbers(kind, node):
    v = len(node)
    return {"fraction": Fraction(v, 1), "np-int": np.int64(v), "np-float": np.float64(v)}[kind]


@pytest.mark.no_leak_check
@pytest.mark.parametrize("kind", ["fraction", "np-int", "np-float"])
@pytest.mark.parametrize("coordination", ["sequential", "stack-stealing"])
def test_other_real_numbers_are_taken(pilot2, coordination, kind):
    f = functools.partial(other_numbers, kind)
    r = branch_and_bound.maximise(pilot2, (), apps.tree3, f, lambda nd: 10,
                                  coordination=coordination, ordered=True)
    assert r.value == 4 and r.node == (0, 0, 0, 0)
    r = branch_and_bound.minimise(pilot2, (), apps.tree3, f, lambda nd: 0,
                                  coordination=coordination, ordered=True)
    assert r.value == 0 and r.node == ()


def rising_bound(node):
    """Children best bound first, but each first child above its parent: a bound need not
    shrink down a path (a valid one: every subtree's objective is at most 4)."""
    return 4 + len(node) - (node[-1] if node else 0)


@pytest.mark.no_leak_check
@pytest.mark.parametrize("coordination", apps.COORDINATIONS)
def test_prune_level_takes_a_first_child_above_its_parent(pilot2, coordination):
    # the loop starts each level's order check from the parent's bound; a first child
    # above it is no misorder (before, every level started from +inf)
    r = branch_and_bound.maximise(pilot2, (), apps.tree3, functools.partial(objective, 1),
                                  rising_bound, prune_level=True, coordination=coordination,
                                  ordered=True)
    assert r.value == 4 and r.node == (0, 0, 0, 0)


# -- attrgetter / itemgetter reads, inlined by the generated loop -------------------------------


class Pt(NamedTuple):
    depth: int
    val: int
    bnd: int


class Bare(NamedTuple):  # no ``val``: the objective's read fails on it
    depth: int
    bnd: int


def pt_children(node):
    if node.depth == 4:
        return []
    d = node.depth + 1
    return [Pt(d, d * 10 + i, 100) for i in range(3)]


def pt_children_bare_at_12(node):
    kids = pt_children(node)
    if node.depth == 1 and node.val == 11:  # the root's second child: (1, 2) is its third
        kids[2] = Bare(2, 100)
    return kids


def test_read_inlines_one_plain_key_only():
    assert shapes.read(operator.attrgetter("val"), "objective") == ("child.val", {}, True)
    assert shapes.read(operator.attrgetter("a.b"), "objective") == ("child.a.b", {}, True)
    assert shapes.read(operator.itemgetter(2), "bound") == ("child[2]", {}, True)
    assert shapes.read(operator.itemgetter("k"), "bound") == ("child['k']", {}, True)
    for fn in (operator.attrgetter("a", "b"), operator.attrgetter("class"),
               operator.attrgetter("a b"), operator.itemgetter(1, 2),
               operator.itemgetter(slice(1))):
        src, values, inline = shapes.read(fn, "bound")
        assert src == "bound(child)" and values == {"bound": fn} and not inline


def field_val(nd):
    return nd.val


def field_bnd(nd):
    """A docstring does not stop the inlining."""
    return nd.bnd


def test_read_inlines_a_function_that_is_one_expression():
    """``def value(node): return node.value`` is read inline as a getter is (shapes.inlined,
    the count loop's accept rule); the same function serves as accept and as bound, and each
    loop gets the expression with its own names."""
    assert shapes.read(field_val, "objective") == ("(child.val)", {"objective": field_val}, True)
    assert shapes.read(field_bnd, "bound") == ("(child.bnd)", {"bound": field_bnd}, True)
    part = functools.partial(lambda k, nd: nd[k], 1)  # a lambda: its source is its line, not inlined
    assert shapes.read(part, "bound")[2] is False
    shapes.INLINE = False
    try:
        assert shapes.read(field_val, "objective") == ("objective(child)", {"objective": field_val}, False)
    finally:
        shapes.INLINE = True


@pytest.mark.no_leak_check
@pytest.mark.parametrize("sense", ["max", "min"])
@pytest.mark.parametrize("coordination", apps.COORDINATIONS)
def test_getter_model_finds_what_the_function_model_finds(pilot2, coordination, sense):
    root = Pt(0, 0, 100)
    search = branch_and_bound.maximise if sense == "max" else branch_and_bound.minimise
    got = search(pilot2, root, pt_children, operator.attrgetter("val"),
                 operator.attrgetter("bnd") if sense == "max" else operator.itemgetter(1),
                 coordination=coordination, ordered=True)
    want = search(pilot2, root, pt_children, lambda nd: nd.val,
                  (lambda nd: nd.bnd) if sense == "max" else (lambda nd: nd[1]),
                  coordination=coordination, ordered=True)
    assert (got.value, got.node, got.path) == (want.value, want.node, want.path)
    if sense == "max":  # one-expression functions, read inline as well
        fns = search(pilot2, root, pt_children, field_val, field_bnd, coordination=coordination,
                     ordered=True)
        assert (fns.value, fns.node, fns.path) == (want.value, want.node, want.path)
    assert got.value == (42 if sense == "max" else 0)


@pytest.mark.no_leak_check
@pytest.mark.parametrize("coordination", apps.COORDINATIONS)
def test_inlined_read_that_raises_names_the_call_and_node(pilot2, coordination):
    with pytest.raises(shoal.patterns.SearchError,
                       match=r"objective\(\) raised AttributeError\(.*'val'.*\) at node path \(1, 2\)"):
        branch_and_bound.maximise(pilot2, Pt(0, 0, 100), pt_children_bare_at_12,
                                  operator.attrgetter("val"), operator.attrgetter("bnd"),
                                  coordination=coordination)


def test_nan_of_numpy_is_refused_by_number():
    from shoal.patterns.search.model import number

    with pytest.raises(TypeError, match=r"bound\(\) returned NaN at node path \(1,\)"):
        number(np.float64("nan"), "bound()", (1,))
    assert number(np.float32(2.5), "bound()", ()) == 2.5
    assert math.isinf(number(np.float64("inf"), "bound()", ()))
