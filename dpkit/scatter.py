"""scatter and scatter_kwargs: split a batch into one chunk per device.

The surprise first: the chunks are ``torch.chunk``'s, not an even split. ``torch.chunk``
makes chunks of ``ceil(batch / devices)`` rows, so 10 rows over 4 devices are 3, 3, 3, 1,
and 6 rows over 4 devices are 2, 2, 2: the fourth device gets nothing and sits idle, and
``DataParallel`` builds no replica for it. Tensors are split; tuples, lists, dicts and
namedtuples are split element by element; any other object is shared by reference with
every device (so a replica that writes to it writes for all).

dpkit addition (off by default): ``chunk_sizes=`` chooses other splits, ``"balanced"``
(sizes differ by at most one: 10 over 4 is 3, 3, 2, 2), an explicit list, or a function
``(batch, num_devices) -> sizes`` such as ``functools.partial(weighted_chunk_sizes,
weights=speeds)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from dpkit._functions import Scatter
from dpkit.devices import DeviceLike, as_devices

ChunkSizes = str | Sequence[int] | Callable[[int, int], Sequence[int]] | None


def torch_chunk_sizes(size: int, num_devices: int) -> list[int]:
    """The sizes ``torch.chunk(x, num_devices)`` gives for ``size`` rows (maybe fewer chunks)."""
    if size <= 0:
        return []
    chunk = math.ceil(size / num_devices)
    full, remainder = divmod(size, chunk)
    return [chunk] * full + ([remainder] if remainder else [])


def balanced_chunk_sizes(size: int, num_devices: int) -> list[int]:
    """Sizes that differ by at most one row, larger first (10 over 4: 3, 3, 2, 2)."""
    base, extra = divmod(size, num_devices)
    return [base + 1 if i < extra else base for i in range(num_devices) if base or i < extra]


def weighted_chunk_sizes(size: int, num_devices: int, weights: Sequence[float]) -> list[int]:
    """Sizes proportional to ``weights`` (e.g. device speeds), rounded by largest remainder.

    Every device gets at least one row while there are rows enough for all (a row is then
    moved from the largest chunk); with fewer rows than devices, the first devices get one.
    """
    if len(weights) != num_devices:
        raise ValueError(f"weights has {len(weights)} entries for {num_devices} devices")
    if any(w <= 0 for w in weights):
        raise ValueError(f"weights must all be positive, got {list(weights)}")
    if size < num_devices:
        return [1] * size
    shares = [size * w / sum(weights) for w in weights]
    sizes = [int(share) for share in shares]
    by_remainder = sorted(range(num_devices), key=lambda i: sizes[i] - shares[i])
    for i in by_remainder[: size - sum(sizes)]:
        sizes[i] += 1
    for i in range(num_devices):
        if sizes[i] == 0:
            sizes[max(range(num_devices), key=sizes.__getitem__)] -= 1
            sizes[i] = 1
    return sizes


def plan_chunks(size: int, num_devices: int, chunk_sizes: ChunkSizes = None) -> list[int]:
    """The chunk sizes scatter uses for ``size`` rows over ``num_devices`` devices."""
    if chunk_sizes is None:
        return torch_chunk_sizes(size, num_devices)
    if chunk_sizes == "balanced":
        return balanced_chunk_sizes(size, num_devices)
    if isinstance(chunk_sizes, str):
        raise ValueError(
            f"chunk_sizes={chunk_sizes!r} is not known; use None (torch.chunk), 'balanced', a "
            "list of sizes, or a function (batch, num_devices) -> sizes"
        )
    sizes = list(chunk_sizes(size, num_devices) if callable(chunk_sizes) else chunk_sizes)
    if any(not isinstance(s, int) or s < 1 for s in sizes) or sum(sizes) != size:
        raise ValueError(
            f"chunk_sizes={sizes} must be positive ints that add up to the batch size {size}"
        )
    if len(sizes) > num_devices:
        raise ValueError(f"chunk_sizes={sizes} has more chunks than the {num_devices} devices")
    return sizes


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_asdict") and hasattr(obj, "_fields")


def _check_splittable(tensor: torch.Tensor, dim: int) -> None:
    if tensor.dim() == 0:
        raise ValueError(
            f"cannot scatter a 0-dim tensor (a scalar) along dim={dim}; pass it as a Python "
            "number to share it with every device, or give it a batch dimension"
        )
    if not -tensor.dim() <= dim < tensor.dim():
        raise ValueError(
            f"dim={dim} is out of range for an input of shape {tuple(tensor.shape)}; use a dim "
            f"between {-tensor.dim()} and {tensor.dim() - 1}"
        )
    if tensor.shape[dim] == 0:
        raise ValueError(
            f"the input of shape {tuple(tensor.shape)} is empty along dim={dim}, so there is "
            "nothing to split; pass a batch with at least one sample"
        )


def scatter(
    inputs: Any, target_gpus: Sequence[DeviceLike], dim: int = 0, chunk_sizes: ChunkSizes = None
) -> Any:
    """Split tensors in ``inputs`` into chunks on ``target_gpus``; share other objects.

    Returns a tuple of chunks for a tensor, else a list with one entry per used device,
    exactly as ``torch.nn.parallel.scatter``. Containers whose elements split into different
    numbers of chunks are cut to the shortest (torch zips them). ``target_gpus`` keeps
    torch's name; any devices will do, virtual lanes included.
    """
    devices = as_devices(target_gpus, argument="target_gpus")

    def scatter_map(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            _check_splittable(obj, dim)
            sizes = plan_chunks(obj.shape[dim], len(devices), chunk_sizes)
            used = devices[: len(sizes)]
            return Scatter.apply(used, sizes, dim, None, obj)
        if _is_namedtuple(obj):
            return [type(obj)(*args) for args in zip(*map(scatter_map, obj))]
        if isinstance(obj, tuple) and len(obj) > 0:
            return list(zip(*map(scatter_map, obj)))
        if isinstance(obj, list) and len(obj) > 0:
            return [list(i) for i in zip(*map(scatter_map, obj))]
        if isinstance(obj, dict) and len(obj) > 0:
            return [type(obj)(i) for i in zip(*map(scatter_map, obj.items()))]
        return [obj for _ in devices]

    # scatter_map refers to itself; clearing it breaks the reference cycle (as torch does).
    try:
        return scatter_map(inputs)
    finally:
        scatter_map = None  # type: ignore[assignment]


def scatter_kwargs(
    inputs: tuple[Any, ...],
    kwargs: dict[str, Any] | None,
    target_gpus: Sequence[DeviceLike],
    dim: int = 0,
    chunk_sizes: ChunkSizes = None,
) -> tuple[tuple[Any, ...], tuple[dict[str, Any], ...]]:
    """Scatter positional and keyword inputs; pad the shorter side as torch does.

    Padding copies torch's rule literally, including its comparison of the keyword chunks
    with ``len(inputs)`` (the number of positional arguments, not of their chunks).
    """
    scattered_inputs = scatter(inputs, target_gpus, dim, chunk_sizes) if inputs else []
    scattered_kwargs = scatter(kwargs, target_gpus, dim, chunk_sizes) if kwargs else []
    if len(scattered_inputs) < len(scattered_kwargs):
        scattered_inputs.extend(() for _ in range(len(scattered_kwargs) - len(scattered_inputs)))
    elif len(scattered_kwargs) < len(inputs):
        scattered_kwargs.extend({} for _ in range(len(scattered_inputs) - len(scattered_kwargs)))
    return tuple(scattered_inputs), tuple(scattered_kwargs)
