"""How close dpkit's copies between virtual CPU lanes come to the machine's limit.

    .venv/bin/python -m benchmarks.copy_bandwidth                 # from the repository root
    .venv/bin/python -m benchmarks.copy_bandwidth --sizes 16 64   # MiB; quicker

The limit is ``dst.copy_(src)`` into memory allocated and written before: the bytes the
memory system can copy. Each collective onto 4 virtual CPU lanes is timed against it for the
same bytes copied, in interleaved rounds (op, then copy_, the order swapped every round, so
that what else the machine does lands on both), the process pinned to one core and torch to
one thread (copy_ and the lanes' copies both single-threaded):

``scatter``    a tensor of S bytes split onto 4 lanes: lanes 1-3 get copies (3/4 S copied;
               lane 0's chunk is a view, as on a GPU for the chunk already there)
``broadcast``  4 tensors of S/4 bytes onto 4 lanes: lanes 1-3 get copies (3 S copied)
``gather``     4 pieces of S/4 bytes, on lanes 0-3, concatenated on lane 0: every piece is
               copied into the result (S copied; 3/4 S counted as moved between lanes)

``ratio`` = time of copy_ for the bytes copied / time of the op: 1.0 is the machine's limit;
given as the median of the rounds' ratios (with quartiles and extremes) and as the fastest
copy_ over the fastest op (on a loaded machine, the rounds nothing preempted). Each op is
measured with lane memory reuse (``dpkit.lane_memory``, as shipped) and without it (each
copy into a fresh allocation, as before it), after warm-up rounds (a training loop's steady
state). Results go to ``benchmarks/results/copy_bandwidth.json`` with the spread of the
per-round ratios and the load average (other processes on the cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch

import dpkit
from benchmarks.machine import machine
from dpkit import comm, lane_memory

RESULTS = Path(__file__).resolve().parent / "results" / "copy_bandwidth.json"
MiB = 2**20
LANES = 4


@contextmanager
def without_reuse() -> Iterator[None]:
    """Every copy into a fresh allocation: lane memory reuse switched off."""
    saved = lane_memory._REFS_WHEN_FREE
    lane_memory._REFS_WHEN_FREE = None
    try:
        yield
    finally:
        lane_memory._REFS_WHEN_FREE = saved


def operations(size: int) -> dict[str, tuple[Callable[[], Any], int]]:
    """Each collective on ``size`` bytes, as a closure, and the bytes it copies."""
    lanes = dpkit.virtual_devices(LANES, on="cpu")
    numel = size // 4  # float32
    batch = torch.randn(numel)
    parameters = [torch.randn(numel // LANES) for _ in range(LANES)]
    pieces = list(comm.scatter(batch, lanes, [numel // LANES] * LANES, 0))
    return {
        "scatter": (
            lambda: comm.scatter(batch, lanes, [numel // LANES] * LANES, 0),
            size * (LANES - 1) // LANES,
        ),
        "broadcast": (lambda: comm.broadcast(parameters, lanes), size * (LANES - 1)),
        "gather": (lambda: comm.gather(pieces, 0, lanes[0], lanes), size),
    }


def rounds(op: Callable[[], Any], nbytes: int, repeats: int, warmup: int) -> dict[str, Any]:
    """Interleaved rounds of ``op`` and copy_ of ``nbytes`` into written memory."""
    source = torch.randn(nbytes // 4)
    target = torch.zeros_like(source)

    def reference() -> None:
        target.copy_(source)

    ratios, op_times, copy_times = [], [], []
    for index in range(warmup + repeats):
        timed = {}
        for name, run in (("op", op), ("copy", reference))[:: 1 if index % 2 else -1]:
            start = time.perf_counter()
            result = run()
            timed[name] = time.perf_counter() - start
            del result
        if index >= warmup:
            ratios.append(timed["copy"] / timed["op"])
            op_times.append(timed["op"])
            copy_times.append(timed["copy"])
    quartiles = statistics.quantiles(ratios, n=4)
    return {
        # Fastest against fastest: the rounds the other processes on this core left alone.
        "ratio_of_fastest": min(copy_times) / min(op_times),
        "ratio_median": statistics.median(ratios),
        "ratio_quartiles": [quartiles[0], quartiles[2]],
        "ratio_min_max": [min(ratios), max(ratios)],
        "op_GiB_per_s": nbytes / statistics.median(op_times) / 2**30,
        "copy_GiB_per_s": nbytes / statistics.median(copy_times) / 2**30,
        "bytes_copied": nbytes,
    }


def measure(sizes_mib: list[int], repeats: int, warmup: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for size_mib in sizes_mib:
        ops = operations(size_mib * MiB)
        for name, (op, nbytes) in ops.items():
            row = {}
            for setting, context in (("reuse", nullcontext), ("fresh", without_reuse)):
                with context():
                    row[setting] = rounds(op, nbytes, repeats, warmup)
                lane_memory.release()
            results[f"{name} {size_mib} MiB"] = row
            print(
                f"{name:<10}{size_mib:>5} MiB  reuse {row['reuse']['ratio_median']:.2f}x "
                f"(fastest {row['reuse']['ratio_of_fastest']:.2f}x) "
                f"(quartiles {row['reuse']['ratio_quartiles'][0]:.2f}-"
                f"{row['reuse']['ratio_quartiles'][1]:.2f})  fresh "
                f"{row['fresh']['ratio_median']:.2f}x "
                f"(fastest {row['fresh']['ratio_of_fastest']:.2f}x)  copy_ "
                f"{row['reuse']['copy_GiB_per_s']:.1f} GiB/s"
            )
        del ops
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 256], help="MiB")
    parser.add_argument("--repeats", type=int, default=21, help="timed rounds per op")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds per op")
    parser.add_argument("--cpu", type=int, default=0, help="the core to pin to (default 0)")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"JSON file (default {RESULTS})")
    args = parser.parse_args()

    os.sched_setaffinity(0, {args.cpu})
    torch.set_num_threads(1)
    load_start = os.getloadavg()
    started = time.perf_counter()
    results = measure(args.sizes, args.repeats, args.warmup)
    result = {
        "what": (
            f"dpkit.comm collectives onto {LANES} virtual CPU lanes vs copy_ into written "
            "memory of the bytes they copy; ratio = copy_ time / op time (1.0: the limit)"
        ),
        "goal": "ratio >= 0.8 at 16 MiB and above for scatter, broadcast and gather (reuse)",
        "results": results,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "pinned_to_cpu": args.cpu,
        "load_average_at_start": load_start,
        "load_average_at_end": os.getloadavg(),
        "seconds": time.perf_counter() - started,
        "machine": machine(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"load average {load_start[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
