"""More checks the parent decides: shapes and counts (chunks along a dim, scalar gradients,
replicas per lane), sent as tensors and judged for sizes the parent chose.

The surprise first: these checks were about structure, not values, so they were compared
in the grading process with ``==`` on lists and tuples (which a subclass answers as it
likes) and always on the same sizes (which a submission could recognise). Here the parent
picks the sizes and the seed, and compares shapes and values it regenerates. Each function
here is one side of a check that :data:`dpkit.grading.decided.CHECKS` lists.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

import torch

from dpkit.grading.outputs import ALL_LANES, NOT_TENSORS


def _listed(values: Mapping[str, torch.Tensor], prefix: str) -> list[torch.Tensor] | None:
    found = []
    while f"{prefix}{len(found)}" in values:
        found.append(values[f"{prefix}{len(found)}"])
    return found if all(isinstance(t, torch.Tensor) for t in found) else None


# --------------------------------------------------------------------------------------
# Task 1: scatter_tensor along dim 1, and a batch smaller than the lanes.


def dim_inputs(rng: random.Random) -> list[int]:
    """A (rows, columns, depth) tensor split along its columns (4-12), a batch of 1-3 rows,
    and the values' seed."""
    return [rng.randint(1, 3), rng.randint(4, 12), rng.randint(1, 4), rng.randint(1, 3)] + [
        rng.randrange(2**62)
    ]


def dim_tensors(rows: int, columns: int, depth: int, small: int, seed: int):  # noqa: ANN201
    """The tensor split along dim 1 and the small batch: the same in the parent and child."""
    generator = torch.Generator().manual_seed(seed)
    wide = torch.randn(rows, columns, depth, generator=generator)
    return wide, torch.randn(small, 2, generator=generator)


def judge_dim(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    wide, small = dim_tensors(*inputs)
    along, few = _listed(values, "dim"), _listed(values, "small")
    if along is None or few is None:
        return NOT_TENSORS
    want = wide.chunk(ALL_LANES, dim=1)
    shapes = [tuple(chunk.shape) for chunk in along]
    if shapes != [tuple(chunk.shape) for chunk in want] or not all(
        torch.equal(got, piece) for got, piece in zip(along, want)
    ):
        return (
            f"{wide.shape[1]} columns over 4 lanes along dim=1 should give chunks of shapes "
            f"{[tuple(c.shape) for c in want]}, got {shapes}; split along dim, not along rows"
        )
    if len(few) != len(small) or not all(
        torch.equal(got, row) for got, row in zip(few, small.chunk(ALL_LANES))
    ):
        return f"{len(small)} rows over 4 lanes make {len(small)} chunks, got {len(few)}"
    return None


# --------------------------------------------------------------------------------------
# Task 4: a scalar piece's gradient, as Gather.backward returns it and as .grad holds it.


def scalar_grad_inputs(rng: random.Random) -> list[int]:
    """Scalar pieces (2-4) and the seed of their values and of the output's gradient."""
    return [rng.randint(2, ALL_LANES), rng.randrange(2**62)]


def scalar_pieces(count: int, seed: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(count, generator=generator)
    return list(values.unbind()), torch.randn(count, generator=generator)


def judge_scalar_grad(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    count, seed = inputs
    _, weight = scalar_pieces(count, seed)
    returned, grads = _listed(values, "returned"), _listed(values, "grad")
    if returned is None or grads is None or len(returned) != count or len(grads) != count:
        return NOT_TENSORS
    shapes = [tuple(g.shape) for g in returned]
    if shapes != [()] * count:
        return (
            f"Gather.backward returned gradients of shapes {shapes} for {count} scalar pieces; "
            "a scalar piece needs a gradient of shape (): view each slice as a scalar"
        )
    for got, want in zip((*returned, *grads), (*weight.unbind(), *weight.unbind())):
        if got.shape != () or not torch.equal(got, want):
            return "a scalar piece's gradient is not its entry of the output's gradient"
    return None


# --------------------------------------------------------------------------------------
# Task 5: which lanes the data-parallel forward runs a replica on.


def lanes_inputs(rng: random.Random) -> list[int]:
    """A batch of 5-16 rows (as many replicas as torch.chunk makes chunks), one of 1-3 rows
    (fewer replicas than lanes), and the model's and batches' seed."""
    return [rng.randint(5, 16), rng.randint(1, 3), rng.randrange(2**62)]


def judge_lanes(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    rows, few, _ = inputs
    big, small, one = (values.get(name) for name in ("big", "small", "one"))
    if not all(isinstance(t, torch.Tensor) and t.dtype == torch.int64 for t in (big, small, one)):
        return NOT_TENSORS
    assert big is not None and small is not None and one is not None
    chunks = len(torch.empty(rows).chunk(ALL_LANES))
    ran = sorted(index for index in big.tolist() if index >= 0)  # -1: no lane (not a replica)
    if ran != list(range(chunks)):
        return (
            f"replicas ran on lanes {ran}; expected one on each of the "
            f"{chunks} lanes that got a chunk of {rows} rows (through dpkit.parallel_apply)"
        )
    if len(small) != few:
        return (
            f"{few} rows over 4 lanes should run {few} replicas, ran {len(small)}: replicate "
            "only onto the devices that got a chunk"
        )
    if len(one) != 1:
        return "with one device, run the module once, directly"
    return None
