"""More checks the parent decides: the tensors a primitive returns, judged against plain torch.

The surprise first: these checks compare what the student's code returns with torch's own
answer, and in the grading process that comparison can be fooled without touching the
harness: a tensor subclass whose ``torch.equal`` or ``torch.allclose`` always says yes
passes every such assert. Sent to the parent, a tensor is a plain one (:func:`encode
<dpkit.grading.decided.encode>` strips subclasses) and is compared there, against values
the parent regenerates from the seed it chose. Each function here is one side of a check
that :data:`dpkit.grading.decided.CHECKS` lists: the inputs the parent chooses, the values
both sides build from them, the judge (a hint, or None when right). The device placement
and storage checks in the same graders stay in the grading process.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import torch
from torch import nn

ALL_LANES = 4  # the graders' lanes fixture


def lane_values(shape: Sequence[int], count: int, seed: int) -> list[torch.Tensor]:
    """The tensors a check puts on ``count`` lanes: the same in the parent and the child."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(tuple(shape), generator=generator) for _ in range(count)]


def _listed(values: Mapping[str, torch.Tensor], prefix: str) -> list[torch.Tensor] | None:
    """The tensors named ``prefix0``, ``prefix1``, ... in order; None if any other is there."""
    found = [values.get(f"{prefix}{index}") for index in range(len(values))]
    if not all(isinstance(tensor, torch.Tensor) for tensor in found):
        return None
    return found  # type: ignore[return-value]


def listed(prefix: str, tensors: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` as the values a check sends: ``prefix0``, ``prefix1``, ..."""
    return {f"{prefix}{index}": tensor for index, tensor in enumerate(tensors)}


NOT_TENSORS = "the outputs sent for this check are not the tensors asked for"


# --------------------------------------------------------------------------------------
# Task 7's ring_allreduce_ at each size of the grader's parametrize: fresh values each run.

RING_SIZES = {  # the grader's ids, and the (shape, lanes) each stands for
    "10 over 4 lanes": ([10], 4),
    "3 over 4 lanes": ([3], 4),
    "2x3x5 over 3 lanes": ([2, 3, 5], 3),
    "7 on 1 lane": ([7], 1),
}


def ring_size_inputs(case: str):  # noqa: ANN201 - a ParentCheck's choose
    shape, count = RING_SIZES[case]
    return lambda rng: [shape, count, rng.randrange(2**62)]


def judge_ring_size(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    shape, count, seed = inputs
    sums = _listed(values, "lane")
    if sums is None or len(sums) != count:
        return NOT_TENSORS
    values = lane_values(shape, count, seed)
    want = sum(values)
    for index, got in enumerate(sums):
        if got.shape != want.shape or not torch.allclose(got, want, atol=1e-5):
            return ring_sum_hint(shape, count, index, got, values)
    return None


def ring_sum_hint(
    shape: Sequence[int], count: int, index: int, got: torch.Tensor, values: Sequence[torch.Tensor]
) -> str:
    """Why lane ``index`` does not hold the sum of ``values`` after a ring all-reduce: the
    chunks' sizes only when the elements they left out are the ones wrong (the end of the
    flat tensor, still the lane's own values); else the ring's steps, and how much is wrong."""
    want = sum(values)
    where = f"after ring_allreduce_ of shape {tuple(shape)} over {count} lane(s), lane {index}"
    if got.shape != want.shape:
        return (
            f"{where} holds a tensor of shape {tuple(got.shape)}, not {tuple(want.shape)}: sum "
            "into each lane's own tensor"
        )
    flat, own = got.reshape(-1), values[index].reshape(-1)
    wrong = ~torch.isclose(flat, want.reshape(-1), atol=1e-5)
    missed, numel = int(wrong.sum()), flat.numel()
    untouched = bool(torch.equal(flat[wrong], own[wrong]))
    if untouched and missed == numel:
        return (
            f"{where} still holds its own values: nothing was added to it (the n chunks must "
            f"cover all {numel} element(s), some empty when numel < n)"
        )
    if untouched and bool(wrong[numel - missed :].all()):
        return (
            f"{where} still holds its own values in its last {missed} element(s), which no "
            "chunk covered: the n chunks together must cover the whole flat tensor (nearly "
            "equal sizes, some empty when numel < n)"
        )
    return (
        f"{where} does not hold the sum in {missed} of its {numel} element(s): after n - 1 "
        "reduce-scatter steps lane i holds chunk (i + 1) % n summed; n - 1 all-gather steps "
        "pass those on"
    )


# --------------------------------------------------------------------------------------
# Task 1's scatter_tensor: torch.chunk's chunks of a fresh tensor over the 4 lanes.


# Rows that torch.chunk cuts into 4 chunks: not 9 (3 chunks of 3), which a correct
# scatter_tensor returns and the grader's per-lane checks would index past.
FOUR_CHUNK_ROWS = [rows for rows in range(7, 41) if len(torch.empty(rows).chunk(4)) == 4]


def scatter_input_inputs(rng: random.Random) -> list[int]:
    """A tensor's rows (7-40, making 4 chunks) and columns (1-5), and its values' seed."""
    return [rng.choice(FOUR_CHUNK_ROWS), rng.randint(1, 5), rng.randrange(2**62)]


def scatter_input(rows: int, columns: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, columns, generator=torch.Generator().manual_seed(seed))


def judge_scatter_chunks(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    rows, columns, seed = inputs
    chunks, want = _listed(values, "chunk"), scatter_input(rows, columns, seed).chunk(ALL_LANES)
    if chunks is None:
        return NOT_TENSORS
    if len(chunks) != len(want):
        return f"{rows} rows over 4 lanes make {len(want)} chunks, got {len(chunks)}"
    start = 0
    for index, (chunk, piece) in enumerate(zip(chunks, want)):
        if chunk.shape != piece.shape or not torch.equal(chunk, piece):
            return (
                f"chunk {index} of a ({rows}, {columns}) tensor is not its rows {start} to "
                f"{start + len(piece) - 1}, torch.chunk's chunk {index}"
            )
        start += len(piece)
    return None


# --------------------------------------------------------------------------------------
# Task 2's Broadcast.forward: every tensor on every lane, device by device.


def layout_inputs(rng: random.Random) -> list:
    """a's and b's shapes, and their values' seed (broadcast to the 4 lanes)."""
    return [[rng.randint(1, 6)], [rng.randint(1, 4), rng.randint(1, 4)], rng.randrange(2**62)]


def layout_tensors(shape_a: Sequence[int], shape_b: Sequence[int], seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(tuple(shape), generator=generator) for shape in (shape_a, shape_b)]


def judge_layout(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    sources = layout_tensors(*inputs)
    copies = _listed(values, "copy")
    if copies is None:
        return NOT_TENSORS
    if len(copies) != len(sources) * ALL_LANES:
        return f"2 tensors on 4 lanes make 8 copies, got {len(copies)}"
    for position, copy in enumerate(copies):
        lane, original = divmod(position, len(sources))
        source = sources[original]
        if copy.shape != source.shape or not torch.equal(copy, source):
            return (
                f"output {position} should be tensor {original} on lane {lane}: lay the copies "
                "out device by device, (a on d0, b on d0, a on d1, ...)"
            )
    return None


# --------------------------------------------------------------------------------------
# Task 5's data-parallel forward: its output and its gradients, against one device's.


def model_inputs(rng: random.Random) -> list[int]:
    """The model's and the batch's seed, and the batch's rows (5-16: every lane gets some)."""
    return [rng.randrange(2**62), rng.randint(5, 16)]


def seeded_model(seed: int) -> nn.Module:
    """The graders' small model (4 -> 8 -> 2), its parameters drawn from ``seed``: the same
    in the parent and the child, whatever torch's global generator holds."""
    module = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) / 2)
    return module


def seeded_batch(seed: int, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (rows, 4), y (rows, 2), and a second input (rows, 3) for the two-input module."""
    generator = torch.Generator().manual_seed(seed + 1)
    shapes = ((rows, 4), (rows, 2), (rows, 3))
    x, y, extra = (torch.randn(shape, generator=generator) for shape in shapes)
    return x, y, extra


def judge_forward(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    seed, rows = inputs
    x, _, extra = seeded_batch(seed, rows)
    out, product, lanes = (values.get(name) for name in ("out", "product", "lanes"))
    if not all(isinstance(t, torch.Tensor) for t in (out, product, lanes)):
        return NOT_TENSORS
    assert out is not None and product is not None and lanes is not None
    with torch.no_grad():
        want = seeded_model(seed)(x)
    if out.shape != want.shape:
        return f"expected one {tuple(want.shape)} output gathered from the replicas"
    if not torch.allclose(out, want, atol=1e-5):
        return "the output differs from module(x)"
    if product.shape != extra.shape or not torch.allclose(product, extra * extra.flip(0)):
        return "every positional input must be scattered, and the chunks passed as arguments"
    if lanes.dtype != torch.int64 or tuple(lanes.shape) != (2,):
        return NOT_TENSORS
    if lanes.tolist() != [0, 0]:
        where = next(lane for lane in lanes.tolist() if lane != 0)
        on = "on no lane" if where < 0 else f"on lane {where}"
        return (
            f"the output is {on}, not on devices[0] (lane 0): gather onto devices[0], where "
            "the labels and the loss are"
        )
    return None


def judge_gradients(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    seed, rows = inputs
    x, y, _ = seeded_batch(seed, rows)
    module = seeded_model(seed)
    nn.functional.mse_loss(module(x), y).backward()
    grads = _listed(values, "grad")
    named = list(module.named_parameters())
    if grads is None or len(grads) != len(named):
        return NOT_TENSORS
    for (name, parameter), got in zip(named, grads):
        assert parameter.grad is not None
        if got.shape != parameter.shape or not torch.isfinite(got).all():
            return f"{name} got no gradient through the data-parallel forward"
        # atol 1e-5: one device and four add in another order (4e-7 apart at most in 300 runs)
        if not torch.allclose(got, parameter.grad, atol=1e-5):
            return f"{name}.grad differs from one device"
    return None


# --------------------------------------------------------------------------------------
# Task 3: what apply_replica stores and what parallel_apply returns, replica by replica.


def replica_inputs(rng: random.Random) -> list:
    """2 to 4 replicas' factors (each multiplies its input), the input length and the
    inputs' seed; apply_replica's check uses the first two replicas, at indices 1-3."""
    count = rng.randint(2, ALL_LANES)
    factors = [round(rng.uniform(-3.0, 3.0), 2) for _ in range(count)]
    return [factors, rng.randint(1, 5), rng.sample(range(1, ALL_LANES), 2), rng.randrange(2**62)]


def replica_tensors(count: int, length: int, seed: int) -> list[torch.Tensor]:
    """One input per replica, and one more (a second positional argument)."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(length, generator=generator) for _ in range(count + 1)]


def judge_apply_replica(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    factors, length, (first, second), seed = inputs
    x = replica_tensors(len(factors), length, seed)
    keys, one, two = (values.get(name) for name in ("keys", "first", "second"))
    if not all(isinstance(t, torch.Tensor) for t in (keys, one, two)):
        return NOT_TENSORS
    assert keys is not None and one is not None and two is not None
    if keys.tolist() != [first]:
        return f"results should have key {first} only, got {keys.tolist()}"
    if one.shape != x[0].shape or not torch.allclose(one, factors[0] * x[0]):
        return f"results[{first}] is not module(input)"
    if two.shape != x[1].shape or not torch.allclose(two, factors[1] * x[1] + x[-1]):
        return "a tuple input holds the positional arguments: call module(*input)"
    three = values.get("third")
    if not isinstance(three, torch.Tensor):
        return NOT_TENSORS
    if three.shape != x[1].shape or not torch.allclose(three, factors[1] * x[1] + x[-1]):
        return "a list input holds the positional arguments too, as a tuple does: module(*input)"
    return None


def judge_in_order(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    factors, length, _, seed = inputs
    x = replica_tensors(len(factors), length, seed)
    got = _listed(values, "out")
    if got is None or len(got) != len(factors):
        return f"return a list with {len(factors)} outputs"
    for index, (out, factor, given) in enumerate(zip(got, factors, x)):
        if out.shape != given.shape or not torch.allclose(out, factor * given):
            return (
                f"output {index} is not replica {index}'s: keep outputs in replica order, "
                "not in the order the threads finished"
            )
    return None
