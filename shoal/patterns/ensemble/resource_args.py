"""``shoal run``'s batch-allocation flags (``--slurm``, ``--nodes``, ``--jobs``, ...) -> a ``Resource``.

The command line's half of resource.py: it reads the flags and a YAML workflow file's
``resource:`` block (yamlfile.py) and merges them into one ``Resource`` (resource.py), so
that neither of those two modules imports the other (the block is read with the YAML
loader's line-numbered errors, the Resource is checked by ``Resource.of``).
"""

from __future__ import annotations

import dataclasses
import sys
import time

import shoal

from .config import parse_walltime
from .model import EnsembleError
from .resource import Resource, merge, time_left
from .yamlfile import yaml_resource


def add_resource_arguments(parser) -> None:
    """``shoal run``'s allocation flags (commands.py calls it)."""
    hpc = parser.add_argument_group("a batch allocation of its own (docs/hpc.md)")
    hpc.add_argument("--slurm", action="store_true",
                     help="run in a SLURM job of --nodes nodes (an elastic --jobs: one job per "
                          "node); --walltime is then the job's length")
    hpc.add_argument("--nodes", type=int, default=None, help="nodes of the batch job, default 1")
    hpc.add_argument("--jobs", default=None, metavar="N|LOW:HIGH",
                     help="batch jobs: a count (as --nodes), or LOW:HIGH for an elastic pilot "
                          "that submits jobs while tasks wait and gives idle ones back")
    hpc.add_argument("--grow-after", type=float, default=None, metavar="S",
                     help="elastic pilot: submit jobs once a task has waited S seconds (default 10)")
    hpc.add_argument("--idle-after", type=float, default=None, metavar="S",
                     help="elastic pilot: give a job back once idle S seconds (default 60)")
    hpc.add_argument("--cores", type=int, default=None, help="cores per node, default 1")
    hpc.add_argument("--partition", default=None, help="SLURM partition (queue)")
    hpc.add_argument("--account", default=None, help="account (project) to charge")


def resource_from_args(args) -> tuple[Resource | None, float | None]:
    """(the allocation to ask for, the engine's walltime) from ``shoal run``'s arguments.

    With --slurm or a YAML ``resource:`` block: the Resource (flags override the block)
    and no engine walltime (it comes from the allocation).  Otherwise no Resource and
    ``--walltime``; without one, inside a batch job: the time until the job ends.
    Sets ``args.extra_resume``: the (flag, value) pairs the resume hint must repeat."""
    jobs = getattr(args, "jobs", None)
    if jobs is not None and args.nodes is not None:
        raise EnsembleError("--nodes and --jobs both give the batch jobs: give one of them")
    thresholds = {"grow_after_s": getattr(args, "grow_after", None),
                  "idle_after_s": getattr(args, "idle_after", None)}
    flags = {"nodes": args.nodes, "jobs": jobs, "cores": args.cores,
             "partition": args.partition, "account": args.account,
             "grow-after": thresholds["grow_after_s"], "idle-after": thresholds["idle_after_s"]}
    args.extra_resume = ([("--slurm", None)] if args.slurm else []) + [
        (f"--{k}", v) for k, v in flags.items() if v is not None]
    base = yaml_resource(args.workflow) if args.workflow.endswith((".yaml", ".yml")) else None
    if base is None and not args.slurm:
        given = [f"--{k}" for k, v in flags.items() if v is not None]
        if given:
            raise EnsembleError(f"{', '.join(given)} describe a batch allocation: add --slurm")
        walltime = parse_walltime(args.walltime)
        if walltime is None and not args.dask:
            walltime = _allocation_walltime()
        return None, walltime
    if args.dask:
        raise EnsembleError("--dask runs on an existing cluster; --slurm (or a resource: block) "
                            "asks for an allocation: give one of them")
    flags["nodes"] = flags.pop("jobs") if jobs is not None else flags["nodes"]
    del flags["grow-after"], flags["idle-after"]
    resource = merge(base, backend="slurm" if args.slurm else None, walltime=args.walltime,
                     **flags)
    given = {k: v for k, v in thresholds.items() if v is not None}
    if given:
        if isinstance(resource.nodes, int):
            raise EnsembleError(f"{', '.join('--' + k.removesuffix('_s').replace('_', '-') for k in given)} "
                                f"apply to an elastic pilot: add --jobs LOW:HIGH (e.g. --jobs 1:4)")
        resource = dataclasses.replace(resource, options=tuple(sorted(
            {**dict(resource.options), **given}.items())))
    return resource, None


def _allocation_walltime() -> float | None:
    """Inside a batch job: seconds until it ends, less the drain margin (None outside one)."""
    alloc = shoal.allocation()
    if alloc is None:
        return None
    start, end = alloc.times()
    if end is None:
        return None
    left = time_left(None, time.time(), start, end)
    print(f"shoal run: inside {alloc.scheduler.value} job {alloc.job_id}: draining before it "
          f"ends, in {left:.0f} s", file=sys.stderr)
    return left


__all__ = ["add_resource_arguments", "resource_from_args"]
