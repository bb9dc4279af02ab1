"""The one place where bytes move between devices.

Every copy dpkit makes from one device to another goes through :func:`copy_to`, so the
bytes can be counted in one place (:func:`add_transfer_listener`). A tensor already on its
target is used as it is, never copied, exactly as ``torch.nn.parallel.comm`` does for the
chunk or parameter that already sits on the target GPU.

Copies run on the caller's current stream. Lanes on one GPU do their *compute* on their
own streams (see ``parallel_apply``), which wait for these copies before they start.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch.utils.hooks import RemovableHandle

from dpkit.devices import Device, device_of, place, resides_on


@dataclass(frozen=True)
class Transfer:
    """One copy between devices: which primitive made it, from where, to where, how big."""

    op: str
    source: Device
    destination: Device
    nbytes: int


_listeners: dict[int, Callable[[Transfer], None]] = {}


def add_transfer_listener(listener: Callable[[Transfer], None]) -> RemovableHandle:
    """Call ``listener(transfer)`` for every copy between devices until the handle is removed."""
    handle = RemovableHandle(_listeners)
    _listeners[handle.id] = listener
    return handle


def tensor_nbytes(tensor: torch.Tensor) -> int:
    """Bytes a copy of ``tensor`` moves (values and indices for a sparse tensor)."""
    if tensor.is_sparse:
        return tensor_nbytes(tensor._values()) + tensor_nbytes(tensor._indices())
    return tensor.numel() * tensor.element_size()


def _copy_data(tensor: torch.Tensor, destination: Device) -> torch.Tensor:
    if tensor.device == destination.torch_device:
        # Another lane of the same physical device: a real copy in the same memory.
        return tensor.clone(memory_format=torch.preserve_format)
    # Copies into CPU memory block, so the result is ready when it is returned.
    non_blocking = destination.torch_device.type != "cpu"
    return tensor.to(destination.torch_device, non_blocking=non_blocking, copy=True)


def _count(op: str, tensor: torch.Tensor, destination: Device) -> None:
    if _listeners:
        transfer = Transfer(op, device_of(tensor), destination, tensor_nbytes(tensor))
        for listener in list(_listeners.values()):
            listener(transfer)


def copy_to(tensor: torch.Tensor, destination: Device, op: str) -> torch.Tensor:
    """``tensor`` on ``destination``: itself if it is already there, else a counted copy."""
    if resides_on(tensor, destination):
        return tensor  # the caller's own object: never tagged, never copied
    _count(op, tensor, destination)
    return place(_copy_data(tensor, destination), destination)


def scatter(
    tensor: torch.Tensor, devices: Sequence[Device], chunk_sizes: Sequence[int], dim: int
) -> tuple[torch.Tensor, ...]:
    """Split ``tensor`` along ``dim`` into ``chunk_sizes`` and put chunk *i* on ``devices[i]``."""
    chunks = tensor.split(list(chunk_sizes), dim)
    # The chunks are new views, so tagging one that stays home touches no caller's object.
    return tuple(
        place(copy_to(chunk, device, "scatter"), device)
        for chunk, device in zip(chunks, devices, strict=True)
    )


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
        return [[copy_to(t, device, "broadcast") for t in tensors] for device in devices]


def reduce_add(
    per_device: Sequence[Sequence[torch.Tensor]], destination: Device
) -> list[torch.Tensor]:
    """Sum the i-th tensor of every device's list onto ``destination``, as torch's reduce_add.

    The sum starts from the copy already on ``destination`` (when there is one) and adds the
    others in device order, so only the tensors from other devices are copied.
    """
    results = []
    for same_tensor in zip(*per_device, strict=True):
        root = next((i for i, t in enumerate(same_tensor) if resides_on(t, destination)), 0)
        total = copy_to(same_tensor[root], destination, "reduce")
        others = [copy_to(t, destination, "reduce") for i, t in enumerate(same_tensor) if i != root]
        if others:
            total = total + others[0]  # a new tensor: the inputs stay untouched
            for other in others[1:]:
                total.add_(other)
        results.append(place(total, destination))
    return results


def gather(tensors: Sequence[torch.Tensor], dim: int, destination: Device) -> torch.Tensor:
    """Concatenate ``tensors`` along ``dim`` into one tensor on ``destination``.

    As in torch, the result is allocated once on the destination and every piece is copied
    straight into its slice; only pieces from other devices count as bytes moved.
    """
    first = tensors[0]
    dim = dim % first.dim()
    for position, tensor in enumerate(tensors):
        same_rank = tensor.dim() == first.dim()
        if not same_rank or any(
            a != b for axis, (a, b) in enumerate(zip(tensor.shape, first.shape)) if axis != dim
        ):
            raise ValueError(
                f"gather: output {position} has shape {tuple(tensor.shape)} but output 0 has "
                f"{tuple(first.shape)}; replica outputs may differ only along dim={dim}"
            )
    shape = list(first.shape)
    shape[dim] = sum(t.shape[dim] for t in tensors)
    result = torch.empty(shape, dtype=first.dtype, device=destination.torch_device)
    non_blocking = destination.torch_device.type != "cpu"
    offset = 0
    for tensor in tensors:
        if not resides_on(tensor, destination):
            _count("gather", tensor, destination)
        result.narrow(dim, offset, tensor.shape[dim]).copy_(tensor, non_blocking=non_blocking)
        offset += tensor.shape[dim]
    return place(result, destination)
