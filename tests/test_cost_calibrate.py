"""calibrate() on virtual CPU lanes: quick, every number positive and in a sane range."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import dpkit
import dpkit.cost as cost
from dpkit.cost.models import course_model, sample_input


@pytest.fixture(scope="module")
def measured() -> cost.Hardware:
    # One torch thread, as lanes run in the course: with one per core, a copy's OpenMP team
    # waits for a descheduled thread whenever the machine is busy, and measures that.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return cost.calibrate(2, models=("mlp",), quick=True, progress=False)
    finally:
        torch.set_num_threads(threads)


def test_calibration_measures_sane_positive_numbers(measured):
    assert measured.name == "this-machine" and "calibrate()" in measured.source
    assert not measured.asynchronous and measured.serial_backward  # CPU lanes
    # a memcpy: about 1 to 200 GB/s; a loaded 2-core machine was seen at 0.4 GB/s
    assert 5e7 < measured.device_to_device.bandwidth < 2e11
    assert 1e8 < measured.memory_bandwidth < 1e12
    assert 1e8 < measured.peak_flops["float32"] < 1e13  # a CPU core's matmul
    assert 1 <= measured.compute_units <= 2
    for name in ("launch_overhead", "autograd_overhead", "gil_contention", "thread_start",
                 "replica_overhead", "copy_overhead", "event_overhead"):  # fmt: skip
        seconds = getattr(measured, name)
        assert 0 < seconds < 0.05 and math.isfinite(seconds), name
    addmm = measured.op_seconds["aten.addmm"]
    works = [work for work, _ in addmm]
    assert works == sorted(works) and len(works) >= 3  # the MLP's three layers at 3 sizes
    assert all(seconds > 0 for _, seconds in addmm)
    assert addmm[-1][1] > addmm[0][1]  # the largest matmul takes longer than the smallest


def test_a_calibrated_machine_predicts(measured):
    predicted = cost.predict(course_model("mlp"), sample_input(), 256, 2, measured)
    assert predicted.step_time > 0
    assert "this-machine" in predicted.hardware


def test_three_lanes_or_more_fit_the_copy_phases_per_call_and_per_device():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        hardware = cost.calibrate(3, models=("mlp",), quick=True, progress=False)
    finally:
        torch.set_num_threads(threads)
    assert set(hardware.phase_overheads) == {"scatter", "gather", "grad_scatter"}
    for phase, (per_call, per_device) in hardware.phase_overheads.items():
        # a step's phase beside its bytes: microseconds to a millisecond, never negative
        assert 0 <= per_call < 5e-3 and 0 <= per_device < 5e-3, phase
        assert per_call + 3 * per_device > 1e-6, phase  # a phase of three events costs time
    # what steps took beyond the model, warm, for two phases (never negative); the MLP's
    # cold steps stay in cache, so they fit no cold extras
    assert set(hardware.phase_extras) == {"replicate", "reduce"}
    assert all(0 <= seconds < 5e-3 for pair in hardware.phase_extras.values() for seconds in pair)
    assert hardware.cold_extras == {}
    assert 0 < hardware.one_device_overhead < 5e-3  # a step on one lane: its own overhead


def test_two_lanes_cannot_fit_them_and_keep_the_events_overheads(measured):
    assert measured.phase_overheads == {}


def test_the_hand_back_gap_is_fitted_as_a_line_over_replicas_times_ops():
    from dpkit.cost.calibrate import _fit_line

    # hand-computed: 3 + 2x through (0, 3), (1, 5) and (4, 11); a flat set has no slope
    assert _fit_line([(0.0, 3.0), (1.0, 5.0), (4.0, 11.0)]) == pytest.approx((3.0, 2.0))
    assert _fit_line([(44.0, 1e-3), (44.0, 2e-3)]) is None


def test_each_calibrated_model_has_its_own_gil_contention(measured):
    key = cost.profile(course_model("mlp"), sample_input()).key
    assert set(measured.gil_contention_by_model) == {key}  # the one model calibrated
    assert 0 <= measured.gil_contention_by_model[key] < 1e-3


def test_extras_fitted_from_steps_recover_what_made_the_steps():
    # Steps "measured" as a machine with known extras predicts them: the fit, starting from
    # the same machine without extras, must find those extras again.
    from dpkit.cost.calibrate import _fit_extras

    base = cost.presets()["this-machine"]
    truth = dataclasses.replace(
        base,
        phase_extras={"replicate": (50e-6, 6e-6), "reduce": (30e-6, 4e-6)},
        cold_extras={"replicate": (5e-6, 1e-6), "gather": (2e-6, 0.5e-6),
                     "grad_scatter": (1e-6, 0.0), "reduce": (8e-6, 3e-6)},
    )  # fmt: skip
    models = [(course_model(name), sample_input()) for name in ("cnn", "transformer")]
    cold_rows = 64

    def steps(rows: int):
        return {
            (number, n): {
                row["phase"]: row["time_s"]
                for row in cost.predict(module, sample, rows * n, n, truth).summary()
            }
            for number, (module, sample) in enumerate(models)
            for n in (2, 4)
        }

    fitted = _fit_extras(base, models, steps(1), steps(cold_rows), cold_rows)
    for phase, pair in truth.phase_extras.items():
        assert fitted.phase_extras[phase] == pytest.approx(pair, abs=1e-9), phase
    for phase, pair in truth.cold_extras.items():
        assert fitted.cold_extras[phase] == pytest.approx(pair, abs=1e-9), phase


def test_a_line_in_the_device_count_is_clipped_at_zero():
    from dpkit.cost.calibrate import _line_in_devices

    # hand-computed: 10 + 2n through n=2 and n=4; a falling line keeps its level, no slope
    assert _line_in_devices({2: 14.0, 4: 18.0}) == pytest.approx((10.0, 2.0))
    assert _line_in_devices({2: 14.0, 4: 10.0}) == pytest.approx((14.0, 0.0))
    assert _line_in_devices({2: -3.0}) == (0.0, 0.0)


def test_calibration_batches_hold_distinct_rows_of_the_samples_values():
    # Max-pooling ran twice as fast on one row repeated as on distinct rows: calibrating on
    # repeated rows under-predicted the CNN. Each row is the first row's values, rotated.
    from dpkit.cost.profile import rows_like

    sample = torch.randn(3, 1, 28, 28)
    batch = rows_like(sample, 64)
    assert batch.shape == (64, 1, 28, 28) and batch.dtype == sample.dtype
    flat = batch.reshape(64, -1)
    assert len({tuple(row.tolist()) for row in flat}) == 64
    first = sample[0].reshape(-1).sort().values
    assert all(torch.equal(row.sort().values, first) for row in flat)
    assert torch.equal(batch, rows_like(sample, 64))  # the same batch every time
    tokens = torch.tensor([[3, 1, 4, 1, 5]])
    # hand-computed: row 1 rotated by 7919 % 5 = 4 places
    assert rows_like(tokens, 2).tolist() == [[3, 1, 4, 1, 5], [5, 3, 1, 4, 1]]


def test_a_model_whose_cold_steps_stay_in_cache_fits_no_cold_extras():
    from dpkit.cost.calibrate import _fit_extras

    base = cost.presets()["this-machine"]
    truth = dataclasses.replace(base, cold_extras={"reduce": (8e-6, 3e-6)})
    model, sample = course_model("mlp"), sample_input()  # 64 rows a lane: about 1.2 MB

    def steps(rows: int):
        return {
            (0, n): {
                row["phase"]: row["time_s"] + 1e-5  # noise the 0.2 doublings would magnify
                for row in cost.predict(model, sample, rows * n, n, truth).summary()
            }
            for n in (2, 4)
        }

    assert _fit_extras(base, [(model, sample)], steps(1), steps(64), 64).cold_extras == {}


def test_a_calibration_batch_stays_where_its_sample_is():
    # Under the placement check (CPU lanes apart from host memory, as on a GPU) a batch made
    # from a sample on lane 0 must be on lane 0, or calibrate's own passes mix the two.
    from dpkit.cost.profile import rows_like
    from dpkit.placement_check import checking_placement

    with checking_placement():
        lane = dpkit.virtual_devices(2)[0]
        sample = torch.randn(1, 5).to(lane.torch_device)
        assert dpkit.device_of(rows_like(sample, 4)) == dpkit.device_of(sample) == lane


def test_one_lane_steps_fit_the_overhead_that_made_them():
    from dpkit.cost.calibrate import _fit_one_device

    base = cost.presets()["this-machine"]
    truth = dataclasses.replace(base, one_device_overhead=0.2e-3)
    models = [(course_model(name), sample_input()) for name in ("mlp", "cnn")]
    steps = {
        (number, 1): {"step": cost.predict(module, sample, 1, 1, truth).step_time}
        for number, (module, sample) in enumerate(models)
    }
    fitted = _fit_one_device(base, models, steps)
    assert fitted.one_device_overhead == pytest.approx(0.2e-3)
