"""The tensors inside what replicas take and return and inside a replica, and their bytes."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def tensors_in(obj: Any, found: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """Every tensor in ``obj``: a tensor, or lists, tuples and dicts holding tensors (appended
    to ``found`` when given)."""
    found = [] if found is None else found
    if isinstance(obj, torch.Tensor):
        found.append(obj)
    elif isinstance(obj, (list, tuple, dict)):
        for item in obj.values() if isinstance(obj, dict) else obj:
            tensors_in(item, found)
    return found


def module_tensors(module: nn.Module) -> list[torch.Tensor]:
    """A module's parameters and buffers, a replica's too (whose parameters are attributes,
    listed in ``_former_parameters`` by replicate)."""
    found: list[torch.Tensor] = []
    for submodule in module.modules():
        params = submodule.__dict__.get("_former_parameters") or submodule._parameters
        found.extend(t for t in params.values() if t is not None)
        found.extend(t for t in submodule._buffers.values() if t is not None)
    return found


def tensor_nbytes(tensor: torch.Tensor) -> int:
    """Bytes a copy of ``tensor`` moves (values and indices for a sparse tensor): the one rule
    for bytes, in transfers, trace events and memory records alike."""
    if tensor.is_sparse:
        return tensor_nbytes(tensor._values()) + tensor_nbytes(tensor._indices())
    return tensor.nbytes  # numel x element size (of a view: its own elements only)
