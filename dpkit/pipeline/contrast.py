"""Data parallel, DDP, model/pipeline parallel: what each copies, what each sends, when it fits.

The surprise first: the data-parallel engines send bytes in proportion to the *model*
(every step moves every parameter or its gradient), a model split in proportion to the
*activations* at its cuts (every step moves the batch's activations forward and their
gradients back, however many micro-batches). So a large model with a small batch favours
the split, a small model with a large batch favours data parallelism; and a model too big
for one device leaves only the split (or sharding, which this course does not cover).

:func:`contrast_table` computes the bytes per step of each for a given model, batch and
device count, from the model's own tensors (one forward on the batch, nothing trained).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dpkit.nested import tensor_nbytes
from dpkit.pipeline.stages import split_model
from dpkit.table import Table


def cut_activation_bytes(model: nn.Sequential, inputs: torch.Tensor, stages: int) -> int:
    """Bytes of the activations crossing the cuts of ``model`` split into ``stages`` (the
    whole batch; their gradients cross back with as many)."""
    crossing = 0
    with torch.no_grad():
        flowing = inputs
        parts = split_model(model, stages)
        for s, part in enumerate(parts):
            flowing = part(flowing)
            if s < stages - 1:
                crossing += tensor_nbytes(flowing)
    return crossing


def contrast_table(model: nn.Sequential, inputs: torch.Tensor, devices: int) -> Any:
    """One row per strategy for ``model`` on batch ``inputs`` over ``devices`` devices:
    what each device holds of the model, what crosses between devices, the bytes that
    crossing adds up to per step (by the formulas of dpkit.cost.collectives), and when
    the strategy fits."""
    n = devices
    params = sum(map(tensor_nbytes, [*model.parameters(), *model.buffers()]))
    with torch.no_grad():
        out_bytes = tensor_nbytes(model(inputs))
    in_bytes = tensor_nbytes(inputs)
    share = (n - 1) / n
    data_parallel = int(2 * params * (n - 1) + (in_bytes + 2 * out_bytes) * share)
    rows = Table()
    rows.append(
        {
            "strategy": "DataParallel (one process)",
            "each device holds": "the whole model (a replica per step)",
            "crosses devices": "parameters out, gradients in, via device 0",
            "bytes/step": data_parallel,
            "fits when": "one machine, quick to try; device 0 is the bottleneck",
        }
    )
    rows.append(
        {
            "strategy": "DDP (a process per device)",
            "each device holds": "the whole model (copied once)",
            "crosses devices": "gradients, all-reduced in buckets during backward",
            "bytes/step": int(2 * params * (n - 1)),  # a ring: 2(n-1)/n per rank, n ranks
            "fits when": "the model fits on one device: the default choice",
        }
    )
    rows.append(
        {
            "strategy": "model split / pipeline",
            "each device holds": f"1/{n} of the layers (one stage)",
            "crosses devices": "activations forward, their gradients back",
            "bytes/step": 2 * cut_activation_bytes(model, inputs, n),
            "fits when": "the model does not fit on one device (sharding, ZeRO or FSDP, is the "
            "usual first step); needs micro-batches",
        }
    )
    return rows
