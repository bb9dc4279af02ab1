"""The host's clock around work that may run on a GPU: :func:`now`.

On a GPU the host queues work and runs ahead, so ``time.perf_counter()`` read around a step
measures how long the host took to *launch* it, not how long it ran. :func:`now` first waits
for the GPUs the given devices use (on CPU lanes there is nothing to wait for and it is
``perf_counter`` itself), so two readings bracket the work itself. Every host-side timing of
dpkit's that may run on GPU lanes (stage times, calibration's steps) reads this clock; the
trace times GPU work with CUDA events instead (:mod:`dpkit.tracing.clock`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch

from dpkit.device import Device


def gpus_of(devices: Iterable[Device]) -> list[torch.device]:
    """The accelerators ``devices`` run on, each once (GPU lanes share their GPU)."""
    found: dict[torch.device, None] = {}
    for device in devices:
        if device.device_type != "cpu":
            found[device.torch_device] = None
    return list(found)


def now(devices: Iterable[Device] | None = None) -> float:
    """``time.perf_counter()`` once the work queued on ``devices``' GPUs is done; without
    ``devices``, on every GPU this process has started (for a step whose devices the caller
    does not track: a model alone, or DataParallel around it)."""
    if devices is None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            for index in range(torch.cuda.device_count()):
                torch.cuda.synchronize(index)
        return time.perf_counter()
    for gpu in gpus_of(devices):
        torch.get_device_module(gpu.type).synchronize(gpu)
    return time.perf_counter()
