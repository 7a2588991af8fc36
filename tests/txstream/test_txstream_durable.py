"""Durability: the driver is SIGKILLed mid-stream (a real kill of a real process with a real
pilot); running again with the same checkpoint gives the store and outputs of an
uninterrupted run (exactly-once effects), and the dead driver's workers do not linger."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys

import numpy as np
import pytest
from txs_ckpt_script import KEYS, PUNCT, N
from txs_helpers import run

from shoal.workloads import txstream as ts
from shoal.workloads.txstream.apps import sl

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _start(ckpt, out, sched):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, HERE]))
    return subprocess.Popen([sys.executable, os.path.join(HERE, "txs_ckpt_script.py"), str(ckpt),
                             str(out), sched], stdout=subprocess.PIPE, text=True, env=env)


@pytest.mark.parametrize("sched", ["adaptive", pytest.param("hosts", marks=pytest.mark.txstream_heavy),
                                   pytest.param("2pl", marks=pytest.mark.txstream_heavy)])
def test_sigkill_and_resume_is_exactly_once(tmp_path, sched):
    ckpt, out = tmp_path / "ckpt", tmp_path / "out.pkl"
    proc = _start(ckpt, out, sched)
    try:
        for line in proc.stdout:
            if line.strip() == "batch 4":
                break
        os.kill(proc.pid, signal.SIGKILL)  # in the middle of batch 5 (or between batches)
    finally:
        proc.kill()
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists()
    again = _start(ckpt, out, sched)
    lines = again.stdout.read().split()
    assert again.wait(120) == 0
    got = pickle.loads(out.read_bytes())
    assert got["resumed_events"] < N  # it did resume, not start over
    assert "batch 0" not in " ".join(lines)
    evs = sl.events(N, KEYS, theta=0.8, abort=0.2, complexity=100, seed=7)
    snap, rep = run(sl.tables(KEYS), evs, "serial", punctuation=PUNCT)
    for k in snap:
        assert np.array_equal(got["snap"][k], snap[k]), k
    assert got["aborted"] == rep.aborted
    assert got["outputs"] == dict(rep.outputs)


def _boom_after(evs, k):
    for i, e in enumerate(evs):
        if i == k:
            raise KeyboardInterrupt("source died")
        yield e


def test_resume_in_process_and_wrong_stream(tmp_path):
    evs = sl.events(500, 30, abort=0.2, seed=9)
    store = ts.Store(sl.tables(30))
    with pytest.raises(KeyboardInterrupt):
        ts.Engine(store, scheduler="serial", punctuation=64, checkpoint=tmp_path).run(
            _boom_after(evs, 300))
    store.close()
    store = ts.Store(sl.tables(30))  # a fresh process would start from the initial tables
    rep = ts.Engine(store, scheduler="serial", punctuation=64, checkpoint=tmp_path).run(evs)
    snap = store.snapshot()
    store.close()
    ref_snap, ref = run(sl.tables(30), evs, "serial", punctuation=64)
    assert all(np.array_equal(snap[k], ref_snap[k]) for k in snap)
    assert dict(rep.outputs) == dict(ref.outputs) and rep.aborted == ref.aborted
    assert rep.events == 500 - 256  # 4 batches of 64 were committed before the failure
    store = ts.Store(sl.tables(30))
    with pytest.raises(ValueError, match="not the stream"):
        ts.Engine(store, scheduler="serial", checkpoint=tmp_path).run(evs[:100])
    store.close()
    store = ts.Store({"other": np.zeros(3, np.int64)})
    with pytest.raises(ValueError, match="fresh checkpoint"):
        ts.Engine(store, scheduler="serial", checkpoint=tmp_path).run(evs)
    store.close()
