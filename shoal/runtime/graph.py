"""The task graph: the one walk that finds, collects and substitutes futures in arguments.

A ``shoal.Future`` passed to ``submit``/``spawn`` is a *dependency*: the task
runs once it is done, with its value in its place.  Every backend and the
worker loop ask the same three questions of a task's arguments, and they must
agree exactly, or a task is held for a future nobody registered (the hang of
issue 11, item 8: detection looked 4 containers deep, collection 5):

* ``has_futures(obj)``: is there a Future anywhere in ``obj``?
* ``collect_futures(obj)``: which ones (each once, in walk order)?
* ``substitute(obj, value_of)``: ``obj`` with each Future ``f`` replaced by
  ``value_of(f)``.

What is walked (the way dask traverses task arguments): the exact built-in
container types ``list``, ``tuple``, ``dict`` (its *values*; keys are opaque),
``set`` and ``frozenset``, at any depth.  Everything else is **opaque**: a
Future inside a subclass (a namedtuple, an ``OrderedDict``), an object's
attributes, a dict key or a numpy object array is not a dependency (and
cannot be pickled, so the task fails with ``SerializationError`` rather than
hanging).

Invariants: the walks are cycle-safe (a container is visited once, so shared
and self-referencing structures terminate, and a shared sub-list is walked
once: no exponential blow-up on DAG-shaped arguments); detection and
collection are iterative (no depth limit); substitution rebuilds only the
containers that hold a Future (the others are passed through as they are) and
keeps cycles (like ``copy.deepcopy``'s memo).  Substitution recurses, so
arguments nested deeper than the interpreter's recursion limit fail with a
RecursionError (pickle could not carry them anyway).

``when_done(deps, fn)`` runs ``fn()`` once every dependency is done.  Chained
settles run **iteratively**: a future finished inside another future's
done-callback only queues its dependents, and the outermost settle drains the
queue (a per-thread trampoline).  Rejected: settling dependents from nested
done-callbacks (a failed chain of 1,000 links recursed 1,000 callbacks deep,
hit the recursion limit inside concurrent.futures' callback logging, and
left the rest of the chain pending forever).
"""

from __future__ import annotations

import logging
import threading
from collections import deque

from .future import Future

ATOMIC = frozenset((int, float, str, bytes, bool, type(None), complex))
CONTAINERS = frozenset((list, tuple, dict, set, frozenset))
_log = logging.getLogger("shoal.runtime")


def _items(obj):
    return obj.values() if type(obj) is dict else obj


def has_futures(obj) -> bool:
    """Whether ``obj`` holds a shoal Future anywhere a dependency may be (see module doc).

    Runs on every submit/spawn with arguments (the spawn hot path): the first
    levels are scanned without any bookkeeping (``_shallow``), atomic items are
    skipped without a call, so a list of a million numbers costs milliseconds;
    only what lies deeper gets the cycle-safe walk.
    """
    if type(obj) not in CONTAINERS:
        return isinstance(obj, Future)
    found = _shallow(obj, 0)
    return _deep(obj) if found is None else found


def _shallow(obj, depth: int):
    """True/False, or None when containers below ``_SHALLOW`` levels were not looked at."""
    deeper = False
    for x in (obj.values() if type(obj) is dict else obj):
        tx = type(x)
        if tx in ATOMIC:
            continue
        if tx in CONTAINERS:
            if depth >= _SHALLOW:
                deeper = True
                continue
            found = _shallow(x, depth + 1)
            if found:
                return True
            if found is None:
                deeper = True
        elif isinstance(x, Future):
            return True
    return None if deeper else False


_SHALLOW = 2  # levels below the top scanned without bookkeeping (a cycle there costs a rescan)


def _deep(obj) -> bool:
    atomic, containers = ATOMIC, CONTAINERS
    stack = [obj]
    seen = {id(obj)}
    while stack:
        for x in _items(stack.pop()):
            tx = type(x)
            if tx in atomic:
                continue
            if tx in containers:
                if id(x) not in seen:
                    seen.add(id(x))
                    stack.append(x)
            elif isinstance(x, Future):
                return True
    return False


def any_future(values) -> bool:
    """``has_futures`` over an iterable of arguments (args, or kwargs.values())."""
    atomic = ATOMIC
    for v in values:
        if type(v) not in atomic and has_futures(v):
            return True
    return False


def collect_futures(obj) -> list:
    """The Futures in ``obj``, each once, in depth-first walk order."""
    out: list = []
    found: set[int] = set()
    atomic, containers = ATOMIC, CONTAINERS
    stack = [obj]
    seen: set[int] = set()
    while stack:
        x = stack.pop()
        tx = type(x)
        if tx in atomic:
            continue
        if tx in containers:
            if id(x) not in seen:
                seen.add(id(x))
                items = list(_items(x))
                items.reverse()  # so the stack pops them in order
                stack.extend(items)
        elif isinstance(x, Future) and id(x) not in found:
            found.add(id(x))
            out.append(x)
    return out


def substitute(obj, value_of, *, sets_as_dicts: bool = False):
    """``obj`` with every Future ``f`` in it replaced by ``value_of(f)`` (see module doc).

    ``sets_as_dicts``: a set or frozenset that held a Future becomes a tagged dict
    (``unpack_sets`` turns it back), for carriers that walk only lists, tuples and
    dicts (dask finds its futures there, not in sets)."""
    if type(obj) not in CONTAINERS:
        return value_of(obj) if isinstance(obj, Future) else obj
    if not has_futures(obj):
        return obj
    return _substitute(obj, value_of, {}, sets_as_dicts)


SET_TAG = "__shoal_set__"


def unpack_sets(obj):
    """Undo ``substitute(..., sets_as_dicts=True)`` on the values (the receiving side)."""
    t = type(obj)
    if t is dict:
        kind = obj.get(SET_TAG) if len(obj) == 2 else None
        if kind in ("set", "frozenset") and "items" in obj:
            return (set if kind == "set" else frozenset)(unpack_sets(x) for x in obj["items"])
        return {k: unpack_sets(v) for k, v in obj.items()}
    if t is list or t is tuple:
        return t(unpack_sets(x) for x in obj)
    return obj


def _substitute(obj, value_of, memo: dict, sets_as_dicts: bool = False):
    t = type(obj)
    if t in ATOMIC:
        return obj
    if t not in CONTAINERS:
        return value_of(obj) if isinstance(obj, Future) else obj
    key = id(obj)
    if key in memo:
        return memo[key]
    if t is list:
        new = memo[key] = []
        new.extend(_substitute(x, value_of, memo, sets_as_dicts) for x in obj)
        return new
    if t is dict:
        new = memo[key] = {}
        for k, v in obj.items():
            new[k] = _substitute(v, value_of, memo, sets_as_dicts)
        return new
    # tuple, set, frozenset: immutable or unable to hold themselves (their members are
    # hashable, so a cycle through them passes a list or dict, which the memo breaks)
    items = [_substitute(x, value_of, memo, sets_as_dicts) for x in obj]
    if sets_as_dicts and t is not tuple:
        new = {SET_TAG: t.__name__, "items": items}
    else:
        new = t(items)
    memo[key] = new
    return new


def resolve(obj):
    """``obj`` with each Future replaced by its result (waits; the first error propagates)."""
    return substitute(obj, Future.result)


# -- settling dependents iteratively ----------------------------------------------------

_tls = threading.local()


def trampoline(fn) -> None:
    """Run ``fn()`` now, or, when called from inside another ``trampoline`` call on this
    thread, queue it for the outermost one: chains of settles never nest."""
    queue = getattr(_tls, "queue", None)
    if queue is not None:
        queue.append(fn)
        return
    _tls.queue = queue = deque((fn,))
    try:
        while queue:
            f = queue.popleft()
            try:
                f()
            except BaseException:  # noqa: BLE001 - one dependent's failure must not strand the rest
                _log.exception("shoal: settling a dependent task failed")
    finally:
        _tls.queue = None


def when_done(deps: list, fn) -> None:
    """Call ``fn()`` (through ``trampoline``) once every future in ``deps`` is done."""
    if not deps:
        trampoline(fn)
        return
    remaining = [len(deps)]
    lock = threading.Lock()

    def on_done(_dep) -> None:
        with lock:
            remaining[0] -= 1
            if remaining[0]:
                return
        trampoline(fn)

    for d in deps:
        d.add_done_callback(on_done)


def failed_dependency(deps: list):
    """The first error among done ``deps`` (a CancelledError for a cancelled one), or None."""
    import concurrent.futures as cf

    for d in deps:
        if d.cancelled():
            return cf.CancelledError(f"a dependency ({d!r}) was cancelled")
        exc = d.exception()
        if exc is not None:
            return exc
    return None
