"""The one place where bytes move between devices, and the one place a move is reported.

Four collectives, named and behaving as in ``torch.nn.parallel.comm``: :func:`scatter`,
:func:`broadcast`, :func:`reduce_add` and :func:`gather`. Their arguments differ: they take
dpkit devices, and where a lane's tensor cannot say it, the devices tensors come from;
``broadcast`` and ``reduce_add`` take groups of tensors, as torch's ``broadcast_coalesced``
and ``reduce_add_coalesced`` do (without packing them into buffers); ``reduce_add`` may land
on a device that sent nothing, where torch requires one of its inputs.

Each moves its tensors in groups, one group per device, through one seam,
:func:`_copy_group`, which is all that tells anyone else about a copy: the transfer
listeners (:func:`add_transfer_listener`) hear of every copy (:func:`copy_to`); the trace
gets one span per group (phase from the collective and the pass, ``scatter`` in forward,
``grad_scatter`` in backward; see :func:`dpkit.tracing.copy_span`) with the bytes actually
copied, then what the copies leave on the device; and in a backward on GPU lanes, what a
lane reads or made is recorded on the right stream (below). A tensor already on its
target is used as it is, never copied, exactly as torch does for the chunk or parameter
that already sits on the target GPU.

On CPU lanes, a copy of 1 MiB or more goes into a block the lane reuses
(:mod:`dpkit.lane_memory`, like CUDA's caching allocator): fresh memory faults in each page
on its first write, which made large copies run at 0.17-0.19x of ``copy_``'s speed (medians,
``benchmarks/results/copy_bandwidth.json``). A block is reused only once no tensor uses it,
so nothing anyone holds is ever overwritten.

Copies run on the caller's current stream. Lanes on one GPU do their *compute* on their
own streams (see ``parallel_apply``), which wait for these copies before they start. A
tensor made on one stream and read on another must also be *recorded* on the reader's
stream, or torch's caching allocator may hand its memory to new work on the maker's stream
while the reader's kernels are still queued: ``parallel_apply`` records what each lane's
forward reads, and in backward, where no ``parallel_apply`` runs, the seam has
:mod:`dpkit.lanes` record the gradients these functions hand to lanes or take from them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from dpkit import lane_memory, lanes, tracing
from dpkit.context import in_backward
from dpkit.device import Device
from dpkit.lanes import device_of, place, resides_on
from dpkit.nested import tensor_nbytes
from dpkit.tracing import Collective, Phase

__all__ = ["Transfer", "add_transfer_listener", "copy_to"]


@dataclass(frozen=True)
class Transfer:
    """One copy between devices: what made it (``op``: the collective, "scatter",
    "broadcast", "reduce" or "gather", or the label a caller of :func:`copy_to` gave), in
    which phase (None for a label that names none), from where, to where, how big."""

    op: str
    source: Device
    destination: Device
    nbytes: int
    phase: Phase | None


_listeners: OrderedDict[int, Callable[[Transfer], None]] = OrderedDict()


def add_transfer_listener(listener: Callable[[Transfer], None]) -> RemovableHandle:
    """Call ``listener(transfer)`` for every copy between devices until the handle is removed."""
    handle = RemovableHandle(_listeners)
    _listeners[handle.id] = listener
    return handle


_COLLECTIVES = frozenset(c.value for c in Collective)
_PHASES = {p.value: p for p in Phase}


def _report(op: Collective | str, tensor: torch.Tensor, source: Device | None, destination: Device):
    """Tell the transfer listeners about one copy, made by ``op``: its phase is a collective's
    in this pass, a phase's own (exercises label their copies "grad_scatter", "allreduce"),
    else None (a label such as "setup")."""
    if _listeners:
        source = device_of(tensor) if source is None else source
        phase = Collective(op).phase(in_backward()) if op in _COLLECTIVES else _PHASES.get(op)
        transfer = Transfer(str(op), source, destination, tensor_nbytes(tensor), phase)
        for listener in list(_listeners.values()):
            listener(transfer)


def _copy_data(tensor: torch.Tensor, destination: Device) -> torch.Tensor:
    if tensor.device == destination.memory:
        # Another lane of the same physical device: a real copy in the same memory, into a
        # block the lane reuses where it can (CPU lanes: fresh pages fault on first write).
        copied = lane_memory.copy(tensor, destination)
        # Else torch's clone, which keeps strides (sparse tensors take no memory_format).
        return tensor.clone() if copied is None else copied
    # Copies into CPU memory block, so the result is ready when it is returned.
    non_blocking = destination.device_type != "cpu"
    return tensor.to(destination.torch_device, non_blocking=non_blocking, copy=True)


def copy_to(
    tensor: torch.Tensor, destination: Device, op: Collective | str, source: Device | None = None
) -> torch.Tensor:
    """``tensor`` on ``destination``: itself if it is already there, else a counted copy,
    reported as made by ``op``: a :class:`~dpkit.tracing.Collective` or its name
    ("scatter", "broadcast", "reduce", "gather"), or any label (see :class:`Transfer`).

    ``source`` says where the tensor is when its tag cannot (gradients carry no lane tag).
    """
    there = source.shares_memory_with(destination) if source else resides_on(tensor, destination)
    if there:
        return tensor  # the caller's own object: never tagged, never copied
    _report(op, tensor, source, destination)
    return place(_copy_data(tensor, destination), destination)


def _copy_group(
    collective: Collective,
    device: Device,
    group: Sequence[torch.Tensor],
    destination: Device,
    source: Device | None = None,
    /,
    into: Sequence[torch.Tensor] | None = None,
    leaves: Sequence[torch.Tensor] | None = None,
    **details: Any,
) -> list[torch.Tensor]:
    """The collectives' one seam: ``group`` copied to ``destination`` by :func:`copy_to`
    (or, with ``into``, into those tensors: gather's slices of its result), and reported.

    - The trace: one span of ``collective`` on ``device`` (its phase follows from the pass)
      with the bytes actually copied (:func:`copy_to` hands back a tensor that needed no
      copy), then what the group leaves on ``destination`` (``leaves``, by default the
      group: a forward scatter's ``input``, a broadcast's ``parameters``; gather's pieces
      name their one result with the last piece).
    - Streams, in a backward on GPU lanes: what scatter and broadcast hand to a lane is
      recorded on the lane's stream, where its backward reads it; what reduce_add and
      gather take from a lane, on this thread's stream, where their copies read it.
    """
    if collective in (Collective.REDUCE, Collective.GATHER):  # taken from a lane
        lanes.made_on_lane_stream(group, device)
    with tracing.copy_span(collective, device, **details) as span:
        if into is None:
            copies = [copy_to(t, destination, collective, source) for t in group]
            moved = [t for t, c in zip(group, copies) if c is not t]
        else:  # the bytes copy_to would move, with no tensor in between
            copies = list(into)
            moved = [] if source.shares_memory_with(destination) else list(group)
            for tensor in moved:
                _report(collective, tensor, source, destination)
            for tensor, out in zip(group, copies, strict=True):
                out.copy_(tensor, non_blocking=destination.device_type != "cpu")
        if span is not None:
            span.nbytes = sum(map(tensor_nbytes, moved))
    if collective in (Collective.SCATTER, Collective.BROADCAST):  # handed to a lane
        lanes.read_on_lane_stream(copies, destination)
    leaves = group if leaves is None else leaves
    if leaves:
        tracing.holds(collective, (destination,), leaves)
    return copies


# --------------------------------------------------------------------------------------
# The collectives


def scatter(
    tensor: torch.Tensor,
    devices: Sequence[Device],
    chunk_sizes: Sequence[int],
    dim: int,
    source: Device | None = None,
) -> tuple[torch.Tensor, ...]:
    """Split ``tensor`` along ``dim`` into ``chunk_sizes`` and put chunk *i* on ``devices[i]``.

    ``source`` says where ``tensor`` is when its tag cannot (a gradient carries no tag).
    """
    results = []
    for chunk, device in zip(tensor.split(list(chunk_sizes), dim), devices, strict=True):
        (moved,) = _copy_group(
            Collective.SCATTER, device, (chunk,), device, source,
            rows=chunk.shape[dim], shape=tuple(chunk.shape),
        )  # fmt: skip
        # A new view: tagging one that stays home touches no caller's object.
        results.append(place(moved, device))
    return tuple(results)


def broadcast(
    tensors: Sequence[torch.Tensor], devices: Sequence[Device]
) -> list[list[torch.Tensor]]:
    """One list of ``tensors`` per device; ``devices[0]`` gets the originals themselves.

    Runs without autograd: the ``Broadcast`` function, not this copy, carries gradients.
    """
    for tensor in tensors:
        if not resides_on(tensor, devices[0]):
            raise ValueError(
                f"broadcast source must be on devices[0] ({devices[0]}), found a tensor on "
                f"{device_of(tensor)}; move the module to devices[0] first"
            )
    with torch.no_grad():
        return [
            _copy_group(Collective.BROADCAST, device, tensors, device, tensors=len(tensors))
            for device in devices
        ]


def reduce_add(
    per_device: Sequence[Sequence[torch.Tensor]], destination: Device, devices: Sequence[Device]
) -> list[torch.Tensor]:
    """Sum the i-th tensor of every device's list onto ``destination``, as torch's reduce_add.

    ``per_device[j]`` comes from ``devices[j]``. Each device's tensors are first copied to
    ``destination`` (those already there are not), then summed in device order starting
    from the one on ``destination``, as torch does where NCCL is not available (where it is,
    torch sums with ``nccl.reduce``); with none there, from ``devices[0]``'s (torch raises).
    """
    for j, tensors in enumerate(per_device):  # torch's size check, before any copy
        for tensor, first in zip(tensors, per_device[0]):
            if tensor.size() != first.size():
                got, expected = ("x".join(map(str, t.size())) for t in (tensor, first))
                raise ValueError(f"input {j} has invalid size: got {got}, but expected {expected}")
    reduce = Collective.REDUCE
    on_destination = []
    for tensors, device in zip(per_device, devices, strict=True):
        details = dict(tensors=len(tensors), destination=destination.name)
        on_destination.append(_copy_group(reduce, device, tensors, destination, device, **details))
    root = next((j for j, d in enumerate(devices) if d == destination), 0)
    results = []
    with tracing.copy_span(reduce, destination, what="sum", tensors=len(on_destination[0])):
        for inputs in zip(*on_destination, strict=True):
            result, nonroot = inputs[root], [t for j, t in enumerate(inputs) if j != root]
            if nonroot:
                result = result + nonroot[0]  # a new tensor: the inputs stay untouched
            for other in nonroot[1:]:
                result.add_(other)
            results.append(place(result, destination))
    return results


def gather(
    tensors: Sequence[torch.Tensor], dim: int, destination: Device, sources: Sequence[Device]
) -> torch.Tensor:
    """Concatenate ``tensors`` (``tensors[i]`` on ``sources[i]``) into one on ``destination``.

    As in torch, the result is allocated once on the destination and every piece is copied
    straight into its slice; only pieces from other devices count as bytes moved.
    """
    first = tensors[0]
    dim = dim % first.dim()
    for position, tensor in enumerate(tensors):
        if tensor.dim() != first.dim() or any(
            a != b for axis, (a, b) in enumerate(zip(tensor.shape, first.shape)) if axis != dim
        ):
            raise ValueError(
                f"gather: output {position} has shape {tuple(tensor.shape)} but output 0 has "
                f"{tuple(first.shape)}; replica outputs may differ only along dim={dim}"
            )
    # the first output's shape, with every piece's size along dim added up
    shape = [*first.shape[:dim], sum(t.shape[dim] for t in tensors), *first.shape[dim + 1 :]]
    # torch's memory format: the pieces' where all have one (channels_last), as torch.cat's
    meta = [t.to("meta") for t in tensors] if first.dim() in (4, 5) else ()
    stride = torch.cat(meta, dim).stride() if meta else ()
    result = lane_memory.empty(shape, first.dtype, destination, stride)  # reused blocks
    pieces = result.split([t.shape[dim] for t in tensors], dim)
    for tensor, source, piece in zip(tensors, sources, pieces, strict=True):
        _copy_group(
            Collective.GATHER, source, (tensor,), destination, source,
            into=(piece,), leaves=(result,) if piece is pieces[-1] else (),
            rows=tensor.shape[dim], destination=destination.name,
        )  # fmt: skip
    return place(result, destination)
