"""The nodes of a multi-node allocation and node-aware reservation (pure; no I/O but reading a
PBS node file the caller names).

What a pilot over N nodes needs before it starts anything (docs/hpc.md, "One pilot, many
nodes"):

* the nodes and their sizes: ``slurm_nodes`` reads ``SLURM_JOB_NODELIST`` (``h[1-3],h5``,
  expanded by ``shoal.runtime.allocation.expand_nodelist``) with ``SLURM_JOB_CPUS_PER_NODE``
  (``2(x3),1``: SLURM's run-length form, one count per node); ``pbs_nodes`` reads a
  ``PBS_NODEFILE`` (one line per slot: a host's lines are its cores);
* ``refusal``: a task that no node can hold is refused before anything runs, naming the task
  and the largest node (a task's cores and memory are reserved on *one* node; only an MPI
  task's ranks may spread);
* ``place``: the node and CPU ids for a request (best fit: the node with the fewest free cores
  that still fits, so wide holes stay for wide tasks);
* ``place_ranks``: an MPI task's ranks on free cores of one node when one has room, else
  block-wise over the fewest nodes (each rank's cores on one node), as a ``RankPlacement``
  for the launcher (mpi.py).

Rejected: treating the allocation as one pool of N x C cores (a 3-core task would be "placed"
across two nodes, which no process can use); first fit (it fragments the big nodes first).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from shoal._cpu_counts import expand_counts
from shoal.runtime.allocation import expand_nodelist

from .mpi import RankPlacement


@dataclasses.dataclass(frozen=True)
class NodeSpec:
    name: str
    cores: int
    memory: int = 0  # bytes; 0: not known (not checked)


def slurm_nodes(env: Mapping[str, str]) -> tuple[NodeSpec, ...]:
    """The allocation's nodes from SLURM's environment (empty outside a SLURM job)."""
    names = expand_nodelist(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "")
    if not names:
        return ()
    counts = expand_counts(env.get("SLURM_JOB_CPUS_PER_NODE", ""))
    if len(counts) != len(names):
        if len(counts) == 1:  # one count for every node
            counts = counts * len(names)
        else:
            raise ValueError(f"SLURM_JOB_NODELIST names {len(names)} nodes but "
                             f"SLURM_JOB_CPUS_PER_NODE gives {len(counts)} counts")
    per_node_mb = env.get("SLURM_MEM_PER_NODE", "")
    memory = int(per_node_mb) << 20 if per_node_mb.isdigit() else 0
    return tuple(NodeSpec(n, c, memory) for n, c in zip(names, counts, strict=True))


def pbs_nodes(text: str) -> tuple[NodeSpec, ...]:
    """A PBS_NODEFILE's text (one host per slot line) -> the hosts in first-seen order."""
    counts: dict[str, int] = {}
    for line in text.split():
        counts[line] = counts.get(line, 0) + 1
    return tuple(NodeSpec(h, c) for h, c in counts.items())


def _size(n: int) -> str:
    for unit, shift in (("T", 40), ("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.3g}{unit}"
    return f"{n} bytes"


def refusal(label: str, cores: int, memory: int, nodes: Sequence[NodeSpec], *,
            ranks: int | None = None, cores_per_rank: int = 1) -> str | None:
    """Why no node (or, for an MPI task, no set of nodes) can ever hold the task; None if one can."""
    if not nodes:
        return f"task {label}: the pilot has no nodes"
    largest = max(nodes, key=lambda n: (n.cores, n.memory))
    where = f"the largest node, {largest.name}, has {largest.cores} cores" + (
        f" and {_size(largest.memory)}" if largest.memory else "")
    if ranks is not None:
        fit = sum(n.cores // cores_per_rank for n in nodes)
        if cores_per_rank > largest.cores:
            return f"task {label} asks for {cores_per_rank} cores per rank but {where}"
        if fit < ranks:
            return (f"task {label} asks for {ranks} ranks of {cores_per_rank} cores but the "
                    f"{len(nodes)} nodes hold {fit} such ranks ({where})")
        return None
    if cores > largest.cores:
        return f"task {label} asks for {cores} cores but {where}"
    if memory and any(n.memory for n in nodes) and not any(
            n.cores >= cores and (not n.memory or n.memory >= memory) for n in nodes):
        return f"task {label} asks for {cores} cores and {_size(memory)} but no node has both ({where})"
    return None


def place(cores: int, free: Mapping[str, Sequence[int]]) -> tuple[str, tuple[int, ...]] | None:
    """Best fit of ``cores`` on one node: (node, its lowest free CPU ids) or None."""
    fits = [(len(cpus), name) for name, cpus in free.items() if len(cpus) >= cores]
    if not fits:
        return None
    _, name = min(fits)
    return name, tuple(sorted(free[name])[:cores])


def place_ranks(ranks: int, cores_per_rank: int,
                free: Mapping[str, Sequence[int]]) -> RankPlacement | None:
    """An MPI task's ranks: one node when one has room (best fit), else block-wise over the
    nodes with the most room first (the fewest nodes); None when they do not fit now."""
    need = ranks * cores_per_rank
    one = place(need, free)
    if one is not None:
        return RankPlacement(ranks, cores_per_rank, (one,))
    hosts, left = [], ranks
    for name in sorted(free, key=lambda n: (-(len(free[n]) // cores_per_rank), n)):
        n = min(left, len(free[name]) // cores_per_rank)
        if n:
            hosts.append((name, tuple(sorted(free[name])[:n * cores_per_rank])))
            left -= n
        if not left:
            return RankPlacement(ranks, cores_per_rank, tuple(hosts))
    return None


__all__ = ["NodeSpec", "expand_counts", "slurm_nodes", "pbs_nodes", "refusal", "place",
           "place_ranks"]
