"""How function tasks run on a pilot: on the CPUs the run granted them, with their code.

Two concerns of function tasks that executables handle in the launcher:

* **CPUs.** A function task with ``cores=N`` holds N of the run's cores in the
  Scheduler, like an executable; on the local backend ``with_cpus`` runs it
  on a pilot worker with its affinity widened to exactly the granted CPUs,
  ``OMP_NUM_THREADS``/``OPENBLAS_NUM_THREADS``/``MKL_NUM_THREADS`` set to N
  and the BLAS/OpenMP pools limited to N (threadpoolctl), all restored
  afterwards so the worker's next task is as before.  (A shoal worker is
  pinned to one CPU; without this the task ran on one CPU with no thread hint.)
* **Code.** On a dask pilot the workers are other processes, maybe on other
  machines, that cannot import a ``hooks.py`` beside the workflow: ``ship_code``
  registers such *local* modules (not installed under the interpreter's prefix
  or site-packages) with cloudpickle to travel by value.

Rejected alternatives: ``client.upload_file`` for local modules (a file per
module per cluster, stale copies on the workers across runs, and no help for
the workflow script's own functions); setting a worker's affinity for its
whole life to N CPUs (a 1-core task after it would run on N).
"""

from __future__ import annotations

import contextlib
import os
import sys
import sysconfig


def with_cpus(fn, cpus, cores: int, *args, **kwargs):
    """Run ``fn`` on a pilot worker with the task's granted CPUs: affinity widened to ``cpus``,
    OMP_NUM_THREADS and the BLAS/OpenMP pools (threadpoolctl, if installed) set to ``cores``;
    all restored afterwards, so the worker's next task is as before."""
    old_cpus = None
    with contextlib.suppress(AttributeError, OSError):
        old_cpus = os.sched_getaffinity(0)
        os.sched_setaffinity(0, cpus)
    old_env = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    for k in old_env:
        os.environ[k] = str(cores)
    try:
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:  # pragma: no cover - optional
            return fn(*args, **kwargs)
        with threadpool_limits(limits=cores):
            return fn(*args, **kwargs)
    finally:
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if old_cpus is not None:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, old_cpus)


_SHIPPED: set[str] = set()


def _installed_roots() -> list[str]:
    paths = sysconfig.get_paths()
    roots = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots |= {sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    return [os.path.realpath(r) for r in roots if r]


def ship_code(fn) -> bool:
    """Make ``fn``'s module travel by value to a dask pilot's workers when it is *local code*.

    Local code is a module whose file is not installed (not under the interpreter's prefix,
    site-packages, or shoal itself): a ``hooks.py`` beside the workflow, imported from the
    driver's ``sys.path``, which the dask workers — other processes, maybe other machines —
    cannot import.  cloudpickle then pickles its functions by value (the dask backend
    cloudpickles task functions once per worker).  Functions of the workflow script itself
    are by value already (its module is not importable).  Returns True if it registered.

    Trust boundary: unchanged — dask workers unpickle what the driver sends in any case."""
    name = getattr(fn, "__module__", None)
    module = sys.modules.get(name) if name else None
    if module is None or name in _SHIPPED or name == "__main__":
        return False
    path = getattr(module, "__file__", None)
    if not path:
        return False
    real = os.path.realpath(path)
    if any(real.startswith(root + os.sep) for root in _installed_roots()):
        return False
    import cloudpickle

    try:
        cloudpickle.register_pickle_by_value(module)
    except ValueError:  # pragma: no cover - not in sys.modules under that name
        return False
    _SHIPPED.add(name)
    return True
