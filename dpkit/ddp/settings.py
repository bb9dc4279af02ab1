"""DDP's settings side by side, measured: one launch, a fresh DDP model per setting.

The surprise first: two settings that look like switches for correctness cost time on
every step. ``find_unused_parameters=True`` lets a model whose forward skips some
parameters train (without it torch raises at the next step: DDP waited for gradients that
never came), by walking the autograd graph from the outputs after *every* forward to find
the parameters it does not reach. ``static_graph=True`` promises that the graph is the same
every step: DDP then learns the unused parameters in step 1 and walks no graph afterwards.
Both walk nothing on the wire; the walk is in the forward (``apply``) of the trace, so the
forward's time under each setting, on the same model, measures it. A compression hook
changes the bytes instead: ``compression`` in a setting (``"bf16"``, ``"fp16"``,
``"powersgd"``, ``"powersgd-R"``, :mod:`dpkit.ddp.hook`) and the error it adds to the
gradients, against one process's exact gradients.

    from dpkit import ddp
    from dpkit.ddp.settings import settings_sweep, settings_rows
    results = settings_sweep({"float32": {}, "bf16": {"compression": "bf16"}},
                             keep_gradients=True)
    print(settings_rows(results, reference=ddp.single_process_gradients("mlp", 32)))

One set of ranks trains a model per setting, the settings taking their steps in turn (step
1 of each, then step 2 of each, ...), so that all meet the machine in the same state: the
difference between two settings' forwards in the same step (:func:`forward_difference`)
is theirs, not the machine's.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from dpkit.ddp.run import DDPResult, launch_plan, make_plan, result_of
from dpkit.ddp.workload import Workload
from dpkit.table import Table
from dpkit.verdict import Outcome, Rounds, Verdict, conclude


def settings_sweep(
    settings: Mapping[str, Mapping[str, Any]],
    workload: Workload | str = "mlp",
    nproc: int = 2,
    batch: int = 32,
    steps: int = 6,
    keep_gradients: bool = False,
    threads: int = 1,
    timeout: float = 120.0,
) -> dict[str, DDPResult]:
    """Train ``workload`` once per entry of ``settings`` (a label -> keyword arguments of
    ``DistributedDataParallel``, and ``"compression"``), on the same ranks, each from the
    same first weights; the results by label (``keep_gradients``: step 1's gradients). By
    default the mlp on 32 rows (the reference of this module's example) for 6 steps, of
    which :func:`forward_times` reads steps 3 to 6: four forwards per rank, each rank on one
    torch thread (ranks that share a machine's cores would otherwise time each other)."""
    if not settings:
        raise ValueError("settings is empty: give at least one label -> DDP options")
    variants = [dict(options) for options in settings.values()]
    plan = make_plan(
        workload, nproc, batch, steps, [25.0], None, timeout, None, threads,
        keep_gradients, variants=variants,
    )  # fmt: skip
    per_rank, pids = launch_plan(plan, timeout)
    return {
        label: result_of([runs[index] for runs in per_rank], plan, pids)
        for index, label in enumerate(settings)
    }


def forward_times(result: DDPResult, from_step: int = 3) -> list[float]:
    """Every rank's forward (``apply``: DDP's own work before and after the module's
    forward included) from step ``from_step`` on, in seconds. Steps 1 and 2 are left out by
    default: DDP builds its buckets in step 1 and rebuilds them at step 2's forward."""
    return [e.duration for e in result.trace.events if e.phase == "apply" and e.step >= from_step]


def same_step_pairs(
    slower: DDPResult, faster: DDPResult, from_step: int = 3
) -> list[tuple[float, float]]:
    """``slower``'s and ``faster``'s forward (seconds) on the same rank in the same step, for
    every rank and step from ``from_step`` on that both have (from one sweep, whose settings
    take their steps in turn: each pair met the machine in the same state)."""

    def by_step(result: DDPResult) -> dict[tuple[str, int], float]:
        return {
            (e.device, e.step): e.duration
            for e in result.trace.events
            if e.phase == "apply" and e.step >= from_step
        }

    mine, theirs = by_step(slower), by_step(faster)
    pairs = [(mine[key], theirs[key]) for key in sorted(mine.keys() & theirs.keys())]
    if not pairs:
        raise ValueError(f"no step from {from_step} on in both runs: train more steps")
    return pairs


def forward_difference(slower: DDPResult, faster: DDPResult, from_step: int = 3) -> float:
    """How much longer ``slower``'s forward took than ``faster``'s, in seconds: the median
    of the differences of :func:`same_step_pairs`."""
    return statistics.median(a - b for a, b in same_step_pairs(slower, faster, from_step))


# find_unused_parameters=True (A) against static_graph=True (B), pair by pair.
WALK_WORDING = {
    Outcome.FASTER: "static_graph=True's forwards were faster: the graph walk is what "
    "find_unused_parameters=True adds to every forward",
    Outcome.SLOWER: "static_graph=True's forwards were slower this time: the walk hid in the "
    "noise of other work",
    Outcome.WITHIN_NOISE: "the walk is smaller than the run-to-run noise on this model",
    Outcome.TOO_NOISY: "the pairs disagree; another program took cores during some",
}


def forward_comparison(
    slower: DDPResult,
    faster: DDPResult,
    wording: Mapping[Outcome, str] = WALK_WORDING,
    from_step: int = 3,
) -> Verdict:
    """``faster``'s forwards against ``slower``'s, pair by pair (:func:`same_step_pairs`):
    each pair is a round of :mod:`dpkit.verdict`, so the conclusion is the one the middle
    half of the pairs' ratios allows (faster: three pairs in four)."""
    pairs = same_step_pairs(slower, faster, from_step)
    rounds = Rounds.of([a for a, _ in pairs], [b for _, b in pairs])
    return conclude(rounds, wording)


def gradient_errors(result: DDPResult, reference: Mapping[str, Any]) -> tuple[float, float]:
    """How far rank 0's step-1 gradients are from ``reference`` (one process's,
    :func:`dpkit.ddp.single_process_gradients`): the largest difference relative to the
    largest reference gradient of the same parameter (what rounding to a 2-byte type
    bounds), and the norm of the difference relative to the norm of all the reference
    gradients (what a low-rank approximation leaves out)."""
    if result.gradients is None:
        raise ValueError("this run kept no gradients: run the sweep with keep_gradients=True")
    mine = result.gradients[0]
    largest = max(
        float(abs(mine[name] - gradient).max() / abs(gradient).max())
        for name, gradient in reference.items()
        if abs(gradient).max() > 0
    )
    missed = sum(
        float(((mine[name] - gradient) ** 2).sum()) for name, gradient in reference.items()
    )
    total = sum(float((gradient**2).sum()) for gradient in reference.values())
    return largest, (missed / total) ** 0.5


def settings_rows(
    results: Mapping[str, DDPResult], reference: Mapping[str, Any] | None = None
) -> Table:
    """One row per setting: the bytes rank 0 all-reduced in the last step, its forward's
    fastest and median time (from step 3), the median step, and with ``reference`` the
    gradients' relative errors (:func:`gradient_errors`)."""
    rows = Table()
    for label, result in results.items():
        forwards = forward_times(result) or forward_times(result, 1)
        row = {
            "setting": label,
            "bytes/step/rank": _of_rank_0(result.allreduce_bytes_per_step()),
            "forward fastest ms": min(forwards) * 1e3,
            "forward median ms": statistics.median(forwards) * 1e3,
            "step median ms": result.median_step_s * 1e3,
        }
        if reference is not None:
            largest, norm = gradient_errors(result, reference)
            row["largest error"], row["norm error"] = f"{largest:.0e}", f"{norm:.0e}"
        rows.append(row)
    return rows


def _of_rank_0(by_device: Mapping[str, int]) -> int:
    return next((n for device, n in by_device.items() if device.startswith("rank:0 ")), 0)
