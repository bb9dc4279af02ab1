"""Grader for task 7: gradient all-reduce by hand against DataParallel's reduce-add.

Under ``dpkit grade`` the check that the ring leaves the sum on every lane and the check of
the bytes each lane sends are decided by the grader's parent process, from the tensors and
the copies sent back on inputs it chose (:mod:`dpkit.grading.decided`).
"""

import pytest
import torch

import dpkit
from dpkit.comm import copy_to
from dpkit.grading import counted, decided, outputs
from dpkit.grading.checks import must_raise

pytestmark = pytest.mark.task7
EXERCISE = "task7_allreduce.py"
FORBIDDEN = ("torch.distributed.all_reduce", "torch.distributed.reduce_scatter")


def test_ring_sums_in_place(exercise, lanes, request):
    """ring_allreduce_ leaves the sum on every lane, in place"""
    # The grader's parent chose the shapes and the values' seed, and judges the sums sent
    # back (dpkit.grading.decided); where they are written is checked here.
    nodeid = request.node.nodeid
    cases = decided.inputs_here(nodeid)
    sums = []
    for shape, count, seed in cases:
        values = decided.lane_values(shape, count, seed)
        tensors = [copy_to(v.clone(), lane, "setup") for v, lane in zip(values, lanes)]
        pointers = [t.data_ptr() for t in tensors]
        result = exercise.ring_allreduce_(tensors, lanes[:count])
        assert result is None, "ring_allreduce_ works in place and returns None"
        assert [t.data_ptr() for t in tensors] == pointers, "write into the tensors' own storage"
        sums += [tensor.reshape(-1) for tensor in tensors]
    decided.answer(nodeid, cases, {"sums": torch.cat(sums)})


@pytest.mark.parametrize(
    "shape, count",
    [((10,), 4), ((3,), 4), ((2, 3, 5), 3), ((7,), 1)],
    ids=["10 over 4 lanes", "3 over 4 lanes", "2x3x5 over 3 lanes", "7 on 1 lane"],
)
def test_ring_any_size(exercise, lanes, shape, count, request):
    """ring_allreduce_ works for any size and any number of lanes"""
    nodeid = request.node.nodeid
    inputs = decided.inputs_here(nodeid)  # the shape and lanes above, a fresh seed
    values = decided.lane_values(shape, count, inputs[-1])
    tensors = [
        copy_to(v.clone(), lane, "setup") for v, lane in zip(values, lanes[:count], strict=True)
    ]
    exercise.ring_allreduce_(tensors, lanes[:count])
    decided.answer(nodeid, inputs, outputs.listed("lane", tensors))


def test_ring_traffic(exercise, lanes, transfers, request):
    """in the ring each lane sends 2(n-1)/n of a gradient, only to its neighbour"""
    nodeid = request.node.nodeid
    chunk, count = inputs = decided.inputs_here(nodeid)
    tensors = [copy_to(torch.randn(chunk * count), lane, "setup") for lane in lanes[:count]]
    transfers.clear()
    exercise.ring_allreduce_(tensors, lanes[:count])
    decided.answer(nodeid, inputs, decided.pack_transfers(transfers))


def test_traffic_per_lane(exercise, lanes, request):
    """traffic_per_lane counts the bytes each lane sends and receives"""
    nodeid = request.node.nodeid
    inputs = decided.inputs_here(nodeid)
    x = torch.randn(inputs[0])  # on the host: lane 0's memory

    def run():
        on_one = copy_to(x, lanes[1], "test")
        copy_to(on_one, lanes[2], "test")
        copy_to(x, lanes[2], "test")

    traffic = exercise.traffic_per_lane(run)
    decided.answer(nodeid, inputs, counted.pack_traffic(dict(traffic)))
    listening = dict(dpkit.comm._listeners)
    with must_raise(
        KeyError,
        "traffic_per_lane(run) where run raises KeyError",
        "let the error of run() through, and remove the listener anyway (try/finally)",
    ):
        exercise.traffic_per_lane(lambda: {}["boom"])
    left = [key for key in dpkit.comm._listeners if key not in listening]
    assert not left, (
        "traffic_per_lane(run) left its transfer listener registered when run raised: it "
        "would count every later copy; remove it in a finally block"
    )


def test_ddp_gradients_match_dataparallel(exercise, lanes, transfers, request):
    """all-reduced replica gradients equal DataParallel's gradients"""
    # The grader's parent chose the model and batch, and compares the replicas' gradients
    # with one device's (which DataParallel's equal) by plain autograd.
    nodeid = request.node.nodeid
    seed, rows = inputs = decided.inputs_here(nodeid)
    x, y, _ = outputs.seeded_batch(seed, rows)
    replicas = [outputs.seeded_model(seed) for _ in lanes]
    for replica, xs, ys in zip(replicas, x.chunk(len(lanes)), y.chunk(len(lanes))):
        # each lane's share of the full-batch mean, so the sum is DataParallel's loss
        ((replica(xs) - ys) ** 2).sum().div(y.numel()).backward()
    transfers.clear()
    exercise.allreduce_gradients_(replicas, lanes)
    hops = {(t.source.index, t.destination.index) for t in transfers}
    ring = {(i, (i + 1) % len(lanes)) for i in range(len(lanes))}
    assert hops == ring, (
        f"allreduce_gradients_ copied between lanes {sorted(hops)}; the ring copies only "
        f"{sorted(ring)}: sum each parameter's .grad with ring_allreduce_"
    )
    grads = [p.grad for replica in replicas for p in replica.parameters()]
    decided.answer(nodeid, inputs, outputs.listed("grad", grads))


def test_compare_traffic(exercise, lanes, request):
    """reduce-add loads lane 0 with (n-1)N bytes; the ring spreads 2(n-1)/n N over all"""
    nodeid = request.node.nodeid
    count, chunk = inputs = decided.inputs_here(nodeid)
    traffic = exercise.compare_traffic(lanes[:count], count * chunk)
    assert set(traffic) == {"reduce_add", "ring"}, f"keys are {sorted(traffic)}"
    values = {
        **counted.pack_traffic(dict(traffic["reduce_add"]), "reduce_add"),
        **counted.pack_traffic(dict(traffic["ring"]), "ring"),
    }
    decided.answer(nodeid, inputs, values)
