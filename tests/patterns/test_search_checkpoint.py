"""Checkpointed search frontiers: the driver SIGKILLed mid-search, the same call resumes
and returns exactly what an uninterrupted run returns; atomic files; refusals.

The kills are real: the driver is a separate Python process (checkpoint_driver.py) with
its own local pilot; the test sends it SIGKILL after it has written a few checkpoints,
checks its worker processes die with it, and runs it again.  The references are OEIS
(N-Queens) and the engine's own uninterrupted, non-checkpointed run (max clique with
``ordered=True``: the same node).  Bigger sizes and the dask backend are marked slow
(tests/dask/test_dask_checkpoint.py).
"""

from __future__ import annotations

import functools
import os
import pickle

import pytest
import search_apps as apps
from checkpoint_driver import graph
from checkpoint_kill import kill_and_resume

import shoal
from shoal import _durable as durable
from shoal.patterns import SearchError, backtracking, branch_and_bound
from shoal.patterns.search import checkpoint as C
from shoal.workloads.nqueens import OEIS_A000170


def read_search_checkpoint(path) -> dict:
    """A checkpoint's pickled state, once its header is checked (as the driver reads it)."""
    _, body = durable.unpack(open(path, "rb").read(), str(path), C.KIND, C.WHAT)
    return pickle.loads(body)

mc = apps.search_maxclique
nq = apps.search_nqueens


@pytest.fixture(scope="module")
def pilot2():
    with shoal.Pilot(workers=2) as p:
        yield p


def _reference_clique(pilot, n):
    r = mc.max_clique(pilot, graph(n), ordered=True)  # the engine, no checkpoint
    return r.value, list(r.path), r.node.clique


@pytest.mark.no_leak_check
def test_sigkill_resume_nqueens(tmp_path):
    res = kill_and_resume(tmp_path, "queens", 12)
    assert res["value"] == OEIS_A000170[12]


@pytest.mark.no_leak_check
def test_sigkill_resume_max_clique_same_node(tmp_path, pilot2):
    res = kill_and_resume(tmp_path, "clique", 120)
    assert (res["value"], res["path"], res["clique"]) == _reference_clique(pilot2, 120)


@pytest.mark.slow
@pytest.mark.no_leak_check
@pytest.mark.parametrize("app,size", [("queens", 13), ("clique", 150)])
def test_sigkill_resume_bigger(tmp_path, pilot2, app, size):
    res = kill_and_resume(tmp_path, app, size, saves=20)
    if app == "queens":
        assert res["value"] == OEIS_A000170[size]
    else:
        assert (res["value"], res["path"], res["clique"]) == _reference_clique(pilot2, size)


# -- in-process: exactness of the frontier, files, refusals ------------------------------


def test_interrupted_and_resumed_in_process(pilot2, tmp_path, monkeypatch):
    """A chunk fails mid-search (an exception in the driver's loop): the checkpoint written
    on the way out resumes to the exact count; the file is gone at the end."""
    ck = tmp_path / "q.ckpt"
    real = C.SearchCheckpoint.save

    def save_then_fail(self, tally, units):
        real(self, tally, units)
        if tally.nodes and units:  # mid-search: part done, part open
            raise KeyboardInterrupt  # as a Ctrl-C in the driver would
    monkeypatch.setattr(C.SearchCheckpoint, "save", save_then_fail)
    with pytest.raises(KeyboardInterrupt):
        nq.count_queens(pilot2, 10, checkpoint=ck, checkpoint_interval=0.001)
    monkeypatch.setattr(C.SearchCheckpoint, "save", real)
    state = read_search_checkpoint(ck)
    tally, units = state["tally"], state["units"]
    assert units and 0 < tally.nodes  # a real frontier, part of the work done
    assert [u[1] for u in units] == sorted(u[1] for u in units)
    r = nq.count_queens(pilot2, 10, checkpoint=ck, checkpoint_interval=0.001, stats=True)
    assert r == OEIS_A000170[10] and not ck.exists()
    assert r.stats.nodes == nq.count_queens(pilot2, 10, stats=True).stats.nodes  # each once


@pytest.mark.parametrize("ordered", [False, True])
def test_checkpointed_bnb_and_find_match_the_engine(pilot2, tmp_path, ordered):
    adj = apps.random_graph(40, 0.6, 7)
    kids = functools.partial(apps.clique_children_unordered, adj)
    args = (pilot2, apps.clique_root(adj), kids, apps.clique_size, apps.clique_bound)
    plain = branch_and_bound.maximise(*args, ordered=ordered)
    ck = branch_and_bound.maximise(*args, ordered=ordered, checkpoint=tmp_path / "c",
                                   checkpoint_interval=0.001)
    assert ck.value == plain.value == apps.brute_force_clique(adj)
    if ordered:
        assert ck.path == plain.path and ck.node == plain.node
    low = branch_and_bound.minimise(pilot2, apps.clique_root(adj), kids, lambda nd: -nd[0],
                                    lambda nd: -apps.clique_bound(nd), checkpoint=tmp_path / "m")
    assert low.value == -plain.value
    hit = backtracking.find(pilot2, apps.clique_root(adj), kids, objective=apps.clique_size,
                            target=plain.value, bound=apps.clique_bound,
                            checkpoint=tmp_path / "f", checkpoint_interval=0.001)
    assert hit[0] == plain.value
    assert backtracking.find(pilot2, apps.clique_root(adj), kids, objective=apps.clique_size,
                             target=plain.value + 1, bound=apps.clique_bound,
                             checkpoint=tmp_path / "f") is None
    assert not os.listdir(tmp_path)  # finished searches leave no file (nor temporaries)


def test_checkpoint_of_another_search_is_refused(pilot2, tmp_path):
    ck = tmp_path / "x.ckpt"
    C.SearchCheckpoint(ck, 1.0, "backtracking.count", "0" * 64).save(C.Tally(), [])
    with pytest.raises(SearchError, match="belongs to another search"):
        nq.count_queens(pilot2, 6, checkpoint=ck)
    ck.write_bytes(b"not a pickle")
    with pytest.raises(SearchError, match="unreadable"):
        nq.count_queens(pilot2, 6, checkpoint=ck)
    with pytest.raises(ValueError, match="checkpoint_interval"):
        nq.count_queens(pilot2, 6, checkpoint=tmp_path / "y", checkpoint_interval=0)
    with pytest.raises(TypeError, match="checkpoint must be a file path"):
        nq.count_queens(pilot2, 6, checkpoint=42)


def test_atomic_write_leaves_old_or_new(tmp_path, monkeypatch):
    """A failure in the middle of a save (the disk full, say) keeps the previous file."""
    ck = C.SearchCheckpoint(tmp_path / "a", 1.0, "k", "d")
    ck.save(C.Tally(count=1), [((), ())])

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError):
        ck.save(C.Tally(count=2), [])
    monkeypatch.undo()
    assert ck.load()[0].count == 1  # (load takes the writer lock, close drops it)
    ck.close()
    assert os.listdir(tmp_path) == ["a"]  # no temporary (nor lock file) left behind
