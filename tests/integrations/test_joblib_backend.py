"""scikit-learn's n_jobs on shoal through joblib: the same scores as loky (and as n_jobs=1)."""

from __future__ import annotations

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
