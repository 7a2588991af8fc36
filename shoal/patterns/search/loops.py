"""The depth-first hot loops of one search task (a mixin of ``engine.Explorer``).

``dfs`` picks the loop for the goal: ``dfs_count`` (backtracking.count), ``dfs_bnb``
(branch and bound, bnb.py) or the generic loop here (find, solutions).  The hot loops
share one shape and the helpers below: all state is in locals; ``top``/``i`` are the
iterator being listed and the index of its last child taken, ``iters``/``idx`` the
ancestors' ones (preallocated lists, entries ``[:d]``); the level is walked with a
``for`` loop (FOR_ITER, no ``next()`` call per node) and descending breaks out of it.
Control is read at most every ``TICK`` nodes, and only if ``POLL_S`` has passed; a
poll may split, which changes the loop's state only through ``skips`` (children of a
level on the path given away: applied when the loop comes back to it) and the
iterators (``_poll_at``).  try blocks cost nothing in 3.11, so user calls are wrapped
one by one and errors name the node; the rare paths (errors, budget splits) are
helpers here, shared by both loops.
"""

from __future__ import annotations

import numbers
import sys
import time

from .model import Coordination, Goal, SearchError, _Stopped, where

TICK = 16  # the hot loops look at the clock once per TICK nodes (tests patch it: read per call)
_END = object()  # next(iterator, _END): the end of a level


class CountLoops:
    """Explorer's counting and generic loops, and the helpers of every loop: worker thread only."""

    def dfs(self, node) -> None:
        """Visit ``node`` (at ``self.base``) and its subtree, splitting as the coordination says."""
        if self.spec.goal is Goal.COUNT and not self.spec.collect:
            return self.dfs_count(node)
        if self.spec.goal is Goal.OPTIMISE:
            return self.dfs_bnb(node)
        base = self.base
        d0 = len(base)
        if not self.visit(node, d0, base):
            return
        visit, kids = self.visit, self.kids
        budget = self.budget()
        backtracks = 0
        skips = self.skips
        clock = time.perf_counter
        iters = [kids(node, base)]
        idx = [-1]

        def pathf():  # the path of the node just taken (idx is updated in place)
            return base + tuple(idx)

        tick = 0
        while iters:
            tick += 1
            if tick >= TICK:  # before taking a child: a split ships the siblings after it
                tick = 0
                if clock() >= self.next_poll:
                    self.poll(iters, idx)
            try:
                child = next(iters[-1], _END)
            except Exception as exc:
                raise self.listing_error(exc, idx, len(idx) - 1) from exc
            if child is _END:
                iters.pop()
                idx.pop()
                if skips and len(idx) - 1 in skips:
                    idx[-1] += skips.pop(len(idx) - 1)
                if budget:
                    backtracks += 1
                    if backtracks >= budget:
                        backtracks = 0
                        self.split(iters, idx, 1, whole_level=True)
                continue
            idx[-1] += 1
            if not visit(child, d0 + len(idx), pathf):
                continue
            iters.append(kids(child, pathf))
            idx.append(-1)

    def _poll_at(self, iters, idx, d, top, i):
        """Poll with the loop's split state (ancestors in ``iters``/``idx``, the level
        being listed in ``top``/``i``); returns the (possibly emptied) ``top``.

        The child at index ``i`` has been taken and is about to be explored, so a
        split of this level ships its *later* siblings; their slots become a skip,
        applied when the loop comes back to this level.
        """
        full, fidx = iters[:d] + [top], idx[:d] + [i]
        self.poll(full, fidx)
        return self._after_split(iters, full, fidx, d, i)

    def _after_split(self, iters, full, fidx, d, i):
        """Write a split's changes back into the loop's state; the new ``top``."""
        if fidx[-1] != i:
            self.skips[d] = self.skips.get(d, 0) + fidx[-1] - i
        iters[:d] = full[:-1]
        return full[-1]

    def dfs_count(self, node) -> None:
        """``dfs`` specialised for counting: the hot loop of backtracking.count.

        All state is in locals: ``top``/``i`` are the iterator being listed and the
        index of its last child taken, ``iters``/``idx`` the ancestors' ones.  The
        level is walked with a ``for`` loop (FOR_ITER, no ``next()`` call per
        node); descending breaks out of it.  Control is read at most every
        ``TICK`` descents, and only if ``POLL_S`` has passed.  try blocks cost
        nothing in 3.11, so user calls are wrapped one by one.
        """
        base, t = self.base, self.tally
        d0 = len(base)
        kernel = self.kernel
        kd = sys.maxsize  # loop depth d from which the children are the kernel's
        if kernel is not None:
            if d0 >= self.spec.kernel_depth:  # a whole task below the cutoff
                t.count += self.run_kernel(node, base)
                return
            kd = self.spec.kernel_depth - d0 - 1
        self.visit(node, d0, base)
        children, accept = self.children, self.accept
        pd = [0] * 32 if self.spec.per_depth else None
        budget = self.budget()
        count = nodes = kcount = 0
        bad = False
        tick = TICK
        skips = self.skips
        clock = time.perf_counter
        iters: list = [None] * 32  # ancestors' iterators and child indices: entries [:d]
        idx: list = [0] * 32
        d = 0
        top = self.kids(node, base)
        i = -1
        try:
            while True:
                for child in top:
                    i += 1
                    if d >= kd:  # kernel=: the user's sequential count of the subtree
                        bad = True  # its TypeError (not an int) is the user's answer
                        kcount += self.run_kernel(child, base + tuple(idx[:d]) + (i,))
                        bad = False
                        if clock() >= self.next_poll:  # (a kernel call is a whole subtree)
                            self.seen = nodes
                            top = self._poll_at(iters, idx, d, top, i)
                        if skips and d in skips:
                            i += skips.pop(d)
                        continue
                    if accept is not None:  # (without accept, count = nodes: added at the end)
                        try:
                            if accept(child):
                                count += 1
                        except Exception as exc:
                            raise self.call_error("accept", exc, idx, d, i, child) from exc
                    try:
                        kids = children(child)
                    except Exception as exc:
                        raise self.call_error("children", exc, idx, d, i, child) from exc
                    if pd is not None:  # stats=True: nodes per depth below the base - 1
                        if d >= len(pd):
                            pd.extend([0] * (d + 1))
                        pd[d] += 1
                    tick -= 1
                    if not tick:
                        nodes += TICK
                        tick = TICK
                        if clock() >= self.next_poll:
                            self.seen = nodes
                            top = self._poll_at(iters, idx, d, top, i)
                    if not kids and (kids.__class__ is list or kids.__class__ is tuple):
                        # a leaf: no level to push and pop (most nodes of UTS trees)
                        if skips and d in skips:  # a poll above shipped the next siblings
                            i += skips.pop(d)
                        if budget:
                            top, i = self.backtrack(budget, iters, idx, d, top, i)
                        continue
                    try:  # push (the lists only grow: d is the depth below the base)
                        iters[d] = top
                        idx[d] = i
                    except IndexError:
                        iters.append(top)
                        idx.append(i)
                    d += 1
                    try:
                        top = iter(kids)
                    except TypeError:
                        raise self.not_iterable(kids, idx, d, child) from None
                    i = -1
                    break
                else:  # the level is done: back up
                    if not d:
                        break
                    d -= 1
                    top = iters[d]
                    i = idx[d]
                    if skips and d in skips:
                        i += skips.pop(d)
                    if budget:
                        top, i = self.backtrack(budget, iters, idx, d, top, i)
        except (_Stopped, SearchError):
            raise
        except Exception as exc:  # raised inside a generator, listing top's children
            if bad:
                raise
            raise self.listing_error(exc, idx, d) from exc
        finally:
            nodes += TICK - tick
            t.nodes += nodes
            self.seen = 0
            if pd is not None:
                self._add_per_depth(pd, d0 + 1)
            t.count += (nodes if accept is None else count) + kcount

    def run_kernel(self, node, path) -> int:
        """``kernel(node)``: the count of the subtree at ``path``, checked."""
        try:
            k = self.kernel(node)
        except Exception as exc:
            raise SearchError(f"kernel() raised {exc!r} at {where(path, node)}") from exc
        if type(k) is not int:
            if isinstance(k, numbers.Integral) and not isinstance(k, bool):
                return int(k)
            raise TypeError(f"kernel() returned {k!r} ({type(k).__name__}) at "
                            f"{where(path, node)}; it must return the subtree's count (an int)")
        return k

    def _add_per_depth(self, counts: list, first: int) -> None:
        """Add a hot loop's per-depth counts (``counts[k]``: nodes at depth ``first + k``)."""
        pd = self.tally.per_depth
        while counts and not counts[-1]:
            counts.pop()
        if len(pd) < first + len(counts):
            pd.extend([0] * (first + len(counts) - len(pd)))
        for k, c in enumerate(counts):
            pd[first + k] += c

    # -- the rare paths of every loop ---------------------------------------------------

    def budget(self) -> int:
        """Backtracks between two splits (BUDGET coordination), else 0."""
        if self.spec.coordination is Coordination.BUDGET and self.split_ok:
            return self.spec.budget
        return 0

    def backtrack(self, budget: int, iters, idx, d, top, i):
        """One backtrack under the BUDGET coordination: every ``budget``-th splits
        (``_poll_split``); ``(top, i)`` to go on with."""
        self.backtracks += 1
        if self.backtracks < budget:
            return top, i
        self.backtracks = 0
        return self._poll_split(iters, idx, d, top, i)

    def call_error(self, what: str, exc: BaseException, idx, d, i, child) -> SearchError:
        """``what()`` raised ``exc`` at child ``i`` of the level at loop depth ``d``."""
        return SearchError(f"{what}() raised {exc!r} at "
                           f"{where(self.base + tuple(idx[:d]) + (i,), child)}")

    def not_iterable(self, kids, idx, d, child) -> SearchError:
        """``children(child)`` (the node at loop depth ``d``) returned a non-iterable."""
        return SearchError(f"children() returned a non-iterable {type(kids).__name__} at "
                           f"{where(self.base + tuple(idx[:d]), child)}; return a list, "
                           "tuple or generator")

    def listing_error(self, exc: BaseException, idx, d) -> SearchError:
        """A generator raised while listing the children of the node at loop depth ``d``
        (the node is not at hand: re-derived from the root for the message)."""
        return SearchError(f"children() raised {exc!r} at "
                           f"{where(self.base + tuple(idx[:d]), spec=self.spec)}")

    def _poll_split(self, iters, idx, d, top, i):
        """A budget split from the loop's state (child ``i`` of the level is done);
        ``(top, i)`` to go on with: siblings shipped from this very level are skipped
        at once, since the loop goes on listing it."""
        full, fidx = iters[:d] + [top], idx[:d] + [i]
        self.split(full, fidx, 1, whole_level=True)
        top = self._after_split(iters, full, fidx, d, i)
        return top, i + self.skips.pop(d, 0)

