"""One pilot over every node of one SLURM job, on the test bed's SLURM (scripts/testbed up
--slurm: three hosts h1..h3 with their own hostname, /tmp and /dev/shm, one CPU each).

* inside: ``sbatch -N 3`` of a script running ``shoal run wf.yaml`` (60 executables, each
  appending its name and host to a file in a shared folder): the tasks ran on all three
  hosts, each exactly once, the run reports them done, and squeue and the hosts are empty
  after;
* ``salloc -N 3`` of a program run outside the nodes: ``shoal.Pilot()`` spans all three;
* outside: ``Pilot(provider="slurm", nodes=3, cores_per_node=1)`` from the root namespace is
  exactly ONE job of 3 nodes in squeue; tasks run on all three hosts; after ``close()``
  squeue lists nothing and no host runs a dask worker.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import textwrap
import time

import mh_tasks as mt
import pytest
from testbed_helpers import ROOT, slurm_testbed, wait_until  # noqa: F401 - fixture

import shoal

pytestmark = [pytest.mark.multihost, pytest.mark.no_leak_check, pytest.mark.timeout(400)]

WORKERS = "shoal.backends.dask.step_worker"


def _pythonpath() -> str:
    here = os.path.join(ROOT, "tests", "multihost")
    return os.pathsep.join(filter(None, [ROOT, here, os.path.join(ROOT, "tests"),
                                         os.environ.get("PYTHONPATH")]))


def _queue() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %D %T"], capture_output=True, text=True,
                         timeout=30, check=True)
    return out.stdout.split("\n")[:-1]


def _no_workers_left(bed) -> None:
    wait_until(lambda: not any(bed.processes_named(h, WORKERS) or bed.processes(h)
                               for h in bed.hosts), 30,
               "the dask workers and shoal workers to leave every host")


def _workflow(out: str, n: int) -> str:
    tasks = "\n".join(
        f"          - {{name: t{i}, executable: /bin/sh, arguments: "
        f"[\"-c\", \"sleep 0.2; echo t{i} $(hostname) >> {out}/ran.log\"]}}"
        for i in range(n))
    return f"pipelines:\n  - name: p\n    stages:\n      - name: s\n        tasks:\n{tasks}\n"


def test_sbatch_three_nodes_runs_one_ensemble_on_all_of_them(slurm_testbed, monkeypatch):  # noqa: F811
    bed = slurm_testbed
    monkeypatch.setenv("PYTHONPATH", _pythonpath())
    box = bed.shared_dir("alloc")
    with open(os.path.join(box, "wf.yaml"), "w") as f:
        f.write(_workflow(box, 60))
    script = os.path.join(box, "job.sh")
    with open(script, "w") as f:
        f.write(textwrap.dedent(f"""\
            #!/bin/sh
            cd {box}
            {sys.executable} -m shoal run wf.yaml --journal run.db
            echo "exit $?"
            {sys.executable} -m shoal status run.db
            """))
    done = subprocess.run(["sbatch", "--wait", "-N", "3", "--ntasks-per-node=1",
                           "--partition=testbed", "--time=5", f"--output={box}/job.out", script],
                          capture_output=True, text=True, timeout=300)
    text = open(f"{box}/job.out").read() if os.path.exists(f"{box}/job.out") else ""
    assert done.returncode == 0, done.stdout + done.stderr + text
    assert "exit 0" in text, text
    lines = open(os.path.join(box, "ran.log")).read().split("\n")[:-1]
    ran = collections.Counter(line.split()[0] for line in lines)
    assert sorted(ran) == sorted(f"t{i}" for i in range(60)), text  # every task ran
    assert set(ran.values()) == {1}, [t for t, c in ran.items() if c > 1]  # nothing twice
    hosts = {line.split()[1] for line in lines}
    assert hosts == set(bed.hosts[:3]), hosts
    assert wait_until(lambda: _queue() == [], 30, "squeue to be empty")
    _no_workers_left(bed)


def test_pilot_with_nodes_is_one_job_over_three_hosts(slurm_testbed, tmp_path, monkeypatch):  # noqa: F811
    bed = slurm_testbed
    monkeypatch.setenv("PYTHONPATH", _pythonpath())
    assert _queue() == []
    with shoal.Pilot(provider="slurm", nodes=3, cores_per_node=1, walltime="5m",
                     queue="testbed", log_directory=bed.shared_dir("alloc-logs"),
                     scheduler_options={"host": bed.env["SHOAL_TESTBED_GATEWAY"]}) as pilot:
        assert pilot.backend is shoal.BackendKind.DASK
        rows = _queue()
        assert len(rows) == 1 and rows[0].split()[1] == "3", rows  # ONE job of three nodes
        wait_until(lambda: pilot.nodes == 3, 120, "the three nodes' workers")
        hosts = collections.Counter(h for h, _ in pilot.map(_slow_where, range(30), chunksize=1))
        assert set(hosts) == set(bed.hosts[:3]), hosts
        assert sum(hosts.values()) == 30
        assert len(_queue()) == 1  # still the one job
    assert _queue() == []  # close() returns once squeue lists it no more
    _no_workers_left(bed)


def _slow_where(i):
    time.sleep(0.2)
    return mt.where(i)


def test_shoal_run_slurm_nodes_submits_one_job_of_three_nodes(slurm_testbed, monkeypatch):  # noqa: F811
    bed = slurm_testbed
    monkeypatch.setenv("PYTHONPATH", _pythonpath())
    box = bed.shared_dir("alloc-run")
    gateway = bed.env["SHOAL_TESTBED_GATEWAY"]
    with open(os.path.join(box, "wf.yaml"), "w") as f:
        f.write(f"resource: {{options: {{scheduler_options: {{host: '{gateway}'}}}}}}\n"
                + _workflow(box, 30))
    seen: list[list[str]] = []
    proc = subprocess.Popen([sys.executable, "-m", "shoal", "run", "wf.yaml", "--journal",
                             "run.db", "--slurm", "--nodes", "3", "--partition", "testbed",
                             "--walltime", "5m"], cwd=box, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    while proc.poll() is None:  # what squeue lists while it runs
        seen.append(_queue())
        time.sleep(0.5)
    text = proc.stdout.read()
    assert proc.returncode == 0, text
    assert {len(rows) for rows in seen} <= {0, 1}, seen  # never more than ONE job
    assert any(rows and rows[0].split()[1] == "3" for rows in seen), seen  # of three nodes
    lines = open(os.path.join(box, "ran.log")).read().split("\n")[:-1]
    assert sorted(line.split()[0] for line in lines) == sorted(f"t{i}" for i in range(30))
    assert {line.split()[1] for line in lines} == set(bed.hosts[:3])
    assert _queue() == []
    _no_workers_left(bed)


def test_inside_a_job_the_walltime_drains_opt_out_stays_and_too_big_is_refused(slurm_testbed,  # noqa: F811
                                                                        monkeypatch):
    """``--time=1`` for 90 tasks of 2 s on three 1-core nodes (a minute of work each): the run
    stops starting tasks before the job's end (exit 3, resumable), nothing ran twice; in the
    same job, SHOAL_ALL_NODES=0 runs everything on its first node, and a 2-core task is
    refused (no node has 2 cores) before anything runs."""
    bed = slurm_testbed
    monkeypatch.setenv("PYTHONPATH", _pythonpath())
    box = bed.shared_dir("alloc-drain")
    with open(os.path.join(box, "wf.yaml"), "w") as f:
        f.write(_workflow(box, 90).replace("sleep 0.2", "sleep 2"))
    with open(os.path.join(box, "small.yaml"), "w") as f:
        f.write(_workflow(os.path.join(box, "one"), 6))
    with open(os.path.join(box, "big.yaml"), "w") as f:
        f.write(_workflow(box, 1).replace("executable:", "cores: 2, executable:"))
    os.makedirs(os.path.join(box, "one"))
    script = os.path.join(box, "job.sh")
    with open(script, "w") as f:
        f.write(textwrap.dedent(f"""\
            #!/bin/sh
            cd {box}
            SHOAL_ALL_NODES=0 {sys.executable} -m shoal run small.yaml --journal one.db
            echo "one $?"
            {sys.executable} -m shoal run big.yaml --journal big.db
            echo "big $?"
            {sys.executable} -m shoal run wf.yaml --journal run.db
            echo "exit $?"
            """))
    done = subprocess.run(["sbatch", "--wait", "-N", "3", "--ntasks-per-node=1",
                           "--partition=testbed", "--time=1", f"--output={box}/job.out", script],
                          capture_output=True, text=True, timeout=300)
    text = open(f"{box}/job.out").read() if os.path.exists(f"{box}/job.out") else ""
    assert done.returncode == 0, done.stdout + done.stderr + text
    assert "one 0" in text, text
    one = open(os.path.join(box, "one", "ran.log")).read().split("\n")[:-1]
    assert len(one) == 6 and {line.split()[1] for line in one} == {bed.hosts[0]}, one
    # a task no node can hold: refused before it runs, naming it and the largest node
    assert "task p.s.t0 asks for 2 cores but the largest node, h1, has 1 cores" in text, text
    assert "big 0" not in text, text
    assert "exit 3" in text, text  # stopped at the walltime; the journal is resumable
    assert "--resume" in text, text
    lines = open(os.path.join(box, "ran.log")).read().split("\n")[:-1]
    ran = collections.Counter(line.split()[0] for line in lines)
    assert 0 < len(ran) < 90 and set(ran.values()) == {1}, ran
    assert {line.split()[1] for line in lines} == set(bed.hosts[:3])
    assert wait_until(lambda: _queue() == [], 30, "squeue to be empty")
    _no_workers_left(bed)


def test_an_n_node_job_that_ends_fails_its_tasks_instead_of_hanging(slurm_testbed,  # noqa: F811
                                                                     monkeypatch):
    bed = slurm_testbed
    monkeypatch.setenv("PYTHONPATH", _pythonpath())
    with shoal.Pilot(provider="slurm", nodes=2, cores_per_node=1, walltime="5m",
                     queue="testbed", log_directory=bed.shared_dir("alloc-end-logs"),
                     scheduler_options={"host": bed.env["SHOAL_TESTBED_GATEWAY"]}) as pilot:
        wait_until(lambda: pilot.nodes == 2, 120, "the two nodes' workers")
        fut = pilot.submit(time.sleep, 120)
        wait_until(fut.running, 30, "the task to start")
        (job,) = [row.split()[0] for row in _queue()]
        subprocess.run(["scancel", job], check=True, timeout=30)
        with pytest.raises(shoal.BackendUnavailable, match=f"job {job}.*not resubmitted"):
            fut.result(timeout=60)
        with pytest.raises(shoal.BackendUnavailable, match=f"job {job}"):
            pilot.submit(mt.where, 1)
    assert _queue() == []
    _no_workers_left(bed)


def test_salloc_from_outside_the_nodes_spans_them_too(slurm_testbed, monkeypatch):  # noqa: F811
    """``salloc -N 3 python prog.py`` runs the program here (the root namespace, no node of
    the job): ``shoal.Pilot()`` still spans the three nodes, its scheduler on this host."""
    bed = slurm_testbed
    monkeypatch.setenv("PYTHONPATH", _pythonpath())
    box = bed.shared_dir("alloc-salloc")
    prog = os.path.join(box, "prog.py")
    with open(prog, "w") as f:
        f.write(textwrap.dedent("""\
            import mh_tasks as mt
            import shoal
            with shoal.Pilot() as p:
                print("HOSTS", p.backend.value, p.nodes,
                      " ".join(sorted({h for h, _ in p.map(mt.where, range(30), chunksize=1)})))
            """))
    done = subprocess.run(["salloc", "-N", "3", "--partition=testbed", "--time=3",
                           sys.executable, prog], capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stdout + done.stderr
    line = [x for x in done.stdout.splitlines() if x.startswith("HOSTS")]
    assert line == [f"HOSTS dask 3 {' '.join(sorted(bed.hosts[:3]))}"], done.stdout + done.stderr
    assert wait_until(lambda: _queue() == [], 30, "squeue to be empty")
    _no_workers_left(bed)
