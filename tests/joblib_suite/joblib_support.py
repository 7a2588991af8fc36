"""Where joblib's own ``joblib/test`` package is, and how to make it importable.

joblib's wheels ship ``joblib/test`` (``test_parallel.py`` and its helpers
``common.py``, ``testutils.py``); a build without it (a distribution package
that strips tests) gets it from the sdist of the *installed* version:
``scripts/install-joblib-tests`` unpacks that sdist's ``joblib/test`` into a
cache folder, and ``make_importable`` appends the folder to ``joblib.__path__``
(so ``joblib.test`` imports from there).  Nothing of joblib is kept in this
repository.
"""

from __future__ import annotations

import os

HOW = ("joblib's test suite (joblib/test/test_parallel.py) is not installed with joblib: run "
       "scripts/install-joblib-tests (it fetches the sdist of the installed joblib version from "
       "PyPI with pip), or set SHOAL_JOBLIB_TESTS to a folder holding test/test_parallel.py")


def folder() -> str:
    import joblib

    return os.environ.get("SHOAL_JOBLIB_TESTS") or os.path.expanduser(
        f"~/.cache/shoal/joblib-tests/{joblib.__version__}")


def make_importable() -> bool:
    """True once ``joblib.test.test_parallel`` can be imported."""
    import importlib.util

    import joblib

    where = folder()
    if os.path.isfile(os.path.join(where, "test", "test_parallel.py")) and where not in joblib.__path__:
        joblib.__path__.append(where)
    try:
        return importlib.util.find_spec("joblib.test.test_parallel") is not None
    except ImportError:
        return False
