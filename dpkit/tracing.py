"""Trace: an event for every phase of every step on every device, and hooks to watch them.

The surprise first: recording is off by default and then costs one test of a list per
phase; nothing is timed, counted or stored. Inside ``with dpkit.trace() as tr:`` every
primitive emits :class:`Event` records, and hooks registered with
:func:`register_phase_hook` see the same events as they happen.

Phases: ``scatter``, ``replicate`` (one per device for its tensor copies, and one more on
the source device, ``details["what"] == "modules"``, for building every replica's module
objects in the caller's thread), ``apply`` (one per device), ``gather``, and in backward
``grad_scatter`` (gather's backward), ``backward`` (one per device: a replica's own backward,
from its first autograd node starting to its last one finishing) and ``reduce``
(replicate's backward: the reduce-add of gradients onto the source device). On the CPU,
autograd runs every replica's backward in the one thread that called ``backward()``, their
nodes interleaved, so the replicas' backward events overlap without running in parallel;
on GPUs each device has its own backward thread. Each event has ``phase``, ``device``,
``start`` and ``end`` (seconds of ``time.perf_counter``, one clock for every device),
``nbytes`` moved between devices, ``step`` and free-form ``details``.

Memory (``tr.memory``): the bytes each device holds, by category and step: counted from the
tensors themselves on every device kind, and on real CUDA devices also read from torch's
allocator (see :class:`MemoryRecord`).

Timing: on the CPU from the monotonic clock inside the thread doing the work; on CUDA from
CUDA events recorded on the stream where the thread queues the device's work (the device's
current stream in that thread: a lane's own stream in its worker and in its backward, the
caller's stream for the copies the caller queues) and resolved after synchronisation. While
a trace records, an event's CUDA times are NaN until the trace resolves them (``tr.events``
and the end of the ``with`` block do); hooks called meanwhile see the NaN. With hooks and no
trace, each event's times are resolved before the hooks are called (see
:func:`register_phase_hook`).

What tracing costs, and where: each phase opens a span (two clock reads and an event; the
primitive adds the bytes it copied), and after each replica's forward
:mod:`dpkit.replica_graph` walks its autograd graph once (its activations, and the two
nodes whose hooks time its backward), outside the timed ``apply``. On 4 CPU lanes that is
about 3% of a training step of a small MLP in time (``benchmarks/trace_overhead.py``)
and in CPU instructions (``benchmarks/trace_instructions.py``).
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from dpkit import replica_graph
from dpkit.devices import REAL, Device, stream_of

FORWARD_PHASES = ("scatter", "replicate", "apply", "gather")
BACKWARD_PHASES = ("grad_scatter", "backward", "reduce", "grad_gather", "grad_broadcast")


@dataclass(slots=True)
class Event:
    """One phase on one device: when it ran, how many bytes it moved, in which step."""

    phase: str
    device: str
    start: float
    end: float
    nbytes: int = 0
    step: int = 0
    kind: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(slots=True)
class MemoryRecord:
    """Bytes one device holds in one category during one step.

    Counted categories, which add up: ``parameters`` (the replica's parameters and buffers;
    lane 0's are the module's own), ``input`` (its chunk), ``activations`` (tensors autograd
    saved for backward in that replica), ``outputs`` (what the replica returned) and
    ``gathered`` (the combined output on the output device).

    On real CUDA devices, two more from torch's caching allocator, each a total of everything
    the process holds there (optimizer state and the caller's own tensors too), so they do
    not add to the counted ones: ``allocated (torch)`` (``torch.cuda.memory_allocated`` at
    the end of the step's forward, what backward starts from) and ``peak (torch)``
    (``torch.cuda.max_memory_allocated`` from the step's forward until the next step begins
    or the trace ends: backward and the optimizer step included). Virtual lanes on one GPU
    share its allocator, so only their counted bytes are per lane.
    """

    device: str
    category: str
    nbytes: int
    step: int = 0
    kind: str = ""


# What the primitives count, in the order figures and tables show it (others go after).
MEMORY_CATEGORIES = ("parameters", "input", "activations", "outputs", "gathered")
ALLOCATED, PEAK = "allocated (torch)", "peak (torch)"
ALLOCATOR_CATEGORIES = (ALLOCATED, PEAK)  # totals from torch's allocator, not parts of a sum

_recorders: list[Trace] = []
_hooks: OrderedDict[int, tuple[frozenset[str] | None, Callable[[Event], None]]] = OrderedDict()
_state_lock = threading.Lock()
_step = 0


def enabled() -> bool:
    """True while a trace records or a hook listens: only then do primitives emit events."""
    return bool(_recorders or _hooks)


def current_step() -> int:
    return _step


def begin_step(devices: Iterable[Device] = ()) -> int:
    """Start a new step on ``devices`` (DataParallel calls this at every forward while tracing).

    While a trace records, this ends the previous step's ``peak (torch)`` reading and, on the
    real CUDA devices among ``devices``, resets torch's peak memory statistics
    (``torch.cuda.reset_peak_memory_stats``), so that a step's peak is its own.
    """
    global _step, _allocator_devices
    if _recorders:
        record_allocator_peaks()
    _step += 1
    if _recorders:
        _allocator_devices = _cuda_allocators(devices)
        for device in _allocator_devices:
            torch.cuda.reset_peak_memory_stats(device.torch_device)
    return _step


# --------------------------------------------------------------------------------------
# Memory from torch's CUDA allocator: read at the end of a step's forward, and its peak
# when the next step begins (or the trace ends).

_allocator_devices: tuple[Device, ...] = ()  # the current step's real CUDA devices


def _cuda_allocators(devices: Iterable[Device]) -> tuple[Device, ...]:
    # Virtual lanes share one GPU's allocator: its totals are no lane's own.
    return tuple(dict.fromkeys(d for d in devices if d.kind == REAL and d.device_type == "cuda"))


def record_allocated() -> None:
    """At the end of a forward: ``allocated (torch)`` on each of the step's CUDA devices."""
    for device in _allocator_devices:
        record_memory(device, ALLOCATED, torch.cuda.memory_allocated(device.torch_device))


def record_allocator_peaks() -> None:
    """``peak (torch)`` since the step began on each of its CUDA devices; ends the step's
    readings (a second call records nothing)."""
    global _allocator_devices
    devices, _allocator_devices = _allocator_devices, ()
    for device in devices:
        record_memory(device, PEAK, torch.cuda.max_memory_allocated(device.torch_device))


def register_phase_hook(
    hook: Callable[[Event], None], phases: Iterable[str] | str | None = None
) -> RemovableHandle:
    """Call ``hook(event)`` for every event (or only for ``phases``) until the handle is removed.

    Hooks run in the thread that did the work (a worker thread for ``apply``).

    On CUDA, with no trace recording, each event's times are final when a hook gets it:
    dpkit first waits for the GPU to finish the event's work (``Event.synchronize``). That
    costs the overlap of host and GPU at every phase (lanes still overlap one another, each
    worker waiting for its own), so measure with ``dpkit.trace()``; but nothing is kept for
    a trace that never comes. While a trace records, hooks get the same events with NaN
    times, which the trace fills in when it resolves them (see the module docstring).
    """
    wanted = frozenset([phases] if isinstance(phases, str) else phases) if phases else None
    with _state_lock:
        handle = RemovableHandle(_hooks)
        _hooks[handle.id] = (wanted, hook)
    original_remove = handle.remove

    def remove() -> None:
        with _state_lock:
            original_remove()

    handle.remove = remove  # type: ignore[method-assign]
    return handle


# --------------------------------------------------------------------------------------
# Clocks: CPU work is timed in its own thread; CUDA work by events on its stream.

_clock = time.perf_counter  # bound once: read twice per event
_profiler_enabled = torch.autograd._profiler_enabled
_cuda_origins: dict[torch.device, tuple[Any, float]] = {}


def _cuda_origin(device: torch.device) -> tuple[Any, float]:
    """A CUDA event and the perf_counter time it completed: maps GPU times onto one clock."""
    if device not in _cuda_origins:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(device))
        event.synchronize()
        _cuda_origins[device] = (event, time.perf_counter())
    return _cuda_origins[device]


class _Span:
    """Times one phase on one device; the primitive that opened it sets ``nbytes``, the
    bytes it copied while the span was open."""

    __slots__ = ("phase", "device", "step", "details", "nbytes", "cuda", "profiler_range")
    __slots__ += ("start", "start_event")

    def __init__(self, phase: str, device: Device, step: int, details: dict[str, Any], cuda: bool):
        self.phase = phase
        self.device = device
        self.step = step
        self.details = details
        self.nbytes = 0
        self.cuda = cuda
        if cuda:
            _cuda_origin(device.torch_device)  # fix the GPU clock's origin before the work
        # The profiler sees only the thread that started it, so worker threads' apply spans
        # open no range; parallel_apply opens dpkit.apply in the caller's thread instead.
        self.profiler_range = (
            torch.autograd.profiler.record_function(f"dpkit.{phase}")
            if phase != "apply" and _profiler_enabled()
            else None
        )

    def __enter__(self) -> _Span:
        if self.profiler_range is not None:
            self.profiler_range.__enter__()
        if self.cuda:
            self.start_event = _cuda_event_now(self.device)
        self.start = _clock()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        end = _clock()
        if self.profiler_range is not None:
            self.profiler_range.__exit__(*exc_info)
        device = self.device
        event = Event(
            self.phase, device.name, self.start, end, self.nbytes, self.step, device.kind,
            self.details,
        )  # fmt: skip
        if self.cuda:
            _time_on_gpu(event, device, self.start_event, _cuda_event_now(device))
        for recorder in _recorders:  # _emit, inlined: spans are the trace's most frequent call
            recorder._events.append(event)
        if _hooks:
            _call_hooks(event)


_pending: list[tuple[Event, torch.device, Any, Any]] = []


def _time_on_gpu(event: Event, device: Device, start_event: Any, end_event: Any) -> None:
    """Give ``event`` the times of two CUDA events: later while a trace records (NaN until
    :func:`resolve_pending`, one wait for the GPU for all of them), at once when only hooks
    listen (they get final times, and nothing piles up waiting for a trace)."""
    if _recorders:
        event.start = event.end = math.nan
        _pending.append((event, device.torch_device, start_event, end_event))
    elif _hooks:
        _resolve(event, device.torch_device, start_event, end_event)


def _resolve(event: Event, device: torch.device, start_event: Any, end_event: Any) -> None:
    # The two may be on different streams (a backward ended by the engine's callback), so
    # one finishing says nothing of the other; elapsed_time needs both done.
    start_event.synchronize()
    end_event.synchronize()
    origin, origin_time = _cuda_origin(device)
    event.start = origin_time + origin.elapsed_time(start_event) / 1000
    event.end = origin_time + origin.elapsed_time(end_event) / 1000


def resolve_pending() -> None:
    """Fill in the times of CUDA events: wait for the GPU, then read its clocks."""
    while _pending:
        _resolve(*_pending.pop())


def _emit(event: Event) -> None:
    for recorder in _recorders:
        recorder._events.append(event)  # atomic: no lock needed in worker threads
    if _hooks:
        _call_hooks(event)


def _call_hooks(event: Event) -> None:
    for wanted, hook in list(_hooks.values()):
        if wanted is None or event.phase in wanted:
            hook(event)


def record_memory(device: Device, category: str, nbytes: int, step: int | None = None) -> None:
    """Note that ``device`` holds ``nbytes`` in ``category`` this step (kept while tracing)."""
    if _recorders:
        # a plain tuple (MemoryRecord is made when read): one per device and category
        record = (device.name, category, nbytes, _step if step is None else step, device.kind)
        for recorder in _recorders:
            recorder._memory.append(record)  # atomic: no lock needed in worker threads


_OFF = nullcontext()


def span(phase: str, device: Device, step: int | None = None, **details: Any) -> Any:
    """A context that records ``phase`` on ``device`` and gives the span, whose ``nbytes``
    the caller sets; when nothing listens, a shared no-op that gives None."""
    if not (_recorders or _hooks):
        return _OFF
    step = _step if step is None else step
    return _Span(phase, device, step, details, device.device_type == "cuda")


def host_span(phase: str, device: Device, **details: Any) -> Any:
    """Like :func:`span`, for Python work in the calling thread done on ``device``'s behalf
    (building replica modules): timed by the CPU clock on every device kind, since CUDA
    events would time the GPU's queue instead."""
    if not (_recorders or _hooks):
        return _OFF
    return _Span(phase, device, _step, details, False)


class ReplicaBackward:
    """Times one replica's backward: from the first of its output nodes starting to its
    last node finishing (:mod:`dpkit.replica_graph` finds both), with autograd node hooks.

    A backward that needs only part of the graph (``torch.autograd.grad(loss, inputs)``,
    ``backward(inputs=...)``) may never run the last node (the transpose of the first
    layer's weight, say); the event then ends when the whole backward does, read by a
    callback queued on autograd's engine, and says so in ``details["end"]``.
    """

    __slots__ = ("device", "step", "cuda", "start", "start_event")

    def __init__(self, device: Device, step: int):
        self.device, self.step = device, step
        self.cuda = device.device_type == "cuda"
        self.start: float | None = None
        self.start_event: Any = None

    def on_start(self, grad_outputs: Any) -> None:
        # A backward run after the trace ended (and with no hook) is timed for no one.
        if self.start is None and (_recorders or _hooks):
            self.start_event = _cuda_event_now(self.device) if self.cuda else None
            self.start = _clock()
            _queue_callback(self.on_backward_end)

    def on_end(self, grad_inputs: Any, grad_outputs: Any) -> None:
        if self.start is None:  # no output took part in this backward
            return
        device = self.device
        end_event = _cuda_event_now(device) if self.cuda else None
        event = Event("backward", device.name, self.start, _clock(), 0, self.step, device.kind)
        if end_event is not None:
            _time_on_gpu(event, device, self.start_event, end_event)
        self.start = None  # a second backward through the same graph starts afresh
        _emit(event)

    def on_backward_end(self) -> None:
        """The whole backward is done: end the event here if the last node did not run."""
        if self.start is None:  # on_end did
            return
        device = self.device
        end_event = None
        if self.cuda:  # this thread's current stream need not be the replica's
            end_event = torch.cuda.Event(enable_timing=True)
            end_event.record(stream_of(device))
        event = Event(
            "backward", device.name, self.start, _clock(), 0, self.step, device.kind,
            {"end": "when the whole backward ended: this backward skipped the replica's last node"},
        )  # fmt: skip
        if end_event is not None:
            _time_on_gpu(event, device, self.start_event, end_event)
        self.start = None
        _emit(event)


_queue_callback = torch.autograd.Variable._execution_engine.queue_callback


def _cuda_event_now(device: Device) -> Any:
    """A timing event recorded now on ``device``'s current stream in this thread, where this
    thread queues that device's work. (Not the current *device*'s stream: the caller's
    thread queues copies for ``cuda:1`` while ``cuda:0`` is current, and the event must be
    on the device whose clock origin times it.)"""
    event = torch.cuda.Event(enable_timing=True)
    event.record(torch.cuda.current_stream(device.torch_device))
    return event


def trace_replica(
    device: Device, outputs: Iterable[torch.Tensor], given: Iterable[torch.Tensor]
) -> None:
    """After a replica's forward, while tracing: record its activations (the bytes autograd
    saved between ``outputs`` and the tensors it was ``given``) and time its backward."""
    if not (_recorders or _hooks):
        return
    graph = replica_graph.walk(outputs, given, count_saved=bool(_recorders))
    if _recorders:
        record_memory(device, "activations", graph.saved_nbytes)
    if graph.first_nodes and graph.last_node is not None:
        timer = ReplicaBackward(device, _step)
        for node in graph.first_nodes:
            node.register_prehook(timer.on_start)
        graph.last_node.register_hook(timer.on_end)


_HELD_ATTRIBUTE = "_dpkit_held_tensors"


def note_held(replica: Any, tensors: list[torch.Tensor]) -> None:
    """While tracing, note on a replica the tensors it holds (its parameters and buffers),
    which replicate knows already, so that nothing walks its modules to find them again."""
    # Straight into __dict__: nn.Module.__setattr__ is slower, and this is no submodule.
    replica.__dict__[_HELD_ATTRIBUTE] = tensors


def held_by(module: Any) -> list[torch.Tensor] | None:
    """What :func:`note_held` noted on ``module``, if anything."""
    return module.__dict__.get(_HELD_ATTRIBUTE)


class Trace:
    """The events recorded inside one ``with dpkit.trace():`` block."""

    def __init__(self) -> None:
        self._events: list[Event] = []
        self._memory: list[tuple[str, str, int, int, str]] = []  # MemoryRecord's fields
        self.origin = time.perf_counter()

    @property
    def memory(self) -> list[MemoryRecord]:
        """What each device held, by category and step."""
        return [MemoryRecord(*fields) for fields in self._memory]

    @property
    def events(self) -> list[Event]:
        """Every event in the order it finished (CUDA times resolved first)."""
        resolve_pending()
        return list(self._events)

    def rows(self) -> Any:
        """One row per event: a pandas DataFrame where pandas is installed, else a list of dicts."""
        from dpkit import trace_export

        return trace_export.as_dataframe(trace_export.rows(self.events, self.origin))

    def memory_rows(self) -> Any:
        """One row per memory record (device, category, bytes, step), like :meth:`rows`."""
        from dpkit import trace_export

        return trace_export.as_dataframe([asdict(record) for record in self.memory])

    def summary(self) -> Any:
        """Time per step, bytes per step and share of the step, per phase; prints as a table."""
        from dpkit import trace_export

        return trace_export.summary(self.events)

    def memory_summary(self, step: int | None = None) -> Any:
        """Bytes each device held in ``step`` (default: the last), by category, as a table."""
        from dpkit import trace_export

        return trace_export.memory_summary(self.memory, step)

    def to_chrome_trace(self, path: str | Any) -> Any:
        """Write Chrome trace JSON (opens in Perfetto and chrome://tracing); returns the path."""
        from dpkit import trace_export

        return trace_export.write_chrome_trace(self.events, self.origin, path)

    @property
    def hardware(self) -> str:
        """What the events ran on, in words (for titles): e.g. "virtual devices on the CPU"."""
        from dpkit import trace_export

        return trace_export.hardware_label(self.events)

    def __enter__(self) -> Trace:
        global _step
        with _state_lock:
            if not _recorders:
                _step = 0  # steps count from 1 in each outermost trace
            _recorders.append(self)
        self.origin = time.perf_counter()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        record_allocator_peaks()  # the last step's peak, while this trace still records
        with _state_lock:
            _recorders.remove(self)
        resolve_pending()


def trace() -> Trace:
    """Record every phase of every step inside a ``with`` block: ``with dpkit.trace() as tr:``."""
    return Trace()
