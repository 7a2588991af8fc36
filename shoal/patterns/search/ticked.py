"""The count loop with nothing but the search in it: polls armed by a tick, not counted down.

``acquire(ex)`` gives a ``Loop`` whose ``run(it) -> count`` (setting ``ex.rec_nodes``) is
what ``shapes.count_loop`` returns -- the recursion of ``loops.dfs_count_gen`` compiled
for the search's ``children``/``accept`` -- where ``shoal._tick`` can tick (the main
thread of a process with the native ticker: a pilot's workers); elsewhere the caller uses
``shapes.count_loop``, whose every node pays a countdown and a depth argument.  A built
loop (two functions per level) is kept per shape when its task is done (``release``) and
rebound to the next task's search: building one costs more than a task of a few nodes.

Per node this loop does what a hand-written recursion does and no more:

- **no countdown**: the recursion's calls go through closure cells, one per level;
  every ``polling.TICK_S`` (and at once on a thief's poke: shoal/_tick.py ``nudge``)
  the tick handler (``_tick``, between two bytecodes of this thread) *arms* them -- rebinds the cells of the levels the loop can enter next to polling
  twins -- and the first level entered after it polls (``tick_poll``), disarms and goes
  on.  A poll therefore happens where the countdown's did: at a level entry, the loop's
  state whole in its frames (``loops.lazy_level`` reads them on a split);
- **no depth argument**: each level is its own function (``rec_<shape><k>``, calling
  level ``k + 1``), so depth is where the call goes; the level past ``ex.rec_cap()``
  calls ``rec_<shape><COUNT_REC_DEPTH + 1>``, which hands its level to the iterative loop as
  before (``Explorer._deep_level``);
- **no node counter**: every level entry returns its count with the node in it --
  ``count = 1`` per node, ``+ 2**64`` per accepted child -- so one sum carries both:
  nodes ``count & MASK`` (less the base's listing), solutions ``count >> 64``.  A unit
  would need 2**64 nodes (centuries) to overflow.  In-flight nodes for ``progress=`` and
  the dashboard are summed from the frames' ``count`` every ``LIVE_EVERY`` polls.

Arming is cheap and safe anywhere: the handler finds the innermost level on the stack
(a few ``f_back`` steps from the interrupted frame; all levels when it is not near one)
and rebinds the cells of levels 2 .. that level + 1, the only ones the loop can enter
next.  A tick that lands while ``tick_poll`` disarms can leave a cell armed; it polls
once more when entered and disarms itself (each twin restores its own cell first).

With ``polling.POLL_S == 0`` (tests) every cell stays armed: every ``polling.TICK``-th level
entry polls, as the countdown loop's window of ``TICK`` nodes does then.

Measured against the hand-written recursion (N-Queens 12, CPU time, one process):
this loop is as fast as the same levels without ticks and faster than the countdown
loop (docs/benchmarks.md, "Measurements behind design choices").  The tick itself was the dear part: at 0.5 ms its timer wake-ups cost a
few per cent, hence 5 ms and the poke (``_tick.nudge``) for prompt splits.

Alternatives rejected: a countdown with a longer window (the check itself is the cost,
not the polls); a flag cell tested per node (a load and a branch per node); one function
with a depth argument and no check (the depth between two ticks is unbounded when the
ticker's thread waits for a busy core: a deep chain could hit the recursion limit);
rearming every level on every tick (64 cell writes each way per tick); a ``try`` around
the inlined ``accept`` (~1-2% per node: an error re-runs the function instead,
``loops.lazy_error``).
"""

from __future__ import annotations

from shoal._tick import available as _can_tick
from shoal._tick import ticking

from . import polling, shapes

LIVE_EVERY = 32  # polls between two sums of the frames' in-flight node counts
K = 1 << 64  # an accepted child's weight in a level's packed count
MASK = K - 1

_SOURCE_LEVEL = '''
    def rec_{name}{k}(it):
        count = 1
        for child in it:
{accept}
            count += rec_{name}{k1}({kcall})
        return count

    def rec_{name}{k}_poll(it):
        tick_poll({k})
        count = 1
        for child in it:
{accept}
            count += rec_{name}{k1}({kcall})
        return count
'''

_ACCEPT_INLINE = '''            if {inline}:
                count += {K}'''

_ACCEPT_CALL = '''            if {acall}:
                count += {K}'''

_CACHE: dict = {}


def available() -> bool:
    """Can this thread run the ticked loop?"""
    return _can_tick()


class _Shape:
    """One compiled shape: ``build`` and the level of each of its functions' code."""

    def __init__(self, build, levels: dict, depth: int, name: str):
        self.build, self.levels, self.depth, self.name = build, levels, depth, name
        codes = {c.co_name: c for c in build.__code__.co_consts if hasattr(c, "co_name")}
        # level k + 1's cell is item next_cell[k] of level k's closure
        self.next_cell = [None, *(codes[f"rec_{name}{k}"].co_freevars.index(f"rec_{name}{k + 1}")
                                  for k in range(1, depth + 1))]


def _shape(ex) -> _Shape:
    kcall, values = shapes.call_source(ex.children, "children")
    if ex.accept is None:
        name, acall, inline = "all", None, None
    else:
        name = "acc"
        acall, more = shapes.call_source(ex.accept, "accept")
        values.update(more)
        inline = shapes.inlined(ex.accept, "accept") if shapes.INLINE else None
    depth = shapes.COUNT_REC_DEPTH
    key = (name, kcall, acall, inline, depth)
    shape = _CACHE.get(key)
    if shape is None:
        if acall is None:
            accept = ""
        elif inline is not None:
            accept = _ACCEPT_INLINE.format(inline=inline, acall=acall, K=K)
        else:
            accept = _ACCEPT_CALL.format(acall=acall, K=K)
        src = [f"def build(ex, tick_poll, {', '.join(values)}):"]
        for k in range(1, depth + 1):
            src.append(_SOURCE_LEVEL.format(name=name, k=k, k1=k + 1, accept=accept, kcall=kcall))
        src.append(f"    def rec_{name}{depth + 1}(it):  # past the cap: the iterative loop\n"
                   f"        ex._deep_level(it)\n        return 1\n")
        fast = ", ".join(f"rec_{name}{k}" for k in range(1, depth + 2))
        slow = ", ".join(f"rec_{name}{k}_poll" for k in range(1, depth + 1))
        src.append(f"    return ({fast}), ({slow})\n")
        ns: dict = {}
        text = "\n".join(src)
        exec(compile(text, f"<shoal ticked search loop {name}: {kcall}, {acall}>", "exec"), ns)
        build = ns["build"]
        # an error on an inlined accept's line is accept's (loops.lazy_error)
        lines = () if inline is None else {n for n, line in enumerate(text.splitlines(), 1)
                                           if line.strip() == f"if {inline}:"}
        shapes.register_recursions(build, lazy=True, accept_lines=lines)
        levels = {}
        for code in build.__code__.co_consts:
            cname = getattr(code, "co_name", "")
            if cname.startswith(f"rec_{name}"):
                k = cname[len(f"rec_{name}"):].removesuffix("_poll")
                if k.isdigit() and int(k) <= depth:
                    levels[code] = int(k)
        shape = _CACHE[key] = _Shape(build, levels, depth, name)
    return shape, values


class Loop:
    """One built ticked loop (two functions per level and their closure cells), bound to
    one Explorer at a time: ``acquire`` binds a free one (or builds it: ~100 us, where a task
    of a few nodes takes ~40 us), ``release`` unbinds it for the next task of the process.
    ``run(it) -> count`` runs one unit (``loops.dfs_count_gen``)."""

    def __init__(self, shape: _Shape, values: dict):
        self.shape = shape
        depth = shape.depth
        fast, slow = shape.build(None, self.tick_poll, **values)
        self.fast, self.slow = (None, *fast), (None, *slow)  # (indexed by level)
        at = shape.next_cell
        self.cells = [None, None, *(self.fast[k].__closure__[at[k]] for k in range(1, depth + 1))]
        self.params = {}  # build's parameters' cells (ex, children, their bound arguments...)
        for f in (*fast, *slow):
            for var, cell in zip(f.__code__.co_freevars, f.__closure__ or (), strict=True):
                if var not in ("tick_poll",) and not var.startswith(f"rec_{shape.name}"):
                    self.params[var] = cell
        self.ex = None
        self.cap = depth
        self.always = False
        self.armed_hi = self.polls = self.entries = 0

    def bind(self, ex, values: dict) -> None:
        depth, cells, fast = self.shape.depth, self.cells, self.fast
        self.ex = ex
        for name, cell in self.params.items():
            cell.cell_contents = ex if name == "ex" else values[name]
        cap = max(1, min(depth, ex.rec_cap()))
        if cap != self.cap:
            if self.cap < depth:
                cells[self.cap + 1].cell_contents = fast[self.cap + 1]
            if cap < depth:  # level cap + 1 is the iterative loop's
                cells[cap + 1].cell_contents = fast[depth + 1]
            self.cap = cap
        self.always = polling.POLL_S == 0  # (tests: poll at every level entry)
        self.armed_hi = self.polls = self.entries = 0
        if self.always:
            for j in range(2, cap + 1):
                cells[j].cell_contents = self.slow[j]

    def unbind(self) -> None:
        """Disarm every level and drop the references to the search (its model may be big)."""
        cells, fast = self.cells, self.fast
        for j in range(2, self.cap + 1):
            cells[j].cell_contents = fast[j]
        for cell in self.params.values():
            cell.cell_contents = None
        self.ex = None

    def tick_poll(self, k: int) -> None:
        """A polling twin's first step (level ``k`` entered after a tick)."""
        if self.always:  # every entry comes here; poll at every polling.TICK-th, as the countdown
            self.entries += 1
            if self.entries < polling.TICK:
                return
            self.entries = 0
        else:
            cells, fast = self.cells, self.fast
            cells[k].cell_contents = fast[k]  # (first: a tick meanwhile re-arms it)
            hi, self.armed_hi = self.armed_hi, 0
            for j in range(2, hi + 1):
                cells[j].cell_contents = fast[j]
        ex = self.ex
        self.polls += 1
        if self.polls >= LIVE_EVERY:
            self.polls = 0
            ex.seen = self.live()
        ex.poll(None)

    def arm(self, frame) -> None:
        """The tick: rebind the cells of levels 2 .. (the innermost level) + 1."""
        cap, levels = self.cap, self.shape.levels
        hi = cap
        f = frame
        for _ in range(16):
            if f is None:
                break
            k = levels.get(f.f_code)
            if k is not None:
                hi = min(cap, k + 1)
                break
            f = f.f_back
        cells, slow = self.cells, self.slow
        for j in range(2, hi + 1):
            cells[j].cell_contents = slow[j]
        if hi > self.armed_hi:
            self.armed_hi = hi

    def live(self) -> int:
        """Nodes of this unit so far, summed from the levels' frames (rare)."""
        n = -1  # (the first level lists the base: no node)
        for f in self.ex.rec_frames():
            c = f.f_locals.get("count")
            if c is not None:
                n += c & MASK
        return max(n, 0)

    def ticking(self):
        """The block in which ticks arm this loop (``dfs_count_gen``: all of a task's units)."""
        return ticking(self.arm, polling.TICK_S)

    def run(self, it):
        ex = self.ex
        ex.rec_nodes = 0
        c = self.fast[1](it)
        ex.rec_nodes = (c & MASK) - 1
        return ex.rec_nodes if ex.accept is None else c >> 64


_FREE: dict = {}  # shape key -> built loops not bound to a task (this process)
FREE_PER_SHAPE = 4


def acquire(ex) -> Loop:
    """A ticked loop bound to ``ex`` (an Explorer counting over generator children;
    ``available()`` must be True); ``release`` it when the task's units are done."""
    shape, values = _shape(ex)
    free = _FREE.get(shape)
    loop = free.pop() if free else Loop(shape, values)
    loop.bind(ex, values)
    return loop


def release(loop: Loop) -> None:
    loop.unbind()
    free = _FREE.setdefault(loop.shape, [])
    if len(free) < FREE_PER_SHAPE:
        free.append(loop)
