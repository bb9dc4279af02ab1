"""The trace: which events DataParallel emits, their bytes, order, steps, exports and hooks.

Expected values are computed here from shapes and dtypes (rows x features x element size,
parameter numel x element size); dpkit's own output is never used as the expectation.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import threading
import time
from collections import Counter, defaultdict

import pytest
import torch
from lanes import lanes
from torch import nn

import dpkit
from dpkit import comm
from dpkit import tracing as trace_mod
from dpkit.tracing import replica_graph

F, H, OUT = 5, 7, 3  # features in, hidden, features out
FORWARD = ("scatter", "replicate", "apply", "gather")
BACKWARD = ("grad_scatter", "backward", "reduce")
ALL_PHASES = set(FORWARD) | set(BACKWARD)
CHUNKS = {10: [3, 3, 3, 1], 6: [2, 2, 2]}  # torch.chunk sizes over 4 devices, written out


def mlp(dtype: torch.dtype = torch.float32, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(F, H), nn.ReLU(), nn.Linear(H, OUT)).to(dtype)


def esize(dtype: torch.dtype) -> int:
    return torch.tensor([], dtype=dtype).element_size()


def param_bytes(model: nn.Module) -> int:
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


def grad_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def step_of_training(model, devs, batch, dtype=torch.float32, output_device=None, seed=1):
    torch.manual_seed(seed)
    x = torch.randn(batch, F, dtype=dtype)
    dp = dpkit.DataParallel(model, device_ids=devs, output_device=output_device)
    y = dp(x)
    y.sum().backward()
    return x, y


def per_step(events):
    steps = defaultdict(list)
    for event in events:
        steps[event.step].append(event)
    return steps


def one(events, phase, device, what=None):
    """The single event of ``phase`` on ``device`` (reduce: the per-device one, not the sum)."""
    found = [
        e
        for e in events
        if e.phase == phase and e.device == device and e.details.get("what") == what
    ]
    assert len(found) == 1, f"expected one {phase} event on {device}, got {len(found)}"
    return found[0]


@pytest.fixture(autouse=True)
def _nothing_left_listening():
    """Every test starts and ends with no trace and no hook active."""
    assert not trace_mod.recorder._recorders and not trace_mod.recorder._hooks
    yield
    assert not trace_mod.recorder._recorders and not trace_mod.recorder._hooks
    assert not trace_mod.enabled()


# --------------------------------------------------------------------------------------
# completeness


@pytest.mark.parametrize("batch", [10, 6])
def test_every_used_device_has_each_phase_once_per_step(batch):
    devs = lanes(4)
    used = [d.name for d in devs[: len(CHUNKS[batch])]]
    with dpkit.trace() as tr:
        step_of_training(mlp(), devs, batch)
    steps = per_step(tr.events)
    assert len(steps) == 1
    (events,) = steps.values()
    assert {e.phase for e in events} == ALL_PHASES
    for phase in ("scatter", "replicate", "apply", "gather", "grad_scatter"):
        devices = Counter(e.device for e in events if e.phase == phase and "what" not in e.details)
        assert devices == Counter(used), phase
    modules = [e for e in events if e.phase == "replicate" and e.details.get("what") == "modules"]
    assert [e.device for e in modules] == [devs[0].name]
    per_device_reduce = Counter(
        e.device for e in events if e.phase == "reduce" and e.details.get("what") != "sum"
    )
    assert per_device_reduce == Counter(used)
    sums = [e for e in events if e.phase == "reduce" and e.details.get("what") == "sum"]
    assert [e.device for e in sums] == [devs[0].name]
    # the idle fourth device of a batch of 6 appears nowhere
    assert {e.device for e in events} == set(used)
    assert all(e.kind == "virtual-cpu" for e in events)


def test_one_device_records_the_module_s_own_call_as_its_apply_and_backward():
    """On one device DataParallel calls the module itself (torch's forward does too); the
    trace still shows that call's work, what it holds and its backward, not a lone scatter."""
    (dev,) = lanes(1)
    model = mlp()
    with dpkit.trace() as tr:
        step_of_training(model, [dev], 6)
    phases = Counter(e.phase for e in tr.events)
    assert phases["apply"] == 1 and phases["backward"] == 1, phases
    assert {"replicate", "gather", "reduce"}.isdisjoint(phases)  # no copies on one device
    (apply,) = [e for e in tr.events if e.phase == "apply"]
    assert apply.device == dev.name and apply.details["thread"] == "caller"
    held = {r.category: r.nbytes for r in tr.memory if r.device == dev.name}
    assert held["parameters"] == param_bytes(model)
    assert held["outputs"] == 6 * OUT * esize(torch.float32)
    assert held["activations"] > 0


def test_data_parallel_on_one_device_records_the_module_s_call_there_too():
    """The functional form on one device calls the module itself, as DataParallel does: its
    apply is on that device, in the caller's thread."""
    (dev,) = lanes(1)
    with dpkit.trace() as tr:
        dpkit.data_parallel(mlp(), torch.randn(6, F), device_ids=[dev]).sum().backward()
    (apply,) = [e for e in tr.events if e.phase == "apply"]
    assert apply.device == dev.name and apply.details["thread"] == "caller"


# --------------------------------------------------------------------------------------
# bytes


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch", [10, 6])
def test_bytes_of_forward_phases(batch, dtype):
    devs = lanes(4)
    model = mlp(dtype)
    size = esize(dtype)
    expected_params = param_bytes(model)
    assert expected_params == (F * H + H + H * OUT + OUT) * size
    with dpkit.trace() as tr:
        step_of_training(model, devs, batch, dtype)
    events = tr.events
    for index, rows in enumerate(CHUNKS[batch]):
        name = devs[index].name
        moved = index != 0  # lane 0 is the plain memory the batch and module live in
        assert one(events, "scatter", name).nbytes == (rows * F * size if moved else 0)
        replicate = sum(e.nbytes for e in events if e.phase == "replicate" and e.device == name)
        assert replicate == (expected_params if moved else 0)
        assert one(events, "gather", name).nbytes == (rows * OUT * size if moved else 0)
        assert one(events, "apply", name).nbytes == 0


@pytest.mark.parametrize("batch", [10, 6])
def test_bytes_of_backward_phases(batch):
    devs = lanes(4)
    model = mlp()
    size = esize(torch.float32)
    with dpkit.trace() as tr:
        step_of_training(model, devs, batch)
    events = tr.events
    for index, rows in enumerate(CHUNKS[batch]):
        name = devs[index].name
        moved = index != 0
        assert one(events, "grad_scatter", name).nbytes == (rows * OUT * size if moved else 0)
        assert one(events, "reduce", name).nbytes == (grad_bytes(model) if moved else 0)
    assert one(events, "reduce", devs[0].name, what="sum").nbytes == 0


def test_reduce_bytes_of_sparse_gradients():
    """A sparse gradient moves its indices and values: one (int64 row, float32 row of 4)
    per looked-up index in the lane's chunk."""
    devs = lanes(2)
    with dpkit.trace() as tr:
        model = dpkit.DataParallel(nn.Embedding(20, 4, sparse=True), device_ids=devs)
        model(torch.tensor([1, 2, 3, 4, 5, 5])).sum().backward()
    per_lookup = esize(torch.int64) + 4 * esize(torch.float32)
    assert one(tr.events, "reduce", devs[1].name).nbytes == 3 * per_lookup
    assert one(tr.events, "reduce", devs[0].name).nbytes == 0


def test_bytes_with_output_device_other_than_lane_0():
    """Output on lane 2: gather moves every piece except lane 2's own; the gradient of the
    output lives on lane 2, so grad_scatter moves every slice except lane 2's."""
    devs = lanes(4)
    size = esize(torch.float32)
    with dpkit.trace() as tr:
        _, y = step_of_training(mlp(), devs, 10, output_device=2)
    assert dpkit.device_of(y) == devs[2]
    events = tr.events
    gather, grad_scatter = {}, {}
    expected = {}
    for index, rows in enumerate(CHUNKS[10]):
        name = devs[index].name
        gather[name] = one(events, "gather", name).nbytes
        grad_scatter[name] = one(events, "grad_scatter", name).nbytes
        expected[name] = 0 if index == 2 else rows * OUT * size
    assert gather == expected
    assert grad_scatter == expected


def test_replicate_bytes_include_buffers():
    devs = lanes(4)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(F, H), nn.BatchNorm1d(H), nn.Linear(H, OUT))
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert buffers > 0
    with dpkit.trace() as tr:
        step_of_training(model, devs, 8)  # 2 rows each: BatchNorm needs more than one
    for index, device in enumerate(devs):
        moved = sum(
            e.nbytes for e in tr.events if e.phase == "replicate" and e.device == device.name
        )
        assert moved == (param_bytes(model) if index else 0)


# --------------------------------------------------------------------------------------
# order and times


@pytest.mark.parametrize("batch", [10, 6])
def test_phases_are_ordered_on_each_device(batch):
    devs = lanes(4)
    with dpkit.trace() as tr:
        step_of_training(mlp(), devs, batch)
    events = tr.events
    for e in events:
        assert math.isfinite(e.start) and math.isfinite(e.end)
        assert e.end >= e.start
        assert e.duration >= 0
    sum_event = one(events, "reduce", devs[0].name, what="sum")
    for device in devs[: len(CHUNKS[batch])]:
        name = device.name
        scatter, replicate = one(events, "scatter", name), one(events, "replicate", name)
        apply, gather = one(events, "apply", name), one(events, "gather", name)
        grad_scatter, reduce = one(events, "grad_scatter", name), one(events, "reduce", name)
        assert scatter.end <= apply.start
        assert replicate.end <= apply.start
        assert apply.end <= gather.start
        assert gather.end <= grad_scatter.start
        assert grad_scatter.end <= reduce.start
        assert reduce.end <= sum_event.start


class _SlowToReplicate(nn.Linear):
    """A layer whose module object takes 10 ms to replicate (its tensors copy at once)."""

    def _replicate_for_data_parallel(self):
        time.sleep(0.01)
        return super()._replicate_for_data_parallel()


def test_the_modules_event_times_building_the_replica_modules():
    """replicate is timed from outside (tracing.replicating): the modules event runs from its
    last copy to its return, so it holds the time spent building each replica's module."""
    devs = lanes(2)
    with dpkit.trace() as tr:
        dpkit.replicate(_SlowToReplicate(2, 2), devs)
    events = tr.events  # new objects on every read
    built = one(events, "replicate", devs[0].name, what="modules")
    copies = [e for e in events if e.phase == "replicate" and e is not built]
    assert built.details["modules"] == 1 and len(copies) == 2
    assert built.duration >= 0.02  # two replicas of the one module
    assert max(e.end for e in copies) <= built.start


def test_building_the_replica_modules_is_timed_between_the_copies_and_apply():
    """replicate copies tensors per device, then builds every replica's module objects in
    the caller's thread: that second part is one more replicate event, on the source."""
    devs = lanes(4)
    model = mlp()
    with dpkit.trace() as tr:
        step_of_training(model, devs, 10)
    events = tr.events
    built = one(events, "replicate", devs[0].name, what="modules")
    assert built.details["modules"] == len(list(model.modules()))
    assert built.nbytes == 0
    copies = [e for e in events if e.phase == "replicate" and e is not built]
    assert len(copies) == 4
    assert max(e.end for e in copies) <= built.start < built.end
    assert built.end <= min(e.start for e in events if e.phase == "apply")


# --------------------------------------------------------------------------------------
# steps


def test_two_iterations_give_two_consecutive_steps():
    devs = lanes(4)
    model = mlp()
    with dpkit.trace() as tr:
        step_of_training(model, devs, 10)
        first = {e.step for e in tr.events}
        step_of_training(model, devs, 10)
    events = tr.events
    assert len(first) == 1
    (s,) = first
    assert {e.step for e in events} == {s, s + 1}
    for step in (s, s + 1):
        in_step = [e for e in events if e.step == step]
        assert {e.phase for e in in_step} == ALL_PHASES
        assert Counter(e.device for e in in_step if e.phase == "apply") == Counter(
            d.name for d in devs
        )
    assert {r.step for r in tr.memory} == {s, s + 1}


def test_backward_events_carry_the_step_of_their_forward():
    """Two forwards, then one backward through both: each backward event belongs to its own
    forward's step, not to the step current when backward runs."""
    devs = lanes(4)
    dp = dpkit.DataParallel(mlp(), device_ids=devs)
    torch.manual_seed(3)
    x1, x2 = torch.randn(10, F), torch.randn(6, F)
    with dpkit.trace() as tr:
        y1 = dp(x1)
        y2 = dp(x2)
        forward_steps = sorted({e.step for e in tr.events})
        (y1.sum() + y2.sum()).backward()
    assert len(forward_steps) == 2
    s1, s2 = forward_steps
    assert s2 == s1 + 1
    events = tr.events
    for step, batch in ((s1, 10), (s2, 6)):
        used = Counter(d.name for d in devs[: len(CHUNKS[batch])])
        backward = [e for e in events if e.step == step and e.phase in BACKWARD]
        assert Counter(e.device for e in backward if e.phase == "grad_scatter") == used
        rows = sorted(e.details["rows"] for e in backward if e.phase == "grad_scatter")
        assert rows == sorted(CHUNKS[batch])
        per_device = [e for e in backward if e.phase == "reduce" and "what" not in e.details]
        assert Counter(e.device for e in per_device) == used


class _SlowScale(torch.autograd.Function):
    """``x * w`` whose backward sleeps, then notes on which lane and when it finished."""

    finished: dict[str, float] = {}

    @staticmethod
    def forward(ctx, x, w, lane):
        ctx.save_for_backward(x, w)
        ctx.lane = lane
        return x * w

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        time.sleep(0.03)
        grads = grad * w, (grad * x).sum(0)
        _SlowScale.finished[ctx.lane] = time.perf_counter()
        return *grads, None


class _SlowModel(nn.Module):
    """The slow scale, alone or followed by a Linear (then the scale's node, made first,
    runs last in backward, after the Linear's nodes)."""

    def __init__(self, then_linear: bool) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(F))
        self.linear = nn.Linear(F, OUT) if then_linear else nn.Identity()

    def forward(self, x):
        return self.linear(_SlowScale.apply(x, self.w, dpkit.device_of(x).name))


@pytest.mark.parametrize("then_linear", [False, True], ids=["one_node", "several_nodes"])
def test_each_replica_backward_ends_when_its_own_gradients_are_done(then_linear):
    """On the CPU autograd runs the replicas' backward in one thread; here each replica's
    30 ms node runs last in its backward, so the replicas finish one after another, and
    each event must end with its own replica, not with the last one."""
    devs = lanes(3)
    _SlowScale.finished.clear()
    model = _SlowModel(then_linear)
    with dpkit.trace() as tr:
        dpkit.DataParallel(model, device_ids=devs)(torch.randn(6, F)).sum().backward()
    finished = _SlowScale.finished
    assert sorted(finished) == sorted(d.name for d in devs)
    ends = sorted(finished.values())
    assert all(b - a >= 0.03 for a, b in zip(ends, ends[1:]))  # one after another
    for device in devs:
        event = one(tr.events, "backward", device.name)
        # it ends after its gradients are computed, and well before the next replica's are
        assert 0 <= event.end - finished[device.name] < 0.015
        assert event.start < finished[device.name] - 0.03


@pytest.mark.parametrize("how", ["autograd.grad", "backward(inputs=)"])
def test_a_gradient_of_the_input_alone_still_times_each_replica_backward(how):
    """A saliency map or an adversarial example needs the input's gradient only: the
    weights' transpose nodes, made first in each replica, never run. Each replica still gets
    its backward event, ending when the whole backward did, and saying so."""
    devs = lanes(4)
    x = torch.randn(10, F, requires_grad=True)
    with dpkit.trace() as tr:
        y = dpkit.DataParallel(mlp(), device_ids=devs)(x)
        before_backward = time.perf_counter()
        if how == "autograd.grad":
            torch.autograd.grad(y.sum(), x)
        else:
            y.sum().backward(inputs=[x])
        after_backward = time.perf_counter()
    for device in devs:
        event = one(tr.events, "backward", device.name)
        assert before_backward < event.start <= event.end <= after_backward
        assert "whole backward" in event.details["end"]
        assert event.start >= one(tr.events, "grad_scatter", device.name).end


def test_a_full_backward_ends_at_each_replicas_last_node():
    with dpkit.trace() as tr:
        step_of_training(mlp(), lanes(4), 10)
    backward = [e for e in tr.events if e.phase == "backward"]
    assert len(backward) == 4 and not any("end" in e.details for e in backward)


# --------------------------------------------------------------------------------------
# off by default


def test_nothing_is_recorded_outside_the_block():
    devs = lanes(4)
    model = mlp()
    listeners_before = dict(comm._listeners)
    assert not trace_mod.enabled()
    step_of_training(model, devs, 10)  # before: nobody listens
    with dpkit.trace() as tr:
        assert trace_mod.enabled()
        step_of_training(model, devs, 10)
    assert not trace_mod.enabled()
    assert comm._listeners == listeners_before  # the trace counts bytes without a listener
    assert len(comm._listeners) == 0
    inside_events, inside_memory = len(tr.events), len(tr.memory)
    # one step: 4 each of scatter, replicate, apply, gather, grad_scatter, backward and
    # reduce; the replica modules built, and the reduce's sum, on device 0
    assert inside_events == 4 * 7 + 2
    assert len({e.step for e in tr.events}) == 1
    step_of_training(model, devs, 10)  # after: nothing more arrives
    assert len(tr.events) == inside_events
    assert len(tr.memory) == inside_memory


def test_off_costs_nothing():
    """With no trace and no hook, spans are one shared no-op, no transfer listener is
    installed and nothing touches the tensors autograd saves."""
    device = lanes(2)[1]
    assert not trace_mod.enabled()
    assert len(comm._listeners) == 0
    assert trace_mod.span("apply", device) is trace_mod.span("scatter", device)
    replicas = dpkit.replicate(mlp(), lanes(2))
    outputs = dpkit.parallel_apply(replicas, dpkit.scatter(torch.randn(4, F), lanes(2)))
    # a saved tensor takes one pair of hooks: none were set, so these go in
    outputs[1].grad_fn._raw_saved_mat1.register_hooks(lambda t: t, lambda t: t)
    step = trace_mod.current_step()
    step_of_training(mlp(), lanes(4), 10)
    assert trace_mod.current_step() == step  # no step counted while off
    # replicas carry nothing extra; their graph is torch's, parameters fed by the broadcast
    replicas = dpkit.replicate(mlp(), lanes(2))
    assert not any(k.startswith("_dpkit") for r in replicas for k in vars(r))
    assert type(replicas[1][0].weight.grad_fn).__name__ == "BroadcastBackward"


# --------------------------------------------------------------------------------------
# hooks


def test_scatter_hook_sees_only_scatter_events():
    devs = lanes(4)
    seen = []
    handle = dpkit.register_phase_hook(seen.append, phases="scatter")
    try:
        assert trace_mod.enabled()
        step_of_training(mlp(), devs, 10)  # no trace block: the hook alone listens
    finally:
        handle.remove()
    assert [e.phase for e in seen] == ["scatter"] * 4
    assert sum(e.details["rows"] for e in seen) == 10
    assert [e.details["rows"] for e in seen] == CHUNKS[10]
    assert [e.nbytes for e in seen] == [0] + [r * F * 4 for r in CHUNKS[10][1:]]


def test_hook_for_all_phases_then_removed():
    devs = lanes(4)
    model = mlp()
    seen, lock = [], threading.Lock()

    def hook(event):
        with lock:  # apply events arrive from the worker threads
            seen.append(event)

    handle = dpkit.register_phase_hook(hook)
    assert trace_mod.enabled()
    step_of_training(model, devs, 10)
    assert {e.phase for e in seen} == ALL_PHASES
    assert len(seen) == 4 * 7 + 2  # with the modules built and the reduce sum on device 0
    assert Counter(e.phase for e in seen)["apply"] == 4
    assert all(e.end >= e.start for e in seen)
    handle.remove()
    assert not trace_mod.enabled()
    assert len(comm._listeners) == 0
    count = len(seen)
    step_of_training(model, devs, 10)
    assert len(seen) == count


def test_hook_with_several_phases_and_a_trace_see_the_same_events():
    devs = lanes(4)
    seen = []
    handle = dpkit.register_phase_hook(seen.append, phases=["gather", "reduce"])
    try:
        with dpkit.trace() as tr:
            step_of_training(mlp(), devs, 6)
    finally:
        handle.remove()
    assert Counter(e.phase for e in seen) == {"gather": 3, "reduce": 4}
    traced = [e for e in tr.events if e.phase in ("gather", "reduce")]
    # the trace keeps its own copies (compact columns): the same events, field by field
    key = lambda e: (e.start, e.device, e.phase)  # noqa: E731
    assert sorted(seen, key=key) == sorted(traced, key=key)


# --------------------------------------------------------------------------------------
# memory


@pytest.fixture(params=["data", "probe"])
def saved_tensor_reading(request, monkeypatch):
    """Both ways replica_graph reads saved tensors: SavedTensor.data where torch has it,
    else a probe with SavedTensor.register_hooks (the path for older torch)."""
    if request.param == "data" and not replica_graph._READ_SAVED_DATA:
        pytest.skip("this torch has no SavedTensor.data")
    if request.param == "probe":
        monkeypatch.setattr(replica_graph, "_READ_SAVED_DATA", False)
    return request.param


@pytest.mark.parametrize("output_device", [0, 2])
@pytest.mark.parametrize("batch", [10, 6])
def test_memory_per_device(batch, output_device, saved_tensor_reading):
    devs = lanes(4)
    model = mlp()
    size = esize(torch.float32)
    with dpkit.trace() as tr:
        step_of_training(model, devs, batch, output_device=output_device)
    held = defaultdict(int)
    categories = defaultdict(set)
    for record in tr.memory:
        held[record.device, record.category] += record.nbytes
        categories[record.device].add(record.category)
        assert record.kind == "virtual-cpu"
    used = devs[: len(CHUNKS[batch])]
    out_name = devs[output_device].name
    assert set(categories) == {d.name for d in used}
    for device, rows in zip(used, CHUNKS[batch]):
        name = device.name
        expected = {"parameters", "input", "activations", "outputs"}
        assert categories[name] == (expected | {"gathered"} if name == out_name else expected)
        assert held[name, "input"] == rows * F * size  # lane 0 holds its chunk too
        assert held[name, "parameters"] == param_bytes(model)
        assert held[name, "outputs"] == rows * OUT * size
        # the ReLU saves its (rows x hidden) output, and the second Linear saves the same
        # tensor as its input: one storage, counted once
        assert held[name, "activations"] == rows * H * size
    assert held[out_name, "gathered"] == batch * OUT * size


def test_activations_leave_out_parameters_and_input():
    """A lone Linear saves only its input and weight, which are counted elsewhere."""
    devs = lanes(4)
    torch.manual_seed(0)
    with dpkit.trace() as tr:
        dp = dpkit.DataParallel(nn.Linear(F, OUT), device_ids=devs)
        dp(torch.randn(8, F)).sum().backward()
    activations = {r.device: r.nbytes for r in tr.memory if r.category == "activations"}
    assert activations == {d.name: 0 for d in devs}


class _Checkpointed(nn.Module):
    """An MLP whose body is recomputed in backward (non-reentrant checkpoint)."""

    def __init__(self, checkpointed: bool) -> None:
        super().__init__()
        self.body = mlp()
        self.checkpointed = checkpointed
        self.body_runs = [0]  # a list: replicas share it, as they share __dict__'s contents

    def run_body(self, x):
        self.body_runs[0] += 1
        return self.body(x)

    def forward(self, x):
        if self.checkpointed:
            return torch.utils.checkpoint.checkpoint(self.run_body, x, use_reentrant=False)
        return self.run_body(x)


@pytest.mark.parametrize("traced", [False, True], ids=["untraced", "traced"])
def test_checkpointed_activations_are_not_counted_nor_recomputed_by_the_trace(
    traced, saved_tensor_reading
):
    """Checkpointing keeps only the body's input, and the trace must not unpack (recompute)
    the tensors it drops: the body runs once per replica forward, once per backward."""
    devs = lanes(2)
    model = _Checkpointed(checkpointed=True)
    with dpkit.trace() if traced else contextlib.nullcontext() as tr:
        dpkit.DataParallel(model, device_ids=devs)(torch.randn(6, F)).sum().backward()
    assert model.body_runs[0] == 2 * len(devs)
    if traced:
        activations = [r.nbytes for r in tr.memory if r.category == "activations"]
        assert activations == [0, 0]  # without the checkpoint: 3 x H floats each


class _Offloaded(nn.Module):
    """An MLP whose saved tensors are packed by save_on_cpu's hooks."""

    def __init__(self) -> None:
        super().__init__()
        self.body = mlp()

    def forward(self, x):
        with torch.autograd.graph.save_on_cpu():
            return self.body(x)


def test_activations_packed_by_other_hooks_are_not_counted(saved_tensor_reading):
    """What save_on_cpu keeps lives elsewhere (pinned host memory on a GPU): not the lane's."""
    devs = lanes(2)
    model = _Offloaded()
    reference = copy.deepcopy(model)
    x = torch.randn(6, F)
    with dpkit.trace() as tr:
        dpkit.DataParallel(model, device_ids=devs)(x).sum().backward()
    assert [r.nbytes for r in tr.memory if r.category == "activations"] == [0, 0]
    reference(x).sum().backward()  # the trace left the packed tensors usable
    for got, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got.grad, want.grad)


class _Picker(nn.Module):
    """Keeps every other hidden unit by advanced indexing, whose node saves its index
    tensor inside a tuple (IndexBackward0's ``indices``)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(F, H)

    def forward(self, x):
        keep = torch.arange(0, H, 2, device=x.device)  # made here: an activation
        return torch.relu(self.linear(x))[:, keep]


def test_activations_include_tensors_saved_in_lists(saved_tensor_reading):
    devs = lanes(2)
    with dpkit.trace() as tr:
        dpkit.DataParallel(_Picker(), device_ids=devs)(torch.randn(6, F)).sum().backward()
    activations = [r.nbytes for r in tr.memory if r.category == "activations"]
    relu_output, index = 3 * H * esize(torch.float32), len(range(0, H, 2)) * esize(torch.int64)
    assert activations == [relu_output + index] * 2


def test_activations_without_checkpoint_for_comparison(saved_tensor_reading):
    devs = lanes(2)
    with dpkit.trace() as tr:
        model = _Checkpointed(checkpointed=False)
        dpkit.DataParallel(model, device_ids=devs)(torch.randn(6, F)).sum().backward()
    activations = [r.nbytes for r in tr.memory if r.category == "activations"]
    assert activations == [3 * H * esize(torch.float32)] * 2


# --------------------------------------------------------------------------------------
# torch.profiler


def test_profiler_sees_dpkit_ranges():
    devs = lanes(4)
    with torch.profiler.profile() as prof:
        with dpkit.trace():
            step_of_training(mlp(), devs, 10)
    names = Counter(e.name for e in prof.events() if e.name.startswith("dpkit."))
    assert names["dpkit.scatter"] == 4
    assert names["dpkit.gather"] == 4
    # The profiler sees only its own thread: one dpkit.apply range spans the 4 workers.
    assert names["dpkit.apply"] == 1


# --------------------------------------------------------------------------------------
# exports


def test_chrome_trace(tmp_path):
    devs = lanes(4)
    before = time.perf_counter()
    with dpkit.trace() as tr:
        step_of_training(mlp(), devs, 10)
        step_of_training(mlp(), devs, 6)
    wall_us = (time.perf_counter() - before) * 1e6
    events = tr.events
    path = tr.to_chrome_trace(tmp_path / "sub" / "t.json")
    data = json.loads((tmp_path / "sub" / "t.json").read_text())
    assert str(path).endswith("t.json")
    trace_events = data["traceEvents"]
    process = [e for e in trace_events if e["ph"] == "M" and e["name"] == "process_name"]
    assert len(process) == 1 and "virtual" in process[0]["args"]["name"]
    threads = [e for e in trace_events if e["ph"] == "M" and e["name"] == "thread_name"]
    assert sorted(t["args"]["name"] for t in threads) == sorted(d.name for d in devs)
    assert len({t["tid"] for t in threads}) == len(devs)
    tid_of = {t["args"]["name"]: t["tid"] for t in threads}
    spans = [e for e in trace_events if e["ph"] == "X"]
    assert len(spans) == len(events) == (4 * 7 + 2) + (3 * 7 + 2)
    for span, event in zip(spans, events, strict=True):
        assert {"name", "ph", "ts", "dur", "pid", "tid", "args"} <= span.keys()
        assert span["name"] == event.phase
        assert span["tid"] == tid_of[event.device]
        # microseconds since the block began
        assert 0 <= span["ts"] <= span["ts"] + span["dur"] <= wall_us
        assert span["dur"] == pytest.approx(event.duration * 1e6)
        assert span["args"]["step"] == event.step
        assert span["args"]["nbytes"] == event.nbytes
        assert span["cat"] == ("backward" if event.phase in BACKWARD else "forward")


def test_summary_bytes_and_shares():
    devs = lanes(4)
    model = mlp()
    size = esize(torch.float32)
    with dpkit.trace() as tr:
        for _ in range(2):
            step_of_training(model, devs, 10)
    table = tr.summary()
    assert [row["phase"] for row in table] == list(FORWARD + BACKWARD)
    moved = CHUNKS[10][1:]  # the chunks of lanes 1..3
    expected = {
        "scatter": sum(moved) * F * size,
        "replicate": 3 * param_bytes(model),
        "apply": 0,
        "backward": 0,
        "gather": sum(moved) * OUT * size,
        "grad_scatter": sum(moved) * OUT * size,
        "reduce": 3 * grad_bytes(model),
    }
    by_step = defaultdict(Counter)
    for event in tr.events:
        by_step[event.step][event.phase] += event.nbytes
    assert len(by_step) == 2
    for counts in by_step.values():
        assert {phase: counts[phase] for phase in expected} == expected
    # time of a phase in a step: first start to last end across devices; share: of the steps'
    # time (first event to last), so that it is the time column over the step's
    spans, step_spans = defaultdict(list), []
    for events in per_step(tr.events).values():
        step_spans.append(max(e.end for e in events) - min(e.start for e in events))
        for phase in expected:
            mine = [e for e in events if e.phase == phase]
            spans[phase].append(max(e.end for e in mine) - min(e.start for e in mine))
    assert table.step_s == pytest.approx(sum(step_spans) / 2)
    for row in table:
        phase = row["phase"]
        assert row["nbytes"] == expected[phase]
        assert 0.0 <= row["share"] <= 1.0
        assert row["share"] == pytest.approx(sum(spans[phase]) / sum(step_spans))
        assert row["time_s"] == pytest.approx(sum(spans[phase]) / 2)
    text = str(table)
    assert all(phase in text for phase in expected)


def test_memory_summary_a_row_per_device_of_the_last_step():
    """Steps of batch 6 then 10 on 4 lanes, output on lane 2: the table shows step 2."""
    devs = lanes(4)
    model = mlp()
    size = esize(torch.float32)
    with dpkit.trace() as tr:
        step_of_training(model, devs, 6)
        step_of_training(model, devs, 10, output_device=2)
    table = tr.memory_summary()
    assert [row["device"] for row in table] == [d.name for d in devs]
    for device, rows, row in zip(devs, CHUNKS[10], table):
        expected = {
            "parameters": param_bytes(model),
            "input": rows * F * size,
            "activations": rows * H * size,  # the ReLU output, saved once
            "outputs": rows * OUT * size,
            "gathered": 10 * OUT * size if device is devs[2] else 0,
        }
        assert row == {"device": device.name, "step": 2, **expected,
                       "counted": sum(expected.values())}  # fmt: skip
    first = tr.memory_summary(step=1)
    assert [row["device"] for row in first] == [d.name for d in devs[:3]]  # 6 rows: 3 lanes
    text = str(table)
    assert text.splitlines()[0] == "step 2, bytes held"
    assert f"{10 * OUT * size:,d}" in text and "counted" in text
    with pytest.raises(ValueError, match=r"step=5 .* \[1, 2\]"):
        tr.memory_summary(step=5)


def test_rows_one_per_event():
    devs = lanes(4)
    before = time.perf_counter()
    with dpkit.trace() as tr:
        step_of_training(mlp(), devs, 6)
    wall = time.perf_counter() - before
    table = tr.rows()
    if hasattr(table, "to_dict"):  # a pandas DataFrame where pandas is installed
        table = table.to_dict("records")
    events = tr.events
    assert len(table) == len(events) == 3 * 7 + 2
    for row, event in zip(table, events, strict=True):
        assert row["phase"] == event.phase and row["device"] == event.device
        assert row["nbytes"] == event.nbytes and row["step"] == event.step
        assert 0 <= row["start_s"] <= row["end_s"] <= wall  # seconds since the block began
        assert row["duration_s"] == pytest.approx(event.end - event.start)


def test_hardware_label():
    with dpkit.trace() as tr:
        step_of_training(mlp(), lanes(4), 6)
    assert tr.hardware == "virtual devices on the CPU"


# --------------------------------------------------------------------------------------
# tracing changes nothing


@pytest.mark.parametrize("batch", [10, 6])
def test_tracing_does_not_change_results(batch):
    devs = lanes(4)
    plain, traced = mlp(), mlp()
    assert all(torch.equal(a, b) for a, b in zip(plain.parameters(), traced.parameters()))
    hooked = copy.deepcopy(plain)
    _, y_plain = step_of_training(plain, devs, batch)
    with dpkit.trace():
        _, y_traced = step_of_training(traced, devs, batch)
    handle = dpkit.register_phase_hook(lambda event: None)
    try:
        _, y_hooked = step_of_training(hooked, devs, batch)
    finally:
        handle.remove()
    for other, y in ((traced, y_traced), (hooked, y_hooked)):
        assert torch.equal(y_plain, y)
        for p, q in zip(plain.parameters(), other.parameters(), strict=True):
            assert torch.equal(p.grad, q.grad)
