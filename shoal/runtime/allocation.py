"""Inside a batch allocation: what the batch system granted this process, read from its environment.

A process started by ``sbatch``/``salloc``/``srun`` (or ``qsub``) may see every
CPU of its host (SLURM with ``TaskPlugin=task/none`` binds nothing; a node
shared by several jobs still shows all its cores to ``os.sched_getaffinity``).
Sizing a pilot from the host would then oversubscribe the cores other jobs
hold.  ``current()`` reads what the batch system says instead::

    environment                                  Allocation field
    SLURM_JOB_ID / PBS_JOBID                     scheduler, job_id
    SLURM_CPUS_ON_NODE / PBS_NUM_PPN, NCPUS      cpus (on this node)
    SLURM_JOB_NODELIST / PBS_NODEFILE            nodes (expanded host names)
    SLURM_MEM_PER_NODE, SLURM_MEM_PER_CPU        memory (bytes on this node)
    scontrol show job -d (SLURM, on demand)      cpu_ids (the CPUs SLURM allocated here),
                                                 end (epoch seconds the allocation ends)

and ``cgroup_cpus()`` reads a CPU quota (cgroup v2 ``cpu.max``, v1
``cpu.cfs_quota_us``), which containers and SLURM's task/cgroup set.  The
topology (topology.py) takes the smaller of the affinity mask, the
allocation's CPU count and the quota, so ``shoal.Pilot()`` and ``shoal run``
inside a job start as many workers as the job has cores.

Pure parts (``expand_nodelist``, ``parse_scontrol``) are separate from the
reads, so they are tested on the formats SLURM documents.  Rejected: calling
``scontrol`` at every topology read (a controller round trip per process
start; it is only asked when the CPU count alone cannot say which CPUs).
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
import re
import subprocess
from pathlib import Path


class Scheduler(enum.Enum):
    SLURM = "slurm"
    PBS = "pbs"


@dataclasses.dataclass(frozen=True)
class Allocation:
    """The batch job this process runs in (see ``current()``)."""

    scheduler: Scheduler
    job_id: str
    cpus: int | None  # CPUs of the job on this node
    nodes: tuple[str, ...]  # every node of the job
    node: str  # this node's name, as the batch system calls it
    memory: int | None = None  # bytes the job may use on this node (SLURM --mem/--mem-per-cpu)

    def to_dict(self) -> dict:
        return {"scheduler": self.scheduler.value, "job_id": self.job_id, "cpus": self.cpus,
                "nodes": list(self.nodes), "node": self.node, "memory": self.memory}

    def times(self) -> tuple[float | None, float | None]:
        """(start, end) of the job in epoch seconds, as the batch system says; None where
        unknown.  SLURM: ``SLURM_JOB_START_TIME``/``SLURM_JOB_END_TIME`` where set (newer
        SLURM), else ``scontrol show job`` (one controller round trip).  PBS: unknown."""
        if self.scheduler is not Scheduler.SLURM:
            return None, None
        env = os.environ
        if env.get("SLURM_JOB_ID") == self.job_id and env.get("SLURM_JOB_END_TIME"):
            return _int(env.get("SLURM_JOB_START_TIME")), _int(env.get("SLURM_JOB_END_TIME"))
        details = slurm_job_details(self.job_id, self.node)
        return details.get("start"), details.get("end")


def expand_nodelist(text: str) -> tuple[str, ...]:
    """SLURM's compressed host list -> names: ``"n[01-03,7],gpu5"`` -> n01 n02 n03 n7 gpu5;
    several bracket groups multiply (``"r[1-2]n[1,3]"`` -> r1n1 r1n3 r2n1 r2n3)."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == "[") - (ch == "]")
        if depth not in (0, 1):
            raise ValueError(f"malformed SLURM node list {text!r}")
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"malformed SLURM node list {text!r}")
    items.append(text[start:])
    names: list[str] = []
    for item in (x.strip() for x in items):
        if item:
            names.extend(_expand_one(item, text))
    return tuple(names)


def _expand_one(pattern: str, text: str) -> list[str]:
    m = re.match(r"([^\[]*)\[([^\]]*)\](.*)", pattern)
    if m is None:
        if "]" in pattern:
            raise ValueError(f"malformed SLURM node list {text!r}")
        return [pattern]
    prefix, ranges, rest = m[1], m[2], m[3]
    tails = _expand_one(rest, text) if rest else [""]
    out = []
    for part in ranges.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()) or (hi and int(hi) < int(lo)):
            raise ValueError(f"malformed SLURM node list {text!r}")
        for i in range(int(lo), int(hi or lo) + 1):
            out.extend(f"{prefix}{i:0{len(lo)}d}{tail}" for tail in tails)
    return out


def _int(value: str | None) -> int | None:
    try:
        n = int(str(value).split("(")[0])  # SLURM_JOB_CPUS_PER_NODE may read "2(x3)"
    except (TypeError, ValueError):
        return None
    return n if n >= 1 else None


def current(env: dict | None = None) -> Allocation | None:
    """The allocation this process runs in, or None outside a batch job."""
    env = os.environ if env is None else env
    if env.get("SLURM_JOB_ID"):
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
        try:
            nodes = expand_nodelist(nodelist) if nodelist else ()
        except ValueError:
            nodes = ()
        cpus = _int(env.get("SLURM_CPUS_ON_NODE")) or _int(env.get("SLURM_JOB_CPUS_PER_NODE"))
        node = env.get("SLURMD_NODENAME") or (nodes[0] if len(nodes) == 1 else "")
        mem_mb = _int(env.get("SLURM_MEM_PER_NODE"))
        if mem_mb is None and _int(env.get("SLURM_MEM_PER_CPU")) and cpus:
            mem_mb = _int(env.get("SLURM_MEM_PER_CPU")) * cpus
        memory = mem_mb * 2**20 if mem_mb else None
        return Allocation(Scheduler.SLURM, env["SLURM_JOB_ID"], cpus, nodes, node, memory)
    if env.get("PBS_JOBID"):
        nodes: tuple[str, ...] = ()
        nodefile = env.get("PBS_NODEFILE")
        if nodefile:
            try:
                nodes = tuple(dict.fromkeys(Path(nodefile).read_text().split()))
            except OSError:
                pass
        cpus = _int(env.get("PBS_NUM_PPN")) or _int(env.get("NCPUS")) or _int(env.get("PBS_NP"))
        return Allocation(Scheduler.PBS, env["PBS_JOBID"], cpus, nodes, "")
    return None


def parse_scontrol(text: str, node: str) -> dict:
    """``scontrol show job -d`` output -> {"cpu_ids": (...) on ``node``, "start"/"end": epoch}."""
    out: dict = {}
    for m in re.finditer(r"(?:^|\s)Nodes=(\S+)\s+CPU_IDs=(\S+)", text):
        try:
            if node in expand_nodelist(m[1]):
                from .topology import parse_cpulist

                out["cpu_ids"] = parse_cpulist(m[2])
                break
        except ValueError:
            continue
    for key, field in (("start", "StartTime"), ("end", "EndTime")):
        m = re.search(rf"\b{field}=(\S+)", text)
        if m:
            try:
                import datetime as dt

                out[key] = dt.datetime.fromisoformat(m[1]).timestamp()
            except ValueError:  # Unknown, None
                pass
    return out


def slurm_job_details(job_id: str, node: str, timeout: float = 10.0) -> dict:
    """``parse_scontrol`` of this job, or {} when scontrol is absent or does not answer."""
    try:
        out = subprocess.run(["scontrol", "show", "job", "-d", job_id], capture_output=True,
                             text=True, timeout=timeout,
                             env={**os.environ, "LC_ALL": "C", "SLURM_TIME_FORMAT": "standard"})
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return parse_scontrol(out.stdout, node) if out.returncode == 0 else {}


def cgroup_cpus(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPU quota of this process's cgroup (v2 ``cpu.max`` or v1 CFS quota), or None."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        try:
            if controllers == "":  # v2
                text = (root / rel / "cpu.max").read_text().split()
                if text and text[0] != "max":
                    return int(text[0]) / int(text[1])
            elif "cpu" in controllers.split(","):
                base = root / controllers if (root / controllers).is_dir() else root / "cpu"
                quota = int((base / rel / "cpu.cfs_quota_us").read_text())
                period = int((base / rel / "cpu.cfs_period_us").read_text())
                if quota > 0 and period > 0:
                    return quota / period
        except (OSError, ValueError, IndexError):
            continue
    return None


def cpu_limit(usable: tuple[int, ...], env: dict | None = None) -> tuple[tuple[int, ...], str | None]:
    """``usable`` cut down to what the allocation and the cgroup quota grant, and why (or None).

    Which CPUs: SLURM's own ``CPU_IDs`` for this node where they are usable CPUs (asked only
    when the affinity mask holds more CPUs than the job), else the first ones."""
    alloc = current(env)
    limit, why = len(usable), None
    if alloc is not None and alloc.cpus is not None and alloc.cpus < limit:
        limit, why = alloc.cpus, f"{alloc.scheduler.value} job {alloc.job_id}: {alloc.cpus} CPUs"
        if alloc.scheduler is Scheduler.SLURM and alloc.node:
            ids = slurm_job_details(alloc.job_id, alloc.node).get("cpu_ids", ())
            if len(ids) == limit and set(ids) <= set(usable):
                return tuple(sorted(ids)), why + f" (CPU_IDs {','.join(map(str, ids))})"
    quota = cgroup_cpus()
    if quota is not None and math.ceil(quota) < limit:
        limit, why = max(1, math.ceil(quota)), f"cgroup CPU quota {quota:g}"
    return tuple(usable[:limit]), why
