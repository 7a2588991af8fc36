"""Search apps for the skeleton tests across backends (module-level, so dask workers and
shoal workers import them by name: the test clusters put this directory on PYTHONPATH)."""

from __future__ import annotations

import random

OEIS_A000170 = {4: 2, 5: 10, 6: 4, 7: 40, 8: 92, 9: 352, 10: 724}


def queens(n: int, node: tuple):
    """Children of a partial placement (one queen per row, columns in ``node``)."""
    r = len(node)
    if r == n:
        return
    for c in range(n):
        if all(c != x and abs(c - x) != r - i for i, x in enumerate(node)):
            yield node + (c,)


def placed(n: int, node: tuple) -> bool:
    return len(node) == n


def knapsack_instance(seed: int, n: int = 24):
    """(items sorted by value/weight, capacity): weakly correlated, a seeded RNG."""
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        w = rng.randint(5, 40)
        items.append((w, max(1, w + rng.randint(-5, 5))))
    items.sort(key=lambda it: it[1] / it[0], reverse=True)
    return tuple(items), sum(w for w, _ in items) // 2


def knapsack_dp(items, cap: int) -> int:
    best = [0] * (cap + 1)
    for w, v in items:
        for c in range(cap, w - 1, -1):
            best[c] = max(best[c], best[c - w] + v)
    return best[cap]


class Knapsack:
    """A 0/1 knapsack as a search: node = (next item, weight, value); take first, then skip."""

    def __init__(self, items, cap: int):
        self.items, self.cap = items, cap

    def children(self, node):
        i, w, v = node
        if i == len(self.items):
            return []
        iw, iv = self.items[i]
        kids = [(i + 1, w + iw, v + iv)] if w + iw <= self.cap else []
        kids.append((i + 1, w, v))
        return kids

    def objective(self, node):
        return node[2]

    def bound(self, node):
        """Dantzig's fractional bound (items are sorted by value/weight)."""
        i, w, v = node
        room = self.cap - w
        for iw, iv in self.items[i:]:
            if iw <= room:
                room -= iw
                v += iv
            else:
                return v + iv * room / iw
        return v

    def cost(self, node):  # for minimise: the value left out
        return -node[2]

    def cost_bound(self, node):
        return -self.bound(node)


def needle(node):
    """A tree where DFS meets the goal early, but every other subtree never ends:
    root ("r", 0) -> 8 children; child 0 leads to the goal at depth 6, the others are
    binary trees 60 levels deep (2**60 nodes: only a stop ends them)."""
    kind, depth = node
    if kind == "r":
        return [("g", 1)] + [("x", 1)] * 7
    if kind == "g":
        return [("g", depth + 1)] if depth < 6 else []
    return [("x", depth + 1), ("x", depth + 1)] if depth < 60 else []


def is_needle(node) -> bool:
    return node == ("g", 6)


def bad_children(node):
    if len(node) == 2:
        raise ValueError("no children here")
    return [node + (i,) for i in range(3)]


def lopsided(node):
    """40 subtrees under the root: the first a complete binary tree 21 levels deep
    (2**21 - 1 nodes, about a second of work), the others single nodes -- one machine
    gets nearly all the work unless subtrees move between machines."""
    if node == ():
        return [(i,) for i in range(40)]
    if node[0] != 0 or len(node) > 20:
        return []
    return [node + (0,), node + (1,)]


LOPSIDED_NODES = 1 + 40 + (2 ** 21 - 2)


def replica_value(cell) -> float:
    """(client.run) The cell as unpickled in a dask worker process: that node's replica."""
    return cell.value


def write_worker_slot(cell, value) -> None:
    """(client.run) What a shoal worker's offer() does on that node."""
    cell._slots.array[1] = value



# -- a user's spawn program whose tasks carry pilot-level shared objects -------------------


def spin_until(flag, per_node, limit_s: float = 60.0) -> str:
    """A leaf: counts itself in its machine's ``per_node`` array (row = its shoal worker),
    then waits for ``flag`` (a ``BestCell.for_pilot``) to rise; "stopped" or "timeout"."""
    import time

    import shoal

    w = shoal.current_worker()
    per_node.array[w.id % len(per_node.array), 0] += 1
    end = time.monotonic() + limit_s
    while flag.value <= 0:
        if time.monotonic() > end:
            return "timeout"
        time.sleep(0.001)
    return "stopped"


def spinners(flag, per_node, n: int) -> list[str]:
    """Spawn ``n`` leaves that each wait for ``flag``; what they saw."""
    import shoal

    futs = [shoal.spawn(spin_until, flag, per_node) for _ in range(n)]
    return [f.result() for f in futs]


def node_rows(per_node) -> int:
    """(client.run) How many leaves this machine's copy of ``per_node`` counted."""
    return int(per_node.array[:, 0].sum())


# -- maximum clique (a DIMACS graph; bitsets; greedy-colouring bound, as examples/) ----------


def read_dimacs(path) -> tuple:
    """Adjacency bitsets of a DIMACS ``.clq`` file (vertices renumbered from 0)."""
    n, adj = 0, []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if parts and parts[0] == "p":
                n = int(parts[2])
                adj = [0] * n
            elif parts and parts[0] == "e":
                u, v = int(parts[1]) - 1, int(parts[2]) - 1
                adj[u] |= 1 << v
                adj[v] |= 1 << u
    return tuple(adj)


def clique_root(adj) -> tuple:
    return (0, 0, (1 << len(adj)) - 1, len(adj))  # (size, clique, candidates, bound)


def clique_children(adj, node):
    """Greedy-colour the candidates; children highest colour first (bound non-increasing)."""
    size, clique, p, _ = node
    order, colour, uncoloured = [], 0, p
    while uncoloured:
        colour += 1
        q = uncoloured
        while q:
            bit = q & -q
            v = bit.bit_length() - 1
            q &= ~adj[v] & ~bit
            uncoloured &= ~bit
            order.append((bit, v, colour))
    for bit, v, c in reversed(order):
        yield (size + 1, clique | bit, p & adj[v], size + c)
        p &= ~bit


def clique_size(node) -> int:
    return node[0]


def clique_bound(node) -> int:
    return node[3]


def is_clique(adj, clique: int) -> bool:
    vs = [v for v in range(len(adj)) if clique >> v & 1]
    return all(adj[u] >> v & 1 for i, u in enumerate(vs) for v in vs[i + 1:])


def stale_replica(pilot_token: str, token: str) -> float:
    """(client.run) Make this machine's replica of a cell from a handle that carries a
    stale value (0.0), as a task lent from a machine that had not heard the news yet."""
    from shoal.backends.dask import cells

    return cells.node_cell(pilot_token, token, "max", 0.0).value


def replica_by_token(token: str):
    """(client.run) This machine's replica's value, or None if it has none."""
    from shoal.backends.dask import cells

    with cells._lock:
        rep = cells._replicas.get(token)
    return None if rep is None else rep.cell.value
