"""How long one device takes for a forward or a backward of its chunk, op by op.

The surprise first: which units an op runs on is torch's choice, not the model's. In
float32 a matmul runs on an NVIDIA GPU's CUDA cores (``torch.backends.cuda.matmul.allow_tf32``
is False by default), a convolution in TF32 on its tensor cores (``cudnn.allow_tf32`` is
True), eight times faster on an A100; under autocast both run on tensor cores. Each op takes
the longer of its FLOPs at its units' rate and its bytes at the memory's achieved bandwidth
(the roofline, Williams et al., CACM 2009), or, on a calibrated machine, what
``Hardware.op_seconds`` measured for it (log-log interpolated), a convolution's FLOPs counted
over the CPU's vector lanes it fills (``OpCost.work_at``); the host pays per op on top.
"""

import math
from bisect import bisect_left
from dataclasses import dataclass

import torch

from dpkit.cost.hardware import Hardware, OpSamples
from dpkit.cost.profiling import OpCost, PassCost


@dataclass(frozen=True)
class PassTime:
    """One pass on one device: ``host`` seconds of launching, ``device`` seconds of work."""

    host: float
    device: float


def rate_key(op: OpCost, hardware: Hardware) -> str:
    """Which of ``hardware.peak_flops`` an op runs at: its dtype, or TF32 for float32
    convolutions and matmuls where torch's ``allow_tf32`` flags say so."""
    # (a dtype the hardware has no units for is refused by flops_per_second)
    flags = {"conv": torch.backends.cudnn, "matmul": torch.backends.cuda.matmul}.get(op.kind)
    tf32 = flags is not None and flags.allow_tf32 and "tfloat32" in hardware.peak_flops
    return "tfloat32" if op.dtype == "float32" and tf32 else op.dtype


def interpolate(samples: OpSamples, work: float) -> float:
    """Seconds for ``work`` from sorted ``(work, seconds)`` samples: log-log between the two
    around it; below the first, its time (a fixed cost); beyond the last, its rate."""
    if work <= samples[0][0]:
        return samples[0][1]
    index = bisect_left([w for w, _ in samples], work)
    if index >= len(samples):
        return samples[-1][1] * work / samples[-1][0]
    (w0, t0), (w1, t1) = samples[index - 1], samples[index]
    if w0 <= 0 or t0 <= 0 or t1 <= 0 or w1 == w0:
        return t1
    share = (math.log(work) - math.log(w0)) / (math.log(w1) - math.log(w0))
    return math.exp(math.log(t0) + share * (math.log(t1) - math.log(t0)))


def op_time(op: OpCost, rows: int, hardware: Hardware) -> float:
    """Device seconds of one op at ``rows`` rows: measured, else the roofline."""
    flops, nbytes = op.flops_at(rows), op.bytes_at(rows)
    samples = hardware.op_seconds.get(op.name)
    if samples:
        return interpolate(samples, op.work_at(rows))
    compute = flops / hardware.flops_per_second(rate_key(op, hardware)) if flops > 0 else 0.0
    return max(compute, nbytes / hardware.achieved_memory_bandwidth)


def pass_time(cost: PassCost, rows: int, hardware: Hardware, backward: bool) -> PassTime:
    """A forward's or backward's seconds: the host pays ``op_overhead`` per call the
    forward's Python makes into torch, ``backward_op_overhead`` per op autograd runs."""
    device = sum(op_time(op, rows, hardware) for op in cost.ops)
    if backward:
        return PassTime(host=len(cost) * hardware.backward_op_overhead, device=device)
    return PassTime(host=host_calls(cost) * hardware.op_overhead, device=device)


def host_calls(cost: PassCost) -> int:
    """A forward's calls into torch where profiled, else one per aten op."""
    return len(cost) if cost.calls is None else cost.calls


def elementwise_time(nbytes: float, hardware: Hardware) -> float:
    """Device seconds of a memory-bound op over ``nbytes`` (an add, a flatten's copy)."""
    samples = hardware.op_seconds.get("aten.add")
    return interpolate(samples, nbytes) if samples else nbytes / hardware.achieved_memory_bandwidth
