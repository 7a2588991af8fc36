"""Hot loops generated per model shape: the recursive loops of counting (over generator
children) and of branch and bound.

``count_loop(ex)`` returns ``run(it) -> count`` (and sets ``ex.rec_nodes``): the
recursion of ``loops.dfs_count_gen`` compiled for this search's shape, so that per
node it does what a hand-written recursion does and little else; ``bnb_loop`` does
the same for ``bnb.dfs_bnb_rec`` (and decides the sense, ``prune_level`` and
``ordered`` branches once):

- **the user's calls are direct**: ``children=functools.partial(f, a)`` becomes
  ``f(a, child)`` in the loop's source (a partial is a C call that starts a new
  interpreter frame loop; a Python function called from Python is inlined by 3.11's
  interpreter): about 10% of N-Queens' node;
- **an accept that is one expression is inlined** (``inlined``): ``return node[0] == n``
  over its own parameters (no calls, no globals, no closures), its source checked to
  compile to the function's very bytecode, becomes ``if (child[0] == accept_a0):`` in
  the loop; when the expression raises, the loop calls the function itself, so the
  error is the function's own (its frame, the node's true path).  The call was about
  8% of an N-Queens node (the reference inlines it by hand: "with calls" in
  benchmarks/bench_search.py is that 8%); a C++ skeleton gets this from its compiler;
- **no class checks**: a generator function's children are a generator, so no
  leaf/``iter()`` tests (the list-children loop keeps them);
- **the poll check is a countdown** (``tick``) at level entry; every level entry
  is one node (each child of a generator level is recursed into), so the node count
  is the entries counted per window in ``poll_rec`` -- no per-level node sum;
- **the countdown's window adapts** (``W``: 1 .. ``WMAX``, ``TICK`` at first):
  ``poll_rec`` reads the clock, doubles the window while a window takes less than
  ``POLL_S / 8`` and halves it when one takes more than ``POLL_S`` + 0.1 ms, so light
  nodes pay one ``poll_rec`` call per up to 128 nodes, heavy ones still poll on time;
- **the count loop keeps no child index** (lazy splitting): a split, a hand-over to
  the iterative loop or an error finds a level's index from its frame
  (``loops.CountLoops.lazy_level``: drain the level's iterator, count its parent's
  children again); the drained children become pending units of the task.

What stays per node of the count loop: the countdown and the depth ``d``, checked
only when the countdown runs out: a level found deeper than ``cap`` (at most ``WMAX``
levels past it) goes to the iterative loop (``Explorer._deep_level``).  The branch-and-
bound loop keeps its child index ``i`` (an improvement's path is read at once, and
``ordered=True`` needs the local order that draining levels into units would change).
The inner functions are registered like the hand-written ones
(``register_recursions``), so errors name the node and which call raised.

The branch-and-bound loop also:

- **checks values on its rare branches only**: a bound where it prunes, an objective
  where it would improve the incumbent (``BnBLoop.rec_improve``).  The tests are written
  ``if not b > lim`` (prune) and ``if not v <= lim`` (improve), so NaN, for which every
  comparison is False, takes the rare branch and is refused there; a value that cannot
  be compared or negated (None, str) raises on a line listed in its ``LoopCode.values`` and
  ``BnBLoop.rec_own_error`` turns that into number()'s TypeError naming the node.  A
  value that compares as a number and decides nothing (a bool, a Decimal) passes as
  that number; the old per-node class checks cost ~5% of a knapsack node;
- **starts a level's ``prune_level`` order check from the parent's bound** (passed down
  as ``prev``), not from ``inf``: a float ``inf`` compared with an int bound takes
  CPython's slow mixed-type path on every level's first child (~4%).  A first child above
  its parent's bound is no misorder (``rec_misordered`` lets ``i == 0`` pass);
- **reads ``operator.attrgetter("f")``/``itemgetter(k)`` inline** (``read``): a model
  whose ``bound``/``objective`` are such getters costs ``child.f`` per node, as a
  hand-written search does, instead of a call.

Each of these steps was measured against a hand-written search (knapsack strong 80,
N-Queens 13; CPU time and cachegrind instruction counts, one process): moving the
checks, getters, and dropping the child index each brought the loop closer to the
hand-written recursion (docs/benchmarks.md, "Measurements behind design choices").

Alternatives rejected: ``enumerate`` for ``i`` (a tuple per node: slower); naming a
child by comparing it (``==``) with a second listing (nodes need not compare by value;
counting the drained rest needs only the same number of children); default arguments
instead of closure cells (no faster in 3.11); a helper thread setting a poll flag (a
GIL hand-over per poll costs more than the countdown); a timer signal
(``ITIMER_VIRTUAL``) rebinding the recursion's closure cell to a polling function, so
that no node pays a countdown: a few per cent faster in a prototype, but it
needs its own node count (a ``+ 1`` per node, or counts packed into one int), polls
only every 4 ms (the virtual timer's tick; ``ITIMER_REAL`` at 0.2 ms cost 14%),
depth checks by frame walks with a large recursion headroom, a process-wide signal
handler in the main thread only, and EINTR for other threads' system calls -- left for
when the remaining ~5% decides a target; inlining more of the user's code than one
side-effect-free expression (statements, calls and globals can change meaning between
the function and our loop; ``children`` is a generator, whose body cannot be inlined
into a ``for``).
"""

from __future__ import annotations

import ast
import dataclasses
import dis
import functools
import inspect
import keyword
import math
import operator
import os
import textwrap
import time
import types

from . import polling

_CACHE: dict = {}
WMAX = 128  # the countdown's longest window (entries): a level is found at most this far past
#             ``cap`` (REC_MARGIN leaves 200 frames)
REC_MARGIN = 200  # frames the recursive loops leave free below the recursion limit
COUNT_REC_DEPTH = 64  # the recursive count loops (and ticked.py's levels) recurse at most this
#                       deep: CPython's calls slow down on deep stacks (UTS T3S, 1024 levels: a
#                       recursion slower than a loop); deeper subtrees go to the iterative loop
BNB_REC_DEPTH = 128  # the recursive branch-and-bound loop's depth at most (knapsack: ~80 deep)
INLINE_ACCEPT = "accept, inlined"  # a LoopCode.calls value: an inlined accept() with no try


@dataclasses.dataclass
class LoopCode:
    """What the rare paths (loops.py, bnb.py: splits, errors) know of one generated
    recursive function (``rec_*``) from its code object."""

    lazy: bool  # it keeps no child index (loops.CountLoops.lazy_level reads its levels)
    calls: dict = dataclasses.field(default_factory=dict)  # line -> the user call made on it
    #      ("accept", "children", "iter", "bound", "objective", or INLINE_ACCEPT)
    values: dict | None = None  # rec_bnb only: line -> ("value", "bound()", local) where a
    #      bound or objective is compared or negated; ("read", "bound", None): a read that
    #      read() inlined (bnb.BnBLoop.rec_own_error names the node)


GENERATED: dict = {}  # code object -> LoopCode: the one registry of the generated loops


def _windows() -> tuple[float, float]:
    """(fast, slow): a window that took less than ``fast`` seconds doubles, one that took
    more than ``slow`` halves -- the clock is read every ~POLL_S/8..POLL_S whatever a
    node costs (with ``POLL_S = 0``, as tests set it, the window stays at ``TICK``)."""
    return polling.POLL_S / 8, polling.POLL_S + 0.0001

_SOURCE = '''
def build(ex, clock, TICK, cap, fast, slow, {params}):
    tick = W = TICK  # the countdown and its window (poll_rec adapts it)
    entries = 0  # level entries counted in whole windows (poll_rec)
    t0 = clock()  # when the window began

    def rec_{name}(it, d):
        nonlocal tick
        if tick:
            tick -= 1
        elif poll_rec(d):  # too deep: the iterative loop lists this level
            ex._deep_level(it)
            return {zero}
        {count0}
        for child in it:
            {accept}
            {recurse}
        {ret}

    def poll_rec(d):
        nonlocal tick, entries, W, t0
        entries += W - tick + 1
        now = clock()
        if now - t0 < fast:  # light nodes: a longer window (fewer of these calls)
            if W < WMAX:
                W += W
        elif now - t0 > slow and W > 1:  # heavy nodes: a shorter one (polls on time)
            W >>= 1
        tick = W
        t0 = now
        if d > cap:  # (checked here only: at most WMAX levels past cap)
            return True
        if now >= ex.next_poll:
            ex.seen = entries
            ex.poll(None)
            t0 = clock()
        return False

    def run(it):
        try:
            {run}
        finally:  # (the first entry lists the base's children: no node)
            ex.rec_nodes = entries + W - tick - 1
        return count

    return run
'''


def call_source(fn, name: str) -> tuple[str, dict]:
    """The source of the call ``fn(child)`` and the closure values it names."""
    if (isinstance(fn, functools.partial) and not fn.keywords and len(fn.args) <= 4
            and type(fn.func) is types.FunctionType):
        args = [f"{name}_a{k}" for k in range(len(fn.args))]
        return f"{name}({', '.join(args + ['child'])})", {name: fn.func, **dict(zip(args, fn.args, strict=True))}
    return f"{name}(child)", {name: fn}


# count_loop inlines an accept() that is one ``return <expression>`` (inlined); the
# environment variable SHOAL_SEARCH_INLINE=0 (read at import, so workers inherit it) turns
# that off: benchmarks/bench_search.py --no-inline measures the loop calling accept
INLINE = os.environ.get("SHOAL_SEARCH_INLINE", "1") != "0"
_INLINE_OK = (ast.Expression, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare, ast.IfExp,
              ast.Subscript, ast.Attribute, ast.Name, ast.Constant, ast.Tuple, ast.Slice,
              ast.boolop, ast.operator, ast.unaryop, ast.cmpop, ast.expr_context)
_INLINED: dict = {}  # (code, bound arguments) -> the expression's source with our names, or None
_NOT_PLAIN = (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS | inspect.CO_GENERATOR
              | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE)


def inlined(fn, name: str) -> str | None:
    """The source of ``fn(child)`` with ``fn``'s body in place of the call, or None.

    Only for a plain function (or a ``functools.partial`` of one, as in ``call_source``) whose
    body is ``return <expression>`` over its own parameters: attribute and item reads,
    operators, comparisons, constants -- no calls, no global names, no closures, no
    defaults.  Its parameters become the loop's names (``child``, ``{name}_a0``...), so
    the expression evaluates exactly what the call would, minus the call (about 8% of an
    N-Queens node).  The source (``inspect``) must compile to the function's very
    bytecode, so an edited file or a function built at run time is never inlined from
    the wrong text.  The loop calls the function itself when the expression raises, so
    an error is the function's own, from its frame."""
    if isinstance(fn, functools.partial):
        if fn.keywords or len(fn.args) > 4 or type(fn.func) is not types.FunctionType:
            return None  # (as call_source: more bound arguments are no names in the loop)
        f, nbound = fn.func, len(fn.args)
    elif type(fn) is types.FunctionType:
        f, nbound = fn, 0
    else:
        return None
    key = (f.__code__, nbound, name)  # (the expression names the bound arguments after ``name``)
    if key not in _INLINED:
        _INLINED[key] = _expression(f, [f"{name}_a{k}" for k in range(nbound)] + ["child"])
    return _INLINED[key]


def _expression(f, names: list) -> str | None:
    code = f.__code__
    if (f.__closure__ or code.co_freevars or code.co_cellvars or f.__defaults__
            or f.__kwdefaults__ or code.co_flags & _NOT_PLAIN or code.co_kwonlyargcount
            or code.co_argcount != len(names)):
        return None
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(f)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    if len(tree.body) != 1 or type(tree.body[0]) is not ast.FunctionDef:
        return None  # (a lambda's source is its whole line)
    fd = tree.body[0]
    body = fd.body
    if body and type(body[0]) is ast.Expr and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]  # the docstring
    if fd.decorator_list or len(body) != 1 or type(body[0]) is not ast.Return or body[0].value is None:
        return None
    params = [a.arg for a in fd.args.posonlyargs + fd.args.args]
    expr = body[0].value
    for node in ast.walk(expr):
        if not isinstance(node, _INLINE_OK) or (type(node) is ast.Name and node.id not in params):
            return None
    try:  # the text must be this function's: compiled alone, the same bytecode
        mod = compile(ast.Module(body=[fd], type_ignores=[]), "<inline check>", "exec")
    except (SyntaxError, ValueError):
        return None
    inner = [c for c in mod.co_consts if isinstance(c, types.CodeType)]
    if (len(inner) != 1 or inner[0].co_code != code.co_code or inner[0].co_consts != code.co_consts
            or inner[0].co_names != code.co_names or inner[0].co_varnames != code.co_varnames):
        return None
    rename = dict(zip(params, names, strict=True))
    for node in ast.walk(expr):
        if type(node) is ast.Name:
            node.id = rename[node.id]
    return f"({ast.unparse(expr)})"


def count_loop(ex):
    """``run(it) -> count`` (nodes in ``ex.rec_nodes``) for ``ex`` (an Explorer counting over generator
    children), generated for the shape of its ``children`` and ``accept``."""
    kcall, values = call_source(ex.children, "children")
    if ex.accept is None:
        name, acall, inline = "all", None, None
    else:
        name = "acc"
        acall, more = call_source(ex.accept, "accept")
        values.update(more)
        inline = inlined(ex.accept, "accept") if INLINE else None
    key = (name, kcall, acall, inline)
    build = _CACHE.get(key)
    if build is None:
        params = ", ".join(values)
        rec = f"rec_{name}(" + kcall + ", d + 1)"
        if inline is not None:  # the user's expression; raising, the call itself (its own error)
            accept = (f"try:\n                if {inline}:\n                    count += 1\n"
                      f"            except Exception:  # (the call raises the same, from its frame)\n"
                      f"                if {acall}:\n                    count += 1")
        else:
            accept = f"if {acall}:\n                count += 1" if acall else ""
        src = _SOURCE.format(
            params=params, name=name,
            count0="count = 0" if acall else "",
            accept=accept,
            recurse=f"count += {rec}" if acall else rec,
            ret="return count" if acall else "", zero="0" if acall else "",
            run=(f"count = rec_{name}(it, 1)" if acall else
                 f"rec_{name}(it, 1)\n            count = entries + W - tick - 1"))
        ns: dict = {"WMAX": WMAX}
        exec(compile(src, f"<shoal search loop {name}: {kcall}, {acall}>", "exec"), ns)
        build = _CACHE[key] = ns["build"]
        register_recursions(build, lazy=True)
    cap = ex.rec_cap()
    return build(ex, time.perf_counter, polling.TICK, cap, *_windows(), **values)


_BNB_SOURCE = '''
def build(ex, clock, TICK, cap, fast, slow, inf, {params}):
    tick = W = TICK  # the countdown and its window (poll_rec adapts it)
    entries = 0  # level entries counted in whole windows (poll_rec)
    t0 = clock()  # when the window began
    pr = leaves = 0  # children pruned; visited children with no children
    lim, slim = ex.lim, ex.slim

    def rec_bnb(it, d{prev_arg}):
        nonlocal tick, pr, leaves, lim, slim
        i = -1  # (a poll reads it: this level is on no child yet)
        if tick:
            tick -= 1
        elif poll_rec(d):  # too deep: the iterative loop lists this level
            ex._deep_bnb_level(it)
            lim, slim = ex.lim, ex.slim
            return
        for child in it:
            i += 1
            {bget}
            {order}
            if not {kept}:  # [bound] (a NaN bound is pruned: checked here)
                {bcheck}
                pr += 1
                {cut}
            v = {ocall}
            if not {notbetter}:  # [objective] (so does a NaN or non-number objective)
                ex.rec_improve(child, v)
                lim, slim = ex.lim, ex.slim
            kids = {kcall}
            if not kids and (kids.__class__ is list or kids.__class__ is tuple):
                leaves += 1
                continue
            rec_bnb(iter(kids), d + 1{prev_pass})

    def poll_rec(d):
        nonlocal tick, entries, lim, slim, W, t0
        entries += W - tick + 1
        now = clock()
        if now - t0 < fast:  # light nodes: a longer window (fewer of these calls)
            if W < WMAX:
                W += W
        elif now - t0 > slow and W > 1:  # heavy nodes: a shorter one (polls on time)
            W >>= 1
        tick = W
        t0 = now
        if d > cap:  # (checked here only: at most WMAX levels past cap)
            return True
        if now >= ex.next_poll:
            ex.seen = entries + leaves
            ex.poll(None)
            lim, slim = ex.lim, ex.slim
            t0 = clock()
        return False

    def run(it):
        try:
            rec_bnb(it, 1{prev_top})
        finally:  # a visited node has children (an entry: the first lists the base's) or none
            ex.rec_nodes, ex.rec_pruned = entries + W - tick - 1 + leaves, pr

    return run
'''


def read(fn, name: str) -> tuple[str, dict, bool]:
    """``call_source``, except that ``operator.attrgetter("a")``/``itemgetter(k)`` of one plain key
    become ``child.a``/``child[k]`` in the loop's source (what they do, without the call), and
    so does a function whose body is one expression over its parameters (``inlined``:
    ``def value(node): return node.value``); the bool says the source is such a read."""
    if type(fn) is operator.attrgetter:
        key, *more = fn.__reduce__()[1]
        if not more and all(p.isidentifier() and not keyword.iskeyword(p) for p in key.split(".")):
            return f"child.{key}", {}, True
    elif type(fn) is operator.itemgetter:
        key, *more = fn.__reduce__()[1]
        if not more and type(key) in (int, str):
            return f"child[{key!r}]", {}, True
    src, values = call_source(fn, name)
    expr = inlined(fn, name) if INLINE else None
    return (src, values, False) if expr is None else (expr, values, True)


def bnb_loop(ex, cap: int):
    """``run(it)`` (nodes and pruned in ``ex.rec_nodes``/``ex.rec_pruned``): the recursive
    branch-and-bound loop (bnb.py) generated for this search: direct calls, and the
    sense (``negate``), ``prune_level`` and ``ordered`` branches decided once."""
    spec = ex.spec
    values: dict = {}
    bcall, more, bread = read(ex.bound, "bound")
    values.update(more)
    ocall, more, oread = read(ex.objective, "objective")
    values.update(more)
    kcall, more = call_source(ex.children, "children")
    values.update(more)
    pl, neg, ordered = bool(spec.prune_level), bool(spec.negate), bool(spec.ordered)
    key = ("bnb", bcall, ocall, kcall, pl, neg, ordered)
    build = _CACHE.get(key)
    if build is None:
        b = "b0" if neg else "b"  # the value bound() returned
        src = _BNB_SOURCE.format(
            params=", ".join(values), ocall=ocall, kcall=kcall,
            bget=(f"b0 = {bcall}\n            b = -b0  # [bound]" if neg else f"b = {bcall}"),
            # prune_level: the promise it rests on (best bound first), checked where cheap;
            # a level starts from its parent's bound (a number of the same kind: an int
            # compared with an int; a first child above it is no misorder: rec_misordered)
            order=("if b > prev:  # [bound]\n                ex.rec_misordered(i, b, prev)\n"
                   "            prev = b") if pl else "",
            prev_arg=", prev" if pl else "", prev_pass=", b" if pl else "",
            prev_top=", inf" if pl else "",
            # kept and better are written so that NaN (every comparison False) takes the
            # rare branch, where the value is checked; unordered, lim == slim (engine._limits)
            kept="(b > lim and b >= slim)" if ordered else "b > lim",
            bcheck=(f"if {b}.__class__ is not int and ({b}.__class__ is not float or {b} != {b}):\n"
                    f"                    ex.rec_number({b}, \"bound()\", child)"),
            cut="break  # the rest of the level is pruned too" if pl else "continue",
            notbetter=((f"({'-v' if neg else 'v'} <= lim or {'-v' if neg else 'v'} < slim)")
                       if ordered else f"{'-v' if neg else 'v'} <= lim"))
        ns: dict = {"WMAX": WMAX}
        exec(compile(src, f"<shoal search loop bnb: {bcall}, {ocall}, {kcall}>", "exec"), ns)
        build = _CACHE[key] = ns["build"]
        register_recursions(build)
        rec = next(c for c in build.__code__.co_consts if getattr(c, "co_name", "") == "rec_bnb")
        lines = GENERATED[rec].values = {}
        for n, line in enumerate(src.splitlines(), 1):
            for what, local in (("bound", b), ("objective", "v")):
                if f"# [{what}]" in line:
                    lines[n] = ("value", f"{what}()", local)
            # an inlined read has no call for register_recursions to find
            if line.strip() == f"{b} = {bcall}" and bread:
                lines[n] = ("read", "bound", None)
            elif line.strip() == f"v = {ocall}" and oread:
                lines[n] = ("read", "objective", None)
    return build(ex, time.perf_counter, polling.TICK, cap, *_windows(), math.inf, **values)


def register_recursions(*loops, lazy: bool = False, accept_lines=()) -> None:
    """Note the inner recursive functions of the generated ``loops`` (their ``rec_*`` functions), and which
    user call each of their lines makes (``rec_frames``, ``rec_error``); ``lazy``: loops
    that keep no child index (``lazy_level``); ``accept_lines``: lines that evaluate an
    inlined ``accept`` with no ``try`` around it (``INLINE_ACCEPT``, ticked.py)."""
    for f in loops:
        for code in f.__code__.co_consts:
            if getattr(code, "co_name", "").startswith("rec_"):
                calls = GENERATED.setdefault(code, LoopCode(lazy=lazy)).calls
                for _, line in dis.findlinestarts(code):
                    if line in accept_lines:
                        calls[line] = INLINE_ACCEPT
                for ins in dis.get_instructions(code):
                    if (ins.argval in ("accept", "children", "iter", "bound", "objective")
                            and ins.opname in ("LOAD_DEREF", "LOAD_GLOBAL", "LOAD_FAST")
                            and ins.positions.lineno):
                        calls[ins.positions.lineno] = ins.argval
