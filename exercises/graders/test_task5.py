"""Grader for task 5: compose DataParallel and prove gradient equivalence.

Under ``dpkit grade`` every check is decided by the grader's parent process, from the
outputs, gradients, losses, differences and lanes sent back for a model and batches it
chose (:mod:`dpkit.grading.decided`).
"""

import threading

import pytest
import torch
from torch import nn

import dpkit
from dpkit.grading import counted, decided, outputs
from dpkit.grading.rules import lent
from dpkit.lanes import resides_on

pytestmark = pytest.mark.task5
EXERCISE = "task5_data_parallel.py"
FORBIDDEN = (
    "dpkit.data_parallel.DataParallel.__init__",
    "dpkit.data_parallel.DataParallel.forward",
    "dpkit.data_parallel.data_parallel",
)


def lane_of(tensor, lanes) -> int:  # noqa: ANN001
    """The index of the lane ``tensor`` is on, -1 if none (the parent wants lane 0)."""
    return next((i for i, lane in enumerate(lanes) if resides_on(tensor, lane)), -1)


class Pairwise(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * b


def test_forward_matches_module(exercise, lanes, request):
    """the data-parallel forward computes module(x)"""
    nodeid = request.node.nodeid
    seed, rows = inputs = decided.inputs_here(nodeid)
    x, _, extra = outputs.seeded_batch(seed, rows)
    out = exercise.data_parallel_forward(outputs.seeded_model(seed), (x,), lanes)
    assert isinstance(out, torch.Tensor), "expected one output gathered from the replicas"
    product = exercise.data_parallel_forward(Pairwise(), (extra, extra.flip(0)), lanes)
    on = [lane_of(t, lanes) if isinstance(t, torch.Tensor) else -1 for t in (out, product)]
    where = torch.tensor(on, dtype=torch.int64)  # gathered on devices[0]: both on lane 0
    decided.answer(nodeid, inputs, {"out": out, "product": product, "lanes": where})


def test_forward_uses_lanes(exercise, lanes, request):
    """one replica runs per lane that got a chunk, on that lane"""
    nodeid = request.node.nodeid
    rows, few, seed = inputs = decided.inputs_here(nodeid)
    module = outputs.seeded_model(seed)
    seen = {"big": [], "small": [], "one": []}
    for name, count, on in (("big", rows, lanes), ("small", few, lanes), ("one", few, lanes[:1])):
        hook = module.register_forward_hook(
            lambda *_, into=seen[name]: into.append(dpkit.current_device())
        )
        exercise.data_parallel_forward(module, (outputs.seeded_batch(seed, count)[0],), on)
        hook.remove()
    # the replicas run at the same time: each waits at a barrier for all the others
    chunks = len(torch.empty(rows).chunk(len(lanes)))
    barrier = threading.Barrier(chunks, timeout=3)

    def meet_the_others(*_):  # noqa: ANN002, ANN202 (a forward hook must return None)
        barrier.wait()

    hook = module.register_forward_hook(meet_the_others)
    try:
        exercise.data_parallel_forward(module, (outputs.seeded_batch(seed, rows)[0],), lanes)
    except threading.BrokenBarrierError:
        pytest.fail(
            "the replicas did not run at the same time: give dpkit.parallel_apply all of "
            "them in one call",
            pytrace=False,
        )
    finally:
        hook.remove()
    lanes_seen = {
        name: torch.tensor([-1 if d is None else d.index for d in found], dtype=torch.int64)
        for name, found in seen.items()
    }
    decided.answer(nodeid, inputs, lanes_seen)


def test_gradients_match_single_device(exercise, lanes, request):
    """data-parallel gradients equal single-device gradients"""
    nodeid = request.node.nodeid
    seed, rows = inputs = decided.inputs_here(nodeid)
    x, y, _ = outputs.seeded_batch(seed, rows)
    parallel = outputs.seeded_model(seed)
    nn.functional.mse_loss(exercise.data_parallel_forward(parallel, (x,), lanes), y).backward()
    grads = []
    for name, parameter in parallel.named_parameters():
        assert parameter.grad is not None, (
            f"{name} got no gradient through the data-parallel forward"
        )
        grads.append(parameter.grad)
    decided.answer(nodeid, inputs, outputs.listed("grad", grads))


def test_train_step(exercise, lanes, request):
    """three data-parallel SGD steps train exactly like one device"""
    nodeid = request.node.nodeid
    seed, rows = inputs = decided.inputs_here(nodeid)
    x, y, _ = outputs.seeded_batch(seed, rows)
    parallel = outputs.seeded_model(seed)
    optimizer = torch.optim.SGD(parallel.parameters(), lr=counted.LEARNING_RATE)
    losses = []
    for _ in range(counted.STEPS):
        got = exercise.train_step(parallel, optimizer, x, y, lanes)
        assert isinstance(got, float), f"train_step should return a float, got {type(got)}"
        losses.append(got)
    values = outputs.listed("param", [p.detach() for p in parallel.parameters()])
    decided.answer(nodeid, inputs, {**values, "losses": torch.tensor(losses, dtype=torch.float64)})


def max_difference(exercise, lanes, request, forward=None) -> None:
    """Run max_gradient_difference on each of the parent's models and batches, send what
    it returns."""
    nodeid = request.node.nodeid
    inputs = decided.inputs_here(nodeid)
    extra = () if forward is None else (forward,)
    sent = []
    for seed, rows in inputs:
        x, y, _ = outputs.seeded_batch(seed, rows)
        make = lent(lambda seed=seed: outputs.seeded_model(seed))
        difference = exercise.max_gradient_difference(make, x, y, lanes, *extra)
        assert isinstance(difference, float), f"return a float, got {type(difference).__name__}"
        sent.append(float(difference))
    decided.answer(nodeid, inputs, {"difference": torch.tensor(sent, dtype=torch.float64)})


def test_gradient_difference_small(exercise, lanes, request):
    """max_gradient_difference is tiny for a correct data-parallel forward"""
    max_difference(exercise, lanes, request)


def test_gradient_difference_detects_errors(exercise, lanes, request):
    """max_gradient_difference detects a wrong forward"""
    max_difference(exercise, lanes, request, lent(counted.first_rows_only))
