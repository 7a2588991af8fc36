"""Fixtures shared by the search tests of this folder."""

from __future__ import annotations

import pytest

from shoal import _tick


@pytest.fixture(params=["ticked", "countdown"])
def both_count_loops(request, monkeypatch):
    """Run a test on both count loops: the ticked one (where the native ticker is built) and
    the countdown one it falls back to (dask's threads, no C compiler, SHOAL_SEARCH_TICK=0).
    A module opts in with ``pytestmark = pytest.mark.usefixtures("both_count_loops")``."""
    if request.param == "ticked" and not _tick.available():
        pytest.skip("shoal._ticker not built: only the countdown loop runs here")
    monkeypatch.setattr(_tick, "ENABLED", request.param == "ticked")
    monkeypatch.setenv("SHOAL_SEARCH_TICK", "1" if request.param == "ticked" else "0")  # (pilots)
