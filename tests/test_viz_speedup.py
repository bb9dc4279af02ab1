"""Notebook 05's speed-up section (dpkit.viz.speedup) and how the timeline draws backwards that
one thread ran: verdicts only beyond the rounds' spread, predictions straight from the cost
model, and hatched backward bars on CPU lanes only."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import dpkit
import dpkit.cost as cost
from dpkit import viz
from dpkit.verdict import Outcome
from dpkit.viz import speedup
from dpkit.viz.common import demo_model
from tests.lanes import lanes

pytestmark = pytest.mark.placement_check


def _series(single: list[float], parallel: list[float]) -> speedup.SpeedupSeries:
    return speedup.SpeedupSeries(4, "test", (64,), {64: single}, {64: parallel})


def test_a_batch_s_conclusion_is_dpkit_verdict_s_on_its_rounds():
    def outcome(parallel: list[float]) -> Outcome:
        return _series([10.0] * 5, parallel).conclusion(64).outcome

    assert outcome([5.0, 6.0, 4.0, 5.0, 5.5]) is Outcome.FASTER
    assert outcome([20.0, 19.0, 25.0, 30.0, 21.0]) is Outcome.SLOWER
    # a median above 1, but a quarter of the rounds well below it: no conclusion
    assert outcome([8.0, 9.0, 9.5, 12.0, 13.0]) is Outcome.TOO_NOISY
    assert outcome([9.8, 10.0, 10.2, 9.9, 10.1]) is Outcome.WITHIN_NOISE
    sentence = str(_series([10.0] * 5, [20.0, 19.0, 25.0, 30.0, 21.0]).conclusion(64))
    assert sentence.startswith("0.48x (middle half of the rounds: 0.40-0.50x) → slower: ")
    assert "DataParallel was slower than one device" in sentence
    assert _series([10.0, 20.0], [5.0, 40.0]).speedups(64) == [2.0, 0.5]


def test_measured_rounds_pair_each_one_device_step_with_a_dataparallel_step():
    series = speedup.measure_speedups(batches=(8, 32), devices=2, rounds=4)
    assert series.batches == (8, 32) and series.devices == 2
    for batch in series.batches:
        assert len(series.single_ms[batch]) == len(series.parallel_ms[batch]) == 4
        assert all(ms > 0 for ms in series.single_ms[batch] + series.parallel_ms[batch])
        assert series.conclusion(batch).ratio == pytest.approx(series.quartiles(batch)[1])
    assert "virtual devices on the CPU" in series.hardware
    assert series.load is not None and series.load.cores >= 1  # said with the verdicts
    with pytest.raises(ValueError, match="rounds"):
        speedup.measure_speedups(rounds=3)


def test_predicted_speedups_are_the_cost_model_s_one_device_over_n():
    machine = cost.preset("this-machine")
    predicted = speedup.predicted_speedups(machine, (16, 1024), devices=4)
    model, sample = demo_model(), torch.randn(1, speedup.FEATURES)
    for batch, value in predicted.items():
        one = cost.predict(model, sample, batch, 1, machine).step_time
        four = cost.predict(model, sample, batch, 4, machine).step_time
        assert value == pytest.approx(one / four)
    series = _series([10.0] * 5, [5.0] * 5)
    series.batches = (16, 1024)
    series.single_ms = {16: [1.0] * 4, 1024: [8.0] * 4}
    series.parallel_ms = {16: [4.0] * 4, 1024: [6.0] * 4}
    figure = speedup.speedup_spread_figure(series, predicted)
    labels = [line.get_label() for line in figure.axes[0].get_lines()]
    assert any("predicted" in label for label in labels)
    assert "measured" in figure.axes[0].get_title()


def _backward_notes(figure) -> list[str]:
    # said under the axis (632d80f), on the x label's last line
    return [line for line in figure.axes[0].get_xlabel().splitlines() if "backwards" in line]


def _hatched(figure) -> int:
    """How many bars are drawn hatched (a collection may hold several)."""
    return sum(len(c.get_paths()) for c in figure.axes[0].collections if c.get_hatch())


def test_backwards_one_cpu_thread_ran_are_drawn_hatched_and_said_so():
    chosen = lanes(3)
    model = dpkit.to_device(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)), chosen[0])
    parallel = dpkit.DataParallel(model, device_ids=chosen)
    inputs = dpkit.to_device(torch.randn(12, 8), chosen[0])
    with dpkit.trace() as recorded:
        parallel(inputs).sum().backward()
    figure = viz.timeline(recorded)
    assert _backward_notes(figure) == [
        "hatched: one thread ran all 3 backwards, interleaved (autograd on a CPU)"
    ]
    assert _hatched(figure) == 3


def test_predicted_backwards_are_hatched_only_where_one_thread_runs_them():
    model, sample = demo_model(), torch.randn(1, speedup.FEATURES)
    cpu = cost.predict(model, sample, 64, 4, "this-machine")
    gpus = cost.predict(model, sample, 64, 4, "4xA100-PCIe4")
    assert _hatched(viz.timeline(cpu)) == 4 and _backward_notes(viz.timeline(cpu))
    assert _hatched(viz.timeline(gpus)) == 0 and not _backward_notes(viz.timeline(gpus))
