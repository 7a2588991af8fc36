"""txstream attacked: every scheduler against an oracle written here from the
"Semantics" paragraph of docs/txstream.md alone (not serial.py), on hostile transactions;
and the bad inputs that were not named before."""

from __future__ import annotations

import os
import random
import threading

import numpy as np
import pytest
import txs_attack_tasks as tasks
from txs_helpers import SCHEDULERS

import shoal
from shoal.workloads import txstream as ts


@pytest.fixture(scope="module")
def pilot2():
    with shoal.Pilot(2) as p:
        yield p


class _Recorder:
    def __init__(self):
        self.ops = []

    def update(self, table, key, fn, guard=None, reads=()):
        self.ops.append((table, key, fn, guard, tuple(reads)))


def oracle(tables: dict, events):
    """Apply the transactions one by one in stream order (docs/txstream.md, Semantics)."""
    state = {name: [int(v) for v in values] for name, values in tables.items()}
    outputs, aborted = [], set()
    for seq, (fn, ev) in enumerate(events):
        rec = _Recorder()
        fn(rec, ev)
        mine: dict = {}  # this transaction's writes so far (seen by its later updates)

        def value(t, k, mine=mine):
            return mine.get((t, k), state[t][k])

        wrote, ok = [], True
        for table, key, f, guard, reads in rec.ops:
            args = [value(table, key)] + [value(t, k) for t, k in reads]
            if guard is not None and not guard(*args):
                ok = False
                break
            mine[(table, key)] = f(*args)
            wrote.append(mine[(table, key)])
        if ok:
            for (t, k), v in mine.items():
                state[t][k] = v
        else:
            aborted.add(seq)
        outputs.append(tuple(wrote) if ok else None)
    return state, outputs, aborted


def _stream(rng: random.Random, n: int, keys: int, hot: int):
    events = []
    for _ in range(n):
        ops = []
        for _ in range(rng.randint(0, 12)):  # 0 updates: a transaction that declares nothing
            key = rng.randrange(hot) if rng.random() < 0.7 else rng.randrange(keys)
            guard = None if rng.random() < 0.7 else rng.randint(0, 40)
            reads = [(rng.choice("ab"), rng.randrange(hot)) for _ in range(rng.randint(0, 3))]
            ops.append((rng.choice("ab"), key, rng.randint(-5, 5), guard, reads))
        events.append(ts.Event(tasks.hostile, ops))
    return events


@pytest.mark.parametrize("sched", ["serial", *SCHEDULERS], ids=str)
def test_every_scheduler_equals_an_independent_oracle_on_hostile_transactions(pilot2, sched):
    # One hot key touched up to 12 times per transaction, guards on other keys' values,
    # a quarter of the transactions aborting, punctuation 1 up to the whole stream.
    for trial, (keys, hot, n, punct) in enumerate([(1, 1, 60, 7), (3, 2, 120, 1),
                                                   (50, 5, 300, 64), (50, 2, 40, 1000)]):
        rng = random.Random(trial)
        tables = {"a": np.arange(keys, dtype=np.int64) * 3, "b": np.full(keys, 20, np.int64)}
        events = _stream(rng, n, keys, hot)
        want_state, want_outputs, want_aborted = oracle(tables, events)
        store = ts.Store({k: v.copy() for k, v in tables.items()})
        try:
            rep = ts.Engine(store, pilot=None if sched == "serial" else pilot2, scheduler=sched,
                            punctuation=punct).run(events)
            snap = store.snapshot()
        finally:
            store.close()
        assert {k: v.tolist() for k, v in snap.items()} == want_state, trial
        assert rep.aborted == want_aborted, trial
        assert [rep.outputs[i] for i in range(n)] == want_outputs, trial


@pytest.mark.parametrize("sched", ["adaptive", "2pl"])
def test_an_event_that_does_not_pickle_is_named(pilot2, sched):
    # Before: TypeError "cannot pickle '_thread.lock' object", naming no event.
    store = ts.Store({"t": np.zeros(2, np.int64)})
    events = [ts.Event(tasks.touch, i) for i in range(5)] + [ts.Event(tasks.touch, threading.Lock())]
    try:
        with pytest.raises(TypeError, match=r"event 5: cannot be pickled for the workers"):
            ts.Engine(store, pilot=pilot2, scheduler=sched, punctuation=4).run(events)
        assert store.snapshot()["t"][0] == 4  # as of the last punctuation
    finally:
        store.close()


@pytest.mark.parametrize("bad", [-1, 0, float("nan"), "10", True])
def test_a_stall_timeout_that_is_not_a_positive_number_is_refused(bad):
    # Before: accepted; -1 or nan made any wait of a partition a Stalled error at once
    # (nan: `now - last > nan` is never true, so a dead worker's batch hung forever).
    store = ts.Store({"t": np.zeros(2, np.int64)})
    try:
        with pytest.raises(ValueError, match="stall_timeout must be a number of seconds > 0"):
            ts.Engine(store, scheduler="serial", stall_timeout=bad)
    finally:
        store.close()


@pytest.mark.parametrize("damage", ["truncate state", "overwrite state", "delete segment"])
def test_a_damaged_checkpoint_is_named(tmp_path, damage):
    # Before: zipfile.BadZipFile "File is not a zip file", numpy's "This file contains pickled
    # (object) data ... allow_pickle" (misleading: never load a checkpoint with pickle), or a
    # bare FileNotFoundError for a lost segment; none named the checkpoint.
    ckpt = str(tmp_path / "ckpt")
    events = [ts.Event(tasks.touch, i) for i in range(10)]
    with ts.Store({"t": np.zeros(2, np.int64)}) as store:
        ts.Engine(store, scheduler="serial", punctuation=4, checkpoint=ckpt).run(events[:8])
    state, seg = tmp_path / "ckpt" / "state.npz", tmp_path / "ckpt" / "out-00000000.npz"
    if damage == "truncate state":
        with open(state, "r+b") as f:
            f.truncate(state.stat().st_size // 2)
    elif damage == "overwrite state":
        state.write_bytes(b"\x00not a checkpoint" * 8)
    else:
        seg.unlink()
    name = "out-00000000.npz" if damage == "delete segment" else "state.npz"
    with ts.Store({"t": np.zeros(2, np.int64)}) as store:
        with pytest.raises(ValueError, match=f"txstream checkpoint .*{name} cannot be read"):
            ts.Engine(store, scheduler="serial", punctuation=4, checkpoint=ckpt).run(events)


_HOLD_CLAIMS = """
import sys, time
from shoal.workloads.txstream.area import ClaimDir
claims = ClaimDir(sys.argv[1])
print(claims.path, flush=True)
time.sleep(120)
"""


def test_the_claim_directory_of_a_killed_driver_is_swept_by_the_next_run(tmp_path):
    # Before: a SIGKILLed driver never ran its rmtree, and its shoal-txstream-* directory
    # stayed in /tmp for good (40 of them on this machine after a day of test runs).
    import signal
    import subprocess
    import sys

    from shoal.workloads.txstream.area import ClaimDir

    def driver():
        proc = subprocess.Popen([sys.executable, "-c", _HOLD_CLAIMS, str(tmp_path)],
                                stdout=subprocess.PIPE, text=True)
        return proc, proc.stdout.readline().strip()

    killed, dead_dir = driver()
    alive, live_dir = driver()
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(30)
        assert os.path.isdir(dead_dir)
        mine = ClaimDir(str(tmp_path))  # what every run of a pilot scheduler makes first
        assert not os.path.exists(dead_dir)  # its driver is dead: swept
        assert os.path.isdir(live_dir)  # a live driver's: kept
        mine.close()
        assert not os.path.exists(mine.path)
    finally:
        alive.kill()
        alive.wait(30)
        killed.stdout.close()
        alive.stdout.close()


@pytest.mark.parametrize("name", ["os:__loader__.exec_module", "shoal:__class__.__subclasses__",
                                  "builtins:__import__", "__future__:annotations"])
def test_an_event_file_cannot_walk_dunder_attributes(tmp_path, name):
    # Before: resolve() followed any attribute path, so a file could name e.g.
    # "os:__loader__.exec_module" or reach every class through __subclasses__.
    import json

    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps({"fn": name, "ev": 1}) + "\n")
    with pytest.raises(ValueError, match="no part starting with '__'"):
        list(ts.read_events(str(path)))


def test_event_files_still_name_main_and_private_functions(monkeypatch):
    import sys

    from shoal.workloads.txstream.source import resolve

    assert resolve("txs_attack_tasks:touch") is tasks.touch
    monkeypatch.setattr(sys.modules["__main__"], "my_event", tasks.touch, raising=False)
    assert resolve("__main__:my_event") is tasks.touch  # a script's own functions
    assert callable(resolve("random:_test_generator"))  # one underscore: fine


def test_an_event_file_nested_too_deep_is_named_with_its_line(tmp_path):
    # Before: RecursionError from json, naming neither the file nor the line.
    path = tmp_path / "events.jsonl"
    deep = "[" * 100_000 + "1" + "]" * 100_000
    path.write_text('{"fn": "txs_attack_tasks:touch", "ev": 1}\n' + '{"fn": "x:y", "ev": ' + deep + "}\n")
    with pytest.raises(ValueError, match=r"events.jsonl:2: not JSON"):
        list(ts.read_events(str(path)))


def test_a_file_as_checkpoint_directory_is_named(tmp_path):
    # Before: FileExistsError "[Errno 17] File exists" from os.makedirs.
    path = tmp_path / "ckpt"
    path.write_text("not a directory")
    with ts.Store({"t": np.zeros(2, np.int64)}) as store:
        with pytest.raises(ValueError, match="is a file; a txstream checkpoint is a directory"):
            ts.Engine(store, scheduler="serial", checkpoint=str(path))
