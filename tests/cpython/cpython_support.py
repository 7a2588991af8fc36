"""Where CPython's ``test_concurrent_futures.py`` is, and how workers import it.

Imported by tests/cpython/test_cpython_executor.py in the driver and, by
reference, by shoal's workers (through the pilot's ``initializer``), so it
imports nothing but the standard library.  The interpreter's ``test`` package
usually lacks the suite: ``scripts/install-cpython-tests`` puts Debian's copy in
a cache folder, and both sides append that folder to ``test.__path__``.
"""

from __future__ import annotations

import os

HOW = ("CPython's test_concurrent_futures.py is not installed: run scripts/install-cpython-tests "
       "(needs root and apt; it fetches Debian's libpython3.11-testsuite), or set "
       "SHOAL_CPYTHON_TESTS to a folder holding the file")


def folder() -> str:
    return os.environ.get("SHOAL_CPYTHON_TESTS") or os.path.expanduser("~/.cache/shoal/cpython-tests")


def make_importable(where: str | None) -> None:
    import test

    if where and os.path.isfile(os.path.join(where, "test_concurrent_futures.py")) \
            and where not in test.__path__:
        test.__path__.append(where)


def load():
    """The suite module, or None when it is not installed."""
    make_importable(folder())
    try:
        from test import test_concurrent_futures
    except ImportError:
        return None
    return test_concurrent_futures


def init_worker(where: str, blob: bytes) -> None:
    """A worker's initializer: make the suite importable there, then run the test's own
    (``blob``: its pickled ``(initializer, initargs)``, unpickled only once it can be)."""
    import pickle

    make_importable(where)
    initializer, initargs = pickle.loads(blob)
    if initializer is not None:
        initializer(*initargs)
