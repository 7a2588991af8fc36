"""An mpi4py program for the MPI task tests: each rank writes one JSON line to
``<out>/rank<N>.json`` (rank, size, host, its CPU affinity, and the sum of 1..size computed with
MPI.Allreduce); ``--fail-rank R --code C`` makes rank R exit with code C after writing a line to
stderr; ``--fail-once FILE`` fails only while FILE does not exist (and creates it)."""

import argparse
import json
import os
import socket
import sys

from mpi4py import MPI


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--fail-rank", type=int, default=None)
    ap.add_argument("--code", type=int, default=3)
    ap.add_argument("--fail-once", default=None)
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    total = comm.allreduce(rank + 1, op=MPI.SUM)
    sys.stderr.write(f"rank {rank} of {size} on {socket.gethostname()}\n")
    with open(os.path.join(a.out, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "size": size, "host": socket.gethostname(),
                   "cpus": sorted(os.sched_getaffinity(0)), "sum": total,
                   "omp": os.environ.get("OMP_NUM_THREADS"), "pid": os.getpid()}, f)
    fail = a.fail_rank is not None and rank == a.fail_rank
    if a.fail_once:  # every rank looks before any creates the file
        fail = fail and not os.path.exists(a.fail_once)
        comm.Barrier()
    if fail:
        if a.fail_once:
            open(a.fail_once, "w").close()
        sys.stderr.write(f"rank {rank}: failing on purpose with code {a.code}\n")
        sys.stderr.flush()
        sys.exit(a.code)
    if a.fail_rank is None:
        comm.Barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
