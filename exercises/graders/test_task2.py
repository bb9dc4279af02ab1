"""Grader for task 2: replicate, with a broadcast whose backward reduce-adds gradients.

The Broadcast checks run the student's Broadcast; the replicate checks run replicate on a
reference Broadcast in its place, so that a wrong Broadcast fails only Broadcast's checks
and every hint names the part that is wrong (as task 1's checks do with its functions).
Under ``dpkit grade`` the checks :data:`dpkit.grading.decided.CHECKS` lists are decided by
the grader's parent process, from the values sent back on inputs it chose: the gradients,
the copies, and which parameters the module holds after replicate, as the index of the one
it held before (:mod:`dpkit.grading.identity`).
"""

import pytest
import torch
from torch import nn

from dpkit.comm import copy_to
from dpkit.grading import decided, identity, outputs
from dpkit.grading.rules import lent
from dpkit.lanes import resides_on

pytestmark = pytest.mark.task2
EXERCISE = "task2_replicate.py"
FORBIDDEN = (
    "dpkit.replicate.replicate",
    "dpkit.comm.broadcast",
    "dpkit.comm.reduce_add",
    "dpkit._functions.Broadcast.apply",
    "dpkit._functions.Broadcast.forward",
    "dpkit._functions.Broadcast.backward",
    "dpkit._functions.ReduceAddCoalesced.apply",
    "dpkit._functions.ReduceAddCoalesced.forward",
    "dpkit._functions.ReduceAddCoalesced.backward",
)


def reference_forward(ctx, devices, *tensors):  # noqa: ANN001, ANN201
    """Broadcast.forward as the task asks for it: every tensor on every lane, flat."""
    ctx.devices, ctx.count = list(devices), len(tensors)
    return tuple(copy_to(t, device, "broadcast") for device in devices for t in tensors)


def reference_backward(ctx, *grads):  # noqa: ANN001, ANN201
    """Broadcast.backward as the task asks for it: each tensor's copies' gradients summed
    on lane 0."""
    home, count = ctx.devices[0], ctx.count
    sums = []
    for index in range(count):
        parts = [
            copy_to(grads[position * count + index], home, "reduce", source=device)
            for position, device in enumerate(ctx.devices)
        ]
        sums.append(sum(parts[1:], parts[0]))
    return (None, *sums)


@pytest.fixture
def with_reference_broadcast(exercise, monkeypatch):
    """The student's module, its Broadcast replaced by the reference (made here, so that a
    submission cannot import it)."""
    forward, backward = lent(reference_forward), lent(reference_backward)
    calls = []

    class Broadcast(torch.autograd.Function):
        @staticmethod
        def forward(ctx, devices, *tensors):  # noqa: ANN001, ANN205
            calls.append(len(tensors))
            return forward(ctx, devices, *tensors)

        @staticmethod
        def backward(ctx, *grads):  # noqa: ANN001, ANN205
            return backward(ctx, *grads)

    monkeypatch.setattr(exercise, "Broadcast", Broadcast, raising=False)
    exercise_calls[id(exercise)] = calls
    return exercise


exercise_calls: dict = {}  # the Broadcast.apply calls each replicate made, by module


def broadcast(exercise, devices, *tensors):  # noqa: ANN001, ANN201
    """``Broadcast.apply(devices, *tensors)``, which must give a tuple: a forward that
    returns a list gives autograd one output that is not a tensor, and no backward runs."""
    copies = exercise.Broadcast.apply(devices, *tensors)
    assert isinstance(copies, tuple), (
        f"Broadcast.apply returned a {type(copies).__name__}, so backward never ran: forward "
        "must return a tuple of tensors (tuple(copies)); autograd takes a list for one output "
        "that is not a tensor"
    )
    return copies


def replicate(exercise, model, devices):  # noqa: ANN001, ANN201
    """``exercise.replicate(model, devices)``. A module whose parameters replicate swapped
    for copies is named as such: when copy.deepcopy then fails on it (its parameters are no
    longer leaves), and when it is itself among the replicas."""
    before = [id(p) for p in model.parameters()]
    try:
        replicas = exercise.replicate(model, devices)
    except RuntimeError as error:
        if "deepcopy protocol" not in str(error):
            raise
        if [id(p) for p in model.parameters()] != before:
            raise AssertionError(
                "replicate swapped the copies into the module itself, and copy.deepcopy then "
                "failed on it (its parameters are no longer leaves): replicas must be new "
                "modules; swap in the replicas only, and leave the module as it was"
            ) from error
        raise AssertionError(
            "copy.deepcopy failed on a module whose parameters are Broadcast's outputs, which "
            "are not leaves (a replica already made?): deep-copy the original module for every "
            "replica, then swap in that lane's copies"
        ) from error
    if [id(p) for p in model.parameters()] != before:  # the copies swapped into the module
        index = next((i for i, replica in enumerate(replicas) if replica is model), None)
        assert index is None, (
            f"replica {index} is the model itself, whose parameters replicate swapped for "
            "copies: replicas must be new modules; swap in the replicas only"
        )
    return replicas


def test_broadcast_forward_layout(exercise, lanes, request):
    """Broadcast.forward returns every tensor on every lane, device by device"""
    # The values are judged by the grader's parent on tensors it chose; the lanes, here.
    nodeid = request.node.nodeid
    inputs = decided.inputs_here(nodeid)
    a, b = outputs.layout_tensors(*inputs)
    copies = broadcast(exercise, lanes, a, b)
    decided.answer(nodeid, inputs, outputs.listed("copy", copies))
    for position, copy in enumerate(copies):
        lane = position // 2
        assert resides_on(copy, lanes[lane]), f"output {position} is not on lane {lane}"
    assert copies[0].data_ptr() == a.data_ptr(), "lane 0's copy must share storage: no copy"


def test_broadcast_forward_bytes(exercise, lanes, transfers, request):
    """Broadcast.forward copies each tensor once to each lane but lane 0"""
    nodeid = request.node.nodeid
    shapes, count = inputs = decided.inputs_here(nodeid)
    tensors = [torch.randn(shape, requires_grad=True) for shape in shapes]
    exercise.Broadcast.apply(lanes[:count], *tensors)
    decided.answer(nodeid, inputs, decided.pack_transfers(transfers))


def test_broadcast_backward_reduce_adds(exercise, lanes, request):
    """Broadcast.backward sums the gradients of all copies"""
    # The grader's parent chose the shapes, lanes and seed (a weight per copy, so every
    # copy's gradient differs) and judges the gradients (dpkit.grading.decided).
    nodeid = request.node.nodeid
    shapes, count, seed = inputs = decided.inputs_here(nodeid)
    tensors, weights = decided.broadcast_values(shapes, count, seed)
    leaves = [tensor.clone().requires_grad_() for tensor in tensors]
    copies = broadcast(exercise, lanes[:count], *leaves)
    sum((weight * copy).sum() for weight, copy in zip(weights, copies)).backward()
    decided.answer(nodeid, inputs, {f"grad{i}": leaf.grad for i, leaf in enumerate(leaves)})


def test_broadcast_backward_moves_to_lane0(exercise, lanes, transfers, request):
    """Broadcast.backward moves each lane's gradient to lane 0 once"""
    nodeid = request.node.nodeid
    shape, count = inputs = decided.inputs_here(nodeid)
    weight = torch.randn(shape, requires_grad=True)
    copies = broadcast(exercise, lanes[:count], weight)
    transfers.clear()
    sum(copy.sum() for copy in copies).backward()
    decided.answer(nodeid, inputs, decided.pack_transfers(transfers))


def test_replicate_places_replicas(with_reference_broadcast, lanes, request):
    """replicate makes one working replica per lane, parameters on that lane"""
    # The replicas' outputs are judged by the grader's parent on a model and batch it
    # chose; where their parameters are, here.
    nodeid = request.node.nodeid
    seed, rows, _ = inputs = decided.inputs_here(nodeid)
    model = outputs.seeded_model(seed)
    x, _, _ = outputs.seeded_batch(seed, rows)
    replicas = replicate(with_reference_broadcast, model, lanes)
    assert len(replicas) == 4, f"expected 4 replicas, got {len(replicas)}"
    with torch.no_grad():
        decided.answer(nodeid, inputs, outputs.listed("out", [r(x) for r in replicas]))
    for index, replica in enumerate(replicas):
        assert replica is not model, "replicas must be new modules, not the model itself"
        weight = replica[0].weight
        assert resides_on(weight, lanes[index]), (
            f"replica {index}'s weight is not on lane {index}: swap in the Broadcast copies"
        )
    calls = exercise_calls.get(id(with_reference_broadcast), [])
    count = len(list(model.parameters()))
    assert calls == [count], (
        f"replicate called Broadcast.apply {len(calls)} times, with {calls} tensors; call it "
        f"once, with all {count} parameters, so that one reduce-add carries every gradient back"
    )
    assert replicas[0][0].weight.data_ptr() == model[0].weight.data_ptr(), (
        "replica 0 must share storage with the module (copy_to onto lane 0 copies nothing)"
    )


def test_replicate_gradients(with_reference_broadcast, lanes, request):
    """gradients of every replica add up in the original module"""
    nodeid = request.node.nodeid
    seed, rows, count = inputs = decided.inputs_here(nodeid)
    model = nn.Sequential(outputs.seeded_model(seed))  # nested: parameters "0.0.weight", ...
    x, _, _ = outputs.seeded_batch(seed, rows)
    replicas = replicate(with_reference_broadcast, model, lanes[:count])
    sum(replica(x).pow(2).sum() for replica in replicas).backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, (
            f"{name}.grad is None: replica parameters must be outputs of Broadcast.apply"
        )
    decided.answer(nodeid, inputs, outputs.listed("grad", [p.grad for p in model.parameters()]))


def test_replicate_leaves_module_alone(with_reference_broadcast, lanes, request):
    """replicate leaves the module's own parameters in place"""
    # The parent chose the model's seed; it judges which of the parameters before replicate
    # each one after is (identity as an index) and their values (dpkit.grading.identity).
    nodeid = request.node.nodeid
    (seed,) = inputs = decided.inputs_here(nodeid)
    model = outputs.seeded_model(seed)
    before = list(model.parameters())
    replicate(with_reference_broadcast, model, lanes)
    after = [param for _, param in model.named_parameters()]
    values = {
        "same": torch.tensor([identity.index_of(p, before) for p in after], dtype=torch.int64),
        "parameter": torch.tensor(
            [int(not isinstance(p, nn.Parameter)) for p in after], dtype=torch.int64
        ),
    }
    values.update({f"value{i}": p for i, p in enumerate(after)})
    decided.answer(nodeid, inputs, values)
