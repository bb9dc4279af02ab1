"""Streams and CUDA timing events on a pretend GPU: which stream each replica runs on, what is
recorded on which stream for torch's caching allocator, and on which stream the trace times.

Without a GPU, torch.cuda is replaced by :class:`FakeGpu` (streams current per thread, as in
CUDA; timing events on a counter that only a synchronised event can be read from), and the
tensors that should be on the GPU are CPU tensors that say they are (:class:`PretendCuda`),
logging every ``record_stream``. ``tests/test_gpu.py`` checks the same behaviour on a GPU.
"""

from __future__ import annotations

import importlib
import itertools
import math
import threading
from collections import OrderedDict
from contextlib import ExitStack, contextmanager, nullcontext
from typing import Any

import pytest
import torch
from lanes import lanes
from torch import nn

import dpkit
from dpkit import comm, tracing
from dpkit.context import backward_of
from dpkit.device import HOST_DEVICE, REAL, VIRTUAL_GPU, Device
from dpkit.tracing import backward as trace_backward
from dpkit.tracing import clock as trace_clock

# Where parallel_apply picks each replica's stream (dpkit.lanes, not hidden by any function).
lanes_module = importlib.import_module("dpkit.lanes")


class FakeStream(torch.Stream):
    """A stream of the pretend GPU (a ``torch.Stream``, as ``record_stream`` requires), which
    logs what it waited for."""

    def __new__(cls, name: str, index: int = 0) -> FakeStream:
        return super().__new__(cls, "cpu")

    def __init__(self, name: str, index: int = 0) -> None:
        self.name, self.index = name, index
        self.waited: list[FakeStream] = []

    def wait_stream(self, other: FakeStream) -> None:
        self.waited.append(other)

    __eq__ = object.__eq__  # torch.Stream's compares stream ids, all 0 here
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"FakeStream({self.name!r})"


class FakeEvent:
    """A CUDA timing event: readable only once synchronised (directly, or by a later event on
    its stream), and only against an event on the same device, as in CUDA."""

    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu, self.done = gpu, False

    def record(self, stream: FakeStream | None = None) -> None:
        self.stream = self.gpu.current_stream() if stream is None else stream
        self.time = next(self.gpu.clock)
        self.gpu.events.append(self)

    def synchronize(self) -> None:
        for event in self.gpu.events:  # a stream runs its work in order
            if event.stream is self.stream and event.time <= self.time:
                event.done = True

    def elapsed_time(self, end: FakeEvent) -> float:
        if not (self.done and end.done):
            raise RuntimeError("CUDA error: device not ready")
        if self.stream.index != end.stream.index:
            raise RuntimeError("CUDA error: invalid resource handle (events on two devices)")
        return float(end.time - self.time)


class FakeGpu:
    """Stands in for ``torch.cuda`` (as much of it as dpkit uses): each thread has its own
    current stream per device, the device's default stream until it enters another one."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._defaults: dict[int, FakeStream] = {}
        self.lane_streams: dict[Device, FakeStream] = {}
        self.clock = itertools.count()
        self.events: list[FakeEvent] = []
        self._lock = threading.Lock()

    def _current(self) -> dict[int, FakeStream]:
        if not hasattr(self._local, "streams"):
            self._local.streams = {}
        return self._local.streams

    def default_stream(self, index: int = 0) -> FakeStream:
        with self._lock:
            return self._defaults.setdefault(index, FakeStream(f"default {index}", index))

    def current_stream(self, device: Any = None) -> FakeStream:
        index = 0 if device is None else torch.device(device).index or 0
        return self._current().get(index) or self.default_stream(index)

    @contextmanager
    def stream(self, stream: FakeStream):
        current = self._current()
        before = current.get(stream.index)
        current[stream.index] = stream
        try:
            yield
        finally:
            current[stream.index] = before

    def device(self, device: Any) -> nullcontext:
        return nullcontext()

    def Event(self, enable_timing: bool = False) -> FakeEvent:  # noqa: N802 - torch's name
        return FakeEvent(self)

    def stream_of(self, device: Device) -> FakeStream | None:
        """dpkit.lanes.stream_of on this GPU: a lane's own stream, a real device's current."""
        if device.device_type == "cpu":
            return None
        if device.kind == REAL:
            return self.current_stream(device.torch_device)
        with self._lock:
            return self.lane_streams.setdefault(device, FakeStream(f"lane {device.index}"))


class PretendCuda(torch.Tensor):
    """A CPU tensor that says it is on ``cuda:0``; its ``record_stream`` calls are logged."""

    records: list[tuple[torch.Tensor, Any]] = []

    @property
    def is_cuda(self) -> bool:
        return True

    @property
    def is_cpu(self) -> bool:
        return False

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", 0)

    def record_stream(self, stream: Any) -> None:
        PretendCuda.records.append((self, stream))


def on_gpu(tensor: torch.Tensor) -> PretendCuda:
    return tensor.as_subclass(PretendCuda)


def recorded_on(tensor: torch.Tensor) -> list[Any]:
    """The streams ``tensor`` was recorded on, in order."""
    return [stream for recorded, stream in PretendCuda.records if recorded is tensor]


def gpu_lanes(n: int) -> list[Device]:
    return [Device(i, VIRTUAL_GPU, torch.device("cuda", 0)) for i in range(n)]


def real_gpus(n: int) -> list[Device]:
    return [Device(i, REAL, torch.device("cuda", i)) for i in range(n)]


@pytest.fixture
def gpu(monkeypatch) -> FakeGpu:
    fake = FakeGpu()
    get_device_module = torch.get_device_module
    monkeypatch.setattr(
        torch,
        "get_device_module",
        lambda kind=None: fake if str(kind) == "cuda" else get_device_module(kind),
    )
    monkeypatch.setattr(torch.cuda, "Event", fake.Event)
    monkeypatch.setattr(torch.cuda, "current_stream", fake.current_stream)
    # Lanes' streams and clock origins come from the fake, and stay out of dpkit's caches.
    for module in (lanes_module, trace_backward):
        monkeypatch.setattr(module, "stream_of", fake.stream_of)
    monkeypatch.setattr(trace_clock, "_cuda_origins", {})
    monkeypatch.setattr(trace_clock, "_pending", [])
    monkeypatch.setattr(PretendCuda, "records", [])
    return fake


# --------------------------------------------------------------------------------------
# Issue 19, item 1: outputs are recorded on the caller's stream, CUDA tensors only.


class CountRows(nn.Module):
    def forward(self, x):
        return x * 2, torch.tensor(float(x.shape[0]))  # the count is a CPU tensor


def test_a_gpu_lane_may_return_cpu_tensors(gpu):
    devices = gpu_lanes(2)
    chunks = [on_gpu(torch.randn(2, 3)) for _ in devices]
    outputs = dpkit.parallel_apply([CountRows(), CountRows()], chunks, devices=devices)
    caller = gpu.current_stream()
    for (doubled, rows), chunk in zip(outputs, chunks):
        assert torch.equal(doubled, chunk * 2) and rows.item() == 2
        assert recorded_on(doubled) == [caller]  # made on the lane's stream, read on the caller's
        assert dpkit.device_of(rows) == HOST_DEVICE  # in CPU memory: not on the lane


# --------------------------------------------------------------------------------------
# Item 2: what a lane reads, made on the caller's stream, is recorded on the lane's stream.


class Scale(nn.Module):
    """Holds its weight as a replica does: a plain attribute, listed in _former_parameters."""

    def __init__(self, weight: torch.Tensor, offset: torch.Tensor) -> None:
        super().__init__()
        self._former_parameters = OrderedDict(weight=weight)
        self.weight = weight
        self.register_buffer("offset", offset)

    def forward(self, x, shift):
        return x * self.weight + self.offset + shift


def test_a_gpu_lane_records_what_its_replica_reads_on_its_own_stream(gpu):
    devices = gpu_lanes(3)
    side = FakeStream("caller's side stream")
    replicas = [Scale(on_gpu(torch.randn(3)), on_gpu(torch.randn(3))) for _ in devices]
    chunks = [on_gpu(torch.randn(2, 3)) for _ in devices]
    shifts = [{"shift": on_gpu(torch.randn(3))} for _ in devices]
    with gpu.stream(side):
        outputs = dpkit.parallel_apply(replicas, chunks, shifts, devices=devices)
    for replica, chunk, kwargs, output, device in zip(replicas, chunks, shifts, outputs, devices):
        lane = gpu.stream_of(device)
        read = (chunk, kwargs["shift"], replica.weight, replica.offset)
        assert [recorded_on(tensor) for tensor in read] == [[lane]] * 4
        assert recorded_on(output) == [side]
        assert lane.waited == [side]  # the lane starts after the caller's copies
    assert side.waited == [gpu.stream_of(device) for device in devices]  # and the caller after it
    assert len(PretendCuda.records) == 5 * len(devices)


def test_cpu_lanes_record_nothing(gpu):
    devices = lanes(2)
    replicas = [Scale(on_gpu(torch.randn(3)), on_gpu(torch.randn(3))) for _ in devices]
    chunks = [on_gpu(torch.randn(2, 3)) for _ in devices]
    dpkit.parallel_apply(replicas, chunks, [{"shift": 1.0}] * 2, devices=devices)
    assert PretendCuda.records == []


def test_gradients_handed_to_gpu_lanes_in_backward_are_recorded_on_their_streams(gpu):
    """In backward no parallel_apply runs: the gradient chunks gather's backward scatters
    are recorded on the lanes' streams, where the lanes' nodes read them; in forward, scatter
    leaves that to parallel_apply."""
    devices = gpu_lanes(2)
    gradient = on_gpu(torch.randn(4, 3))
    with backward_of(step=1):
        chunks = comm.scatter(gradient, devices, [2, 2], 0, devices[0])
    assert [recorded_on(chunk) for chunk in chunks] == [[gpu.stream_of(d)] for d in devices]
    forward = comm.scatter(gradient, devices, [2, 2], 0, devices[0])
    assert [recorded_on(chunk) for chunk in forward] == [[], []]


def test_gradients_from_gpu_lanes_are_recorded_on_the_stream_that_sums_them(gpu):
    devices = gpu_lanes(3)
    per_lane = [[on_gpu(torch.full((2,), float(i)))] for i in range(3)]
    side = FakeStream("backward's stream")
    with gpu.stream(side), backward_of(step=1):  # a reduce runs in replicate's backward
        (total,) = comm.reduce_add(per_lane, devices[0], devices)
    assert torch.equal(total, torch.full((2,), 3.0))
    assert [recorded_on(grads[0]) for grads in per_lane] == [[side]] * 3


# --------------------------------------------------------------------------------------
# Item 3: on real devices, each replica runs on the stream current in the caller.


class Where(nn.Module):
    def __init__(self, gpu: FakeGpu, seen: dict[int, Any]) -> None:
        super().__init__()
        self.gpu, self.seen = gpu, seen

    def forward(self, x):
        device = dpkit.current_device()
        self.seen[device.index] = self.gpu.current_stream(device.torch_device)
        return x + 1


def test_real_devices_run_replicas_on_the_callers_current_streams(gpu):
    devices = real_gpus(2)
    sides = [FakeStream(f"side {i}", i) for i in range(2)]
    seen: dict[int, Any] = {}
    with gpu.stream(sides[0]), gpu.stream(sides[1]):
        outputs = dpkit.parallel_apply(
            [Where(gpu, seen), Where(gpu, seen)], [torch.zeros(1), torch.zeros(1)], devices=devices
        )
    assert [output.item() for output in outputs] == [1.0, 1.0]
    assert seen[0] is sides[0] and seen[1] is sides[1]  # not each worker's default stream
    assert PretendCuda.records == [] and sides[0].waited == []  # one stream each: no joins


# --------------------------------------------------------------------------------------
# Items 4 and 5: timing events on the span's device, and what hooks see.


def test_spans_are_timed_on_their_own_devices_stream(gpu):
    """The caller's thread, with cuda:0 current, queues work for cuda:1 too: its spans are
    timed on cuda:1's current stream, against cuda:1's clock origin."""
    devices = real_gpus(2)
    with dpkit.trace() as tr:
        for device in devices:
            with tracing.span("scatter", device):
                pass
    streams = {event.stream for event in gpu.events}  # the origins, then each span's two
    assert streams == {gpu.current_stream(torch.device("cuda", i)) for i in range(2)}
    for device in devices:
        on_device = [e for e in gpu.events if e.stream is gpu.current_stream(device.torch_device)]
        assert len(on_device) == 3
    assert [e.device for e in tr.events] == ["cuda:0", "cuda:1"]
    assert all(0 <= e.start <= e.end < math.inf for e in tr.events)


def test_a_replicas_apply_is_timed_on_the_stream_it_runs_on(gpu):
    """The trace opens each replica's apply span before its worker enters its stream: the
    span's two events still go on that stream (a lane's own; a real device's stream current
    in the caller), not on the worker's default stream."""
    sides = [FakeStream("side 0", 0), FakeStream("side 1", 1)]
    cases = ((gpu_lanes(2), sides[:1], None), (real_gpus(2), sides, sides))
    for devices, caller_streams, expected in cases:
        gpu.events.clear()
        with ExitStack() as stack:
            for stream in caller_streams:
                stack.enter_context(gpu.stream(stream))
            tr = stack.enter_context(dpkit.trace())
            chunks = [on_gpu(torch.randn(2, 3)) for _ in devices]
            dpkit.parallel_apply([nn.Identity() for _ in devices], chunks, devices=devices)
        assert [e.phase for e in tr.events] == ["apply", "apply"]
        for stream in expected or [gpu.stream_of(device) for device in devices]:
            assert [e.stream for e in gpu.events].count(stream) == 2, stream


def test_a_backward_timed_on_two_streams_waits_for_both_ends(gpu, monkeypatch):
    """A lane's backward starts on the stream its first node runs on and may end on another
    (the engine's callback records on the lane's stream): both events must be done before
    their times are read."""
    monkeypatch.setattr(trace_backward, "_queue_callback", lambda callback: None)
    lane = gpu_lanes(2)[1]
    with dpkit.trace() as tr:
        with tracing.span("apply", lane):  # fixes the clock origin, as the forward does
            pass
        timer = tracing.ReplicaBackward(lane, step=1)
        with gpu.stream(FakeStream("a node's stream")):
            timer.on_start(None)
        timer.on_backward_end()  # the last node did not run: ended by the callback
    (backward,) = [e for e in tr.events if e.phase == "backward"]
    assert 0 <= backward.start <= backward.end < math.inf


def test_hooks_without_a_trace_get_final_times_and_nothing_piles_up(gpu):
    seen = []
    handle = dpkit.register_phase_hook(seen.append)
    try:
        for _ in range(3):
            dpkit.scatter(on_gpu(torch.randn(4, 3)), gpu_lanes(2))
    finally:
        handle.remove()
    assert [e.phase for e in seen] == ["scatter"] * 6
    assert all(0 <= e.start <= e.end < math.inf for e in seen)
    assert trace_clock._pending == []


def test_hooks_under_a_trace_get_the_events_the_trace_resolves(gpu):
    seen = []
    handle = dpkit.register_phase_hook(seen.append)
    try:
        with dpkit.trace() as tr:
            dpkit.scatter(on_gpu(torch.randn(4, 3)), gpu_lanes(2))
            assert all(math.isnan(e.start) for e in seen)  # as documented: resolved later
    finally:
        handle.remove()
    key = lambda e: (e.start, e.device)  # noqa: E731  (the trace keeps copies, field by field)
    assert sorted(seen, key=key) == sorted(tr.events, key=key)
    assert all(0 <= e.start <= e.end < math.inf for e in seen)
    assert trace_clock._pending == []


def test_a_backward_after_the_trace_ended_leaves_nothing_pending(gpu, monkeypatch):
    monkeypatch.setattr(trace_backward, "_queue_callback", lambda callback: None)
    lane = gpu_lanes(1)[0]
    timer = tracing.ReplicaBackward(lane, step=1)  # made while a trace recorded
    timer.on_start(None)
    timer.on_end(None, None)
    assert trace_clock._pending == [] and gpu.events == []
