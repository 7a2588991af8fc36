"""joblib's own ``joblib/test/test_parallel.py`` with "shoal" added to its backend lists.

The backend is registered before the suite is imported, so every list the
suite builds from ``joblib.parallel.BACKENDS`` (``ALL_VALID_BACKENDS``, the
``BACKENDS``-parametrized tests, ``RETURN_GENERATOR_BACKENDS``) has "shoal";
the hand-written lists of process backends (``PROCESS_BACKENDS``,
``PARALLEL_BACKENDS``, ``all_backends_for_context_manager``) get "shoal"
appended before pytest expands their parametrizations (the marks hold the
same list objects).  Only the cases with shoal in their parameters run (the
others are joblib's business; conftest.py deselects them).  The tests run
unchanged; the differences from loky are listed in ``EXPECTED_DIFFERENCES``
with a reason each, and are strict expected failures (a difference that goes
away fails as XPASS, so the list cannot go stale).

Opt-in: ``pytest -m joblib_suite tests/joblib_suite``; skipped with the way to
enable it when joblib was installed without its tests.
"""

from __future__ import annotations

import joblib_support
import pytest

pytest.importorskip("joblib")
if not joblib_support.make_importable():
    pytest.skip(joblib_support.HOW, allow_module_level=True)

import shoal.integrations.joblib  # noqa: E402,F401  (registers "shoal" before the suite is imported)

# isort: split
from joblib.test import test_parallel as suite  # noqa: E402

for _name in ("PROCESS_BACKENDS", "PARALLEL_BACKENDS", "all_backends_for_context_manager"):
    _lst = getattr(suite, _name)
    if "shoal" not in _lst:
        _lst.insert(len([b for b in _lst if not str(b).startswith("test_backend")]), "shoal")

from joblib.test.test_parallel import *  # noqa: E402,F401,F403

pytestmark = [pytest.mark.joblib_suite]

# The one list of the differences from loky, test id -> reason.
_UNREGISTERED_IN_LOKY = (
    "the inner Parallel(backend='shoal') runs in a loky worker, which never imported "
    "shoal.integrations.joblib: a backend registered with register_parallel_backend exists only "
    "in the processes that import its module (the same holds for every third-party backend; "
    "shoal's own workers register it when a task imports joblib, and tests/integrations/"
    "test_joblib_backend.py checks that)")
EXPECTED_DIFFERENCES: dict[str, str] = {
    "test_nested_loop[loky-shoal]": _UNREGISTERED_IN_LOKY,
    "test_nested_loop[back_compat_backend-shoal]": _UNREGISTERED_IN_LOKY,
    "test_backend_nesting_level[parallel_config-shoal-loky]": _UNREGISTERED_IN_LOKY,
    "test_backend_nesting_level[parallel_backend-shoal-loky]": _UNREGISTERED_IN_LOKY,
    "test_parallel_with_interactively_defined_functions[shoal]": (
        "runs a script in a fresh interpreter that passes backend='shoal' without importing "
        "shoal.integrations.joblib, so joblib does not know the name (the script's functions "
        "defined in __main__ do run on shoal: tests/integrations/test_joblib_backend.py)"),
    "test_error_capture[shoal]": (
        "checks that the backend's private pool (_pool/_workers) is a new object after a task "
        "error, i.e. that loky's executor was killed and restarted; shoal keeps the pilot: the "
        "batches not started are cancelled and the running ones are force-cancelled, which "
        "kills and replaces only their workers. The errors themselves (ZeroDivisionError, "
        "KeyboardInterrupt) reach the caller as the test expects"),
}


def test_expected_differences_name_real_tests(request):
    """Every listed difference names a collected case (the list cannot go stale)."""
    names = {i.name for i in request.session.items}
    missing = [k for k in EXPECTED_DIFFERENCES if k not in names]
    assert not missing, missing


# joblib's own leak policy: loky keeps its reusable workers between tests, so shoal's per-test
# child-process check does not apply; what shoal leaves is checked once at the end.
@pytest.fixture(autouse=True)
def leak_check():
    yield


@pytest.fixture(scope="module", autouse=True)
def shoal_leaves_nothing():
    yield
    import psutil
    from joblib.externals.loky import get_reusable_executor

    import shoal.integrations.joblib as sj

    # loky's reusable workers ran nested shoal calls (test_nested_loop[loky-shoal]): their
    # default pilots close when those workers exit, checked below with ours
    get_reusable_executor().shutdown(wait=True)
    sj.close_default_pilot()
    left = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if "shoal.runtime.worker" in " ".join(proc.cmdline()):
                left.append(proc.pid)
        except psutil.Error:
            pass
    assert not left, f"joblib's suite left shoal workers behind: {left}"
