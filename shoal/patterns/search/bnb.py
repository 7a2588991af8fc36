"""The branch-and-bound hot loop, ``Explorer.dfs_bnb`` (a mixin of ``engine.Explorer``).

The loop has the shape of ``dfs_count`` and uses the helpers of loops.py (its module
docstring): a ``for`` over the level being listed, a preallocated stack of iterators
and child indices, a poll every ``TICK`` nodes once ``POLL_S`` has passed, and each
user call wrapped in its own ``try`` so errors name the node.  Per child: ``bound`` (pruned when it cannot strictly
beat the incumbent; with ``prune_level`` the rest of the level too, after checking the
bounds come best first), then ``objective`` (an improvement is offered at once), then
``children``.
"""

from __future__ import annotations

import math
import sys
import time

from . import polling, shapes
from .model import SearchError, _Stopped, number, where

_EMPTY = iter(())


class BnBLoop:
    """Explorer's branch-and-bound loop: worker thread only."""

    def dfs_bnb_rec(self, node) -> None:
        """``dfs`` for branch and bound as a plain recursion with lazy splitting (see
        ``loops.dfs_count_gen``: the state a split, an improvement or an error needs is
        read from the frames then), generated for the search's shape (shapes.py).  Per
        child: ``bound`` (a cut ends the level with ``prune_level``, after checking the
        order), ``objective``, ``children``."""
        base, t = self.base, self.tally
        if not self.visit(node, len(base), base):
            return
        cap = max(1, min(shapes.BNB_REC_DEPTH, sys.getrecursionlimit() - self.frames_in_use()
                         - shapes.REC_MARGIN))
        run = shapes.bnb_loop(self, cap)
        self.rskips = {}
        self.rec_nodes = self.rec_pruned = 0
        try:
            run(self.kids(node, base))
        except (_Stopped, SearchError):
            raise
        except Exception as exc:  # a user function raised (or returned a non-iterable)
            if getattr(exc, "_shoal_answer", False):  # number() rejected a value
                raise
            own = self.rec_own_error(exc)
            if isinstance(own, SearchError):  # an inlined read raised
                raise own from exc
            if own is not None:  # a value that is no number: number()'s TypeError
                raise own from None
            raise self.rec_error(exc) from exc
        finally:
            t.nodes += self.rec_nodes
            t.pruned += self.rec_pruned
            self.seen = 0
            self.rskips = None

    def rec_path(self) -> tuple:
        """The recursive loop: the path of the child its deepest level is on."""
        return self.base + tuple(self.rec_levels()[1])

    def rec_number(self, value, what: str, child) -> float:
        """``number(value)`` for the recursive loop (its TypeError is the user's answer)."""
        try:
            return number(value, what, self.base + tuple(self.rec_levels()[1]), child)
        except TypeError as exc:
            exc._shoal_answer = True
            raise

    def rec_improve(self, child, v) -> None:
        """The recursive loop's rare branch for an objective ``v`` (as returned) that did not
        compare as no better than the incumbent: a better number, or NaN or no number at
        all (refused here, naming the node)."""
        path = self.rec_path()
        v = self.rec_number(v, "objective()", child)
        if self.spec.negate:
            v = -v
        if v > self.lim and v >= self.slim:
            self.improve(child, v, path)

    def rec_own_error(self, exc: BaseException) -> BaseException | None:
        """The error naming the node when ``exc`` (raised in the recursive loop) came from
        comparing or negating a bound or objective that is no number (None, str, ...: the
        loop checks values on its rare branches only, shapes.py) -- number()'s TypeError --
        or from a read that ``shapes.read`` inlined (``child.bound``); else None."""
        frames, last = [], None
        tb = exc.__traceback__
        while tb is not None:
            info = shapes.GENERATED.get(tb.tb_frame.f_code)
            if info is not None and info.values is not None:  # (rec_bnb's frames only)
                frames.append(tb.tb_frame)
                last, lines = tb, info.values
            tb = tb.tb_next
        if last is None:
            return None
        which = lines.get(last.tb_lineno)
        if which is None:
            return None
        kind, what, local = which
        loc = last.tb_frame.f_locals
        path = self.base + tuple(self.rec_levels(frames)[1])
        if kind == "read":
            return SearchError(f"{what}() raised {exc!r} at {where(path, loc['child'])}")
        try:
            number(loc[local], what, path, loc["child"])
        except TypeError as bad:
            return bad
        return None

    def rec_misordered(self, i: int, b: float, prev: float) -> None:
        """``b`` (child ``i``'s bound) above ``prev``: misordered, unless ``i`` is the level's
        first child (``prev`` is then the parent's bound: a bound need not shrink down a path)."""
        if i:
            self._misordered(self.base + tuple(self.rec_levels()[1][:-1]), i, b, prev)

    def _deep_bnb_level(self, it) -> None:
        """A level below the recursive loop's ``cap`` (its node visited, no child taken):
        the iterative loop lists it (the node's path read from the frames)."""
        base = self.base
        self.base = base + tuple(self.rec_levels()[1][:-1])  # (the deepest frame: i == -1)
        try:
            self.dfs_bnb(None, visited=True, top=it)
        finally:
            self.base = base

    def dfs_bnb(self, node, visited: bool = False, top=None) -> None:
        """``dfs`` specialised for branch and bound (the same loop shape as ``dfs_count``);
        ``top``: the node's children already listed (``_deep_bnb_level``)."""
        base, t, spec = self.base, self.tally, self.spec
        d0 = len(base)
        if not visited and not self.visit(node, d0, base):
            return
        children, bound, objective = self.children, self.bound, self.objective
        negate, prune_level = spec.negate, spec.prune_level
        pd = [0] * 32 if spec.per_depth else None
        budget = self.budget()
        nodes = pruned = 0
        TICK = tick = polling.TICK  # (read per call: tests patch it)
        lim, slim = self.lim, self.slim
        skips = self.skips
        clock = time.perf_counter
        iters: list = [None] * 32  # ancestors' iterators and child indices: entries [:d]
        idx: list = [0] * 32
        prev = inf = math.inf
        prevs: list = [inf] * 32  # prune_level: the last bound seen on each ancestor's level
        d = 0
        if top is None:
            top = self.kids(node, base)
        i = -1
        bad = False  # set while number() checks a value
        try:
            while True:
                for child in top:
                    i += 1
                    try:
                        b = bound(child)
                    except Exception as exc:
                        raise self.call_error("bound", exc, idx, d, i, child) from exc
                    tb = type(b)
                    if tb is not int and (tb is not float or b != b):
                        bad = True  # number()'s TypeError is the user's answer
                        b = number(b, "bound()", base + tuple(idx[:d]) + (i,), child)
                        bad = False
                    if negate:
                        b = -b
                    if prune_level:  # the promise it rests on, checked where it is cheap
                        if b > prev:
                            self._misordered(base + tuple(idx[:d]), i, b, prev)
                        prev = b
                    if b <= lim or b < slim:
                        pruned += 1
                        if prune_level:
                            top = _EMPTY  # the rest of the level is pruned too
                            break
                        continue
                    try:
                        v = objective(child)
                    except Exception as exc:
                        raise self.call_error("objective", exc, idx, d, i, child) from exc
                    if v.__class__ is not int and (v.__class__ is not float or v != v):
                        bad = True
                        v = number(v, "objective()", base + tuple(idx[:d]) + (i,), child)
                        bad = False
                    if negate:
                        v = -v
                    if v > lim and v >= slim:
                        self.improve(child, v, base + tuple(idx[:d]) + (i,))
                        lim, slim = self.lim, self.slim
                    nodes += 1
                    if pd is not None:  # stats=True: nodes per depth below the base - 1
                        if d >= len(pd):
                            pd.extend([0] * (d + 1))
                        pd[d] += 1
                    try:
                        kids = children(child)
                    except Exception as exc:
                        raise self.call_error("children", exc, idx, d, i, child) from exc
                    tick -= 1
                    if not tick:
                        tick = TICK
                        if clock() >= self.next_poll:
                            self.seen = nodes
                            top = self._poll_at(iters, idx, d, top, i)
                            lim, slim = self.lim, self.slim
                    try:  # push (the lists only grow: d is the depth below the base)
                        iters[d] = top
                        idx[d] = i
                        prevs[d] = prev
                    except IndexError:
                        iters.append(top)
                        idx.append(i)
                        prevs.append(prev)
                    d += 1
                    try:
                        top = iter(kids)
                    except TypeError:
                        raise self.not_iterable(kids, idx, d, child) from None
                    i = -1
                    prev = inf
                    break
                else:  # the level is done (or pruned): back up
                    if not d:
                        break
                    d -= 1
                    top = iters[d]
                    i = idx[d]
                    prev = prevs[d]
                    if skips and d in skips:
                        i += skips.pop(d)
                    if budget:
                        top, i = self.backtrack(budget, iters, idx, d, top, i)
                        lim, slim = self.lim, self.slim
        except (_Stopped, SearchError):
            raise
        except Exception as exc:
            if bad:  # number() rejected a bound or objective value
                raise
            raise self.listing_error(exc, idx, d) from exc
        finally:
            t.nodes += nodes
            self.seen = 0
            t.pruned += pruned
            if pd is not None:
                self._add_per_depth(pd, d0 + 1)

    def _misordered(self, parent, i: int, b: float, prev: float) -> None:
        """prune_level=True, but child ``i`` of ``parent`` has a better bound than its
        elder sibling: refuse (pruning the level would have been silently wrong)."""
        if self.spec.negate:
            b, prev = -b, -prev
        order = "non-decreasing lower" if self.spec.negate else "non-increasing upper"
        raise SearchError(f"prune_level=True needs children in {order} bound order, but "
                          f"child {i} of {where(parent, spec=self.spec)} has bound {b} after a sibling "
                          f"with bound {prev}; sort the children best bound first, or "
                          "leave prune_level off (the default)")

