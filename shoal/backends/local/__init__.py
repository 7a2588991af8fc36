"""The embedded local backend (``LocalBackend``): worker processes on this machine,
rings in shared memory.  The design is in ``backend.py``: components with their own
state (``processes.py``, ``timers.py``, ``replies.py``; their locks' order in
``locks.py``) and one module per concept over the task table (``submit.py``,
``cancel.py``, ``pump.py``, ``lifecycle.py``, ``stopped.py``)."""

from .backend import LocalBackend

__all__ = ["LocalBackend"]
