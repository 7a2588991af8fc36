"""Topology detection, sysfs parsing, synthetic specs and worker placement."""

import os
from pathlib import Path

import pytest

from shoal._errors import ShoalError, TopologyError
from shoal.runtime import topology as topo_mod
from shoal.runtime.topology import (
    ENV_VAR,
    NumaNode,
    TopologySource,
    format_cpulist,
    parse_cpulist,
    topology,
)

BAD_SPECS = ["2x", "0x1", "abc", "2x-1", "1000000x1", "x2", "2x0", "2*2", "-1x2"]


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)


def test_real_machine_sanity():
    t = topology(refresh=True)
    assert not t.synthetic
    assert t.usable_cpus and len(t.usable_cpus) <= t.logical_cpus
    possible = Path("/sys/devices/system/cpu/possible")
    if possible.exists():  # usable CPU ids are a subset of the machine's logical CPUs
        assert set(t.usable_cpus) <= set(parse_cpulist(possible.read_text()))
    assert 1 <= t.physical_cores <= t.logical_cpus
    assert set(t.usable_cpus) == set(os.sched_getaffinity(0))
    covered = [cpu for node in t.nodes for cpu in node.cpus]
    assert sorted(covered) == list(t.usable_cpus)  # disjoint and complete
    assert t.source in (TopologySource.SYSFS, TopologySource.SINGLE_NODE)
    for cpu in t.usable_cpus:
        assert t.real_cpu(cpu) == cpu
        assert t.node_of(cpu) in {node.id for node in t.nodes}


def test_cached_unless_refresh():
    assert topology() is topology()
    assert topology(refresh=True) == topology()


@pytest.mark.parametrize(
    "text, expected",
    [
        ("0-3,8-11", (0, 1, 2, 3, 8, 9, 10, 11)),
        ("0", (0,)),
        ("", ()),
        ("\n", ()),
        ("5,1-2\n", (1, 2, 5)),
        ("0-0", (0,)),
    ],
)
def test_parse_cpulist(text, expected):
    assert parse_cpulist(text) == expected
    assert parse_cpulist(format_cpulist(expected)) == expected


@pytest.mark.parametrize("text", ["a", "3-1", "1-", "-1", "1-2-3"])
def test_parse_cpulist_malformed(text):
    with pytest.raises(ValueError):
        parse_cpulist(text)


def test_format_cpulist():
    assert format_cpulist([5, 0, 1, 2]) == "0-2,5"
    assert format_cpulist([]) == ""


def _fake_sysfs(tmp_path, nodes):
    for node_id, cpulist in nodes.items():
        (tmp_path / f"node{node_id}").mkdir()
        (tmp_path / f"node{node_id}" / "cpulist").write_text(cpulist + "\n")
    (tmp_path / "possible").write_text("0-1\n")  # not a node dir: ignored
    return tmp_path


def test_sysfs_intersects_usable(tmp_path, monkeypatch):
    root = _fake_sysfs(tmp_path, {0: "0-3", 1: "4-7", 2: "8-9"})
    monkeypatch.setattr(topo_mod, "_usable_cpus", lambda: (1, 2, 5))
    t = topo_mod._detect(root)
    assert t.nodes == (NumaNode(0, (1, 2)), NumaNode(1, (5,)))  # node 2 has no usable CPU
    assert t.source is TopologySource.SYSFS
    assert t.node_of(5) == 1
    with pytest.raises(ValueError):
        t.node_of(3)


@pytest.mark.parametrize("nodes", [{}, {0: "0"}, {0: "zz"}])
def test_sysfs_fallback_single_node(tmp_path, monkeypatch, nodes):
    root = _fake_sysfs(tmp_path, nodes)
    monkeypatch.setattr(topo_mod, "_usable_cpus", lambda: (0, 1))
    t = topo_mod._detect(root)  # missing, incomplete or malformed -> one node
    assert t.nodes == (NumaNode(0, (0, 1)),)
    assert t.source is TopologySource.SINGLE_NODE


@pytest.mark.parametrize("spec, n_nodes, per_node", [("2x1", 2, 1), ("2x2", 2, 2), ("1x4", 1, 4)])
def test_synthetic(spec, n_nodes, per_node):
    t = topology(spec=spec)
    total = n_nodes * per_node
    assert t.synthetic and t.source is TopologySource.SYNTHETIC
    assert t.logical_cpus == total and t.usable_cpus == tuple(range(total))
    assert len(t.nodes) == n_nodes
    for cpu in range(total):
        assert t.node_of(cpu) == cpu // per_node  # node-major
    real = sorted(os.sched_getaffinity(0))
    assert [t.real_cpu(c) for c in range(total)] == [real[c % len(real)] for c in range(total)]
    d = t.to_dict()
    assert d["synthetic"] is True and d["source"] == "synthetic"
    assert d["nodes"][0] == {"id": 0, "cpus": list(range(per_node))}


def test_synthetic_from_env_and_spec_overrides(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "2x2")
    assert topology().logical_cpus == 4
    assert topology(spec="1x3").logical_cpus == 3
    monkeypatch.setenv(ENV_VAR, "")
    assert not topology().synthetic


@pytest.mark.parametrize("bad", BAD_SPECS)
def test_bad_spec(bad, monkeypatch):
    with pytest.raises(TopologyError) as info:
        topology(spec=bad)
    message = str(info.value)
    assert ENV_VAR in message and repr(bad) in message and '"NxC"' in message
    assert isinstance(info.value, ValueError) and isinstance(info.value, ShoalError)
    monkeypatch.setenv(ENV_VAR, bad)
    with pytest.raises(TopologyError, match=ENV_VAR):
        topology(refresh=True)


def test_worker_slots_grouping_and_wraparound():
    t = topology(spec="2x2")
    assert t.worker_slots(3) == [(0, 0), (1, 0), (2, 1)]
    assert t.worker_slots(6) == [(0, 0), (1, 0), (2, 1), (3, 1), (0, 0), (1, 0)]
    assert topology(spec="1x1").worker_slots(2) == [(0, 0), (0, 0)]
    for n in (0, -1):
        with pytest.raises(ValueError):
            t.worker_slots(n)


def test_worker_slots_real():
    t = topology(refresh=True)
    slots = t.worker_slots(len(t.usable_cpus))
    assert sorted(cpu for cpu, _ in slots) == list(t.usable_cpus)
    assert all(t.node_of(cpu) == node for cpu, node in slots)
