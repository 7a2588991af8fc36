"""The embedded local backend (``LocalBackend``): worker processes on this machine,
rings in shared memory.  The design is in ``backend.py``; one module per concept:
``submit.py``, ``cancel.py``, ``pump.py``, ``lifecycle.py``."""

from .backend import LocalBackend

__all__ = ["LocalBackend"]
