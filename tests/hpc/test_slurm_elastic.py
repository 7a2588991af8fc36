"""An elastic pilot (``jobs=(1, 3)``) against a real SLURM (``sudo scripts/slurm-local up``;
marker ``slurm``): a burst of tasks grows it, the end of the burst shrinks it.

slurm-local's one node has 2 CPUs and the smallest job is 1 core, so of the 3 jobs the burst
asks for 2 run and the third stays PENDING (Resources) until the work runs out, when it is
cancelled; the second running job is given back once idle."""

from __future__ import annotations

import threading
import time

import pytest
import tasks_hpc as th
from slurm_helpers import queue, slurm, tasks_importable, wait_for  # noqa: F401 (fixtures)

import shoal

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm", "tasks_importable"), pytest.mark.fd_slack(64),
              pytest.mark.timeout(240)]


class Timeline:
    """Samples (seconds since start, jobs the pilot asks for, its jobs SLURM runs) every 0.5 s."""

    def __init__(self, pilot):
        self.pilot, self.rows, self.t0 = pilot, [], time.monotonic()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.wait(0.5):
            driver = self.pilot.stats()["driver"]
            running = sum(j["state"] == "RUNNING" for j in driver["jobs"])
            self.rows.append((round(time.monotonic() - self.t0, 1), driver["elastic"]["jobs"],
                              running))

    def close(self):
        self.stop.set()
        self.thread.join(10)


def test_a_burst_grows_a_1_3_pilot_to_3_jobs_and_it_shrinks_back_to_1(tmp_path):
    n, delay = 16, 4.0
    ledger = tmp_path / "ledger"
    with shoal.Pilot(backend="dask", provider="slurm", jobs=(1, 3), cores=1, memory="1GB",
                     walltime="10m", grow_after_s=1, idle_after_s=5,
                     log_directory=str(tmp_path), scheduler_options={"dashboard_address": ":0"}) as p:
        timeline = Timeline(p)
        try:
            futs = [p.submit(th.ledger, i, str(ledger), delay) for i in range(n)]
            results = [f.result(180) for f in futs]
            wait_for(lambda: p.stats()["driver"]["elastic"]["jobs"] == 1, 60,
                     "the pilot to shrink back to 1 job")
            elastic = p.stats()["driver"]["elastic"]
            ids = {j["job_id"] for j in p.stats()["driver"]["jobs"]}
        finally:
            timeline.close()
    print("timeline (s, jobs asked for, jobs running):", timeline.rows)
    print("decisions:", [(d["action"], d["job_id"], d["reason"]) for d in elastic["decisions"]])
    assert sorted(x for x, _ in results) == list(range(n))
    lines = ledger.read_text().split()
    ran = sorted(int(x) for x in lines[::2])
    assert ran == list(range(n)), f"every task runs exactly once: {ran}"
    assert elastic["peak"] == 3, elastic
    actions = [d["action"] for d in elastic["decisions"]]
    assert actions.count("submit") >= 2, actions
    assert "retire" in actions, actions
    assert max(asked for _, asked, _ in timeline.rows) == 3
    assert len({job for _, job in results}) >= 2, "the burst ran in more than one job"
    assert all(d["reason"] for d in elastic["decisions"])
    assert not (ids & set(queue())), "close() leaves none of the pilot's jobs in squeue"


WORKFLOW = """
resource: {backend: slurm, jobs: "1:3", cores: 1, options: {grow_after_s: 2, idle_after_s: 5}}
pipelines:
  - name: p
    stages:
      - name: s
        tasks:
%s
"""


def test_shoal_run_an_elastic_resource_grows_and_the_journal_says_why(tmp_path):
    """``shoal run wf.yaml`` whose ``resource:`` asks for ``jobs: "1:3"``: the ensemble's
    tasks wait in dask beyond grow_after_s, so the pilot submits 2 more jobs; the journal
    keeps each decision with its reason and the job watch's notes (``shoal status`` prints
    them, the journal dashboard's state carries them); each task done exactly once."""
    import subprocess

    from slurm_helpers import shoal_cmd

    done = tmp_path / "done.txt"
    tasks = "\n".join(f'          - {{name: t{i}, executable: /bin/sh, arguments: ["-c", '
                      f'"sleep 4; echo t{i} $SLURM_JOB_ID >> {done}"]}}' for i in range(12))
    (tmp_path / "wf.yaml").write_text(WORKFLOW % tasks)
    out = subprocess.run(shoal_cmd("run", "wf.yaml", "--journal", "j.db"), cwd=tmp_path,
                         capture_output=True, text=True, timeout=200)
    assert out.returncode == 0, out.stdout + out.stderr
    names = [line.split()[0] for line in done.read_text().splitlines()]
    assert sorted(names) == sorted(f"t{i}" for i in range(12)), "each task done exactly once"
    assert len({line.split()[1] for line in done.read_text().splitlines()}) >= 2, "ran in 2+ jobs"
    status = subprocess.run(shoal_cmd("status", "j.db"), cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    print(status.stdout)
    submits = [ln for ln in status.stdout.splitlines()
               if "elastic pilot: submitting a job: " in ln and "tasks waiting, the oldest for" in ln]
    assert len(submits) >= 1, status.stdout
    from shoal.dashboard.journal import journal_state

    events = journal_state(str(tmp_path / "j.db"))["job_events"]
    assert any("submitting a job" in e["text"] for e in events), events
    assert any("-> RUNNING" in e["text"] for e in events), events  # the job watch's notes
