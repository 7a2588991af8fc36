"""The dask.distributed backend, one module per role.

===================  ==============================================================
module               role
===================  ==============================================================
``backend.py``       ``DaskBackend``: the driver side (submit, map, results, close)
``node.py``          the node runtime inside each dask worker (a LocalBackend)
``balance.py``       the driver's balancer: spawned work lent between machines
``cells.py``         cluster-wide BestCells, channels, per-node arrays; the topic
``provider.py``      ``provider="slurm"|"pbs"``: the dask-jobqueue cluster
``jobs.py``          ``JobWatch``: queue progress and replacement of batch jobs
``job_nodes.py``     one job's nodes: a scheduler here, one srun step of workers
``step_worker.py``   the entry point srun starts on each node (a per-node name)
===================  ==============================================================

The data flow across them is in ``backend.py``'s docstring and docs/dask.md.
"""

from .backend import DaskBackend

__all__ = ["DaskBackend"]
