"""The count loop with nothing but the search in it: polls armed by a tick, not counted down.

``count_loop(ex)`` returns ``run(it) -> count`` (and sets ``ex.rec_nodes``) like
``shapes.count_loop`` -- the recursion of ``loops.dfs_count_gen`` compiled for the
search's ``children``/``accept`` -- where ``shoal._tick`` can tick (the main thread of a
process with the native ticker: a pilot's workers); elsewhere the caller uses
``shapes.count_loop``, whose every node pays a countdown and a depth argument.

Per node this loop does what a hand-written recursion does and no more:

- **no countdown**: the recursion's calls go through closure cells, one per level;
  every ``TICK_S`` the tick handler (``_tick``, between two bytecodes of this thread)
  *arms* them -- rebinds the cells of the levels the loop can enter next to polling
  twins -- and the first level entered after it polls (``tick_poll``), disarms and goes
  on.  A poll therefore happens where the countdown's did: at a level entry, the loop's
  state whole in its frames (``loops.lazy_level`` reads them on a split);
- **no depth argument**: each level is its own function (``rec_<shape><k>``, calling
  level ``k + 1``), so depth is where the call goes; the level past ``ex.rec_cap()``
  calls ``rec_<shape><REC_DEPTH + 1>``, which hands its level to the iterative loop as
  before (``Explorer._deep_level``);
- **no node counter**: every level entry returns its count with the node in it --
  ``count = 1`` per node, ``+ 2**64`` per accepted child -- so one sum carries both:
  nodes ``count & MASK`` (less the base's listing), solutions ``count >> 64``.  A unit
  would need 2**64 nodes (centuries) to overflow.  In-flight nodes for ``progress=`` and
  the dashboard are summed from the frames' ``count`` every ``LIVE_EVERY`` polls.

Builds are reused: a shape's generated functions close over ``ex``, ``tick_poll`` and the
user's functions and bound arguments through cells, so a finished run's build
(``_Built``: 2 functions per level) is kept per shape and rebound by the next run
(``_Shape.acquire``/``release``; the cells are cleared in between, so no user object
outlives its search).  Building anew cost ~85 us per task (4x a small task's whole
countdown loop); a run holds its build, so a nested search of the same shape inside
``children`` gets another.

Arming is cheap and safe anywhere: the handler finds the innermost level on the stack
(a few ``f_back`` steps from the interrupted frame; all levels when it is not near one)
and rebinds the cells of levels 2 .. that level + 1, the only ones the loop can enter
next.  A tick that lands while ``tick_poll`` disarms can leave a cell armed; it polls
once more when entered and disarms itself (each twin restores its own cell first).

With ``engine.POLL_S == 0`` (tests) every cell stays armed: every ``loops.TICK``-th level
entry polls, as the countdown loop's window of ``TICK`` nodes does then.

Measured (N-Queens 12, CPU time, one process, 10-12 rounds in shuffled order, reference
= the hand-written recursion = 1.00): this loop 0.965-0.967x; the same levels without
ticks 0.963x; a single recursive function with neither (the floor: it calls ``children``
directly where the reference goes through its partial) 0.95x; the countdown loop
1.02-1.09x.  The tick itself was the dear part: at 0.5 ms its timer wake-ups cost ~3% on
this VM, hence 5 ms and the poke (``_tick.nudge``) for prompt splits.

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

from . import loops, shapes

TICK_S = 0.005  # seconds between two ticks (one poll at the next level entry after each); a
#                 thief's poke (SIGURG) arms the loop at once (shoal/_tick.py nudge)
LIVE_EVERY = 32  # polls between two sums of the frames' in-flight node counts
FREE_BUILDS = 4  # builds of a shape kept for the next task's loop (more: nested searches)
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
    """One compiled shape: ``build``, the level of each of its functions' code, and the
    builds no running loop holds (``acquire``/``release``)."""

    def __init__(self, build, levels: dict, depth: int, name: str):
        self.build, self.levels, self.depth, self.name = build, levels, depth, name
        codes = {c.co_name: c for c in build.__code__.co_consts if hasattr(c, "co_name")}
        # level k + 1's cell is item next_cell[k] of level k's closure
        self.next_cell = [None, *(codes[f"rec_{name}{k}"].co_freevars.index(f"rec_{name}{k + 1}")
                                  for k in range(1, depth + 1))]
        self.free: list = []  # builds between two runs (main thread only)

    def acquire(self, values: dict) -> _Built:
        """A build of this shape for one run, its cells bound to ``values``: a free one
        (a task's loop costs ~85 us to build: 2 functions per level), else a new one.
        A build is held by one run at a time (a nested search of the same shape inside
        ``children`` gets another), so a run's cells are its own."""
        b = self.free.pop() if self.free else _Built(self)
        b.bind(values)
        return b

    def release(self, b: _Built) -> None:
        b.unbind()
        if len(self.free) < FREE_BUILDS:
            self.free.append(b)


class _Built:
    """One ``build`` of a shape: level k's functions ``fast[k]``/``slow[k]``, the cell that
    holds level k (``cells[k]``, k >= 2; item ``depth + 1``: the iterative loop's hand-over),
    and the cells of the names the levels close over (``ex``, ``tick_poll``, the user's
    functions and bound arguments), rebound per run and cleared between runs (a finished
    search keeps none of the user's objects alive)."""

    def __init__(self, shape: _Shape):
        self.depth = depth = shape.depth
        names = {}  # name -> a placeholder the cells are built with
        fast, slow = shape.build(**{n: None for n in shape.build.__code__.co_varnames[
            :shape.build.__code__.co_argcount]})
        self.fast, self.slow = (None, *fast), (None, *slow)  # (indexed by level)
        at = shape.next_cell
        self.cells = [None, None, *(self.fast[k].__closure__[at[k]] for k in range(1, depth + 1))]
        for f in (*fast, *slow):
            for name, cell in zip(f.__code__.co_freevars, f.__closure__ or (), strict=True):
                if not name.startswith("rec_"):
                    names[name] = cell
        self.named = names

    def bind(self, values: dict) -> None:
        named = self.named
        for name, value in values.items():
            cell = named.get(name)
            if cell is not None:
                cell.cell_contents = value

    def unbind(self) -> None:
        fast, cells = self.fast, self.cells
        for j in range(2, self.depth + 2):  # (a run leaves cells armed, or its cap's hand-over)
            cells[j].cell_contents = fast[j]
        for cell in self.named.values():
            cell.cell_contents = None


def _shape(ex) -> _Shape:
    kcall, values = shapes.call_source(ex.children, "children")
    if ex.accept is None:
        name, acall, inline = "all", None, None
    else:
        name = "acc"
        acall, more = shapes.call_source(ex.accept, "accept")
        values.update(more)
        inline = shapes.inlined(ex.accept, "accept") if shapes.INLINE else None
    depth = loops.REC_DEPTH
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
        loops.register_recursions(build, lazy=True, accept_lines=lines)
        levels = {}
        for code in build.__code__.co_consts:
            cname = getattr(code, "co_name", "")
            if cname.startswith(f"rec_{name}"):
                k = cname[len(f"rec_{name}"):].removesuffix("_poll")
                if k.isdigit() and int(k) <= depth:
                    levels[code] = int(k)
        shape = _CACHE[key] = _Shape(build, levels, depth, name)
    return shape, values


def count_loop(ex):
    """``run(it) -> count`` for ``ex`` (an Explorer counting over generator children): the
    ticked loop (module doc); ``available()`` must be True."""
    from . import engine

    shape, values = _shape(ex)
    depth, levels = shape.depth, shape.levels
    cap = max(1, min(depth, ex.rec_cap()))
    always = engine.POLL_S == 0  # (tests: poll at every level entry)
    armed_hi = 0  # cells 2 .. armed_hi may be armed
    polls = entries = 0

    def tick_poll(k: int) -> None:
        nonlocal armed_hi, polls, entries
        if always:  # every entry comes here; poll at every loops.TICK-th, as the countdown
            entries += 1
            if entries < loops.TICK:
                return
            entries = 0
        else:
            cells[k].cell_contents = fast[k]  # (first: a tick meanwhile re-arms it)
            hi, armed_hi = armed_hi, 0
            for j in range(2, hi + 1):
                cells[j].cell_contents = fast[j]
        polls += 1
        if polls >= LIVE_EVERY:
            polls = 0
            ex.seen = live()
        ex.poll(None)

    fast = slow = cells = None  # (the run's build: run())

    def arm(frame) -> None:
        """The tick: rebind the cells of levels 2 .. (the innermost level) + 1."""
        nonlocal armed_hi
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
        for j in range(2, hi + 1):
            cells[j].cell_contents = slow[j]
        if hi > armed_hi:
            armed_hi = hi

    def live() -> int:
        """Nodes of this unit so far, summed from the levels' frames (rare)."""
        n = -1  # (the first level lists the base: no node)
        for f in ex.rec_frames():
            c = f.f_locals.get("count")
            if c is not None:
                n += c & MASK
        return max(n, 0)

    def run(it):
        nonlocal fast, slow, cells, armed_hi
        ex.rec_nodes = 0
        armed_hi = 0
        b = shape.acquire({"ex": ex, "tick_poll": tick_poll, **values})
        fast, slow, cells = b.fast, b.slow, b.cells
        try:
            if cap < depth:  # level cap + 1 is the iterative loop's
                cells[cap + 1].cell_contents = fast[depth + 1]
            if always:
                for j in range(2, cap + 1):
                    cells[j].cell_contents = slow[j]
            with ticking(arm, TICK_S):
                c = fast[1](it)
        finally:
            fast = slow = cells = None
            shape.release(b)
        ex.rec_nodes = (c & MASK) - 1
        return ex.rec_nodes if ex.accept is None else c >> 64

    return run
