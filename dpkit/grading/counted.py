"""More checks the parent decides: the numbers a student's function returns (bytes, losses).

The surprise first: a number compared in the grading process can agree with anything. A
``float`` subclass whose ``<`` and ``>`` always say yes passes both "the difference is
tiny" and "the difference is large"; a ``tuple`` subclass whose ``==`` says yes passes a
traffic table compared with ``==``. Sent to the parent as a tensor, a number is only its
value, judged against what the parent computes for the sizes and seeds it chose. Each
function here is one side of a check that :data:`dpkit.grading.decided.CHECKS` lists.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from dpkit.grading.outputs import NOT_TENSORS, seeded_batch, seeded_model

FLOAT = 4  # bytes per float32 element

# --------------------------------------------------------------------------------------
# Task 7: traffic tables, {lane: (sent, received)}, sent as (lane, sent, received) rows.


def pack_traffic(traffic: Mapping[Any, Any], name: str = "traffic") -> dict[str, torch.Tensor]:
    rows = [[int(lane), int(sent), int(received)] for lane, (sent, received) in traffic.items()]
    return {name: torch.tensor(rows, dtype=torch.int64).reshape(-1, 3)}


def _table(values: Mapping[str, torch.Tensor], name: str) -> dict[int, tuple[int, int]] | None:
    rows = values.get(name)
    if not isinstance(rows, torch.Tensor) or rows.dtype != torch.int64 or rows.ndim != 2:
        return None
    if rows.shape[1] != 3 or len(set(rows[:, 0].tolist())) != len(rows):
        return None
    return {int(lane): (int(sent), int(got)) for lane, sent, got in rows.tolist()}


def traffic_inputs(rng: random.Random) -> list[int]:
    """The elements (1-50) of the tensor the check's run copies three times."""
    return [rng.randint(1, 50)]


def judge_traffic(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    nbytes = inputs[0] * FLOAT  # the run: lane 0 -> 1, 1 -> 2, lane 0 -> 2
    table, want = _table(values, "traffic"), {0: (2 * nbytes, 0), 1: (nbytes, nbytes)}
    want[2] = (0, 2 * nbytes)
    if table is None:
        return "the outputs sent for traffic_per_lane are not a table of lanes"
    if table != want:
        return (
            f"got {table}, expected {want}: sum Transfer.nbytes by source (sent) and by "
            "destination (received); the host (-1) counts as lane 0"
        )
    return None


def compare_inputs(rng: random.Random) -> list[int]:
    """Lanes (3 or 4) and elements per lane's chunk (10-300): numel = lanes * chunk."""
    return [rng.randint(3, 4), rng.randint(10, 300)]


def judge_compare(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    lanes, chunk = inputs
    nbytes = lanes * chunk * FLOAT
    reduce_add, ring = _table(values, "reduce_add"), _table(values, "ring")
    if reduce_add is None or ring is None:
        return "the outputs sent for compare_traffic are not two tables of lanes"
    want_reduce = {0: (0, (lanes - 1) * nbytes), **{i: (nbytes, 0) for i in range(1, lanes)}}
    if reduce_add != want_reduce:
        return (
            f"reduce_add traffic {reduce_add}, expected {want_reduce}: measure only the "
            "reduce_add call, with traffic_per_lane"
        )
    share = 2 * (lanes - 1) * chunk * FLOAT
    want_ring = {lane: (share, share) for lane in range(lanes)}
    if ring != want_ring:
        return f"ring traffic {ring}, expected {want_ring}"
    return None


# --------------------------------------------------------------------------------------
# Task 5: train_step's losses and parameters, max_gradient_difference's numbers.

STEPS, LEARNING_RATE = 3, 0.1


def train_inputs(rng: random.Random) -> list[int]:
    """The model's and the batch's seed, and the batch's rows (8-16)."""
    return [rng.randrange(2**62), rng.randint(8, 16)]


def judge_train(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    seed, rows = inputs
    losses = values.get("losses")
    model = seeded_model(seed)
    params = [values.get(f"param{i}") for i in range(len(list(model.parameters())))]
    if not isinstance(losses, torch.Tensor) or losses.shape != (STEPS,):
        return NOT_TENSORS
    if not all(isinstance(p, torch.Tensor) for p in params):
        return NOT_TENSORS
    x, y, _ = seeded_batch(seed, rows)
    for step, got in enumerate(losses.tolist()):
        # plain SGD by hand: torch.optim's first step costs the parent 1.5 s of imports
        model.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        with torch.no_grad():
            for parameter in model.parameters():
                assert parameter.grad is not None
                parameter -= LEARNING_RATE * parameter.grad
        if not abs(got - loss.item()) < 1e-5:
            return (
                f"step {step}: loss {got} differs from one device's {loss.item()}; zero the "
                "gradients first and use mse_loss on the gathered output"
            )
    for got, want in zip(params, model.parameters()):
        assert isinstance(got, torch.Tensor)
        if got.shape != want.shape or not torch.allclose(got, want.detach(), atol=1e-5):
            return "after 3 steps the parameters differ"
    return None


def difference_inputs(rng: random.Random) -> list[list[int]]:
    """Two (seed, rows) cases, the rows 6-16 (the wrong forward drops all but the first 3
    from backward). In the first, the largest difference between one device's gradients and
    the wrong forward's is positive; in the second, negative: a signed maximum (no
    ``.abs()``) misses one of them on every run, whichever way round it subtracts."""
    cases: dict[bool, list[int]] = {}
    while len(cases) < 2:
        seed, rows = rng.randrange(2**62), rng.randint(6, 16)
        largest, smallest = _signed_extremes(_dropped_rows_differences(seed, rows))
        cases.setdefault(largest >= -smallest, [seed, rows])
    return [cases[True], cases[False]]


def _differences(values: Mapping[str, torch.Tensor], count: int) -> list[float] | None:
    sent = values.get("difference")
    if not isinstance(sent, torch.Tensor) or sent.dtype != torch.float64 or sent.numel() != count:
        return None
    return sent.tolist()


def judge_difference_small(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    differences = _differences(values, len(inputs))
    if differences is None:
        return NOT_TENSORS
    for difference in differences:
        if not 0.0 <= difference < 1e-5:
            return f"got {difference}; equal gradients differ by ~1e-7 at most"
    return None


def first_rows_only(module: nn.Module, inputs: tuple, devices: Any) -> torch.Tensor:
    """The wrong forward the check hands over: rows after the first 3 leave backward."""
    return torch.cat([module(inputs[0][:3]), module(inputs[0][3:]).detach()])


def _dropped_rows_differences(seed: int, rows: int) -> list[torch.Tensor]:
    """One device's gradients minus those through :func:`first_rows_only`, per parameter."""
    x, y, _ = seeded_batch(seed, rows)
    single, wrong = seeded_model(seed), seeded_model(seed)
    nn.functional.mse_loss(single(x), y).backward()
    nn.functional.mse_loss(first_rows_only(wrong, (x,), None), y).backward()
    pairs = zip(single.parameters(), wrong.parameters())
    return [a.grad - b.grad for a, b in pairs]  # type: ignore[operator]


def _signed_extremes(differences: list[torch.Tensor]) -> tuple[float, float]:
    return max(d.max().item() for d in differences), min(d.min().item() for d in differences)


def judge_difference_large(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    differences = _differences(values, len(inputs))
    if differences is None:
        return NOT_TENSORS
    for (seed, rows), difference in zip(inputs, differences):
        largest, smallest = _signed_extremes(_dropped_rows_differences(seed, rows))
        want = max(largest, -smallest)
        if abs(difference - want) <= 1e-3 * want:
            continue
        signed = min(largest, -smallest)  # the signed maximum that is not the largest
        fix = (
            "take the largest absolute difference: .abs() before .max(), since a gradient "
            "may be smaller than one device's as well as larger"
            if abs(difference - signed) <= 1e-3 * abs(signed)
            else "compare the .grad of every parameter, using the forward you are given"
        )
        return (
            f"a forward that drops {rows - 3} of {rows} rows from backward gave a difference "
            f"of {difference}, not the largest one, {want:.6g}; {fix}"
        )
    return None
