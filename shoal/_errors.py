"""Exception hierarchy shared by every layer (leaf module: stdlib only).

Where the standard library has a type for the same failure, shoal's error is
also an instance of it, so code written for ``concurrent.futures`` catches it:
``WorkerLost``/``BrokenPilot`` are ``concurrent.futures.BrokenExecutor``s,
``TaskTimeout`` is a ``TimeoutError``, and the two serialization failures are
``pickle.PicklingError``/``pickle.UnpicklingError``.
"""

import pickle
from concurrent.futures import BrokenExecutor


class ShoalError(Exception):
    """Base class of every error shoal raises on purpose."""


class TopologyError(ShoalError, ValueError):
    """A bad topology description, e.g. a malformed ``SHOAL_TOPOLOGY`` value."""


class PilotClosed(ShoalError, RuntimeError):
    """The pilot was closed (or is closing): it takes no new work."""


class TaskTimeout(ShoalError, TimeoutError):
    """A task ran longer than its ``timeout=``; its worker was killed and replaced."""


class WorkerLost(ShoalError, BrokenExecutor):
    """The worker process running a task died (segfault, ``os._exit``, SIGKILL, OOM kill).

    A ``concurrent.futures.BrokenExecutor`` (a ``RuntimeError``), although only the
    task is lost: the pilot replaces the worker and goes on (a process pool breaks).
    """


class BrokenPilot(ShoalError, BrokenExecutor):
    """The pilot cannot run tasks any more: a worker's ``initializer`` failed (stdlib semantics)."""


class BackendUnavailable(ShoalError, ConnectionError):
    """The backend's cluster cannot be reached, has no workers, or went away mid-run."""


class SerializationError(ShoalError, TypeError):
    """A function, argument or result could not be pickled or unpickled (base of the two below)."""


class PicklingError(SerializationError, pickle.PicklingError):
    """A function, argument or result could not be pickled."""


class UnpicklingError(SerializationError, pickle.UnpicklingError):
    """An argument or result could not be unpickled (also when unpickling raised SystemExit)."""


class RemoteTraceback(Exception):
    """Carries the formatted traceback of an exception raised in a worker.

    Set as ``__cause__`` of the re-raised exception, so the driver's traceback
    shows the worker's frames too (the trick of concurrent.futures.process).
    """

    def __init__(self, tb: str, hops: int = 0):
        super().__init__(tb)
        self.tb = tb
        self.hops = hops  # further process boundaries it crossed after the first (not re-nested)

    def __str__(self) -> str:
        if self.hops:
            return f"{self.tb}\n(re-raised across {self.hops} more process boundaries on its way here)"
        return self.tb


def install_hint(extra: str, packages: str) -> str:
    """How to install what an optional feature needs, in a form that works wherever shoal came
    from: shoal is not on a package index, so ``pip install 'shoal[extra]'`` works only from
    a checkout; naming the packages themselves works for a wheel, an sdist or a checkout."""
    return (f"pip install {packages} (the '{extra}' extra: pip install -e '.[{extra}]' in a "
            f"checkout, or pip install 'shoal-<version>.whl[{extra}]' with the wheel)")
