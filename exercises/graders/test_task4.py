"""Grader for task 4: gather, with a backward that scatters the gradient back.

Under ``dpkit grade`` the check that Gather concatenates the pieces and the three checks
of the bytes it copies (forward, scalars, backward) are decided by the grader's parent
process, from the results and the copies sent back on inputs it chose
(:mod:`dpkit.grading.decided`). The concatenation gathers onto lane 2, and a result left
on lane 0 reaches the parent zeroed: it cannot see lane tags, but it sees that.
"""

from collections import namedtuple

import pytest
import torch

from dpkit.comm import copy_to
from dpkit.grading import decided, gradients, outputs, shapes, structure
from dpkit.grading.checks import must_raise
from dpkit.lanes import device_of, resides_on

pytestmark = pytest.mark.task4
EXERCISE = "task4_gather.py"
FORBIDDEN = (
    "dpkit.gather.gather",
    "dpkit.comm.gather",
    "dpkit._functions.Gather.apply",
    "dpkit._functions.Gather.forward",
    "dpkit._functions.Gather.backward",
)

Result = namedtuple("Result", ["logits", "loss"])
HOME = 0  # the lane outputs are gathered onto, as DataParallel's output_device


def on_lanes(tensors, lanes, requires_grad=False):
    """Each tensor as a leaf on its lane (lane 0's stays in plain memory)."""
    return [
        copy_to(t, lane, "setup").requires_grad_(requires_grad) for t, lane in zip(tensors, lanes)
    ]


def on_lanes_nested(outputs, lanes):
    """Each replica's dict with its tensor moved to the replica's lane."""
    return [{k: copy_to(t, lane, "setup") for k, t in o.items()} for o, lane in zip(outputs, lanes)]


def test_gather_concatenates(exercise, lanes, request):
    """Gather concatenates the pieces in order on the destination"""
    # The grader's parent chose the pieces' sizes and values' seed, and judges the results
    # sent back (dpkit.grading.decided); where they are is checked here.
    # Onto lane 2: lane 0 is plain memory, where a tensor dpkit never tagged resides too.
    nodeid = request.node.nodeid
    cases = decided.inputs_here(nodeid)
    destination, results = lanes[2], {}
    for name, (sizes, other, dim, seed) in zip(("rows", "columns"), cases):
        values = decided.gather_pieces(sizes, other, dim, seed)
        result = exercise.Gather.apply(destination, dim, *on_lanes(values, lanes))
        assert resides_on(result, destination), (
            f"gathered onto {destination}, the result is not there (device_of gives "
            f"{device_of(result)}): torch.cat makes a new tensor, which dpkit has not tagged and "
            "so takes to be on lane 0; return place(result, destination)"
        )
        # The parent sees values, not lane tags, so where the result lives shows in them:
        # moved to lane 0, a result on lane 2 is copied and zeroing the copy leaves it
        # intact; one on lane 0 (or with a tag that claims every lane) is handed back
        # itself, and zeroed, even if it is a tensor subclass that would skip zero_.
        with torch._C.DisableTorchFunctionSubclass():
            copy_to(result, lanes[0], "probe").zero_()
        results[name] = result
    decided.answer(nodeid, cases, results)


def test_gather_bytes(exercise, lanes, transfers, request):
    """Gather copies only the pieces that are not on the destination"""
    nodeid = request.node.nodeid
    rows, columns = inputs = decided.inputs_here(nodeid)
    pieces = on_lanes([torch.randn(count, columns) for count in rows], lanes)
    transfers.clear()
    exercise.Gather.apply(lanes[HOME], 0, *pieces)
    decided.answer(nodeid, inputs, decided.pack_transfers(transfers))


def test_gather_scalars(exercise, lanes, transfers, request):
    """scalars from the replicas gather into a vector"""
    nodeid = request.node.nodeid
    count, seed = inputs = decided.inputs_here(nodeid)
    pieces = on_lanes(decided.scalar_values(count, seed), lanes)
    transfers.clear()
    result = exercise.Gather.apply(lanes[HOME], 0, *pieces)
    decided.answer(nodeid, inputs, {**decided.pack_transfers(transfers), "result": result})


def test_gather_backward(exercise, lanes, request):
    """gradients flow back to every piece, the matching slice each"""
    nodeid = request.node.nodeid
    rows, columns, seed = inputs = decided.inputs_here(nodeid)
    pieces = on_lanes([torch.randn(n, columns) for n in rows], lanes, requires_grad=True)
    weight = gradients.output_weight(rows, columns, seed)
    (exercise.Gather.apply(lanes[HOME], 0, *pieces) * weight).sum().backward()
    grads = outputs.listed("grad", [p.grad for p in pieces])
    # The same pieces transposed, gathered along dim 1: the gradient splits along dim 1.
    pieces = on_lanes([torch.randn(columns, n) for n in rows], lanes, requires_grad=True)
    gathered = exercise.Gather.apply(lanes[HOME], 1, *pieces)
    try:
        (gathered * weight.t()).sum().backward()
    except RuntimeError as error:
        if isinstance(error, NotImplementedError):
            raise
        message = str(error).strip().splitlines()[0] if str(error).strip() else ""
        pytest.fail(
            f"gathered along dim 1, the backward raised {type(error).__name__} ({message}): "
            "split the gradient along the dim the forward concatenated (save it in ctx)",
            pytrace=False,
        )
    across = outputs.listed("across", [p.grad for p in pieces])
    decided.answer(nodeid, inputs, {**grads, **across})


def test_gather_backward_to_lanes(exercise, lanes, transfers, request):
    """the backward sends each gradient slice back to its piece's lane"""
    nodeid = request.node.nodeid
    rows, columns = inputs = decided.inputs_here(nodeid)
    values = [torch.randn(count, columns) for count in rows]
    pieces = on_lanes(values, lanes, requires_grad=True)
    result = exercise.Gather.apply(lanes[HOME], 0, *pieces)
    transfers.clear()
    result.sum().backward()
    decided.answer(nodeid, inputs, decided.pack_transfers(transfers))


def test_gather_scalar_backward(exercise, lanes, request):
    """a scalar piece gets a scalar gradient"""
    nodeid = request.node.nodeid
    count, seed = inputs = decided.inputs_here(nodeid)
    values, weight = shapes.scalar_pieces(count, seed)
    pieces = on_lanes(values, lanes, requires_grad=True)
    gathered = exercise.Gather.apply(lanes[HOME], 0, *pieces)
    # What backward itself returns: autograd would quietly reshape a 1-element gradient to
    # the scalar's shape before it reaches .grad, so .grad alone cannot tell.
    returned = gathered.grad_fn.apply(weight)[2:]
    (gathered * weight).sum().backward()
    grads = [p.grad for p in pieces]
    decided.answer(
        nodeid, inputs, {**outputs.listed("returned", returned), **outputs.listed("grad", grads)}
    )


def test_gather_containers(exercise, lanes, request):
    """gather handles dicts, lists, tuples, namedtuples and None"""
    # The grader's parent chose the sizes and values, and compares the structure and the
    # tensors sent back (dpkit.grading.structure).
    nodeid = request.node.nodeid
    rows, seed = inputs = decided.inputs_here(nodeid)
    gathered = exercise.gather(structure.replica_outputs(rows, seed, Result), lanes[HOME])
    wide = structure.columns_outputs(rows, seed)
    columns = exercise.gather(on_lanes_nested(wide, lanes), lanes[HOME], dim=1)
    decided.answer(
        nodeid, inputs, {**structure.pack([gathered]), **structure.pack([columns], structure.DIM)}
    )
    with must_raise(
        TypeError,
        f"gather(['a string', 'b'], lanes[{HOME}])",
        "outputs that are not tensors, None or containers of them cannot be gathered: "
        "raise TypeError naming the type",
    ):
        exercise.gather(["a string", "b"], lanes[HOME])
