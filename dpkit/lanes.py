"""Lanes: the tag that says which lane a tensor lives on, each GPU lane's own CUDA stream, and
what a lane adds to a replica's run in :func:`dpkit.parallel_apply` (its stream, what it
reads, the tag on what it makes).

A virtual lane is not a ``torch.device``: a tensor dpkit copies onto lane *i* is tagged with
it (:func:`place`), and :func:`device_of` and :func:`resides_on` read the tag, so that a copy
to another lane of the same memory is a real copy and one to its own lane none.

torch runs each replica on its device's current stream and knows no lanes. A virtual lane
is a tag on a tensor and, on a GPU, a CUDA stream of its own, so ``parallel_apply`` calls
the helpers here at four points (the module docstring of :mod:`dpkit.parallel_apply` says
why each is needed):

- :func:`lane_streams`, in the caller: the stream each replica runs on;
- :func:`record_reads`, in a GPU lane's worker: what it reads, recorded on its stream;
- :func:`tag_new_outputs`, in a lane's worker: the outputs its forward made, tagged;
- :func:`lanes_done`, in the caller: its stream waits for the lanes' and records the outputs.

In backward, where no ``parallel_apply`` runs, :mod:`dpkit.comm`'s copy seam has the
gradients it hands to GPU lanes, or takes from them, recorded on the stream that reads them
(:func:`read_on_lane_stream`, :func:`made_on_lane_stream`); :func:`record_use` says how.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

from dpkit.context import in_backward
from dpkit.device import HOST_DEVICE, MAX_GPU_LANES, REAL, Device
from dpkit.nested import module_tensors, tensors_in


def lane_streams(devices: Sequence[Device]) -> tuple[list[Any], Any | None]:
    """The stream each replica runs on (None on CPU), and the caller's stream when lanes
    share one GPU (else None). Called in the caller's thread, whose streams these are: a
    lane's stream first waits for the caller's, where scatter and replicate queued its
    inputs."""
    streams = [stream_of(device) for device in devices]
    first = devices[0]
    if not first.has_own_stream:
        # Real devices: the caller's current stream on each, as torch does (in a worker thread
        # current_stream would give the device's default stream instead); CPU lanes: None.
        return streams, None
    module = torch.get_device_module(first.device_type)
    caller_stream = module.current_stream(first.torch_device)
    for stream in streams:
        stream.wait_stream(caller_stream)
    return streams, caller_stream


def record_reads(
    module: nn.Module, input: Any, kwargs: dict[str, Any], device: Device, stream: Any
) -> None:
    """On a GPU lane ``device``: record on the lane's ``stream`` the CUDA tensors its replica
    reads that were made on the caller's stream."""
    if device.has_own_stream:
        record_use(module_tensors(module) + tensors_in((input, kwargs)), stream)


def tag_new_outputs(
    output: Any, device: Device, module: nn.Module, input: Any, kwargs: dict[str, Any]
) -> None:
    """Tag with its lane ``device`` the output tensors the replica's forward made. Tensors on
    a lane already keep their lane; a parameter or a tensor that existed before the forward
    is the user's (or another replica's), and tagging it would move it to this lane for good."""
    if not device.is_virtual:  # only virtual lanes are tags: nothing to walk on a real GPU
        return
    new = [
        t
        for t in tensors_in(output)
        if getattr(t, _LANE_ATTRIBUTE, None) is None
        and not isinstance(t, nn.Parameter)
        # a GPU lane's CPU tensors (a count, say) are the host's
        and (not device.has_own_stream or t.device == device.torch_device)
    ]
    # An output with a grad_fn was made by autograd in this forward; a leaf may be older: one
    # of the tensors the replica could return without making them, its inputs and its
    # modules' buffers and tensor attributes (a replica's parameters are attributes too).
    if any(t.grad_fn is None for t in new):
        before = {id(t) for t in tensors_in((input, kwargs))}
        for submodule in module.modules():
            before.update(id(v) for v in submodule.__dict__.values() if isinstance(v, torch.Tensor))
            before.update(id(t) for t in submodule._buffers.values() if t is not None)
        new = [t for t in new if t.grad_fn is not None or id(t) not in before]
    for tensor in new:
        place(tensor, device)


def lanes_done(streams: Sequence[Any], caller_stream: Any, results: dict[int, Any]) -> None:
    """On GPU lanes (``caller_stream`` is not None): the caller's stream waits for every
    lane's before the outputs are used, and records the CUDA outputs, which were made on a
    lane's stream and are read on the caller's (the allocator must not reuse them early)."""
    if caller_stream is None:
        return
    for stream in streams:
        caller_stream.wait_stream(stream)
    record_use(tensors_in(list(results.values())), caller_stream)


# --------------------------------------------------------------------------------------
# Lane tags: where a tensor lives.

# Where a tensor that dpkit copied onto a virtual lane records its lane.
_LANE_ATTRIBUTE = "_dpkit_lane"


def place(tensor: torch.Tensor, device: Device) -> torch.Tensor:
    """Record that ``tensor``, a new tensor dpkit made for ``device``, lives on that lane."""
    if device.is_virtual:
        setattr(tensor, _LANE_ATTRIBUTE, device)
    return tensor


def device_of(tensor: torch.Tensor) -> Device:
    """The dpkit device a tensor lives on: its lane, its accelerator, or the host."""
    lane = getattr(tensor, _LANE_ATTRIBUTE, None)
    if lane is not None:
        return lane
    if tensor.is_cpu:
        return HOST_DEVICE
    if tensor.is_meta:
        raise ValueError("a tensor on the meta device holds no data to move between devices")
    return Device(tensor.device.index or 0, REAL, tensor.device)


def resides_on(tensor: torch.Tensor, device: Device) -> bool:
    """True when ``tensor`` is already on ``device``, so moving it there needs no copy.

    Lane 0 is the home lane: its memory is the plain memory of its torch device. So a tensor
    dpkit never placed is on lane 0 (and on the host, for a CPU tensor), and a tensor placed
    on lane 0 is still in that plain memory; only lanes 1, 2, ... hold copies of their own.
    """
    if tensor.device != device.memory:
        return False
    lane = getattr(tensor, _LANE_ATTRIBUTE, None)
    return device.holds_plain_memory if lane is None else lane.shares_memory_with(device)


# --------------------------------------------------------------------------------------
# Streams: each GPU lane runs on its own CUDA stream; a real device on its current stream.

_lane_streams: dict[torch.device, list[Any]] = {}  # the lanes' streams, by GPU, by lane index
_lane_streams_lock = threading.Lock()


def _new_lane_streams(module: Any, gpu: torch.device) -> list[Any]:
    """One stream per possible lane of ``gpu``, all taken in one go from torch's pool of 32 of
    the highest priority, not the default one: the pool hands its streams out round-robin, so
    streams of the default priority taken after the lanes' (``torch.cuda.Stream()``, a
    library's side stream) would be the lanes' own, and their work would wait for a lane's
    instead of overlapping it. Taken one at a time, with other code taking some in between,
    they could also come back to a lane that already has one."""
    # torch's highest priority (its range's second number, -3 where the GPU allows it),
    # whose pool the code around dpkit rarely draws from.
    priority_range = getattr(module.Stream, "priority_range", None)
    priority = priority_range()[1] if priority_range is not None else -1
    for _ in range(3):
        streams = [module.Stream(gpu, priority=priority) for _ in range(MAX_GPU_LANES)]
        if len({stream.stream_id for stream in streams}) == MAX_GPU_LANES:
            return streams
    raise RuntimeError(
        f"could not get {MAX_GPU_LANES} distinct CUDA streams of priority {priority} on {gpu} "
        "from torch's pool (another thread takes streams at the same time); create dpkit's "
        "lanes first"
    )


def stream_of(device: Device) -> Any | None:
    """The stream work for ``device`` runs on (None on CPU): a GPU lane's own stream (the
    same one for the whole process), or a real device's current stream in this thread."""
    if device.device_type == "cpu":
        return None
    module = torch.get_device_module(device.device_type)
    if device.kind == REAL:
        return module.current_stream(device.torch_device)
    with _lane_streams_lock:  # two threads asking at once must not both take 32 streams
        if device.torch_device not in _lane_streams:
            _lane_streams[device.torch_device] = _new_lane_streams(module, device.torch_device)
        return _lane_streams[device.torch_device][device.index]


# --------------------------------------------------------------------------------------
# Streams: what a lane reads or made on its own stream is recorded for torch's allocator.


def record_use(tensors: Iterable[torch.Tensor], stream: Any) -> None:
    """Tell torch's caching allocator that work queued on ``stream`` reads ``tensors``.

    The allocator gives a freed block back to the stream that allocated it at once; a block
    another stream still reads must first wait for that stream's queued work, which
    ``Tensor.record_stream`` arranges (torch's own scatter does the same for its copy
    streams). Only CUDA memory has such blocks: other tensors are skipped, and a sparse
    tensor, which has no storage of its own (``record_stream`` refuses it), is recorded
    through the dense tensors it is made of.
    """
    for tensor in tensors:
        if tensor.is_cuda:
            for part in _dense_parts(tensor):
                part.record_stream(stream)


def _dense_parts(tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The strided tensors holding ``tensor``'s memory: itself, or a sparse layout's parts."""
    layout = tensor.layout
    if layout is torch.sparse_coo:
        return tensor._indices(), tensor._values()
    if layout in (torch.sparse_csr, torch.sparse_bsr):
        return tensor.crow_indices(), tensor.col_indices(), tensor.values()
    if layout in (torch.sparse_csc, torch.sparse_bsc):
        return tensor.ccol_indices(), tensor.row_indices(), tensor.values()
    return (tensor,)


def read_on_lane_stream(tensors: Sequence[torch.Tensor], lane: Device) -> None:
    """In a backward on GPU lanes: record ``tensors``, copies comm made on this thread's
    stream for ``lane``, on the lane's stream, where its backward reads them."""
    if lane.has_own_stream and in_backward():
        record_use(tensors, stream_of(lane))


def made_on_lane_stream(tensors: Sequence[torch.Tensor], lane: Device) -> None:
    """In a backward on GPU lanes: record gradients ``lane`` made on its stream as read on
    this thread's current stream of its GPU, where comm queues the copies and sums that read
    them (a copy into CPU memory too)."""
    if lane.has_own_stream and in_backward():
        module = torch.get_device_module(lane.device_type)
        record_use(tensors, module.current_stream(lane.torch_device))
