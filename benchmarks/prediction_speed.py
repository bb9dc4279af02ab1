"""How long ``dpkit.cost.predict`` takes once a model's profile is cached.

    .venv/bin/python -m benchmarks.prediction_speed                # from the repository root
    .venv/bin/python -m benchmarks.prediction_speed --rounds 3     # quicker, looser spreads

The explorers (notebook 06's scaling explorer) predict at every slider move, so a prediction
must take milliseconds. Only a model's first prediction runs it: ``profiling.profile`` times
its forward and backward at a few batch sizes and caches the result per module, and every
later prediction, whatever the batch, devices, hardware or strategy, reuses that profile
(``tests/test_cost_predict.py`` checks that no pass runs again). The goal, once the unit
test that asserted it (27 ms once under load) was removed in issue 27: the median cached
prediction <= 20 ms.

Measured, for the course models (``dpkit.models.COURSE_MODELS``), one torch thread:

``first call``    a freshly built model's first prediction (8 devices of 8xH100, batch 1024):
                  the profile included, several fresh builds each. The process's very first
                  prediction (a throwaway MLP; torch's lazy set-up included) is given apart.
``cached calls``  every case: model x preset (one node of 8 H100, two nodes of 8 A100) x
                  strategy (dp, ddp) x devices (up to what the strategy can span there) x
                  batch. They run in interleaved rounds (each round every case in rotating
                  order, several calls each, so a busy moment of the machine lands on all
                  alike): per case the median and 90th percentile of all calls, and the spread,
                  the lowest and highest of the rounds' medians.

``met``: every case's median <= ``goal_ms``. Profile passes are counted during the cached
rounds (``profile_passes_during_cached_calls``, 0 if the cache held). Results go to
``benchmarks/results/prediction_speed.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

import dpkit.cost as cost
from benchmarks.machine import machine
from dpkit.cost import profiling
from dpkit.models import COURSE_MODELS, build_model, sample_input

RESULTS = Path(__file__).resolve().parent / "results" / "prediction_speed.json"
GOAL_MS = 20.0  # the removed unit test's bound (issue 27)
PRESETS = ("8xH100-SXM-NVLink", "2x8xA100-IB-HDR")
FIRST_CALL = ("8xH100-SXM-NVLink", 8, 1024, "dp")  # hardware, devices, batch, strategy


def predict_ms(model: nn.Module, hardware: str, devices: int, batch: int, strategy: str) -> float:
    """One prediction's wall time in milliseconds."""
    sample = sample_input()
    start = time.perf_counter()
    cost.predict(model, sample, batch, devices, hardware, strategy)
    return (time.perf_counter() - start) * 1e3


def spread(values: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def first_calls(models: tuple[str, ...], fresh: int) -> tuple[float, dict[str, Any]]:
    """The process's first prediction, then each model's first prediction on fresh builds."""
    process_first = predict_ms(build_model("mlp", seed=0), *FIRST_CALL)
    per_model = {
        name: spread([predict_ms(build_model(name, seed=0), *FIRST_CALL) for _ in range(fresh)])
        for name in models
    }
    return process_first, per_model


def cases(models: tuple[str, ...], devices: list[int], batches: list[int]) -> list[tuple]:
    """(model, hardware, devices, batch, strategy) wherever the strategy can run: DataParallel
    on one node's devices, DDP on all nodes'."""
    found = []
    for model in models:
        for hardware in PRESETS:
            machine = cost.preset(hardware)
            for strategy in ("dp", "ddp"):
                most = machine.devices_per_node * (machine.nodes if strategy == "ddp" else 1)
                for count in (n for n in devices if n <= most):
                    found += [(model, hardware, count, batch, strategy) for batch in batches]
    return found


@contextmanager
def counting_passes() -> Iterator[list[int]]:
    """Count the profile's passes of a model while the block runs (none, if the cache holds)."""
    passes: list[int] = []
    run_passes = profiling.run_passes

    def counted(*args: Any, **kwargs: Any) -> Any:
        passes.append(1)
        return run_passes(*args, **kwargs)

    profiling.run_passes = counted
    try:
        yield passes
    finally:
        profiling.run_passes = run_passes


def cached_rounds(
    grid: list[tuple], models: dict[str, nn.Module], rounds: int, calls: int, warmup: int
) -> list[list[list[float]]]:
    """times[case][round] = the ms of that round's calls. Each round starts further along the
    grid (by a share of it), so that every case sits early, late and in between."""
    times: list[list[list[float]]] = [[] for _ in grid]
    for round_index in range(warmup + rounds):
        shift = round_index * len(grid) // (warmup + rounds)
        for index in [*range(shift, len(grid)), *range(shift)]:
            model, hardware, devices, batch, strategy = grid[index]
            timed = [
                predict_ms(models[model], hardware, devices, batch, strategy) for _ in range(calls)
            ]
            if round_index >= warmup:
                times[index].append(timed)
    return times


def summary(round_times: list[list[float]]) -> dict[str, Any]:
    """Median and p90 of all calls; the spread: the lowest and highest round median."""
    every = [ms for timed in round_times for ms in timed]
    medians = [statistics.median(timed) for timed in round_times]
    return {
        "median_ms": statistics.median(every),
        "p90_ms": statistics.quantiles(every, n=10, method="inclusive")[8],
        "spread_ms": [min(medians), max(medians)],
        "calls": len(every),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--models", nargs="+", default=list(COURSE_MODELS), help="course models")
    parser.add_argument("--devices", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 1024])
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds (default 7)")
    parser.add_argument("--calls", type=int, default=11, help="calls per case per round")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds (default 1)")
    parser.add_argument("--fresh", type=int, default=3, help="fresh builds per model, first call")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"JSON file (default {RESULTS})")
    args = parser.parse_args()

    torch.set_num_threads(1)
    models = tuple(args.models)
    load_start = os.getloadavg()
    started = time.perf_counter()
    process_first, first = first_calls(models, args.fresh)
    for name, ms in first.items():
        print(
            f"first call  {name:<12} median {ms['median']:8.1f} ms  "
            f"({ms['min']:.1f}-{ms['max']:.1f}, {ms['n']} fresh builds)"
        )
    print(f"first call of the process (mlp): {process_first:.1f} ms\n")

    grid = cases(models, args.devices, args.batches)
    profiled = {name: build_model(name, seed=0) for name in models}
    for model in profiled.values():
        predict_ms(model, *FIRST_CALL)  # profiles it: every case below reuses this
    with counting_passes() as passes:
        times = cached_rounds(grid, profiled, args.rounds, args.calls, args.warmup)

    results = {}
    for (model, hardware, devices, batch, strategy), round_times in zip(grid, times):
        name = f"{model} {hardware} {strategy} {devices} devices batch {batch}"
        results[name] = summary(round_times)
        row = results[name]
        low, high = row["spread_ms"]
        print(
            f"{name:<58} median {row['median_ms']:6.2f} ms  p90 {row['p90_ms']:6.2f}  "
            f"spread {low:.2f}-{high:.2f}"
        )
    # the whole grid, round by round: each round's calls of every case together
    overall = summary([[ms for case in times for ms in case[r]] for r in range(args.rounds)])
    worst = max(results, key=lambda name: results[name]["median_ms"])
    over = [name for name, row in results.items() if row["median_ms"] > GOAL_MS]
    result = {
        "what": (
            "wall time of dpkit.cost.predict(model, sample_input(), batch, devices, preset, "
            "strategy) once the model's profile is cached, and of a fresh model's first call "
            "(profile included); ms"
        ),
        "goal": f"median cached prediction <= {GOAL_MS:g} ms in every case (issue 27)",
        "goal_ms": GOAL_MS,
        "met": not over,
        "cases_over_goal": over,
        "overall": {
            **overall,
            "worst_case": worst,
            "worst_case_median_ms": results[worst]["median_ms"],
        },
        "first_call_ms": first,
        "first_call_of_the_process_ms": process_first,
        "first_call_case": dict(zip(("hardware", "devices", "batch", "strategy"), FIRST_CALL)),
        "cached": results,
        "profile_passes_during_cached_calls": len(passes),
        "rounds": args.rounds,
        "calls_per_round": args.calls,
        "warmup": args.warmup,
        "load_average_at_start": load_start,
        "load_average_at_end": os.getloadavg(),
        "seconds": time.perf_counter() - started,
        "machine": machine(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    low, high = overall["spread_ms"]
    print(
        f"\nall cases: median {overall['median_ms']:.2f} ms, p90 {overall['p90_ms']:.2f}, "
        f"round medians {low:.2f}-{high:.2f}; worst case {worst} "
        f"({results[worst]['median_ms']:.2f} ms)"
    )
    print(f"goal: median <= {GOAL_MS:g} ms in every case: {'met' if not over else 'not met'}")
    print(f"profile passes during the cached calls: {len(passes)}")
    print(
        f"load average {load_start[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; "
        f"{result['seconds']:.0f} s"
    )
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
