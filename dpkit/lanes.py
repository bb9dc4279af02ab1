"""What a lane adds to a replica's run in :func:`dpkit.parallel_apply`: its stream, what it
reads, and the tag on what it makes.

torch runs each replica on its device's current stream and knows no lanes. A virtual lane
is a tag on a tensor and, on a GPU, a CUDA stream of its own, so ``parallel_apply`` calls
the helpers here at four points (the module docstring of :mod:`dpkit.parallel_apply` says
why each is needed):

- :func:`lane_streams`, in the caller: the stream each replica runs on;
- :func:`record_reads`, in a GPU lane's worker: what it reads, recorded on its stream;
- :func:`tag_new_outputs`, in a lane's worker: the outputs its forward made, tagged;
- :func:`lanes_done`, in the caller: its stream waits for the lanes' and records the outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from dpkit import comm
from dpkit.devices import _LANE_ATTRIBUTE, Device, place, stream_of
from dpkit.nested import module_tensors, tensors_in


def lane_streams(devices: Sequence[Device]) -> tuple[list[Any], Any | None]:
    """The stream each replica runs on (None on CPU), and the caller's stream when lanes
    share one GPU (else None). Called in the caller's thread, whose streams these are."""
    first = devices[0]
    if first.device_type == "cpu":
        return [None] * len(devices), None
    module = torch.get_device_module(first.device_type)
    if first.has_own_stream:
        return [stream_of(device) for device in devices], module.current_stream(first.torch_device)
    # Real devices: the caller's current stream on each, as torch does; in a worker thread
    # current_stream would give the device's default stream instead.
    return [module.current_stream(device.torch_device) for device in devices], None


def record_reads(
    module: nn.Module, input: Any, kwargs: dict[str, Any], stream: Any, caller_stream: Any
) -> None:
    """On a GPU lane (``caller_stream`` is not None): record on the lane's stream the CUDA
    tensors its replica reads that were made on the caller's stream."""
    if caller_stream is None:
        return
    comm.record_use(module_tensors(module), stream)
    comm.record_use(tensors_in(input), stream)
    if kwargs:
        comm.record_use(tensors_in(kwargs), stream)


def tag_new_outputs(
    output: Any,
    device: Device,
    module: nn.Module,
    input: Any,
    kwargs: dict[str, Any],
    caller_stream: Any,
) -> None:
    """Tag with its lane ``device`` the output tensors the replica's forward made. Tensors on
    a lane already keep their lane; a parameter or a tensor that existed before the forward
    is the user's (or another replica's), and tagging it would move it to this lane for good."""
    if not device.is_virtual:  # only virtual lanes are tags: nothing to walk on a real GPU
        return
    tensors = tensors_in(output)
    if caller_stream is not None:  # a GPU lane's CPU tensors (a count, say) are the host's
        tensors = [t for t in tensors if t.device == device.torch_device]
    new = [
        t
        for t in tensors
        if getattr(t, _LANE_ATTRIBUTE, None) is None and not isinstance(t, nn.Parameter)
    ]
    # An output with a grad_fn was made by autograd in this forward; a leaf may be older.
    if any(t.grad_fn is None for t in new):
        before = _tensor_ids_before(module, input, kwargs)
        new = [t for t in new if t.grad_fn is not None or id(t) not in before]
    for tensor in new:
        place(tensor, device)


def _tensor_ids_before(module: nn.Module, input: Any, kwargs: dict[str, Any]) -> set[int]:
    """The tensors a replica could return without making them: its inputs, and its
    modules' buffers and tensor attributes (a replica's parameters are attributes too)."""
    ids = {id(t) for t in tensors_in(input)}
    if kwargs:
        ids.update(id(t) for t in tensors_in(kwargs))
    stack = [module]
    while stack:
        submodule = stack.pop()
        stack.extend(child for child in submodule._modules.values() if child is not None)
        ids.update(id(v) for v in submodule.__dict__.values() if isinstance(v, torch.Tensor))
        ids.update(id(t) for t in submodule._buffers.values() if t is not None)
    return ids


def lanes_done(streams: Sequence[Any], caller_stream: Any, results: dict[int, Any]) -> None:
    """On GPU lanes (``caller_stream`` is not None): the caller's stream waits for every
    lane's before the outputs are used, and records the CUDA outputs, which were made on a
    lane's stream and are read on the caller's (the allocator must not reuse them early)."""
    if caller_stream is None:
        return
    for stream in streams:
        caller_stream.wait_stream(stream)
    comm.record_use(tensors_in(list(results.values())), caller_stream)
