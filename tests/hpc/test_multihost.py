"""MPI ranks over several hosts of the multi-host test bed (marker ``multihost``; the test bed's
``scripts/testbed up --slurm`` exports SHOAL_TESTBED_HOSTS, SHOAL_TESTBED_ROOT and SLURM_CONF:
``eval "$(scripts/testbed env)"``).  Skips with that hint when SHOAL_TESTBED_HOSTS is unset.

What runs here is the launcher layer over hosts: ``nodes.place_ranks`` places one rank per
host, ``mpi.Srun`` builds the command, and an ``sbatch -N 2`` job runs it with the mpi4py probe:
each rank on the host it was placed on, the allreduce over hosts correct, a rank's exit 3 failing
the step with its own stderr file.  The engine-level checks (one pilot over the N nodes of a
job, a 60-task ensemble on all hosts) are tests/multihost/test_multihost_allocation.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PROBE = os.path.join(HERE, "mpi_probe.py")
HINT = ("needs the multi-host test bed: `sudo scripts/testbed up --slurm`, then "
        "`eval \"$(scripts/testbed env)\"` and `python -m pytest -m multihost tests/hpc`")

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(300)]

JOB = textwrap.dedent("""\
    import json, os, subprocess, sys
    sys.path.insert(0, {root!r})
    from shoal.patterns.ensemble import mpi, nodes
    from shoal.patterns.ensemble.mpi import RANK_EXEC
    hosts = {hosts!r}
    placement = nodes.place_ranks(len(hosts), 1, {{h: [0] for h in hosts}})
    out = {out!r}
    results = {{}}
    for name, extra in (("ok", []), ("bad", ["--fail-rank", "1", "--code", "3"])):
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        argv = mpi.Srun().argv(placement, [sys.executable, "-S", RANK_EXEC, sys.executable,
                                          {probe!r}, d, *extra])
        env = dict(os.environ, **placement.env(d))
        results[name] = subprocess.run(argv, env=env, capture_output=True, text=True).returncode
    print(json.dumps(results))
    """)


def test_ranks_over_two_hosts_with_srun(tmp_path):
    hosts = os.environ.get("SHOAL_TESTBED_HOSTS", "").split()
    if len(hosts) < 2 or not os.environ.get("SLURM_CONF"):
        pytest.skip(HINT)
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.skip("mpi4py is not installed: sudo scripts/install-mpi")
    shared = os.path.join(os.environ["SHOAL_TESTBED_ROOT"], "shared", f"mpi-{os.getpid()}")
    os.makedirs(shared, exist_ok=True)
    script = os.path.join(shared, "job.py")
    with open(script, "w") as f:
        f.write(JOB.format(root=ROOT, hosts=hosts[:2], out=shared, probe=PROBE))
    done = subprocess.run(["sbatch", "--wait", "-N", "2", "--ntasks-per-node=1", "--time=3",
                           f"--output={shared}/job.out", "--wrap", f"{sys.executable} {script}"],
                          capture_output=True, text=True, timeout=240)
    text = open(f"{shared}/job.out").read() if os.path.exists(f"{shared}/job.out") else ""
    assert done.returncode == 0, done.stdout + done.stderr + text
    codes = json.loads(text.strip().splitlines()[-1])
    assert codes["ok"] == 0 and codes["bad"] == 3, text
    ranks = [json.load(open(os.path.join(shared, "ok", f"rank{r}.json"))) for r in range(2)]
    assert [r["host"] for r in ranks] == hosts[:2]  # rank i on the host it was placed on
    assert all(r["size"] == 2 and r["sum"] == 3 for r in ranks)
    bad = open(os.path.join(shared, "bad", "stderr.rank1")).read()
    assert "failing on purpose with code 3" in bad
