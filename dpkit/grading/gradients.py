"""More checks the parent decides: the gradients autograd leaves after the student's backward.

The surprise first: a ``.grad`` can be made to agree with anything in the grading process
(a hook that turns it into a tensor subclass whose ``torch.equal`` says yes), so these
checks send the gradients as plain tensors and the parent compares them with plain
autograd's, on a model or tensors it regenerates from the seed it chose. Each function
here is one side of a check that :data:`dpkit.grading.decided.CHECKS` lists.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from dpkit.grading.outputs import ALL_LANES, NOT_TENSORS, seeded_batch, seeded_model


def _listed(values: Mapping[str, torch.Tensor], prefix: str, count: int) -> list | None:
    found = [values.get(f"{prefix}{index}") for index in range(count)]
    return found if all(isinstance(t, torch.Tensor) for t in found) else None


# --------------------------------------------------------------------------------------
# Task 1: the input's gradient through scatter_tensor's chunks.


def scatter_grad_inputs(rng: random.Random) -> list[int]:
    """The input's rows (5-40) and columns (1-5), and the seed of each chunk's weight."""
    return [rng.randint(5, 40), rng.randint(1, 5), rng.randrange(2**62)]


def chunk_weights(rows: int, columns: int, seed: int) -> list[torch.Tensor]:
    """A weight per torch.chunk chunk of a (rows, columns) input over the 4 lanes: the loss
    is the sum of weight * chunk, so the input's gradient is the weights, stacked."""
    generator = torch.Generator().manual_seed(seed)
    shapes = [chunk.shape for chunk in torch.empty(rows, columns).chunk(ALL_LANES)]
    return [torch.randn(shape, generator=generator) for shape in shapes]


def judge_scatter_grad(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    want = torch.cat(chunk_weights(*inputs))
    got = values.get("grad")
    if not isinstance(got, torch.Tensor):
        return NOT_TENSORS
    if got.shape != want.shape or not torch.equal(got, want):
        return "x.grad is wrong: each row's gradient comes from its chunk"
    return None


# --------------------------------------------------------------------------------------
# Task 4: each piece's gradient through Gather.


def gather_grad_inputs(rng: random.Random) -> list:
    """Four pieces' rows (1-5), their columns (1-4), and the seed of the output's weight."""
    return [[rng.randint(1, 5) for _ in range(ALL_LANES)], rng.randint(1, 4), rng.randrange(2**62)]


def output_weight(rows: Sequence[int], columns: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(sum(rows), columns, generator=generator)


def judge_gather_grad(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    """The pieces gathered along dim 0 (``grad0``, ...), then the same pieces transposed,
    gathered along dim 1 with the weight transposed (``across0``, ...)."""
    rows, columns, seed = inputs
    grads = _listed(values, "grad", len(rows))
    across = _listed(values, "across", len(rows))
    if grads is None or across is None:
        return NOT_TENSORS
    for index, (got, want) in enumerate(zip(grads, output_weight(*inputs).split(rows))):
        if got.shape != want.shape or not torch.equal(got, want):
            return (
                f"piece {index}'s gradient is not its slice of the output gradient: split by "
                "the sizes saved in forward"
            )
    for index, (got, want) in enumerate(zip(across, output_weight(*inputs).split(rows))):
        if got.shape != want.t().shape or not torch.equal(got, want.t()):
            return (
                f"gathered along dim 1, piece {index}'s gradient is not its slice of the output "
                "gradient: split it along the dim the forward concatenated (save it in ctx)"
            )
    return None


# --------------------------------------------------------------------------------------
# Task 2: replicate's outputs and the gradients its replicas add up in the module.


def replica_inputs(rng: random.Random) -> list[int]:
    """The model's and the batch's seed, the batch's rows (2-8) and the replicas (2-4)."""
    return [rng.randrange(2**62), rng.randint(2, 8), rng.randint(2, ALL_LANES)]


def judge_replica_outputs(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    seed, rows, _ = inputs
    got = _listed(values, "out", ALL_LANES)
    if got is None:
        return NOT_TENSORS
    x, _, _ = seeded_batch(seed, rows)
    with torch.no_grad():
        want = seeded_model(seed)(x)
    for index, out in enumerate(got):
        if out.shape != want.shape or not torch.allclose(out, want, atol=1e-6):
            return f"replica {index} computes something else"
    return None


def judge_replica_grads(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    seed, rows, count = inputs
    model = seeded_model(seed)
    named = list(model.named_parameters())
    grads = _listed(values, "grad", len(named))
    if grads is None:
        return NOT_TENSORS
    x, _, _ = seeded_batch(seed, rows)
    (count * model(x).pow(2).sum()).backward()
    for (name, parameter), got in zip(named, grads):
        assert parameter.grad is not None
        if got.shape != parameter.shape or not torch.allclose(got, parameter.grad, atol=1e-5):
            return (
                f"{name}.grad is not the sum over the {count} replicas: one Broadcast.apply "
                "over all parameters, whose backward reduce-adds"
            )
    return None


# --------------------------------------------------------------------------------------
# Task 7: replicas' gradients after allreduce_gradients_, against one device's.


def ddp_inputs(rng: random.Random) -> list[int]:
    """The model's and the batch's seed, and the batch: 4 x 2-4 rows, a chunk per lane."""
    return [rng.randrange(2**62), ALL_LANES * rng.randint(2, 4)]


def judge_ddp_grads(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    seed, rows = inputs
    model = seeded_model(seed)
    named = list(model.named_parameters())
    grads = _listed(values, "grad", ALL_LANES * len(named))
    if grads is None:
        return NOT_TENSORS
    x, y, _ = seeded_batch(seed, rows)
    nn.functional.mse_loss(model(x), y).backward()  # what DataParallel's gradients equal
    for position, got in enumerate(grads):
        replica, (name, parameter) = divmod(position, len(named))[0], named[position % len(named)]
        assert parameter.grad is not None
        if got.shape != parameter.shape or not torch.allclose(got, parameter.grad, atol=1e-5):
            if got.shape == parameter.shape and torch.allclose(
                got * ALL_LANES, parameter.grad, atol=1e-5
            ):  # real DDP's average, which the task does not ask for
                return (
                    f"replica {replica}'s {name}.grad is DataParallel's divided by {ALL_LANES}, "
                    f"the number of replicas (off by a factor n = {ALL_LANES}): "
                    "allreduce_gradients_ leaves the sum over the replicas, not the average "
                    "real DDP takes"
                )
            first = position % len(named)  # replica 0's gradient of this parameter
            if any(
                grads[first + r * len(named)].shape != got.shape
                or not torch.allclose(grads[first + r * len(named)], got, atol=1e-5)
                for r in range(ALL_LANES)
            ):
                return (
                    f"replica {replica}'s {name}.grad differs from DataParallel's, and the "
                    f"replicas do not all hold the same {name}.grad: after the all-reduce every "
                    "replica holds the sum (ring_allreduce_'s own checks test the ring)"
                )
            return (
                f"replica {replica}'s {name}.grad differs from DataParallel's: all-reduce every "
                "parameter's .grad across the replicas"
            )
    return None
