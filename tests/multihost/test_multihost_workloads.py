"""shoal's workloads on the hosts of scripts/testbed: a dask worker on each of 3 hosts that
share neither memory, /dev/shm nor /tmp with each other or with this driver (which runs in
the root namespace, on no test-bed host).

Every test opens its own pilot and checks, after closing it, that no host holds a shoal
process or a /dev/shm or /tmp entry it did not hold before (``no_leftovers``).

The conformance suite's dask column (tests/conformance), the search skeletons
(tests/dask/test_dask_search.py) and the ensemble conformance (tests/dask/test_dask_ensemble.py)
run on this cluster too, as their ``dask-testbed`` parameter (-m multihost).
"""

from __future__ import annotations

import functools
import json
import os
import socket
import sys
import urllib.request

import mh_tasks as mt
import numpy as np
import pytest
from testbed_helpers import ROOT, testbed, wait_until  # noqa: F401 - fixture

sys.path[:0] = [os.path.join(ROOT, "tests", d) for d in ("dask", "patterns")]
import search_tasks as st  # noqa: E402

import shoal  # noqa: E402
from shoal.patterns import all_pairs  # noqa: E402
from shoal.patterns import backtracking as bt  # noqa: E402

pytestmark = [pytest.mark.multihost, pytest.mark.no_leak_check]


@pytest.fixture
def no_leftovers(testbed):  # noqa: F811
    """The hosts' /dev/shm and /tmp and shoal processes now; after the test: nothing new."""
    testbed.ensure_up()
    before = testbed.snapshot()
    yield testbed
    testbed.assert_clean(before)


@pytest.fixture
def pilot(no_leftovers):
    with shoal.Pilot(backend="dask", address=no_leftovers.dask, workers=1) as p:
        yield p


def test_each_host_is_a_machine_of_its_own(pilot, no_leftovers):
    """Tasks run on all three hosts, none on the driver's; a file a task leaves in its
    host's temp folder exists there only."""
    hosts = {h for h, _ in pilot.map(mt.where, range(60))}
    assert hosts == set(no_leftovers.hosts) and socket.gethostname() not in hosts
    host, path = pilot.submit(mt.leave_temp_file, f"shoal-mh-{os.getpid()}").result(60)
    try:
        assert not os.path.exists(path)  # not in the driver's /tmp
        seen = {h: no_leftovers.run(h, "test", "-e", path, check=False).returncode == 0
                for h in no_leftovers.hosts}
        assert seen == {h: h == host for h in no_leftovers.hosts}
    finally:
        no_leftovers.run(host, "rm", "-f", path)


def test_spawn_program_with_pilot_cells_and_per_node_arrays(pilot, no_leftovers):
    """A ``shoal.spawn`` program that carries a ``BestCell.for_pilot`` stop flag and a
    ``SharedArray.per_node``: the balancer moves its leaves between hosts, each leaf sees the
    flag the driver raises, and each host's copy of the array counts the leaves it ran."""
    from distributed import Client

    n = 9
    flag = shoal.BestCell.for_pilot(pilot, "max", initial=0.0)
    rows = shoal.SharedArray.per_node(pilot, (pilot.workers + 1, 1), "int64", fill=0)
    try:
        fut = pilot.submit(st.spinners, flag, rows, n)
        try:
            wait_until(lambda: pilot.stats()["driver"]["moved"] >= 1, 120,
                       "the balancer to move a leaf to another host")
        finally:
            flag.offer(1.0)
        assert fut.result(120) == ["stopped"] * n
        with Client(no_leftovers.dask, set_as_default=False) as client:
            names = no_leftovers.dask_hosts(client)
            per_host = {names[a]: v for a, v in client.run(st.node_rows, rows).items()}
        assert sum(per_host.values()) == n
        assert sum(1 for v in per_host.values() if v > 0) >= 2, per_host  # leaves ran on 2+ hosts
    finally:
        flag.close()
        rows.close()


def test_stop_flag_reaches_every_host(pilot):
    """``StopFlag.for_pilot`` through ``bt.find``: the needle is deep on one host while the
    others are in subtrees that never end; only the flag, relayed through the driver to every
    host, lets ``find`` return."""
    assert pilot.nodes == 3
    got = bt.find(pilot, ("r", 0), st.needle, st.is_needle, stats=True)
    assert got.node == ("g", 6) and got.stats.stop_latency_s is not None


def test_a_driver_shared_array_is_refused_on_another_host_naming_both(pilot):
    """A plain ``SharedArray`` is memory of the driver's host, named by the driver's pid and
    fd.  Before, a task on another host of this test bed opened /proc/<driver pid>/fd/<fd>
    (visible here only because the hosts share one kernel) and silently wrote the driver's
    memory; on real hosts that pid is another process or none.  Now: refused, with both
    host names in the error."""
    with shoal.SharedArray((8,), "float64", fill=1.0) as arr:
        fut = pilot.submit(mt.mean_of, arr)
        with pytest.raises(Exception) as info:
            fut.result(60)
    text = str(info.value) + str(info.value.__cause__ or "")
    assert socket.gethostname() in text and "made on host" in text, text
    assert any(f"'{h}'" in text for h in ("h1", "h2", "h3")), text
    assert "SharedArray.per_node" in text


def test_search_checkpoint_survives_a_killed_driver_across_hosts(no_leftovers, tmp_path,
                                                                monkeypatch):
    """A checkpointed N-Queens 12 count whose driver is SIGKILLed mid-search, resumed by a new
    driver on the same test-bed cluster: exact (OEIS A000170).  The checkpoint is on the
    driver's disk; the search's work was on the three hosts.  The killed driver's node
    runtimes go after their ``idle_timeout`` (5 s here), so the hosts end clean."""
    from checkpoint_kill import kill_and_resume

    monkeypatch.setenv("SHOAL_TEST_IDLE_TIMEOUT", "5")
    from shoal.workloads.nqueens import OEIS_A000170

    res = kill_and_resume(tmp_path, "queens", 12, no_leftovers.dask)
    assert res["value"] == OEIS_A000170[12]


def test_exact_clique_number_across_hosts(pilot):
    """A DIMACS clique number (brock200_2: 12, published) by branch and bound over 3 hosts."""
    from shoal.patterns import branch_and_bound as bb

    adj = st.read_dimacs(os.path.join(ROOT, "examples", "data", "dimacs", "brock200_2.clq"))
    got = bb.maximise(pilot, st.clique_root(adj), functools.partial(st.clique_children, adj),
                      st.clique_size, st.clique_bound, prune_level=True, stats=True)
    assert got.value == 12 and st.is_clique(adj, got.node[1])


def test_all_pairs_in_memory_arrays_across_hosts(pilot, no_leftovers):
    """``compute(pilot, X, block=cdist, condensed=True)`` is scipy's ``pdist(X)``, bit for bit,
    with the strips computed on the three hosts (no /dev/shm of the driver there: each strip
    carries its rows and comes back as a task result)."""
    from scipy.spatial.distance import cdist, pdist, squareform

    folder = no_leftovers.shared_dir("all-pairs-arrays")
    assert all_pairs.across_hosts(pilot)
    rng = np.random.default_rng(3)
    X, Y = rng.normal(size=(300, 5)), rng.normal(size=(40, 5))
    noting = functools.partial(mt.cdist_noting_host, folder)
    np.testing.assert_array_equal(all_pairs.compute(pilot, X, block=noting, condensed=True),
                                  pdist(X))
    with open(os.path.join(folder, "hosts")) as f:
        assert len(set(f.read().split())) >= 2  # strips ran on two hosts or more
    np.testing.assert_array_equal(all_pairs.compute(pilot, X, block=cdist), squareform(pdist(X)))
    np.testing.assert_array_equal(all_pairs.compute(pilot, X, block=cdist, other=Y), cdist(X, Y))


def test_all_pairs_file_items_on_the_shared_checkout(pilot):
    """Files loaded on the hosts (``load=os.path.getsize``): the items go to each host once,
    the tiles come back; exact, and the work (per host in ``.stats``) is on two hosts or more."""
    paths = sorted(os.path.join(ROOT, "examples", "data", "dimacs", f)
                   for f in os.listdir(os.path.join(ROOT, "examples", "data", "dimacs")))
    got = all_pairs.compute(pilot, paths, mt.size_diff, load=os.path.getsize, tile=2)
    sizes = np.array([os.path.getsize(p) for p in paths], dtype=float)
    assert np.array_equal(np.asarray(got), np.abs(sizes[:, None] - sizes[None, :]))
    n = len(paths)
    assert got.stats.pairs == n * (n + 1) // 2 and got.stats.item_loads.min() >= 1
    worked = {w["host"] for w in got.stats.per_worker if w["pairs"]}
    assert len(worked) >= 2 and worked <= set(pilot_hosts(pilot)), got.stats.per_worker


def test_all_pairs_tiles_lent_to_another_host_bring_the_items(pilot):
    """One block (the slow 8 x 8 corner) outlasts the others: the balancer lends its tiles to
    the hosts that are done, each lent task carrying the items to its new host; exact, with
    the pairs counted once."""
    items = list(range(40))
    got = all_pairs.compute(pilot, items, mt.slow_in_the_corner, tile=1)
    a = np.array(items, dtype=float)
    assert np.array_equal(np.asarray(got), np.abs(a[:, None] - a[None, :]))
    assert pilot.stats()["driver"]["moved"] >= 1
    assert got.stats.pairs == 40 * 41 // 2
    assert sum(w["pairs"] for w in got.stats.per_worker) == got.stats.pairs


def test_all_pairs_outputs_across_hosts(pilot, no_leftovers):
    """``out=`` a file (on the driver's disk), an ``on_tile`` callback and ``top_k`` across
    hosts: each the one-process answer."""
    from scipy.spatial.distance import cdist, squareform

    X = np.random.default_rng(5).normal(size=(50, 3))
    ref = squareform(np.asarray(cdist(X, X))[np.triu_indices(50, 1)])
    items = list(X)
    path = os.path.join(no_leftovers.shared_dir("all-pairs-out"), "d.npy")
    on_disk = all_pairs.compute(pilot, items, mt.euclid, tile=5, out=path)
    np.testing.assert_allclose(np.load(path), ref, rtol=1e-12, atol=1e-12)
    assert on_disk.shape == (50, 50)
    seen = np.full((50, 50), np.nan)

    def on_tile(i0, j0, tile):
        seen[i0:i0 + tile.shape[0], j0:j0 + tile.shape[1]] = tile

    all_pairs.compute(pilot, items, mt.euclid, tile=5, out=on_tile)
    np.testing.assert_allclose(seen, ref, rtol=1e-12, atol=1e-12)
    best = all_pairs.compute(pilot, items, mt.euclid, tile=5, top_k=2)
    masked = ref + np.diag(np.full(50, np.inf))
    np.testing.assert_array_equal(best.indices, np.argsort(masked, axis=1, kind="stable")[:, :2])


def test_a_failing_pair_on_another_host_names_it(pilot):
    with pytest.raises(all_pairs.PairError, match=r"\(i, j\) = \((3, 5|5, 3)\)"):
        all_pairs.compute(pilot, list(range(12)), mt.fails_on_3_5, tile=2)
    assert np.asarray(all_pairs.compute(pilot, [1, 4], mt.size_diff))[0, 1] == 3  # goes on


def pilot_hosts(pilot) -> list[str]:
    return sorted({h for h, _ in pilot.map(mt.where, range(30))})


def _dl_fit(pilot, plan, epochs, batch_size=32, **kw):
    """tests/dl/test_dl_digits.py's MLP trained under ``plan`` on ``pilot`` (None: here)."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "dl"))
    from dl_models import digits

    from shoal.workloads import dl

    Xtr, Xte, ytr, yte = digits()
    model = dl.Sequential([dl.Linear(64, 64), dl.ReLU(), dl.Linear(64, 10)], seed=0)
    trainer = dl.Trainer(model, optimizer=dl.SGD(lr=0.1, momentum=0.9), pilot=pilot, plan=plan)
    trainer.fit(Xtr, ytr, epochs=epochs, batch_size=batch_size, shuffle=True, seed=0, **kw)
    return trainer, (Xte, yte)


def _same_bits(a, b) -> bool:
    pa, pb = a.parameters(), b.parameters()
    return len(pa) == len(pb) and all(np.array_equal(x, y) for x, y in zip(pa, pb, strict=True))


@pytest.mark.parametrize("plan", [dict(replicas=2, stages=2, micro_batches=4, schedule="1f1b"),
                                  dict(replicas=2, stages=2, micro_batches=4, schedule="gpipe"),
                                  dict(replicas=3, stages=1, micro_batches=2)],
                         ids=["hybrid-1f1b", "hybrid-gpipe", "data-3"])
@pytest.mark.timeout(400)  # (three 15-epoch fits: over a minute on a loaded 2-core machine)
def test_dl_trainer_on_a_multi_host_pilot(pilot, plan):
    """One plan, bitwise the same parameters in this process, on 1 host x 2 workers (a local
    pilot: the shared arena) and on 3 hosts x 1 worker (tasks exchange arrays as results,
    dl.Transport.FUTURES, chosen because the workers are on other hosts); the digits test
    accuracy of the hybrid plans is >= 0.97."""
    from shoal.workloads import dl

    plan = dl.Plan(**plan)
    epochs = 15 if plan.stages > 1 else 2
    serial, (Xte, yte) = _dl_fit(None, plan, epochs)
    with shoal.Pilot(workers=2) as local:
        one_host, _ = _dl_fit(local, plan, epochs)
        outputs = one_host.predict(Xte)
    hosts, _ = _dl_fit(pilot, plan, epochs)
    assert hosts._transport() is dl.Transport.FUTURES and one_host._transport() is dl.Transport.ARENA
    assert _same_bits(serial, one_host) and _same_bits(serial, hosts)
    assert np.array_equal(hosts.predict(Xte), outputs)  # (one BLAS thread each)
    if plan.stages > 1:
        assert hosts.evaluate(Xte, yte) >= 0.97


@pytest.mark.parametrize("fault, epochs, options", [("crash", 3, {}),
                                                    ("partition", 2, {"silent_after_s": 5})],
                         ids=["crash", "partition"])
@pytest.mark.timeout(400)  # (repairing a cut host alone takes a minute on a loaded machine)
def test_dl_trainer_survives_a_host_fault_mid_epoch(testbed, fault, epochs, options):  # noqa: F811
    """h2 crashed (every process SIGKILLed) or cut off (its link down: the pilot drops its
    silent dask worker after ``silent_after_s``) in the middle of epoch 1: h2's tasks re-run
    on the other hosts, lost results are recomputed from the same inputs, and the final
    parameters are bitwise those of the undisturbed run."""
    import threading

    from shoal.workloads import dl

    testbed.ensure_up()
    plan = dl.Plan(replicas=3, stages=2, micro_batches=2)
    serial, _ = _dl_fit(None, plan, epochs, batch_size=16)
    struck, seen = threading.Event(), {}

    def strike_h2_in_epoch_1(record):
        if record["epoch"] == 0:
            threading.Timer(0.2, lambda: (testbed.verb(fault, "h2"), struck.set())).start()
        if record["epoch"] == 1:
            seen["struck in epoch 1"] = struck.is_set()

    try:
        with shoal.Pilot(backend="dask", address=testbed.dask, workers=1, **options) as p:
            hosts, _ = _dl_fit(p, plan, epochs, batch_size=16, callback=strike_h2_in_epoch_1)
        assert seen == {"struck in epoch 1": True}
        assert _same_bits(serial, hosts)
    finally:
        struck.wait(60)
        testbed.repair()


def test_dashboard_groups_workers_by_host(no_leftovers):
    """The pilot's workers view on a 3-host cluster: one row per shoal worker with its host's
    name, grouped by host; CPU % only for workers of the driver's host (none here: a pid of
    another host names nothing, or another process, in this host's /proc)."""
    with shoal.Pilot(backend="dask", address=no_leftovers.dask, workers=1, dashboard=0) as p:
        list(p.map(mt.where, range(30)))

        def state():
            with urllib.request.urlopen(p.dashboard_url.rstrip("/") + "/api/state",
                                        timeout=10) as r:
                s = json.load(r).get("pilot") or {}
            return s if len(s.get("workers", [])) == 3 else None

        s = wait_until(state, 60, "the workers view to list the 3 hosts' workers")
        hosts = [r["host"] for r in s["workers"]]
        assert hosts == sorted(hosts) == sorted(no_leftovers.hosts)  # grouped, in host order
        assert sorted(s["hosts"]) == sorted(no_leftovers.hosts)
        assert all(len(v) == 1 for v in s["hosts"].values())
        assert all(r["cpu_percent"] is None for r in s["workers"])
