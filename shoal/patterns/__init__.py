"""Skeletons: parallel patterns built on shoal's public API only (a test checks it).

- ``shoal.patterns.backtracking``: ``count``, ``find``, ``solutions`` over a lazy search tree
- ``shoal.patterns.branch_and_bound``: ``maximise``, ``minimise`` with a shared incumbent
- ``shoal.patterns.all_pairs``: ``compute`` over every pair of items, tiled, cached, stolen
- ``shoal.ensemble`` (implemented in ``shoal.patterns.ensemble``): Pipeline/Stage/Task workflows
"""

from . import all_pairs, backtracking, branch_and_bound
from .search import Coordination, SearchError, SearchStats

__all__ = ["Coordination", "SearchError", "SearchStats", "all_pairs", "backtracking", "branch_and_bound"]
