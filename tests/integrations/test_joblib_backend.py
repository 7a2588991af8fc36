"""scikit-learn's n_jobs on shoal through joblib: the same scores as loky (and as n_jobs=1)."""

from __future__ import annotations

import contextlib
import os

import int_tasks as it
import numpy as np
import pytest

import shoal

joblib = pytest.importorskip("joblib")
sklearn = pytest.importorskip("sklearn")
from sklearn.datasets import load_iris  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.model_selection import GridSearchCV, cross_val_score  # noqa: E402
from sklearn.tree import DecisionTreeClassifier  # noqa: E402

import shoal.integrations.joblib  # noqa: E402,F401  (registers backend "shoal")


@pytest.fixture(scope="module")
def data():
    return load_iris(return_X_y=True)


def test_parallel_matches_sequential_with_own_pilot():
    with joblib.parallel_config(backend="shoal", n_jobs=2):
        out = joblib.Parallel()(joblib.delayed(it.add)(i, i) for i in range(500))
    assert out == [2 * i for i in range(500)]


_LOKY = """
import json, joblib
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.tree import DecisionTreeClassifier
X, y = load_iris(return_X_y=True)
with joblib.parallel_config(backend="loky"):
    cv = cross_val_score(LogisticRegression(max_iter=500), X, y, cv=3, n_jobs=2)
    gs = GridSearchCV(DecisionTreeClassifier(random_state=0), GRID, cv=3, n_jobs=2).fit(X, y)
print(json.dumps({"cv": list(cv), "best": gs.best_params_, "mean": list(gs.cv_results_["mean_test_score"])}))
"""
GRID = {"max_depth": [1, 2, None]}


def test_cross_val_score_and_grid_search_match_loky(data):
    """The reference runs on loky in a fresh interpreter (loky keeps its workers and
    resource tracker alive for reuse; here they end with that interpreter)."""
    import json

    from conftest import run_script

    res = run_script(_LOKY.replace("GRID", repr(GRID)), timeout=120)
    assert res.returncode == 0, res.stderr
    ref = json.loads(res.stdout.strip().splitlines()[-1])
    X, y = data
    with shoal.Pilot(2) as pilot, joblib.parallel_config(backend="shoal", pilot=pilot):
        cv = cross_val_score(LogisticRegression(max_iter=500), X, y, cv=3, n_jobs=2)
        gs = GridSearchCV(DecisionTreeClassifier(random_state=0), GRID, cv=3, n_jobs=2).fit(X, y)
        assert pilot.stats()["driver"]["messages_in"] > 0  # the work ran on the pilot
    np.testing.assert_allclose(cv, ref["cv"])
    assert gs.best_params_ == ref["best"]
    np.testing.assert_allclose(gs.cv_results_["mean_test_score"], ref["mean"])


def test_error_reaches_the_caller_and_the_pilot_goes_on():
    with shoal.Pilot(2) as pilot, joblib.parallel_config(backend="shoal", pilot=pilot):
        with pytest.raises(ValueError, match="boom 3"):
            joblib.Parallel(n_jobs=2)(joblib.delayed(it.boom)(i) if i == 3 else joblib.delayed(it.inc)(i)
                                      for i in range(50))
        assert joblib.Parallel(n_jobs=2)(joblib.delayed(it.inc)(i) for i in range(10)) == list(range(1, 11))


def test_bad_pilot_argument():
    with pytest.raises(TypeError, match="shoal.Pilot"):
        with joblib.parallel_config(backend="shoal", pilot="nope"):
            joblib.Parallel(n_jobs=2)(joblib.delayed(it.inc)(1) for _ in range(2))


# -- loky's semantics (issue 36): memmaps, n_jobs, the warm default pilot, nesting, fork ------


@pytest.fixture(scope="module", autouse=True)
def loky_resource_tracker():
    """joblib's memmapping registers its temporary files with loky's resource tracker, a
    process that lives as long as this one: started before any test's leak check looks."""
    from joblib.externals.loky.backend import resource_tracker

    resource_tracker.ensure_running()


@pytest.fixture(autouse=True)
def close_default_pilot(leak_check):
    """The default pilot stays warm between calls, by design; closed after each test here
    (before the leak check looks)."""
    yield
    import shoal.integrations.joblib as sj

    getattr(sj, "close_default_pilot", lambda: None)()


_LOKY_MEMMAPS = """
import json, os, sys, tempfile
import numpy as np
from joblib import Parallel, delayed
sys.path.insert(0, TESTS)
import int_tasks as it
folder = tempfile.mkdtemp()
m = np.memmap(os.path.join(folder, "m.dat"), dtype="float64", mode="w+", shape=(20,))
Parallel(n_jobs=2, backend="loky")(delayed(it.write_into)(m, i) for i in range(20))
big, small = np.ones(300_000), np.ones(10)
kinds = Parallel(n_jobs=2, backend="loky")(delayed(it.array_kind)(a) for a in [big, small, m])
print(json.dumps({"written": m.tolist(), "kinds": [k[:2] for k in kinds]}))
"""


@pytest.fixture(scope="module")
def loky_memmaps():
    import json
    import os

    from conftest import run_script

    tests = os.path.dirname(os.path.abspath(__file__))
    res = run_script(_LOKY_MEMMAPS.replace("TESTS", repr(tests)), timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_task_writes_into_the_callers_memmap_are_seen_as_with_loky(tmp_path, loky_memmaps):
    m = np.memmap(tmp_path / "m.dat", dtype="float64", mode="w+", shape=(20,))
    joblib.Parallel(n_jobs=2, backend="shoal")(joblib.delayed(it.write_into)(m, i) for i in range(20))
    assert m.tolist() == loky_memmaps["written"] == [float(i + 1) for i in range(20)]


def test_arrays_arrive_as_with_loky_and_the_temporary_folder_is_removed(tmp_path, loky_memmaps):
    """Above max_nbytes (1 MB) a read-only memmap of a temporary file; below, a copy; a
    caller's memmap, a memmap of the caller's file."""
    m = np.memmap(tmp_path / "m.dat", dtype="float64", mode="w+", shape=(20,))
    big, small = np.ones(300_000), np.ones(10)
    with joblib.parallel_config(temp_folder=str(tmp_path / "tmp")):
        kinds = joblib.Parallel(n_jobs=2, backend="shoal")(
            joblib.delayed(it.array_kind)(a) for a in [big, small, m])
    assert [list(k[:2]) for k in kinds] == loky_memmaps["kinds"] == [
        ["memmap", False], ["ndarray", True], ["memmap", True]]
    assert str(kinds[2][2]) == str(tmp_path / "m.dat")
    assert kinds[0][2].startswith(str(tmp_path / "tmp"))
    assert not os.path.exists(os.path.dirname(kinds[0][2]))  # removed with the call
    # max_nbytes=None turns it off, as for loky
    kinds = joblib.Parallel(n_jobs=2, backend="shoal", max_nbytes=None)(
        joblib.delayed(it.array_kind)(a) for a in [big])
    assert list(kinds[0][:2]) == ["ndarray", True]


def test_n_jobs_1_and_none_run_in_the_caller_and_start_no_pilot():
    me = os.getpid()
    assert joblib.Parallel(n_jobs=1, backend="shoal")(joblib.delayed(it.getpid)() for _ in range(3)) \
        == [me] * 3
    assert joblib.Parallel(backend="shoal")(joblib.delayed(it.getpid)() for _ in range(3)) == [me] * 3
    with joblib.parallel_config(backend="shoal"):
        assert joblib.Parallel()(joblib.delayed(it.getpid)() for _ in range(3)) == [me] * 3
    assert shoal.integrations.joblib.default_pilot() is None


def test_the_default_pilot_has_the_workers_a_call_asks_for_and_stays_warm(tmp_path):
    """n_jobs=1 then 2 then 3 in one parallel_config (the order that left a 1-worker pilot
    running everything after): k tasks meet at a rendezvous only if k run at once; and
    the workers are the same from call to call, as loky's."""
    with joblib.parallel_config(backend="shoal"):
        joblib.Parallel(n_jobs=1)(joblib.delayed(it.inc)(i) for i in range(3))
        for k in (2, 3):
            folder = tmp_path / str(k)
            folder.mkdir()
            met = joblib.Parallel(n_jobs=k, batch_size=1)(
                joblib.delayed(it.rendezvous)(str(folder), i, k) for i in range(k))
            assert met == [True] * k
        first = set(joblib.Parallel(n_jobs=3)(joblib.delayed(it.getpid)() for _ in range(30)))
        again = set(joblib.Parallel(n_jobs=2)(joblib.delayed(it.getpid)() for _ in range(30)))
    assert os.getpid() not in first | again
    assert again <= first  # the same warm workers (a smaller call runs on them, 2 at once)
    pilot = shoal.integrations.joblib.default_pilot()
    assert pilot.workers == 3
    with joblib.parallel_config(backend="shoal"):
        assert joblib.effective_n_jobs(-1) == joblib.cpu_count()
        assert joblib.effective_n_jobs(5) == 5


def test_n_jobs_on_an_open_pilot_is_at_most_its_workers_and_at_most_k_at_once(tmp_path):
    with shoal.Pilot(3) as pilot, joblib.parallel_config(backend="shoal", pilot=pilot):
        assert joblib.effective_n_jobs(2) == 2
        assert joblib.effective_n_jobs(7) == 3
        assert joblib.effective_n_jobs(-1) == 3
        assert joblib.effective_n_jobs(-2) == 2
        me = os.getpid()
        assert joblib.Parallel(n_jobs=1)(joblib.delayed(it.getpid)() for _ in range(2)) == [me, me]
        seen = joblib.Parallel(n_jobs=2, batch_size=1)(
            joblib.delayed(it.running_at_once)(str(tmp_path), i) for i in range(9))
        assert max(seen) <= 2
    with shoal.Pilot(2) as pilot:  # the innermost open pilot, without pilot=
        with joblib.parallel_config(backend="shoal"):
            assert joblib.effective_n_jobs(3) == 2


def test_the_default_pilot_is_closed_at_interpreter_exit():
    import json

    import psutil
    from conftest import run_script

    script = (
        "import json, os, sys; sys.path.insert(0, TESTS)\n"
        "import joblib, int_tasks as it\n"
        "import shoal.integrations.joblib as sj\n"
        "pids = joblib.Parallel(n_jobs=2, backend='shoal')(joblib.delayed(it.getpid)() for _ in range(8))\n"
        "assert sj.default_pilot() is not None and not any(\n"
        "    r() is sj.default_pilot() for r in sj._context.pilots)  # not the innermost pilot\n"
        "print(json.dumps(sorted(set(pids))))\n"
    ).replace("TESTS", repr(os.path.dirname(os.path.abspath(__file__))))
    res = run_script(script, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stderr.strip() == ""
    for pid in json.loads(res.stdout.strip().splitlines()[-1]):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.parametrize("workers", [1, 2])
def test_parallel_with_the_shoal_backend_inside_a_shoal_task(workers):
    """The task imports joblib in the worker: "shoal" is registered there, and the batches
    are children of the task (a 1-worker pilot too: the waiting task runs them)."""
    with shoal.Pilot(workers) as pilot:
        assert pilot.submit(it.nested_parallel, 20).result(timeout=120) == list(range(1, 21))
        futs = [pilot.submit(it.nested_parallel, 10) for _ in range(4)]
        assert [f.result(timeout=120) for f in futs] == [list(range(1, 11))] * 4


def test_a_nested_parallel_call_in_a_shoal_batch_runs_on_shoal():
    out = joblib.Parallel(n_jobs=2, backend="shoal")(joblib.delayed(it.nested_default)(5) for _ in range(4))
    assert out == [("ShoalBackend", list(range(1, 6)))] * 4


def nested_loop(backend):
    """joblib's test_nested_loop's inner function."""
    joblib.Parallel(n_jobs=2, backend=backend)(joblib.delayed(it.inc)(0.01) for _ in range(2))
    return os.getpid()


@pytest.mark.fd_slack(4)  # joblib's multiprocessing pool leaves its 2 queue pipes open (any inner backend)
@pytest.mark.parametrize("parent_has", ["a warm default pilot", "an open pilot"])
def test_forked_children_start_their_own_pilot(parent_has):
    """joblib's test_nested_loop[multiprocessing-shoal]: the multiprocessing backend forks
    children that use "shoal" themselves while the parent has a pilot running."""
    with contextlib.ExitStack() as stack:
        if parent_has == "an open pilot":
            stack.enter_context(shoal.Pilot(2))
        joblib.Parallel(n_jobs=2, backend="shoal")(joblib.delayed(it.inc)(i) for i in range(4))
        pids = joblib.Parallel(n_jobs=2, backend="multiprocessing")(
            joblib.delayed(nested_loop)("shoal") for _ in range(2))
        assert os.getpid() not in pids
        # and the parent's pilot still works
        assert joblib.Parallel(n_jobs=2, backend="shoal")(
            joblib.delayed(it.inc)(i) for i in range(4)) == [1, 2, 3, 4]


def _in_fork(fn) -> str:
    """Run ``fn()`` in a forked child; what it returns (or raises), as text."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(r)
        try:
            out = repr(fn())
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            out = f"{type(exc).__name__}: {exc}"
        try:
            from shoal.integrations.joblib import close_default_pilot as close

            close()
        finally:
            os.write(w, out.encode())
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        out = pipe.read().decode()
    os.waitpid(pid, 0)
    return out


def test_a_forked_child_uses_a_fresh_pilot_not_the_parents_open_one():
    def use():
        pids = joblib.Parallel(n_jobs=2, backend="shoal")(joblib.delayed(it.getpid)() for _ in range(4))
        return os.getpid() not in pids  # ran on workers, not in the child itself

    with shoal.Pilot(2):  # the innermost open pilot: the child must not use it
        assert _in_fork(use) == "True"


def test_a_parents_pilot_given_explicitly_in_a_forked_child_is_one_clear_error():
    with shoal.Pilot(2) as pilot:
        def use():
            with joblib.parallel_config(backend="shoal", pilot=pilot):
                return joblib.Parallel(n_jobs=2)(joblib.delayed(it.inc)(i) for i in range(4))

        out = _in_fork(use)
        assert pilot.submit(it.inc, 1).result() == 2  # the parent's pilot is untouched
    assert out.startswith("PilotClosed: ") and "fork" in out and "open a new shoal.Pilot" in out, out


def test_initializer_runs_in_every_worker_of_the_default_pilot(tmp_path):
    """joblib's initializer=/initargs= (as for loky): the default pilot is (re)started with
    them; on a pilot of the user's they are refused (its workers run already)."""
    out = joblib.Parallel(n_jobs=2, backend="shoal", initializer=it.touch_pid, initargs=(str(tmp_path),))(
        joblib.delayed(it.initialized_here)(str(tmp_path), i) for i in range(20))
    assert out == [True] * 20
    with shoal.Pilot(2) as pilot, joblib.parallel_config(backend="shoal", pilot=pilot):
        with pytest.raises(ValueError, match="initializer=/initargs= to shoal.Pilot"):
            joblib.Parallel(n_jobs=2, initializer=it.touch_pid, initargs=(str(tmp_path),))(
                joblib.delayed(it.inc)(i) for i in range(2))
    with pytest.raises(TypeError, match="unexpected argument.*idle_worker_timeout"):
        joblib.Parallel(n_jobs=2, backend="shoal", idle_worker_timeout=3)(
            joblib.delayed(it.inc)(i) for i in range(2))
