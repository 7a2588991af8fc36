"""MPI tasks: how a task's ranks are started (the *launcher*), where each rank runs, and how
their ends are read back.

A task with ``ranks=R, cores_per_rank=C`` reserves ``R * C`` cores like any other task (the
Scheduler hands out disjoint CPU ids, so no core is given to two ranks).  At its start the
engine asks the run's one ``RankLauncher`` for the command line::

    placement = RankPlacement(ranks=R, cores_per_rank=C, hosts=((host, cpus),))
    argv      = launcher.argv(placement, [python, rank_exec.py, exe, *arguments])

* ``srun``   (inside a SLURM allocation): ``srun --mpi=pmix --ntasks=R --cpus-per-task=C
  --nodes=1 --nodelist=HOST --overlap --kill-on-bad-exit=1 ...`` — the step runs on the node
  shoal placed it on; ``--overlap`` because shoal, not SLURM, keeps the cores apart (SLURM's
  step allocator would otherwise block the step behind the CPUs the pilot already holds);
  ``--mpi=pmix`` because sites (and Debian's SLURM) often leave ``MpiDefault=none``, under
  which Open MPI 4's ranks cannot find each other ("install PMI-2 ..."), unless the user set
  ``SLURM_MPI_TYPE`` (srun's own variable: then srun's choice stands);
* ``mpirun`` (Open MPI, elsewhere): ``mpirun -np R --host HOST:R --bind-to none ...``
  (``--allow-run-as-root`` when run as root, as Open MPI refuses root otherwise);
* ``none``: the executable is started once, as before MPI tasks existed, with all ``R * C``
  cores (for programs that start their own ranks, or ``mpirun`` written in the arguments).

Every rank runs ``rank_exec.py`` first: it reads its rank from the launcher's environment
(``OMPI_COMM_WORLD_RANK``, ``PMIX_RANK``, ``SLURM_PROCID``, ``PMI_RANK``), pins itself to its
own ``C`` cores of the grant, writes its stderr to ``<sandbox>/stderr.rank<N>`` and ``exec``s
the program (the same pid, so the launcher's bookkeeping and PMIx are unchanged).  One
mechanism for every launcher: binding flags differ between Open MPI, MPICH and SLURM's
affinity plugins (and ``task/none``, common without cgroups, binds nothing), the pin-and-exec
does not.  A failed rank fails the task; the failure's stderr tail lists every rank's tail
(``launcher.rank_tails``) and the launcher's own.

Choice (``choose``): ``launcher=`` of ``run()`` (``"srun"``, ``"mpirun"``, ``"none"`` or a
``LauncherKind``) wins; otherwise ``srun`` inside a SLURM job (``SLURM_JOB_ID`` set and ``srun``
on PATH), else ``mpirun`` when Open MPI's is on PATH, else none found, and MPI tasks are
refused before anything runs, saying how to install one (scripts/install-mpi).  Chosen once per
run, so all MPI tasks of a run start the same way.

Rejected: a rankfile or ``--cpu-set`` per launcher (three syntaxes, Open MPI's logical vs
physical numbering); ``taskset`` per rank (every rank the same command: it cannot know its own
rank's cores); letting SLURM place the step (``task/none`` nodes bind nothing, and without
``--overlap`` a step waits behind the pilot's own workers); starting an ``mpi4py`` *function*
on R ranks (the pilot's worker processes are not MPI processes: the function would need a
fresh interpreter per rank started by the launcher, its arguments pickled to a file and rank 0's
result read back — an executable task running a script is that, written by the user, so
``ranks=`` is refused for function tasks).
"""

from __future__ import annotations

import dataclasses
import enum
import os
import shutil
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

RANK_EXEC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_exec.py")
RANK_TAIL = 600  # bytes of each rank's (and the launcher's) stderr in a failure


class LauncherKind(enum.Enum):
    SRUN = "srun"
    MPIRUN = "mpirun"
    NONE = "none"


@dataclasses.dataclass(frozen=True)
class RankPlacement:
    """Where a task's ranks run: ``hosts`` is ((host, cpu ids), ...), the ranks filling the
    hosts in order, ``cores_per_rank`` CPU ids each."""

    ranks: int
    cores_per_rank: int
    hosts: tuple[tuple[str, tuple[int, ...]], ...]

    def rank_cpus(self) -> list[tuple[int, ...]]:
        """The CPU ids of each rank, rank 0 first (each host's cpus cut into runs of C)."""
        out: list[tuple[int, ...]] = []
        c = self.cores_per_rank
        for _, cpus in self.hosts:
            out += [tuple(cpus[i:i + c]) for i in range(0, len(cpus) - c + 1, c)]
        if len(out) < self.ranks:
            raise ValueError(f"{self.ranks} ranks of {c} cores do not fit the placement {self.hosts}")
        return out[:self.ranks]

    def ranks_per_host(self) -> list[tuple[str, int]]:
        left, out = self.ranks, []
        for host, cpus in self.hosts:
            n = min(left, len(cpus) // self.cores_per_rank)
            if n:
                out.append((host, n))
            left -= n
        return out

    def env(self, sandbox: str) -> dict[str, str]:
        """What rank_exec.py reads: each rank's CPUs ("0,1;2,3") and where stderr goes."""
        return {"SHOAL_RANK_CPUS": ";".join(",".join(map(str, c)) for c in self.rank_cpus()),
                "SHOAL_RANK_DIR": sandbox}


class RankLauncher(Protocol):
    """Turns one rank's command line into the command that starts all of a task's ranks."""

    kind: LauncherKind

    def argv(self, placement: RankPlacement, command: Sequence[str]) -> list[str]: ...


@dataclasses.dataclass(frozen=True)
class Srun:
    """``mpi``: srun's ``--mpi=`` plugin; None leaves it to SLURM_MPI_TYPE / the site's MpiDefault."""

    program: str = "srun"
    mpi: str | None = "pmix"
    kind: LauncherKind = LauncherKind.SRUN

    def argv(self, placement: RankPlacement, command: Sequence[str]) -> list[str]:
        hosts = placement.ranks_per_host()
        plugin = [f"--mpi={self.mpi}"] if self.mpi else []
        return [self.program, *plugin, f"--ntasks={placement.ranks}",
                f"--cpus-per-task={placement.cores_per_rank}", f"--nodes={len(hosts)}",
                "--nodelist=" + ",".join(h for h, _ in hosts),
                "--distribution=block", "--overlap", "--kill-on-bad-exit=1", "--export=ALL",
                "--quiet", *command]


@dataclasses.dataclass(frozen=True)
class Mpirun:
    program: str = "mpirun"
    as_root: bool = False
    kind: LauncherKind = LauncherKind.MPIRUN

    def argv(self, placement: RankPlacement, command: Sequence[str]) -> list[str]:
        hosts = ",".join(f"{h}:{n}" for h, n in placement.ranks_per_host())
        root = ["--allow-run-as-root"] if self.as_root else []
        # the shoal variables travel to other hosts (-x); pinning is rank_exec.py's job
        exports = [x for v in ("SHOAL_RANK_CPUS", "SHOAL_RANK_DIR", "OMP_NUM_THREADS",
                               "PYTHONPATH", "PATH") for x in ("-x", v)]
        return [self.program, *root, "-np", str(placement.ranks), "--host", hosts,
                "--bind-to", "none", *exports, *command]


@dataclasses.dataclass(frozen=True)
class NoLauncher:
    kind: LauncherKind = LauncherKind.NONE

    def argv(self, placement: RankPlacement, command: Sequence[str]) -> list[str]:
        return list(command)


@dataclasses.dataclass(frozen=True)
class NotFound:
    """No launcher on this machine: ``why`` is what the refusal of an MPI task says."""

    why: str
    kind: LauncherKind = LauncherKind.NONE

    def argv(self, placement: RankPlacement, command: Sequence[str]) -> list[str]:
        raise RuntimeError(self.why)


def parse_kind(value) -> LauncherKind | None:
    if value is None or isinstance(value, LauncherKind):
        return value
    try:
        return LauncherKind(str(value).lower())
    except ValueError:
        from .model import EnsembleError

        raise EnsembleError(f"launcher={value!r}: choose one of "
                            f"{', '.join(k.value for k in LauncherKind)}") from None


def choose(kind=None, *, env: Mapping[str, str] | None = None,
           which: Callable[[str], str | None] = shutil.which, euid: int | None = None):
    """The run's launcher (see the module doc); ``env``/``which``/``euid`` default to this process's."""
    env = os.environ if env is None else env
    euid = os.geteuid() if euid is None else euid
    kind = parse_kind(kind)
    if kind is LauncherKind.NONE:
        return NoLauncher()
    if kind in (None, LauncherKind.SRUN) and (kind is LauncherKind.SRUN or env.get("SLURM_JOB_ID")):
        srun = which("srun")
        if srun:  # PMIx unless the user chose srun's plugin (SLURM_MPI_TYPE): see the module doc
            return Srun(srun, mpi=None if env.get("SLURM_MPI_TYPE") else "pmix")
        if kind is LauncherKind.SRUN:
            return NotFound("launcher='srun' but srun is not on PATH")
    mpirun = which("mpirun")
    if mpirun:
        return Mpirun(mpirun, as_root=euid == 0)
    if kind is LauncherKind.MPIRUN:
        return NotFound("launcher='mpirun' but mpirun is not on PATH (install Open MPI: "
                        "scripts/install-mpi, or apt-get install openmpi-bin)")
    return NotFound("no MPI launcher: not inside a SLURM job and no mpirun on PATH (install Open "
                    "MPI: scripts/install-mpi, or apt-get install openmpi-bin; or pass "
                    "launcher='none' to start the executable once)")


def local_placement(ranks: int, cores_per_rank: int, cpus: Sequence[int]) -> RankPlacement:
    """The ranks of a task granted ``cpus`` of this host."""
    return RankPlacement(ranks, cores_per_rank, ((socket.gethostname(), tuple(cpus)),))


__all__ = ["LauncherKind", "RankLauncher", "RankPlacement", "Srun", "Mpirun", "NoLauncher",
           "NotFound", "choose", "parse_kind", "local_placement"]
