"""N-Queens solution counting: a balanced-ish backtracking workload.

How many ways can ``n`` queens sit on an ``n x n`` board without two attacking
each other?  The counts are OEIS A000170 (``1, 0, 0, 2, 10, 4, 40, 92, 352, 724,
2680, 14200, 73712, 365596`` for ``n = 1..14``), a reference nobody here wrote.

The sequential solver is the classic bitmask backtracker (one row at a time; the
occupied columns and both diagonal directions are three ints, shifted one bit per
row), with two standard savings: the last row is not searched but counted with
``int.bit_count``, and the left-right mirror symmetry halves the search (place
the first queen in the left half only and double; the middle column of an odd
board is searched once).

The parallel version spawns one task per placement in each of the first
``spawn_depth`` rows (the parent runs its last child itself and joins the others
newest first) and solves below that sequentially.  A subproblem is five ints,
so a spawn moves a few dozen bytes.  Subtrees differ in size by a factor of a
few, not by orders of magnitude as in UTS, so a depth of 2-3 already gives a
few hundred tasks of milliseconds each: enough slack for stealing to even out.

Only shoal's public API is used (``shoal.spawn``, a pilot's ``submit``).
"""

from __future__ import annotations

from typing import NamedTuple

import shoal

__all__ = ["OEIS_A000170", "Subproblem", "count_parallel", "count_sequential",
           "count_subproblem", "subproblems"]

# OEIS A000170: number of ways to place n non-attacking queens on an n x n board,
# n = 0..20 (a(0) = 1: the empty board has one empty placement).
OEIS_A000170 = (1, 1, 0, 0, 2, 10, 4, 40, 92, 352, 724, 2680, 14200, 73712, 365596,
                2279184, 14772512, 95815104, 666090624, 4968057848, 39029188884)

DEFAULT_SPAWN_DEPTH = 3


class Subproblem(NamedTuple):
    """A partial board: rows placed so far as bitmasks, and how much it counts for.

    ``cols``/``ld``/``rd``: attacked columns, and the squares of the next row
    attacked along the two diagonal directions; ``left``: rows still to place;
    ``weight``: 2 for a mirrored left-half start, else 1.
    """

    full: int
    cols: int
    ld: int
    rd: int
    left: int
    weight: int = 1


def _count(full: int, cols: int, ld: int, rd: int, left: int) -> int:
    """Solutions below a partial board with ``left >= 1`` rows to place."""
    avail = full & ~(cols | ld | rd)
    if left == 1:
        return avail.bit_count()
    total = 0
    while avail:
        bit = avail & -avail
        avail ^= bit
        total += _count(full, cols | bit, ((ld | bit) << 1) & full, (rd | bit) >> 1, left - 1)
    return total


def _first_row(n: int) -> list[Subproblem]:
    """The mirror-reduced placements of the first queen (n >= 2)."""
    full = (1 << n) - 1
    subs = []
    for c in range(n // 2):
        bit = 1 << c
        subs.append(Subproblem(full, bit, (bit << 1) & full, bit >> 1, n - 1, 2))
    if n % 2:
        bit = 1 << (n // 2)
        subs.append(Subproblem(full, bit, (bit << 1) & full, bit >> 1, n - 1, 1))
    return subs


def _expand(sub: Subproblem) -> list[Subproblem]:
    """The children of a partial board: one per safe square of its next row."""
    full, cols, ld, rd, left, w = sub
    avail = full & ~(cols | ld | rd)
    out = []
    while avail:
        bit = avail & -avail
        avail ^= bit
        out.append(Subproblem(full, cols | bit, ((ld | bit) << 1) & full,
                              (rd | bit) >> 1, left - 1, w))
    return out


def count_subproblem(sub: Subproblem) -> int:
    """Solutions below ``sub``, weight included (sequential)."""
    if sub.left == 0:
        return sub.weight
    return sub.weight * _count(sub.full, sub.cols, sub.ld, sub.rd, sub.left)


def subproblems(n: int, depth: int = 1) -> list[Subproblem]:
    """All partial boards with ``depth`` queens placed (mirror-reduced), for static splits.

    ``sum(count_subproblem(s) for s in subproblems(n, d)) == count_sequential(n)``.
    """
    if n < 2:
        return [Subproblem((1 << n) - 1, 0, 0, 0, n, 1)] if n >= 0 else []
    level = _first_row(n)
    for _ in range(max(depth, 1) - 1):
        level = [c for s in level if s.left > 0 for c in _expand(s)]
    return level


def count_sequential(n: int) -> int:
    """The number of solutions of the n-queens problem (OEIS A000170), in this process."""
    if n < 0:
        raise ValueError("n must be >= 0")
    if n < 2:
        return 1
    return sum(count_subproblem(s) for s in _first_row(n))


def _task(sub: Subproblem, spawn_depth: int) -> int:
    """Solutions below ``sub``: spawn a child per safe square while ``spawn_depth`` > 0."""
    if spawn_depth <= 0 or sub.left <= 1:
        return count_subproblem(sub)
    kids = _expand(sub)
    return _spawn_all(kids, spawn_depth - 1) if kids else 0


def _root_task(n: int, spawn_depth: int) -> int:
    """The whole board: one task per first-row placement, then per row below."""
    if n < 2 or spawn_depth <= 0:
        return count_sequential(n)
    return _spawn_all(_first_row(n), spawn_depth - 1)


def _spawn_all(subs: list[Subproblem], spawn_depth: int) -> int:
    """Spawn all but the last of ``subs``, run the last here, join newest first."""
    futs = [shoal.spawn(_task, s, spawn_depth) for s in subs[:-1]]
    total = _task(subs[-1], spawn_depth)
    for f in reversed(futs):
        total += f.result()
    return total


def count_parallel(pilot, n: int, spawn_depth: int = DEFAULT_SPAWN_DEPTH) -> int:
    """The n-queens count with ``pilot``'s workers: one task per placement in the first
    ``spawn_depth`` rows, sequential below."""
    if n < 0:
        raise ValueError("n must be >= 0")
    return pilot.submit(_root_task, n, spawn_depth).result()
