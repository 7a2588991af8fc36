"""Breaking the ensemble skeleton the way users and attackers use it.

Real processes throughout: `shoal run` / `shoal status` as subprocesses, real SQLite journals,
real victims for the journal's trust boundary.  Each test failed before its fix (or is a strict
xfail naming the open finding in another owner's file, so it flips when that is fixed).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time

import psutil
import pytest

from shoal.ensemble import Pipeline, Stage, Task

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def shoal_cli(*args, cwd, timeout=120):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "shoal", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=cwd)


def write_wf(tmp_path, body: str, name: str = "wf.py"):
    path = tmp_path / name
    path.write_text("from shoal.ensemble import Pipeline, Stage, Task\n" + body)
    return path


# -- the journal is a trust boundary -------------------------------------------------------
def test_a_crafted_journal_cannot_make_resume_kill_a_stranger(tmp_path):
    wf = write_wf(tmp_path, "workflow = [Pipeline([Stage([Task(executable='/bin/true')])])]\n")
    victim = subprocess.Popen(["sleep", "300"], start_new_session=True)  # not started by shoal
    try:
        assert shoal_cli("run", wf, cwd=tmp_path).returncode == 0
        db = sqlite3.connect(tmp_path / "run.db")
        db.execute("UPDATE tasks SET state='running', pid=?, pid_start=?",
                   (victim.pid, psutil.Process(victim.pid).create_time()))
        db.commit()
        db.close()
        r = shoal_cli("run", wf, "--resume", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        time.sleep(0.2)
        assert victim.poll() is None, "the resume SIGKILLed a process shoal never started"
    finally:
        victim.kill()
        victim.wait()


# -- the command line: every bad option is one line and exit status 2 -------------------------
@pytest.mark.parametrize("args, words", [
    (("run", "wf.py", "--workers", "0"), "--workers: expected a whole number >= 1"),
    (("run", "wf.py", "--workers", "-3"), "--workers: expected a whole number >= 1"),
    (("run", "wf.py", "--gpus", "-1"), "--gpus: expected a whole number >= 0"),
    (("status", "run.db", "--watch", "-1"), "--watch: expected a number of seconds"),
    (("status", "run.db", "--watch", "nan"), "--watch: expected a number of seconds"),
    (("status", "run.db", "--watch", "0"), "--watch: expected a number of seconds"),
])
def test_bad_numbers_on_the_command_line_are_usage_errors(tmp_path, args, words):
    """Before: --workers 0/-3 a raw ValueError traceback from the scheduler (exit 1); --gpus -1
    'asks for 0 GPUs but the pilot has -1'; --watch -1/nan a ValueError traceback from
    time.sleep once the run was live, --watch 0 redrew ~8,000 times a second."""
    write_wf(tmp_path, "workflow = [Pipeline([Stage([Task(executable='/bin/true')])])]\n")
    r = shoal_cli(*args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert words in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_run_refuses_a_workers_or_gpus_count_that_is_not_one(tmp_path):
    from shoal.ensemble import EnsembleError, Pipeline, Stage, Task, run

    wf = [Pipeline([Stage([Task(executable="/bin/true")])])]
    for kw, words in ((dict(workers=0), "workers must be an integer >= 1"),
                      (dict(workers=True), "workers must be an integer >= 1"),
                      (dict(gpus=-1), "gpus must be an integer >= 0")):
        with pytest.raises(EnsembleError, match=words):
            run(wf, journal=str(tmp_path / "run.db"), **kw)


# -- YAML workflows --------------------------------------------------------------------------
def test_yaml_merge_keys_give_shared_task_settings(tmp_path):
    """``<<: *defaults`` (YAML's merge key, the usual way to share settings) was a raw
    yaml ConstructorError traceback, exit 1.  Explicit keys override merged ones."""
    (tmp_path / "wf.yaml").write_text(
        "pipelines:\n"
        "  - name: p\n"
        "    stages:\n"
        "      - name: s\n"
        "        tasks:\n"
        "          - &sim\n"
        "            name: a\n"
        "            executable: /bin/sh\n"
        "            arguments: ['-c', 'echo $X $OMP_NUM_THREADS']\n"
        "            environment: {X: from-a}\n"
        "            cores: 1\n"
        "          - <<: *sim\n"
        "            name: b\n"
        "            environment: {X: from-b}\n")
    r = shoal_cli("run", "wf.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "run.sandbox/p/s/a/stdout").read_text().split() == ["from-a", "1"]
    assert (tmp_path / "run.sandbox/p/s/b/stdout").read_text().split() == ["from-b", "1"]


@pytest.mark.parametrize("value, line, words", [
    ("[!!python/name:os.system x]", 6, "cannot read"),
    ("!custom /bin/echo", 6, "cannot read '!custom'"),
])
def test_yaml_tags_it_cannot_read_are_file_line_errors(tmp_path, value, line, words):
    key = "arguments" if value.startswith("[") else "executable"
    extra = "" if key == "executable" else "            executable: /bin/echo\n"
    (tmp_path / "wf.yaml").write_text(
        "pipelines:\n  - stages:\n      - tasks:\n          - name: t\n" + extra
        + ("" if extra else "\n") + f"            {key}: {value}\n")
    r = shoal_cli("run", "wf.yaml", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"wf.yaml:{line}:" in r.stderr and words in r.stderr, r.stderr


@pytest.mark.parametrize("gen", ["replicas: 100000000000000000000000",
                                 "replicas: 100\n            sweep: {" + ", ".join(
                                     f"{c}: [0,1,2,3,4,5,6,7,8,9]" for c in "abcdefg") + "}"])
def test_a_generator_bigger_than_memory_is_refused_before_it_is_built(tmp_path, gen):
    """Before: ``replicas: 10**23`` -> raw OverflowError; a sweep of 10**9 combinations grew the
    driver until the machine ran out of memory (~1.2 KB per copy, built before anything runs)."""
    (tmp_path / "wf.yaml").write_text(
        "pipelines:\n  - stages:\n      - tasks:\n          - executable: /bin/true\n"
        "            name: 'r{i}'\n" + f"            {gen}\n")
    r = shoal_cli("run", "wf.yaml", cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "wf.yaml:4:" in r.stderr and "GiB of driver memory" in r.stderr, r.stderr


# -- resume after a SIGKILL, in a new process ---------------------------------------------------
def test_a_killed_run_with_a_set_argument_resumes_in_a_new_process(tmp_path):
    """A function task given a set of names: its spec's fingerprint followed the set's
    iteration order, i.e. the process's str hash seed, so after a SIGKILL the resume (a new
    process) refused the run as another workflow ('args [...] -> [...]'), every time."""
    wf = write_wf(tmp_path, (
        "workflow = [Pipeline([\n"
        "    Stage([Task(function=sorted, args=({'alpha', 'beta', 'gamma', 'delta', 'eps'},), name='f')]),\n"
        "    Stage([Task(executable='/bin/sh', name='wait', arguments=['-c', "
        "'touch ../../../../started; while [ ! -e ../../../../go ]; do sleep 0.02; done'])]),\n"
        "], name='p')]\n"))
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONHASHSEED="1")
    first = subprocess.Popen([sys.executable, "-m", "shoal", "run", str(wf)], cwd=tmp_path, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists():
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()
            time.sleep(0.02)
        first.kill()  # SIGKILL the driver; its task is killed by the resume
        first.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        first.stderr.close()
    (tmp_path / "go").touch()
    env["PYTHONHASHSEED"] = "2"  # what a new process gets anyway (random): made certain here
    r = subprocess.run([sys.executable, "-m", "shoal", "run", str(wf), "--resume"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "2 done" in r.stdout, r.stdout


ENTK_SET_SCRIPT = '''
import sys
from shoal.entk import AppManager, Pipeline, Stage, Task

pipes = set()
for i in range(8):                       # unnamed pipelines in a set, as EnTK scripts write them
    p = Pipeline()
    s = Stage()
    tasks = set()
    for j in range(2):
        t = Task()
        t.executable = '/bin/sh'
        t.arguments = ['-c', 'touch ../../../../started; while [ ! -e ../../../../go ]; do sleep 0.02; done; '
                             'echo %d %d' % (i, j)]
        tasks.add(t)
    s.add_tasks(tasks)
    p.add_stages(s)
    pipes.add(p)
appman = AppManager(resource_desc={'resource': 'local.localhost', 'cpus': 2}, resume=len(sys.argv) > 1)
appman.workflow = pipes
appman.run()
print('done', appman.report.done)
'''


def test_an_entk_set_of_unnamed_pipelines_resumes_after_sigkill(tmp_path):
    """``appman.workflow = set([...])`` / ``s.add_tasks(set([...]))``: a set of these objects
    iterates in address order, another one in every process, so the unnamed pipelines and tasks
    got other p<i>/t<k> after a crash and AppManager(resume=True) refused the run as another
    workflow (or, with look-alike pipelines, would have mixed them up)."""
    script = tmp_path / "entk_sets.py"
    script.write_text(ENTK_SET_SCRIPT)
    env = dict(os.environ, PYTHONPATH=ROOT)
    first = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists():
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()
            time.sleep(0.02)
        first.kill()
        first.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        first.stderr.close()
    (tmp_path / "go").touch()
    r = subprocess.run([sys.executable, str(script), "resume"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "done 16" in r.stdout
    for i in range(8):  # p<i> is the i-th pipeline the script created, t<j> its j-th task
        for j in range(2):
            assert (tmp_path / f"entk.sandbox/p{i}/s0/t{j}/stdout").read_text().split() == [str(i), str(j)]


ENTK_NAMES_SCRIPT = '''
import sys
from shoal.entk import AppManager, Pipeline, Stage, Task

pipes = set()
for i in range(3):                       # EnTK's names: dots, spaces, duplicates; a shared sandbox
    p = Pipeline()
    p.name = 'pipe.%03d' % i
    s1 = Stage()
    s1.name = 'Stage 1'
    firsts = []
    for j in range(2):
        t = Task()
        t.name = 'my.task'
        t.executable = 'sh'
        t.arguments = ['-c', 'touch ../started; while [ ! -e ../go ]; do sleep 0.02; done; echo %d %d' % (i, j)]
        t.stdout = 'out.%d.txt' % j
        t.sandbox = p.name
        s1.add_tasks(t)
        firsts.append(t)
    p.add_stages(s1)
    s2 = Stage()
    t = Task()
    t.name = 'sum'
    t.executable = 'cat'
    t.arguments = ['in.0', 'in.1', '>', 'both.txt']
    t.copy_input_data = ['$Pipeline_%s_Stage_%s_Task_%s/out.%d.txt > in.%d' % (p.uid, s1.uid, f.uid, j, j)
                         for j, f in enumerate(firsts)]
    s2.add_tasks(t)
    p.add_stages(s2)
    pipes.add(p)
appman = AppManager(resource_desc={'resource': 'local.localhost', 'cpus': 2}, resume=len(sys.argv) > 1)
appman.workflow = pipes
appman.run()
print('done', appman.report.done)
'''


def test_an_entk_run_with_dotted_duplicate_names_resumes_after_sigkill(tmp_path):
    """Names with '.' and spaces, two tasks of one name, a sandbox the pipeline's tasks share and
    references built from uids: SIGKILL mid-stage, and AppManager(resume=True) finishes the run
    (the names' journal keys and the '#<position>' of the duplicate are the same in the second
    process; the uids the references name are resolved to those keys)."""
    script = tmp_path / "entk_names.py"
    script.write_text(ENTK_NAMES_SCRIPT)
    env = dict(os.environ, PYTHONPATH=ROOT)
    first = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "entk.sandbox/started").exists():
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()
            time.sleep(0.02)
        first.kill()
        first.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        first.stderr.close()
    (tmp_path / "entk.sandbox/go").touch()
    r = subprocess.run([sys.executable, str(script), "resume"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "done 9" in r.stdout
    for i in range(3):
        box = tmp_path / "entk.sandbox" / ("pipe.%03d" % i)
        assert box.joinpath("out.1.txt").read_text() == f"{i} 1\n"
        assert (tmp_path / f"entk.sandbox/pipe~2E{i:03d}/s1/sum/both.txt").read_text() == f"{i} 0\n{i} 1\n"


# -- what reaches the user's terminal ----------------------------------------------------------
ESCAPES = r"ok\033]0;PWNED\007\033[2J\033]52;c;ZWNobyBoaQ==\007\233"


def test_escape_sequences_in_stderr_or_a_crafted_journal_do_not_reach_the_terminal(tmp_path):
    """A failed task's stderr tail (and a crafted journal's text: a trust boundary) was printed
    raw by ``shoal run``'s report and ``shoal status``: escape sequences set the terminal's
    title, cleared the screen, wrote the clipboard (OSC 52).  Now shown as ``\\x1b``."""
    wf = write_wf(tmp_path, "workflow = [Pipeline([Stage([Task(executable='/bin/sh', name='evil', arguments="
                            f"['-c', r\"printf '{ESCAPES}' >&2; exit 3\"])])], name='p')]\n")
    r = shoal_cli("run", wf, cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert "\\x1b]0;PWNED" in r.stdout
    db = sqlite3.connect(tmp_path / "run.db")  # a crafted journal: escapes where shoal wrote plain text
    db.execute("UPDATE meta SET value=? WHERE key='driver'",
               ('{"pid": 1, "host": "h\\u001b]0;HOST\\u0007", "start": 0, "since": 0}',))
    db.execute("UPDATE tasks SET reason=?", ("r\x1b[2J",))
    db.commit()
    db.close()
    s = shoal_cli("status", "run.db", cwd=tmp_path)
    assert s.returncode == 0, s.stderr
    for out in (r.stdout, s.stdout):
        assert not any(c in out for c in "\x1b\x07\x9b"), out
    assert "\\x1b[2J" in s.stdout and "PWNED" in s.stdout


def test_an_entk_reference_built_from_uids_resolves(tmp_path, monkeypatch):
    """EnTK gives objects a uid at creation, so scripts write
    '$Pipeline_%s_Stage_%s_Task_%s' % (p.uid, s.uid, t.uid); those uids were None until the run
    (the task waited for 'None.None.None', then a clear refusal).  Now they exist and resolve."""
    from shoal.entk import AppManager, Pipeline, Stage, Task

    monkeypatch.chdir(tmp_path)
    p, s, t = Pipeline(), Stage(), Task()
    assert (p.uid, s.uid, t.uid) != (None, None, None)
    t.executable, t.arguments = "/bin/sh", ["-c", "echo made > out.txt"]
    s.add_tasks(t)
    p.add_stages(s)
    t2 = Task()
    t2.executable, t2.arguments = "cat", ["out.txt"]
    t2.copy_input_data = ["$Pipeline_%s_Stage_%s_Task_%s/out.txt" % (p.uid, s.uid, t.uid)]
    s2 = Stage()
    s2.add_tasks(t2)
    p.add_stages(s2)
    appman = AppManager(resource_desc={"resource": "local.localhost", "walltime": 1, "cpus": 1})
    appman.workflow = [p]
    appman.run()
    assert (tmp_path / "entk.sandbox/p0/s1/t0/stdout").read_text() == "made\n"


# -- staging -------------------------------------------------------------------------------------
def test_a_moved_input_survives_a_retry(tmp_path):
    from shoal.ensemble import Input, Staging, run

    src = tmp_path / "input.txt"
    src.write_text("precious\n")
    t = Task(executable="/bin/sh", name="t", retries=1, inputs=[Input(str(src), "in.txt", Staging.MOVE)],
             arguments=["-c", "if [ -e ../../../../once ]; then cat in.txt; else touch ../../../../once; exit 1; fi"])
    report = run(Pipeline([Stage([t])], name="p"), journal=str(tmp_path / "run.db"))
    kept = [p for p in (src, tmp_path / "run.sandbox/p/s0/t/in.txt") if p.exists()]
    assert kept, "the input file is gone: moved into the sandbox by attempt 1, deleted by attempt 2"
    assert report.ok, report.failures
    assert (tmp_path / "run.sandbox/p/s0/t/stdout").read_text() == "precious\n"


# -- adaptivity ------------------------------------------------------------------------------
def test_a_stage_added_to_a_finished_pipeline_is_not_dropped_silently(tmp_path):
    from shoal.ensemble import EnsembleError, run

    fast = Pipeline([Stage([Task(executable="/bin/true")])], name="fast")
    gate = tmp_path / "fast-done"

    def grow():  # EnTK style: no argument, reaches the other pipeline through the closure
        fast.add_stages(Stage([Task(executable="/bin/sh", arguments=["-c", f"touch {tmp_path}/late"])],
                              name="late"))

    slow = Pipeline([Stage([Task(executable="/bin/sh", arguments=[
        "-c", f"while [ ! -e {gate} ]; do sleep 0.02; done"])], post_exec=grow)], name="slow")
    fast.stages[0].post_exec = lambda: gate.touch()  # slow's stage ends only after fast has ended
    try:
        report = run([fast, slow], journal=str(tmp_path / "run.db"))
    except EnsembleError as exc:  # refusing it, naming the stage, is as good as running it
        assert "late" in str(exc) and "fast" in str(exc)
        return
    assert (tmp_path / "late").exists(), f"stage fast.late never ran and nothing said so: {report}"


def test_a_timeout_of_a_month_or_more_runs_the_program_on_a_dask_node(tmp_path):
    """``timeout=1e9`` ("never") made the node's wait call poll() with more milliseconds than a C
    int holds: OverflowError on the node, the program killed right after its start.  The
    node-side function is called directly (the same call a dask worker makes)."""
    from shoal.patterns.ensemble.remote import Ended, ExecSpec, run_executable

    for timeout in (3e6, 1e9):
        spec = ExecSpec(uid="p.s.t", executable="/bin/sh", arguments=("-c", "sleep 0.1; echo ok"),
                        sandbox=str(tmp_path / f"sb{int(timeout)}"), cwd=str(tmp_path), timeout=timeout)
        out = run_executable(spec)
        assert (out.ended, out.exit_code) == (Ended.EXITED, 0), out
        assert (tmp_path / f"sb{int(timeout)}" / "stdout").read_text() == "ok\n"


def test_walltime_nan_is_refused_and_slurm_day_format_is_read(tmp_path):
    """walltime=float('nan') was accepted and never enforced (a NaN deadline compares False);
    docs/hpc.md promises 'D-HH:MM:SS' everywhere, which run() refused."""
    from shoal.ensemble import EnsembleError, parse_walltime, run

    with pytest.raises(EnsembleError, match="walltime must be > 0"):
        run(Pipeline([Stage([Task(executable="/bin/true")])]), journal=str(tmp_path / "r.db"),
            walltime=float("nan"))
    assert parse_walltime("1-00:00:00") == 86400
    assert parse_walltime("2-12") == 2.5 * 86400
    assert parse_walltime("1:30") == 90  # MM:SS, as Slurm reads it
    for bad in ("-1:00:00", "1-", "a-1:00", "1-2:3:4:5"):
        with pytest.raises(EnsembleError, match="D-HH:MM:SS"):
            parse_walltime(bad)


def test_a_yaml_file_that_is_not_utf8_is_a_file_line_error(tmp_path):
    """A Latin-1 or binary file passed as workflow.yaml: raw UnicodeDecodeError traceback, exit 1."""
    (tmp_path / "wf.yaml").write_bytes(b"pipelines:\n  - name: caf\xe9\n")
    r = shoal_cli("run", "wf.yaml", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "wf.yaml:2: not a UTF-8 text file (byte 0xe9" in r.stderr, r.stderr


def test_a_sigint_the_caller_ignores_stays_ignored(tmp_path):
    write_wf(tmp_path, "workflow = [Pipeline([Stage([Task(executable='/bin/sh', arguments=['-c', "
                       "'touch ../../../../started; sleep 1'])])])]\n")
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen(["bash", "-c", f"trap '' INT; exec {sys.executable} -m shoal run wf.py"], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "started").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(2)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err


CRAFTED = [
    "UPDATE meta SET value='[]' WHERE key='driver'",
    "UPDATE meta SET value='x' WHERE key='sessions'",
    "UPDATE meta SET value='[1]' WHERE key='plan'",
    "UPDATE tasks SET state='bogus'",
    "UPDATE meta SET value='{\"pid\": \"x\", \"since\": \"abc\"}' WHERE key='driver'",
]


def _crafted_journal(tmp_path, sql: str):
    write_wf(tmp_path, "workflow = [Pipeline([Stage([Task(executable='/bin/true')])])]\n")
    assert shoal_cli("run", "wf.py", cwd=tmp_path).returncode == 0
    db = sqlite3.connect(tmp_path / "run.db")
    db.execute(sql)
    db.commit()
    db.close()


@pytest.mark.parametrize("sql", CRAFTED)
def test_status_of_a_journal_with_values_shoal_never_writes_is_one_line(tmp_path, sql):
    """Before: AttributeError / ValueError / TypeError tracebacks, exit 1 (docs: journal problems are
    one 'shoal: error: journal ...' line and exit 2)."""
    _crafted_journal(tmp_path, sql)
    r = shoal_cli("status", "run.db", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "journal run.db is damaged or was not written by shoal" in r.stderr


@pytest.mark.parametrize("sql", [CRAFTED[1], CRAFTED[3]])
def test_resume_of_a_journal_with_values_shoal_never_writes_is_one_line(tmp_path, sql):
    _crafted_journal(tmp_path, sql)
    r = shoal_cli("run", "wf.py", "--resume", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("case", ["pipeline", "task"])
def test_an_explicit_name_equal_to_a_default_name_loses_no_work(tmp_path, case):
    from shoal.ensemble import EnsembleError, run

    if case == "pipeline":
        wf = [Pipeline([Stage([Task(executable="/bin/true")])], name="p1"),
              Pipeline([Stage([Task(executable="/bin/true")])])]  # its default name is p1
    else:
        wf = [Pipeline([Stage([Task(executable="/bin/true", name="t1"), Task(executable="/bin/true")])])]
    try:
        report = run(wf, journal=str(tmp_path / "run.db"))
    except EnsembleError as exc:  # refusing the clash, naming it, is as good as running both
        assert "twice" in str(exc) or "used" in str(exc)
        return
    assert report.done == 2, report


def test_entk_task_from_dict(tmp_path):
    """EnTK's documented constructor ``Task(from_dict={...})`` was a TypeError (unexpected keyword)."""
    from shoal.entk import AppManager, EnsembleError

    t = Task(from_dict={"name": "hello", "executable": "/bin/echo", "arguments": ["hi"],
                        "cpu_reqs": {"cpu_processes": 1, "cpu_threads": 2},
                        "uid": "task.0001", "state": "DESCRIBED"})  # to_dict() bookkeeping: dropped
    assert (t.executable, t.arguments, t.cores, t.uid) == ("/bin/echo", ["hi"], 2, None)
    with pytest.raises(EnsembleError, match="did you mean 'executable'"):
        Task(from_dict={"executabel": "/bin/echo"})
    p = Pipeline(name="p")
    p.add_stages(Stage().add_tasks(t))
    am = AppManager(journal=str(tmp_path / "entk.db"))
    am.workflow = [p]
    am.run()
    assert (tmp_path / "entk.sandbox/p/s0/hello/stdout").read_text() == "hi\n"
