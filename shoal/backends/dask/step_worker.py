"""One dask worker of a job's worker step (job_nodes.py), named after the node it runs on.

``srun`` starts the same command line on every node, so a per-node name cannot be on it;
this entry point adds ``--name <prefix>-<node>`` (``SLURMD_NODENAME``, else the host name) and
hands the rest to dask's own ``dask worker`` command.  The worker runs without a nanny: the
srun task *is* the worker, so srun's signals reach it directly and nothing outlives the step.
"""

from __future__ import annotations

import os
import socket
import sys


def worker_name(prefix: str, node: str) -> str:
    """``shoal-42-h2``: unique per node of a step (one worker per node)."""
    return f"{prefix}-{node}"


def worker_args(argv: list[str], env) -> list[str]:
    """``SCHEDULER --name-prefix P REST...`` -> dask worker's arguments (pure)."""
    if len(argv) < 3 or argv[1] != "--name-prefix":
        raise SystemExit("usage: python -m shoal.backends.dask.step_worker SCHEDULER "
                         "--name-prefix PREFIX [dask worker options]")
    scheduler, prefix, rest = argv[0], argv[2], argv[3:]
    node = env.get("SLURMD_NODENAME") or socket.gethostname()
    return [scheduler, "--name", worker_name(prefix, node), "--no-nanny", "--nworkers", "1",
            "--no-dashboard", *rest]


def main() -> None:
    from distributed.cli.dask_worker import main as dask_worker

    dask_worker(worker_args(sys.argv[1:], os.environ))


if __name__ == "__main__":
    main()
