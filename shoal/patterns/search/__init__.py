"""The search engine behind ``backtracking`` and ``branch_and_bound`` (their public entry
points are those two modules; this package is how they work).

Layout, by role::

    model.py       options, SearchSpec (what a task is given), Tally (what it returns),
                   SearchStats (what the user gets); checks of user values; paths
    control.py     what a running search shares: the Control array, the StopFlag
    engine.py      Explorer (one task's search: visit, poll, split, join) and the task
    room.py        in_room: the hot loops run from a frame-stack chunk of their own
    shapes.py      the recursive hot loops, generated per search shape (direct calls)
    ticked.py      the count loop with polls armed by a tick (shoal._tick), not counted down
    loops.py       the depth-first hot loops (count, generic) and their shared helpers
    bnb.py         the branch-and-bound hot loop
    driver.py      the driver's side: validate, submit, wait, progress, SearchStats
    multinode.py   several machines: the top split (the runtime balances the rest)
    checkpoint.py  checkpointed frontiers: driver-side chunks that survive a SIGKILL

Imports go down this list's dependency order: model <- control <- room/shapes <-
ticked <- loops/bnb <- engine <- multinode/checkpoint <- driver; only ``shoal``'s public
API and leaf modules below that (shapes.py imports loops lazily, when it registers a
generated loop; ticked.py imports loops, which imports it back for ``dfs_count_gen``).
"""

from .model import Coordination, SearchError, SearchStats

__all__ = ["Coordination", "SearchError", "SearchStats"]
