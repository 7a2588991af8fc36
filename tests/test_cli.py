"""``shoal info`` through a real subprocess and through ``main``."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shoal.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _shoal(*args, topology=None):
    env = {k: v for k, v in os.environ.items() if k != "SHOAL_TOPOLOGY"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if topology is not None:
        env["SHOAL_TOPOLOGY"] = topology
    return subprocess.run(
        [sys.executable, "-m", "shoal", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_info_human():
    proc = _shoal("info")
    assert proc.returncode == 0, proc.stderr
    assert "logical CPUs" in proc.stdout and "NUMA node" in proc.stdout


def test_info_json():
    proc = _shoal("info", "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert set(info["usable_cpus"]) == set(os.sched_getaffinity(0))
    assert info["logical_cpus"] >= len(info["usable_cpus"]) and info["physical_cores"] >= 1
    assert info["synthetic"] is False and isinstance(info["native_ring"], bool)
    assert info["python_version"] == "%d.%d.%d" % sys.version_info[:3]
    assert info["shoal_version"]
    assert sorted(c for node in info["nodes"] for c in node["cpus"]) == info["usable_cpus"]


def test_info_json_synthetic():
    proc = _shoal("info", "--json", topology="2x2")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["synthetic"] is True
    assert info["nodes"] == [{"id": 0, "cpus": [0, 1]}, {"id": 1, "cpus": [2, 3]}]


@pytest.mark.parametrize("bad", ["2x", "abc"])
def test_bad_topology_env(bad):
    proc = _shoal("info", topology=bad)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert "SHOAL_TOPOLOGY" in lines[0] and repr(bad) in lines[0]


def test_main_in_process(capsys, monkeypatch):
    monkeypatch.setenv("SHOAL_TOPOLOGY", "1x3")
    assert main(["info", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["logical_cpus"] == 3
    assert main([]) == 2  # a command is required
    assert main(["no-such-command"]) == 2
    assert main(["--help"]) == 0


@pytest.mark.parametrize("args", [("info",), ("run", "--help")])
def test_a_reader_that_left_the_pipe_gets_no_traceback(args):
    """``shoal status run.db | head -3`` printed a BrokenPipeError traceback when head left
    before shoal had written everything.  Here the reader is gone before shoal writes at all
    (the read end of a real pipe closed): the exit status is a SIGPIPE death's, stderr empty."""
    read, write = os.pipe()
    os.close(read)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    try:
        proc = subprocess.run([sys.executable, "-m", "shoal", *args], stdout=write, stderr=subprocess.PIPE,
                              text=True, env=env, timeout=60)
    finally:
        os.close(write)
    assert proc.stderr == "", proc.stderr
    assert proc.returncode == (0 if "--help" in args else 141)  # argparse's help ignores the pipe
