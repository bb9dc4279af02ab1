"""Task 1: chunk planning and scatter of nested inputs.

Goal: split a batch into one chunk per device, as ``torch.nn.parallel.scatter`` does.
The surprise: the chunks are ``torch.chunk``'s, not an even split. ``torch.chunk`` makes
chunks of ``ceil(batch / devices)`` rows, so 10 rows over 4 devices are 3, 3, 3, 1 and
6 rows over 4 devices are 2, 2, 2: the fourth device gets nothing and sits idle.

Inputs can be nested: tuples, lists, dicts and namedtuples are split element by element,
and any other object (a string, a number, None) is shared with every device by reference.

You may use torch, ``dpkit.comm.copy_to`` (moves a tensor to a device with a real, counted
copy) and ``dpkit.device_of``, but not ``dpkit.scatter`` or ``torch.chunk``: writing them is
the task. Grade your work with ``dpkit grade 1``.
"""

# Reference solution: every TODO of the stub, done. Graded by the same grader.

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from dpkit.comm import copy_to
from dpkit.device import Device


def chunk_sizes(batch: int, num_devices: int) -> list[int]:
    """The chunk sizes ``torch.chunk`` gives for ``batch`` rows over ``num_devices`` devices.

    Every chunk has ``ceil(batch / num_devices)`` rows except the last, which has what is
    left; so there may be fewer chunks than devices. ``chunk_sizes(10, 4) == [3, 3, 3, 1]``,
    ``chunk_sizes(6, 4) == [2, 2, 2]``. One case differs from torch on purpose:
    ``chunk_sizes(0, 4) == []`` (no rows, no chunk to run a replica on), where
    ``torch.empty(0).chunk(4)`` gives four empty chunks and torch's DataParallel would run
    four replicas on nothing.
    """
    if batch <= 0:
        return []
    rows = math.ceil(batch / num_devices)
    full, rest = divmod(batch, rows)
    return [rows] * full + ([rest] if rest else [])


def scatter_tensor(
    tensor: torch.Tensor, devices: Sequence[Device], dim: int = 0
) -> tuple[torch.Tensor, ...]:
    """Split ``tensor`` along ``dim`` by :func:`chunk_sizes`; chunk *i* goes to ``devices[i]``.

    Move each chunk with ``copy_to(chunk, device, "scatter")``: the chunk for lane 0 stays
    where it is (no copy), every other lane gets a real copy. Gradients must flow back from
    the chunks to ``tensor`` (``copy_to`` is differentiable, ``.detach()`` is not).
    Returns one chunk per device that got rows (fewer than ``len(devices)`` for a small batch).
    """
    sizes = chunk_sizes(tensor.shape[dim], len(devices))
    pieces = tensor.split(sizes, dim)
    return tuple(copy_to(piece, device, "scatter") for piece, device in zip(pieces, devices))


def scatter(inputs: Any, devices: Sequence[Device], dim: int = 0) -> list[Any]:
    """Scatter ``inputs`` (a tensor or a nest of containers) into one entry per used device.

    - a tensor: its chunks, from :func:`scatter_tensor`;
    - a tuple, list or dict: one tuple, list or dict per device, each holding that device's
      share of every element (dict keys are kept, and so is the mapping type: an
      ``OrderedDict`` gives one ``OrderedDict`` per device);
    - a namedtuple: one namedtuple of the same type per device;
    - anything else: the same object, by reference, once per device.

    When elements split into different numbers of chunks, keep as many entries as the
    element with the fewest (``zip`` does this). Returns a list.
    """
    if isinstance(inputs, torch.Tensor):
        return list(scatter_tensor(inputs, devices, dim))
    if isinstance(inputs, tuple) and hasattr(inputs, "_fields"):  # a namedtuple
        return [
            type(inputs)(*shares) for shares in zip(*(scatter(x, devices, dim) for x in inputs))
        ]
    if isinstance(inputs, tuple) and inputs:
        return [tuple(shares) for shares in zip(*(scatter(x, devices, dim) for x in inputs))]
    if isinstance(inputs, list) and inputs:
        return [list(shares) for shares in zip(*(scatter(x, devices, dim) for x in inputs))]
    if isinstance(inputs, dict) and inputs:
        keys = list(inputs)
        per_key = zip(*(scatter(inputs[key], devices, dim) for key in keys))
        return [type(inputs)(zip(keys, shares)) for shares in per_key]
    return [inputs for _ in devices]
