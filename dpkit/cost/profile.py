"""A model's cost, read off the real module running on a sample input: :func:`profile`.

The surprise first: nothing here is a hand formula. The FLOPs are what
``torch.utils.flop_counter.FlopCounterMode`` counts for each aten op the module really runs,
in forward and in backward; the bytes each op reads and writes are the sizes of its actual
tensors; the activations are what autograd really saved, walked exactly as the trace walks
a replica's graph (:mod:`dpkit.tracing.replica_graph`). The module runs twice, on 2 and 4
rows copied from the sample, and every count is fitted as ``a + b * rows``, exact for the
layers of the course's models (a matmul's FLOPs grow with its rows, a weight's bytes do not).

Profiles are cached per module and input shape, so a widget sweeping batch sizes and device
counts profiles once and then predicts in milliseconds.
"""

from __future__ import annotations

import copy
import hashlib
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from dpkit.nested import tensors_in
from dpkit.tracing import replica_graph

PROFILE_ROWS = (2, 4)  # the two batch sizes each count is fitted from


@dataclass(frozen=True)
class OpCost:
    """One aten op of a pass: ``flops`` and ``nbytes`` (read + written) as ``(a, b)``, the
    cost at ``rows`` rows being ``a + b * rows``. A view moves no bytes."""

    name: str
    flops: tuple[float, float]
    nbytes: tuple[float, float]

    def flops_at(self, rows: int) -> float:
        return max(0.0, self.flops[0] + self.flops[1] * rows)

    @property
    def shape_key(self) -> str:
        """The op and its shape, apart from rows: ``"aten.addmm@401408"`` (FLOPs per row, or
        ``@b`` and bytes per row for an op without FLOPs). Calibration times each layer's op
        under this key as well as under its name: two convolutions of different channels
        reach different FLOP/s, and their samples are kept apart."""
        if self.flops[1] > 0:
            return f"{self.name}@{round(self.flops[1])}"
        return f"{self.name}@b{round(self.nbytes[1])}"

    def bytes_at(self, rows: int) -> float:
        return max(0.0, self.nbytes[0] + self.nbytes[1] * rows)


@dataclass(frozen=True)
class PassCost:
    """The ops of a forward or a backward, in the order they ran."""

    ops: tuple[OpCost, ...]

    def flops(self, rows: int) -> float:
        return sum(op.flops_at(rows) for op in self.ops)

    def nbytes(self, rows: int) -> float:
        return sum(op.bytes_at(rows) for op in self.ops)

    def __len__(self) -> int:
        return len(self.ops)


@dataclass(frozen=True)
class Profile:
    """What one replica's step costs, per row of its chunk and per model.

    ``parameter_sizes`` and ``buffer_sizes`` are the bytes of each tensor in
    ``module.parameters()`` / ``module.buffers()`` order (what replicate broadcasts and reduce
    sums, tensor by tensor); ``modules`` counts ``module.modules()`` (what replicate builds
    per replica); ``input_row_bytes`` and ``output_row_bytes`` the bytes of one row of input
    and output; ``activations`` the bytes autograd saves, ``(a, b)`` as in :class:`OpCost`.
    """

    dtype: torch.dtype
    forward: PassCost
    backward: PassCost
    parameter_sizes: tuple[int, ...]
    buffer_sizes: tuple[int, ...]
    modules: int
    input_row_bytes: int
    output_row_bytes: int
    activations: tuple[float, float]

    @property
    def key(self) -> str:
        """Names the model by its forward's ops and their shapes (what
        ``Hardware.gil_contention_by_model`` is keyed by): equal for equal architectures."""
        shapes = "|".join(op.shape_key for op in self.forward.ops)
        return hashlib.sha1(shapes.encode()).hexdigest()[:16]

    @property
    def parameter_bytes(self) -> int:
        return sum(self.parameter_sizes)

    @property
    def buffer_bytes(self) -> int:
        return sum(self.buffer_sizes)

    def input_bytes(self, rows: int) -> int:
        return rows * self.input_row_bytes

    def output_bytes(self, rows: int) -> int:
        return rows * self.output_row_bytes

    def activation_bytes(self, rows: int) -> int:
        return max(0, round(self.activations[0] + self.activations[1] * rows))


class OpRecorder(TorchDispatchMode):
    """Notes every aten op that runs inside it: its name, the FLOPs ``counter`` (an enclosing
    FlopCounterMode) counted for it, the bytes of its tensors, and, with ``timed``, the
    seconds it took (calibration uses that without a counter, so that counting costs no time)."""

    def __init__(self, counter: FlopCounterMode | None = None, timed: bool = False) -> None:
        super().__init__()
        self.counter = counter
        self.timed = timed
        self.ops: list[tuple[str, float, int, float]] = []  # name, flops, bytes, seconds

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
        kwargs = kwargs or {}
        before = self.counter.get_total_flops() if self.counter is not None else 0
        start = time.perf_counter() if self.timed else 0.0
        out = func(*args, **kwargs)
        seconds = time.perf_counter() - start if self.timed else 0.0
        flops = self.counter.get_total_flops() - before if self.counter is not None else 0
        nbytes = 0 if func.is_view else _distinct_nbytes(tensors_in([args, kwargs, out]))
        self.ops.append((str(func.overloadpacket), float(flops), nbytes, seconds))
        return out


def _distinct_nbytes(tensors: Sequence[torch.Tensor]) -> int:
    """Bytes of ``tensors``, each memory block once (an in-place op's output is its input)."""
    seen: dict[tuple[int, int], int] = {}
    for tensor in tensors:
        try:
            key = (tensor.data_ptr(), tensor.nbytes)
        except RuntimeError:  # no single storage (sparse, ...): counted by size alone
            key = (id(tensor), tensor.nbytes)
        seen[key] = tensor.nbytes
    return sum(seen.values())


def rows_like(sample: torch.Tensor, rows: int) -> torch.Tensor:
    """A batch of ``rows`` rows made of the sample's first row (real values, fresh memory):
    row ``i`` is that row's values rotated by an amount of its own.

    The rows must differ. Max-pooling ran twice as fast on a batch of one row repeated as on
    distinct rows (its comparisons go the same way every time, and the CPU's branch
    predictor learns them): calibrating on repeated rows made the course CNN's forward a
    third faster than the learner's random images take.
    """
    first = sample[:1].reshape(-1)
    size = first.numel()
    batch = first.new_empty((rows, size))  # made from the sample: on its device, or lane
    # a fixed stride through the row: deterministic, and no two of the first `size` alike
    for row in range(rows):
        shift = (row * 7919) % size if size else 0
        batch[row, : size - shift] = first[shift:]
        batch[row, size - shift :] = first[:shift]
    return batch.reshape(rows, *sample.shape[1:])


def run_passes(
    module: nn.Module, inputs: torch.Tensor, counter: FlopCounterMode | None, timed: bool
) -> tuple[list[tuple], list[tuple], torch.Tensor, int]:
    """One forward and one backward of ``module`` on ``inputs``, recorded op by op: the
    forward's ops, the backward's ops, the output and the activations' bytes.

    The backward starts from the output with a gradient of ones and stops at the parameters
    (``torch.autograd.grad``): exactly what a replica's backward runs, no loss and no
    accumulation into ``.grad``.
    """
    params = [p for p in module.parameters() if p.requires_grad]
    given = [*module.parameters(), *module.buffers(), inputs]
    outer = counter if counter is not None else _NoMode()
    with outer:
        with OpRecorder(counter, timed) as forward:
            output = module(inputs)
    if not isinstance(output, torch.Tensor):
        raise TypeError(
            "the cost model profiles modules that return one tensor; this one returned "
            f"{type(output).__name__}"
        )
    activations = replica_graph.walk([output], given).saved_nbytes
    seed = torch.ones_like(output)
    with outer:
        with OpRecorder(counter, timed) as backward:
            if params and output.requires_grad:
                torch.autograd.grad([output], params, [seed], allow_unused=True)
    return forward.ops, backward.ops, output, activations


class _NoMode:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: Any) -> None:
        return None


def _fit(small: list[tuple], large: list[tuple], rows: tuple[int, int]) -> PassCost:
    """Each op's FLOPs and bytes as ``a + b * rows`` from the runs at ``rows[0]`` and
    ``rows[1]``; if the two runs ran different ops, the larger run's costs scaled by rows."""
    r1, r2 = rows
    if [op[0] for op in small] != [op[0] for op in large]:
        return PassCost(
            tuple(OpCost(name, (0.0, f / r2), (0.0, b / r2)) for name, f, b, _ in large)
        )
    ops = []
    for (name, f1, b1, _), (_, f2, b2, _) in zip(small, large):
        flops_slope, bytes_slope = (f2 - f1) / (r2 - r1), (b2 - b1) / (r2 - r1)
        ops.append(
            OpCost(name, (f1 - flops_slope * r1, flops_slope), (b1 - bytes_slope * r1, bytes_slope))
        )
    return PassCost(tuple(ops))


_cache: weakref.WeakKeyDictionary[nn.Module, dict[tuple, Profile]] = weakref.WeakKeyDictionary()


def _key(module: nn.Module, sample: torch.Tensor) -> tuple:
    # The parameters' names and shapes too: a module changed in place is profiled afresh.
    shapes = tuple((name, tuple(p.shape)) for name, p in module.named_parameters())
    return (tuple(sample.shape[1:]), sample.dtype, sample.device, shapes)


def profile(module: nn.Module, sample_input: torch.Tensor) -> Profile:
    """FLOPs, bytes and activations of ``module`` per row of ``sample_input`` (cached).

    ``sample_input`` is a batch (rows along dim 0) of the kind the module takes; its values
    are used, its batch size is not. The module itself is left untouched: a copy runs
    (BatchNorm's running statistics, say, stay as they were).
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(sample_input, torch.Tensor) or sample_input.dim() == 0:
        raise TypeError(
            "sample_input must be a tensor with a batch dimension (dim 0), e.g. "
            "torch.randn(1, 1, 28, 28)"
        )
    key = _key(module, sample_input)
    cached = _cache.setdefault(module, {})
    if key in cached:
        return cached[key]
    runs = []
    work = copy.deepcopy(module)
    work.train(module.training)
    for rows in PROFILE_ROWS:
        counter = FlopCounterMode(display=False)
        runs.append(run_passes(work, rows_like(sample_input, rows), counter, timed=False))
    (fwd1, bwd1, out1, act1), (fwd2, bwd2, out2, act2) = runs
    r1, r2 = PROFILE_ROWS
    floating = [p for p in module.parameters() if p.is_floating_point()]
    result = Profile(
        dtype=floating[0].dtype if floating else sample_input.dtype,
        forward=_fit(fwd1, fwd2, PROFILE_ROWS),
        backward=_fit(bwd1, bwd2, PROFILE_ROWS),
        parameter_sizes=tuple(p.nbytes for p in module.parameters()),
        buffer_sizes=tuple(b.nbytes for b in module.buffers()),
        modules=len(list(module.modules())),
        input_row_bytes=sample_input[:1].nbytes,
        output_row_bytes=out2.nbytes // r2,
        activations=(act1 - (act2 - act1) / (r2 - r1) * r1, (act2 - act1) / (r2 - r1)),
    )
    cached[key] = result
    return result
