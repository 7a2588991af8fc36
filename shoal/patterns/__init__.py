"""Skeletons: parallel patterns built on shoal's public API only (a test checks it).

- ``shoal.patterns.backtracking``: ``count``, ``find``, ``solutions`` over a lazy search tree
- ``shoal.patterns.branch_and_bound``: ``maximise``, ``minimise`` with a shared incumbent
"""

from . import backtracking, branch_and_bound
from ._search import Coordination, SearchError, SearchStats

__all__ = ["Coordination", "SearchError", "SearchStats", "backtracking", "branch_and_bound"]
