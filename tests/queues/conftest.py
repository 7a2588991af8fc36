"""Fixtures for the queue tests: run every conformance test on both implementations."""
from __future__ import annotations

import pytest
from qhelpers import IMPLS


@pytest.fixture(params=IMPLS)
def native(request) -> bool:
    """True for the C helper, False for the pure-Python fallback."""
    return request.param
