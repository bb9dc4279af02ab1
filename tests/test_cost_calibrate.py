"""calibrate(): the fit recovers known host terms, op curves are monotone, and a quick
calibration of virtual CPU lanes gives a valid Hardware with plausible numbers."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

import dpkit
import dpkit.cost as cost
from dpkit.cost import calibration
from dpkit.cost.hardware import HOST_TERMS
from dpkit.models import build_model, sample_input
from dpkit.placement_check import checking_placement


@pytest.fixture(scope="module")
def measured() -> cost.Hardware:
    # One torch thread, as lanes run in the course: with one per core, a copy's OpenMP team
    # waits for a descheduled thread whenever the machine is busy, and measures that.
    # Under dpkit's placement check, as notebooks 05 and 06 run it in nbval: every tensor it
    # makes for the lanes must be made on them (a label left on the host fails, as on a GPU).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with checking_placement():
            return cost.calibrate(2, models=("mlp",), quick=True, progress=False)
    finally:
        torch.set_num_threads(threads)


def _steps(hardware: cost.Hardware, names=("mlp", "cnn"), counts=(1, 2, 4), rows=(1, 16)):
    """Steps "measured" as ``hardware`` predicts them: wall time and every phase."""
    found = []
    for name in names:
        module, sample = build_model(name, seed=0), sample_input()
        for n in counts:
            for per_lane in rows:
                predicted = cost.predict(module, sample, per_lane * n, n, hardware)
                times = {row["phase"]: row["time_s"] for row in predicted.summary()}
                found.append(
                    (module, sample, per_lane * n, n, {**times, "step": predicted.step_time})
                )
    return found


def test_the_fit_recovers_the_host_terms_that_made_the_steps():
    base = cost.presets()["this-machine"]
    truth = dataclasses.replace(
        base, op_overhead=3e-6, backward_op_overhead=2e-6, gil_handoff=7e-6,
        copy_overhead=9e-6, step_overhead=500e-6,
    )  # fmt: skip
    fitted = calibration.fit_host_terms(base, _steps(truth))
    for name in calibration.FITTED:
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-3), name
    for name in set(HOST_TERMS) - set(calibration.FITTED):  # measured elsewhere: left alone
        assert getattr(fitted, name) == getattr(base, name), name


def _segment_steps(hardware: cost.Hardware, names=("mlp", "transformer"), counts=(1, 2, 4)):
    """Steps "measured" as calibration measures them (untraced: the step's wall time and,
    on 2 lanes or more, each of DataParallel's calls and loss.backward()), as ``hardware``
    predicts them."""
    found = []
    for name in names:
        module, sample = build_model(name, seed=0), sample_input()
        for n in counts:
            for per_lane in (1, 16):
                segments = calibration.predicted_segments(
                    cost.predict(module, sample, per_lane * n, n, hardware)
                )
                keys = calibration.SEGMENTS if n > 1 else calibration.ONE_LANE_SEGMENTS
                found.append((module, sample, per_lane * n, n, {k: segments[k] for k in keys}))
    return found


def test_the_fit_recovers_the_host_terms_from_untraced_segments():
    base = cost.presets()["this-machine"]
    truth = dataclasses.replace(
        base, op_overhead=4e-6, backward_op_overhead=1e-6, gil_handoff=12e-6,
        copy_overhead=20e-6, step_overhead=150e-6,
    )  # fmt: skip
    fitted = calibration.fit_host_terms(base, _segment_steps(truth))
    for name in calibration.FITTED:
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-3), name


def test_predicted_segments_add_the_backward_call_up():
    hardware = cost.presets()["this-machine"]
    predicted = cost.predict(build_model("mlp", seed=0), sample_input(), 64, 2, hardware)
    segments = calibration.predicted_segments(predicted)
    phases = {row["phase"]: row["time_s"] for row in predicted.summary()}
    assert segments["step"] == predicted.step_time
    assert segments["backward_call"] == pytest.approx(
        phases["grad_scatter"] + phases["backward"] + phases["reduce"]
    )
    assert segments["apply"] == phases["apply"]


def test_measured_steps_are_untraced_and_time_dataparallels_calls(monkeypatch):
    def no_trace(*args, **kwargs):
        raise AssertionError("calibration's steps run untraced, as a learner's loop does")

    monkeypatch.setattr(dpkit, "trace", no_trace)
    lanes = dpkit.virtual_devices(2, on="cpu")
    module, sample = build_model("mlp", seed=0), sample_input()
    found = calibration.measure_steps([(module, sample)], lanes, (1, 2), (1,), 1)
    (_, _, batch1, n1, one), (_, _, batch2, n2, two) = found
    assert (batch1, n1, batch2, n2) == (1, 1, 2, 2)
    assert set(one) == set(calibration.ONE_LANE_SEGMENTS)
    assert set(two) == set(calibration.SEGMENTS)
    for measured in one, two:  # the calls happen within the step
        parts = sum(seconds for name, seconds in measured.items() if name != "step")
        assert 0 < parts <= measured["step"] * 1.0001


def test_a_term_no_step_depends_on_keeps_its_value():
    # one-lane steps run no threads: nothing in them says anything about the GIL's handoff
    base = cost.presets()["this-machine"]
    truth = dataclasses.replace(base, op_overhead=3e-6, step_overhead=500e-6)
    fitted = calibration.fit_host_terms(base, _steps(truth, counts=(1,)))
    assert fitted.gil_handoff == base.gil_handoff
    assert fitted.op_overhead == pytest.approx(3e-6, rel=1e-3)


def test_op_curves_merge_near_points_and_never_fall():
    curve = calibration.op_curve
    # hand-computed: 100 and 110 are within 1.3x (one point, the medians 105 and 3)
    assert curve([(110, 4.0), (100, 2.0), (1000, 3.0), (1e4, 30.0)]) == (
        (105, 3.0),
        (1000, 3.0),
        (1e4, 30.0),
    )
    # a larger op measured faster than a smaller: pooled (their mean, at the larger work)
    assert curve([(10, 5.0), (100, 1.0), (1000, 10.0)]) == ((100, 3.0), (1000, 10.0))
    assert curve([(0, 2e-6), (0, 1e-6), (0, 3e-6)]) == ((0, 2e-6),)  # a view: one sample


def test_quick_calibration_gives_a_valid_hardware_for_virtual_lanes(measured):
    assert isinstance(measured, cost.Hardware)
    assert measured.virtual_lanes and measured.name == "this-machine"
    assert "calibrate()" in measured.source and "(quick)" in measured.source
    # a memcpy: about 1 to 200 GB/s; a loaded 2-core machine was seen at 0.4 GB/s
    assert 5e7 < measured.device_to_device.bandwidth < 2e11
    assert 1e-8 < measured.device_to_device.latency < 1e-4
    assert 1e8 < measured.memory_bandwidth < 1e12
    assert 1e8 < measured.peak_flops["float32"] < 1e13  # a CPU core's matmul
    assert 1 <= measured.compute_units <= 2
    for name in HOST_TERMS:
        seconds = getattr(measured, name)
        assert 0 < seconds < 5e-3, name  # host terms: microseconds, never a step's worth
    assert 1e-6 < measured.thread_start < 5e-3  # starting a Python thread
    assert 1e-7 < measured.module_overhead < 1e-3  # building one module object


def test_the_uncalibrated_default_predicts_steps_of_this_machines_size(measured):
    """``dpkit predict --hardware this-machine`` without --calibrate: a rough default (17 %
    and 39 % median step errors, benchmarks/this_machine_preset.py), but of the right size:
    its host terms are microseconds, like a calibration's, and its predicted steps within
    4x of what a calibration of this machine predicts (a term in the wrong unit is 10**6x)."""
    default = cost.preset("this-machine")
    for name in HOST_TERMS:
        assert 0 < getattr(default, name) < 5e-3, name
    module, sample = build_model("mlp", seed=0), sample_input()
    for batch in (16, 256):
        rough = cost.predict(module, sample, batch, 2, default).step_time
        calibrated = cost.predict(module, sample, batch, 2, measured).step_time
        assert 0.25 < rough / calibrated < 4, (batch, rough, calibrated)


def test_measured_op_samples_are_by_name_and_monotone(measured):
    assert all(name.startswith("aten.") and "@" not in name for name in measured.op_seconds)
    for name in ("aten.addmm", "aten.mm", "aten.relu", "aten.convolution"):
        assert name in measured.op_seconds, name  # the MLP's and the probes' ops
    for name, samples in measured.op_seconds.items():
        works = [work for work, _ in samples]
        seconds = [s for _, s in samples]
        assert works == sorted(works) and len(set(works)) == len(works), name
        assert seconds == sorted(seconds), name  # more work never takes less
        assert all(s > 0 for s in seconds), name
    addmm = measured.op_seconds["aten.addmm"]
    assert len(addmm) >= 3 and addmm[-1][1] > 2 * addmm[0][1]  # matmuls of many sizes


def test_a_calibrated_machine_predicts(measured):
    predicted = cost.predict(build_model("mlp", seed=0), sample_input(), 256, 2, measured)
    assert 0 < predicted.step_time < 1.0
    assert "this-machine" in predicted.hardware


def test_the_link_is_measured_from_sources_out_of_the_caches(monkeypatch):
    # A made-up lane copy: 2 GB/s from a source out of the caches, 8 GB/s from one a copy
    # before has brought into them (scatters of one tensor again and again), 1 us more per
    # copy. A step's copies read sources its own work has pushed out of the caches, so the
    # link must be the 2 GB/s one: chunks of 1 kB and 1 MB, (1 MB - 1 kB) / 2 GB/s apart.
    state = {"cold": True}
    recorder: list[list[object]] = []

    class Recorded:
        def __init__(self) -> None:
            self.events: list[object] = []

        def __enter__(self) -> Recorded:
            recorder.append(self.events)
            return self

        def __exit__(self, *exc: object) -> None:
            recorder.pop()

    def scatter(tensor: torch.Tensor, lanes: list[dpkit.Device]) -> None:
        chunk = tensor[:1].nbytes
        seconds = 1e-6 + chunk / (2e9 if state["cold"] else 8e9)
        state["cold"] = False
        for lane in lanes[1:]:
            recorder[-1].append(
                dataclasses.make_dataclass("E", ["device", "nbytes", "duration"])(
                    lane.name, chunk, seconds
                )
            )

    def evict() -> None:
        state["cold"] = True

    monkeypatch.setattr(dpkit, "trace", Recorded)
    monkeypatch.setattr(dpkit, "scatter", scatter)
    lanes = dpkit.virtual_devices(2, on="cpu")
    link = calibration.measure_link(lanes, 3, (2 * 1000, 2 * 1000 * 1000), evict=evict)
    assert link.bandwidth == pytest.approx(2e9)
    # on CPU lanes the default evicts too: more bytes than this VM's 32 MiB last-level cache
    assert calibration.EVICT_BYTES >= 2 * 32 * 2**20


def test_the_relative_errors_cover_every_measured_time_of_every_step():
    hardware = cost.presets()["this-machine"]
    module, sample = build_model("mlp", seed=0), sample_input()
    steps = []
    for n in (1, 2):
        predicted = calibration.predicted_segments(cost.predict(module, sample, 8, n, hardware))
        measured = {"step": 2 * predicted["step"], "apply": predicted["apply"] / 2}
        steps.append((module, sample, 8, n, {**measured, "never predicted": 1.0}))
    errors = calibration._relative_errors(hardware, steps)
    # hand-computed: twice the prediction reads -0.5, half of it +1, a time the model has
    # no phase for -1 (predicted 0); both steps, in order
    assert errors.tolist() == pytest.approx([-0.5, 1.0, -1.0] * 2)


def test_a_pooled_curve_weighs_each_block_by_its_points():
    # hand-computed: 10 and 11 merge (two points, 5.0); 100 is faster, so the three pool:
    # (2 x 5.0 + 1 x 2.0) / 3 = 4.0, at the larger work
    assert calibration.op_curve([(10, 5.0), (11, 5.0), (100, 2.0)]) == ((100, 4.0),)


def test_the_forward_call_is_dataparallels_four_forward_phases():
    hardware = cost.presets()["this-machine"]
    predicted = cost.predict(build_model("mlp", seed=0), sample_input(), 64, 2, hardware)
    segments = calibration.predicted_segments(predicted)
    phases = {row["phase"]: row["time_s"] for row in predicted.summary()}
    assert segments["forward_call"] == pytest.approx(
        phases["scatter"] + phases["replicate"] + phases["apply"] + phases["gather"]
    )


def test_calibration_replaces_the_defaults_with_what_it_measured(measured):
    from dpkit.cost.catalog import this_machine_default

    default = this_machine_default()
    for name in ("memory_bandwidth", "device_to_device", "thread_start", "module_overhead"):
        assert getattr(measured, name) != getattr(default, name), name
    assert measured.peak_flops.keys() == {"float32"}
    assert "calibrated" in measured.description  # not the default's "documented default"
    assert measured.peak_flops["float32"] != default.peak_flops["float32"]
    # one measured link for every copy: CPU lanes, the host and "nodes" share one memory
    link = measured.device_to_device
    assert link.source == "calibrate(): lanes" and link != default.device_to_device
    assert measured.host_to_device == link == measured.node_to_node


def test_the_cores_measured_are_between_one_and_the_threads():
    assert 1.0 <= calibration.measure_cores(2, 1) <= 2.0


def test_every_probe_of_a_full_calibration_runs_on_rows_of_a_batch():
    quick, full = calibration.probes(quick=True), calibration.probes(quick=False)
    assert len(full) > len(quick)  # a full calibration times more: the quick probes, and more
    for (module, _), (same, _) in zip(full, quick):
        assert type(module) is type(same) and str(module) == str(same)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no probe leans on a default torch warns about
        for module, sample in full:
            rows = torch.cat([sample, torch.randn_like(sample)])
            # dim 0 is the batch: a row's output does not depend on the other rows
            torch.testing.assert_close(module.eval()(rows)[:1], module(sample))


def test_calibrate_measures_the_lanes_it_is_given(monkeypatch):
    class Stop(Exception):
        pass

    seen = []

    def first_measurement(lanes, *args, **kwargs):
        seen.append(list(lanes))
        raise Stop  # the rest of a calibration is not this test's

    monkeypatch.setattr(calibration, "measure_link", first_measurement)
    lanes = dpkit.virtual_devices(3, on="cpu")
    with pytest.raises(Stop):
        cost.calibrate(lanes, models=("mlp",), quick=True, progress=False)
    assert seen == [lanes]


def test_calibrate_times_a_module_of_yours_on_your_sample(monkeypatch):
    class Stop(Exception):
        pass

    timed = []

    def measure_ops(modules, rows, repeats):
        timed.extend(modules)
        raise Stop  # the rest of a calibration is not this test's

    monkeypatch.setattr(calibration, "measure_link", lambda *args, **kwargs: cost.Link(1e9, 1e-6))
    monkeypatch.setattr(calibration, "measure_cores", lambda *args, **kwargs: 1.0)
    monkeypatch.setattr(calibration, "measure_ops", measure_ops)
    mine, sample = torch.nn.Linear(5, 3), torch.ones(1, 5)
    with pytest.raises(Stop):
        cost.calibrate(2, models=(mine, "mlp"), sample=sample, quick=True, progress=False)
    (module, inputs), (course, image) = timed[-2:]  # after the probes
    assert module is mine and torch.equal(inputs, sample)
    assert image.shape == (1, 1, 28, 28)  # a course model keeps its own sample


class _Op:
    def __init__(self, name: str, work_per_row: float):
        self.name, self.work_per_row = name, work_per_row

    def work_at(self, rows: int) -> float:
        return self.work_per_row * rows


def test_op_times_are_the_fastest_whole_pass_s_less_the_recorder_s_own_cost(monkeypatch):
    # Times by hand, in us. Each pass: forward (a view, an addmm), backward (a t, an mm).
    # The first pass has the fastest view (3) but is slower in all; a pass that took another
    # path (three forward ops) is left out however fast. So the fastest matching pass is
    # (9, 20 | 7, 50). The recorder's own cost: the median of the no-work ops' times, 8,
    # less an eager view's 1: 7 us, taken off every op (never below FLOOR).
    forward = [_Op("aten.view", 0), _Op("aten.addmm", 100)]
    backward = [_Op("aten.t", 0), _Op("aten.mm", 200)]
    cost = type("Cost", (), {"forward": type("P", (), {"ops": forward}),
                             "backward": type("P", (), {"ops": backward})})  # fmt: skip
    passes = [((3, 40), (7, 60)), ((1, 1, 1), (1, 1, 1)), ((9, 20), (7, 50))]
    calls = []

    def run_passes(module, inputs, counter, timed):
        times = passes[min(len(calls), 2)]
        calls.append(inputs.shape[0])
        return tuple([("op", None, None, us * 1e-6) for us in part] for part in times) + (0, 0)

    monkeypatch.setattr(calibration, "profile", lambda module, sample: cost)
    monkeypatch.setattr(calibration, "run_passes", run_passes)
    monkeypatch.setattr(calibration, "_fastest", lambda call, repeats: 1e-6)
    curves = calibration.measure_ops([(torch.nn.Identity(), torch.ones(1, 3))], (1, 10), 2)
    us = {name: [(work, round(s * 1e6, 6)) for work, s in curve] for name, curve in curves.items()}
    assert us == {
        "aten.view": [(0, 2.0)],
        "aten.addmm": [(100, 13.0), (1000, 13.0)],
        "aten.t": [(0, round(calibration.FLOOR * 1e6, 6))],
        "aten.mm": [(200, 43.0), (2000, 43.0)],
    }
    # 2 repeats, and more for short passes: 4 x 2 in all at each size (0.05 s allows more)
    assert calls == [1] * 8 + [10] * 8
