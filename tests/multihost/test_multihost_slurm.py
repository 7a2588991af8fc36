"""A SLURM pilot over the test bed's hosts (scripts/testbed up --slurm: slurmctld in the root
namespace, a slurmd on each host, its own SLURM_CONF): ``jobs=2`` lands one batch job on each
of two hosts, and an ensemble of executables and functions runs there with its inputs staged
from the driver's folder into sandboxes on the shared filesystem; each host's /tmp is its
own, so a task writing there leaves nothing the driver (or the other host) sees."""

from __future__ import annotations

import os
import socket
import time

import mh_tasks as mt
import pytest
from testbed_helpers import ROOT, slurm_testbed  # noqa: F401 - fixture

import shoal
from shoal.ensemble import Pipeline, Stage, Task, run

pytestmark = [pytest.mark.multihost, pytest.mark.no_leak_check, pytest.mark.timeout(400)]


def test_slurm_jobs_on_two_hosts_run_an_ensemble_with_staging(slurm_testbed, tmp_path,  # noqa: F811
                                                             monkeypatch):
    bed = slurm_testbed
    here = os.path.join(ROOT, "tests", "multihost")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [ROOT, here, os.path.join(ROOT, "tests"), os.environ.get("PYTHONPATH")])))
    src = tmp_path / "in.txt"
    src.write_text("\n".join(str(i) for i in range(10)) + "\n")
    with shoal.Pilot(backend="dask", provider="slurm", jobs=2, cores=1, memory="1GB",
                     walltime="10m", queue="testbed", log_directory=str(tmp_path / "logs"),
                     scheduler_options={"host": bed.env["SHOAL_TESTBED_GATEWAY"],
                                        "dashboard_address": ":0"}) as pilot:
        # the pilot starts with its first job's worker; 40 tiny tasks can all finish there
        # before the second job's worker connects (seen in CI), so wait for both jobs
        deadline = time.monotonic() + 120
        while pilot.nodes < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert pilot.nodes == 2, f"the second batch job's worker did not connect: {pilot.nodes}"
        hosts = {h for h, _ in pilot.map(mt.where, range(40))}
        assert hosts <= set(bed.hosts) and len(hosts) == 2, hosts
        tasks = [Task(executable="/bin/sh", name=f"x{i}",
                      arguments=["-c", "hostname > host; wc -l < in.txt; echo mine > /tmp/mine"],
                      inputs=[(str(src), "in.txt")]) for i in range(6)]
        tasks += [Task(function=mt.where, args=(i,), name=f"f{i}") for i in range(4)]
        rep = run(Pipeline([Stage(tasks, name="s")], name="p"), pilot=pilot,
                  journal=str(tmp_path / "run.db"))
        assert rep.ok and rep.done == 10, rep
        box = tmp_path / "run.sandbox" / "p" / "s"
        ran_on = {(box / f"x{i}" / "host").read_text().strip() for i in range(6)}
        assert ran_on <= set(bed.hosts)
        assert all((box / f"x{i}" / "stdout").read_text().strip() == "10" for i in range(6))
        assert {rep.result(f"p.s.f{i}")[0] for i in range(4)} <= set(bed.hosts)
        assert socket.gethostname() not in ran_on
        assert not os.path.exists("/tmp/mine") or open("/tmp/mine").read() != "mine\n"
