"""From an entry point to a finished run: the pilot to run on, then the ``Engine``.

``run()`` (the package), ``AppManager.run()`` (entk.py) and ``shoal run`` (commands.py)
each build one ``EngineConfig`` (config.py) and call ``run_workflow`` with the pilot they
were given or the batch allocation they were asked for.  It opens what the run needs and
closes it at the end:

  * ``resource=`` (a batch allocation, resource.py): a dask pilot of batch jobs; the
    run's walltime is the smaller of the one given and the allocation's time left;
  * no pilot in the batch step of a SLURM job of several nodes: one pilot over all of
    them (``shoal.Pilot()`` decides: a dask worker on every node, or this node only
    with ``SHOAL_ALL_NODES=0``); on dask, the nodes' sizes (``node_specs``) let the
    run refuse a task no node can hold, naming the largest;
  * otherwise the given pilot, or none (the engine starts a local one with the first
    function task).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

import shoal

from . import nodes
from .config import EngineConfig
from .engine import Engine
from .model import EnsembleError
from .report import Report
from .resource import Resource, resource_pilot


def run_workflow(workflow, config: EngineConfig, *, pilot=None, resource=None) -> Report:
    """Run ``workflow`` with ``config`` on ``pilot`` or in the allocation ``resource``."""
    if resource is not None:
        if pilot is not None:
            raise EnsembleError("run(): give pilot= or resource=, not both")
        with resource_pilot(Resource.of(resource)) as (rpilot, left):
            budget = [w for w in (config.walltime, left) if w is not None]
            config = dataclasses.replace(config, walltime=min(budget) if budget else None)
            return run_workflow(workflow, config, pilot=rpilot)
    with contextlib.ExitStack() as stack:
        node_specs = ()
        if pilot is None and _several_nodes():
            pilot = stack.enter_context(shoal.Pilot(config.workers))
            config = dataclasses.replace(config, workers=None)
            if pilot.backend is shoal.BackendKind.DASK:  # each node's worker has the
                # smallest node's cores (one srun step: one --cpus-per-task for all)
                found = nodes.slurm_nodes(os.environ)
                least = min(n.cores for n in found)
                node_specs = [dataclasses.replace(n, cores=least) for n in found]
        return Engine(workflow, config, pilot=pilot, node_specs=node_specs).run()


def _several_nodes() -> bool:
    alloc = shoal.allocation()
    return alloc is not None and len(alloc.nodes) > 1


__all__ = ["run_workflow"]
