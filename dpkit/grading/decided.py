"""Checks the parent decides: the student's outputs come back as data, the verdict is made here.

The surprise first: the grading process runs the student's code, so everything behind its
word (the harness, its key, the graders' asserts) is within the submission's reach. So
every check of the graders is listed here and decided the other way round (see the threat
model in docs/instructors.md):

- the parent (:mod:`dpkit.grading.sandbox`, which never imports a submission) chooses the
  inputs afresh for every run and hands them over in the run's environment;
- in the grading process the check calls the student's function on them, and sends the
  outputs as tensors (``torch.save``; read back with ``torch.load(weights_only=True)``,
  never unpickled as objects) with its signed record;
- the parent computes the right outputs itself, from its own copy of the inputs, and a
  check passes only if the grading process said so *and* the values it sent are right. A
  forged "passed" record, a swapped ``torch.equal`` or an ``__eq__`` that always agrees in
  the grading process gain nothing here; a check it leaves out of its records fails (the
  list of checks is the graders', :mod:`dpkit.grading.roster`).

Two kinds: checks of the values a student's function returns, and checks of the copies a
primitive makes between lanes, which the grading process's transfer listener sees and
sends as (source lane, destination lane, bytes) rows; the parent computes the copies the
sizes it chose call for. A grader calls :func:`inputs_here` and :func:`answer`, which
judges the values as the parent will (the hint, and the verdict of a grader run on its
own) and sends them.

The inputs are all sent at once, before the submission is imported: they are fresh, so
no answer can have been stored in advance, and a pure function of two numbers gains
nothing from seeing the next input early. The grading process still computes the outputs,
so whether it used the student's own function (and no forbidden one) is the forbidden-call
rules' to police, as for every check.
"""

from __future__ import annotations

import base64
import io
import json
import math
import os
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dpkit.grading import (
    conduct,
    counted,
    gradients,
    identity,
    outputs,
    shapes,
    structure,
    weighted,
)
from dpkit.grading.outputs import lane_values

ENVIRONMENT = "DPKIT_PARENT_INPUTS"  # the inputs the parent chose, as JSON, by check
VALUES_LIMIT = 256 * 1024  # characters of encoded values a check may send
MISSING = (
    "the grading process sent no readable outputs for this check; the grader decides it from the "
    "values your functions return"
)


@dataclass(frozen=True)
class ParentCheck:
    """A check the parent decides: where it is, its name (the test's docstring line), how
    the parent chooses its inputs and judges the outputs (a hint, or None when right)."""

    task: int
    test: str
    name: str
    choose: Callable[[random.Random], list]
    judge: Callable[[list, Mapping[str, torch.Tensor]], str | None]

    @property
    def key(self) -> str:
        return f"test_task{self.task}.py::{self.test}"


# --------------------------------------------------------------------------------------
# Task 1's chunk_sizes, for any batch and device count.


def chunk_sizes_inputs(rng: random.Random) -> list[list[int]]:
    """A hundred (batch, devices) pairs, smallest first (the first failure shown is the
    smallest), with the edges of the range among them."""
    pairs = {(1, 1), (1, 16), (16, 16), (17, 16), (300, 16), (300, 1)}
    while len(pairs) < 100:
        pairs.add((rng.randint(1, 300), rng.randint(1, 16)))
    return [list(pair) for pair in sorted(pairs)]


def pack_sizes(answers: Sequence[Sequence[int]]) -> dict[str, torch.Tensor]:
    """Lists of chunk sizes as two tensors: every size in a row, and each list's length."""
    flat = [size for sizes in answers for size in sizes]
    return {
        "sizes": torch.tensor(flat, dtype=torch.int64),
        "lengths": torch.tensor([len(sizes) for sizes in answers], dtype=torch.int64),
    }


def judge_chunk_sizes(pairs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    sizes, lengths = values.get("sizes"), values.get("lengths")
    for tensor in (sizes, lengths):
        if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.int64 or tensor.ndim != 1:
            return "the outputs sent for chunk_sizes are not the lists of sizes asked for"
    assert sizes is not None and lengths is not None
    if len(lengths) != len(pairs) or bool((lengths < 0).any()) or lengths.sum() != len(sizes):
        return "the outputs sent for chunk_sizes do not answer the inputs the grader chose"
    for (batch, devices), got in zip(pairs, torch.split(sizes, lengths.tolist())):
        want = torch_sizes(batch, devices)
        if got.tolist() != want:
            return (
                f"chunk_sizes({batch}, {devices}) returned {got.tolist()}, torch.chunk gives "
                f"{want}{chunk_count_note(len(got), len(want), devices)}"
            )
    return None


def chunk_count_note(got: int, want: int, devices: int) -> str:
    """A note on the number of chunks, where it is what is wrong: more chunks than devices,
    or one per device where torch.chunk makes fewer."""
    if got > devices:
        return f"; that is {got} chunks for {devices} devices: never more chunks than devices"
    if want < got:
        return "; note there may be fewer chunks than devices (6 rows over 4 devices: 2, 2, 2)"
    return ""


# --------------------------------------------------------------------------------------
# Task 6's straggler_report: torch's chunks, the weighted chunks, the measured times.

SLACK = 0.25  # seconds: sleep() may overshoot on a busy machine; it never undershoots


def torch_chunk_sizes_padded(batch: int, devices: int) -> list[int]:
    """torch.chunk's sizes for ``batch`` rows over ``devices``, 0 for each idle device."""
    sizes = [len(chunk) for chunk in torch.empty(batch).chunk(devices)] if batch else []
    return sizes + [0] * (devices - len(sizes))


def step_time(sizes: Sequence[int], speeds: Sequence[float]) -> float:
    return max(rows / speed for rows, speed in zip(sizes, speeds))


def straggler_inputs(rng: random.Random) -> list[list]:
    """Two (batch, speeds, seconds per row) cases: a fast device among three slower ones,
    and equal devices that torch.chunk leaves 3 of idle (so padding shows)."""
    speeds = [round(rng.uniform(2.5, 5.0), 2)] + [round(rng.uniform(0.8, 1.25), 2) for _ in "abc"]
    rng.shuffle(speeds)
    idle = [
        (batch, devices)
        for devices in range(5, 13)
        for batch in range(devices, 3 * devices)
        if torch_chunk_sizes_padded(batch, devices).count(0) == 3
    ]
    batch, devices = rng.choice(idle)
    return [[rng.randint(40, 80), speeds, 0.003], [batch, [1.0] * devices, 0.001]]


def pack_report(reports: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
    """straggler_report's answers as tensors: both chunk lists of every case in a row, and
    each case's (torch_seconds, weighted_seconds, speedup)."""
    return {
        "torch_chunks": torch.tensor(
            [int(s) for r in reports for s in r["torch_chunks"]], dtype=torch.int64
        ),
        "weighted_chunks": torch.tensor(
            [int(s) for r in reports for s in r["weighted_chunks"]], dtype=torch.int64
        ),
        "seconds": torch.tensor(
            [
                [float(r["torch_seconds"]), float(r["weighted_seconds"]), float(r["speedup"])]
                for r in reports
            ],
            dtype=torch.float64,
        ),
    }


def judge_straggler_report(cases: list, values: Mapping[str, torch.Tensor]) -> str | None:
    equal, weighted, seconds = (
        values.get(k) for k in ("torch_chunks", "weighted_chunks", "seconds")
    )
    devices = sum(len(speeds) for _, speeds, _ in cases)
    for tensor in (equal, weighted):
        if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.int64 or tensor.ndim != 1:
            return "the outputs sent for straggler_report are not the chunk sizes asked for"
        if len(tensor) != devices:
            return "the outputs sent for straggler_report do not answer the inputs the grader chose"
    if not isinstance(seconds, torch.Tensor) or seconds.dtype != torch.float64:
        return "the outputs sent for straggler_report are not the times asked for"
    if tuple(seconds.shape) != (len(cases), 3):
        return "the outputs sent for straggler_report do not answer the inputs the grader chose"
    assert equal is not None and weighted is not None
    counts = [len(speeds) for _, speeds, _ in cases]
    for (batch, speeds, per_row), got_equal, got_weighted, (t_s, w_s, speedup) in zip(
        cases, equal.split(counts), weighted.split(counts), seconds.tolist()
    ):
        call = f"straggler_report({batch}, {speeds}, {per_row})"
        want = torch_chunk_sizes_padded(batch, len(speeds))
        if got_equal.tolist() != want:
            return (
                f"{call} gave torch_chunks {got_equal.tolist()}, torch.chunk gives {want}: one "
                "size per device, 0 for each idle one"
            )
        sizes = got_weighted.tolist()
        # What the check says: the weighted chunks beat torch's on unequal devices (whether
        # they are the best split is weighted_chunk_sizes' own check: one mistake, one check)
        beaten = step_time(want, speeds)
        unequal = len(set(speeds)) > 1
        if (
            min(sizes) < 0
            or sum(sizes) != batch
            or (unequal and step_time(sizes, speeds) >= beaten)
        ):
            return (
                f"{call} gave weighted_chunks {sizes}, which do not split the batch faster than "
                f"torch's chunks ({beaten:g} rows' time): use weighted_chunk_sizes({batch}, "
                f"{speeds})"
            )
        if len(set(speeds)) == 1 and max(sizes) - min(sizes) > 1:
            return f"{call} gave weighted_chunks {sizes}; equal speeds differ by at most one row"
        for what, got, sizes_used in (("torch", t_s, want), ("weighted", w_s, sizes)):
            ideal = step_time(sizes_used, speeds) * per_row
            if not ideal - 1e-3 <= got < ideal + SLACK:
                return (
                    f"{call} gave {what}_seconds {got:.4f}, but its slowest device sleeps "
                    f"{ideal:.4f} s: measure with measure_step_time"
                )
        if not abs(speedup - t_s / w_s) <= 1e-6 * abs(t_s / w_s):
            return f"{call} gave speedup {speedup}: speedup is torch_seconds / weighted_seconds"
    return None


# --------------------------------------------------------------------------------------
# Task 7's ring all-reduce: the sums left on every lane.


def allreduce_inputs(rng: random.Random) -> list[list]:
    """Three (shape, lanes, seed) cases: a matrix over 4 lanes, fewer elements than lanes,
    a 3-d tensor over 2 or 3 lanes; fresh values (a fresh seed) for each."""
    seed = rng.randrange(2**62)
    return [
        [[rng.randint(2, 9), rng.randint(2, 9)], 4, seed],
        [[rng.randint(1, 3)], 4, seed + 1],
        [[rng.randint(1, 4), rng.randint(2, 4), rng.randint(2, 5)], rng.randint(2, 3), seed + 2],
    ]


def judge_allreduce(cases: list, values: Mapping[str, torch.Tensor]) -> str | None:
    sums = values.get("sums")
    if not isinstance(sums, torch.Tensor) or sums.dtype != torch.float32 or sums.ndim != 1:
        return "the outputs sent for ring_allreduce_ are not the tensors asked for"
    numels = [count * math.prod(shape) for shape, count, _ in cases]
    if len(sums) != sum(numels):
        return "the outputs sent for ring_allreduce_ do not answer the inputs the grader chose"
    for (shape, count, seed), lanes in zip(cases, sums.split(numels)):
        values = lane_values(shape, count, seed)
        want = sum(values)
        for index, got in enumerate(lanes.view(count, *shape)):
            if not torch.allclose(got, want, atol=1e-5):
                return outputs.ring_sum_hint(shape, count, index, got, values)
    return None


# --------------------------------------------------------------------------------------
# Task 4's Gather: the pieces concatenated, along rows and along columns.


def gather_pieces(sizes: Sequence[int], other: int, dim: int, seed: int) -> list[torch.Tensor]:
    """The pieces a check gathers: ``sizes[i]`` long along ``dim``, ``other`` across it."""
    generator = torch.Generator().manual_seed(seed)
    shapes = [(size, other) if dim == 0 else (other, size) for size in sizes]
    return [torch.randn(shape, generator=generator) for shape in shapes]


def gather_inputs(rng: random.Random) -> list[list]:
    """Two (sizes, other size, dim, seed) cases: four pieces of rows from the four lanes
    (one a single row), and two pieces of columns."""
    seed = rng.randrange(2**62)
    rows = [rng.randint(2, 5) for _ in range(3)] + [1]
    rng.shuffle(rows)
    return [
        [rows, rng.randint(1, 5), 0, seed],
        [[rng.randint(1, 3), rng.randint(1, 3)], rng.randint(1, 4), 1, seed + 1],
    ]


def judge_gather(cases: list, values: Mapping[str, torch.Tensor]) -> str | None:
    for name, (sizes, other, dim, seed) in zip(("rows", "columns"), cases):
        got = values.get(name)
        if not isinstance(got, torch.Tensor):
            return "the outputs sent for Gather are not the tensors asked for"
        want = torch.cat(gather_pieces(sizes, other, dim, seed), dim)
        if got.shape != want.shape:
            return (
                f"gathering pieces of sizes {sizes} along dim={dim} gave shape "
                f"{tuple(got.shape)}, torch.cat gives {tuple(want.shape)}"
            )
        if not torch.equal(got, want):
            return (
                f"gathering pieces of sizes {sizes} along dim={dim}: the result is not "
                "torch.cat of the pieces"
            )
    return None


# --------------------------------------------------------------------------------------
# Task 2's Broadcast.backward: the gradients of every copy, summed.


def broadcast_inputs(rng: random.Random) -> list:
    """Two tensors' shapes (a's and b's), the lanes (2 to 4) and the seed of their values and
    of a weight per copy, so every copy's gradient differs."""
    shapes = [[rng.randint(1, 5)], [rng.randint(1, 3), rng.randint(1, 3)]]
    return [shapes, rng.randint(2, 4), rng.randrange(2**62)]


def broadcast_values(
    shapes: Sequence[Sequence[int]], lanes: int, seed: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The tensors a check broadcasts, and the weight of each copy in its loss (laid out as
    the copies are: lane by lane, tensor by tensor): the same in the parent and the child."""
    generator = torch.Generator().manual_seed(seed)
    tensors = [torch.randn(tuple(shape), generator=generator) for shape in shapes]
    weights = [torch.randn(tuple(s), generator=generator) for _ in range(lanes) for s in shapes]
    return tensors, weights


def judge_broadcast(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    shapes, lanes, seed = inputs
    tensors, weights = broadcast_values(shapes, lanes, seed)
    leaves = [tensor.requires_grad_() for tensor in tensors]
    copies = [leaves[position % len(leaves)] for position in range(len(weights))]
    sum((w * c).sum() for w, c in zip(weights, copies)).backward()  # plain autograd's sums
    for index, (name, leaf) in enumerate(zip("ab", leaves)):
        got = values.get(f"grad{index}")
        if not isinstance(got, torch.Tensor) or got.shape != leaf.shape:
            return "the outputs sent for Broadcast are not the gradients asked for"
        assert leaf.grad is not None
        if not torch.allclose(got, leaf.grad, atol=1e-5):
            return (
                f"{name}.grad is not the sum of its copies' gradients over {lanes} lanes: "
                f"backward must add the gradients of {name}'s copies on every lane (and pick "
                "them from the flat layout)"
            )
    return None


# --------------------------------------------------------------------------------------
# Transfer counts: the copies a primitive makes, as (source lane, destination lane, bytes).
# The grading process sends the copies its transfer listener saw; the parent computes the
# copies the primitive must make for the sizes it chose, and compares the two as multisets.

FLOAT = 4  # bytes per float32 element: every tensor these checks move


def pack_transfers(transfers: Sequence[Any]) -> dict[str, torch.Tensor]:
    """``dpkit.Transfer`` records as one (copies, 3) tensor: source, destination, bytes."""
    rows = [[int(t.source.index), int(t.destination.index), int(t.nbytes)] for t in transfers]
    return {"transfers": torch.tensor(rows, dtype=torch.int64).reshape(-1, 3)}


def _copies(values: Mapping[str, torch.Tensor]) -> list[tuple[int, int, int]] | None:
    """The copies sent, sorted; None unless they are a (copies, 3) tensor of integers."""
    sent = values.get("transfers")
    if not isinstance(sent, torch.Tensor) or sent.dtype != torch.int64 or sent.ndim != 2:
        return None
    if sent.shape[1] != 3:
        return None
    return sorted((int(a), int(b), int(c)) for a, b, c in sent.tolist())


NOT_COPIES = "the copies sent for this check are not (source, destination, bytes) triples"


def torch_sizes(batch: int, devices: int) -> list[int]:
    return [len(chunk) for chunk in torch.empty(batch).chunk(devices)] if batch else []


def scatter_bytes_inputs(rng: random.Random) -> list[int]:
    """(rows, columns, lanes) of the tensor scatter_tensor splits."""
    return [rng.randint(5, 40), rng.randint(1, 6), rng.randint(2, 4)]


def judge_scatter_bytes(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    rows, columns, lanes = inputs
    copies = _copies(values)
    if copies is None:
        return NOT_COPIES
    moved = sorted((destination, nbytes) for _, destination, nbytes in copies)
    sizes = torch_sizes(rows, lanes)
    want = [(lane, sizes[lane] * columns * FLOAT) for lane in range(1, len(sizes))]
    if moved != want:
        return (
            f"scattering a ({rows}, {columns}) float tensor over {lanes} lanes copied (lane, "
            f"bytes) {moved}, expected {want}: copy each chunk once with copy_to, and leave "
            "lane 0's chunk where it is"
        )
    return None


def broadcast_bytes_inputs(rng: random.Random) -> list:
    """Two tensors' shapes and the lanes (2 to 4) Broadcast copies them to."""
    shapes = [[rng.randint(1, 9), rng.randint(1, 9)], [rng.randint(1, 20)]]
    return [shapes, rng.randint(2, 4)]


def judge_broadcast_bytes(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    shapes, lanes = inputs
    copies = _copies(values)
    if copies is None:
        return NOT_COPIES
    moved = sorted((destination, nbytes) for _, destination, nbytes in copies)
    sizes = [math.prod(shape) * FLOAT for shape in shapes]
    want = sorted((lane, nbytes) for lane in range(1, lanes) for nbytes in sizes)
    if moved != want:
        return (
            f"broadcasting tensors of {sizes} bytes to {lanes} lanes copied (lane, bytes) "
            f"{moved}, expected {want}: each tensor once to each lane but lane 0"
        )
    return None


def grad_bytes_inputs(rng: random.Random) -> list:
    """A weight's shape and the lanes (2 to 4) it is broadcast to, then backward."""
    return [[rng.randint(1, 9), rng.randint(1, 9)], rng.randint(2, 4)]


def judge_broadcast_grad_bytes(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    shape, lanes = inputs
    copies = _copies(values)
    if copies is None:
        return NOT_COPIES
    nbytes = math.prod(shape) * FLOAT
    want = [(lane, 0, nbytes) for lane in range(1, lanes)]
    if copies != want:
        return (
            f"backward copies (from, to, bytes): {copies}; expected one {nbytes}-byte copy "
            f"from each of lanes 1-{lanes - 1} to lane 0: use copy_to(grad, devices[0], "
            "'reduce', source=that_lane)"
        )
    return None


def gather_bytes_inputs(rng: random.Random) -> list:
    """Each lane's piece's rows (1 to 5, 2 to 4 lanes) and the columns they share."""
    return [[rng.randint(1, 5) for _ in range(rng.randint(2, 4))], rng.randint(1, 6)]


def _gather_want(rows: Sequence[int], columns: int, backward: bool) -> list[tuple[int, int, int]]:
    sizes = [(lane, rows[lane] * columns * FLOAT) for lane in range(1, len(rows))]
    return [(0, lane, n) if backward else (lane, 0, n) for lane, n in sizes]


def judge_gather_bytes(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    rows, columns = inputs
    copies = _copies(values)
    if copies is None:
        return NOT_COPIES
    if copies != _gather_want(rows, columns, backward=False):
        return (
            f"gathering pieces of {rows} rows: copies (from, to, bytes) {copies}, expected "
            f"{_gather_want(rows, columns, False)}: move each piece with copy_to(piece, "
            "destination, 'gather'), which does not copy lane 0's piece"
        )
    return None


def judge_gather_grad_bytes(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    rows, columns = inputs
    copies = _copies(values)
    if copies is None:
        return NOT_COPIES
    if copies != _gather_want(rows, columns, backward=True):
        return (
            f"backward copies (from, to, bytes): {copies}, expected "
            f"{_gather_want(rows, columns, True)}: send slice i to piece i's device with "
            "copy_to(slice, device, 'grad_scatter', source=destination)"
        )
    return None


def gather_scalar_inputs(rng: random.Random) -> list[int]:
    """The lanes (2 to 4) each holding one scalar, and the scalars' seed."""
    return [rng.randint(2, 4), rng.randrange(2**62)]


def scalar_values(lanes: int, seed: int) -> list[torch.Tensor]:
    """The scalars a check gathers, one per lane: the same in the parent and the child."""
    generator = torch.Generator().manual_seed(seed)
    return list(torch.randn(lanes, generator=generator).unbind())


def judge_gather_scalars(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    lanes, seed = inputs
    copies, result = _copies(values), values.get("result")
    if copies is None or not isinstance(result, torch.Tensor):
        return NOT_COPIES
    if copies != [(lane, 0, FLOAT) for lane in range(1, lanes)]:
        return (
            f"copies (from, to, bytes) {copies} were made for scalars on lanes 0-{lanes - 1}, "
            f"expected one {FLOAT}-byte copy from each of lanes 1-{lanes - 1}: move each piece "
            "with copy_to before reshaping it (a new view carries no lane tag)"
        )
    if tuple(result.shape) != (lanes,):
        return (
            f"{lanes} scalars should gather into a vector of shape ({lanes},), got "
            f"{tuple(result.shape)}: view each scalar as a 1-element vector first"
        )
    if not torch.equal(result, torch.stack(scalar_values(lanes, seed))):
        return f"the {lanes} gathered scalars are not the pieces' values, in lane order"
    return None


def ring_bytes_inputs(rng: random.Random) -> list[int]:
    """Elements per chunk and lanes (3 or 4): the gradient is lanes * chunk elements, so
    every chunk is the same size and every lane's bytes are exact. Not 2 lanes: there a
    ring that passes whole tensors sends as many bytes as the real one."""
    return [rng.randint(20, 300), rng.randint(3, 4)]


def judge_ring_bytes(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    chunk, lanes = inputs
    copies = _copies(values)
    if copies is None:
        return NOT_COPIES
    ring = {(lane, (lane + 1) % lanes) for lane in range(lanes)}
    pairs = sorted({(source, destination) for source, destination, n in copies if n})
    if not set(pairs) <= ring:
        return (
            f"copies went between lanes {pairs}; in a ring lane i sends only to lane "
            "(i + 1) % n, with copy_to(..., source=devices[i])"
        )
    want = 2 * (lanes - 1) * chunk * FLOAT
    for lane in range(lanes):
        sent = sum(n for source, _, n in copies if source == lane)
        if sent != want:
            return (
                f"lane {lane} sent {sent} bytes of a {lanes * chunk * FLOAT}-byte gradient "
                f"over {lanes} lanes; a ring sends 2 * (n - 1) chunks of N / n, {want} bytes"
            )
    return None


CHECKS = (
    ParentCheck(
        1,
        "test_chunk_sizes_property",
        "chunk_sizes matches torch.chunk for any batch and device count",
        chunk_sizes_inputs,
        judge_chunk_sizes,
    ),
    ParentCheck(
        2,
        "test_broadcast_backward_reduce_adds",
        "Broadcast.backward sums the gradients of all copies",
        broadcast_inputs,
        judge_broadcast,
    ),
    ParentCheck(
        4,
        "test_gather_concatenates",
        "Gather concatenates the pieces in order on the destination",
        gather_inputs,
        judge_gather,
    ),
    ParentCheck(
        6,
        "test_straggler_report",
        "weighted chunks beat torch's equal chunks on unequal devices",
        straggler_inputs,
        judge_straggler_report,
    ),
    ParentCheck(
        7,
        "test_ring_sums_in_place",
        "ring_allreduce_ leaves the sum on every lane, in place",
        allreduce_inputs,
        judge_allreduce,
    ),
    ParentCheck(
        1,
        "test_scatter_tensor_counts_bytes",
        "scatter_tensor copies every chunk except lane 0's, once",
        scatter_bytes_inputs,
        judge_scatter_bytes,
    ),
    ParentCheck(
        2,
        "test_broadcast_forward_bytes",
        "Broadcast.forward copies each tensor once to each lane but lane 0",
        broadcast_bytes_inputs,
        judge_broadcast_bytes,
    ),
    ParentCheck(
        2,
        "test_broadcast_backward_moves_to_lane0",
        "Broadcast.backward moves each lane's gradient to lane 0 once",
        grad_bytes_inputs,
        judge_broadcast_grad_bytes,
    ),
    ParentCheck(
        4,
        "test_gather_bytes",
        "Gather copies only the pieces that are not on the destination",
        gather_bytes_inputs,
        judge_gather_bytes,
    ),
    ParentCheck(
        4,
        "test_gather_scalars",
        "scalars from the replicas gather into a vector",
        gather_scalar_inputs,
        judge_gather_scalars,
    ),
    ParentCheck(
        4,
        "test_gather_backward_to_lanes",
        "the backward sends each gradient slice back to its piece's lane",
        gather_bytes_inputs,
        judge_gather_grad_bytes,
    ),
    ParentCheck(
        7,
        "test_ring_traffic",
        "in the ring each lane sends 2(n-1)/n of a gradient, only to its neighbour",
        ring_bytes_inputs,
        judge_ring_bytes,
    ),
    # The tensors returned, in dpkit.grading.outputs.
    *(
        ParentCheck(
            7,
            f"test_ring_any_size[{case}]",
            f"ring_allreduce_ works for any size and any number of lanes ({case})",
            outputs.ring_size_inputs(case),
            outputs.judge_ring_size,
        )
        for case in outputs.RING_SIZES
    ),
    ParentCheck(
        1,
        "test_scatter_tensor_places_chunks",
        "scatter_tensor puts chunk i on lane i with the right rows",
        outputs.scatter_input_inputs,
        outputs.judge_scatter_chunks,
    ),
    ParentCheck(
        2,
        "test_broadcast_forward_layout",
        "Broadcast.forward returns every tensor on every lane, device by device",
        outputs.layout_inputs,
        outputs.judge_layout,
    ),
    ParentCheck(
        5,
        "test_forward_matches_module",
        "the data-parallel forward computes module(x)",
        outputs.model_inputs,
        outputs.judge_forward,
    ),
    ParentCheck(
        5,
        "test_gradients_match_single_device",
        "data-parallel gradients equal single-device gradients",
        outputs.model_inputs,
        outputs.judge_gradients,
    ),
    # The numbers returned, in dpkit.grading.counted.
    ParentCheck(
        7,
        "test_traffic_per_lane",
        "traffic_per_lane counts the bytes each lane sends and receives",
        counted.traffic_inputs,
        counted.judge_traffic,
    ),
    ParentCheck(
        7,
        "test_compare_traffic",
        "reduce-add loads lane 0 with (n-1)N bytes; the ring spreads 2(n-1)/n N over all",
        counted.compare_inputs,
        counted.judge_compare,
    ),
    ParentCheck(
        5,
        "test_train_step",
        "three data-parallel SGD steps train exactly like one device",
        counted.train_inputs,
        counted.judge_train,
    ),
    ParentCheck(
        5,
        "test_gradient_difference_small",
        "max_gradient_difference is tiny for a correct data-parallel forward",
        counted.difference_inputs,
        counted.judge_difference_small,
    ),
    ParentCheck(
        5,
        "test_gradient_difference_detects_errors",
        "max_gradient_difference detects a wrong forward",
        counted.difference_inputs,
        counted.judge_difference_large,
    ),
    # The gradients autograd leaves, in dpkit.grading.gradients.
    ParentCheck(
        1,
        "test_scatter_tensor_gradients",
        "gradients flow back from the chunks to the input",
        gradients.scatter_grad_inputs,
        gradients.judge_scatter_grad,
    ),
    ParentCheck(
        2,
        "test_replicate_places_replicas",
        "replicate makes one working replica per lane, parameters on that lane",
        gradients.replica_inputs,
        gradients.judge_replica_outputs,
    ),
    ParentCheck(
        2,
        "test_replicate_gradients",
        "gradients of every replica add up in the original module",
        gradients.replica_inputs,
        gradients.judge_replica_grads,
    ),
    ParentCheck(
        4,
        "test_gather_backward",
        "gradients flow back to every piece, the matching slice each",
        gradients.gather_grad_inputs,
        gradients.judge_gather_grad,
    ),
    ParentCheck(
        7,
        "test_ddp_gradients_match_dataparallel",
        "all-reduced replica gradients equal DataParallel's gradients",
        gradients.ddp_inputs,
        gradients.judge_ddp_grads,
    ),
    ParentCheck(
        1,
        "test_chunk_sizes_examples",
        "chunk_sizes matches torch.chunk on the classic examples",
        lambda rng: [[10, 4], [6, 4], [8, 4], [1, 4], [3, 1], [0, 4]],  # fixed, judged here
        judge_chunk_sizes,
    ),
    # Task 6's sizes and simulated time, in dpkit.grading.weighted.
    ParentCheck(
        6,
        "test_sizes_are_a_split",
        "weighted_chunk_sizes returns one whole-row size per device, adding up to the batch",
        weighted.split_inputs,
        weighted.judge_split,
    ),
    ParentCheck(
        6,
        "test_equal_speeds_balance",
        "equal speeds give sizes that differ by at most one",
        weighted.balance_inputs,
        weighted.judge_balance,
    ),
    ParentCheck(
        6,
        "test_sizes_are_optimal",
        "weighted_chunk_sizes minimises the slowest device's time",
        weighted.optimal_inputs,
        weighted.judge_optimal,
    ),
    ParentCheck(
        6,
        "test_simulated_step_time",
        "simulated_step_time is the time of the slowest device",
        weighted.simulated_inputs,
        weighted.judge_simulated,
    ),
    ParentCheck(
        6,
        "test_measure_step_time",
        "measure_step_time runs the devices at the same time and measures real time",
        weighted.measured_inputs,
        weighted.judge_measured,
    ),
    # Shapes and counts, in dpkit.grading.shapes.
    ParentCheck(
        1,
        "test_scatter_tensor_dim_and_small_batch",
        "scatter_tensor splits along dim and leaves devices idle for a small batch",
        shapes.dim_inputs,
        shapes.judge_dim,
    ),
    ParentCheck(
        4,
        "test_gather_scalar_backward",
        "a scalar piece gets a scalar gradient",
        shapes.scalar_grad_inputs,
        shapes.judge_scalar_grad,
    ),
    ParentCheck(
        5,
        "test_forward_uses_lanes",
        "one replica runs per lane that got a chunk, on that lane",
        shapes.lanes_inputs,
        shapes.judge_lanes,
    ),
    # Nested outputs, in dpkit.grading.structure.
    ParentCheck(
        1,
        "test_scatter_containers",
        "scatter splits tuples, lists and dicts element by element",
        structure.scatter_inputs,
        structure.judge_scatter,
    ),
    ParentCheck(
        4,
        "test_gather_containers",
        "gather handles dicts, lists, tuples, namedtuples and None",
        structure.gather_inputs,
        structure.judge_gather,
    ),
    ParentCheck(
        3,
        "test_apply_replica_stores_output",
        "apply_replica stores the output under the replica's index",
        outputs.replica_inputs,
        outputs.judge_apply_replica,
    ),
    ParentCheck(
        3,
        "test_outputs_in_order",
        "parallel_apply returns each replica's output, in replica order",
        outputs.replica_inputs,
        outputs.judge_in_order,
    ),
    ParentCheck(
        3,
        "test_apply_replica_sets_grad_mode",
        "apply_replica runs the module under the grad mode it is given",
        conduct.grad_mode_inputs,
        conduct.judge_grad_mode,
    ),
    ParentCheck(
        3,
        "test_grad_mode_carried",
        "parallel_apply carries the caller's grad mode into the threads",
        conduct.carried_inputs,
        conduct.judge_carried,
    ),
    ParentCheck(
        3,
        "test_apply_replica_catches",
        "apply_replica stores a ReplicaFailure instead of raising",
        conduct.catches_inputs,
        conduct.judge_catches,
    ),
    ParentCheck(
        3,
        "test_reraise_names_replica",
        "reraise keeps the exception type and names the replica and device",
        conduct.names_inputs,
        conduct.judge_names,
    ),
    ParentCheck(
        3,
        "test_reraise_falls_back_to_runtime_error",
        "reraise raises RuntimeError for a type that cannot be built from one message",
        conduct.fallback_inputs,
        conduct.judge_fallback,
    ),
    ParentCheck(
        3,
        "test_exception_carried_back",
        "an exception in a replica is raised in the caller, naming the replica",
        conduct.carried_back_inputs,
        conduct.judge_carried_back,
    ),
    ParentCheck(
        3,
        "test_one_thread_per_replica",
        "parallel_apply runs every replica at the same time, each in its own thread",
        conduct.threads_inputs,
        conduct.judge_threads,
    ),
    ParentCheck(
        1,
        "test_scatter_namedtuple_and_shared_objects",
        "scatter keeps namedtuples and shares other objects by reference",
        identity.shared_inputs,
        identity.judge_shared,
    ),
    ParentCheck(
        2,
        "test_replicate_leaves_module_alone",
        "replicate leaves the module's own parameters in place",
        identity.module_inputs,
        identity.judge_module_alone,
    ),
)


# --------------------------------------------------------------------------------------
# The parent's side.


def choose(tasks: Sequence[int]) -> dict[str, list]:
    """Fresh inputs for every parent-decided check of ``tasks``, by check."""
    rng = random.SystemRandom()
    return {check.key: check.choose(rng) for check in CHECKS if check.task in tasks}


def _check_of(nodeid: str, chosen: Mapping[str, list]) -> ParentCheck | None:
    return next((c for c in CHECKS if c.key in chosen and nodeid.endswith(c.key)), None)


def decode(text: Any) -> dict[str, torch.Tensor] | None:
    """Values a check sent, as tensors by name; None unless they are exactly that."""
    if not isinstance(text, str) or len(text) > VALUES_LIMIT:
        return None
    try:
        data = base64.b64decode(text, validate=True)
        values = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception:  # noqa: BLE001 - bad base64, or anything torch's safe loader refuses
        return None
    if not isinstance(values, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in values.items()
    ):
        return None
    return values


def decide(records: list[dict], chosen: Mapping[str, list]) -> list[dict]:
    """``records`` with the parent's verdict on its checks: a "passed" record stands only
    with values the parent finds right. (A check missing from the records fails as every
    check does: the list scored is the graders', :mod:`dpkit.grading.roster`.)"""
    decided = []
    for record in records:
        check = _check_of(str(record.get("nodeid", "")), chosen)
        if check is not None and record["event"] == "passed":
            values = decode(record.get("values"))
            try:
                hint = MISSING if values is None else check.judge(chosen[check.key], values)
            except Exception:  # noqa: BLE001 - a judge's slip on odd values fails the check,
                hint = MISSING  # it never stops the grader
            if hint is not None:
                record = {"event": "failed", "nodeid": record["nodeid"], "hint": hint}
        decided.append(record)
    return decided


# --------------------------------------------------------------------------------------
# The grading process's side.


def inputs_for(nodeid: str) -> list | None:
    """The inputs the parent chose for the check ``nodeid``; None outside ``dpkit grade``."""
    chosen = json.loads(os.environ.get(ENVIRONMENT) or "{}")
    return next((inputs for key, inputs in chosen.items() if nodeid.endswith(key)), None)


def encode(values: Mapping[str, torch.Tensor]) -> str:
    """A check's outputs as :func:`decode` reads them: plain tensors (a subclass would not
    load), saved by torch, in base64."""
    buffer = io.BytesIO()
    with torch._C.DisableTorchFunctionSubclass():
        plain = {name: tensor.detach().cpu().clone() for name, tensor in values.items()}
    torch.save(plain, buffer)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def check_named(nodeid: str) -> ParentCheck:
    return next(check for check in CHECKS if nodeid.endswith(check.key))


def inputs_here(nodeid: str) -> list:
    """The inputs the parent chose for the check ``nodeid``, or, outside ``dpkit grade``,
    fresh ones chosen here as the parent would."""
    chosen = inputs_for(nodeid)
    return chosen if chosen is not None else check_named(nodeid).choose(random.Random())


def answer(nodeid: str, inputs: list, values: Mapping[str, torch.Tensor]) -> None:
    """Judge ``values`` here as the parent will (the hint, and the verdict of a grader run on
    its own: an AssertionError), then send them to the parent (under ``dpkit grade``)."""
    hint = check_named(nodeid).judge(inputs, values)
    if hint is not None:
        raise AssertionError(hint)
    send(nodeid, values)


def send(nodeid: str, values: Mapping[str, torch.Tensor]) -> None:
    """Send a check's outputs to the parent with its record (under ``dpkit grade`` only)."""
    if not os.environ.get(ENVIRONMENT):
        return
    from dpkit.grading.harness import record_values

    record_values(nodeid, encode(values))
