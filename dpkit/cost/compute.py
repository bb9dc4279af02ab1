"""How long one device takes for a forward or a backward of its chunk, op by op.

The surprise first: which units an op runs on is torch's choice, not the model's. In
float32 a matmul runs on an NVIDIA GPU's CUDA cores (``torch.backends.cuda.matmul.allow_tf32``
is False by default), a convolution in TF32 on its tensor cores
(``torch.backends.cudnn.allow_tf32`` is True by default), eight times faster on an A100;
under ``torch.autocast`` both run in float16 or bfloat16 on tensor cores, and the ops around
them stay memory-bound. So each op takes the longer of its FLOPs at the rate of the units
it runs on and its bytes at the memory's achieved bandwidth (the roofline of Williams,
Waterman and Patterson, CACM 2009); the host pays an overhead per op on top.

On a calibrated machine (:func:`dpkit.cost.calibrate`) measured seconds replace the
roofline for every kind of op that was measured: ``Hardware.op_seconds`` holds, per aten op,
how long it took for how much work, interpolated on a log-log scale.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass

import torch

from dpkit.cost.hardware import Hardware, OpSamples
from dpkit.cost.profile import OpCost, PassCost


@dataclass(frozen=True)
class PassTime:
    """One pass on one device: ``host`` seconds of launching (Python, dispatcher, autograd
    engine) and ``device`` seconds of the ops' own work."""

    host: float
    device: float


def rate_key(op: OpCost, hardware: Hardware) -> str:
    """Which of ``hardware.peak_flops`` an op's FLOPs run at, as torch decides on a GPU:
    its dtype, except float32 matmuls in TF32 where ``allow_tf32`` says so (convolutions by
    default, matmuls after ``torch.backends.cuda.matmul.allow_tf32 = True``). A T4 has no
    bfloat16 units: predicting bf16 autocast there is an error, as it should be."""
    dtype, kind = op.dtype, op.kind
    if dtype == "float32" and "tfloat32" in hardware.peak_flops:
        if kind == "conv" and torch.backends.cudnn.allow_tf32:
            return "tfloat32"
        if kind == "matmul" and torch.backends.cuda.matmul.allow_tf32:
            return "tfloat32"
    return dtype  # a dtype the hardware has no units for is refused by flops_per_second


def interpolate(samples: OpSamples, work: float) -> float:
    """Seconds for ``work`` from measured ``(work, seconds)`` samples (sorted by work): the
    log-log line between the two samples around it; below the first, the first's time (a
    small op costs its fixed overhead); beyond the last, the last's rate."""
    if work <= samples[0][0]:
        return samples[0][1]
    works = [w for w, _ in samples]
    index = bisect_left(works, work)
    if index >= len(samples):
        last_work, last_seconds = samples[-1]
        return last_seconds * work / last_work
    (w0, t0), (w1, t1) = samples[index - 1], samples[index]
    if w0 <= 0 or t0 <= 0 or t1 <= 0 or w1 == w0:
        return t1
    share = (math.log(work) - math.log(w0)) / (math.log(w1) - math.log(w0))
    return math.exp(math.log(t0) + share * (math.log(t1) - math.log(t0)))


def op_time(op: OpCost, rows: int, hardware: Hardware) -> float:
    """Device seconds of one op at ``rows`` rows: measured if its kind was calibrated, else
    ``max(FLOPs / achieved FLOP/s of its units, bytes / achieved memory bandwidth)``."""
    flops, nbytes = op.flops_at(rows), op.bytes_at(rows)
    samples = hardware.op_seconds.get(op.name)
    if samples:
        return interpolate(samples, flops if flops > 0 else nbytes)
    compute = flops / hardware.flops_per_second(rate_key(op, hardware)) if flops > 0 else 0.0
    return max(compute, nbytes / hardware.achieved_memory_bandwidth)


def pass_time(cost: PassCost, rows: int, hardware: Hardware, backward: bool) -> PassTime:
    """Host and device seconds of a forward (``backward=False``) or backward of ``rows``: the
    host pays ``op_overhead`` per call the forward's Python makes into torch, and
    ``backward_op_overhead`` per op autograd runs."""
    device = sum(op_time(op, rows, hardware) for op in cost.ops)
    if backward:
        return PassTime(host=len(cost) * hardware.backward_op_overhead, device=device)
    return PassTime(host=host_calls(cost) * hardware.op_overhead, device=device)


def host_calls(cost: PassCost) -> int:
    """Calls the host makes for a forward: its Python's calls into torch where profiled,
    else one per aten op."""
    return len(cost) if cost.calls is None else cost.calls


def ready_times(cost: PassCost, rows: int, hardware: Hardware) -> list[float]:
    """Device seconds from the start of a backward to the end of each of its ops: when a
    gradient that op produces is ready (DDP's buckets wait for these)."""
    elapsed, ends = 0.0, []
    for op in cost.ops:
        elapsed += op_time(op, rows, hardware) + hardware.backward_op_overhead
        ends.append(elapsed)
    return ends


def elementwise_time(nbytes: float, hardware: Hardware) -> float:
    """Device seconds of a memory-bound op over ``nbytes`` (an add, a flatten's copy)."""
    samples = hardware.op_seconds.get("aten.add")
    if samples:
        return interpolate(samples, nbytes)
    return nbytes / hardware.achieved_memory_bandwidth
