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
- Replicas must return the same structure. torch returns ``None`` when replica 0 returns
  ``None`` whatever the others return, and fails with a ``KeyError``, ``AttributeError`` or
  ``zip()`` error on dicts with other keys, a tensor against a tuple, or tuples of other
  lengths; dpkit raises one ``ValueError`` naming the replicas and what each returned.

``gather`` reads line for line against torch's (``torch/nn/parallel/scatter_gather.py``); a
``# dpkit:`` comment marks what differs, and dpkit's additions follow it: where the output
goes (:func:`_destination`), then the checks of the replicas' outputs (:func:`_check_outputs`
and the errors it raises).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from dpkit._functions import Gather
from dpkit.device import Device, DeviceLike, as_device
from dpkit.lanes import device_of
from dpkit.parallel_apply import get_a_var
from dpkit.scatter import _is_namedtuple, check_dim


def gather(outputs: Sequence[Any], target_device: DeviceLike, dim: int = 0) -> Any:
    """Gather one output per replica into a single output on ``target_device``."""
    check_dim(dim)  # dpkit: a clear error for a bad dim
    # dpkit: a dpkit Device (a lane, an accelerator, the host); an int is of the outputs' kind
    destination = _destination(target_device, outputs)

    def gather_map(outputs: Sequence[Any], path: tuple[Any, ...] = ()) -> Any:
        # dpkit: a clear error where torch fails obscurely or not at all (see the module
        # docstring); ``path`` says where in the output
        _check_outputs(outputs, dim, path)
        out = outputs[0]
        if isinstance(out, torch.Tensor):
            # dpkit: the device each piece came from, where backward sends its gradient
            return Gather.apply(destination, dim, tuple(map(device_of, outputs)), *outputs)
        if out is None:
            return None
        if isinstance(out, dict):
            # dpkit: torch's "All dicts must have the same number of keys" is raised by
            # _check_outputs (with torch's words first); each value gets its key in path
            return type(out)((k, gather_map([d[k] for d in outputs], (*path, k))) for k in out)
        # dpkit: one list for both branches, each item with its index in path, and zip without
        # strict=True: _check_outputs has checked the lengths (torch: map over zip(*outputs,
        # strict=True) in each branch)
        gathered = [gather_map(items, (*path, i)) for i, items in enumerate(zip(*outputs))]
        if _is_namedtuple(out):
            return type(out)._make(gathered)
        return type(out)(gathered)

    # Recursive function calls like this create reference cycles.
    # Setting the function to None clears the refcycle.
    try:
        res = gather_map(outputs)
    finally:
        gather_map = None  # type: ignore[assignment]
    return res


# --------------------------------------------------------------------------------------
# dpkit's additions, in the order gather calls them.


def _destination(target_device: DeviceLike, outputs: Sequence[Any]) -> Device:
    if len(outputs) == 0:
        raise ValueError("outputs is empty; pass one output per replica")
    first = get_a_var(list(outputs))
    like = device_of(first) if first is not None else None
    return as_device(target_device, like=like, argument="target_device")


def _check_outputs(outputs: Sequence[Any], dim: int, path: tuple[Any, ...]) -> None:
    """The replicas' outputs at ``path`` are of a type gather combines, all of one structure
    (torch checks only that dicts have as many keys) and, for tensors, have ``dim``."""
    out = outputs[0]
    if isinstance(out, torch.Tensor):
        same = all(isinstance(o, torch.Tensor) for o in outputs)
    elif out is None:
        same = all(o is None for o in outputs)
    elif isinstance(out, dict):
        same = all(isinstance(d, dict) and d.keys() == out.keys() for d in outputs)
    elif isinstance(out, (list, tuple)):
        same = all(isinstance(o, (list, tuple)) and len(o) == len(out) for o in outputs)
    else:
        raise _cannot_gather(out)
    if not same:
        raise _different_structures(outputs, path)
    if isinstance(out, torch.Tensor) and out.dim() == 0 and dim != 0:
        raise ValueError(f"replica outputs are scalars, which gather only along dim=0, not {dim}")
    if isinstance(out, torch.Tensor) and out.dim() > 0:
        check_dim(dim, out.shape, of="replica outputs")


def _cannot_gather(value: Any) -> TypeError:
    kind = type(value).__name__
    hint = (
        "a dataclass: return its fields as a dict or a namedtuple instead"
        if hasattr(type(value), "__dataclass_fields__")
        else "return tensors (a Python number can be wrapped with torch.tensor(x)), or a "
        "dict, list, tuple or namedtuple of tensors"
    )
    return TypeError(f"gather cannot combine replica outputs of type {kind}; {hint}")


def _different_structures(outputs: Sequence[Any], path: tuple[Any, ...]) -> ValueError:
    replicas: dict[str, list[str]] = {}
    for index, output in enumerate(outputs):
        replicas.setdefault(_describe(output), []).append(str(index))
    returned = "; ".join(
        f"replica{'s' if len(indices) > 1 else ''} {', '.join(indices)}: {what}"
        for what, indices in replicas.items()
    )
    at = f" at output{''.join(f'[{key!r}]' for key in path)}" if path else ""
    # torch's own words first where torch has them: dicts with other numbers of keys
    torch_words = all(isinstance(o, dict) for o in outputs) and len({len(o) for o in outputs}) > 1
    return ValueError(
        f"{'All dicts must have the same number of keys. ' if torch_words else ''}gather cannot "
        f"combine replica outputs of different structures{at} ({returned}); make every "
        "replica return the same structure: the same containers, lengths and keys, with "
        "tensors in the same places"
    )


def _describe(output: Any) -> str:
    if isinstance(output, torch.Tensor):
        return "a tensor"
    if output is None:
        return "None"
    if isinstance(output, dict):
        return f"a {type(output).__name__} with keys {list(output)}"
    if isinstance(output, (list, tuple)):
        return f"a {type(output).__name__} of {len(output)}"
    return f"a {type(output).__name__}"
