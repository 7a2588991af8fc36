"""A driver process for the checkpoint tests: run one checkpointed search and write its
result as JSON; the tests SIGKILL it mid-search and run it again with the same arguments.

    python checkpoint_driver.py APP SIZE CHECKPOINT OUT [DASK_ADDRESS]

APP: ``queens`` (backtracking.count of N-Queens SIZE), ``clique`` (branch_and_bound.maximise,
``ordered=True``, of a max clique of G(SIZE, 0.8) with the example's MCQ children), ``find``
(backtracking.find of a clique of the clique number of that graph, through objective/target/
bound: a hit at the end of the search).
"""

from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)  # before any worker starts (workers inherit sys.path)
if os.path.join(ROOT, "examples") not in sys.path:  # last: examples/dask_cluster.py
    sys.path.append(os.path.join(ROOT, "examples"))  # must not shadow tests/ when imported

import search_maxclique as mc  # noqa: E402
import search_nqueens as nq  # noqa: E402

import shoal  # noqa: E402
from shoal.patterns import backtracking  # noqa: E402

INTERVAL_S = 0.05


def graph(n: int, p: float = 0.8, seed: int = 15) -> mc.Graph:
    """G(n, p), renumbered by non-increasing degree as read_dimacs does."""
    import random

    rng = random.Random(seed)
    edges = [(u, v) for u in range(n) for v in range(u + 1, n) if rng.random() < p]
    deg = [0] * n
    for u, v in edges:
        deg[u] += 1
        deg[v] += 1
    order = sorted(range(n), key=lambda v: -deg[v])
    new = {v: i for i, v in enumerate(order)}
    adj = [0] * n
    for u, v in edges:
        adj[new[u]] |= 1 << new[v]
        adj[new[v]] |= 1 << new[u]
    return mc.Graph(n, tuple(adj), tuple(v + 1 for v in order))


def run(pilot, app: str, size: int, checkpoint) -> dict:
    kw = {} if checkpoint is None else dict(checkpoint=checkpoint, checkpoint_interval=INTERVAL_S)
    if app == "queens":
        r = nq.count_queens(pilot, size, stats=True, **kw)
        return {"value": int(r), "nodes": r.stats.nodes}
    g = graph(size)
    if app == "clique":
        r = mc.max_clique(pilot, g, ordered=True, stats=True, **kw)
        return {"value": r.value, "path": list(r.path), "clique": r.node.clique,
                "nodes": r.stats.nodes}
    if app == "find":
        import functools

        omega = int(sys.argv[6])
        node = backtracking.find(pilot, mc.root(g), functools.partial(mc.children, g),
                                 objective=mc.size, target=omega, bound=mc.bound, **kw)
        return {"value": None if node is None else node.size,
                "clique": None if node is None else node.clique}
    raise SystemExit(f"unknown app {app!r}")


def main() -> None:
    app, size, checkpoint, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    address = sys.argv[5] if len(sys.argv) > 5 and sys.argv[5] != "-" else None
    resumed = os.path.exists(checkpoint)
    pilot = (shoal.Pilot(2) if address is None
             else shoal.Pilot(backend="dask", address=address, workers=1,
                              # a killed driver's node runtimes go after this long idle
                              idle_timeout=float(os.environ.get("SHOAL_TEST_IDLE_TIMEOUT", 600))))
    with pilot:
        res = run(pilot, app, size, checkpoint)
    res["resumed"] = resumed
    res["checkpoint_left"] = os.path.exists(checkpoint)
    with open(out + ".tmp", "w") as f:
        json.dump(res, f)
    os.replace(out + ".tmp", out)


if __name__ == "__main__":
    main()
