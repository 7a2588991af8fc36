"""The search engine shared by ``backtracking`` and ``branch_and_bound``.

A search is a root node and a lazy node generator ``children(node)``.  Every
node is named by its *path*: the tuple of child indices from the root (the
root is ``()``); paths order nodes exactly as a sequential depth-first search
meets them (lexicographic tuple order = pre-order).

Data flow::

    driver: make Control (SharedArray) [+ BestCell] --submit--> _task(spec, root, ())
    _task:  visit the unit node, then depth-first from it with an explicit stack of
            child iterators (one frame per level); every ~0.2 ms poll Control:
              stop flag set?        -> unwind (find hit, error, KeyboardInterrupt)
              incumbent improved?   -> prune against it from now on
              work wanted?          -> split: spawn the shallowest unexplored
                                       sibling as a new _task (coordination decides when)
            then join the spawned tasks newest first and merge their Tallies
    driver: Tally -> count / node / Result + SearchStats

Control is a ``SharedArray((workers + 1, 4), int64)``: one row per process,
each written only by its owner (the single-writer rule of BestCell):
SPAWNED and STARTED count search tasks made and begun, ACTIVE counts search
tasks running (not waiting in a join), STOP is a flag, EXPORTED counts subtrees
given to other machines and NODES the nodes visited so far (written at every
poll: what ``progress=`` shows).  A worker whose
ACTIVE is 0 is hungry; ``sum(SPAWNED) - sum(STARTED)`` tasks are on offer.

Invariants: every node of the tree is visited by exactly one task (a split
takes a sibling *out* of its frame's iterator before shipping it), so counts
add up exactly whoever stole what; a frame's index counter advances for every
child taken, also by a split, so paths stay true.

Coordinations (YewPar's names): SEQUENTIAL (one task), DEPTH_BOUNDED (one task
per node above ``spawn_depth``), BUDGET (after ``budget`` backtracks, spawn all
unexplored siblings of the shallowest level), STACK_STEALING (demand-driven:
when some worker is hungry and nothing is on offer, spawn the shallowest
unexplored sibling, so thieves get the biggest subtrees) and INDEXED (as
stack-stealing but a task ships only a path; the thief replays ``children``
from the root along it).

Alternatives rejected: true stack stealing (a thief reaching into the victim's
Python stack: the runtime steals whole tasks, and a spawned task is exactly a
piece of the stack put where thieves look); spawning at every node (~5 us per
spawn swamps small nodes); splitting by the runtime's hunger flags (internal,
not public API); reading the incumbent at every node (a few us each).
"""

from __future__ import annotations

import numbers
import pickle
import random
import sys
import time

import shoal

from ._portable import unwrap
from ._search_bnb import BnBLoop
from ._search_model import (  # noqa: F401 - re-exported for the drivers
    Coordination,
    Goal,
    SearchError,
    SearchStats,
    Spec,
    Tally,
    _p,
    _Stopped,
    check_picklable,
    coordination_of,
    kids_of,
    number,
    replay,
    where,
)

__all__ = ["Coordination", "SearchError", "SearchStats"]


SPAWNED, STARTED, ACTIVE, STOP, EXPORTED, NODES = range(6)
CONTROL_COLUMNS = 6
POLL_S = 0.0002  # seconds between two reads of Control by a running task
STOP_CELL_EVERY = 4  # polls between two reads of the stop cell (the cross-node stop flag)
TICK = 16  # the hot loops look at the clock once per TICK nodes expanded
STALE_POLLS = 8  # polls (~1.6 ms) a hungry worker may leave work on offer before a poke
_FRAMES_PER_NESTING = 20
_EMPTY = iter(())
_END = object()  # next(iterator, _END): the end of a level
_nesting = 0  # search tasks nested in joins on this worker's stack


def max_nesting() -> int:
    """Search tasks a worker may nest in joins before it stops splitting (bounds the stack)."""
    return max(4, min(256, sys.getrecursionlimit() // _FRAMES_PER_NESTING))


def _slot(array) -> int:
    w = shoal.current_worker()
    return 0 if w is None else w.id % len(array)


# ---------------------------------------------------------------------------
# the explorer: one task's depth-first search
# ---------------------------------------------------------------------------


class Explorer(BnBLoop):
    """Depth-first search of one unit of work inside one task: worker thread only."""

    def __init__(self, spec: Spec, base: tuple, ctl, me: int, split: bool):
        self.spec = spec
        self.children = unwrap(spec.children)
        self.accept = unwrap(spec.accept)
        self.objective = unwrap(spec.objective)
        self.bound = unwrap(spec.bound)
        self.kernel = unwrap(spec.kernel)
        self.base = base
        self.ctl = ctl
        self.me = me
        self.tally = Tally()
        self.futs: list = []
        self.split_ok = split and _nesting < max_nesting()
        self.demand = split and spec.coordination in (Coordination.STACK_STEALING,
                                                     Coordination.INDEXED)
        # a split counts leaf siblings in place instead of shipping them (count only:
        # most UTS nodes are leaves, and 87% of its pieces used to be single leaves)
        self.leaves_in_place = (spec.goal is Goal.COUNT and not spec.collect
                                and spec.kernel is None)
        self.next_poll = 0.0
        self.skips: dict = {}  # level -> children split off while the level was on the path
        self.stale = 0  # polls in a row with hungry workers and unclaimed work on offer
        self.cell = spec.cell
        self.stop_cell = spec.stop
        self.channel = spec.channel
        self.exporting: list | None = None  # collects what split() ships, while exporting
        self.polls = 0
        self.seen = 0  # nodes a hot loop has visited and not yet added to the tally
        self.reported = 0  # nodes of this task already added to Control's NODES
        w = shoal.current_worker()
        self.peers = len(ctl) - 1 if w is None else min(w.workers, len(ctl) - 1)  # rows 1..peers
        g = spec.initial
        if self.cell is not None:
            g = max(g, self.cell.value)
        self.glob = g  # best value anywhere (as of the last poll)
        self.local = spec.initial  # best value this task found
        self._limits()

    def _limits(self) -> None:
        # prune when bound <= lim or bound < slim (module docstring of branch_and_bound)
        if self.spec.ordered:
            self.lim, self.slim = self.local, self.glob
        else:
            self.lim = self.slim = max(self.glob, self.local)

    # -- user functions, with errors that name the node ---------------------------

    def kids(self, node, path):
        return kids_of(self.children, node, path)

    def visit(self, node, depth: int, path) -> bool:
        """Account for ``node``; True if its children are to be explored.  ``path``: tuple or callable."""
        spec, t = self.spec, self.tally
        if spec.goal is Goal.OPTIMISE:
            try:
                b = self.bound(node)
            except Exception as exc:
                raise SearchError(f"bound() raised {exc!r} at {where(path, node)}") from exc
            b = number(b, "bound()", path, node)
            if spec.negate:
                b = -b
            if b <= self.lim or b < self.slim:
                t.pruned += 1
                return False
            try:
                v = self.objective(node)
            except Exception as exc:
                raise SearchError(f"objective() raised {exc!r} at {where(path, node)}") from exc
            v = number(v, "objective()", path, node)
            if spec.negate:
                v = -v
            if v > self.lim and v >= self.slim:
                self.improve(node, v, _p(path))
        elif spec.goal is Goal.FIND:
            if self.bound is not None:  # the Decision skeleton: prune against the target
                try:
                    b = self.bound(node)
                except Exception as exc:
                    raise SearchError(f"bound() raised {exc!r} at {where(path, node)}") from exc
                if number(b, "bound()", path, node) < spec.target:
                    t.pruned += 1
                    return False
            if self.accept is not None:
                try:
                    hit = self.accept(node)
                except Exception as exc:
                    raise SearchError(f"goal() raised {exc!r} at {where(path, node)}") from exc
            else:
                try:
                    v = self.objective(node)
                except Exception as exc:
                    raise SearchError(f"objective() raised {exc!r} at "
                                      f"{where(path, node)}") from exc
                hit = number(v, "objective()", path, node) >= spec.target
            if hit:
                p = _p(path)
                check_picklable(node, p, "a found node travels back to the driver")
                t.found, t.t_hit = (p, node), time.monotonic()
                self.halt()
                t.nodes += 1
                raise _Stopped
        elif self.accept is not None:
            try:
                ok = self.accept(node)
            except Exception as exc:
                raise SearchError(f"accept() raised {exc!r} at {where(path, node)}") from exc
            if ok:
                t.count += 1
                if spec.collect:
                    check_picklable(node, _p(path), "a solution travels back to the driver")
                    t.found_nodes.append(node)
        else:
            t.count += 1
        t.nodes += 1
        if spec.per_depth:
            pd = t.per_depth
            while len(pd) <= depth:
                pd.append(0)
            pd[depth] += 1
        return True

    def improve(self, node, v: float, path: tuple) -> None:
        t = self.tally
        check_picklable(node, path, "the incumbent travels back to the driver")
        now = time.monotonic()
        t.best, t.best_path, t.best_node, t.t_best = v, path, node, now
        if t.t_first is None:
            t.t_first = now
        t.updates += 1
        self.local = v
        if v > self.glob:
            self.glob = v
        self.cell.offer(v)
        self._limits()

    # -- control -------------------------------------------------------------------

    def halt(self) -> None:
        """Stop the whole search: this node at once (Control), the others through the cell."""
        self.ctl[self.me, STOP] = 1
        if self.stop_cell is not None:
            self.stop_cell.offer(1.0)

    def report(self) -> None:
        """Add the nodes visited since the last report to Control's NODES (progress)."""
        live = self.tally.nodes + self.seen
        if live != self.reported:
            self.ctl[self.me, NODES] += live - self.reported
            self.reported = live

    def poll(self, iters, idx) -> None:
        """Read Control (stop flag, incumbent, hunger) and split if work is wanted."""
        self.report()
        rows = self.ctl.tolist()  # one copy, then plain Python: numpy reductions cost ~1 us each
        for r in rows:
            if r[STOP]:
                raise _Stopped
        if self.stop_cell is not None:
            self.polls += 1
            if self.polls >= STOP_CELL_EVERY:
                self.polls = 0
                if self.stop_cell.value > 0:  # stopped elsewhere (another node, the driver)
                    self.ctl[self.me, STOP] = 1
                    raise _Stopped
                if (self.channel is not None and self.split_ok
                        and self.spec.requests.value > sum(r[EXPORTED] for r in rows)):
                    self.export_level(iters, idx)
        cell = self.cell
        if cell is not None:
            g = cell.value
            if g > self.glob:
                self.glob = g
                self._limits()
        if self.demand and self.split_ok:
            hungry = sum(1 for r in rows[1:self.peers + 1] if r[ACTIVE] == 0)
            if not hungry:
                self.stale = 0
            else:
                offered = sum(r[SPAWNED] - r[STARTED] for r in rows)
                if offered < hungry:
                    # two at least: the runtime wakes a parked thief when a deque reaches 2
                    self.split(iters, idx, max(2, hungry - offered), whole_level=False)
                    self.stale = 0
                else:
                    self.stale += 1
                    if self.stale >= STALE_POLLS:  # on offer but nobody takes it: poke again
                        self.split(iters, idx, 1, whole_level=False)
                        self.stale = 0
        self.next_poll = time.perf_counter() + POLL_S

    def split(self, iters, idx, want: int, whole_level: bool) -> None:
        """Spawn unexplored siblings, shallowest level first (``whole_level``: all of one level)."""
        shipped = 0
        for lvl in range(len(iters)):
            it = iters[lvl]
            if it is _EMPTY:
                continue
            while want > 0:
                try:
                    child = next(it)
                except StopIteration:
                    iters[lvl] = _EMPTY
                    break
                except Exception as exc:
                    path = self.base + tuple(idx[:lvl])
                    raise SearchError(f"children() raised {exc!r} at "
                                      f"{where(path, spec=self.spec)}") from exc
                if lvl == len(idx) - 1:  # the deepest level: DFS takes its next child after this
                    idx[lvl] += 1
                    path = self.base + tuple(idx)
                else:  # idx[lvl] is on the current path: count the skip, apply it on return
                    skips = self.skips
                    skips[lvl] = skips.get(lvl, 0) + 1
                    path = self.base + tuple(idx[:lvl]) + (idx[lvl] + skips[lvl],)
                if self.spec.goal is Goal.OPTIMISE and self.prunable(child, path):
                    if self.spec.prune_level:
                        iters[lvl] = _EMPTY
                        break
                    continue
                if self.leaves_in_place and self._leaf(child, path):
                    continue  # counted here: a steal round trip for one leaf buys nothing
                self.ship(child, path)
                shipped += 1
                if not whole_level:
                    want -= 1
            if want <= 0 or (whole_level and shipped):
                return

    def _leaf(self, node, path) -> bool:
        """Count ``node`` here if it is a leaf (``children`` returns an empty list or
        tuple; a generator cannot tell without being advanced, so it is shipped)."""
        try:
            kids = self.children(node)
        except Exception as exc:
            raise SearchError(f"children() raised {exc!r} at {where(path, node)}") from exc
        if kids or not (kids.__class__ is list or kids.__class__ is tuple):
            return False
        self.visit(node, len(path), path)
        return True

    def prunable(self, node, path) -> bool:
        try:
            b = self.bound(node)
        except Exception as exc:
            raise SearchError(f"bound() raised {exc!r} at {where(path, node)}") from exc
        b = number(b, "bound()", path, node)
        if self.spec.negate:
            b = -b
        if b <= self.lim or b < self.slim:
            self.tally.pruned += 1
            return True
        return False

    def ship(self, node, path) -> None:
        """Spawn a task for the subtree at ``path`` (its node, or only its path when indexed);
        while exporting, send it to the driver for another machine instead."""
        if self.spec.coordination is Coordination.INDEXED:
            node = None
        else:
            check_picklable(node, path, "a split-off subtree may be stolen by another process")
        if self.exporting is not None:
            self.exporting.append((node, path))
            return
        self._spawn(node, path)

    def _spawn(self, node, path) -> None:
        a = self.ctl
        a[self.me, SPAWNED] += 1
        self.futs.append(shoal.spawn(task, self.spec, node, path))
        self.tally.splits += 1

    def export_level(self, iters, idx) -> None:
        """Another machine ran dry: give it the unexplored siblings of our shallowest open
        level, in one Channel message (if the slot is still full or the message too big,
        they are spawned here instead)."""
        self.exporting = []
        try:
            self.split(iters, idx, 1, whole_level=True)
        finally:
            units, self.exporting = self.exporting, None
        if units and not self.export(units):
            for node, path in units:
                self._spawn(node, path)

    def export(self, units: list) -> bool:
        """Put the subtrees in the Channel; False: the slot is still full or it is too big."""
        uid = random.getrandbits(62)
        try:
            blob = pickle.dumps((uid, units), 5)
        except Exception:
            import cloudpickle

            blob = cloudpickle.dumps((uid, units))
        if len(blob) > self.channel.size or not self.channel.put(blob):
            return False
        self.ctl[self.me, EXPORTED] += 1
        t = self.tally
        if t.exports is None:
            t.exports = []
        t.exports.append(uid)
        return True

    # -- the depth-first loop --------------------------------------------------------

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
        spec = self.spec
        visit, kids = self.visit, self.kids
        prune_level = spec.prune_level and spec.goal is Goal.OPTIMISE
        budget = spec.budget if (spec.coordination is Coordination.BUDGET and self.split_ok) else 0
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
                raise SearchError(f"children() raised {exc!r} at "
                                  f"{where(base + tuple(idx[:-1]), spec=self.spec)}") from exc
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
                if prune_level:
                    iters.pop()
                    idx.pop()
                    if skips and len(idx) - 1 in skips:
                        idx[-1] += skips.pop(len(idx) - 1)
                    if budget:
                        backtracks += 1
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
        budget = self.spec.budget if (self.spec.coordination is Coordination.BUDGET
                                      and self.split_ok) else 0
        backtracks = count = nodes = kcount = 0
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
                            raise SearchError(f"accept() raised {exc!r} at "
                                              f"{where(base + tuple(idx[:d]) + (i,), child)}") from exc
                    try:
                        kids = children(child)
                    except Exception as exc:
                        raise SearchError(f"children() raised {exc!r} at "
                                          f"{where(base + tuple(idx[:d]) + (i,), child)}") from exc
                    if pd is not None:  # a local list indexed by depth below the base - 1
                        try:
                            pd[d] += 1
                        except IndexError:
                            pd.extend([0] * (d + 1 - len(pd)))
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
                            backtracks += 1
                            if backtracks >= budget:
                                backtracks = 0
                                top, i = self._poll_split(iters, idx, d, top, i)
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
                        raise SearchError(f"children() returned a non-iterable "
                                          f"{type(kids).__name__} at "
                                          f"{where(base + tuple(idx[:d]), child)}; return a "
                                          "list, tuple or generator") from None
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
                        backtracks += 1
                        if backtracks >= budget:
                            backtracks = 0
                            top, i = self._poll_split(iters, idx, d, top, i)
        except (_Stopped, SearchError):
            raise
        except Exception as exc:  # raised inside a generator, listing top's children
            if bad:
                raise
            raise SearchError(f"children() raised {exc!r} at "
                              f"{where(base + tuple(idx[:d]), spec=self.spec)}") from exc
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

    def _poll_split(self, iters, idx, d, top, i):
        """A budget split from the loop's state (child ``i`` of the level is done);
        ``(top, i)`` to go on with: siblings shipped from this very level are skipped
        at once, since the loop goes on listing it."""
        full, fidx = iters[:d] + [top], idx[:d] + [i]
        self.split(full, fidx, 1, whole_level=True)
        top = self._after_split(iters, full, fidx, d, i)
        return top, i + self.skips.pop(d, 0)

    def join(self) -> None:
        """Wait for the spawned tasks (newest first) and merge what they found."""
        if not self.futs:
            return
        a = self.ctl
        a[self.me, ACTIVE] -= 1  # waiting in a join: this worker may be hungry
        try:
            # No cancelling on STOP here: the sibling that raised (and set STOP) may
            # still be on its way back from a thief, and a cancelled future would drop
            # its error.  Siblings see STOP at their next poll and return at once.
            for f in reversed(self.futs):
                if f.cancelled():
                    continue
                self.tally.merge(f.result())
        except BaseException:
            self.halt()
            for g in self.futs:
                g.cancel()
            raise
        finally:
            a[self.me, ACTIVE] += 1


# ---------------------------------------------------------------------------
# tasks
# ---------------------------------------------------------------------------


def task(spec: Spec, node, path: tuple) -> Tally:
    """One search task: the subtree at ``path`` (``node`` is None when indexed)."""
    global _nesting
    ctl = spec.control.array
    me = _slot(ctl)
    ctl[me, STARTED] += 1
    ctl[me, ACTIVE] += 1
    _nesting += 1
    try:
        coord = spec.coordination
        ex = Explorer(spec, path, ctl, me, split=coord is not Coordination.SEQUENTIAL)
        if spec.collect:
            ex.tally.found_nodes = []
        try:
            if stopped(spec, ctl):
                return ex.tally
            if node is None:
                node = replay(spec, path)
            if coord is Coordination.DEPTH_BOUNDED and len(path) < spec.spawn_depth:
                _spawn_children(ex, node, path)
            else:
                ex.dfs(node)
        except _Stopped:
            pass
        except BaseException:
            ex.halt()
            for f in ex.futs:
                f.cancel()
            raise
        ex.report()  # (the spawned tasks report their own nodes)
        ex.join()
        return ex.tally
    finally:
        _nesting -= 1
        ctl[me, ACTIVE] -= 1


def stopped(spec: Spec, ctl) -> bool:
    """Has the search been stopped (on this node, or anywhere through the stop cell)?"""
    return bool(ctl[:, STOP].any()) or (spec.stop is not None and spec.stop.value > 0)


def units_task(spec: Spec, units: list) -> Tally:
    """A group of subtrees ``[(node, path)]`` (the driver's split of the top levels on a
    pilot of several nodes): one task each, spawned here, so this node's workers share them."""
    tally = Tally(tasks=0)
    futs = [shoal.spawn(task, spec, node, path) for node, path in units[:0:-1]]
    try:
        tally.merge(task(spec, *units[0]))
        for f in reversed(futs):
            tally.merge(f.result())
    except BaseException:
        for f in futs:
            f.cancel()
        raise
    return tally


def _spawn_children(ex: Explorer, node, path: tuple) -> None:
    """Depth-bounded: visit ``node`` and spawn one task per (unpruned) child."""
    if not ex.visit(node, len(path), path):
        return
    it = ex.kids(node, path)
    for i in range(sys.maxsize):
        try:
            child = next(it)
        except StopIteration:
            return
        except Exception as exc:
            raise SearchError(f"children() raised {exc!r} at {where(path, node)}") from exc
        cpath = path + (i,)
        if ex.spec.goal is Goal.OPTIMISE and ex.prunable(child, cpath):
            if ex.spec.prune_level:
                return
            continue
        ex.ship(child, cpath)
