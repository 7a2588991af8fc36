"""A peer for the multi-process ring tests: send and/or receive checked records.

Used in-process by the tests (``exchange``) and as a child process started with
``subprocess.Popen(pass_fds=matrix.fds())``::

    python ring_peer.py SPEC_JSON ME SEND_JSON RECV_JSON PARK SEED

SEND_JSON maps destination -> number of records to send, RECV_JSON maps
source -> number of records to expect.  A record is ``seq u64 | crc32 u32 |
0 u32 | body``; the receiver checks that sequence numbers arrive in order with
no gap and that every body matches its crc32.  Prints a JSON summary.
"""
from __future__ import annotations

import json
import os
import random
import struct
import sys
import time
import zlib

_HDR = struct.Struct("<QII")


def make_record(rng: random.Random, seq: int, max_message: int) -> bytes:
    if rng.random() < 0.02:
        size = rng.randrange(0, max_message - _HDR.size + 1)
    else:
        size = rng.randrange(0, 256)
    body = rng.randbytes(size)
    return _HDR.pack(seq, zlib.crc32(body), 0) + body


def check_record(rec: bytes, expected_seq: int, src: int) -> None:
    seq, crc, _ = _HDR.unpack_from(rec)
    if seq != expected_seq:
        raise AssertionError(f"from {src}: got seq {seq}, expected {expected_seq}")
    if zlib.crc32(memoryview(rec)[_HDR.size :]) != crc:
        raise AssertionError(f"from {src}: record {seq} of {len(rec)} bytes is corrupt")


def exchange(matrix, me: int, send: dict, recv: dict, park: bool, seed: int, limit: float = 120.0) -> dict:
    """Send ``send[dst]`` records to each dst and check ``recv[src]`` from each src."""
    from shoal.queues import Push

    rng = random.Random(seed)
    sent = {dst: 0 for dst in send}
    got = {src: 0 for src in recv}
    pending: dict[int, bytes] = {}
    outs = {dst: matrix.ring(me, dst) for dst in send}
    ins = {src: matrix.ring(src, me) for src in recv}
    bell = matrix.doorbell(me)
    parks = 0
    deadline = time.monotonic() + limit

    def ready() -> bool:
        if any(ring.readable() for ring in ins.values()):
            return True
        return any(outs[dst].used_bytes() < outs[dst].capacity // 2 for dst in pending)

    while any(sent[d] < send[d] for d in send) or any(got[s] < recv[s] for s in recv):
        progressed = False
        for dst, ring in outs.items():
            pushed = False
            while sent[dst] < send[dst]:
                rec = pending.pop(dst, None) or make_record(rng, sent[dst], ring.max_message)
                if ring.push(rec) is Push.FULL:
                    pending[dst] = rec
                    break
                sent[dst] += 1
                pushed = True
            if pushed:
                progressed = True
                matrix.doorbell(dst).ring()
        for src, ring in ins.items():
            recs = ring.pop_many()
            if recs:
                for rec in recs:
                    check_record(rec, got[src], src)
                    got[src] += 1
                progressed = True
                matrix.doorbell(src).ring()  # it may be parked waiting for space
        if not progressed:
            if time.monotonic() > deadline:
                raise AssertionError(f"endpoint {me} stuck: sent {sent} of {send}, got {got} of {recv}")
            if park:
                parks += 1
                bell.park(ready, 0.05 if pending else 2.0)
            else:
                os.sched_yield()
    for src, n in recv.items():
        if got[src] != n:
            raise AssertionError(f"from {src}: got {got[src]} records, expected {n}")
    return {"sent": sent, "got": got, "parks": parks}


def main(argv: list[str]) -> int:
    from shoal.queues import RingMatrix

    spec, me, send, recv, park, seed = argv
    matrix = RingMatrix.attach(json.loads(spec))
    try:
        result = exchange(
            matrix,
            int(me),
            {int(k): v for k, v in json.loads(send).items()},
            {int(k): v for k, v in json.loads(recv).items()},
            park == "1",
            int(seed),
        )
    finally:
        matrix.close()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
