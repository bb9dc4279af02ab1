"""Speed-up over one device, measured so that its lesson holds on every run.

The surprise first: a speed-up measured once on a shared machine flips from run to run. One
run says DataParallel pays off from batch 256, the next that it never does, because another
program took a core during some of the steps. So the steps are measured in *rounds*: in
every round each batch size runs one step on one device and then one with DataParallel,
back to back, so that both see the same moment of the machine, and each round gives one
speed-up per batch. The rounds' spread is the noise, and each batch's conclusion comes from
:mod:`dpkit.verdict` (faster or slower only where the whole middle half of its speed-ups
lies on one side of 1; :meth:`SpeedupSeries.conclusion`). Next to that, the cost model's
prediction from a calibration of this machine (:func:`predicted_speedups`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from matplotlib.figure import Figure
from torch import nn

import dpkit
from dpkit import cost, host_clock, verdict
from dpkit.viz.common import FIGURE_DPI, FIGURE_WIDTH, demo_model, hardware_of, intra_op_threads
from dpkit.viz.figures import HIGHLIGHT_COLOR, MEASURED_COLOR

FEATURES = 256  # the demo MLP's input width


@dataclass
class SpeedupSeries:
    """Per batch, the step times of every round (ms): ``single_ms[batch][round]`` on one
    device and ``parallel_ms[batch][round]`` with DataParallel on ``devices`` devices."""

    devices: int
    hardware: str
    batches: tuple[int, ...]
    single_ms: dict[int, list[float]]
    parallel_ms: dict[int, list[float]]
    load: verdict.Load | None = None  # what other programs used while the rounds ran

    def speedups(self, batch: int) -> list[float]:
        """One speed-up per round: that round's one-device step over its DataParallel step."""
        return [s / p for s, p in zip(self.single_ms[batch], self.parallel_ms[batch])]

    def quartiles(self, batch: int) -> tuple[float, float, float]:
        """Lower quartile, median and upper quartile of the rounds' speed-ups."""
        return self.rounds(batch).quartiles()

    def rounds(self, batch: int) -> verdict.Rounds:
        """The batch's rounds: one device (A) against DataParallel (B), round by round."""
        return verdict.Rounds.of(self.single_ms[batch], self.parallel_ms[batch])

    def conclusion(self, batch: int) -> verdict.Verdict:
        """What the rounds allow one to say about DataParallel against one device."""
        return verdict.conclude(self.rounds(batch), SPEEDUP_WORDING)


SPEEDUP_WORDING = {
    verdict.Outcome.FASTER: "DataParallel was faster than one device in three rounds of four",
    verdict.Outcome.SLOWER: "DataParallel was slower than one device in three rounds of four",
}


def _step(net: nn.Module, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    start = host_clock.now()  # on a GPU: once its queued work is done, not at launch
    model.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(net(inputs), targets).backward()
    return (host_clock.now() - start) * 1e3


def measure_speedups(
    batches: Sequence[int] = (16, 64, 256, 1024, 4096),
    devices: int = 4,
    rounds: int = 7,
    threads: int | None = 1,
    seed: int = 0,
) -> SpeedupSeries:
    """Interleaved rounds of training steps of the demo MLP: in each round, every batch (in a
    new random order) runs one step on one device, then one with DataParallel. ``threads``
    intra-op threads for both (default 1: a lane is one core)."""
    if rounds < 4:
        raise ValueError(f"rounds={rounds}: at least 4 are needed for quartiles of the noise")
    lanes = dpkit.devices(devices)
    model = dpkit.to_device(demo_model(), lanes[0])
    parallel = dpkit.DataParallel(model, device_ids=lanes)
    data = {
        batch: dpkit.to_device(
            (torch.randn(batch, FEATURES), torch.randint(0, 10, (batch,))), lanes[0]
        )
        for batch in batches
    }
    single: dict[int, list[float]] = {batch: [] for batch in batches}
    together: dict[int, list[float]] = {batch: [] for batch in batches}
    order = list(batches)
    shuffle = random.Random(seed).shuffle
    with intra_op_threads(threads), verdict.machine_load() as load:
        for batch in batches:  # warm up both paths once
            _step(model, model, *data[batch])
            _step(parallel, model, *data[batch])
        for _ in range(rounds):
            shuffle(order)
            for batch in order:
                single[batch].append(_step(model, model, *data[batch]))
                together[batch].append(_step(parallel, model, *data[batch]))
    return SpeedupSeries(len(lanes), hardware_of(lanes), tuple(batches), single, together, load)


def predicted_speedups(
    hardware: cost.Hardware, batches: Sequence[int], devices: int
) -> dict[int, float]:
    """The cost model's speed-up of the demo MLP on ``hardware`` (e.g. this machine,
    calibrated): a one-device step over a DataParallel step, per batch."""
    model, sample = demo_model(), torch.randn(1, FEATURES)

    def step(batch: int, n: int) -> float:
        return cost.predict(model, sample, batch, n, hardware).step_time

    return {batch: step(batch, 1) / step(batch, devices) for batch in batches}


def speedup_spread_figure(
    series: SpeedupSeries, predicted: dict[int, float] | None = None
) -> Figure:
    """The speed-up per batch: every round as a dot, the median joined by a line, the
    interquartile range as a bar; the calibrated prediction dashed, labelled predicted."""
    figure = Figure(figsize=(FIGURE_WIDTH, 3.0), dpi=FIGURE_DPI, layout="constrained")
    axes = figure.add_subplot()
    batches = list(series.batches)
    for batch in batches:
        values = series.speedups(batch)
        axes.plot([batch] * len(values), values, ".", color=MEASURED_COLOR, alpha=0.35)
        low, _, high = series.quartiles(batch)
        axes.vlines(batch, low, high, color=MEASURED_COLOR, linewidth=3, alpha=0.6)
    medians = [series.quartiles(b)[1] for b in batches]
    axes.plot(batches, medians, "o-", color=MEASURED_COLOR, label="measured: median of the rounds")
    if predicted:
        axes.plot(
            batches,
            [predicted[b] for b in batches],
            "s--",
            color=HIGHLIGHT_COLOR,
            label="predicted (cost model, calibrated here)",
        )
    axes.axhline(1, color="0.4", linestyle=":", linewidth=1)
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xticks(batches, [str(b) for b in batches])
    axes.minorticks_off()
    axes.set_xlabel("batch size")
    axes.set_ylabel(f"speed-up of {series.devices} devices over 1")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, frameon=False, loc="upper left")
    rounds = len(series.speedups(batches[0]))
    axes.set_title(
        f"{rounds} interleaved rounds (bars: quartiles) — measured on {series.hardware}",
        fontsize=9,
    )
    return figure
