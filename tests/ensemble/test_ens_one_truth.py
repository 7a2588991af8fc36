"""One set of numbers per run (issue 35): the table a run prints, ``shoal status``, the
dashboard's journal data and ``RunStatus`` agree after an interrupt, after a failure and
after a resume; the resume command is journaled and exact (YAML, Python and EnTK drivers).

Each test failed before the fix: after a Ctrl-C the run's table said ``pending 2`` (total
102) where ``shoal status`` said 100 of 200, a stopped run's stage read "running", a stage
after a failure vanished from the run's table (2/2 for a 3-task file) while ``shoal status``
showed it "skipped" with total 0, the failure line read ``exit_code: exit code 3 (exit code
3, attempts 1)``, and ``shoal status`` printed ``shoal run <workflow> ...``.

Real ``shoal run`` driver processes, real SIGINT, real SQLite journals.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time

from ens_tasks import ROOT

from shoal.dashboard.journal import journal_state
from shoal.ensemble import EnsembleError, RunStatus, TaskState

COLS = ["done", "running", "pending", "failed", "skipped", "canceled", "total"]

SLEEPY = """\
pipelines:
  - name: ens
    stages:
      - name: sim
        tasks:
          - executable: /bin/sh
            name: "r{i}"
            arguments: ["-c", "sleep 0.4; echo {i} > out.txt"]
            replicas: 10
      - name: ana
        tasks:
          - executable: /bin/cat
            name: "a{i}"
            arguments: ["$ens.sim.r{i}/out.txt"]
            replicas: 3
"""

FAILING = """\
pipelines:
  - name: p
    stages:
      - name: a
        tasks:
          - {executable: /bin/true, name: ok}
          - {executable: /bin/sh, name: bad, arguments: ["-c", "echo oops >&2; exit 3"]}
      - name: b
        tasks:
          - {executable: /bin/true}
"""


def _env():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("SHOAL_RESUME", None)
    return env


def shoal_cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "shoal", *map(str, args)], capture_output=True,
                          text=True, env=_env(), timeout=180, cwd=cwd)


def table_rows(text: str) -> dict[str, dict[str, int]]:
    """The per-stage rows (and 'total') of a stage table: {uid: {column: n}}."""
    lines = text.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["stage", "state"])
    rows = {}
    for ln in lines[head + 1:]:
        parts = ln.split()
        if not parts or not re.fullmatch(r"\d+", parts[-1]):
            break
        rows[parts[0]] = dict(zip(COLS, map(int, parts[-7:]), strict=True))
        if parts[0] == "total":
            break
    return rows


def status_rows(status: RunStatus) -> dict[str, dict[str, int]]:
    rows = {}
    for p in status.pipelines:
        for s in p.stages:
            c = {k: s.counts.get(TaskState(k), 0) for k in COLS[:-1]}
            c["pending"], c["total"] = s.pending, s.total
            rows[s.uid] = c
    rows["total"] = {**{k: status.counts[TaskState(k)] for k in COLS[:-1]}, "total": status.total}
    return rows


def dashboard_rows(path) -> dict[str, dict[str, int]]:
    d = journal_state(str(path))
    assert d["error"] is None, d
    rows = {uid: {k: row[k] for k in COLS[:-1]} for uid, row in d["stages"].items()}
    rows["total"] = {k: d["counts"][k] for k in COLS[:-1]}
    return rows


def assert_one_truth(run_stdout: str, journal, cwd) -> dict[str, dict[str, int]]:
    status = RunStatus.load(str(journal))
    truth = status_rows(status)
    printed = shoal_cli("status", journal, cwd=cwd)
    assert printed.returncode == 0, printed.stderr
    assert table_rows(printed.stdout) == truth, printed.stdout
    assert table_rows(run_stdout) == truth, run_stdout
    no_totals = {uid: {k: v for k, v in row.items() if k != "total"} for uid, row in truth.items()}
    assert dashboard_rows(journal) == no_totals
    rate = journal_state(str(journal))["rate"]  # this session's, as shoal status prints it
    assert rate == (None if status.rate is None else round(status.rate, 3)), (rate, status.rate)
    for row in truth.values():
        assert row["total"] == sum(v for k, v in row.items() if k != "total")
    return truth


def _interrupt_after(driver, journal, done: int) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if RunStatus.load(str(journal)).counts[TaskState.DONE] >= done:
                break
        except EnsembleError:
            pass
        time.sleep(0.05)
    driver.send_signal(signal.SIGINT)


def test_interrupt_then_resume_one_set_of_numbers(tmp_path):
    (tmp_path / "wf.yaml").write_text(SLEEPY)
    journal = tmp_path / "run.db"
    driver = subprocess.Popen([sys.executable, "-m", "shoal", "run", "wf.yaml", "--workers", "2"],
                              cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    _interrupt_after(driver, journal, 2)
    out, err = driver.communicate(timeout=90)
    assert driver.returncode == 130, out + err
    truth = assert_one_truth(out, journal, tmp_path)
    assert truth["total"]["total"] == 13 and truth["ens.ana"]["pending"] == 3
    assert truth["total"]["running"] == 0 and truth["total"]["pending"] > 0
    status = shoal_cli("status", journal, cwd=tmp_path).stdout
    sim = next(ln for ln in status.splitlines() if ln.startswith("ens.sim"))
    assert sim.split()[1] == "stopped", status  # not "running": nothing runs it
    assert "<workflow>" not in status
    resume = "shoal run wf.yaml --journal run.db --resume --workers 2"
    assert f"finish with: {resume}" in status and f"finish with: {resume}" in out
    before = truth["total"]["done"]

    # the journaled command, from another directory: it says where to run it
    elsewhere = shoal_cli("status", journal, cwd="/")
    assert f"finish with: cd {shlex.quote(str(tmp_path))} && {resume}" in elsewhere.stdout
    again = shoal_cli(*shlex.split(resume)[1:], cwd=tmp_path)  # `shoal` is `python -m shoal` here
    assert again.returncode == 0, again.stdout + again.stderr
    truth = assert_one_truth(again.stdout, journal, tmp_path)
    assert truth["total"]["done"] == 13
    # this session's rate and count: only the tasks it ran
    head = again.stdout.splitlines()[0]
    assert f"13 done ({13 - before} in this session)" in head, head
    wall = float(re.search(r", ([\d.]+) s, ", head)[1])
    rate = float(re.search(r"([\d.]+) tasks/s", head)[1])
    assert abs(rate - (13 - before) / wall) < 0.2, head

    # a resume with nothing left to run: no rate anywhere (the dashboard divided all the
    # journal's tasks by their span)
    idle = shoal_cli(*shlex.split(resume)[1:], cwd=tmp_path)
    assert idle.returncode == 0, idle.stdout + idle.stderr
    assert_one_truth(idle.stdout, journal, tmp_path)
    assert "13 done (0 in this session)" in idle.stdout and " 0.0 tasks/s" in idle.stdout.splitlines()[0]
    assert "rate ?" in shoal_cli("status", journal, cwd=tmp_path).stdout
    assert journal_state(str(journal))["rate"] is None


def test_after_a_failure_the_next_stage_is_shown_not_started(tmp_path):
    (tmp_path / "fail.yaml").write_text(FAILING)
    done = shoal_cli("run", "fail.yaml", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    truth = assert_one_truth(done.stdout, tmp_path / "run.db", tmp_path)
    assert truth["p.b"] == {"done": 0, "running": 0, "pending": 0, "failed": 0, "skipped": 1,
                            "canceled": 0, "total": 1}
    assert truth["total"]["total"] == 3
    for text in (done.stdout, shoal_cli("status", "run.db", cwd=tmp_path).stdout):
        assert "not started (pipeline failed at p.a)" in text, text
        failure = [ln for ln in text.splitlines() if ln.startswith("FAILED")]
        assert failure == ["FAILED p.a.bad: exit code 3"], text
        assert "None" not in text
    assert "3/3" in done.stderr  # the progress line's total keeps the stage that did not start
    # resume with --retry-failed: the same numbers again
    again = shoal_cli("run", "fail.yaml", "--resume", "--retry-failed", cwd=tmp_path)
    assert again.returncode == 1
    assert_one_truth(again.stdout, tmp_path / "run.db", tmp_path)


PY_DRIVER = """\
import sys
from shoal.ensemble import Pipeline, Stage, Task, run
wf = Pipeline([Stage([Task(executable="/bin/sleep", arguments=["0.4"], name=f"t{i}") for i in range(8)],
                     name="sim")], name="py")
report = run(wf, journal="py.db", workers=2)
print(report)
sys.exit(0 if report.ok else 3)
"""

ENTK_DRIVER = """\
from shoal.entk import AppManager, Pipeline, Stage, Task
p = Pipeline(); p.name = "entk"
s = Stage(); s.name = "sim"
for i in range(8):
    t = Task(); t.name = f"t{i}"; t.executable = "/bin/sleep"; t.arguments = ["0.4"]
    s.add_tasks(t)
p.add_stages(s)
appman = AppManager(resource_desc={"resource": "local.localhost", "walltime": 10, "cpus": 2},
                    journal="entk.db")
appman.workflow = [p]
appman.run()
"""


def _script_resume(tmp_path, script: str, name: str, journal: str):
    (tmp_path / name).write_text(script)
    driver = subprocess.Popen([sys.executable, name], cwd=tmp_path, env=_env(), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _interrupt_after(driver, tmp_path / journal, 2)
    out, err = driver.communicate(timeout=90)
    assert driver.returncode != 0, out + err
    status = RunStatus.load(str(tmp_path / journal))
    assert not status.finished
    expected = "SHOAL_RESUME=1 " + shlex.join([sys.executable, name])
    assert status.resume_command.endswith(expected), status.resume_command
    printed = shoal_cli("status", journal, cwd=tmp_path).stdout
    assert f"finish with: {expected}" in printed and "<workflow>" not in printed
    again = subprocess.run(["/bin/sh", "-c", expected], cwd=tmp_path, env=_env(), text=True,
                           capture_output=True, timeout=180)
    assert again.returncode == 0, again.stdout + again.stderr
    final = RunStatus.load(str(tmp_path / journal))
    assert final.finished and final.counts[TaskState.DONE] == 8 and final.sessions == 2


def test_a_python_driver_journals_its_exact_resume_command(tmp_path):
    _script_resume(tmp_path, PY_DRIVER, "driver.py", "py.db")


def test_an_entk_driver_journals_its_exact_resume_command(tmp_path):
    _script_resume(tmp_path, ENTK_DRIVER, "entk_driver.py", "entk.db")


def test_run_help_names_yaml_and_python_workflow_files(capsys):
    from shoal.cli import main

    assert main(["run", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "YAML" in text and ".yaml" in text and "Python file (.py)" in text


FAILURE_KINDS = """\
pipelines:
  - name: p
    stages:
      - name: s
        tasks:
          - {{name: exit1, executable: /bin/sh, arguments: ["-c", "echo oops >&2; exit 1"]}}
          - {{name: killed, executable: /bin/sh, arguments: ["-c", "kill -9 $$"]}}
          - {{name: raises, function: "failing:boom", args: ["<b>3</b>"]}}
          - {{name: missing, executable: "{tmp}/no-such-program"}}
          - {{name: slow, executable: /bin/sleep, arguments: ["30"], timeout: 0.5}}
          - {{name: noout, executable: /bin/true, outputs: [made.txt]}}
          - {{name: noin, executable: /bin/true, inputs: ["{tmp}/absent.txt"]}}
"""


def _rate(pattern: str, text: str) -> float:
    found = re.search(pattern, text)
    assert found, text
    return float(found[1].replace(",", ""))  # the progress line writes 1,284


def test_failure_reasons_are_one_line_each_and_the_rate_counts_them(tmp_path):
    """Each failure kind is one line with its reason once: before, a signal read ``killed by
    signal 9 (exit code -9)``, a missing output ``... after exit 0: [...] (exit code 0)``, a
    missing input ``cannot copy input 'X' -> absent.txt: no such file (X)``, and the
    dashboard's line ``exit_code — exit code 1 (exit code 1, attempts 1)``.  The run's report
    said ``0.0 tasks/s`` for a run whose tasks all failed (it counted DONE only) while its
    progress line and ``shoal status`` counted the 7 settled tasks."""
    (tmp_path / "failing.py").write_text("def boom(x):\n    raise ValueError(f'bad value {x}')\n")
    (tmp_path / "kinds.yaml").write_text(FAILURE_KINDS.format(tmp=tmp_path))
    done = shoal_cli("run", "kinds.yaml", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    expected = {
        "FAILED p.s.exit1: exit code 1",
        "FAILED p.s.killed: killed by signal 9",
        "FAILED p.s.raises: ValueError: bad value <b>3</b>",
        f"FAILED p.s.missing: executable '{tmp_path}/no-such-program' does not exist",
        "FAILED p.s.slow: killed after timeout=0.5s (exit code -9)",  # the kill that timed it out
        f"FAILED p.s.noout: declared outputs missing after exit 0: ['{tmp_path}/run.sandbox/p/s/noout/made.txt']",
        f"FAILED p.s.noin: input '{tmp_path}/absent.txt' does not exist",
    }
    status = shoal_cli("status", "run.db", cwd=tmp_path).stdout
    for text in (done.stdout, status):
        assert {ln for ln in text.splitlines() if ln.startswith("FAILED")} == expected, text
        assert "None" not in text
    dashboard = journal_state(str(tmp_path / "run.db"))
    assert {f["line"] for f in dashboard["failures"]} == expected
    head = done.stdout.splitlines()[0]
    report_rate = _rate(r"([\d.]+) tasks/s", head)
    line_rate = _rate(r"\d+/\d+ tasks  ([\d.,]+) tasks/s", done.stderr)
    status_rate = _rate(r"^([\d.]+) tasks/s  ETA", next(ln for ln in status.splitlines() if "tasks/s" in ln))
    assert report_rate > 0, head  # 7 tasks ended in this session, none of them done
    assert abs(report_rate - line_rate) <= 0.1 + 0.02 * line_rate, (head, done.stderr)
    assert abs(status_rate - report_rate) <= 0.3 * report_rate + 0.1, (head, status)
    assert dashboard["rate"] is not None and abs(dashboard["rate"] - status_rate) <= 0.051


def test_a_driver_read_from_standard_input_is_not_told_to_rerun_python_dash(tmp_path):
    """``python - < driver.py`` journaled ``SHOAL_RESUME=1 python -`` as the exact resume
    command, which waits for a script on a terminal; now the journal says how to finish it."""
    driver = subprocess.Popen([sys.executable, "-"], cwd=tmp_path, env=_env(), text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    driver.stdin.write(PY_DRIVER)
    driver.stdin.close()
    _interrupt_after(driver, tmp_path / "py.db", 2)
    out = driver.stdout.read() + driver.stderr.read()
    assert driver.wait(90) != 0, out
    status = RunStatus.load(str(tmp_path / "py.db"))
    assert not status.finished
    assert status.resume_command.startswith("run the code that started it again with resume=True")
    printed = shoal_cli("status", tmp_path / "py.db", cwd="/").stdout  # no `cd ... &&` before it
    assert f"finish with: {status.resume_command}" in printed and "python -" not in printed, printed
