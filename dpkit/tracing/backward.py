"""The seam around a replica's run: its modules built, its forward, what its outputs and
activations hold, and its backward timed.

``replicate`` is wrapped by :func:`replicating`, which times building the replicas' module
objects. ``parallel_apply`` runs its workers through :func:`applying` (DataParallel on one
device calls its module through :func:`traced_call`), which, while tracing, runs each worker
in the caller's scope as an ``apply`` span on its device, opens a "dpkit.apply" range for
torch's profiler in the caller's thread, and then hands the finished replicas to
:func:`after_apply`. Done there, after the workers, so that none of it is timed as ``apply``
and no worker waits for the GIL on the trace's behalf: each replica's ``outputs`` are
counted, and :mod:`~dpkit.tracing.replica_graph` walks its autograd graph once, for its
``activations`` (the bytes saved for backward) and the nodes where its backward starts and
ends, which get the hooks of a :class:`ReplicaBackward`.

On the CPU, autograd runs every replica's backward in the one thread that called
``backward()``, their nodes interleaved, so the replicas' ``backward`` events overlap
without running in parallel; on GPUs each device has its own backward thread.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any, TypeVar

import torch
from torch import nn
from torch._utils import ExceptionWrapper

from dpkit.context import Scope, current_scope, current_step, within
from dpkit.device import Device, as_devices
from dpkit.lanes import stream_of
from dpkit.nested import module_tensors, tensor_nbytes, tensors_in
from dpkit.tracing import clock, recorder, replica_graph
from dpkit.tracing.events import Event, Phase

_queue_callback = torch.autograd.Variable._execution_engine.queue_callback
_BACKWARD = Phase.BACKWARD.value


class ReplicaBackward:
    """Times one replica's backward: from the first of its output nodes starting to its
    last node finishing (:mod:`~dpkit.tracing.replica_graph` finds both), with autograd
    node hooks.

    A backward that needs only part of the graph (``torch.autograd.grad(loss, inputs)``,
    ``backward(inputs=...)``) may never run the last node (the transpose of the first
    layer's weight, say); the event then ends when the whole backward does, read by a
    callback queued on autograd's engine, and says so in ``details["end"]``.
    """

    __slots__ = ("device", "step", "scope", "cuda", "start", "start_event")

    def __init__(self, device: Device, step: int, scope: Scope | None = None):
        # the forward's scope (default: this thread's), whose traces record the backward
        self.device, self.step = device, step
        self.scope = current_scope() if scope is None else scope
        self.cuda = device.device_type == "cuda"
        self.start: float | None = None
        self.start_event: Any = None

    def on_start(self, grad_outputs: Any) -> None:
        # A backward run after the trace ended (and with no hook) is timed for no one.
        if self.start is None and (recorder.recorders_for(self.scope) or recorder._hooks):
            self.start_event = clock.cuda_event_now(self.device) if self.cuda else None
            self.start = clock.now()
            _queue_callback(self.on_backward_end)

    def on_end(self, grad_inputs: Any, grad_outputs: Any) -> None:
        if self.start is None:  # no output took part in this backward
            return
        end_event = clock.cuda_event_now(self.device) if self.cuda else None
        self._emit(end_event, {})

    def on_backward_end(self) -> None:
        """The whole backward is done: end the event here if the last node did not run."""
        if self.start is None:  # on_end did
            return
        # This thread's current stream need not be the replica's: record on the replica's.
        end_event = clock.cuda_event_now(self.device, stream_of(self.device)) if self.cuda else None
        why = "when the whole backward ended: this backward skipped the replica's last node"
        self._emit(end_event, {"end": why})

    def _emit(self, end_event: Any, details: dict[str, Any]) -> None:
        device = self.device
        event = Event(
            _BACKWARD, device.name, self.start, clock.now(), 0, self.step, device.kind, details
        )
        if end_event is not None:
            recorder.time_on_gpu(event, device, self.start_event, end_event)
        self.start = None  # a second backward through the same graph starts afresh
        recorder.emit(event, self.scope)


def trace_replica(
    device: Device, outputs: Iterable[torch.Tensor], given: Iterable[torch.Tensor]
) -> None:
    """After a replica's forward: record its activations (the bytes autograd saved between
    ``outputs`` and the tensors it was ``given``) and time its backward."""
    recording = recorder.recording()
    graph = replica_graph.walk(outputs, given, count_saved=recording)
    if recording:
        recorder.record_memory(device, "activations", graph.saved_nbytes)
    if graph.first_nodes and graph.last_node is not None:
        timer = ReplicaBackward(device, current_step(), current_scope())
        for node in graph.first_nodes:
            node.register_prehook(timer.on_start)
        graph.last_node.register_hook(timer.on_end)


Replicate = TypeVar("Replicate", bound=Callable[..., Any])


def replicating(replicate: Replicate) -> Replicate:
    """``replicate``, which, while tracing, records building its replicas' module objects
    (Python in the calling thread, every replica's at once) as one more ``replicate`` event
    on the source device (``what="modules"``), timed by the CPU clock from the end of its
    last tensor copy (comm's spans, one per device) to its return."""

    @functools.wraps(replicate)
    def traced_replicate(network: nn.Module, devices: Any, detach: bool = False) -> Any:
        if not recorder.enabled():
            return replicate(network, devices, detach)
        if isinstance(devices, Iterator):  # read twice: by replicate, and for its source
            devices = list(devices)
        recorder._last_end.time = clock.now()  # no copies (no tensors): from here
        replicas = replicate(network, devices, detach)
        modules = sum(1 for _ in network.modules())
        source = as_devices(devices)[0]
        with recorder.host_span(Phase.REPLICATE, source, what="modules", modules=modules) as span:
            if span is not None:
                span.start = recorder._last_end.time
        return replicas

    return traced_replicate  # type: ignore[return-value]


def after_apply(work: Sequence[tuple[Any, ...]], results: dict[int, Any]) -> None:
    """For each ``(index, module, input, kwargs, device, ...)`` of ``parallel_apply`` whose
    result is not an exception: its outputs' bytes, its activations, its backward's timer."""
    for index, module, input, kwargs, device, *_ in work:
        output = results[index]
        if isinstance(output, ExceptionWrapper):
            continue
        outputs = [output] if isinstance(output, torch.Tensor) else tensors_in(output)
        recorder.record_memory(device, "outputs", sum(map(tensor_nbytes, outputs)))
        given = module_tensors(module)
        if isinstance(input, torch.Tensor):  # the usual case, without the recursion
            given.append(input)
        else:
            tensors_in(input, given)
        if kwargs:
            tensors_in(kwargs, given)
        trace_replica(device, outputs, given)


Worker = Callable[[int, nn.Module, Any, dict[str, Any], Device, Any], None]


@contextmanager
def applying(
    worker: Worker, work: Sequence[tuple[Any, ...]], results: dict[int, Any]
) -> Iterator[Worker]:
    """parallel_apply's ``worker``, as its workers run it: while tracing, each runs in the
    caller's scope (the caller's traces record it, in its thread) as an ``apply`` span on its
    device, timed on the stream it runs on; the workers run inside a "dpkit.apply" range in
    the caller's thread, which torch's profiler follows (it follows no worker); and once
    every worker has finished (not after a timeout or Ctrl-C), :func:`after_apply` runs on
    ``results``."""
    if not recorder.enabled():
        yield worker
        return
    scope = current_scope()

    def traced_worker(
        index: int, module: nn.Module, input: Any, kwargs: Any, device: Device, stream: Any
    ) -> None:
        with within(scope), recorder.span_on(stream, Phase.APPLY, device, replica=index):
            worker(index, module, input, kwargs, device, stream)

    profiling = torch.autograd._profiler_enabled()
    with torch.autograd.profiler.record_function("dpkit.apply") if profiling else nullcontext():
        yield traced_worker
    after_apply(work, results)


@contextmanager
def forward_step(devices: Sequence[Device]) -> Iterator[None]:
    """Around DataParallel's forward: while tracing, a step begins on ``devices`` and, when the
    forward returns, torch's allocator is read for its ``allocated (torch)`` records."""
    if not recorder.enabled():
        yield
        return
    recorder.begin_step(devices)
    yield
    recorder.end_forward()


def traced_call(module: nn.Module, input: Any, kwargs: dict[str, Any], device: Device) -> Any:
    """``module(*input, **kwargs)`` in the caller's thread, where DataParallel on one device
    calls its module, as torch's does, recorded as replica 0's forward on ``device`` (an
    ``apply`` span, the module's parameters, its outputs and activations, its backward): a
    trace of one device shows the step's work, not a scatter alone. Not tracing: the call."""
    if not recorder.enabled():
        return module(*input, **kwargs)
    with recorder.span(Phase.APPLY, device, replica=0, thread="caller"):
        output = module(*input, **kwargs)
    held = [*module.parameters(), *module.buffers()]
    recorder.record_memory(device, "parameters", sum(map(tensor_nbytes, held)))
    after_apply([(0, module, input, kwargs, device)], {0: output})
    return output
