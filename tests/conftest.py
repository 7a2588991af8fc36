"""Shared fixtures: a leak check around every test, and small helpers.

The leak check (docs/architecture.md, "Testing habits") fails a test that leaves
behind a child process, a shoal thread, a /dev/shm entry or open file
descriptors.  Children get a grace period to exit (pilots shut down
asynchronously only in error paths).
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time

import psutil
import pytest

faulthandler.enable()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _shm() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


# A real browser's processes are not leaks: the dashboard's browser tests keep one Chromium
# per module (tests/dashboard/conftest.py closes it), and its renderers come and go with pages.
_BROWSER_EXES = ("chromium", "chrome", "headless_shell")


def _is_browser(proc) -> bool:
    try:
        return os.path.basename(proc.exe()).startswith(_BROWSER_EXES)
    except psutil.Error:
        return False


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if not _is_browser(p)}


def _fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def _shoal_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("shoal")}


HEAVY_LIST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "heavy_tests.txt")


def heavy_prefixes() -> list[str]:
    """The node-id prefixes tests/heavy_tests.txt lists (comments and blank lines dropped)."""
    with open(HEAVY_LIST) as f:
        return [ln.strip() for ln in f if ln.strip() and not ln.lstrip().startswith("#")]


# what this session collected, for tests/test_heavy_list.py: the files, and the list's
# prefixes that matched a test (before -m deselected any)
HEAVY_SEEN: dict[str, set[str]] = {"files": set(), "matched": set()}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def _involves_shoal(item) -> bool:
    from shoal.integrations.joblib import ShoalBackend

    params = getattr(getattr(item, "callspec", None), "params", {})
    return any(v == "shoal" or isinstance(v, ShoalBackend) for v in params.values())


def _select_joblib_suite_cases(config, items):
    """tests/joblib_suite runs joblib's own test_parallel.py: only its cases that involve the
    shoal backend, and joblib_suite's EXPECTED_DIFFERENCES as strict xfails.  (Here, not in a
    tests/joblib_suite/conftest.py: a second conftest module shadows this one for the tests
    that import run_script from it.)"""
    here = os.path.join(ROOT, "tests", "joblib_suite")
    mine = [i for i in items if str(i.path).startswith(here + os.sep)]
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


def pytest_collection_modifyitems(config, items):
    _select_joblib_suite_cases(config, items)
    prefixes = heavy_prefixes()
    for item in items:
        HEAVY_SEEN["files"].add(item.nodeid.split("::")[0])
        for prefix in prefixes:
            if item.nodeid.startswith(prefix):
                item.add_marker(pytest.mark.heavy)
                HEAVY_SEEN["matched"].add(prefix)


# dask's scheduler falls back from a taken port with a warning ("Port 8787 is already in use"),
# which pyproject.toml makes an error.  Holding 8787 for the session makes a test that starts a
# dashboard on the fixed default port (``dashboard_address=None`` still binds 8787) fail here
# every time, not only on a machine where something else happens to listen there.
DASK_DEFAULT_DASHBOARD_PORT = 8787


@pytest.fixture(scope="session", autouse=True)
def dask_default_port_held():
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", DASK_DEFAULT_DASHBOARD_PORT))
        sock.listen(1)
    except OSError:  # taken by someone else: a fixed-port test warns (an error) all the same
        pass
    yield
    sock.close()


@pytest.fixture(autouse=True)
def leak_check(request):
    yield from check_leaks(request)


def check_leaks(request):
    """The leak check's body, for modules that override ``leak_check`` for some tests only."""
    if request.node.get_closest_marker("no_leak_check"):
        yield
        return
    children, shm, fds, threads = _children(), _shm(), _fds(), _shoal_threads()
    yield
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        extra = _children() - children
        if not extra and not (_shoal_threads() - threads):
            break
        time.sleep(0.05)
    extra = _children() - children
    leftover = []
    for pid in extra:
        try:
            leftover.append(" ".join(psutil.Process(pid).cmdline())[:120])
        except psutil.Error:
            pass
    assert not leftover, f"test left child processes behind: {leftover}"
    assert not (_shoal_threads() - threads), f"test left threads: {_shoal_threads() - threads}"
    new_shm = {n for n in _shm() - shm if n.startswith(("psm_", "shoal", "wnsm_"))}
    assert not new_shm, f"test left /dev/shm segments: {new_shm}"
    slack = request.node.get_closest_marker("fd_slack")
    slack = slack.args[0] if slack else 2
    assert _fds() <= fds + slack, f"test leaked file descriptors: {fds} before, {_fds()} after"


def run_script(code: str, timeout: float = 60, env: dict | None = None):
    """Run ``code`` as a __main__ script in a fresh interpreter; returns CompletedProcess."""
    import subprocess

    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in [ROOT, full_env.get("PYTHONPATH")] if p)
    if env:
        full_env.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, env=full_env)


@pytest.fixture(params=["ticked", "countdown"])
def both_count_loops(request, monkeypatch):
    """Run a test on both search count loops: the ticked one (where the native ticker is
    built) and the countdown one it falls back to (dask's threads, no C compiler,
    SHOAL_SEARCH_TICK=0).  A module opts in with
    ``pytestmark = pytest.mark.usefixtures("both_count_loops")``."""
    from shoal import _tick

    if request.param == "ticked" and not _tick.available():
        pytest.skip("shoal._ticker not built: only the countdown loop runs here")
    monkeypatch.setattr(_tick, "ENABLED", request.param == "ticked")
    monkeypatch.setenv("SHOAL_SEARCH_TICK", "1" if request.param == "ticked" else "0")  # (pilots)
