"""predict: a training step on hardware you may not have, as a Trace marked predicted.

The surprise first: the prediction *is* a trace. It has the phases, bytes, steps and memory
records a measured ``dpkit.trace()`` of the same model, batch and device count has (the bytes
exactly, since they follow from the model's tensors alone), and only its times come from the
cost model. So every summary, export and figure works on it unchanged, and every one of them
says "predicted" (the events' kind is :data:`~dpkit.devices.PREDICTED`).

Two strategies, built side by side so that the difference shows:

``"dp"``  what ``DataParallel`` does every step, as dpkit runs it: scatter the batch from
          device 0, broadcast the parameters from device 0 (replicate, then build the replica
          modules in the caller's thread), start a thread per replica (apply), gather the
          outputs on device 0; in backward scatter the output's gradient, run each replica's
          backward, and reduce-add every gradient onto device 0. Every copy starts or ends at
          device 0, one after another (``Hardware.funnel_through_device0``).
``"ddp"`` what ``DistributedDataParallel`` does: one process per device, parameters
          broadcast once at construction (not per step), a forward and a backward per rank,
          and the gradients all-reduced in buckets (torch's defaults: 25 MiB, the first one
          1 MiB, filled in the order gradients become ready), each bucket's ring all-reduce
          starting as soon as its last gradient is ready, overlapping the rest of backward.

Times come from a small simulation with two clocks, the host's and each device's: on a GPU
the host queues copies and kernels and runs ahead (a phase lasts the longer of its host and
its device part); on CPU lanes the host does the work itself, the lanes' threads share the
cores (``Hardware.compute_units``) and take turns with Python's GIL, and autograd runs every
replica's backward in one thread. A prediction takes a few milliseconds once the model is
profiled (:func:`dpkit.cost.profile`, cached).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dpkit.cost.collectives import allreduce, ring_bytes_sent
from dpkit.cost.compute import PassTime, elementwise_time, pass_time
from dpkit.cost.hardware import Hardware, Link
from dpkit.cost.presets import preset
from dpkit.cost.profile import Profile, profile
from dpkit.devices import KIND_LABELS, PREDICTED, Device
from dpkit.scatter import torch_chunk_sizes
from dpkit.tracing import Event, Phase, Trace

STRATEGIES = ("dp", "ddp")
# torch.nn.parallel.DistributedDataParallel's defaults: bucket_cap_mb=25, and a first bucket
# of dist._DEFAULT_FIRST_BUCKET_BYTES (1 MiB) so that the last layers' gradients, ready
# first, start communicating early.
DDP_BUCKET_BYTES = 25 * 1024 * 1024
DDP_FIRST_BUCKET_BYTES = 1024 * 1024
# The loss between gather and the gradient's scatter (cross_entropy: log_softmax, nll_loss
# and their backward, plus autograd's seed): a few ops on device 0, outside DataParallel.
LOSS_OPS = 6


class PredictedTrace(Trace):
    """A :class:`~dpkit.tracing.Trace` made by the cost model: the same events and memory
    records as a measured one, every event of kind ``"predicted"``, and a title that names
    the hardware (``.machine``) and the strategy."""

    def __init__(self, machine: Hardware, strategy: str, batch_size: int, devices: int):
        super().__init__()
        self.origin = 0.0  # predicted times start at 0 s
        self.machine = machine
        self.strategy = strategy
        self.batch_size = batch_size
        self.device_count = devices
        self.step_bounds: dict[int, tuple[float, float]] = {}  # step -> (begins, ends)

    @property
    def hardware(self) -> str:
        """What the figures' titles say: "predicted devices (cost model): <name>, dp"."""
        return f"{KIND_LABELS[PREDICTED]}: {self.machine.name}, {self.strategy}"

    @property
    def step_time(self) -> float:
        """Predicted seconds of one step, as a wall clock around ``loss.backward()`` and the
        forward before it would read them: the phases, and the Python before, between and
        after them (``Hardware.step_overhead``)."""
        begins, ends = self.step_bounds[max(self.step_bounds)]
        return ends - begins


def device_names(hardware: Hardware, n: int) -> list[str]:
    """How predicted devices are named: ``"predicted:3 (A100)"``, with the node past one."""
    per_node = hardware.devices_per_node
    return [
        f"predicted:{i} ({hardware.device_name}"
        + (f", node {i // per_node})" if n > per_node else ")")
        for i in range(n)
    ]


@dataclass
class _Clock:
    """The host's clock and each device's queue, for one step."""

    host: float
    device: list[float]


class _Step:
    """Builds one step's events and memory records into a trace."""

    def __init__(self, trace: PredictedTrace, names: list[str], step: int, start: float):
        self.trace, self.names, self.step = trace, names, step
        self.clock = _Clock(start, [start] * len(names))

    def event(self, phase: Phase, index: int, start: float, end: float, nbytes: int = 0,
              **details: Any) -> None:  # fmt: skip
        self.trace._events.append(
            Event(
                phase.value,
                self.names[index],
                start,
                end,
                int(nbytes),
                self.step,
                PREDICTED,
                details,
            )  # fmt: skip
        )

    def memory(self, index: int, category: str, nbytes: int) -> None:
        self.trace._memory.append((self.names[index], category, int(nbytes), self.step, PREDICTED))


def _link_from_device0(hardware: Hardware, index: int) -> Link:
    """Device 0 to device ``index``: inside its node, or over the network to another node."""
    return hardware.device_link() if index < hardware.devices_per_node else hardware.node_to_node


def _copies(
    step: _Step,
    hardware: Hardware,
    phase: Phase,
    sizes: Sequence[int],
    local: bool = False,
    extra: tuple[float, float] = (0.0, 0.0),
    **details: Any,
) -> list[float]:
    """Copies between device 0 and each device (``sizes[i]`` bytes for device i, entry 0
    staying put), one event per device; returns when each device's copy is done.

    Funnelled, the copies run one after another on one queue; else each on its own link.
    On a synchronous machine the host does them; on a GPU the host queues them and runs on.
    ``local``: device 0's share is copied too, within its memory (gather copies every piece
    into its result), moving no bytes between devices. ``extra``: ``(per call, per device)``
    host seconds on top (:meth:`~dpkit.cost.Hardware.phase_extra`).
    """
    clock, done = step.clock, []
    tensors = details.get("tensors", 1)  # reduce copies each gradient, one after another
    fitted = hardware.phase_overheads.get(phase._value_)
    for index, size in enumerate(sizes):
        moves = index > 0 and size > 0
        copies = moves or (local and size > 0)
        if fitted is not None:  # calibrated in steps: per call (on the first event), per device
            host = fitted[1] + (fitted[0] if index == 0 else 0.0)
        else:
            host = hardware.event_overhead + (tensors * hardware.copy_overhead if copies else 0.0)
        host += extra[1] + (extra[0] if index == 0 else 0.0)
        if moves:
            link = _link_from_device0(hardware, index)
            device = tensors * link.latency + size / link.bandwidth
        else:
            device = 2 * size / hardware.achieved_memory_bandwidth if copies else 0.0
        if not hardware.asynchronous:
            start, end = clock.host, clock.host + host + device
            clock.host = end
        else:
            clock.host += host
            queue = 0 if hardware.funnel_through_device0 else index
            start = max(clock.device[queue], clock.host)
            end = start + device
            clock.device[queue] = end
        step.event(phase, index, start, end, size if moves else 0, **details)
        done.append(end)
    return done


def _share_cores(starts: list[float], work: list[float], units: float) -> list[float]:
    """When each of several threads ends, each needing ``work[i]`` seconds of a core from
    ``starts[i]``, when they share ``units`` cores fairly (each runs at ``min(1, units /
    running)``): processor sharing, simulated from one start or end to the next."""
    ends = [0.0] * len(work)
    left = list(work)
    pending = sorted(range(len(work)), key=starts.__getitem__)
    running: list[int] = []
    now = starts[pending[0]] if pending else 0.0
    while pending or running:
        while pending and starts[pending[0]] <= now:
            running.append(pending.pop(0))
        if not running:
            now = starts[pending[0]]
            continue
        rate = min(1.0, units / len(running))
        finish = min(left[i] for i in running) / rate
        arrive = starts[pending[0]] - now if pending else float("inf")
        elapsed = min(finish, arrive)
        for i in running:
            left[i] -= elapsed * rate
        now += elapsed
        for i in [i for i in running if left[i] <= 1e-15]:
            ends[i] = now
            running.remove(i)
    return ends


def _threads_end(
    starts: list[float], work: list[float], python: float, units: float
) -> list[float]:
    """When threads doing ``work`` on shared cores end (:func:`_share_cores`), held back so
    that the last ends no sooner than all their ``python`` seconds after the first start:
    Python's GIL lets one thread at a time run Python, however many cores there are."""
    ends = _share_cores(starts, work, units)
    first, last = min(starts), max(ends)
    if last - first >= python or last <= first:
        return ends
    stretch = python / (last - first)
    return [first + (end - first) * stretch for end in ends]


def _loss(step: _Step, hardware: Hardware, output_bytes: int) -> None:
    """The loss on device 0 between forward and backward, and autograd starting the backward:
    no event, only time (half of ``Hardware.step_overhead``, the rest before and after)."""
    host = LOSS_OPS * hardware.launch_overhead + hardware.step_overhead / 2
    device = LOSS_OPS * elementwise_time("aten.add", output_bytes, hardware)
    clock = step.clock
    if hardware.asynchronous:
        clock.host += host
        clock.device[0] = max(clock.device[0], clock.host) + device
    else:
        clock.host += host + device


def _lasts(time: PassTime, hardware: Hardware) -> float:
    """How long a pass lasts: its host and device parts overlap on a GPU, add up on a CPU."""
    return max(time.host, time.device) if hardware.asynchronous else time.host + time.device


def _one_device(
    step: _Step, model: Profile, hardware: Hardware, rows: int, forward: PassTime,
    backward: PassTime,
) -> None:  # fmt: skip
    """DataParallel on one device: the module's forward, the loss and its backward, no more."""
    clock = step.clock
    start = clock.host
    end = start + _lasts(forward, hardware)
    step.event(Phase.APPLY, 0, start, end, replica=0, note="one device: the module itself")
    clock.host = clock.device[0] = end
    _account_replica(step, model, 0, rows)
    _loss(step, hardware, model.output_bytes(rows))
    start = max(clock.host, clock.device[0])
    end = start + _lasts(backward, hardware)
    step.event(Phase.BACKWARD, 0, start, end)
    clock.host = clock.device[0] = end


def _dp_step(step: _Step, model: Profile, hardware: Hardware, batch: int, rate: float) -> None:
    sizes = torch_chunk_sizes(batch, len(step.names))
    n = len(sizes)  # devices that get a chunk, as DataParallel uses
    clock = step.clock
    input_sizes = [model.input_bytes(rows) for rows in sizes]
    output_sizes = [model.output_bytes(rows) for rows in sizes]
    forward = {rows: pass_time(model.forward, rows, hardware, rate, False) for rows in set(sizes)}
    backward = {rows: pass_time(model.backward, rows, hardware, rate, True) for rows in set(sizes)}
    for index, size in enumerate(input_sizes):
        step.memory(index, "input", size)
    working_set = model.input_bytes(batch) + model.activation_bytes(batch)

    def extra(phase: Phase) -> tuple[float, float]:
        return hardware.phase_extra(phase._value_, working_set)

    clock.host += hardware.step_overhead / 4  # DataParallel's entry: checks, a new step
    _copies(step, hardware, Phase.SCATTER, input_sizes, extra=extra(Phase.SCATTER))
    if n == 1:  # DataParallel on one device calls the module itself: no replicas, no threads
        _one_device(step, model, hardware, sizes[0], forward[sizes[0]], backward[sizes[0]])
        return

    clock.host += hardware.dp_overhead / 3  # Python between DataParallel's phases
    # replicate: parameters, then buffers, broadcast from device 0; then the replica modules
    for tensors in (model.parameter_sizes, model.buffer_sizes):
        if tensors:
            per_device = sum(tensors)
            copies = [0] + [per_device] * (n - 1)
            _broadcast(step, hardware, copies, len(tensors))
    modules_start = clock.host
    per_call, per_device = extra(Phase.REPLICATE)  # on the host, with the replica modules
    clock.host += hardware.replica_overhead * model.modules * n + per_call + per_device * n
    step.event(Phase.REPLICATE, 0, modules_start, clock.host, what="modules", modules=model.modules)

    # apply: a thread per replica, started one after another by the caller
    clock.host += hardware.dp_overhead / 3
    starts = [clock.host + (i + 1) * hardware.thread_start for i in range(n)]
    contention = hardware.gil_contention_by_model.get(model.key, hardware.gil_contention)
    per_op = hardware.launch_overhead + contention  # threads hand the GIL on
    hosts = [len(model.forward) * per_op for _ in sizes]
    devices = [forward[rows].device for rows in sizes]
    if hardware.asynchronous:
        ready = max(clock.device)  # the lanes wait for the copies queued before them
        begins = [max(s, ready) for s in starts]
        # the threads' Python (launching each op) runs one thread at a time, the GPUs at once
        launched = _threads_end(starts, hosts, sum(hosts), float(n))
        ends = [max(h, b + d) for h, b, d in zip(launched, begins, devices)]
        clock.host = max(launched)  # the caller joins its threads
        clock.device = [max(ends)] * len(clock.device)  # and its stream waits for the lanes
    else:
        work = [h + d for h, d in zip(hosts, devices)]
        ends = _threads_end(starts, work, sum(hosts), hardware.compute_units)
        begins = starts
        clock.host = max(ends)
    clock.host += n * len(model.forward) * hardware.graph_overhead  # each replica's graph
    for index in range(n):
        step.event(Phase.APPLY, index, begins[index], ends[index], replica=index)
        _account_replica(step, model, index, sizes[index])

    _copies(step, hardware, Phase.GATHER, output_sizes, local=True, extra=extra(Phase.GATHER))
    step.memory(0, "gathered", sum(output_sizes))
    _loss(step, hardware, sum(output_sizes))
    arrived = _copies(step, hardware, Phase.GRAD_SCATTER, output_sizes,
                      extra=extra(Phase.GRAD_SCATTER))  # fmt: skip

    # backward: one thread for all replicas on the CPU, a thread per device on GPUs
    times = [backward[rows] for rows in sizes]
    if hardware.serial_backward:
        start = max(clock.host, *arrived)
        total = sum(t.host + t.device for t in times)
        for index in range(n):
            step.event(Phase.BACKWARD, index, start, start + total, thread="shared")
        clock.host = start + total
        clock.device = [max(q, clock.host) for q in clock.device]
    else:
        ends = []
        for index, time in enumerate(times):
            start = arrived[index]
            ends.append(start + max(time.host, time.device))
            step.event(Phase.BACKWARD, index, start, ends[-1])
        clock.host = max(clock.host, max(ends))
        clock.device = [max(q, max(ends)) for q in clock.device]

    # reduce: every replica's gradients copied to device 0, then summed there
    clock.host += hardware.dp_overhead / 3
    gradients = model.parameter_bytes
    _copies(step, hardware, Phase.REDUCE, [0] + [gradients] * (n - 1),
            tensors=len(model.parameter_sizes))  # fmt: skip
    adds = [elementwise_time("aten.add", 3 * size, hardware) for size in model.parameter_sizes]
    per_call, per_device = extra(Phase.REDUCE)  # on the host, with the sums
    host = hardware.event_overhead + (n - 1) * len(adds) * hardware.launch_overhead
    host += per_call + per_device * n
    device = (n - 1) * sum(adds)
    if hardware.asynchronous:
        clock.host += host
        start = max(clock.device[0], clock.host)
        end = start + device
        clock.device[0] = end
    else:
        start, end = clock.host, clock.host + host + device
        clock.host = end
    step.event(Phase.REDUCE, 0, start, end, what="sum", tensors=len(adds))


def _broadcast(step: _Step, hardware: Hardware, sizes: list[int], tensors: int) -> None:
    """replicate's copies: like :func:`_copies`, paying the copy overhead per tensor."""
    clock, per_device = step.clock, max(sizes)
    for index, size in enumerate(sizes):
        link = _link_from_device0(hardware, index)
        moves = size > 0
        host = hardware.event_overhead + (tensors * hardware.copy_overhead if moves else 0.0)
        device = tensors * link.latency + size / link.bandwidth if moves else 0.0
        if not hardware.asynchronous:
            start, end = clock.host, clock.host + host + device
            clock.host = end
        else:
            clock.host += host
            queue = 0 if hardware.funnel_through_device0 else index
            start = max(clock.device[queue], clock.host)
            end = start + device
            clock.device[queue] = end
        step.event(Phase.REPLICATE, index, start, end, size, tensors=tensors)
        step.memory(index, "parameters", per_device)  # each broadcast's tensors, as dpkit notes


def _account_replica(step: _Step, model: Profile, index: int, rows: int) -> None:
    step.memory(index, "outputs", model.output_bytes(rows))
    step.memory(index, "activations", model.activation_bytes(rows))


def ddp_buckets(
    sizes: Sequence[int],
    bucket_bytes: int = DDP_BUCKET_BYTES,
    first_bucket_bytes: int = DDP_FIRST_BUCKET_BYTES,
) -> list[list[int]]:
    """DDP's gradient buckets: parameter indices, in the order gradients become ready (the
    reverse of ``parameters()``), each bucket closed once it holds at least its limit (1 MiB
    for the first, then 25 MiB), as torch's ``_compute_bucket_assignment_by_size`` does."""
    buckets: list[list[int]] = []
    current: list[int] = []
    filled, limit = 0, first_bucket_bytes
    for index in reversed(range(len(sizes))):
        current.append(index)
        filled += sizes[index]
        if filled >= limit:
            buckets.append(current)
            current, filled, limit = [], 0, bucket_bytes
    if current:
        buckets.append(current)
    return buckets


def allreduce_schedule(
    parameter_sizes: Sequence[int],
    backward_start: float,
    backward_end: float,
    n: int,
    hardware: Hardware,
) -> list[tuple[list[int], float, float, int]]:
    """DDP's bucketed all-reduces during a backward from ``backward_start`` to
    ``backward_end``: ``(parameter indices, start, end, bytes)`` per bucket.

    Gradients become ready last layer first; a parameter's share of the backward is taken
    as its share of the parameters' bytes (a layer's backward work grows with its weights).
    A bucket's all-reduce starts once its last gradient is ready and the one before it is
    done (they run one after another on one communication stream), overlapping the rest of
    the backward; what is left after the backward ends is the communication DDP exposes.
    """
    total = sum(parameter_sizes) or 1
    ready_at, done = {}, 0
    for index in reversed(range(len(parameter_sizes))):
        done += parameter_sizes[index]
        ready_at[index] = backward_start + (backward_end - backward_start) * done / total
    schedule, free = [], backward_start
    for bucket in ddp_buckets(parameter_sizes):
        nbytes = sum(parameter_sizes[i] for i in bucket)
        start = max(free, max(ready_at[i] for i in bucket))
        free = start + allreduce(nbytes, n, hardware)
        schedule.append((bucket, start, free, nbytes))
    return schedule


def _ddp_step(step: _Step, model: Profile, hardware: Hardware, batch: int, rate: float) -> None:
    sizes = torch_chunk_sizes(batch, len(step.names))
    n = len(sizes)
    clock = step.clock
    start = clock.host + hardware.step_overhead / 4
    if model.buffer_sizes and n > 1:  # DDP broadcasts buffers from rank 0 at every forward
        took = allreduce(model.buffer_bytes, n, hardware) / 2  # a broadcast: half a ring
        for index in range(n):
            moved = model.buffer_bytes if index else 0
            step.event(Phase.REPLICATE, index, start, start + took, moved, what="buffers")
        start += took
    forward = [pass_time(model.forward, rows, hardware, rate, False) for rows in sizes]
    backward = [pass_time(model.backward, rows, hardware, rate, True) for rows in sizes]
    if hardware.asynchronous:
        forward_ends = [start + max(t.host, t.device) for t in forward]
    else:  # one process per rank, sharing the cores
        forward_ends = _share_cores([start] * n, [t.host + t.device for t in forward],
                                    hardware.compute_units)  # fmt: skip
    loss = LOSS_OPS * (hardware.launch_overhead + elementwise_time("aten.add", 64, hardware))
    loss += hardware.step_overhead / 2
    backward_starts = [end + loss for end in forward_ends]
    if hardware.asynchronous:
        backward_ends = [s + max(t.host, t.device) for s, t in zip(backward_starts, backward)]
    else:
        backward_ends = _share_cores(backward_starts, [t.host + t.device for t in backward],
                                     hardware.compute_units)  # fmt: skip
    for index, rows in enumerate(sizes):
        step.memory(index, "input", model.input_bytes(rows))
        step.memory(index, "parameters", model.parameter_bytes + model.buffer_bytes)
        _account_replica(step, model, index, rows)
        step.event(Phase.APPLY, index, start, forward_ends[index], replica=index)
        step.event(Phase.BACKWARD, index, backward_starts[index], backward_ends[index])
    end = max(backward_ends)
    if n > 1:
        schedule = allreduce_schedule(model.parameter_sizes, max(backward_starts), end, n, hardware)
        for number, (bucket, bucket_start, bucket_end, nbytes) in enumerate(schedule):
            for index in range(n):
                step.event(Phase.ALLREDUCE, index, bucket_start, bucket_end,
                           ring_bytes_sent(nbytes, n), bucket=number, bucket_bytes=nbytes,
                           tensors=len(bucket))  # fmt: skip
            end = max(end, bucket_end)
    clock.host = end
    clock.device = [end] * len(clock.device)


def _count(devices: int | Sequence[Device]) -> int:
    if isinstance(devices, bool):
        raise TypeError(f"devices must be a count or a list of devices, got {devices!r}")
    if isinstance(devices, int):
        count = devices
    elif isinstance(devices, Sequence) and not isinstance(devices, str):
        count = len(devices)
    else:
        raise TypeError(
            f"devices must be a count (e.g. 8) or a list of devices, got {type(devices).__name__}"
        )
    if count < 1:
        raise ValueError(f"devices must be at least 1, got {count}")
    return count


def predict(
    model: nn.Module,
    sample_input: torch.Tensor,
    batch_size: int,
    devices: int | Sequence[Device],
    hardware: Hardware | str,
    strategy: str = "dp",
    steps: int = 1,
) -> PredictedTrace:
    """A predicted trace of ``steps`` training steps of ``model`` on a batch of ``batch_size``
    rows like ``sample_input``, split over ``devices`` (a count, or a list of devices whose
    number is used) of ``hardware`` (a :class:`~dpkit.cost.Hardware` or a preset's name),
    with ``strategy`` ``"dp"`` (DataParallel) or ``"ddp"`` (DistributedDataParallel).

    The result is a :class:`PredictedTrace`: ``tr.summary()``, ``tr.memory_summary()``,
    ``tr.to_chrome_trace(path)`` and ``dpkit.viz.timeline(tr)`` work as on a measured trace,
    and ``tr.step_time`` is the predicted seconds per step.
    """
    if isinstance(hardware, str):
        hardware = preset(hardware)
    if not isinstance(hardware, Hardware):
        raise TypeError(
            "hardware must be a dpkit.cost.Hardware or a preset name, got "
            f"{type(hardware).__name__}"
        )
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is not known; use 'dp' or 'ddp'")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    count = _count(devices)
    if count == 1:  # DataParallel calls the module itself: its own per-step overhead
        hardware = hardware.on_one_device()
    cost = profile(model, sample_input)
    rate = hardware.flops_per_second(cost.dtype)
    trace = PredictedTrace(hardware, strategy, batch_size, count)
    names = device_names(hardware, count)
    build = _dp_step if strategy == "dp" else _ddp_step
    start = 0.0
    for number in range(1, steps + 1):
        step = _Step(trace, names, number, start)
        build(step, cost, hardware, batch_size, rate)
        # after the last phase: autograd finishing (gradients into .grad), the step's end
        end = max(step.clock.host, *step.clock.device) + hardware.step_overhead / 4
        trace.step_bounds[number] = (start, end)
        start = end
    return trace
