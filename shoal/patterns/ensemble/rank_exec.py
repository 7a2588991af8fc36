"""One MPI rank's start: pin to this rank's cores, send stderr to its own file, exec the program.

Run by the launcher (srun, mpirun) as ``python -S rank_exec.py PROGRAM ARGS...`` for every rank
of a task (mpi.py says why one wrapper for all launchers).  Standalone on purpose: it imports
nothing of shoal, so a rank starts in an interpreter's bare start-up time, on any host that
sees this file.  It ``exec``s, so the program keeps the pid the launcher started and all the
launcher's environment (PMIx/PMI variables) for ``MPI_Init``.

Reads ``SHOAL_RANK_CPUS`` ("0,1;2,3": rank r's CPU ids at index r) and ``SHOAL_RANK_DIR``
(stderr goes to ``<dir>/stderr.rank<r>``); sets ``SHOAL_RANK`` for the program.
"""

import os
import sys

RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID", "PMI_RANK")


def main(argv):
    if not argv:
        sys.stderr.write("rank_exec.py: no program to run\n")
        return 2
    rank = next((int(os.environ[v]) for v in RANK_VARS if os.environ.get(v, "").isdigit()), None)
    if rank is None:
        sys.stderr.write(f"rank_exec.py: no rank in the environment (none of {', '.join(RANK_VARS)})\n")
        return 2
    where = os.environ.get("SHOAL_RANK_DIR")
    if where:
        fd = os.open(os.path.join(where, f"stderr.rank{rank}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
    table = os.environ.get("SHOAL_RANK_CPUS", "").split(";")
    if rank < len(table) and table[rank]:
        cpus = {int(c) for c in table[rank].split(",")}
        try:
            os.sched_setaffinity(0, cpus)
        except OSError as exc:  # another host's numbering: run unpinned, but say so
            sys.stderr.write(f"rank_exec.py: rank {rank}: cannot pin to CPUs {sorted(cpus)}: {exc}\n")
    os.environ["SHOAL_RANK"] = str(rank)
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        sys.stderr.write(f"rank_exec.py: rank {rank}: cannot start {argv[0]!r}: {exc}\n")
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
