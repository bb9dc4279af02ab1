"""Memory as torch's CUDA caching allocator reports it, on real CUDA devices.

The recorder reads ``allocated (torch)`` at the end of a step's forward and ``peak (torch)``
when the next step begins or the trace ends, after resetting the peak when the step began;
see :class:`~dpkit.tracing.events.MemoryRecord` for what the two totals mean. Virtual lanes
on one GPU share its allocator: its totals are no lane's own, so lanes have none.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from dpkit.device import REAL, Device


def devices_with_allocator(devices: Iterable[Device]) -> tuple[Device, ...]:
    """Those of ``devices`` whose allocator totals are their own (real CUDA devices), each once."""
    own = (d for d in devices if d.kind == REAL and d.device_type == "cuda")
    return tuple(dict.fromkeys(own))


def reset_peaks(devices: Iterable[Device]) -> None:
    """Start a new peak on each device (``torch.cuda.reset_peak_memory_stats``)."""
    for device in devices:
        torch.cuda.reset_peak_memory_stats(device.torch_device)


def allocated(device: Device) -> int:
    """Bytes torch's allocator has handed out on ``device`` now."""
    return torch.cuda.memory_allocated(device.torch_device)


def peak(device: Device) -> int:
    """The most bytes torch's allocator had handed out on ``device`` since the last reset."""
    return torch.cuda.max_memory_allocated(device.torch_device)
