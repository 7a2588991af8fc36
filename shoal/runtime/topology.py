"""Machine topology: which CPUs this process may use and how they group into NUMA nodes.

Data flow
---------
``topology()`` builds one immutable :class:`Topology` per process (cached) from,
in order of precedence:

1. a *synthetic* spec, ``topology(spec="2x2")`` or the ``SHOAL_TOPOLOGY``
   environment variable, format ``"NxC"``: N NUMA nodes of C CPUs each;
2. Linux sysfs, ``/sys/devices/system/node/node*/cpulist`` (e.g. ``"0-3,8-11"``),
   intersected with the CPUs this process may run on;
3. a fallback of one node holding every usable CPU (no sysfs, unreadable or
   malformed files, or node lists that do not cover the usable CPUs).

Usable CPUs come from ``os.sched_getaffinity(0)`` (the cgroup/taskset mask), or
``range(os.cpu_count())`` where the platform lacks it, cut down to what a batch
allocation grants this node (``SLURM_CPUS_ON_NODE``, ``PBS_NUM_PPN``; SLURM's
``CPU_IDs`` say which) and to a cgroup CPU quota: see allocation.py.
``limited_by`` says which of those applied.  Physical cores come from
``psutil.cpu_count(logical=False)``, falling back to the logical count.

Why synthetic topologies
------------------------
Most development and CI machines have a single NUMA node, so the NUMA-aware code
paths (victim order, redirect-push placement, steal locality counters) would
never run.  A synthetic topology lets tests and benchmarks exercise a 2- or
4-node layout anywhere.  Synthetic CPU ids ``0..N*C-1`` are assigned node-major
(node 0 gets ``0..C-1``); when the runtime pins a worker, it maps synthetic CPU
``k`` onto the real usable CPU ``host_cpus[k % len(host_cpus)]`` via
:meth:`Topology.real_cpu`, so oversubscribed layouts still run.

Invariants: node CPU tuples are sorted, disjoint, non-empty, and their union is
``usable_cpus``; nodes are sorted by id.  Rejected alternative: hwloc bindings —
a heavy native dependency for the two facts we need (CPU mask, node membership).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from pathlib import Path

from shoal._errors import TopologyError
from shoal.runtime.allocation import cpu_limit

__all__ = [
    "ENV_VAR",
    "NumaNode",
    "Topology",
    "TopologySource",
    "TopologyError",
    "format_cpulist",
    "parse_cpulist",
    "parse_spec",
    "topology",
]

ENV_VAR = "SHOAL_TOPOLOGY"
SYSFS_NODES = Path("/sys/devices/system/node")
MAX_SYNTHETIC_CPUS = 4096
_SPEC_RE = re.compile(r"(\d+)x(\d+)")
_SPEC_HELP = 'expected "NxC" (N NUMA nodes of C CPUs each, e.g. "2x2"), with N, C >= 1'


class TopologySource(str, Enum):
    """Where a :class:`Topology` came from."""

    SYSFS = "sysfs"
    SINGLE_NODE = "single-node fallback"
    SYNTHETIC = "synthetic"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class NumaNode:
    id: int
    cpus: tuple[int, ...]


@dataclass(frozen=True)
class Topology:
    """An immutable snapshot of the CPUs and NUMA nodes the runtime places workers on.

    ``host_cpus`` are the real usable CPUs that synthetic CPU ids map onto
    (equal to ``usable_cpus`` for a real topology).
    """

    logical_cpus: int
    physical_cores: int
    usable_cpus: tuple[int, ...]
    nodes: tuple[NumaNode, ...]
    synthetic: bool
    source: str
    host_cpus: tuple[int, ...] = ()
    limited_by: str | None = None  # a batch allocation or cgroup quota that cut usable_cpus

    @cached_property
    def _node_by_cpu(self) -> dict[int, int]:
        return {cpu: node.id for node in self.nodes for cpu in node.cpus}

    def node_of(self, cpu: int) -> int:
        """The NUMA node id holding usable CPU ``cpu``; ValueError if it is not usable."""
        try:
            return self._node_by_cpu[cpu]
        except KeyError:
            raise ValueError(f"CPU {cpu} is not a usable CPU of this topology") from None

    def real_cpu(self, cpu: int) -> int:
        """The real CPU to pin to for topology CPU ``cpu`` (identity unless synthetic)."""
        self.node_of(cpu)  # validates
        if not self.synthetic:
            return cpu
        host = self.host_cpus or self.usable_cpus
        return host[cpu % len(host)]

    def worker_slots(self, n: int) -> list[tuple[int, int]]:
        """``(cpu, node)`` for workers ``0..n-1``: node 0's CPUs first, then node 1's, ...

        When ``n`` exceeds the usable CPUs the placement wraps around round-robin.
        """
        if n < 1:
            raise ValueError(f"need at least one worker slot, got n={n}")
        order = [(cpu, node.id) for node in self.nodes for cpu in node.cpus]
        return [order[i % len(order)] for i in range(n)]

    def to_dict(self) -> dict:
        """A JSON-able description (used by ``shoal info --json``)."""
        return {
            "logical_cpus": self.logical_cpus,
            "physical_cores": self.physical_cores,
            "usable_cpus": list(self.usable_cpus),
            "nodes": [{"id": node.id, "cpus": list(node.cpus)} for node in self.nodes],
            "synthetic": self.synthetic,
            "source": str(getattr(self.source, "value", self.source)),
            "host_cpus": list(self.host_cpus),
            "limited_by": self.limited_by,
        }


def parse_cpulist(text: str) -> tuple[int, ...]:
    """Parse a kernel cpulist (``"0-3,8-11"``, ``"0"``, ``""``) into sorted CPU ids."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            first, last = (int(lo), int(hi)) if sep else (int(lo), int(lo))
        except ValueError:
            raise ValueError(f"malformed cpulist {text!r}") from None
        if first < 0 or last < first:
            raise ValueError(f"malformed cpulist {text!r}")
        cpus.update(range(first, last + 1))
    return tuple(sorted(cpus))


def format_cpulist(cpus: Iterable[int]) -> str:
    """Inverse of :func:`parse_cpulist`: ``(0, 1, 2, 5)`` -> ``"0-2,5"``."""
    runs: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def parse_spec(spec: str) -> tuple[int, int]:
    """Validate a synthetic spec ``"NxC"``; return ``(N, C)`` or raise TopologyError."""
    match = _SPEC_RE.fullmatch(spec.strip())
    if match is not None:
        n_nodes, per_node = int(match[1]), int(match[2])
        if n_nodes >= 1 and per_node >= 1 and n_nodes * per_node <= MAX_SYNTHETIC_CPUS:
            return n_nodes, per_node
    raise TopologyError(
        f"invalid {ENV_VAR}={spec!r}: {_SPEC_HELP} and at most {MAX_SYNTHETIC_CPUS} CPUs"
    )


def _usable_cpus() -> tuple[int, ...]:
    try:
        cpus = tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        cpus = ()
    return cpus or tuple(range(os.cpu_count() or 1))


def _synthetic(spec: str, host: tuple[int, ...]) -> Topology:
    n_nodes, per_node = parse_spec(spec)
    nodes = tuple(
        NumaNode(i, tuple(range(i * per_node, (i + 1) * per_node))) for i in range(n_nodes)
    )
    total = n_nodes * per_node
    return Topology(
        logical_cpus=total,
        physical_cores=total,
        usable_cpus=tuple(range(total)),
        nodes=nodes,
        synthetic=True,
        source=TopologySource.SYNTHETIC,
        host_cpus=host,
    )


def _sysfs_nodes(usable: tuple[int, ...], root: Path) -> tuple[NumaNode, ...] | None:
    """Usable CPUs grouped by sysfs node, or None if sysfs cannot describe them all."""
    allowed = set(usable)
    nodes = []
    try:
        for path in root.glob("node[0-9]*/cpulist"):
            node_id = int(path.parent.name[len("node") :])
            cpus = tuple(c for c in parse_cpulist(path.read_text()) if c in allowed)
            if cpus:
                nodes.append(NumaNode(node_id, cpus))
    except (OSError, ValueError):
        return None
    covered = [cpu for node in nodes for cpu in node.cpus]
    if not nodes or sorted(covered) != sorted(allowed):
        return None
    return tuple(sorted(nodes, key=lambda node: node.id))


def _physical_cores(logical: int) -> int:
    try:
        import psutil

        return psutil.cpu_count(logical=False) or logical
    except Exception:  # psutil missing or unsupported platform: count logical CPUs
        return logical


def _detect(root: Path = SYSFS_NODES) -> Topology:
    usable = _usable_cpus()
    logical = max(os.cpu_count() or 0, len(usable))
    usable, limited_by = cpu_limit(usable)
    nodes = _sysfs_nodes(usable, root)
    source = TopologySource.SYSFS
    if nodes is None:
        nodes, source = (NumaNode(0, usable),), TopologySource.SINGLE_NODE
    return Topology(
        logical_cpus=logical,
        physical_cores=_physical_cores(logical),
        usable_cpus=usable,
        nodes=nodes,
        synthetic=False,
        source=source,
        host_cpus=usable,
        limited_by=limited_by,
    )


_cache: dict[str | None, Topology] = {}


def topology(refresh: bool = False, spec: str | None = None) -> Topology:
    """This machine's topology, or a synthetic one from ``spec`` / ``$SHOAL_TOPOLOGY``.

    Cached per effective spec; ``refresh=True`` re-reads the machine.  An empty
    spec or environment value means "not set".  Raises TopologyError on a bad spec.
    """
    if spec is None:
        spec = os.environ.get(ENV_VAR)
    key = spec.strip() if spec and spec.strip() else None
    if not refresh and key in _cache:
        return _cache[key]
    topo = _detect() if key is None else _synthetic(key, _usable_cpus())
    _cache[key] = topo
    return topo
