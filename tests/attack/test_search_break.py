"""Breaking the search skeletons the way users and attackers use them.

Checkpoints with real SIGKILLed driver processes, hostile checkpoint paths.  Each test failed
before its fix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import shoal
from shoal.patterns import backtracking
from shoal.patterns.search import SearchError

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _driver(args, seed: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONHASHSEED=seed)
    return subprocess.Popen([sys.executable, os.path.join(HERE, "search_ck_driver.py"), *map(str, args)],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _checkpoint_kill():
    """tests/patterns/checkpoint_kill.py (the kill procedure of the checkpoint tests), loaded
    by path: tests/patterns is on sys.path only when pytest collects it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "checkpoint_kill", os.path.join(ROOT, "tests", "patterns", "checkpoint_kill.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_killed_search_over_sets_of_names_resumes_in_a_new_process(tmp_path):
    """A root holding a frozenset of strings: its plain pickle follows the per-process hash
    order, so the checkpoint's digest differed in every new process and the rerun after a
    SIGKILL was refused as 'another search' (every run)."""
    n = 17
    ck, out = tmp_path / "s.ckpt", tmp_path / "out.json"
    first = _driver([n, ck, out], seed="1")
    _checkpoint_kill().kill_after_saves(first, str(ck), 2, 120)  # the file holds a real frontier
    assert ck.exists()
    second = _driver([n, ck, out], seed="2")  # another process, another hash seed
    text = second.communicate(timeout=300)[0].decode()
    assert second.returncode == 0, text[-2000:]
    res = json.loads(out.read_text())
    assert res == {"count": 2 ** n, "resumed": True}
    assert not ck.exists()


def _kids(n):
    return [n + 1, n + 2] if n < 12 else []


@pytest.mark.parametrize("what", ["missing-dir", "directory", "fifo"])
def test_a_checkpoint_path_no_save_could_write_is_refused_before_the_search(tmp_path, what):
    """Before: a missing directory failed with a raw FileNotFoundError naming a temporary file
    ``interval`` seconds into the search (60 s by default); a directory gave a raw
    IsADirectoryError; a FIFO blocked the call forever in open()."""
    path = {"missing-dir": tmp_path / "nope" / "s.ckpt", "directory": tmp_path, "fifo": tmp_path / "fifo"}[what]
    if what == "fifo":
        os.mkfifo(path)
    with shoal.Pilot(1) as pilot:
        with pytest.raises(SearchError, match="checkpoint") as info:
            backtracking.count(pilot, 0, _kids, checkpoint=str(path), checkpoint_interval=0.01)
        assert {"missing-dir": "does not exist", "directory": "is a directory",
                "fifo": "not a regular file"}[what] in str(info.value)
        assert backtracking.count(pilot, 0, _kids) > 0  # the pilot is fine afterwards


class _LockedNode:
    def __init__(self, d):
        import threading

        self.d, self.lock = d, threading.Lock()


def _locked_kids(node):
    return [_LockedNode(node.d + 1)] if node.d < 2 else []


def test_an_unpicklable_root_is_not_sent_to_a_coordination_that_cannot_help():
    with shoal.Pilot(1) as pilot:
        with pytest.raises(SearchError) as info:
            backtracking.count(pilot, _LockedNode(0), _locked_kids, coordination="indexed")
    assert "cannot be pickled" in str(info.value)
    assert "use coordination='indexed'" not in str(info.value)


def test_true_is_not_a_checkpoint_interval(tmp_path):
    """checkpoint_interval=True passed the number check as 1 second."""
    with shoal.Pilot(1) as pilot:
        with pytest.raises(ValueError, match="checkpoint_interval must be a positive number"):
            backtracking.count(pilot, 0, _kids, checkpoint=str(tmp_path / "c"), checkpoint_interval=True)


def test_a_save_cut_by_sigkill_leaves_no_temporary_file_behind(tmp_path):
    """A driver SIGKILLed while writing its checkpoint left '.<name>.<pid>.tmp' (as big as the
    frontier) beside it forever: every later run has another pid.  The next run of the search
    removes this host's temporaries whose driver is gone; a live driver's stay."""
    import socket

    ck = tmp_path / "s.ckpt"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that is gone
    host = socket.gethostname()
    stale = tmp_path / f".s.ckpt.{host}.{dead.pid}.tmp"
    live = tmp_path / f".s.ckpt.{host}.{os.getppid()}.tmp"  # a live process: not ours to remove
    other = tmp_path / f".s.ckpt.another-host.{dead.pid}.tmp"
    for p in (stale, live, other):
        p.write_bytes(b"half a pickle")
    with shoal.Pilot(1) as pilot:
        assert backtracking.count(pilot, 0, _kids, checkpoint=str(ck), checkpoint_interval=0.01) == \
            backtracking.count(pilot, 0, _kids)
    assert not stale.exists() and live.exists() and other.exists()
    assert not ck.exists()
