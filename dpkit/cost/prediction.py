"""predict: a training step on hardware you may not have, as a Trace marked predicted.

The surprise first: the prediction *is* a trace, with the phases, bytes (exact: they follow
from the model's tensors), steps and memory records a measured ``dpkit.trace()`` has; only
its times come from the cost model, on two clocks: the host's and each device's queue.

``"dp"`` (``nn.DataParallel``, one process on one node): scatter from device 0, replicate, a
thread per replica for the forward (their Python takes turns with the GIL), gather and the
loss on device 0; backward scatters its gradient, each replica runs its backward, and once
*all* are done the gradients are summed onto device 0. GPUs copy and run NCCL calls; on
virtual lanes (dpkit's CPU lanes) the host makes every copy and the threads share the cores.
``"ddp"`` (a process per device, any number of nodes): each gradient bucket is all-reduced
once its last gradient is ready, overlapping the rest of the backward. A step is forward and
backward: the optimizer's state is in the memory, its step is not.
"""

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dpkit.chunk_plans import torch_chunk_sizes
from dpkit.cost import collectives
from dpkit.cost.catalog import preset
from dpkit.cost.compute import PassTime, elementwise_time, host_calls, op_time, pass_time
from dpkit.cost.hardware import Hardware
from dpkit.cost.memory import Held, ddp_memory, dp_memory, optimizer_copies, with_blas_workspaces
from dpkit.cost.profiling import Profile, profile
from dpkit.ddp.checks import check_bucket_cap
from dpkit.device import Device
from dpkit.tracing import KIND_LABELS, PREDICTED, Event, Phase, Trace

STRATEGIES = ("dp", "ddp")
# torch DDP's defaults: bucket_cap_mb=25, and a first bucket of dist._DEFAULT_FIRST_BUCKET_BYTES
# (1 MiB), so that the last layers' gradients, ready first, start communicating early. A cap
# given, even 25, is every bucket's, the first's too (distributed.py, _BucketCapacityConfig).
DDP_BUCKET_BYTES, DDP_FIRST_BUCKET_BYTES = 25 * 1024 * 1024, 1024 * 1024
# The loss between gather and the gradient's scatter (cross_entropy: log_softmax, nll_loss,
# their backward and autograd's seed): a few ops on device 0, outside DataParallel.
LOSS_OPS = 6


class PredictedTrace(Trace):
    """A :class:`~dpkit.tracing.Trace` of kind "predicted" on ``.machine``, with the bytes
    each device holds by category (``.held``, :mod:`dpkit.cost.memory`)."""

    def __init__(self, machine: Hardware, strategy: str, batch_size: int, devices: int):
        super().__init__()
        self.origin = 0.0  # predicted times start at 0 s
        self.machine, self.strategy, self.batch_size = machine, strategy, batch_size
        self.device_count = devices
        self.gradient_as_bucket_view = False  # DDP's .grad views its bucket (no copy back)
        self.step_bounds: dict[int, tuple[float, float]] = {}  # step -> (begins, ends)
        self.held: list[Held] = []

    @property
    def hardware(self) -> str:  # the figures' titles: "predicted devices (cost model): <name>, dp"
        return f"{KIND_LABELS[PREDICTED]}: {self.machine.name}, {self.strategy}"

    @property
    def step_time(self) -> float:
        """Predicted seconds of the last step, as a wall clock around it would read."""
        begins, ends = self.step_bounds[max(self.step_bounds)]
        return ends - begins

    @property
    def memory_per_device(self) -> list[int]:  # predicted bytes at each device's peak
        return [sum(device.values()) for device in self.held]

    @property
    def fits(self) -> bool:
        return max(self.memory_per_device) <= self.machine.memory_capacity


@dataclass
class _Step:
    """One step being built: the host's clock, each device's queue, and the events."""

    trace: PredictedTrace
    names: list[str]
    step: int
    host: float
    device: list[float]

    def event(self, phase: Phase, index: int, start: float, end: float, nbytes: int = 0,
              **details: Any) -> None:  # fmt: skip
        self.trace._events.append(Event(phase.value, self.names[index], start, end, int(nbytes),
                                        self.step, PREDICTED, details))  # fmt: skip

    def run(self, phase: Phase, index: int, seconds: float, **details: Any) -> None:
        """Work on device ``index`` that the host waits for, once both are free."""
        start = max(self.host, self.device[index])
        self.host = self.device[index] = start + seconds
        self.event(phase, index, start, self.host, **details)

    def collective(self, hardware: Hardware, phase: Phase, calls: int, took: float,
                   nbytes: int, n: int, **details: Any) -> None:  # fmt: skip
        """``calls`` NCCL calls on the first ``n`` GPUs at once (those that got a chunk: torch
        replicates onto no other), once all are free."""
        self.host += hardware.copy_overhead + calls * hardware.op_overhead
        start = max(self.host, *self.device[:n])
        for index in range(n):
            self.event(phase, index, start, start + took, nbytes if index else 0, **details)
        self.device[:n] = [start + took] * n

    def busy(self, host: float) -> tuple[float, float]:
        """The host does ``host`` seconds of work itself (virtual lanes)."""
        start, self.host = self.host, self.host + host
        return start, self.host


def _threads(starts: list[float], calls: int, python: list[float], kernel: list[float],
             units: float, caller: float = 0.0) -> list[float]:  # fmt: skip
    """When threads end that each make ``calls`` calls, each ``python[i]`` seconds holding the
    GIL (granted in the order asked) then ``kernel[i]`` without it (torch lets it go around an
    op's work), on ``units`` cores shared fairly. DDP's ranks share no GIL: ``python`` 0, one
    call each. ``caller`` (lanes' parallel_apply): from ``starts[0]`` the caller starts the
    threads one by one, each start holding the GIL ``caller`` seconds (a new thread runs
    Python to begin); ``starts`` is then filled in with when each thread began."""
    n = len(starts)
    left_calls, begin = [calls] * n, list(starts)
    if caller:  # the caller as one more thread, whose n calls start the others
        begin, left_calls = [math.inf] * n + starts[:1], [*left_calls, n]
        python, kernel = [*python, caller], [*kernel, 0.0]
    every = range(len(begin))
    state = ["new"] * len(begin)  # new, waiting (for the GIL), python, kernel, done
    left, ends = [0.0] * len(begin), [0.0] * len(begin)
    waiting: list[int] = []
    now = min(begin)
    while any(s != "done" for s in state):
        for i in every:
            if state[i] == "new" and begin[i] <= now:
                state[i] = "waiting"
                waiting.append(i)
        if waiting and "python" not in state:  # the GIL is free: the first to ask takes it
            first = waiting.pop(0)
            state[first], left[first] = "python", python[first]
        running = [i for i in every if state[i] in ("python", "kernel")]
        rate = min(1.0, units / len(running)) if running else 1.0
        step_to = min((left[i] / rate for i in running), default=math.inf)
        elapsed = min([step_to, *(begin[i] - now for i in every if state[i] == "new")])
        if elapsed == math.inf:
            break
        for i in running:
            left[i] -= elapsed * rate
        now += elapsed
        for i in running:
            if left[i] > 1e-15:
                continue
            if state[i] == "python":  # lets the GIL go
                state[i], left[i] = "kernel", kernel[i]
                continue
            left_calls[i] -= 1
            if i == n:  # the caller has started thread n - 1 - left_calls[n]: it asks first
                started = n - 1 - left_calls[n]
                begin[started] = starts[started] = now
                state[started] = "waiting"
                waiting.append(started)
            if left_calls[i] > 0:
                state[i] = "waiting"
                waiting.append(i)
            else:
                state[i], ends[i] = "done", now
    return ends[:n]


def _lasts(time: PassTime, hardware: Hardware) -> float:
    """A pass on one device: host and device overlap on a GPU, add up on CPU lanes."""
    return time.host + time.device if hardware.virtual_lanes else max(time.host, time.device)


def _loss(step: _Step, hardware: Hardware, output_bytes: int) -> None:
    """The loss on device 0 between forward and backward: time, no event."""
    device = LOSS_OPS * elementwise_time(output_bytes, hardware)
    host = LOSS_OPS * hardware.op_overhead + hardware.step_overhead / 2
    if hardware.virtual_lanes:
        step.busy(host + device)
    else:  # the host issues its ops; device 0 runs them once free and issued
        step.host += host
        step.device[0] = max(step.device[0], step.host) + device


def _copies(step: _Step, hardware: Hardware, phase: Phase, sizes: Sequence[int],
            tensors: int = 1) -> list[float]:  # fmt: skip
    """Copies between device 0 and each device (entry 0: device 0's own), returning when each
    is done. Virtual lanes: the host makes each in turn. GPUs: copies out of device 0 run at
    once, sharing its link; those into it (gather) in turn, its own piece within its memory."""
    link, done, ready = hardware.device_link(), [], step.device[0]
    outward = phase in (Phase.SCATTER, Phase.GRAD_SCATTER, Phase.REPLICATE)
    moved = sum(sizes[1:])
    per_copy = tensors * hardware.op_overhead  # its ops; and dpkit's Python around them,
    if phase is not Phase.GRAD_SCATTER:  # except in gather's backward, which autograd runs
        per_copy += hardware.copy_overhead
    step.host += 0.0 if hardware.virtual_lanes else len(sizes) * per_copy
    for index, size in enumerate(sizes):
        moves = index > 0 and size > 0
        wire = tensors * link.latency + size / link.bandwidth if moves else 0.0
        if index == 0 and phase is Phase.GATHER:
            wire = 2 * elementwise_time(size, hardware)
        if hardware.virtual_lanes:
            start, end = step.busy(per_copy + wire)
        elif outward:  # at once, sharing device 0's link: all done when all bytes are out
            start = max(step.host, ready)
            end = start + (link.latency * tensors + moved / link.bandwidth if moves else 0.0)
            step.device[index] = max(step.device[index], end)
        else:  # into device 0, one after another on its stream
            start = max(step.host, step.device[0], step.device[index])
            end = step.device[0] = start + wire
        step.event(phase, index, start, end, size if moves else 0)
        done.append(end)
    return done


def _dp_step(step: _Step, model: Profile, hardware: Hardware, sizes: list[int]) -> None:
    n = len(sizes)
    forward = {r: pass_time(model.forward, r, hardware, False) for r in set(sizes)}
    backward = {r: pass_time(model.backward, r, hardware, True) for r in set(sizes)}
    step.host += hardware.step_overhead / 4  # DataParallel's entry: checks, a new step
    _copies(step, hardware, Phase.SCATTER, [model.input_bytes(r) for r in sizes])
    if n == 1:  # DataParallel calls the module itself: no replicas, no threads
        note = "one device: the module itself"
        step.run(Phase.APPLY, 0, _lasts(forward[sizes[0]], hardware), replica=0, note=note)
        _loss(step, hardware, model.grad_output_bytes(sizes[0]))
        step.run(Phase.BACKWARD, 0, _lasts(backward[sizes[0]], hardware))
        return
    _replicate(step, model, hardware, n)
    _apply(step, model, hardware, [forward[rows].device for rows in sizes])
    outputs = [model.output_bytes(r) for r in sizes]
    _copies(step, hardware, Phase.GATHER, outputs, tensors=model.output_tensors)
    # the loss reads, and Gather's backward scatters a gradient for, only the outputs on
    # the loss's autograd path: those that require grad
    gradients = [model.grad_output_bytes(r) for r in sizes]
    _loss(step, hardware, sum(gradients))
    arrived = _copies(step, hardware, Phase.GRAD_SCATTER, gradients,
                      tensors=model.grad_output_count)  # fmt: skip
    times = [backward[r] for r in sizes]
    if hardware.virtual_lanes:  # autograd runs every replica's backward in the caller's thread
        start = max(step.host, *arrived)
        end = step.host = start + sum(t.host + t.device for t in times)
        for index in range(n):
            step.event(Phase.BACKWARD, index, start, end, thread="shared")
    else:  # a backward thread per GPU, each starting once its gradient has arrived
        for index, time in enumerate(times):
            start = max(arrived[index], step.device[index])
            step.device[index] = start + max(time.host, time.device)
            step.event(Phase.BACKWARD, index, start, step.device[index])
    _reduce(step, model, hardware, n)


def _replicate(step: _Step, model: Profile, hardware: Hardware, n: int) -> None:
    """The parameters, then the buffers, to every device (GPUs: an NCCL broadcast per
    10 MiB; lanes: a copy per tensor); then the replica modules, built by the host."""
    for sizes in filter(None, (model.parameter_sizes, model.buffer_sizes)):
        if hardware.virtual_lanes:
            _copies(step, hardware, Phase.REPLICATE, [0] + [sum(sizes)] * (n - 1),
                    tensors=len(sizes))  # fmt: skip
            continue
        calls = collectives.messages(sizes)
        # One way, so not the all-reduce's link through host memory (nccl#384: broadcast
        # 10.3 GB/s, all-reduce 3.9); without peer to peer, down and up (6.3 on PCIe 3)
        took = collectives.broadcast(sum(sizes), n, hardware.device_link(), calls)
        step.collective(hardware, Phase.REPLICATE, calls, took, sum(sizes), n, tensors=len(sizes))
    start, end = step.busy(hardware.module_overhead * model.modules * n)
    step.event(Phase.REPLICATE, 0, start, end, what="modules", modules=model.modules)


def _apply(step: _Step, model: Profile, hardware: Hardware, forward: list[float]) -> None:
    """A thread per replica, started one after another; their Python takes turns. ``forward``:
    each replica's seconds on its device."""
    n = len(forward)
    calls = max(1, host_calls(model.forward))  # each call's Python holds the GIL
    per_call = [hardware.op_overhead + hardware.gil_handoff] * n
    if hardware.virtual_lanes:  # ... then its kernels run on the shared cores without it;
        kernels, begins = [d / calls for d in forward], [step.host] * n  # the caller's starts
        ends = _threads(begins, calls, per_call, kernels, hardware.compute_units,
                        hardware.thread_start)  # fmt: skip
        step.host = max(ends)
    else:  # ... and only queues the GPU's kernels
        starts = [step.host + (i + 1) * hardware.thread_start for i in range(n)]
        launched = _threads(starts, calls, per_call, [0.0] * n, float(n))
        begins = [max(s, q) for s, q in zip(starts, step.device)]
        ends = [max(h, b + d) for h, b, d in zip(launched, begins, forward)]
        step.host = max(launched)  # the caller joins its threads; the GPUs run on
        step.device = list(ends)
    for index in range(n):
        step.event(Phase.APPLY, index, begins[index], ends[index], replica=index)


def _reduce(step: _Step, model: Profile, hardware: Hardware, n: int) -> None:
    """The gradients summed onto device 0 after every backward. GPUs: an NCCL reduce per
    10 MiB (flattened, then unflattened); lanes: each copied to lane 0 and added there."""
    sizes, total = model.gradient_sizes, model.gradient_bytes
    if hardware.virtual_lanes:  # (the host has run every backward: the lanes are free)
        _copies(step, hardware, Phase.REDUCE, [0] + [total] * (n - 1), tensors=len(sizes))
        adds = (n - 1) * (len(sizes) * hardware.op_overhead + elementwise_time(3 * total, hardware))
        start, end = step.busy(adds)
        step.event(Phase.REDUCE, 0, start, end, what="sum", tensors=len(sizes))
        return
    calls = collectives.messages(sizes)
    flatten = elementwise_time(2 * total, hardware)  # read the gradients, write the buffer
    took = 2 * flatten + collectives.reduce(total, n, hardware.device_link(), calls)  # one way
    step.collective(hardware, Phase.REDUCE, calls, took, total, n, tensors=len(sizes))


def ddp_buckets(sizes: Sequence[int], bucket_bytes: int = DDP_BUCKET_BYTES,
                first_bucket_bytes: int = DDP_FIRST_BUCKET_BYTES) -> list[list[int]]:  # fmt: skip
    """DDP's gradient buckets: parameter indices from the last (whose gradient is ready
    first), a bucket closed once it holds at least its cap, as torch's
    ``_compute_bucket_assignment_by_size`` (a 1.5 MiB cap can give a 2.1 MB bucket)."""
    buckets: list[list[int]] = [[]]
    filled, limit = 0, first_bucket_bytes
    for index in reversed(range(len(sizes))):
        buckets[-1].append(index)
        filled += sizes[index]
        if filled >= limit:
            buckets.append([])
            filled, limit = 0, bucket_bytes
    return [bucket for bucket in buckets if bucket]


def allreduce_schedule(parameter_sizes: Sequence[int], ready_at: Sequence[float], n: int,
                       hardware: Hardware, bucket_bytes: int = DDP_BUCKET_BYTES,
                       first_bucket_bytes: int = DDP_FIRST_BUCKET_BYTES,
                       ) -> list[tuple[list[int], float, float, int]]:  # fmt: skip
    """DDP's all-reduces, ``(parameter indices, start, end, bytes)`` per bucket: each
    starts once its gradients are ready (``ready_at``) and the one before it is done."""
    schedule, free = [], 0.0
    for bucket in ddp_buckets(parameter_sizes, bucket_bytes, first_bucket_bytes):
        nbytes = sum(parameter_sizes[i] for i in bucket)
        start = max(free, max(ready_at[i] for i in bucket))
        free = start + collectives.allreduce(nbytes, n, hardware)
        schedule.append((bucket, start, free, nbytes))
    return schedule


def gradient_ready(model: Profile, rows: int, hardware: Hardware) -> list[float]:
    """Seconds into the backward at which each gradient is ready: the end of the op that
    produced it (by work, not bytes: VGG's fully connected layers hold 89 % of its bytes,
    under 1 % of its work); an unused one at the end."""
    times = [op_time(op, rows, hardware) for op in model.backward.ops]
    ends = [0.0, *itertools.accumulate(t + hardware.backward_op_overhead for t in times)]
    return [ends[i + 1] if i >= 0 else ends[-1] for i in model.gradient_ops]


def _ddp_step(step: _Step, model: Profile, hardware: Hardware, sizes: list[int],
              caps: tuple[int, int], bucket_view: bool) -> None:  # fmt: skip
    n = len(sizes)
    start = step.host + hardware.step_overhead / 4
    if model.buffer_sizes and n > 1:  # broadcast_buffers=True: rank 0's, every forward
        link = collectives.allreduce_link(hardware, n)
        calls = collectives.messages(model.buffer_sizes)
        took = collectives.broadcast(model.buffer_bytes, n, link, calls)
        for index in range(n):
            moved = model.buffer_bytes if index else 0
            step.event(Phase.REPLICATE, index, start, start + took, moved, what="buffers")
        start += took
    forward = [pass_time(model.forward, rows, hardware, False) for rows in sizes]
    # DDP's reducer copies each gradient into its bucket (copy_grad_to_bucket), and after the
    # all-reduces back into .grad (finalize_bucket_dense) unless gradient_as_bucket_view
    copies = PassTime(len(model.gradient_sizes) * hardware.backward_op_overhead,
                      elementwise_time(2 * model.gradient_bytes, hardware))  # fmt: skip
    backward = [pass_time(model.backward, rows, hardware, True) for rows in sizes]
    backward = [PassTime(t.host + copies.host, t.device + copies.device) for t in backward]
    # each rank's loss on its own outputs that require grad (and autograd's start)
    loss = [LOSS_OPS * (hardware.op_overhead + elementwise_time(model.grad_output_bytes(rows),
                                                                hardware))
            + hardware.step_overhead / 2 for rows in sizes]  # fmt: skip

    def ends(starts: list[float], times: list[PassTime]) -> list[float]:
        if hardware.virtual_lanes:  # a process per rank, sharing the cores
            work = [t.host + t.device for t in times]
            return _threads(starts, 1, [0.0] * n, work, hardware.compute_units)
        return [begin + _lasts(t, hardware) for begin, t in zip(starts, times)]

    forward_ends = ends([start] * n, forward)
    backward_starts = [end + own for end, own in zip(forward_ends, loss)]
    backward_ends = ends(backward_starts, backward)
    for index in range(n):
        step.event(Phase.APPLY, index, start, forward_ends[index], replica=index)
        step.event(Phase.BACKWARD, index, backward_starts[index], backward_ends[index])
    end = max(backward_ends)
    if n > 1:
        slowest = max(range(n), key=backward_ends.__getitem__)
        # a rank sharing cores with others runs its backward slower
        alone = max(backward[slowest].device + backward[slowest].host, 1e-12)
        stretch = (backward_ends[slowest] - backward_starts[slowest]) / alone
        ready = [backward_starts[slowest] + t * stretch
                 for t in gradient_ready(model, sizes[slowest], hardware)]  # fmt: skip
        schedule = allreduce_schedule(model.gradient_sizes, ready, n, hardware, *caps)
        for number, (bucket, bucket_start, bucket_end, nbytes) in enumerate(schedule):
            sent = collectives.ring_bytes_sent(nbytes, n)
            for index in range(n):
                step.event(Phase.ALLREDUCE, index, bucket_start, bucket_end, sent, bucket=number,
                           bucket_bytes=nbytes, tensors=len(bucket))  # fmt: skip
            end = max(end, bucket_end)
    if not bucket_view:  # the sums back into .grad once the last bucket is in: autograd's
        end += _lasts(copies, hardware)  # final callback, no phase of its own
    step.host = end
    step.device = [end] * n


def predict(model: nn.Module, sample_input: Any, batch_size: int,
            devices: int | Sequence[Device], hardware: Hardware | str, strategy: str = "dp",
            steps: int = 1, *, sample_kwargs: Mapping[str, Any] | None = None,
            amp: torch.dtype | str | None = None, optimizer: str = "sgd",
            gradient_as_bucket_view: bool = False,
            bucket_cap_mb: float | None = None) -> PredictedTrace:  # fmt: skip
    """A predicted trace of ``steps`` training steps of ``model`` on ``batch_size`` rows like
    ``sample_input`` (a tensor, or a tuple of inputs; ``sample_kwargs`` keyword inputs), on
    ``devices`` (a count or a list) of ``hardware`` (a Hardware or a preset's name), with
    ``strategy`` ``"dp"`` (DataParallel: one node) or ``"ddp"``.

    ``amp`` (``"bf16"``, ``"fp16"`` or their dtypes): under ``torch.autocast``; ``optimizer``
    (sgd, momentum, adam, adamw) sets the state in the memory; ``gradient_as_bucket_view``
    and ``bucket_cap_mb`` are DDP's (None: torch's 25 MiB, the first bucket 1 MiB; a cap given
    is the first bucket's too). Every DDP step is a later one: with torch's defaults the
    very first step all-reduces all gradients in one bucket, and the buckets are then
    rebuilt in the order the gradients became ready. ``tr.step_time``: seconds per step;
    ``tr.held``: bytes by category per device, ``tr.memory_per_device`` their sums,
    ``tr.fits``."""
    hardware = preset(hardware) if isinstance(hardware, str) else hardware
    if not isinstance(hardware, Hardware):
        kind = type(hardware).__name__
        raise TypeError(f"hardware must be a dpkit.cost.Hardware or a preset name, got {kind}")
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is not known; use 'dp' or 'ddp'")
    for name, value in (("batch_size", batch_size), ("steps", steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    bucket_cap_mb = check_bucket_cap(bucket_cap_mb)  # as torch's DDP would take it
    optimizer_copies(optimizer)
    is_list = isinstance(devices, Sequence) and not isinstance(devices, str)
    if isinstance(devices, bool) or not (isinstance(devices, int) or is_list):
        raise TypeError(f"devices must be a count (e.g. 8) or a list of devices, got {devices!r}")
    count = len(devices) if is_list else devices
    if count < 1:
        raise ValueError(f"devices must be at least 1, got {count}")
    # virtual lanes are threads of one process on one machine, however many
    nodes_apart = count > hardware.devices_per_node and not hardware.virtual_lanes
    if strategy == "dp" and nodes_apart:  # one process, one machine
        raise ValueError(
            f"strategy='dp' on {count} devices: nn.DataParallel is one process with a thread "
            f"per device, so it uses the devices of one machine ({hardware.devices_per_node} "
            f"on {hardware.name!r}). Across machines, train with strategy='ddp' "
            "(DistributedDataParallel: a process per device, started by torchrun on each node)"
        )
    sizes, per_node = torch_chunk_sizes(batch_size, count), hardware.devices_per_node
    chunks = len(sizes)
    if strategy == "ddp" and chunks < count:  # DataParallel leaves devices idle; DDP cannot
        raise ValueError(
            f"batch_size={batch_size} over devices={count} leaves {count - chunks} of {count} "
            f"ranks without rows (torch.chunk's split makes {chunks} chunks), and every DDP rank "
            f"trains on rows of its own; use a multiple of {count}, e.g. "
            f"batch_size={(batch_size // count + 1) * count}"
        )
    cost = profile(model, sample_input, sample_kwargs=sample_kwargs, amp=amp)
    trace = PredictedTrace(hardware, strategy, batch_size, count)
    trace.gradient_as_bucket_view = gradient_as_bucket_view
    # "predicted:3 (A100)", with the node past one
    node = (lambda i: f", node {i // per_node})") if nodes_apart else (lambda i: ")")
    names = [f"predicted:{i} ({hardware.device_name}{node(i)}" for i in range(count)]
    gpu = not hardware.virtual_lanes
    if strategy == "dp":
        held = dp_memory(cost, sizes, optimizer, gpu)
    else:
        held = ddp_memory(cost, sizes, optimizer, gradient_as_bucket_view)
    trace.held = with_blas_workspaces(held, cost, hardware.device_name) if gpu else held
    caps = (DDP_BUCKET_BYTES, DDP_FIRST_BUCKET_BYTES)  # (every bucket's, the first's)
    if bucket_cap_mb is not None:  # as DDP turns it into bytes
        caps = (int(bucket_cap_mb * 1024 * 1024),) * 2
    start = 0.0
    for number in range(1, steps + 1):
        step = _Step(trace, names, number, start, [start] * count)
        if strategy == "dp":
            _dp_step(step, cost, hardware, sizes)
        else:
            _ddp_step(step, cost, hardware, sizes, caps, gradient_as_bucket_view)
        # after the last phase: autograd finishing (gradients into .grad), the step's end
        end = max(step.host, *step.device) + hardware.step_overhead / 4
        trace.step_bounds[number] = (start, end)
        for index, held in enumerate(trace.held):  # memory records as measured, buffers apart
            for category, nbytes in held.items():
                split = category == "parameters" and cost.buffer_bytes
                parts = [nbytes - cost.buffer_bytes, cost.buffer_bytes] if split else [nbytes]
                for part in filter(None, parts):
                    trace._memory.append((names[index], category, int(part), number, PREDICTED))
        start = end
    return trace
