"""The search engine behind ``backtracking`` and ``branch_and_bound`` (their public entry
points are those two modules; this package is how they work).

Module map, in import order (a module imports only modules above it in this list;
tests/test_layers.py checks that no module of the package imports another round a
cycle, also from inside a function)::

    model.py       options, SearchSpec (what a task is given), Tally (what it returns),
                   SearchStats (what the user gets); checks of user values; paths
    control.py     what a running search shares: the Control array, the StopFlag
    polling.py     when a running task looks up from its loop: the polling protocol (its
                   states), its constants (POLL_S, TICK, TICK_S) and the split policy
    room.py        in_room: the hot loops run from a frame-stack chunk of their own
    shapes.py      the recursive hot loops, generated per search shape (direct calls),
                   their recursion depths and the registry of their code objects
    ticked.py      the count loop with polls armed by a tick (shoal._tick), not counted down
    loops.py       the depth-first hot loops (count, generic) and their shared helpers
    bnb.py         the branch-and-bound hot loops
    engine.py      Explorer (one task's search: visit, poll, split, join) and the task
    multinode.py   several machines: the top split (the runtime balances the rest)
    checkpoint.py  checkpointed frontiers: driver-side chunks that survive a SIGKILL
    driver.py      the driver's side: validate, submit, wait, progress, SearchStats

The depth-first loops, by goal: counting over generator children runs ticked.py's loop
(where the native ticker runs) or shapes.py's countdown recursion; other counting runs
``loops.dfs_count``; enumeration and decision run the generic loop (``loops._dfs``);
optimisation runs shapes.py's recursion or ``bnb.dfs_bnb`` (per-depth statistics, the
BUDGET coordination, and subtrees deeper than the recursions go).  Beyond these modules
the package uses only ``shoal``'s public API and leaf modules (``shoal._room``,
``shoal._tick``) and ``shoal.patterns._portable``, ``shoal.patterns._progress``.
"""

from .model import Coordination, SearchError, SearchStats

__all__ = ["Coordination", "SearchError", "SearchStats"]
