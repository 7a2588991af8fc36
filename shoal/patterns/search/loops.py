"""The depth-first hot loops of one search task (a mixin of ``engine.Explorer``).

``dfs`` picks the loop for the goal: ``dfs_count_gen`` (backtracking.count over
generator children: a recursion generated per shape, shapes.py), ``dfs_count``,
``dfs_bnb_rec``/``dfs_bnb`` (branch and bound, bnb.py) or the generic loop here (find,
solutions), and runs it from a frame-stack chunk of its own (room.py).  The iterative loops
share one shape and the helpers below: all state is in locals; ``top``/``i`` are the
iterator being listed and the index of its last child taken, ``iters``/``idx`` the
ancestors' ones (preallocated lists, entries ``[:d]``); the level is walked with a
``for`` loop (FOR_ITER, no ``next()`` call per node) and descending breaks out of it.
Control is read at most every ``TICK`` nodes, and only if ``POLL_S`` has passed
(polling.py: the protocol); a
poll may split, which changes the loop's state only through ``skips`` (children of a
level on the path given away: applied when the loop comes back to it) and the
iterators (``_poll_at``).  try blocks cost nothing in 3.11, so user calls are wrapped
one by one and errors name the node; the rare paths (errors, budget splits) are
helpers here, shared by both loops.
"""

from __future__ import annotations

import functools
import numbers
import sys
import time

from . import polling, shapes, ticked
from .model import Coordination, Goal, SearchError, _Stopped, where
from .room import in_room

_END = object()  # next(iterator, _END): the end of a level


class CountLoops:
    """Explorer's counting and generic loops, and the helpers of every loop: worker thread only."""

    def dfs(self, node) -> None:
        """Visit ``node`` (at ``self.base``) and its subtree, splitting as the coordination
        says; from the base of a frame-stack chunk of its own (room.py: no chunk boundary
        for the loops to call across)."""
        return in_room(self._dfs, node)

    def _dfs(self, node) -> None:
        spec = self.spec
        if spec.goal is Goal.COUNT and not spec.collect:
            if (spec.kernel is None and not spec.per_depth and not self.budget()
                    and _yields(self.children)):
                return self.dfs_count_gen(node)
            return self.dfs_count(node)
        if spec.goal is Goal.OPTIMISE:
            if not spec.per_depth and not self.budget():
                return self.dfs_bnb_rec(node)
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
        TICK = polling.TICK  # (read per call: tests patch it)
        while iters:
            tick += 1
            if tick >= TICK:  # before taking a child: a split ships the siblings after it
                tick = 0
                if clock() >= self.next_poll:
                    self.poll(lambda: (iters, idx))
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
        built = []

        def frontier():  # O(d): only when the poll splits
            if not built:
                built.append((iters[:d] + [top], idx[:d] + [i]))
            return built[0]

        self.poll(frontier)
        return self._after_split(iters, *built[0], d, i) if built else top

    def _after_split(self, iters, full, fidx, d, i):
        """Write a split's changes back into the loop's state; the new ``top``."""
        if fidx[-1] != i:
            self.skips[d] = self.skips.get(d, 0) + fidx[-1] - i
        iters[:d] = full[:-1]
        return full[-1]

    def dfs_count_gen(self, node) -> None:
        """``dfs`` for counting over generator children as a plain recursion: the loop
        ticked.py generates for this search's ``children``/``accept`` (polls armed by a
        tick: nothing per node but the recursion), or where it cannot tick, the one
        shapes.py generates (a countdown and a depth argument per node).

        Lazy splitting: the loop keeps no stack, no child index and wraps no call in a
        ``try``.  What a split, a hand-over or an error needs -- each level's
        iterator (``it``), the child it is on (``child``) and that child's index -- is
        read from the recursion's frames only then (``lazy_level``: the index is
        reconstructed by draining the level's iterator and counting its parent's
        children again).  A drained level's remaining children become *pending units*
        of this task (``self.pending``: (path, node), explored after the recursion
        returns, each by the same loop); a split ships the shallowest pending units
        first.  A level deeper than ``rec_cap()`` goes to the iterative ``dfs_count``
        (``_deep_level``).
        """
        base0 = self.base
        owned = self.pending is None  # (else a bundle task's units: engine.bundle_task)
        if owned:
            self.pending = []
        self.rdrained = {}
        loop = ticked.acquire(self) if ticked.available() else None
        try:
            if loop is None:
                self._count_gen_units(node, None)
            else:
                self.ticked_runs += 1
                with loop.ticking():
                    self._count_gen_units(node, loop.run)
        finally:
            if loop is not None:
                ticked.release(loop)
            self.base = base0
            self.rdrained = None
            if owned:
                self.pending = None

    def _count_gen_units(self, node, run) -> None:
        """The unit ``node``, then the pending ones (``run``: the ticked loop's, or None)."""
        self._count_gen_unit(node, run)
        while self.pending:
            self.base, nd = self.pending.pop()
            self._count_gen_unit(nd, run)

    def _count_gen_unit(self, node, run) -> None:
        """One unit (``node`` at ``self.base``) of ``dfs_count_gen``."""
        base, t = self.base, self.tally
        self.visit(node, len(base), base)
        if run is None:
            run = shapes.count_loop(self)
        self.rnode = node  # the parent of the recursion's first level (lazy_level)
        self.rdrained.clear()  # (the levels of the previous unit are gone)
        self.rec_nodes = 0
        count = 0
        try:
            count = run(self.kids(node, base))
        except (_Stopped, SearchError):
            raise
        except Exception as exc:  # a user function raised (or returned a non-iterable)
            err = self.rec_error(exc)
            raise err from (err.__cause__ or exc)  # (lazy_error may name a truer cause)
        finally:  # (without accept every node counts: also those of an interrupted run)
            t.nodes += self.rec_nodes
            t.count += self.rec_nodes if self.accept is None else count
            self.seen = 0

    def rec_cap(self) -> int:
        """How deep the recursive count loops go: ``shapes.COUNT_REC_DEPTH``, or less where the recursion
        limit, less what joins may nest, leaves less room."""
        return max(1, min(shapes.COUNT_REC_DEPTH,
                           sys.getrecursionlimit() - self.frames_in_use() - shapes.REC_MARGIN))

    def _deep_level(self, it) -> None:
        """A level below the generated loop's ``cap`` (its node visited, no child taken):
        the iterative ``dfs_count`` lists it.  The node's path comes from the frames
        (``lazy_path``: the ancestors' levels are drained into ``self.pending``)."""
        frames = self.rec_frames()
        base = self.base
        self.base = self.lazy_path(frames[:-1], keep=True)
        # the recursion's in-flight nodes (``seen``, its last poll's) stay in the live count
        # while dfs_count's polls set ``seen`` to its own nodes (else progress= and the
        # dashboard fell by all the unit had visited: tests/attack/test_search_tick_break.py)
        t, seen = self.tally, self.seen
        t.nodes += seen
        self.seen = 0
        try:
            self.dfs_count(None, top=it)
        finally:
            self.base = base
            t.nodes -= seen
            self.seen = seen

    # -- the recursive loops' state, read from their frames -----------------------------

    def lazy_level(self, f, parent, path: tuple, keep: bool):
        """(index, remaining children) of the level of the lazy count loop's frame ``f``
        (``parent``: the node it lists, at ``path``): the index of the child it is on (-1:
        none yet), found by draining its iterator and counting ``parent``'s children
        again (``children`` must give the same number of children every time; indexed
        coordination and replay assume as much).  A drained level ends when its current
        child's subtree is done; its index is remembered (``self.rdrained``) and its
        remaining children are returned (None when drained before): kept as pending
        units (``keep``), shipped by the caller, or dropped (an error's message)."""
        loc = f.f_locals
        it = loc["it"]
        j = self.rdrained.get(it)
        if j is not None:
            return j, None
        try:
            rest = list(it)
            if "child" not in loc:  # the level polled on entry: no child taken yet
                j = -1
            else:
                j = sum(1 for _ in self.children(parent)) - len(rest) - 1
        except Exception as exc:
            raise SearchError(f"children() raised {exc!r} at {where(path, parent)}") from exc
        if j < -1:  # fewer children on this call than were listed: the names are lost
            if self.spec.coordination is Coordination.INDEXED:  # (and they are the work)
                raise SearchError(f"children() is not deterministic: {where(path, parent)} "
                                  "has fewer children on a second call than were listed; "
                                  "coordination='indexed' needs the same children each time")
            j = -1
        self.rdrained[it] = j
        if keep:
            self.pending.extend((path + (j + 1 + r,), c) for r, c in enumerate(rest))
            rest = None
        return j, rest

    def lazy_path(self, frames, keep: bool) -> tuple:
        """The path of the child the deepest of ``frames`` (the lazy count loop's, from
        its first level) is on, every level drained (``lazy_level``)."""
        parent, path = self.rnode, self.base
        for f in frames:
            j, _ = self.lazy_level(f, parent, path, keep)
            path += (j,)
            parent = f.f_locals.get("child")
        return path

    def lazy_split(self, want: int) -> None:
        """A split from the lazy count loop (called in its poll): pending units first,
        then the shallowest level with children left, drained: ``want`` of them shipped,
        the others pending."""
        want = self.ship_pending(want)
        if want <= 0:
            return
        parent, path = self.rnode, self.base
        for f in self.rec_frames():
            j, rest = self.lazy_level(f, parent, path, keep=False)
            if rest:
                for r, c in enumerate(rest):
                    if want > 0:
                        self.ship(c, path + (j + 1 + r,))
                        want -= 1
                    else:
                        self.pending.append((path + (j + 1 + r,), c))
                return
            loc = f.f_locals
            if "child" not in loc:
                return
            path += (j,)
            parent = loc["child"]

    def ship_pending(self, want: int) -> int:
        """Ship up to ``want`` of the shallowest pending units; what is still wanted."""
        pend = self.pending
        if not pend or want <= 0:
            return want
        pend.sort(key=lambda u: -len(u[0]))  # the shallowest last (local work pops deep ones)
        while pend and want > 0:
            path, node = pend.pop()
            self.ship(node, path)
            want -= 1
        return want

    def rec_frames(self) -> list:
        """The frames of the recursive loop (shapes.py) on this stack, shallowest first."""
        f = sys._getframe(1)
        out = []
        while f is not None:
            if f.f_code in shapes.GENERATED:
                out.append(f)
            elif out:
                break  # above the recursion
            f = f.f_back
        out.reverse()
        return out

    def rec_levels(self, frames=None) -> tuple[list, list]:
        """(each level's iterator, the true index of the child it is on), shallowest first."""
        rs = self.rskips
        its, idx, loops = [], [], []
        for f in self.rec_frames() if frames is None else frames:
            loc = f.f_locals
            it, i = loc["it"], loc["i"]
            its.append(it)
            loops.append(i)
            # children split off after the loop's child j: later children moved up by k
            idx.append(i + sum(k for j, k in rs.get(it, ()) if i > j))
        self._rec_loop_idx = loops  # (split_at: the loop's own indices)
        return its, idx

    def rec_error(self, exc: BaseException) -> BaseException:
        """The SearchError for ``exc`` raised inside the recursive loop, naming the node
        (rare path).  The traceback holds the recursion's frames; the line of the
        deepest one says which call raised: ``accept``, ``children``, ``iter`` (a
        non-iterable) or the ``for`` (a generator raised, listing that level)."""
        frames, last = [], None
        tb = exc.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code in shapes.GENERATED:
                frames.append(tb.tb_frame)
                last = tb
            tb = tb.tb_next
        if last is None:
            return SearchError(f"children() raised {exc!r} at {where(self.base, spec=self.spec)}")
        if shapes.GENERATED[last.tb_frame.f_code].lazy:
            return self.lazy_error(exc, frames, last)
        _, idx = self.rec_levels(frames)
        loc = last.tb_frame.f_locals
        what = shapes.GENERATED[last.tb_frame.f_code].calls.get(last.tb_lineno)
        if what is None:  # listing: the node is the level's parent, re-derived for the message
            return SearchError(f"children() raised {exc!r} at "
                               f"{where(self.base + tuple(idx[:-1]), spec=self.spec)}")
        child, path = loc["child"], self.base + tuple(idx)
        if what == "iter":
            kids = loc["kids"]
            if isinstance(exc, TypeError) and not hasattr(kids, "__iter__"):
                return SearchError(f"children() returned a non-iterable {type(kids).__name__} "
                                   f"at {where(path, child)}; return a list, tuple or generator")
            what = "children"
        return SearchError(f"{what}() raised {exc!r} at {where(path, child)}")

    def lazy_error(self, exc: BaseException, frames: list, last) -> BaseException:
        """``rec_error`` for the lazy count loop: the path from its frames (``lazy_path``;
        the search ends with this error, so the drained children are dropped)."""
        what = shapes.GENERATED[last.tb_frame.f_code].calls.get(last.tb_lineno)
        if what is None:  # listing: the node is the level's parent
            frames = frames[:-1]
        try:
            path = self.lazy_path(frames, keep=False)
        except SearchError:  # the path cannot be rebuilt: name the node alone
            path = self.base + ("?",)
        if what is None:
            return SearchError(f"children() raised {exc!r} at {where(path, spec=self.spec)}")
        child = last.tb_frame.f_locals["child"]
        cause = None
        if what == shapes.INLINE_ACCEPT:  # (ticked.py) the expression raised in the loop: the
            what = "accept"        # function itself, called, raises it from its own frame
            try:
                self.accept(child)
            except Exception as again:
                cause = again
        err = SearchError(f"{what}() raised {exc!r} at {where(path, child)}")
        err.__cause__ = cause
        return err

    def dfs_count(self, node, top=None) -> None:
        """``dfs`` specialised for counting: the hot loop of backtracking.count.

        All state is in locals: ``top``/``i`` are the iterator being listed and the
        index of its last child taken, ``iters``/``idx`` the ancestors' ones.  The
        level is walked with a ``for`` loop (FOR_ITER, no ``next()`` call per
        node); descending breaks out of it.  Control is read at most every
        ``TICK`` descents, and only if ``POLL_S`` has passed.  try blocks cost
        nothing in 3.11, so user calls are wrapped one by one.  ``top``: the node's
        children already listed (and the node visited: ``_deep_level``).
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
        if top is None:
            self.visit(node, d0, base)
            top = self.kids(node, base)
        children, accept = self.children, self.accept
        pd = [0] * 32 if self.spec.per_depth else None
        budget = self.budget()
        count = nodes = kcount = 0
        bad = False
        TICK = tick = polling.TICK  # (read per call: tests patch it)
        skips = self.skips
        clock = time.perf_counter
        iters: list = [None] * 32  # ancestors' iterators and child indices: entries [:d]
        idx: list = [0] * 32
        d = 0
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


def _yields(children) -> bool:
    """Is ``children`` a generator function (through partials)?  Counting uses the
    recursive loop for those only (shapes.py: every child is a level, no leaf tests).
    A tree of lists (UTS) stays on the iterative loop: with the frame-stack room
    (room.py) the recursive loop measured the same as the iterative one on UTS T3, and
    UTS's deep trees mostly run below the recursion anyway."""
    import inspect

    while isinstance(children, functools.partial):
        children = children.func
    return inspect.isgeneratorfunction(children)
