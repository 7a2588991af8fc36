"""Plans and schedules are pure policy: cuts, splits, the reduction tree, and schedules that
always make progress (M < S, M = 1: the hangs of torchtitan#775 and PiPPy#1064)."""

from __future__ import annotations

import itertools

import pytest

from shoal.workloads import dl
from shoal.workloads.dl.plan import micro_batches, partition, reduction_tree, splits
from shoal.workloads.dl.schedules import OpKind, stage_ops, step_graph


def test_partition_minimises_the_largest_stage():
    assert partition([1, 1, 1, 1], 2) == [[0, 1], [2, 3]]
    assert partition([5, 1, 1, 1, 1, 1], 2) == [[0], [1, 2, 3, 4, 5]]
    assert partition([1, 1, 8, 1], 3) == [[0, 1], [2], [3]]
    assert partition([1, 2, 3], 3) == [[0], [1], [2]]
    with pytest.raises(dl.PlanError, match="Plan.stages=4 but the model has only 3 layers"):
        partition([1, 1, 1], 4)


def test_splits_are_array_split():
    import numpy as np

    for n, parts in itertools.product(range(0, 12), range(1, 5)):
        got = [b - a for a, b in splits(3, 3 + n, parts)]
        assert got == [len(p) for p in np.array_split(np.arange(n), parts)]
    assert micro_batches(0, 10, 2, 2) == [[(0, 3), (3, 5)], [(5, 8), (8, 10)]]


def test_reduction_tree_is_fixed_by_replicas():
    assert reduction_tree(1) == ([], [("leaf", 0)])
    assert reduction_tree(2) == ([], [("leaf", 0), ("leaf", 1)])
    nodes, root = reduction_tree(5)
    assert nodes == [(("leaf", 0), ("leaf", 1)), (("leaf", 2), ("leaf", 3)),
                     (("node", 0), ("node", 1))]
    assert root == [("node", 2), ("leaf", 4)]


def test_1f1b_order():
    # stage 0 of 4 stages, 6 micro-batches: 3 warm-up forwards, steady 1F1B, cool-down
    ops = stage_ops(dl.Schedule.ONE_F_ONE_B, 4, 6, 0)
    assert ops == [("F", 0), ("F", 1), ("F", 2), ("F", 3), ("B", 0), ("F", 4), ("B", 1),
                   ("F", 5), ("B", 2), ("B", 3), ("B", 4), ("B", 5)]
    assert stage_ops(dl.Schedule.GPIPE, 2, 2, 1) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]


@pytest.mark.parametrize("schedule", list(dl.Schedule))
def test_every_small_plan_makes_progress(schedule):
    for R, S, M in itertools.product((1, 2, 3), range(1, 6), range(1, 10)):
        nodes = step_graph(R, S, M, schedule)
        for i, node in enumerate(nodes):
            assert all(d < i for d in node.deps), (R, S, M, node)  # a submission order
        kinds = [n.kind for n in nodes]
        fwd = sum(k in (OpKind.FORWARD, OpKind.FORWARD_BACKWARD) for k in kinds)
        bwd = sum(k in (OpKind.BACKWARD, OpKind.FORWARD_BACKWARD) for k in kinds)
        assert fwd == bwd == R * S * M
        assert kinds.count(OpKind.UPDATE) == S
        assert kinds.count(OpKind.REDUCE) == S * len(reduction_tree(R)[0])


@pytest.mark.parametrize("schedule", list(dl.Schedule))
def test_fused_updates_leave_the_forward_backward_graph_as_it_is(schedule):
    # R <= 2: no UPDATE/REDUCE nodes; the F/B nodes and their order are the unfused ones,
    # and each (replica, stage)'s last node is its backward of the last micro-batch (the
    # one that applies the update: program.Program._arrive)
    for R, S, M in itertools.product((1, 2), range(1, 5), range(1, 7)):
        fused = step_graph(R, S, M, schedule, chunks=R, fuse_update=True)
        plain = [n for n in step_graph(R, S, M, schedule, chunks=R) if n.kind is not OpKind.UPDATE]
        assert fused == plain
        last = {(n.replica, n.stage): n for n in fused}
        assert all(n.kind is not OpKind.FORWARD and n.index == M - 1 for n in last.values())
    with pytest.raises(dl.PlanError, match="fuse_update needs at most 2 replicas"):
        step_graph(3, 1, 1, schedule, fuse_update=True)


def test_simulated_pipeline_length():
    # F and B one tick each: a GPipe pipeline of S stages and M micro-batches takes 2(M+S-1)
    # ticks (one less with M = 1: the last stage's F0 B0 become one task)
    for S, M in ((2, 8), (4, 4), (3, 1)):
        nodes = step_graph(1, S, M, dl.Schedule.GPIPE)
        last = max(n.tick for n in nodes if n.kind not in (OpKind.REDUCE, OpKind.UPDATE))
        assert last + 1 == 2 * (M + S - 1) - (M == 1)
    assert dl.ideal_bubble(2, 8) == pytest.approx(1 / 9)


def test_plan_fields_are_checked():
    with pytest.raises(dl.PlanError, match="Plan.replicas must be an int >= 1"):
        dl.Plan(replicas=0)
    with pytest.raises(dl.PlanError, match="Plan.micro_batches"):
        dl.Plan(micro_batches=1.5)
    with pytest.raises(dl.PlanError, match="Plan.schedule='zigzag' is unknown"):
        dl.Plan(schedule="zigzag")
    with pytest.raises(dl.PlanError, match=r"Plan.stages=3 but Plan.shards has 2"):
        dl.Plan(stages=3, shards=[[0], [1]])
    with pytest.raises(dl.PlanError, match=r"Plan.shards\[1\] must be a non-empty"):
        dl.Plan(shards=[[0], []])
    model = dl.Sequential([dl.Linear(4, 4), dl.ReLU(), dl.Linear(4, 2)])
    with pytest.raises(dl.PlanError, match="Plan.stages=4 but the model has only 3 layers"):
        dl.Trainer(model, plan=dl.Plan(stages=4))
    with pytest.raises(dl.PlanError, match=r"Plan.shards\[1\] names layer 3"):
        dl.Trainer(model, plan=dl.Plan(shards=[[0, 1], [2, 3]]))
    with pytest.raises(dl.PlanError, match="once each, in order"):
        dl.Trainer(model, plan=dl.Plan(shards=[[0, 2], [1]]))
    assert dl.Plan(shards=[[0, 1], [2]]).stages == 2


@pytest.mark.parametrize("opt", [dl.SGD(lr=0.1, momentum=0.9, weight_decay=0.01),
                                 dl.Adam(lr=0.01, weight_decay=0.01)], ids=["sgd", "adam"])
def test_updating_slices_changes_no_bit(opt):
    # the update of a stage runs as R tasks on slices of its parameters
    import numpy as np

    rng = np.random.default_rng(0)
    p, g = rng.standard_normal(1001), rng.standard_normal(1001)
    state = [np.abs(rng.standard_normal(1001)) for _ in range(opt.slots)]  # v >= 0 (Adam)
    whole_p, whole_s = np.empty_like(p), [np.empty_like(p) for _ in state]
    opt.update(p, g, state, whole_p, whole_s, 7)
    part_p, part_s = np.empty_like(p), [np.empty_like(p) for _ in state]
    for a, b in splits(0, 1001, 3):
        opt.update(p[a:b], g[a:b], [s[a:b] for s in state], part_p[a:b], [s[a:b] for s in part_s], 7)
    assert np.array_equal(whole_p, part_p)
    assert all(np.array_equal(x, y) for x, y in zip(whole_s, part_s, strict=True))


def _accesses(node, S, k):
    """(buffer, micro-batch, writes?) of a node, from the data flow in docs/dl.md: stage s keeps
    micro-batch m's stored activations, output and output gradient in buffer m % k[s]."""
    r, s, m = node.replica, node.stage, node.index
    act, out, dout = ("act", r, s, m % k[s]), ("out", r, s, m % k[s]), ("dout", r, s, m % k[s])
    below = ("out", r, s - 1, m % k[s - 1]) if s else None
    dbelow = ("dout", r, s - 1, m % k[s - 1]) if s else None
    acc = []
    if node.kind in (OpKind.FORWARD, OpKind.FORWARD_BACKWARD):
        acc += [(act, m, True)] + ([(below, m, False)] if s else [])
        acc += [(out, m, True)] if s < S - 1 else []
        if node.kind is OpKind.FORWARD and s == S - 1:
            acc += [(dout, m, True)]  # the loss gradient, for the later backward
    if node.kind in (OpKind.BACKWARD, OpKind.FORWARD_BACKWARD):
        acc += [(act, m, False)] + ([(below, m, False), (dbelow, m, True)] if s else [])
        if node.kind is OpKind.BACKWARD:
            acc += [(dout, m, False)]
    return acc


@pytest.mark.parametrize("schedule", list(dl.Schedule))
def test_reused_activation_buffers_are_never_overwritten_early(schedule):
    from shoal.workloads.dl import schedules

    slots = schedules.slots

    for R, S, M in itertools.product((1, 2), range(1, 6), range(1, 10)):
        nodes = step_graph(R, S, M, schedule)
        k = [slots(schedule, S, M, s) for s in range(S)]
        ancestors: list[set] = []
        for node in nodes:
            a = set(node.deps)
            for d in node.deps:
                a |= ancestors[d]
            ancestors.append(a)
        users: dict = {}  # buffer -> [(node index, micro-batch, writes)]
        for i, node in enumerate(nodes):
            if node.kind in (OpKind.REDUCE, OpKind.UPDATE):
                continue
            for buf, m, writes in _accesses(node, S, k):
                for j, m2, _ in users.get(buf, []):
                    if m2 != m and writes:  # another micro-batch's user must be finished
                        assert j in ancestors[i], (schedule, R, S, M, nodes[j], node, buf)
                users.setdefault(buf, []).append((i, m, writes))
    assert slots(dl.Schedule.ONE_F_ONE_B, 4, 8, 0) == 4 and slots(dl.Schedule.GPIPE, 4, 8, 0) == 8


def test_the_buffer_check_catches_one_buffer_too_few(monkeypatch):
    from shoal.workloads.dl import schedules

    real = schedules.slots
    monkeypatch.setattr(schedules, "slots", lambda sch, S, M, s: max(1, real(sch, S, M, s) - (s < S - 1)))
    with pytest.raises(AssertionError):
        test_reused_activation_buffers_are_never_overwritten_early(dl.Schedule.ONE_F_ONE_B)
