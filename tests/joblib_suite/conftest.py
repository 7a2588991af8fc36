"""joblib's suite runs only its cases that involve the shoal backend (see
test_joblib_parallel.py), and joblib's own leak policy: loky keeps its reusable
workers between tests, so shoal's per-test child-process check does not apply;
what shoal leaves (worker processes, threads, segments) is checked once at the end."""

from __future__ import annotations

import os

import psutil
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _involves_shoal(item) -> bool:
    from shoal.integrations.joblib import ShoalBackend

    params = getattr(getattr(item, "callspec", None), "params", {})
    return any(v == "shoal" or isinstance(v, ShoalBackend) for v in params.values())


def pytest_collection_modifyitems(config, items):
    mine = [i for i in items if str(i.path).startswith(HERE + os.sep)]
    if not mine:
        return
    keep, drop = [], []
    for item in items:
        if item in mine and item.function.__module__ == "joblib.test.test_parallel" \
                and not _involves_shoal(item):
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    for item in mine:
        if item in keep:
            differences = getattr(item.module, "EXPECTED_DIFFERENCES", {})
            if item.name in differences:
                item.add_marker(pytest.mark.xfail(reason=differences[item.name], strict=True))


@pytest.fixture(autouse=True)
def leak_check():
    yield


@pytest.fixture(scope="session", autouse=True)
def shoal_leaves_nothing():
    yield
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
