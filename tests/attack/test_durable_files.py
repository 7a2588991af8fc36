"""Every file shoal writes and reads back: planted links, crafted and damaged files, two
drivers, full / read-only / missing folders, the fit(checkpoint=) contract, YAML bombs.

Real files and real driver processes (``durable_driver.py``); a real tmpfs for a full and a
read-only file system (root only: skipped with the reason otherwise).  Each test names the
behaviour it replaced.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import subprocess
import sys
import time

import numpy as np
import pytest

from shoal import _durable as durable
from shoal.patterns.search import checkpoint as SC
from shoal.workloads import dl
from shoal.workloads import txstream as ts
from shoal.workloads.txstream.apps import sl

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DRIVER = os.path.join(HERE, "durable_driver.py")
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))


def drive(kind, ck, timeout=180, **env):
    return subprocess.run([sys.executable, DRIVER, kind, str(ck)], env=dict(ENV, **env),
                          capture_output=True, text=True, timeout=timeout)


def result(proc) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("result ")][-1]
    return json.loads(line[len("result "):])


def tree(top) -> dict:
    """path -> (kind, bytes' sha256 or link target) of everything under ``top``."""
    out = {}
    for folder, dirs, files in os.walk(top):
        for name in dirs + files:
            p = os.path.join(folder, name)
            if os.path.islink(p):
                out[p] = ("link", os.readlink(p))
            elif os.path.isfile(p):
                out[p] = ("file", hashlib.sha256(open(p, "rb").read()).hexdigest())
    return out


def checkpoint_of(kind, tmp_path):
    folder = tmp_path / "ck"
    folder.mkdir()
    return folder if kind == "txstream" else folder / "c"


# -- 1. planted links --------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["dl", "txstream",
                                  pytest.param("search", marks=pytest.mark.slow)])
def test_links_planted_at_every_temporary_name_are_never_written_through(tmp_path, kind):
    """Before: ``open(tmp, "wb")`` at ``state.npz.tmp`` / ``fit.npz.tmp<pid>`` /
    ``.<base>.<host>.<pid>.tmp`` followed a planted link and overwrote the file outside the
    folder with checkpoint data.  The driver plants a link at every name its pid's saves can
    use (and at the name each save picks first); no byte outside the folder changes."""
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim"
    victim.write_bytes(b"the user's precious file\n")
    (outside / "other").write_bytes(b"x" * 1000)
    before = tree(outside)
    ck = checkpoint_of(kind, tmp_path)
    clean = checkpoint_of(kind, tmp_path / "clean") if (tmp_path / "clean").mkdir() is None else None
    got = result(drive(kind, ck, VICTIM=str(victim)))
    assert tree(outside) == before
    assert got == result(drive(kind, clean))  # the checkpointed run still did its work


@pytest.mark.slow  # a driver process per case: .ci/run runs them (-m slow)
def test_a_link_at_the_checkpoint_or_its_lock_is_refused(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    (tmp_path / "ck").mkdir()
    os.symlink(victim, tmp_path / "ck" / "c")
    proc = drive("dl", tmp_path / "ck" / "c")
    assert proc.returncode == 1 and "is a symbolic link" in proc.stderr.splitlines()[-1]
    os.unlink(tmp_path / "ck" / "c")
    os.symlink(victim, tmp_path / "ck" / "c.lock")
    proc = drive("dl", tmp_path / "ck" / "c")
    assert proc.returncode == 1 and "lock" in proc.stderr and "symbolic link" in proc.stderr
    assert victim.read_bytes() == b"keep me"


# -- 2. fit(checkpoint=) semantics ---------------------------------------------------------------
rng = np.random.default_rng(1)
X, Y = rng.normal(size=(96, 16)), rng.integers(0, 3, 96)


def trainer():
    return dl.Trainer(dl.Sequential([dl.Linear(16, 8), dl.ReLU(), dl.Linear(8, 3)], seed=0),
                      optimizer=dl.Adam(lr=0.01), plan=dl.Plan())


def test_a_loop_of_one_epoch_fits_trains_one_epoch_per_call(tmp_path):
    """Before: the checkpoint stored the epoch within the call, so calls 2..5 'resumed after'
    it and returned at once: 5 calls, 1 epoch, no error."""
    ck = str(tmp_path / "fit.npz")
    looped = trainer()
    for _ in range(5):
        looped.fit(X, Y, epochs=1, checkpoint=ck)
    once = trainer()
    once.fit(X, Y, epochs=5)
    assert [r["epoch"] for r in looped.history] == [0, 1, 2, 3, 4]
    assert all(np.array_equal(a, b) for a, b in zip(looped.parameters(), once.parameters(), strict=True))


@pytest.mark.slow  # a driver process per case: .ci/run runs them (-m slow)
def test_a_script_of_one_epoch_run_three_times_trains_three_epochs(tmp_path):
    ck2 = tmp_path / "ck" / "c"
    (tmp_path / "ck").mkdir()
    assert [result(drive("dl", ck2, EPOCHS="1"))["epochs"] for _ in range(3)] == [1, 2, 3]
    assert os.listdir(tmp_path / "ck") == ["c"]  # no temporary, no lock file


def test_a_checkpoint_of_other_starting_parameters_is_refused_unless_resumed(tmp_path):
    """Before: fine-tuning from set_parameters(pretrained) with an old checkpoint present
    resumed the checkpoint silently and discarded the pretrained weights."""
    ck = str(tmp_path / "fit.npz")
    trainer().fit(X, Y, epochs=2, checkpoint=ck)
    tuned = trainer()
    pretrained = [p + 0.5 for p in tuned.parameters()]
    tuned.model.set_parameters(pretrained)
    with pytest.raises(ValueError, match="other starting parameters.*resume=True"):
        tuned.fit(X, Y, epochs=1, checkpoint=ck)
    assert all(np.array_equal(a, b) for a, b in zip(tuned.parameters(), pretrained, strict=True))
    assert tuned.history == []
    tuned.fit(X, Y, epochs=1, checkpoint=ck, resume=True)  # asked for: the checkpoint's weights
    assert len(tuned.history) == 3


# -- 3. checked before trusted: search --------------------------------------------------------
class _Marker:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))  # unpickling creates the marker file


class _Exit:
    def __reduce__(self):
        return (SystemExit, (7,))


@pytest.mark.slow  # a driver process per case: .ci/run runs them (-m slow)
@pytest.mark.parametrize("header", ["none", "another search"])
def test_a_crafted_search_checkpoint_runs_no_code(tmp_path, header):
    """Before: the file was unpickled before it was checked: a crafted one wrote a marker
    file, and one raising SystemExit ended the driver with status 7."""
    (tmp_path / "ck").mkdir()
    ck, marker = tmp_path / "ck" / "c", tmp_path / "marker"
    for payload in (_Marker(str(marker)), _Exit()):
        body = pickle.dumps({"format": 1, "kind": "backtracking.count", "digest": "x",
                             "tally": payload, "units": []})
        if header == "none":
            ck.write_bytes(body)
        else:
            ck.write_bytes(b"".join(durable.pack(SC.KIND, {"kind": "backtracking.count",
                                                          "digest": "0" * 64}, body)))
        proc = drive("search", ck)
        assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
        assert "SearchError" in proc.stderr and "delete it" in proc.stderr.lower()
        assert not marker.exists()


RINGS = "Workers → driver"
UNPICKLING = {  # (module, enclosing function) -> the docs/runtime.md "Trust boundaries" entry
    ("shoal/runtime/wire.py", "<module>"): RINGS,
    ("shoal/runtime/wire.py", "decode_define"): RINGS,
    ("shoal/runtime/worker.py", "run_initializer"): RINGS,
    ("shoal/runtime/mapping.py", "_load_batch"): RINGS,
    ("shoal/backends/local/pump.py", "<module>"): RINGS,
    ("shoal/patterns/_portable.py", "_load"): RINGS,
    ("shoal/patterns/_pair_tasks.py", "__init__"): RINGS,
    ("shoal/patterns/_pair_tasks.py", "blob"): RINGS,
    ("shoal/workloads/dl/program.py", "get"): RINGS,
    ("shoal/workloads/txstream/area.py", "load_events"): RINGS,
    ("shoal/patterns/search/checkpoint.py", "thaw"): RINGS,
    ("shoal/patterns/search/checkpoint.py", "_load"): "Search checkpoints",
    ("shoal/patterns/ensemble/values.py", "decode"): "Journals on resume",
    ("shoal/backends/dask/node.py", "_portable"): "Over dask connections",
    ("shoal/backends/dask/node.py", "_start_lent"): "Over dask connections",
    ("shoal/backends/dask/node.py", "deliver_result"): "Over dask connections",
    ("shoal/backends/dask/node.py", "function"): "Over dask connections",
    ("shoal/workloads/txstream/hosts.py", "_plan_of"): "Over dask connections",
    ("shoal/integrations/joblib.py", "_run_batch"): RINGS,
    ("shoal/integrations/joblib.py", "_unpack"): RINGS,
}


def unpickling_sites() -> set:
    """(module, enclosing function) of every reference to ``pickle.loads`` / ``load`` /
    ``Unpickler`` (also ``cloudpickle.``, ``wire.pickle.``, and aliases such as
    ``_loads = pickle.loads``) in shoal's sources."""
    import ast

    mods = {"pickle", "cloudpickle", "_pickle", "dill"}
    found = set()

    def walk(node, rel, fn):
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else fn
            if (isinstance(child, ast.Attribute) and child.attr in ("loads", "load", "Unpickler")
                    and ((isinstance(child.value, ast.Name) and child.value.id in mods)
                         or (isinstance(child.value, ast.Attribute) and child.value.attr in mods))):
                found.add((rel, name))
            walk(child, rel, name)

    for folder, _, files in os.walk(os.path.join(ROOT, "shoal")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                walk(ast.parse(open(path, encoding="utf-8").read()), os.path.relpath(path, ROOT), "<module>")
    return found


def test_every_unpickling_call_is_a_documented_trust_boundary():
    """Every place shoal's code can unpickle is in UNPICKLING with the docs/runtime.md
    "Trust boundaries" entry that covers it, and every such entry is in that section.
    Before, the section left out search checkpoints and txstream's event arguments, and
    said journal results were stored pickled (msgpack is the default, pickle opt-in)."""
    found = unpickling_sites()
    assert found <= set(UNPICKLING), f"undocumented unpickling: {sorted(found - set(UNPICKLING))}"
    assert set(UNPICKLING) <= found, f"gone from the code: {sorted(set(UNPICKLING) - found)}"
    text = open(os.path.join(ROOT, "docs", "runtime.md"), encoding="utf-8").read()
    section = text.split("## Trust boundaries", 1)[1].split("\n## ", 1)[0]
    for title in set(UNPICKLING.values()):
        assert f"**{title}**" in section, title
    for name in ("state.npz", "out-*.npz", "fit(..., checkpoint=)", "msgpack", "values='pickle'",
                 "Unpickled only after", "allow_pickle=False", "txstream`'s event arguments"):
        assert name in section, name
    assert "stored pickled" not in section


# -- 4. two drivers ------------------------------------------------------------------------------
@pytest.mark.slow  # a driver process per case: .ci/run runs them (-m slow)
@pytest.mark.parametrize("kind", ["txstream", "dl"])
def test_a_second_driver_on_one_checkpoint_is_refused_and_the_first_resumes(tmp_path, kind):
    """Before (txstream): the second died with a raw FileNotFoundError after deleting a
    segment the first was about to commit: the checkpoint could not be resumed."""
    ck = checkpoint_of(kind, tmp_path)
    go = tmp_path / "go"
    first = subprocess.Popen([sys.executable, DRIVER, kind, str(ck)], env=dict(ENV, HOLD=str(go)),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "holding"  # mid-run, a checkpoint written
        second = drive(kind, ck)
        assert second.returncode == 1
        last = second.stderr.strip().splitlines()[-1]
        assert "in use by another live driver" in last and f"pid {first.pid}" in last, last
        go.write_text("")
        out, err = first.communicate(timeout=180)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, err[-2000:]
    clean = checkpoint_of(kind, tmp_path / "clean") if (tmp_path / "clean").mkdir() is None else None
    reference = result(drive(kind, clean))
    assert json.loads(out.split("result ", 1)[1]) == reference


def test_a_second_search_driver_is_refused(tmp_path):
    a = SC.SearchCheckpoint(tmp_path / "s", 1.0, "k", "d")
    b = SC.SearchCheckpoint(tmp_path / "s", 1.0, "k", "d")
    assert a.load() is None
    with pytest.raises(durable.CheckpointInUse, match=f"in use by another live driver \\(pid {os.getpid()}"):
        b.load()
    a.close()
    assert b.load() is None
    b.close()


# -- 5. bounded YAML -----------------------------------------------------------------------------
def _bomb(levels: int, where: str) -> str:
    anchors = ["&a0 [x, x, x, x, x, x, x, x, x, x]"] + [
        f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    task = '          - function: "os:getpid"\n'
    if where == "args":
        task += "            args:\n" + "".join(f"              - {a}\n" for a in anchors)
    elif where == "kwargs":
        task += "            kwargs:\n" + "".join(f"              k{i}: {a}\n" for i, a in enumerate(anchors))
    elif where == "environment":
        task = ('          - executable: /bin/true\n            environment:\n'
                + "".join(f"              V{i}: {a}\n" for i, a in enumerate(anchors)))
    else:  # sweep
        task = ('          - executable: /bin/true\n            arguments: ["{v}"]\n'
                "            sweep:\n              v:\n" + "".join(f"                - {a}\n" for a in anchors))
    return "pipelines:\n  - stages:\n      - tasks:\n" + task


def test_a_669_byte_alias_bomb_in_args_is_refused_at_once(tmp_path):
    """Before: it passed validation, then the run's identity fingerprint walked its 10**9
    leaves: ``shoal run`` spun at 100% CPU with no output."""
    wf = tmp_path / "bomb.yaml"
    wf.write_text(_bomb(9, "args"))
    assert len(wf.read_bytes()) < 750  # (the reported one: 669 bytes)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "shoal", "run", str(wf), "--journal",
                           str(tmp_path / "run.db")], env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "nodes through its aliases" in proc.stderr
    assert time.monotonic() - t0 < 110  # (the bound: it answered; before, it never did)


@pytest.mark.parametrize("where", ["args", "kwargs", "environment", "sweep"])
def test_every_yaml_value_is_bounded(tmp_path, where):
    from shoal.patterns.ensemble.model import EnsembleError
    from shoal.patterns.ensemble.yamlfile import load_yaml

    wf = tmp_path / "w.yaml"
    wf.write_text(_bomb(7, where))  # 10**7 nodes: under the file's bound, over a value's
    with pytest.raises(EnsembleError, match=r"w.yaml:\d+: .*expands to more than 1,000,000 nodes"):
        load_yaml(str(wf))


@pytest.mark.slow  # walks a million nodes before it refuses: .ci/run runs it (-m slow)
def test_the_identity_fingerprint_is_bounded_for_python_values():
    from shoal.patterns.ensemble.identity import fingerprint
    from shoal.patterns.ensemble.model import EnsembleError

    v = ["x"] * 10
    for _ in range(8):
        v = [v] * 10  # 10**9 leaves in 90 list objects
    with pytest.raises(EnsembleError, match="more than 1,000,000 values"):
        fingerprint(v)
    assert fingerprint([list(range(1000))] * 100) == fingerprint([list(range(1000))] * 100)


# -- 6. damaged and crafted checkpoints ---------------------------------------------------------
def _dl_checkpoint(tmp_path):
    ck = str(tmp_path / "fit.npz")
    trainer().fit(X, Y, epochs=2, checkpoint=ck)
    return ck


def _recraft(ck, change):
    """Rewrite a dl checkpoint with a valid header around a changed body / header."""
    belongs, body = durable.unpack(open(ck, "rb").read(), ck, "dl.fit", "dl checkpoint")
    z = np.load(io.BytesIO(body))
    arrays = {k: z[k] for k in z.files}
    change(belongs, arrays)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    open(ck, "wb").write(b"".join(durable.pack("dl.fit", belongs, buf.getbuffer())))


def _latest(belongs, arrays):
    from shoal.workloads.dl.checkpoint import parameters_hash

    params = [arrays[f"param_{i}"] for i in range(4)]
    belongs["latest"] = parameters_hash(params)


CRAFTED = {
    "optimizer state of shape (1,)": lambda b, a: a.update(state_0_0=np.zeros(1)),
    "a history that is a string": lambda b, a: a.update(history=np.frombuffer(b'"abc"', np.uint8)),
    "epoch -100": lambda b, a: b.update(call={"epochs": 2, "done": -100}),
    "an epoch count past the call": lambda b, a: b.update(call={"epochs": 2, "done": 3}),
    "a step of 1e300": lambda b, a: b.update(step=1e300),
    "a parameter of another shape": lambda b, a: (a.update(param_0=np.zeros((3, 3))), _latest(b, a)),
    "a parameter missing": lambda b, a: (a.pop("param_3"), a.pop("state_0_3"), a.pop("state_1_3")),
    "a pickled array": lambda b, a: a.update(history=np.array([{"x": 1}], dtype=object)),
}


@pytest.mark.parametrize("craft", list(CRAFTED))
def test_a_crafted_dl_checkpoint_is_one_clear_error(tmp_path, craft):
    """Before: raw AttributeError / KeyError / OverflowError / TypeError, or silently accepted
    (state of shape (1,), a string history, epoch -100 that then trained 103 epochs)."""
    ck = _dl_checkpoint(tmp_path)
    try:
        _recraft(ck, CRAFTED[craft])
    except ValueError:  # np.savez refuses nothing; np.load of an object array needs pickle
        pytest.skip("cannot craft this body")
    t = trainer()
    with pytest.raises(ValueError, match=f"checkpoint '{ck}' cannot be read"):
        t.fit(X, Y, epochs=3, checkpoint=ck)
    assert t.history == []


@pytest.mark.parametrize("kind", ["dl", "txstream"])
def test_one_flipped_byte_is_named(tmp_path, kind):
    """Before: a raw zipfile.BadZipFile."""
    if kind == "dl":
        ck = _dl_checkpoint(tmp_path)
        target = ck
    else:
        ck = str(tmp_path / "ck")
        with ts.Store(sl.tables(8)) as store:
            ts.Engine(store, scheduler="serial", punctuation=50, checkpoint=ck).run(
                iter(sl.events(200, 8, seed=1)))
        target = os.path.join(ck, "out-00000001.npz")
    data = bytearray(open(target, "rb").read())
    data[len(data) // 2] ^= 0x40
    open(target, "wb").write(bytes(data))
    with pytest.raises(ValueError, match="cannot be read .*checksum"):
        if kind == "dl":
            trainer().fit(X, Y, epochs=3, checkpoint=ck)
        else:
            with ts.Store(sl.tables(8)) as store:
                ts.Engine(store, scheduler="serial", punctuation=50, checkpoint=ck).run(
                    iter(sl.events(200, 8, seed=1)))


def test_a_txstream_state_of_one_value_for_400_keys_is_refused(tmp_path):
    """Before: 1 value for 400 keys was broadcast to all of them."""
    ck = str(tmp_path / "ck")
    tables = {"t": np.zeros(400, np.int64)}
    with ts.Store(tables) as store:
        ts.Engine(store, scheduler="serial", punctuation=4, checkpoint=ck).run(
            [ts.Event(_touch, i) for i in range(8)])
    state = os.path.join(ck, "state.npz")
    belongs, body = durable.unpack(open(state, "rb").read(), state, "txstream.state", "x")
    z = np.load(io.BytesIO(body))
    buf = io.BytesIO()
    np.savez(buf, flat=np.array([7], np.int64), meta=z["meta"])
    open(state, "wb").write(b"".join(durable.pack("txstream.state", belongs, buf.getbuffer())))
    with ts.Store(tables) as store:
        with pytest.raises(ValueError, match=r"state.npz cannot be read \(a store of shape \(1,\)"):
            ts.Engine(store, scheduler="serial", punctuation=4, checkpoint=ck).run([])
        assert not store.flat.any()


def _touch(txn, ev):
    txn.update("t", 0, lambda v: v + 1)


@pytest.mark.parametrize("kind", ["dl", "txstream"])
def test_a_fifo_at_the_checkpoint_is_refused_not_a_hang(tmp_path, kind):
    """Before: open() of a FIFO at the checkpoint path blocked for ever."""
    ck = checkpoint_of(kind, tmp_path)
    os.mkfifo(ck / "state.npz" if kind == "txstream" else ck)
    proc = drive(kind, ck, timeout=120)
    assert proc.returncode == 1
    assert "not a regular file" in proc.stderr.strip().splitlines()[-1]


# -- 7. full, read-only and missing folders ----------------------------------------------------
@pytest.fixture
def tmpfs(tmp_path):
    """A real small tmpfs (``mount -t tmpfs``): root only."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs (mount -t tmpfs -o size=...): run as root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()

    def mount(size: str, ro: bool = False):
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}" + (",ro" if ro else ""), "tmpfs",
                        str(mnt)], check=True, capture_output=True)
        return mnt
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def big_trainer():
    return dl.Trainer(dl.Sequential([dl.Linear(16, 512), dl.ReLU(), dl.Linear(512, 3)], seed=0),
                      optimizer=dl.Adam(lr=0.01), plan=dl.Plan())


def test_a_too_small_folder_fails_before_the_first_epoch(tmpfs):
    """Before: dl trained a whole epoch, then raised a raw ENOSPC that named no path."""
    mnt = tmpfs("64k")
    t, epochs = big_trainer(), []
    with pytest.raises(OSError, match=r"dl checkpoint .*fit.npz: .*free \(ENOSPC before any work\)"):
        t.fit(X, Y, epochs=2, checkpoint=str(mnt / "fit.npz"), callback=epochs.append)
    assert epochs == [] and t.history == [] and os.listdir(mnt) == []


def test_a_disk_that_fills_mid_run_is_one_clear_error_and_keeps_the_last_checkpoint(tmpfs):
    mnt = tmpfs("2m")
    ck = str(mnt / "fit.npz")

    def fill(record):
        if record["epoch"] == 0:
            with open(mnt / "filler", "wb") as f:
                try:
                    while True:
                        f.write(b"\0" * 65536)
                        f.flush()
                except OSError:
                    pass
    t = big_trainer()
    with pytest.raises(OSError) as info:
        t.fit(X, Y, epochs=3, checkpoint=ck, callback=fill)
    msg = str(info.value)
    assert info.value.errno == 28 and ck in msg and "ENOSPC" in msg and "free space" in msg, msg
    assert sorted(os.listdir(mnt)) == ["filler", "fit.npz"]  # no temporary left, the lock removed
    os.unlink(mnt / "filler")
    resumed = big_trainer()
    resumed.fit(X, Y, epochs=3, checkpoint=ck)  # the epoch-0 checkpoint: the call goes on
    assert len(resumed.history) == 3


def test_read_only_and_missing_folders_fail_before_any_work(tmpfs, tmp_path):
    """Before: dl trained an epoch first (EROFS, or a FileNotFoundError naming its temporary);
    txstream raised a raw OSError at the first commit."""
    mnt = tmpfs("1m", ro=True)
    epochs = []
    with pytest.raises(OSError, match=r"dl checkpoint .*fit.npz.*EROFS.*writable folder"):
        big_trainer().fit(X, Y, epochs=2, checkpoint=str(mnt / "fit.npz"), callback=epochs.append)
    with pytest.raises(OSError, match="ENOENT.*create the folder"):
        big_trainer().fit(X, Y, epochs=2, checkpoint=str(tmp_path / "nope" / "fit.npz"),
                          callback=epochs.append)
    assert epochs == []
    with ts.Store(sl.tables(8)) as store:
        with pytest.raises(OSError, match="txstream checkpoint .*EROFS"):
            ts.Engine(store, scheduler="serial", checkpoint=str(mnt / "ck"))
    os.mkdir(tmp_path / "ro")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(tmp_path / "ro")], check=True)
    try:
        os.mkdir(tmp_path / "ro" / "ck")
        subprocess.run(["mount", "-o", "remount,ro", str(tmp_path / "ro")], check=True)
        with ts.Store(sl.tables(8)) as store:
            with pytest.raises(OSError, match="txstream checkpoint .*ck.*EROFS"):
                ts.Engine(store, scheduler="serial", checkpoint=str(tmp_path / "ro" / "ck"))
    finally:
        subprocess.run(["umount", str(tmp_path / "ro")], capture_output=True)


@pytest.mark.slow  # a driver process per case: .ci/run runs them (-m slow)
def test_temporaries_of_killed_writers_are_removed_at_the_next_open(tmp_path):
    """Before: dl left a temporary (63 MiB for a real model) behind for every save a SIGKILL
    interrupted, and never removed it."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ck = tmp_path / "fit.npz"
    stale = [tmp_path / f"fit.npz.tmp{dead.pid}",
             tmp_path / f".fit.npz.{durable.HOST}.{dead.pid}.0123456789abcdef.tmp"]
    alive = tmp_path / f".fit.npz.{durable.HOST}.{os.getppid()}.0123456789abcdef.tmp"
    for p in (*stale, alive):
        p.write_bytes(b"\0" * 4096)
    trainer().fit(X, Y, epochs=1, checkpoint=str(ck))
    assert sorted(os.listdir(tmp_path)) == sorted(["fit.npz", alive.name])
    # a driver SIGKILLed in the middle of its run: its checkpoint folder is clean at the rerun
    folder = tmp_path / "k"
    folder.mkdir()
    go = tmp_path / "never"
    proc = subprocess.Popen([sys.executable, DRIVER, "dl", str(folder / "c")], env=dict(ENV, HOLD=str(go)),
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "holding"
    (folder / f".c.{durable.HOST}.{proc.pid}.0123456789abcdef.tmp").write_bytes(b"\0" * 4096)
    proc.kill()
    proc.wait()
    assert result(drive("dl", folder / "c"))["epochs"] == 3
    assert os.listdir(folder) == ["c"]
