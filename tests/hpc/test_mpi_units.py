"""MPI tasks without MPI: the launcher choice, the rank placement and command lines, the model's
``ranks=``/``cores_per_rank=`` and EnTK's ``cpu_process_type='MPI'`` (pure; default suite).
The runs with real Open MPI and SLURM are in test_mpi.py (markers mpi, slurm)."""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shoal.ensemble import EnsembleError, Pipeline, Stage, Task, run
from shoal.patterns.ensemble import launcher, mpi
from shoal.patterns.ensemble.mpi import LauncherKind, RankPlacement


def which_of(*found):
    return lambda name: f"/usr/bin/{name}" if name in found else None


def test_choose_prefers_srun_inside_a_slurm_job_and_mpirun_elsewhere():
    inside = {"SLURM_JOB_ID": "7"}
    assert mpi.choose(env=inside, which=which_of("srun", "mpirun"), euid=0).kind is LauncherKind.SRUN
    assert mpi.choose(env={}, which=which_of("srun", "mpirun"), euid=0).kind is LauncherKind.MPIRUN
    # inside a job without srun on PATH: mpirun
    assert mpi.choose(env=inside, which=which_of("mpirun"), euid=0).kind is LauncherKind.MPIRUN
    # the override wins, also as a string
    assert mpi.choose("mpirun", env=inside, which=which_of("srun", "mpirun"), euid=0).kind is LauncherKind.MPIRUN
    assert mpi.choose("none", env=inside, which=which_of("srun")).kind is LauncherKind.NONE
    assert mpi.choose(LauncherKind.SRUN, env={}, which=which_of("srun")).kind is LauncherKind.SRUN


def test_choose_says_how_to_get_a_launcher_when_there_is_none():
    found = mpi.choose(env={}, which=which_of())
    assert isinstance(found, mpi.NotFound)
    assert "scripts/install-mpi" in found.why and "launcher='none'" in found.why
    assert "srun is not on PATH" in mpi.choose("srun", env={}, which=which_of("mpirun")).why
    with pytest.raises(EnsembleError, match="launcher='jsrun'.*srun, mpirun, none"):
        mpi.choose("jsrun")


def test_mpirun_allows_root_only_as_root():
    p = RankPlacement(2, 1, (("h1", (0, 1)),))
    assert "--allow-run-as-root" in mpi.choose(env={}, which=which_of("mpirun"), euid=0).argv(p, ["a"])
    assert "--allow-run-as-root" not in mpi.choose(env={}, which=which_of("mpirun"), euid=1000).argv(p, ["a"])


def test_command_lines_of_the_launchers():
    p = RankPlacement(4, 2, (("h1", (0, 1, 2, 3)), ("h2", (4, 5, 6, 7))))
    srun = mpi.Srun("/usr/bin/srun").argv(p, ["prog", "x"])
    assert srun[0] == "/usr/bin/srun" and srun[-2:] == ["prog", "x"]
    for flag in ("--ntasks=4", "--cpus-per-task=2", "--nodes=2", "--nodelist=h1,h2", "--overlap",
                 "--kill-on-bad-exit=1", "--mpi=pmix"):
        assert flag in srun
    # the user's SLURM_MPI_TYPE (srun's own variable) stands: no --mpi flag then
    mine = mpi.choose(env={"SLURM_JOB_ID": "1", "SLURM_MPI_TYPE": "pmi2"}, which=which_of("srun"))
    assert not [a for a in mine.argv(p, ["prog"]) if a.startswith("--mpi")]
    run_ = mpi.Mpirun("/usr/bin/mpirun").argv(p, ["prog", "x"])
    i = run_.index("--host")
    assert run_[i + 1] == "h1:2,h2:2" and run_[run_.index("-np") + 1] == "4"
    assert run_[-2:] == ["prog", "x"] and "none" == run_[run_.index("--bind-to") + 1]
    assert mpi.NoLauncher().argv(p, ["prog"]) == ["prog"]


@given(ranks=st.integers(1, 8), cpr=st.integers(1, 4), spare=st.integers(0, 5), split=st.integers(0, 8))
def test_rank_cpus_never_share_a_core_and_cover_every_rank(ranks, cpr, spare, split):
    cpus = list(range(ranks * cpr + spare))
    cut = min(split, ranks) * cpr
    hosts = tuple((h, tuple(c)) for h, c in (("a", cpus[:cut]), ("b", cpus[cut:])) if c)
    p = RankPlacement(ranks, cpr, hosts)
    per_rank = p.rank_cpus()
    assert len(per_rank) == ranks and all(len(c) == cpr for c in per_rank)
    flat = [c for r in per_rank for c in r]
    assert len(flat) == len(set(flat))
    assert sum(n for _, n in p.ranks_per_host()) == ranks
    env = p.env("/sb")
    assert env["SHOAL_RANK_CPUS"].count(";") == ranks - 1 and env["SHOAL_RANK_DIR"] == "/sb"


def test_a_placement_too_small_for_its_ranks_is_an_error():
    with pytest.raises(ValueError, match="3 ranks of 2 cores do not fit"):
        RankPlacement(3, 2, (("h", (0, 1, 2, 3, 4)),)).rank_cpus()


def test_rank_tails_label_every_rank_and_put_the_ranks_last(tmp_path):
    (tmp_path / "stderr.rank0").write_text("fine\n")
    (tmp_path / "stderr.rank1").write_text("boom\nTraceback\n")
    text = launcher.rank_tails(str(tmp_path), 3, "mpirun: a rank failed\n")
    assert text.splitlines() == ["[launcher] mpirun: a rank failed", "[rank 0] fine",
                                 "[rank 1] boom", "[rank 1] Traceback", "[rank 2] (no stderr)"]


# -- the model ----------------------------------------------------------------------------

def test_an_mpi_task_reserves_ranks_times_cores_per_rank():
    t = Task(executable="prog", ranks=4, cores_per_rank=2)
    t.validate()
    assert t.mpi and t.reserved_cores == 8
    assert not Task(executable="prog", cores=3).mpi and Task(executable="prog", cores=3).reserved_cores == 3


@pytest.mark.parametrize("kw, match", [
    ({"ranks": 0}, "ranks must be an integer >= 1"),
    ({"ranks": True}, "ranks must be an integer >= 1"),
    ({"ranks": 2, "cores_per_rank": 0}, "cores_per_rank must be an integer >= 1"),
    ({"cores_per_rank": 2}, "ranks must be an integer >= 1, got None"),
    ({"ranks": 2, "cores": 4}, "give cores_per_rank= instead of cores=4"),
])
def test_bad_mpi_fields_name_the_task_and_field(kw, match):
    with pytest.raises(EnsembleError, match=match):
        Task(executable="prog", name="sim", **kw).validate()


def test_function_tasks_may_not_ask_for_ranks():
    with pytest.raises(EnsembleError, match="ranks= applies to executables"):
        Task(function=print, ranks=2).validate()


def test_entk_mpi_cpu_reqs_map_to_ranks_and_back():
    t = Task(executable="prog")
    t.cpu_reqs = {"cpu_processes": 4, "cpu_process_type": "MPI", "cpu_threads": 2,
                  "cpu_thread_type": "OpenMP"}
    assert (t.ranks, t.cores_per_rank, t.cores) == (4, 2, 1)
    assert t.cpu_reqs["cpu_process_type"] == "MPI" and t.cpu_reqs["cpu_processes"] == 4
    t.cpu_reqs = {"cpu_processes": 2, "cpu_threads": 3}  # a later non-MPI assignment replaces it
    assert (t.ranks, t.cores) == (None, 6)
    t.cpu_reqs = {"processes": 2, "process_type": "mpi", "threads_per_process": 1}  # the older keys
    assert t.ranks == 2
    with pytest.raises(EnsembleError, match="cpu_thread_type='MPI'"):
        t.cpu_reqs = {"cpu_processes": 2, "cpu_thread_type": "MPI"}


def test_an_mpi_task_without_a_launcher_is_refused_before_anything_runs(tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    monkeypatch.setenv("PATH", str(tmp_path))  # no mpirun, no srun
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    first = Task(executable="/bin/sh", arguments=["-c", f"touch {marker}"], name="first")
    wide = Task(executable=sys.executable, ranks=1, name="mpi")
    with pytest.raises(EnsembleError, match=r"task p0\.s0\.mpi is an MPI task .*no MPI launcher.*install-mpi"):
        run([Pipeline([Stage([first, wide])])], journal=str(tmp_path / "j.db"))
    assert not marker.exists()


def test_an_mpi_task_wider_than_the_node_is_refused_naming_it_and_the_node(tmp_path):
    t = Task(executable=sys.executable, ranks=3, cores_per_rank=2, name="wide")
    with pytest.raises(EnsembleError, match=r"task p0\.s0\.wide asks for 6 cores but the pilot has 2 "
                                            r"\(3 ranks x 2 cores per rank; the largest node has 2"):
        run([Pipeline([Stage([t])])], journal=str(tmp_path / "j.db"), cores=2, launcher="none")


def test_launcher_none_starts_the_program_once_with_every_core(tmp_path):
    out = tmp_path / "out"
    t = Task(executable="/bin/sh", ranks=2, name="once",
             arguments=["-c", f"echo $OMP_NUM_THREADS $(nproc) >> {out}"])
    report = run([Pipeline([Stage([t])])], journal=str(tmp_path / "j.db"), cores=[0, 1]
                 if len(os.sched_getaffinity(0)) >= 2 else 1, launcher="none")
    assert report.ok
    assert len(out.read_text().splitlines()) == 1  # started once, not per rank
    assert out.read_text().split()[0] == "1"  # OMP_NUM_THREADS = cores per rank
