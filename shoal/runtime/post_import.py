"""Run a function right after a module is first imported in this process (worker set-up).

A worker adopts some of the driver's state only when a task needs it: the
driver's ``multiprocessing`` authkey (``Manager`` proxies authenticate with it,
``shoal.runtime.worker``) and the driver's joblib backend registration
(``Parallel(backend="shoal")`` inside a task, ``shoal.integrations.joblib``).
Importing ``multiprocessing`` or joblib eagerly in every worker would cost each
worker start what those imports cost (tens of milliseconds to most of a
second) for tasks that never touch them; so ``when_imported(name, fn)`` runs
``fn(module)`` once ``name`` is imported — at once if it already is.

How: a ``sys.meta_path`` finder that answers only for the watched names, asks
the other finders for the real spec and wraps its loader so that ``fn`` runs
after the module's code; the module's ``__loader__`` is then the real loader
again.  Rejected: polling ``sys.modules`` (no moment to poll at); patching
``builtins.__import__`` (every import of the process pays for it);
``importlib``'s lazy loader (it defers the module's own code, not ours).
"""

from __future__ import annotations

import importlib.abc
import logging
import sys
import threading

_hooks: dict[str, list] = {}
_lock = threading.RLock()


def when_imported(name: str, fn) -> None:
    """Call ``fn(module)`` right after ``name`` is imported (now, if it already is)."""
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            _hooks.setdefault(name, []).append(fn)
            if not any(isinstance(f, _Finder) for f in sys.meta_path):
                sys.meta_path.insert(0, _Finder())
            return
    fn(module)


def _run(name: str, module) -> None:
    with _lock:
        hooks = _hooks.pop(name, [])
    for fn in hooks:
        try:
            fn(module)
        except Exception:  # noqa: BLE001 - the user's import must not fail for our set-up
            logging.getLogger("shoal.runtime").exception(
                "shoal: setting up after the import of %s failed", name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Loader(spec.loader, name)
        return spec


class _Loader(importlib.abc.Loader):
    def __init__(self, loader, name: str):
        self.loader, self.name = loader, name

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = self.loader  # the real loader for everyone who looks later
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        _run(self.name, module)

    def __getattr__(self, attr):
        return getattr(self.loader, attr)
