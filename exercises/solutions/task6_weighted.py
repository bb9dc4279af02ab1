"""Task 6: weighted scatter for unequal devices, and the straggler effect.

Goal: a data-parallel step ends when the *slowest* device finishes (the straggler). With
``torch.chunk``'s equal chunks, a fast device finishes early and waits for a slow one.
Given each device's speed (rows per unit of time, relative), choose chunk sizes that
minimise the step time ``max_i(rows_i / speed_i)``, then measure the effect with real
threads, one per device, each "computing" by sleeping as long as its rows take.
The surprise: proportional shares rounded to whole rows are not always optimal, and a
slow enough device should get no rows at all.

You may use torch, ``threading``, ``time``, ``math`` and ``dpkit.torch_chunk_sizes``
(task 1's chunk planning). Grade your work with ``dpkit grade 6``.
"""

# Reference solution: every TODO of the stub, done. Graded by the same grader.

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from dpkit import torch_chunk_sizes


def weighted_chunk_sizes(batch: int, speeds: Sequence[float]) -> list[int]:
    """Whole-row chunk sizes, one per device, that minimise ``max(rows_i / speed_i)``.

    The sizes are ints >= 0 that add up to ``batch``; a device may get 0 rows. Raise
    ``ValueError`` if a speed is not positive: a speed of 0 (or below) must raise it, before
    anything divides by it (the grader calls ``weighted_chunk_sizes(10, [1.0, 0.0])``).
    Hint: hand out the rows one at a time (or start from the rounded-down proportional
    shares), each to the device that would finish it soonest, i.e. with the smallest
    ``(rows_i + 1) / speed_i``.
    """
    if any(speed <= 0 for speed in speeds):
        raise ValueError(f"speeds must all be positive, got {list(speeds)}")
    total = sum(speeds)
    sizes = [int(batch * speed / total) for speed in speeds]
    for _ in range(batch - sum(sizes)):
        soonest = min(range(len(speeds)), key=lambda i: (sizes[i] + 1) / speeds[i])
        sizes[soonest] += 1
    return sizes


def simulated_step_time(
    chunk_sizes: Sequence[int], speeds: Sequence[float], per_row_seconds: float
) -> float:
    """Seconds one step takes when device ``i`` needs ``per_row_seconds / speeds[i]`` a row.

    The devices work at the same time, so the step lasts as long as the slowest one.
    """
    return max(rows * per_row_seconds / speed for rows, speed in zip(chunk_sizes, speeds))


def measure_step_time(
    chunk_sizes: Sequence[int], speeds: Sequence[float], per_row_seconds: float
) -> float:
    """Measured seconds of one step: one thread per device, each sleeping for its rows.

    Device ``i`` sleeps ``chunk_sizes[i] * per_row_seconds / speeds[i]`` seconds. Start all
    threads, join all, and return the wall-clock time from before the first start to after
    the last join (``time.perf_counter``).
    """
    threads = [
        threading.Thread(target=time.sleep, args=(rows * per_row_seconds / speed,))
        for rows, speed in zip(chunk_sizes, speeds)
    ]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start


def straggler_report(
    batch: int, speeds: Sequence[float], per_row_seconds: float
) -> dict[str, object]:
    """Equal (``torch.chunk``) against weighted chunks, measured, for one step.

    Returns a dict with ``"torch_chunks"`` (torch's sizes, padded with 0 for idle devices
    to one per device), ``"weighted_chunks"``, ``"torch_seconds"`` and
    ``"weighted_seconds"`` (from :func:`measure_step_time`), and ``"speedup"``
    (``torch_seconds / weighted_seconds``).
    """
    equal = torch_chunk_sizes(batch, len(speeds))
    equal += [0] * (len(speeds) - len(equal))
    weighted = weighted_chunk_sizes(batch, speeds)
    torch_seconds = measure_step_time(equal, speeds, per_row_seconds)
    weighted_seconds = measure_step_time(weighted, speeds, per_row_seconds)
    return {
        "torch_chunks": equal,
        "weighted_chunks": weighted,
        "torch_seconds": torch_seconds,
        "weighted_seconds": weighted_seconds,
        "speedup": torch_seconds / weighted_seconds,
    }
