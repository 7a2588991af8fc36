"""Where an ensemble runs when it asks for a batch allocation: ``run(..., resource=...)``.

EnTK's idea (a resource description next to the workflow), in shoal's words::

    run(workflow, resource={"backend": "slurm", "nodes": 2, "cores": 16,
                            "partition": "normal", "walltime": "2h"})
    shoal run wf.py --slurm --nodes 2 --cores 16 --partition normal --walltime 2h
    resource: {backend: slurm, nodes: 2, cores: 16, walltime: 2h}     # in a YAML workflow

Data flow: ``Resource.of`` validates the description (unknown keys: an error
with a did-you-mean) ──► ``resource_pilot`` opens a dask pilot with
``provider="slurm"`` (``nodes > 1``: one batch job of that many nodes with a dask worker per
node; one node or an elastic range: one job per node, ``cores`` each) ──► it waits for
the first job to run (the job watch logs queue state meanwhile; a job that can
never start fails here with SLURM's reason) and asks, from inside the job, when
the allocation ends ──► the engine gets the time left as its walltime and
drains before the end ──► the pilot closes and its jobs leave the queue.

Walltime, one meaning (docs/hpc.md): the number is the allocation's length in
seconds (or '30m', '2h', 'HH:MM:SS'), counted from when the job starts running,
not from when it was submitted.  The engine stops starting tasks that cannot
finish ``margin(walltime)`` before the end (``min(300 s, max(3 s, walltime / 10))``),
kills what still runs at that point and leaves it PENDING in the journal, so
``--resume`` in a new allocation finishes the rest; the dask workers retire
(``--lifetime``) only after that point.

Rejected: counting the walltime from submission (a job that waits an hour in the
queue would start with no time left); trusting SLURM's time limit alone (it is
rounded up to whole minutes: a 30-second request runs for 60).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import enum
import time

import shoal

from .config import parse_walltime
from .model import EnsembleError

KEYS = {
    "backend": "slurm or pbs",
    "nodes": "integer (nodes of one batch job), or 'low:high' (an elastic pilot of one-node "
             "jobs; alias: jobs)",
    "cores": "integer (per node)", "memory": "size per node, e.g. '8GB'",
    "partition": "string (alias: queue)", "account": "string (alias: project)",
    "walltime": "seconds, '30m', '2h' or 'HH:MM:SS'", "job_extra": "list of batch directives",
    "options": "mapping passed to dask-jobqueue (e.g. log_directory)",
}
ALIASES = {"queue": "partition", "project": "account", "jobs": "nodes"}


class ResourceKind(enum.Enum):
    SLURM = "slurm"
    PBS = "pbs"


def margin(walltime: float) -> float:
    """Seconds before the allocation's end at which the engine stops (see the module doc)."""
    return min(300.0, max(3.0, walltime / 10))


@dataclasses.dataclass(frozen=True)
class Resource:
    """A batch allocation for one run: ``nodes`` jobs of ``cores`` cores for ``walltime`` s
    (``nodes=(low, high)``: an elastic pilot, between ``low`` and ``high`` jobs)."""

    backend: ResourceKind = ResourceKind.SLURM
    nodes: int | tuple[int, int] = 1
    cores: int = 1
    memory: str | None = None
    partition: str | None = None
    account: str | None = None
    walltime: float | None = None
    job_extra: tuple[str, ...] = ()
    options: tuple[tuple[str, object], ...] = ()

    @classmethod
    def of(cls, value) -> Resource:
        """A Resource from itself or a mapping (keys: ``KEYS``, plus EnTK's queue/project)."""
        if isinstance(value, Resource):
            return value
        if not isinstance(value, dict):
            raise EnsembleError(f"resource must be a mapping such as {{'backend': 'slurm', "
                                f"'cores': 4, 'walltime': '1h'}}, got {value!r}")
        kw: dict = {}
        for key, v in value.items():
            name = ALIASES.get(key, key)
            if name not in KEYS:
                close = difflib.get_close_matches(str(key), [*KEYS, *ALIASES], n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise EnsembleError(f"resource: unknown key {key!r}{hint}; allowed: "
                                    f"{', '.join(KEYS)}")
            if name in kw:
                raise EnsembleError(f"resource: {key!r} given twice (queue = partition, "
                                    "project = account, jobs = nodes)")
            kw[name] = v
        try:
            kw["backend"] = ResourceKind(kw.get("backend", "slurm"))
        except ValueError:
            raise EnsembleError(f"resource: backend {kw['backend']!r}; choose one of "
                                f"{', '.join(k.value for k in ResourceKind)}") from None
        kw["nodes"] = _nodes(kw.get("nodes", 1))
        n = kw.get("cores", 1)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise EnsembleError(f"resource: cores must be an integer >= 1, got {n!r}")
        for name in ("memory", "partition", "account"):
            if kw.get(name) is not None and not isinstance(kw[name], str):
                raise EnsembleError(f"resource: {name} must be a string, got {kw[name]!r}")
        if kw.get("walltime") is not None:
            kw["walltime"] = parse_walltime(kw["walltime"])
        extra = kw.get("job_extra", ())
        if isinstance(extra, str) or not all(isinstance(x, str) for x in extra):
            raise EnsembleError(f"resource: job_extra must be a list of strings such as "
                                f"['--exclusive'], got {extra!r}")
        kw["job_extra"] = tuple(extra)
        options = kw.get("options", {})
        if not isinstance(options, dict):
            raise EnsembleError(f"resource: options must be a mapping, got {options!r}")
        kw["options"] = tuple(sorted(options.items()))
        return cls(**kw)

    @classmethod
    def from_entk(cls, desc: dict) -> Resource | None:
        """EnTK's ``resource_desc`` (``{"resource": "xsede.stampede2", "walltime": 30,
        "cpus": 64, "queue": ..., "project": ...}``): None for ``local.*`` (run here), else a
        SLURM resource of one node with ``cpus`` cores (``backend`` may say ``pbs``).  EnTK's
        walltime is in minutes; it is converted here, so the Resource's is seconds."""
        if not isinstance(desc, dict):
            raise EnsembleError(f"resource_desc must be a mapping, got {desc!r}")
        known = {"resource", "walltime", "cpus", "gpus", "queue", "project", "backend",
                 "access_schema", "schema", "memory", "nodes"}  # schema: access_schema's other spelling
        unknown = sorted(set(desc) - known)
        if unknown:
            close = difflib.get_close_matches(unknown[0], known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise EnsembleError(f"resource_desc: unknown key {unknown[0]!r}{hint}; "
                                f"allowed: {', '.join(sorted(known))}")
        if str(desc.get("resource", "local")).startswith("local"):
            return None
        if desc.get("gpus"):
            raise EnsembleError("resource_desc: gpus on a batch resource are not supported "
                                "(an ensemble on a dask pilot places no GPUs)")
        mapping = {"backend": desc.get("backend", "slurm"), "cores": desc.get("cpus", 1),
                   "nodes": desc.get("nodes", 1)}
        for key in ("queue", "project", "memory"):
            if desc.get(key) is not None:
                mapping[key] = desc[key]
        if desc.get("walltime") is not None:
            minutes = desc["walltime"]
            if isinstance(minutes, bool) or not isinstance(minutes, int | float) or minutes <= 0:
                raise EnsembleError(f"resource_desc: walltime is in minutes (a number > 0), "
                                    f"got {minutes!r}")
            mapping["walltime"] = minutes * 60
        return cls.of(mapping)

    def pilot_options(self) -> dict:
        """Keyword arguments of ``shoal.Pilot`` for this resource."""
        one_job = (isinstance(self.nodes, int) and self.nodes > 1
                   and self.backend is ResourceKind.SLURM)
        if one_job:  # ONE job of N nodes, a worker step over them; memory only when asked for
            kw = {"backend": shoal.BackendKind.DASK, "provider": self.backend.value,
                  "nodes": self.nodes, "cores_per_node": self.cores, **dict(self.options)}
            if self.memory is not None:
                kw["memory"] = self.memory
        else:  # one node, elastic (whole jobs come and go) or PBS: dask-jobqueue's jobs,
            # watched by the job watch (docs/hpc.md)
            kw = {"backend": shoal.BackendKind.DASK, "provider": self.backend.value,
                  "jobs": self.nodes, "cores": self.cores,
                  "memory": self.memory or f"{2 * self.cores}GB", **dict(self.options)}
        if self.partition is not None:
            kw["queue"] = self.partition
        if self.account is not None:
            kw["account"] = self.account
        if self.job_extra:
            kw["job_extra"] = list(self.job_extra)
        if self.walltime is not None:
            kw["walltime"] = self.walltime
            if not one_job:  # workers retire (--lifetime) after the engine stops
                kw["drain_margin_s"] = margin(self.walltime) / 2
        return kw


def _nodes(value) -> int | tuple[int, int]:
    """``nodes``: a count (2, "2"), or a range ("1:8", [1, 8]) for an elastic pilot (the
    pilot's own ``jobs=`` reading, which patterns may not import, is the same)."""
    pair = None
    if isinstance(value, str):
        low, sep, high = value.partition(":")
        if low.strip().isdigit() and (not sep or high.strip().isdigit()):
            pair = (int(low), int(high) if sep else int(low))
    elif isinstance(value, int) and not isinstance(value, bool):
        pair = (value, value)
    elif isinstance(value, list | tuple) and len(value) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        pair = (value[0], value[1])
    if pair is None or not 0 <= pair[0] <= pair[1] or pair[1] < 1:
        raise EnsembleError(f"resource: nodes must be an integer >= 1 or a range 'low:high' "
                            f"with 0 <= low <= high (an elastic pilot), got {value!r}")
    return pair[0] if pair[0] == pair[1] else pair


def _inside() -> tuple[str | None, float, float | None, float | None]:
    """Runs in the allocation: (job id, now, start, end) as the batch system says."""
    alloc = shoal.allocation()
    if alloc is None:
        return None, time.time(), None, None
    start, end = alloc.times()
    return alloc.job_id, time.time(), start, end


def time_left(walltime: float | None, now: float, start: float | None,
              end: float | None) -> float | None:
    """Seconds the engine may run from ``now`` (pure): until ``min(start + walltime, end)``
    less the margin; None when nothing bounds it."""
    ends = [e for e in (end, start + walltime if start is not None and walltime else None)
            if e is not None]
    if not ends:
        if walltime is None:
            return None
        ends = [now + walltime]  # the job's start is unknown: count from now
    left = min(ends) - margin(walltime or (min(ends) - (start or now))) - now
    return max(left, 1e-3)


@contextlib.contextmanager
def resource_pilot(resource: Resource, wait_timeout: float | None = None):
    """Open the allocation: ``with resource_pilot(r) as (pilot, seconds_left): ...``.

    Blocks until the first job runs (the pilot's job watch logs queue state while it
    waits; a job that can never start raises ``shoal.BackendUnavailable`` with SLURM's
    reason); ``seconds_left`` is the engine's walltime (None without a walltime)."""
    pilot = shoal.Pilot(**resource.pilot_options())
    try:
        job_id, now, start, end = pilot.submit(_inside).result(wait_timeout)
        if job_id is None:
            raise EnsembleError("the resource's first task did not run inside a batch job")
        left = time_left(resource.walltime, now, start, end)
        if left is not None:
            left -= max(0.0, time.time() - now)
        yield pilot, (None if left is None else max(left, 1e-3))
    except BaseException:
        pilot.close(cancel_pending=True)
        raise
    else:
        pilot.close()


def merge(base, **overrides) -> Resource | None:
    """``base`` (None, a mapping or a Resource) with the command line's non-None values,
    validated as a whole (``--cores 0`` is the same error as ``cores: 0``)."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if base is None and not given:
        return None
    r = Resource.of(base) if base is not None else Resource()
    fields = {"backend": r.backend.value, "nodes": r.nodes, "cores": r.cores,
              "memory": r.memory, "partition": r.partition, "account": r.account,
              "walltime": r.walltime, "job_extra": list(r.job_extra), "options": dict(r.options)}
    return Resource.of({**{k: v for k, v in fields.items() if v is not None}, **given})


__all__ = ["Resource", "ResourceKind", "resource_pilot", "time_left", "margin", "merge", "KEYS",
           "ALIASES"]
