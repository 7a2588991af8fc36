"""Multi-process stress: records cross process boundaries in order and intact.

Counts scale with SHOAL_STRESS_SCALE (default 1: 20,000 records per direction).
"""
from __future__ import annotations

import json

from qhelpers import (
    finish,
    native_fixture,  # noqa: F401 (provides the `native` fixture)
    spawn_peer,
    stress_scale,
)
from ring_peer import exchange

from shoal.queues import RingMatrix

COUNT = max(1000, int(20_000 * stress_scale()))


def run_pair(native: bool, to_child: int, to_parent: int, park: bool, capacity: int = 1 << 16):
    with RingMatrix(2, capacity, native=native) as matrix:
        child = spawn_peer(
            [
                json.dumps(matrix.spec()),
                "1",
                json.dumps({0: to_parent} if to_parent else {}),
                json.dumps({0: to_child} if to_child else {}),
                "1" if park else "0",
                "7",
            ],
            matrix.fds(),
            native,
        )
        try:
            mine = exchange(
                matrix,
                0,
                {1: to_child} if to_child else {},
                {1: to_parent} if to_parent else {},
                park,
                seed=11,
            )
        finally:
            out = finish(child)
    theirs = json.loads(out)
    assert theirs["got"] == ({"0": to_child} if to_child else {})
    assert mine["got"] == ({1: to_parent} if to_parent else {})
    return mine, theirs


def test_child_to_parent(native):
    run_pair(native, 0, COUNT, park=False)


def test_both_directions(native):
    run_pair(native, COUNT, COUNT, park=False)


def test_both_directions_parking(native):
    run_pair(native, COUNT, COUNT, park=True)


def test_small_ring_wraps_often(native):
    run_pair(native, COUNT // 4, COUNT // 4, park=True, capacity=4096)


def test_many_endpoints(native):
    """Three children and the driver all talk to each other (peer rings included)."""
    n = 4
    count = COUNT // 2
    with RingMatrix(n, 1 << 16, 1 << 14, native=native) as matrix:
        spec = json.dumps(matrix.spec())
        kids = []
        for me in range(1, n):
            send = {dst: count for dst in range(n) if dst != me}
            recv = {src: count for src in range(n) if src != me}
            kids.append(
                spawn_peer([spec, str(me), json.dumps(send), json.dumps(recv), "1", str(me)], matrix.fds(), native)
            )
        try:
            exchange(matrix, 0, {d: count for d in range(1, n)}, {s: count for s in range(1, n)}, True, 0)
        finally:
            outs = [finish(kid) for kid in kids]
    for out in outs:
        assert all(v == count for v in json.loads(out)["got"].values())
