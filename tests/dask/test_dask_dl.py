"""shoal.workloads.dl on the dask backend (a LocalCluster of 2 worker processes, each hosting
a node runtime of one shoal worker): the same plan gives bitwise the parameters it gives in
one process and on the local backend."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from dask_cluster import clusters, pilot  # noqa: F401 - fixtures

from shoal.workloads import dl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "dl"))
from dl_models import digits, mlp, same  # noqa: E402

pytestmark = pytest.mark.fd_slack(8)


@pytest.fixture(scope="module")
def kind(clusters):
    clusters.warm("dask-localcluster")
    return "dask-localcluster"


def test_hybrid_plan_on_dask_is_bitwise_the_in_process_run(pilot):
    Xtr, Xte, ytr, _ = digits(400)
    runs = []
    for p in (None, pilot):
        trainer = dl.Trainer(mlp(), optimizer=dl.SGD(lr=0.1, momentum=0.9), pilot=p,
                             plan=dl.Plan(replicas=2, stages=2, micro_batches=4, schedule="gpipe"))
        trainer.fit(Xtr, ytr, epochs=1, batch_size=32, shuffle=True, seed=3)
        runs.append(trainer)
    assert same(runs[0].parameters(), runs[1].parameters())
    assert np.array_equal(runs[0].predict(Xte), runs[1].predict(Xte))
