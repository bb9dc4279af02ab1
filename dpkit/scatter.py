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

Where torch gives a silent wrong result, dpkit raises (a documented difference): every
tensor split by one call onto several devices, positional and keyword alike, must have the
same size along ``dim`` (torch zips chunks of different batches, dropping rows, or hands a
replica a short keyword tensor that broadcasts). Sparse and nested tensors get a clear error.

``scatter`` and ``scatter_kwargs`` read line for line against torch's
(``torch/nn/parallel/scatter_gather.py``); a ``# dpkit:`` comment marks what differs. dpkit's
additions follow them: how one call splits each tensor (:class:`_Split` and its checks). The
chunk plans (``chunk_sizes=``, and ``torch.chunk``'s sizes) are :mod:`dpkit.chunk_plans`'.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from dpkit._functions import Scatter
from dpkit.chunk_plans import ChunkSizes, _is_int, plan_chunks
from dpkit.chunk_plans import balanced_chunk_sizes as balanced_chunk_sizes  # this module's
from dpkit.chunk_plans import torch_chunk_sizes as torch_chunk_sizes  # names before they
from dpkit.chunk_plans import weighted_chunk_sizes as weighted_chunk_sizes  # moved (DESIGN.md)
from dpkit.device import Device, DeviceLike, as_devices


def _is_namedtuple(obj: Any) -> bool:
    # Check if type was created from collections.namedtuple or a typing.NamedTuple.
    return isinstance(obj, tuple) and hasattr(obj, "_asdict") and hasattr(obj, "_fields")


def scatter(
    inputs: Any, target_gpus: Sequence[DeviceLike], dim: int = 0, chunk_sizes: ChunkSizes = None
) -> Any:
    """Slice tensors into chunks on ``target_gpus`` (any devices, lanes too); share other objects.

    As ``torch.nn.parallel.scatter``: a tuple of chunks for a tensor, else a list with one entry
    per device used. Every tensor split must have the same size along ``dim``.
    """
    # dpkit: chunk_sizes becomes a _Split, which checks dim and target_gpus (which become dpkit
    # Devices) and plans each tensor's chunks; scatter_kwargs passes its own, for both calls
    if not isinstance(chunk_sizes, _Split):
        chunk_sizes = _Split(target_gpus, dim, chunk_sizes, inputs=inputs)
    target_gpus = chunk_sizes.devices

    def scatter_map(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            # dpkit: chunk_sizes(obj) gives the devices used and the chunk sizes (torch: all
            # devices, and None for torch.chunk's); None: read the source device off the tensor
            return Scatter.apply(*chunk_sizes(obj), dim, None, obj)
        if _is_namedtuple(obj):
            return [type(obj)(*args) for args in zip(*map(scatter_map, obj))]
        if isinstance(obj, tuple) and len(obj) > 0:
            return list(zip(*map(scatter_map, obj)))
        if isinstance(obj, list) and len(obj) > 0:
            return [list(i) for i in zip(*map(scatter_map, obj))]
        if isinstance(obj, dict) and len(obj) > 0:
            return [type(obj)(i) for i in zip(*map(scatter_map, obj.items()))]
        return [obj for _ in target_gpus]

    # scatter_map refers to itself; clearing it breaks the reference cycle (as torch does).
    try:
        res = scatter_map(inputs)
    finally:
        scatter_map = None  # type: ignore[assignment]
    return res


def scatter_kwargs(
    inputs: tuple[Any, ...],
    kwargs: dict[str, Any] | None,
    target_gpus: Sequence[DeviceLike],
    dim: int = 0,
    chunk_sizes: ChunkSizes = None,
) -> tuple[tuple[Any, ...], tuple[dict[str, Any], ...]]:
    """Scatter positional and keyword inputs; pad the shorter side as torch does.

    The padding copies torch's rule literally: with a batch of 2 rows on 4 devices and a
    keyword flag (no tensor), devices 2 and 3 get the flag and no input, as in torch. Its
    second branch compares the keyword chunks with ``len(inputs)``, the number of positional
    arguments, not of their chunks; with one batch size for every tensor (dpkit's rule) it
    pads nothing, and torch's padding there only met kwargs of another batch size.
    """
    # dpkit: one _Split for both calls, so that positional and keyword tensors have one batch
    chunk_sizes = _Split(target_gpus, dim, chunk_sizes, inputs=inputs, kwargs=kwargs)
    scattered_inputs = scatter(inputs, target_gpus, dim, chunk_sizes) if inputs else []
    scattered_kwargs = scatter(kwargs, target_gpus, dim, chunk_sizes) if kwargs else []
    if len(scattered_inputs) < len(scattered_kwargs):
        scattered_inputs.extend(() for _ in range(len(scattered_kwargs) - len(scattered_inputs)))
    elif len(scattered_kwargs) < len(inputs):
        scattered_kwargs.extend({} for _ in range(len(scattered_inputs) - len(scattered_kwargs)))
    return tuple(scattered_inputs), tuple(scattered_kwargs)


# --------------------------------------------------------------------------------------
# dpkit's additions: how one call splits each tensor, and the checks on the way.


class _Split:
    """How one scatter (or both of scatter_kwargs') splits each tensor: checked that it can
    be split and that all have one size along ``dim`` (the batch), then cut into
    ``plan_chunks``' sizes on the first devices. Onto one device nothing is split, so tensors
    of any sizes go whole, as in torch. ``named``: what the caller was given, which the error
    for two batch sizes lists."""

    def __init__(
        self, target_gpus: Sequence[DeviceLike], dim: int, chunk_sizes: ChunkSizes, **named: Any
    ) -> None:
        self.dim = check_dim(dim)
        self.devices = as_devices(target_gpus, argument="target_gpus")
        self.chunk_sizes = chunk_sizes
        self.named = named
        self.batches: set[int] = set()  # the sizes along dim of the tensors split so far

    def __call__(self, tensor: torch.Tensor) -> tuple[list[Device], list[int]]:
        _check_splittable(tensor, self.dim)
        size = tensor.shape[self.dim]
        self.batches.add(size)
        if len(self.batches) > 1 and len(self.devices) > 1:
            raise _batch_mismatch(self.dim, **self.named)
        sizes = plan_chunks(size, len(self.devices), self.chunk_sizes)
        return self.devices[: len(sizes)], sizes


def check_dim(dim: Any, shape: Sequence[int] | None = None, of: str = "an input") -> int:
    """``dim`` if it is an int (``dim='0'`` would fail deep inside) and, if ``shape`` is
    given, one of its dimensions; else a clear error. ``of``: what has ``shape``."""
    if not _is_int(dim):
        raise TypeError(
            f"dim must be an int (the dimension to split and gather along), got {dim!r} "
            f"({type(dim).__name__}); pass e.g. dim=0"
        )
    if shape is not None and not -len(shape) <= dim < len(shape):
        raise ValueError(
            f"dim={dim} is out of range for {of} of shape {tuple(shape)}; use a dim between "
            f"{-len(shape)} and {len(shape) - 1}"
        )
    return int(dim)


def _check_splittable(tensor: torch.Tensor, dim: int) -> None:
    if tensor.is_nested:
        raise TypeError(
            "cannot scatter a nested tensor: its rows have different shapes, so it has no "
            f"size along dim={dim} to split; pass x.to_padded_tensor(0.0) (and a mask if the "
            "module needs one)"
        )
    if tensor.layout != torch.strided:
        raise TypeError(
            f"cannot scatter a sparse tensor (layout {tensor.layout}); scatter splits dense "
            "tensors: pass x.to_dense(), or, if every replica needs the whole tensor, keep it "
            "in the module (e.g. module.register_buffer) instead of passing it as an input"
        )
    if tensor.dim() == 0:
        raise ValueError(
            f"cannot scatter a 0-dim tensor (a scalar) along dim={dim}; pass it as a Python "
            "number to share it with every device, or give it a batch dimension"
        )
    check_dim(dim, tensor.shape)
    if tensor.shape[dim] == 0:
        raise ValueError(
            f"the input of shape {tuple(tensor.shape)} is empty along dim={dim}, so there is "
            "nothing to split; pass a batch with at least one sample"
        )


def _batch_mismatch(dim: int, **named: Any) -> ValueError:
    sizes = [found for name, obj in named.items() for found in _sizes_along(obj, dim, name)]
    listed = ", ".join(f"{path} has {size}" for path, size in sizes)
    return ValueError(
        f"scatter splits every tensor along dim={dim} into the same chunks, so all must have "
        f"the same size there (the batch), but {listed} (torch would silently drop rows, or "
        "hand a replica a short tensor that broadcasts); pass tensors of one batch size, and "
        "keep a tensor that every replica needs whole in the module (e.g. "
        "module.register_buffer), which replicate copies to every device"
    )


def _sizes_along(obj: Any, dim: int, path: str) -> list[tuple[str, int]]:
    """Each tensor in ``obj`` that has a dimension ``dim``, by where it is (``inputs[0]``,
    ``kwargs['mask']``), with its size along ``dim``."""
    if isinstance(obj, torch.Tensor):  # (a nested tensor has no one size: its own error)
        fits = not obj.is_nested and -obj.dim() <= dim < obj.dim()
        return [(path, obj.shape[dim])] if fits else []
    if not isinstance(obj, (list, tuple, dict)):
        return []
    items = obj.items() if isinstance(obj, dict) else enumerate(obj)
    return [found for key, item in items for found in _sizes_along(item, dim, f"{path}[{key!r}]")]
