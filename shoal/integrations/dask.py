"""A dask scheduler on a shoal pilot: ``dask.compute(x, scheduler=pilot.get)``.

Data flow: ``get(pilot, dsk, keys)`` converts the graph to dask's task spec
(``convert_legacy_graph``), walks it once in dependency order, and submits each
task node as one shoal task whose arguments are the node and a dict of its
dependencies' *futures*, so shoal holds the whole graph at once: a node is sent
to a worker the moment its inputs are done, never after a scheduler round trip,
and independent nodes run on all workers.  Data nodes (literals in the graph)
are passed as values, never submitted.  The requested keys' futures are then
waited for and packed into ``keys``' nesting.

``dask.compute(x, scheduler=pilot)`` works as well, without this module: a
pilot is a ``concurrent.futures.Executor``, and dask runs its own threaded
scheduler loop over ``pilot.submit`` (``dask.local.get_async``), a round trip
through the driver per ready batch.

Errors: the first failing node's exception (with the worker's traceback as
``__cause__``) is raised by ``get``; nodes that depend on it fail with the same
exception and are not run; other in-flight nodes are cancelled.

Where results live: on the local backend the whole culled graph travels as
*one* task (``_run_graph``).  On a worker it spawns every node whose inputs are
done as a child task (``shoal.spawn``; idle workers steal them), counts down
the dependents as children finish, and returns only the requested keys'
values.  So an intermediate result goes from the worker that made it to the one
that needs it (a stolen child's result returns to the graph's worker over the
peer rings) and never through the driver; it is dropped as soon as its last
dependent has started.  On the dask backend each node is one shoal task with
its dependencies' futures as arguments, which that backend resolves on its
workers.

Rejected: dask's ``get_async`` loop for ``pilot.get`` (one driver-side scheduling
step per finished task); fusing the graph first (dask's optimisations already
ran in ``dask.compute`` before ``get`` is called); on the local backend, one
driver task per node (a dependency's value then went worker -> driver ->
worker, since that backend resolves futures among arguments in the driver);
spawning every node at once with its dependencies' futures as arguments (a
child with future arguments is pinned to the worker that spawned it, so every
inner node of the graph would run on that one worker).
"""

from __future__ import annotations

import types


def _run_node(node, deps: dict):
    """One dask task node on a shoal worker: ``deps`` maps dependency keys to their values."""
    return node(deps)


_runners: dict = {}  # task function -> its runner (one per function for the program's life)


def _runner_of(func):
    """A function that runs nodes of ``func`` (shoal sends it once per worker, then caches it),
    so a node travels without its function: a ``__main__`` function would otherwise be
    pickled by value into every node."""
    runner = _runners.get(func)
    if runner is None:
        def run_node(shell, deps):
            shell.func = func
            return shell(deps)

        run_node.__qualname__ = f"dask[{getattr(func, '__qualname__', type(func).__name__)}]"
        runner = _runners[func] = run_node
    return runner


def _plain(node, Task):
    """``node`` as ``(runner, shell)`` when its function can travel once, else None."""
    if type(node) is not Task or not isinstance(node.func, (types.FunctionType, types.BuiltinFunctionType)):
        return None
    try:
        runner = _runner_of(node.func)
    except TypeError:  # an unhashable callable
        return None
    shell = Task(node.key, _placeholder, *node.args, **node.kwargs)
    shell.func = None
    return runner, shell


def _placeholder(*args, **kwargs):  # pragma: no cover - replaced before any call
    raise RuntimeError("a dask node ran without its function")


def get(pilot, dsk, keys, **kwargs):
    """dask's ``get(dsk, keys, **kwargs)`` protocol, running every task on ``pilot``.

    Extra keyword arguments dask's schedulers take (``num_workers``, ``pool``,
    ...) are accepted and ignored: the pilot's workers are what runs.
    """
    from collections.abc import Mapping

    try:
        from dask._task_spec import DataNode, Task, convert_legacy_graph
    except ImportError as exc:  # pragma: no cover - depends on the installed dask
        raise ImportError("pilot.get needs dask >= 2024.12 (its task spec); use "
                          "dask.compute(..., scheduler=pilot) with an older dask") from exc

    if not isinstance(dsk, Mapping):  # a dask expression or collection
        dsk = _unculled(dsk) or dsk.__dask_graph__()
    graph = convert_legacy_graph(dsk)
    wanted = list(_flatten(keys))
    if _on_local_workers(pilot):
        order = _order(graph, wanted)
        values = {}
        tasks = []
        for key in order:
            node = graph[key]
            if isinstance(node, DataNode):
                values[key] = node.value
            else:
                tasks.append((key, node))
        results = dict(zip(wanted, pilot.submit(_run_graph, tasks, values, wanted).result(), strict=True))
        return _pack(keys, results)
    futures: dict = {}
    values: dict = {}
    submit = pilot.submit
    try:
        for key in _order(graph, wanted):
            node = graph[key]
            if isinstance(node, DataNode):
                values[key] = node.value
                continue
            deps = {}
            for dep in node.dependencies:
                deps[dep] = futures[dep] if dep in futures else values[dep]
            plain = _plain(node, Task)
            if plain is not None:
                futures[key] = submit(plain[0], plain[1], deps)
            else:
                futures[key] = submit(_run_node, node, deps)
        results = {}
        for key in wanted:
            if key in futures:
                results[key] = futures[key].result()
            else:
                results[key] = values[key]
    except BaseException:
        for fut in futures.values():
            fut.cancel()
        raise
    return _pack(keys, results)


def _on_local_workers(pilot) -> bool:
    """Whether ``pilot``'s tasks may spawn children that other workers steal (the local
    backend); on dask each node goes as its own task (see the module docstring)."""
    from shoal import BackendKind

    return pilot.backend is BackendKind.LOCAL


def _run_graph(tasks: list, values: dict, wanted: list) -> list:
    """Run a culled dask graph inside a task: ``tasks`` is ``[(key, node)]`` in dependency
    order, ``values`` the data nodes; returns the values of ``wanted``.

    Every node whose inputs are done is spawned (``shoal.spawn``) with those inputs'
    values; a done-callback counts down its dependents, and this task waits (running
    or stealing other tasks meanwhile: a help-first join) until a new node is ready.
    The first failing node's exception is raised; nodes not yet started are cancelled.
    """
    from collections import deque

    from shoal import Future, spawn

    nodes = dict(tasks)
    pending: dict = {}  # key -> inputs not yet done
    dependents: dict = {}  # key -> keys that need it
    uses: dict = {}  # key -> dependents not yet started (its value is freed at 0)
    ready: deque = deque()
    for key, node in tasks:
        deps = [d for d in node.dependencies if d in nodes]
        pending[key] = len(deps)
        for d in deps:
            dependents.setdefault(d, []).append(key)
            uses[d] = uses.get(d, 0) + 1
        if not deps:
            ready.append(key)
    keep = set(wanted)
    left = len(tasks)
    failed: list = []
    running: dict = {}
    wake = None

    def done(key, fut):
        nonlocal left
        left -= 1
        running.pop(key, None)
        exc = fut.exception() if not fut.cancelled() else None
        if fut.cancelled():
            return
        if exc is not None:
            failed.append(exc)
        else:
            values[key] = fut.result()
            for k in dependents.get(key, ()):
                pending[k] -= 1
                if not pending[k]:
                    ready.append(k)
        if wake is not None and not wake.done():
            wake.set_result(None)

    while left and not failed:
        while ready and not failed:
            key = ready.popleft()
            node = nodes[key]
            deps = {}
            for d in node.dependencies:
                deps[d] = values[d]
                if d in uses:
                    uses[d] -= 1
                    if not uses[d] and d not in keep:
                        del values[d]  # its last dependent has it now
            fut = running[key] = spawn(node, deps)
            fut.add_done_callback(lambda f, key=key: done(key, f))
        if left and not failed and not ready:
            wake = Future()
            wake.result()  # help-first: runs and steals tasks until a callback wakes us
            wake = None
    if failed:
        for fut in list(running.values()):
            fut.cancel()
        raise failed[0]
    return [values[k] for k in wanted]


def _unculled(expr):
    """The graph of ``delayed`` collections without dask's cull, or None.

    ``dask.delayed.optimize`` only culls (unless ``optimization.fuse.delayed``
    is set), and dask's per-layer cull is quadratic in the number of layers
    (0.7 s of a 2,000-node ``delayed`` graph, more than running it); the walk in
    ``get`` visits only what the wanted keys need, which is the same cull.  Any
    other optimiser (dask.array's fusion, ...) runs as dask wants: None."""
    try:
        import dask
        from dask._expr import HLGExpr, _HLGExprSequence
        from dask.delayed import optimize as delayed_optimize
        from dask.highlevelgraph import HighLevelGraph
        from dask.utils import ensure_dict
    except ImportError:  # pragma: no cover - another dask version: take the general path
        return None
    if type(expr) is not _HLGExprSequence or dask.config.get("optimization.fuse.delayed", False):
        return None
    ops = expr.operands
    if not ops or not all(isinstance(op, HLGExpr) and op.low_level_optimizer is delayed_optimize
                          for op in ops):
        return None
    return ensure_dict(HighLevelGraph.merge(*[op.hlg for op in ops]))


def _order(graph, wanted) -> list:
    """The keys ``wanted`` needs, dependencies first (iterative DFS: no recursion limit)."""
    order, state = [], {}
    for root in wanted:
        if root in state:
            continue
        stack = [(root, False)]
        while stack:
            key, expanded = stack.pop()
            if expanded:
                state[key] = 2
                order.append(key)
                continue
            if state.get(key):
                continue
            if key not in graph:
                raise KeyError(f"dask graph has no task {key!r}")
            state[key] = 1
            stack.append((key, True))
            for dep in graph[key].dependencies:
                if not state.get(dep):
                    stack.append((dep, False))
    return order


def _flatten(keys):
    if isinstance(keys, list):
        for k in keys:
            yield from _flatten(k)
    else:
        yield keys


def _pack(keys, results):
    """``keys``' nesting, lists as tuples (what dask's own ``get`` functions return)."""
    if isinstance(keys, list):
        return tuple(_pack(k, results) for k in keys)
    return results[keys]


__all__ = ["get"]
