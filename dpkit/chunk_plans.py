"""Chunk plans: how many rows of a batch each device gets (``chunk_sizes=`` of scatter).

torch's rule is ``torch.chunk``'s (:func:`torch_chunk_sizes`): chunks of
``ceil(batch / devices)`` rows, the last one what is left, so 10 rows over 4 devices are
3, 3, 3, 1 and 6 rows over 4 are 2, 2, 2 (the fourth device sits idle). dpkit's
``chunk_sizes=`` (off by default, an option torch lacks) chooses others: ``"balanced"``
(sizes differ by at most one: 10 over 4 is 3, 3, 2, 2), an explicit list, or a function
``(batch, num_devices) -> sizes`` such as ``functools.partial(weighted_chunk_sizes,
weights=speeds)`` for devices of different speeds. :func:`plan_chunks` turns any of them
into the sizes :func:`dpkit.scatter` cuts, with a clear error for a plan that does not fit.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

from dpkit.device import _check_count

ChunkSizes = str | Sequence[int] | Callable[[int, int], Sequence[int]] | None


def plan_chunks(size: int, num_devices: int, chunk_sizes: ChunkSizes = None) -> list[int]:
    """The chunk sizes scatter uses for ``size`` rows over ``num_devices`` devices."""
    _check_plan(size, num_devices)
    if chunk_sizes is None:
        return torch_chunk_sizes(size, num_devices)
    if chunk_sizes == "balanced":
        return balanced_chunk_sizes(size, num_devices)
    if isinstance(chunk_sizes, str):
        raise ValueError(
            f"chunk_sizes={chunk_sizes!r} is not known; use None (torch.chunk), 'balanced', a "
            "list of sizes, or a function (batch, num_devices) -> sizes"
        )
    sizes = chunk_sizes(size, num_devices) if callable(chunk_sizes) else chunk_sizes
    if not isinstance(sizes, (list, tuple)):
        what = "the chunk_sizes function returned" if callable(chunk_sizes) else "chunk_sizes is"
        raise TypeError(
            f"{what} {sizes!r}, not a list of sizes; chunk_sizes must give a list of positive "
            f"ints that add up to the batch size {size}, e.g. "
            f"{balanced_chunk_sizes(size, num_devices)}"
        )
    sizes = list(sizes)
    if not all(_is_int(s) and s >= 1 for s in sizes) or sum(sizes) != size:
        raise ValueError(
            f"chunk_sizes={sizes} must be positive ints that add up to the batch size {size} "
            f"(not booleans), e.g. {balanced_chunk_sizes(size, num_devices)}"
        )
    if len(sizes) > num_devices:
        raise ValueError(f"chunk_sizes={sizes} has more chunks than the {num_devices} devices")
    return [int(rows) for rows in sizes]


def torch_chunk_sizes(size: int, num_devices: int) -> list[int]:
    """The sizes ``torch.chunk(x, num_devices)`` gives for ``size`` rows: chunks of
    ``ceil(size / num_devices)`` rows, the last one what is left (so maybe fewer chunks).

    One case differs on purpose: no rows give no chunks (``[]``), where torch.chunk gives
    ``num_devices`` empty ones and torch's DataParallel would run every replica on nothing.
    """
    _check_plan(size, num_devices)
    # At least 1: no rows give no chunks (range's step cannot be 0), not torch.chunk's empty ones
    chunk = max(1, (size + num_devices - 1) // num_devices)  # ceil, exact for any int
    return [min(chunk, size - start) for start in range(0, size, chunk)]


def balanced_chunk_sizes(size: int, num_devices: int) -> list[int]:
    """Sizes that differ by at most one row, larger first (10 over 4: 3, 3, 2, 2)."""
    _check_plan(size, num_devices)
    base, extra = divmod(size, num_devices)
    return [base + 1 if i < extra else base for i in range(num_devices) if base or i < extra]


def weighted_chunk_sizes(size: int, num_devices: int, weights: Sequence[float]) -> list[int]:
    """Sizes proportional to ``weights`` (e.g. device speeds), rounded by largest remainder.

    Every device gets at least one row while there are rows enough for all (a row is then
    moved from the largest chunk); with fewer rows than devices, the first devices get one.
    """
    _check_plan(size, num_devices)
    if len(weights) != num_devices:
        raise ValueError(f"weights has {len(weights)} entries for {num_devices} devices")
    if any(isinstance(w, bool) or not isinstance(w, (int, float)) for w in weights):
        raise TypeError(f"weights must be numbers (e.g. device speeds), got {list(weights)}")
    if not all(math.isfinite(w) and w > 0 for w in weights):
        raise ValueError(
            f"weights must all be positive and finite, got {list(weights)}; pass each "
            "device's relative speed, e.g. weights=[1, 1, 2, 2]"
        )
    if size < num_devices:
        return [1] * size
    shares = [size * w / sum(weights) for w in weights]
    sizes = [int(share) for share in shares]
    by_remainder = sorted(range(num_devices), key=lambda i: sizes[i] - shares[i])
    for i in by_remainder[: size - sum(sizes)]:
        sizes[i] += 1
    # A device left without a row takes one from the largest chunk, which has at least two
    # (the rows are at least the devices), so no other device is left without one.
    for i in [i for i, rows in enumerate(sizes) if rows == 0]:
        sizes[max(range(num_devices), key=sizes.__getitem__)] -= 1
        sizes[i] = 1
    return sizes


def _check_plan(size: Any, num_devices: Any) -> None:
    if not _is_int(size):
        raise TypeError(f"size must be a number of rows (an int), got {size!r}")
    if size < 0:
        raise ValueError(f"size must be a number of rows (an int >= 0), got {size}")
    _check_count(num_devices, argument="num_devices")


def _is_int(value: Any) -> bool:
    """An int, or what torch takes as one (numpy's integers), but not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)
