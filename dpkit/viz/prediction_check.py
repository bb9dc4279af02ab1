"""The cost model checked where it can be: a prediction next to steps measured on this
machine's lanes, with the error judged against the measurement's own noise.

The surprise first: on a machine shared with other programs, one measured step is not "the"
step time. Calibration (:func:`dpkit.cost.calibrate`) keeps the fastest of its repeats, so
a prediction from it is of the machine at its quietest; real steps are slower whenever
something else runs. So the measured steps are kept, all of them, each one a round against
the prediction, and the prediction is judged on their middle half, as every measured
conclusion of the course is (:mod:`dpkit.verdict`, :meth:`Comparison.verdict`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import torch
from matplotlib.figure import Figure
from torch import nn

import dpkit
from dpkit import cost, host_clock
from dpkit.models import build_model, sample_input
from dpkit.tracing import Trace
from dpkit.tracing.export import as_dataframe
from dpkit.verdict import Load, Outcome, Rounds, Verdict, conclude, machine_load
from dpkit.viz.common import intra_op_threads
from dpkit.viz.scaling import phase_timeline


@dataclass
class Comparison:
    """Measured DataParallel steps on this machine's lanes next to the calibrated prediction.

    ``measured_ms`` holds every measured step (after a warm-up); ``measured`` is the trace of
    the median one."""

    model: str
    devices: int
    batch: int
    measured: Trace
    predicted: Any  # a dpkit.cost.PredictedTrace
    measured_ms: list[float]
    load: Load | None = None  # how busy other programs kept the cores while the steps ran

    @property
    def quartiles_ms(self) -> tuple[float, float, float]:
        """The measured steps' lower quartile, median and upper quartile (ms)."""
        low, middle, high = statistics.quantiles(self.measured_ms, n=4)
        return low, middle, high

    @property
    def median_ms(self) -> float:
        return statistics.median(self.measured_ms)

    @property
    def predicted_ms(self) -> float:
        return self.predicted.step_time * 1e3

    @property
    def error(self) -> float:
        """(predicted - measured median) / measured median."""
        return self.predicted_ms / self.median_ms - 1

    @property
    def noise(self) -> float:
        """Half the measured steps' interquartile range, relative to their median."""
        low, _, high = self.quartiles_ms
        return (high - low) / 2 / self.median_ms

    def verdict(self) -> Verdict:
        """The measured steps against the prediction, each step one round
        (:mod:`dpkit.verdict`): the steps' times over the predicted time, judged on their
        middle half. Above 1 throughout: the prediction is faster than three steps in four
        (the model leaves out some of this machine's costs, or other programs slowed the
        steps: ``load`` says how busy they kept the cores)."""
        busy = f" ({self.load})" if self.load is not None else ""
        wording = {
            Outcome.FASTER: "the prediction is faster than three measured steps in four: "
            f"the model leaves out some of this machine's costs, or other programs slowed "
            f"the steps{busy}",
            Outcome.SLOWER: "the prediction is slower than three measured steps in four: "
            "the model overestimates some costs",
            Outcome.WITHIN_NOISE: "the prediction lies within the measured steps' spread",
            Outcome.TOO_NOISY: f"the steps vary more than that at this load{busy}: they "
            "cannot judge the model; rerun on a quieter machine",
        }
        predicted = self.predicted_ms
        return conclude(Rounds.of(self.measured_ms, [predicted] * len(self.measured_ms)), wording)

    def phase_errors(self) -> Any:
        """Each phase's time in the median measured step and predicted, and the error."""
        measured = {r["phase"]: r["time_s"] for r in self.measured.summary()}
        predicted = {r["phase"]: r["time_s"] for r in self.predicted.summary()}
        rows = []
        for phase, seconds in measured.items():
            guess = predicted.get(phase, 0.0)
            rows.append(
                {
                    "phase": phase,
                    "measured ms": round(seconds * 1e3, 3),
                    "predicted ms": round(guess * 1e3, 3),
                    "error": f"{guess / seconds - 1:+.0%}" if seconds > 0 else "n/a",
                }
            )
        return as_dataframe(rows)


def measure_against_prediction(
    hardware: cost.Hardware,
    model_name: str = "mlp",
    devices: int = 4,
    batch: int = 256,
    steps: int = 9,
) -> Comparison:
    """Run ``steps`` traced DataParallel training steps (forward, cross-entropy, backward)
    of a course model on virtual CPU lanes, with one intra-op thread as calibration measured,
    and predict the same step on ``hardware`` (from :func:`dpkit.cost.calibrate`)."""
    if steps < 4:
        raise ValueError(f"steps={steps}: at least 4 are needed for quartiles of the noise")
    lanes = dpkit.virtual_devices(devices, on="cpu")
    module = dpkit.to_device(build_model(model_name, seed=0), lanes[0])
    parallel = dpkit.DataParallel(module, device_ids=lanes)
    batch_data = (sample_input(batch), torch.randint(0, 10, (batch,)))
    images, labels = dpkit.to_device(batch_data, lanes[0])
    runs = []
    with intra_op_threads(1), machine_load() as load:
        for _ in range(steps + 1):  # the first warms up
            module.zero_grad(set_to_none=True)
            with dpkit.trace() as recorded:
                start = host_clock.now(lanes)
                nn.functional.cross_entropy(parallel(images), labels).backward()
                runs.append((host_clock.now(lanes) - start, recorded))
    runs = runs[1:]
    median_trace = sorted(runs, key=lambda run: run[0])[len(runs) // 2][1]
    # the cost model profiles its own copy of the model, on the host
    predicted = cost.predict(
        build_model(model_name, seed=0), sample_input(), batch, devices, hardware
    )
    walls = [wall * 1e3 for wall, _ in runs]
    return Comparison(model_name, devices, batch, median_trace, predicted, walls, load)


def comparison_figure(comparison: Comparison) -> Figure:
    """The median measured step above the predicted one, phase by phase, on one time axis."""
    low, middle, high = comparison.quartiles_ms
    figure = phase_timeline(
        [comparison.measured, comparison.predicted],
        [
            f"measured, the median of {len(comparison.measured_ms)} steps: {middle:.3g} ms "
            f"(quartiles {low:.3g}-{high:.3g}) — {comparison.measured.hardware}",
            f"predicted from the calibration: {comparison.predicted_ms:.3g} ms, "
            f"error {comparison.error:+.0%} against the median",
        ],
    )
    figure.suptitle(
        f"{comparison.model}, batch {comparison.batch}, {comparison.devices} lanes: measured "
        "vs predicted (cost model)",
        fontsize=9,
    )
    return figure
