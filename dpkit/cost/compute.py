"""How long one device takes for a forward or a backward of its chunk: the roofline, op by op.

The surprise first: most ops of a small model are not limited by FLOPs at all. A ReLU, a
max-pool or a layer norm does no matmul work; it reads and writes memory, and on a CPU it
may be slower still. So each op takes the longer of its FLOPs at the achieved FLOP/s and its
bytes at the achieved memory bandwidth (the roofline of Williams, Waterman and Patterson,
CACM 2009), and the host pays a launch overhead per op on top.

On a calibrated machine (:func:`dpkit.cost.calibrate`) measured seconds replace the roofline
for every kind of op that was measured: ``Hardware.op_seconds`` holds, per aten op, how long
it took for how much work (FLOPs, or bytes for ops without FLOPs), and the time for another
amount of work is interpolated between those samples on a log-log scale (extrapolated at the
last measured rate beyond them). That is what "achieved FLOP/s on the model's kind of work"
means here: a CPU reaches very different rates on a matmul, a 3x3 convolution with 8
channels and a max-pool, and no single number would do.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass

from dpkit.cost.hardware import Hardware, OpSamples
from dpkit.cost.profile import OpCost, PassCost


@dataclass(frozen=True)
class PassTime:
    """One pass on one device: ``host`` seconds of launching (Python, dispatcher, autograd
    engine) and ``device`` seconds of the ops' own work."""

    host: float
    device: float


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


def op_time(op: OpCost, rows: int, hardware: Hardware, flops_per_second: float) -> float:
    """Device seconds of one op at ``rows`` rows: measured if its shape or at least its kind
    was calibrated, else the roofline, ``max(FLOPs / achieved FLOP/s, bytes / achieved
    bandwidth)``."""
    flops, nbytes = op.flops_at(rows), op.bytes_at(rows)
    samples = hardware.op_seconds.get(op.shape_key) or hardware.op_seconds.get(op.name)
    if samples:
        return interpolate(samples, flops if flops > 0 else nbytes)
    return max(flops / flops_per_second, nbytes / hardware.achieved_memory_bandwidth)


def pass_time(
    cost: PassCost, rows: int, hardware: Hardware, flops_per_second: float, backward: bool
) -> PassTime:
    """Host and device seconds of a forward (``backward=False``) or backward of ``rows``."""
    per_op = hardware.autograd_overhead if backward else hardware.launch_overhead
    device = sum(op_time(op, rows, hardware, flops_per_second) for op in cost.ops)
    return PassTime(host=len(cost) * per_op, device=device)


def elementwise_time(name: str, nbytes: float, hardware: Hardware) -> float:
    """Device seconds of a memory-bound op ``name`` (``"aten.add"``, ...) over ``nbytes``."""
    return op_time(OpCost(name, (0.0, 0.0), (nbytes, 0.0)), 0, hardware, 1.0)
