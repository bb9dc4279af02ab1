"""gather: combine the replicas' outputs into one output on one device.

The surprises first, as in ``torch.nn.parallel.gather``:

- Tensors are concatenated along ``dim`` on ``target_device``; the backward scatters the
  gradient back to the device each piece came from.
- A replica that returns a scalar (a 0-dim tensor, such as a loss) gives a *vector* with
  one entry per device, with a warning; its gradient is squeezed back to a scalar.
- Dicts (with the same number of keys), namedtuples, lists and tuples are gathered element
  by element; ``None`` stays ``None``.
- Anything else cannot be combined. torch fails obscurely on it (or, for a string, builds
  one from a ``map`` object); dpkit raises a ``TypeError`` that says what to return.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from dpkit._functions import Gather
from dpkit.devices import Device, DeviceLike, as_device, device_of
from dpkit.parallel_apply import get_a_var
from dpkit.scatter import _is_namedtuple


def _target(target_device: DeviceLike, outputs: Sequence[Any]) -> Device:
    first = get_a_var(list(outputs))
    like = device_of(first) if first is not None else None
    return as_device(target_device, like=like, argument="target_device")


def _cannot_gather(value: Any) -> TypeError:
    kind = type(value).__name__
    hint = (
        "a dataclass: return its fields as a dict or a namedtuple instead"
        if hasattr(type(value), "__dataclass_fields__")
        else "return tensors (a Python number can be wrapped with torch.tensor(x)), or a "
        "dict, list, tuple or namedtuple of tensors"
    )
    return TypeError(f"gather cannot combine replica outputs of type {kind}; {hint}")


def _check_gatherable(output: torch.Tensor, dim: int) -> None:
    if output.dim() == 0 and dim != 0:
        raise ValueError(f"replica outputs are scalars, which gather only along dim=0, not {dim}")
    if output.dim() > 0 and not -output.dim() <= dim < output.dim():
        raise ValueError(
            f"dim={dim} is out of range for replica outputs of shape {tuple(output.shape)}; "
            f"use a dim between {-output.dim()} and {output.dim() - 1}"
        )


def gather(outputs: Sequence[Any], target_device: DeviceLike, dim: int = 0) -> Any:
    """Gather one output per replica into a single output on ``target_device``."""
    if len(outputs) == 0:
        raise ValueError("outputs is empty; pass one output per replica")
    destination = _target(target_device, outputs)

    def gather_map(outputs: Sequence[Any]) -> Any:
        out = outputs[0]
        if isinstance(out, torch.Tensor):
            _check_gatherable(out, dim)
            input_devices = tuple(device_of(t) for t in outputs)
            return Gather.apply(destination, dim, input_devices, *outputs)
        if out is None:
            return None
        if isinstance(out, dict):
            if not all(len(out) == len(d) for d in outputs):
                raise ValueError("All dicts must have the same number of keys")
            return type(out)((k, gather_map([d[k] for d in outputs])) for k in out)
        if _is_namedtuple(out):
            return type(out)._make(map(gather_map, zip(*outputs, strict=True)))
        if isinstance(out, (list, tuple)):
            return type(out)(map(gather_map, zip(*outputs, strict=True)))
        raise _cannot_gather(out)

    # gather_map refers to itself; clearing it breaks the reference cycle (as torch does).
    try:
        return gather_map(outputs)
    finally:
        gather_map = None  # type: ignore[assignment]
