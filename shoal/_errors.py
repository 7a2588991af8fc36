"""Exception hierarchy shared by every layer (leaf module: stdlib only)."""


class ShoalError(Exception):
    """Base class of every error shoal raises on purpose."""


class TopologyError(ShoalError, ValueError):
    """A bad topology description, e.g. a malformed ``SHOAL_TOPOLOGY`` value."""


class PilotClosed(ShoalError, RuntimeError):
    """The pilot was closed (or is closing): it takes no new work."""


class TaskTimeout(ShoalError, TimeoutError):
    """A task ran longer than its ``timeout=``; its worker was killed and replaced."""


class WorkerLost(ShoalError, RuntimeError):
    """The worker process running a task died (segfault, ``os._exit``, SIGKILL, OOM kill)."""


class BackendUnavailable(ShoalError, ConnectionError):
    """The backend's cluster cannot be reached, has no workers, or went away mid-run."""


class SerializationError(ShoalError, TypeError):
    """A function, argument or result could not be pickled or unpickled."""


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
