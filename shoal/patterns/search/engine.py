"""One search task: the Explorer (visits, polls, splits, joins) and the task functions.

A search is a root node and a lazy node generator ``children(node)``.  Every
node is named by its *path*: the tuple of child indices from the root (the
root is ``()``); paths order nodes exactly as a sequential depth-first search
meets them (lexicographic tuple order = pre-order).

Data flow::

    driver: make Control (control.py) [+ incumbent cell] --submit--> task(spec, root, ())
    task:   visit the unit node, then depth-first from it (the hot loops: loops.py and
            ticked.py for counting and finding, bnb.py for branch and bound); every ~0.2 ms
            (the ticked count loop: every 5 ms and when a thief pokes) poll (polling.py
            states the protocol):
              stop flag set?        -> unwind (find hit, error, KeyboardInterrupt)
              incumbent improved?   -> prune against it from now on
              work wanted?          -> split: spawn the shallowest unexplored
                                       sibling as a new task (coordination decides when)
            then join the spawned tasks newest first and merge their Tallies
    driver: Tally -> count / node / Result + SearchStats

Invariants: every node of the tree is visited by exactly one task (a split
takes a sibling *out* of its level's iterator before shipping it), so counts
add up exactly whoever stole what; a level's index counter advances for every
child taken, also by a split, so paths stay true.

Coordinations (YewPar's names): SEQUENTIAL (one task), DEPTH_BOUNDED (one task
per node above ``spawn_depth``), BUDGET (after ``budget`` backtracks, spawn all
unexplored siblings of the shallowest level), STACK_STEALING (demand-driven:
when some worker is hungry and nothing is on offer, spawn the shallowest
unexplored sibling, so thieves get the biggest subtrees) and INDEXED (as
stack-stealing but a task ships only a path; the thief replays ``children``
from the root along it).

Hunger and nesting are the runtime's signals (``shoal.current_worker()``):
``hungry()`` counts the idle peers of this worker live, ``nesting`` and
``max_nesting`` say how deep joins nest on this worker's stack and how deep they
may (a task at the cap explores its subtree without splitting).

Alternatives rejected: true stack stealing (a thief reaching into the victim's
Python stack: the runtime steals whole tasks, and a spawned task is exactly a
piece of the stack put where thieves look); spawning at every node (~5 us per
spawn swamps small nodes); counting hungry workers in Control (a copy of what
the runtime knows, and blind to workers busy with other work); reading the
incumbent at every node (a few us each).
"""

from __future__ import annotations

import math
import sys
import time

import shoal

from .._portable import unwrap
from . import polling
from .bnb import BnBLoop
from .control import NODES, RESERVE, SPAWNED, STARTED, STOP, slot, stopped
from .loops import CountLoops
from .model import (
    Coordination,
    Goal,
    SearchError,
    SearchSpec,
    Tally,
    _p,
    _Stopped,
    below,
    check_picklable,
    floor_float,
    kids_of,
    listing,
    number,
    replay,
    where,
)
from .polling import Split

BUNDLE = 8  # subtrees per stolen task when counting a list-children tree (ship_bundle)
BARREN_DEPTH = 256  # a split that found nothing waits (stack depth // this) polls
_EMPTY = iter(())


# ---------------------------------------------------------------------------
# the explorer: one task's depth-first search
# ---------------------------------------------------------------------------


class Explorer(CountLoops, BnBLoop):
    """Depth-first search of one unit of work inside one task: worker thread only."""

    def __init__(self, spec: SearchSpec, base: tuple, ctl, me: int, split: bool,
                 held: float = -math.inf):
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
        # the runtime's signals (shoal.current_worker()): tasks nested in joins on this
        # worker's stack, how many its recursion limit affords, and idle peers (live)
        w = shoal.current_worker()
        self.split_ok = split and (w is None or w.nesting < w.max_nesting)
        self.nest_frames = 0 if w is None else w.nesting * (sys.getrecursionlimit()
                                                            // max(1, w.max_nesting))
        self.demand = split and spec.coordination in (Coordination.STACK_STEALING,
                                                     Coordination.INDEXED)
        # a split counts leaf siblings in place instead of shipping them (count only:
        # most UTS nodes are leaves, and 87% of its pieces used to be single leaves)
        self.leaves_in_place = (spec.goal is Goal.COUNT and not spec.collect
                                and spec.kernel is None)
        # ... and ships the other subtrees of a split BUNDLE to a task (stack stealing)
        self.bundles = self.leaves_in_place and spec.coordination is Coordination.STACK_STEALING
        self.next_poll = 0.0
        self.skips: dict = {}  # level -> children split off while the level was on the path
        self.stale = 0  # polls in a row with hungry workers and unclaimed work on offer
        self.barren = 0  # polls to skip before the next hungry split (split_for)
        self.backtracks = 0  # BUDGET: backtracks since the last split
        self.rskips: dict | None = None  # the recursive loop: iterator -> children split off
        self.pending: list | None = None  # the lazy count loop: (path, node) units left here
        self.rdrained: dict | None = None  # ... and its drained levels: iterator -> index
        self.ticked_runs = 0  # ... how often it ran the ticked loop (ticked.py; tests)
        self.cell = spec.cell
        self.stop = spec.stop  # StopFlag: the search's stop on every machine
        # several machines: keep RESERVE of this task's subtrees on offer for the runtime's
        # balancer, which lends spawned tasks to a machine that runs dry (control.py)
        self.reserve: list | None = [] if spec.reserve and self.demand else None
        self.polls = 0
        self.seen = 0  # nodes a hot loop has visited and not yet added to the tally
        self.reported = 0  # nodes of this task already added to Control's NODES
        # in the driver's process (tests, benchmarks): every other row counts as hungry
        self.hungry = w.hungry if w is not None else (lambda: len(ctl) - 1)
        g = spec.initial
        if self.cell is not None:
            g = max(g, self.cell.value)
        self.glob = g  # best value anywhere (as of the last poll)
        # best value this task found or its spawners held when they spawned it (their
        # results carry it, and this task's result counts only if theirs do): ties with
        # it may be pruned; the cell's value is pruned strictly (_limits)
        self.local = max(spec.initial, held)
        self._limits()

    def frames_in_use(self) -> int:
        """Frames the tasks nested in joins on this worker's stack may hold."""
        return self.nest_frames

    def _limits(self) -> None:
        # prune when bound <= lim or bound < slim (module docstring of branch_and_bound,
        # "Pruning rule"): non-strictly against this task's own best, strictly against the
        # global incumbent, whose holder may die with its machine.  Unordered, one limit
        # says both (the generated loops test ``b > lim`` only): b <= below(g) => b < g
        if self.spec.ordered:
            self.lim, self.slim = self.local, self.glob
        else:
            g = self.glob
            if g > self.local:
                g = below(g)
            self.lim = self.slim = max(g, self.local)

    # -- user functions, with errors that name the node ---------------------------

    def kids(self, node, path):
        return kids_of(self.children, node, path)

    def visit(self, node, depth: int, path) -> bool:
        """Account for ``node``; True if its children are to be explored.  ``path``: tuple or callable."""
        spec, t = self.spec, self.tally
        if spec.goal is Goal.OPTIMISE:
            if self.prunable(node, path):
                return False
            v = self.value_of(self.objective, "objective()", node, path)
            if v > self.lim and v >= self.slim:
                self.improve(node, v, _p(path))
        elif spec.goal is Goal.FIND:
            if self.bound is not None:  # the Decision skeleton: prune against the target
                if self.value_of(self.bound, "bound()", node, path) < spec.target:
                    t.pruned += 1
                    return False
            if self.accept is not None:
                hit = self.call(self.accept, "goal()", node, path)
            else:
                hit = self.value_of(self.objective, "objective()", node, path) >= spec.target
            if hit:
                p = _p(path)
                check_picklable(node, p, "a found node travels back to the driver")
                t.found, t.t_hit = (p, node), time.monotonic()
                self.halt()
                t.nodes += 1
                raise _Stopped
        elif self.accept is not None:
            if self.call(self.accept, "accept()", node, path):
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
        self.cell.offer(floor_float(v))  # never above v: the cell may only under-prune
        self._limits()

    # -- control -------------------------------------------------------------------

    def halt(self) -> None:
        """Stop the whole search: this node at once (Control), the others through the cell."""
        self.ctl[self.me, STOP] = 1
        if self.stop is not None:
            self.stop.set()

    def report(self) -> None:
        """Add the nodes visited since the last report to Control's NODES (progress)."""
        live = self.tally.nodes + self.seen
        if live != self.reported:
            self.ctl[self.me, NODES] += live - self.reported
            self.reported = live

    def poll(self, frontier) -> None:
        """Read Control (stop flag, incumbent, hunger) and split if work is wanted.

        ``frontier``: None for the recursive loops (their levels are read from their frames
        on a split), else a function returning the iterative loop's ``(iters, idx)``, called
        only when a split happens: building them costs O(depth), and a poll that copied them
        every time made a 100,000-level chain quadratic."""
        self.report()
        rows = self.ctl.tolist()  # one copy, then plain Python: numpy reductions cost ~1 us each
        for r in rows:
            if r[STOP]:
                raise _Stopped
        if self.stop is not None:
            self.polls += 1
            if self.polls >= polling.STOP_CELL_EVERY:
                self.polls = 0
                if self.stop.is_set():  # stopped elsewhere (another machine, the driver)
                    self.ctl[self.me, STOP] = 1
                    raise _Stopped
                if self.reserve is not None and self.split_ok:
                    self.keep_reserve(*_levels(frontier))
        cell = self.cell
        if cell is not None:
            g = cell.value
            if g > self.glob:
                self.glob = g
                self._limits()
        if self.demand and self.split_ok:
            hungry = self.hungry()
            offered = sum(r[SPAWNED] - r[STARTED] for r in rows) if hungry else 0
            action, want, self.stale, self.barren = polling.split_decision(
                hungry, offered, self.stale, self.barren)
            if action is Split.SPLIT or action is Split.POKE:
                self.split_for(frontier, want)
        self.next_poll = time.perf_counter() + polling.POLL_S

    def split_for(self, frontier, want: int) -> None:
        """A hungry worker's split.  One that ships nothing scanned the whole stack for
        siblings, O(depth): on a deep stack the next is tried only after
        depth // BARREN_DEPTH polls, so a 200,000-level chain with a thief waiting is not
        quadratic (40 s instead of ~1 s); trees under BARREN_DEPTH levels
        (every benchmark's) never wait."""
        iters, idx = _levels(frontier)
        before = self.tally.splits
        self.split_at(iters, idx, want, whole_level=False)
        if self.tally.splits == before and iters is not None:
            self.barren = len(iters) // BARREN_DEPTH

    def keep_reserve(self, iters, idx) -> None:
        """Several machines: keep ``RESERVE`` of this task's shallowest subtrees spawned and
        not finished, so the runtime's balancer has work to lend when another machine
        runs dry (its hunger is not visible here).  A reserve task counts while it waits
        in the deque, runs here or runs elsewhere; once done, another is offered."""
        res = self.reserve
        if res:
            res[:] = [f for f in res if not f.done()]
        if len(res) < RESERVE:
            n = len(self.futs)
            self.split_at(iters, idx, RESERVE - len(res), whole_level=False)
            res.extend(self.futs[n:])

    def split_at(self, iters, idx, want: int, whole_level: bool) -> None:
        """``split`` from a loop's state: ``iters``/``idx`` of an iterative loop, or None for
        the recursive loop, whose levels are read from its frames only now (loops.py)."""
        if iters is not None:
            return self.split(iters, idx, want, whole_level)
        if self.rdrained is not None:  # the lazy count loop (loops.dfs_count_gen)
            return self.lazy_split(want)
        its, idx = self.rec_levels()
        keys, loops, rs = list(its), self._rec_loop_idx, self.rskips
        # siblings already taken after the child each level is on (earlier splits)
        pending = {lvl: sum(k for j, k in rs.get(it, ()) if j == loops[lvl])
                   for lvl, it in enumerate(keys) if it in rs}
        skips = dict(pending)
        self.split(its, idx, want, whole_level, skips)
        for lvl, k in skips.items():
            k -= pending.get(lvl, 0)
            if k:
                rs.setdefault(keys[lvl], []).append((loops[lvl], k))

    def split(self, iters, idx, want: int, whole_level: bool, skips: dict | None = None) -> None:
        """Spawn unexplored siblings, shallowest level first (``whole_level``: all of one level).

        ``iters``/``idx``: each level's iterator and the index of the child it is on;
        without ``skips`` (the iterative loops) the deepest level's index moves past what
        is taken and the others' takes go to ``self.skips``; with ``skips`` (the recursive
        loop, whose indices are the true ones) every level's takes are counted there.
        """
        if self.pending:  # units of the lazy count loop: shallower than any level here
            left = self.ship_pending(1 if whole_level else want)
            if whole_level or left <= 0:
                return
            want = left
        shipped = 0
        bundle = [] if self.bundles and not whole_level else None
        deepest = len(idx) - 1 if skips is None else -1
        if skips is None:
            skips = self.skips
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
                if lvl == deepest:  # the deepest level: DFS takes its next child after this
                    idx[lvl] += 1
                    path = self.base + tuple(idx)
                else:  # idx[lvl] is on the current path: count the skip, apply it on return
                    skips[lvl] = skips.get(lvl, 0) + 1
                    path = self.base + tuple(idx[:lvl]) + (idx[lvl] + skips[lvl],)
                if self.spec.goal is Goal.OPTIMISE and self.prunable(child, path):
                    if self.spec.prune_level:
                        iters[lvl] = _EMPTY
                        break
                    continue
                if self.leaves_in_place and self._leaf(child, path):
                    continue  # counted here: a steal round trip for one leaf buys nothing
                if bundle is not None:  # several subtrees per stolen task (ship_bundle)
                    bundle.append((path, child))
                    if len(bundle) < BUNDLE:
                        continue
                    self.ship_bundle(bundle)
                    bundle = []
                else:
                    self.ship(child, path)
                shipped += 1
                if not whole_level:
                    want -= 1
            if want <= 0 or (whole_level and shipped):
                break
        if bundle:
            self.ship_bundle(bundle)

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

    @staticmethod
    def call(fn, what: str, node, path):
        """``fn(node)`` for a user's function ``what``, with errors that name the node."""
        try:
            return fn(node)
        except Exception as exc:
            raise SearchError(f"{what} raised {exc!r} at {where(path, node)}") from exc

    def value_of(self, fn, what: str, node, path) -> float:
        """``fn(node)`` (the bound or the objective), checked, negated when minimising."""
        v = number(self.call(fn, what, node, path), what, path, node)
        return -v if self.spec.negate else v

    def prunable(self, node, path) -> bool:
        """Is ``node`` cut by its bound (counted as pruned)?"""
        b = self.value_of(self.bound, "bound()", node, path)
        if b <= self.lim or b < self.slim:
            self.tally.pruned += 1
            return True
        return False

    def ship(self, node, path) -> None:
        """Spawn a task for the subtree at ``path`` (its node, or only its path when indexed)."""
        if self.spec.coordination is Coordination.INDEXED:
            node = None
        else:
            check_picklable(node, path, "a split-off subtree may be stolen by another process", subtree=True)
        self.spawn_unit(node, path)

    def ship_bundle(self, units: list) -> None:
        """Spawn one task for several subtrees ``[(path, node), ...]`` (``bundle_task``):
        counting a list-children tree (UTS), a split's shallowest non-leaf siblings are
        mostly small (T3: median 25 nodes), so a thief given one at a time was soon
        hungry again and waited for the victim's next poll."""
        if len(units) == 1:
            path, node = units[0]
            return self.ship(node, path)
        for path, node in units:
            check_picklable(node, path, "a split-off subtree may be stolen by another process", subtree=True)
        self.ctl[self.me, SPAWNED] += 1
        self.futs.append(shoal.spawn(bundle_task, self.spec, units))
        self.tally.splits += 1

    def run_units(self, units: list) -> None:
        """Explore ``units`` ``[(path, node), ...]``: the first at once, the others kept
        pending (a split ships them first), then explored in path order."""
        path, node = units[0]
        self.base, self.pending = path, (units[:0:-1] or None)  # (popped from the end)
        self.dfs(node)
        while self.pending:
            self.base, node = self.pending.pop()
            self.dfs(node)

    def spawn_unit(self, node, path) -> None:
        """Spawn a search task for the subtree at ``path`` (joined by ``join``)."""
        a = self.ctl
        a[self.me, SPAWNED] += 1
        if self.local > self.spec.initial:  # (what this task and its spawners hold)
            self.futs.append(shoal.spawn(task, self.spec, node, path, self.local))
        else:
            self.futs.append(shoal.spawn(task, self.spec, node, path))
        self.tally.splits += 1

    def join(self) -> None:
        """Wait for the spawned tasks (newest first) and merge what they found."""
        if not self.futs:
            return
        try:  # (waiting here, this worker runs or steals other tasks: the runtime's hunger)
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


# ---------------------------------------------------------------------------
# tasks
# ---------------------------------------------------------------------------


def task(spec: SearchSpec, node, path: tuple, held: float = -math.inf) -> Tally:
    """One search task: the subtree at ``path`` (``node`` is None when indexed); ``held``:
    the best value its spawners hold (Explorer.local)."""
    ctl = spec.control.array
    me = slot(ctl)
    ctl[me, STARTED] += 1
    coord = spec.coordination
    ex = Explorer(spec, path, ctl, me, split=coord is not Coordination.SEQUENTIAL, held=held)
    if spec.collect:
        ex.tally.found_nodes = []

    def explore(node=node):
        if node is None:
            node = replay(spec, path)
        if coord is Coordination.DEPTH_BOUNDED and len(path) < spec.spawn_depth:
            _spawn_children(ex, node, path)
        else:
            ex.dfs(node)

    return _explore(ex, explore)


def _explore(ex: Explorer, body) -> Tally:
    """A search task around ``body()``: nothing if the search stopped before it started; a
    stop ends it quietly; an error halts it and cancels what it spawned, then propagates;
    then its own nodes are reported (the spawned tasks report theirs) and its spawned tasks
    joined."""
    try:
        if stopped(ex.spec.stop, ex.ctl):
            return ex.tally
        body()
    except _Stopped:
        pass
    except BaseException:
        ex.halt()
        for f in ex.futs:
            f.cancel()
        raise
    ex.report()
    ex.join()
    return ex.tally


def bundle_task(spec: SearchSpec, units: list) -> Tally:
    """One search task for several subtrees ``[(path, node), ...]`` (``ship_bundle``): the
    first explored at once, the others pending (a split ships pending units first)."""
    ctl = spec.control.array
    me = slot(ctl)
    ctl[me, STARTED] += 1
    ex = Explorer(spec, units[0][0], ctl, me, split=True)
    return _explore(ex, lambda: ex.run_units(units))


def _spawn_children(ex: Explorer, node, path: tuple) -> None:
    """Depth-bounded: visit ``node`` and spawn one task per (unpruned) child."""
    if not ex.visit(node, len(path), path):
        return
    for i, child in enumerate(listing(ex.children, node, path)):
        cpath = path + (i,)
        if ex.spec.goal is Goal.OPTIMISE and ex.prunable(child, cpath):
            if ex.spec.prune_level:
                return
            continue
        ex.ship(child, cpath)


def _levels(frontier) -> tuple:
    """A poll's ``(iters, idx)``: built by the iterative loop's ``frontier`` only now, or
    ``(None, None)`` for the recursive loops."""
    return (None, None) if frontier is None else frontier()
