"""dpkit.cost.calibration with its measurements replaced: what calibrate() asks to be timed,
what it reports, and the numbers its measure_* functions make from hand-set times."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math

import pytest
import torch
from torch import nn

import dpkit
import dpkit.cost as cost
from dpkit.cost import calibration
from dpkit.cost.catalog import this_machine_default
from dpkit.cost.cli import add_predict_command
from dpkit.models import build_model, sample_input


@pytest.fixture
def faked(monkeypatch):
    """calibrate() with every measurement replaced (no timing at all): what it asked for is
    in the returned dict ("sizes" of copies, "rows" of ops, "advanced" progress steps)."""
    asked: dict[str, list] = {"sizes": [], "rows": [], "advanced": []}

    def measure_link(lanes, repeats, sizes, evict=None):
        asked["sizes"].append(tuple(sizes))
        return cost.Link(1e9, 1e-6, "calibrate(): lanes")

    def measure_ops(modules, rows, repeats):
        asked["rows"].append(tuple(rows))
        return {}

    @contextlib.contextmanager
    def progress(enabled):
        yield asked["advanced"].append

    monkeypatch.setattr(calibration, "measure_link", measure_link)
    monkeypatch.setattr(calibration, "measure_cores", lambda lanes, repeats: 1.5)
    monkeypatch.setattr(calibration, "measure_ops", measure_ops)
    monkeypatch.setattr(calibration, "measure_rates", lambda repeats, lanes: (5e10, 7e9))
    monkeypatch.setattr(calibration, "measure_thread_start", lambda lanes, repeats: 1e-4)
    monkeypatch.setattr(calibration, "measure_module_overhead", lambda lanes, repeats: 1e-5)
    monkeypatch.setattr(calibration, "measure_steps", lambda *args: [])
    monkeypatch.setattr(calibration, "fit_host_terms", lambda hardware, steps: hardware)
    monkeypatch.setattr(calibration, "_progress", progress)
    monkeypatch.setattr(calibration.platform, "node", lambda: "lab-pc")
    monkeypatch.setattr(calibration.time, "strftime", lambda fmt: "2030-01-02 03:04")
    return asked


def test_the_progress_bar_names_each_step_it_declares_in_order(faked):
    # the bar's total is len(_STEPS): each advance names the step just done, as the user
    # reads it beside the bar ("calibrating ... cores")
    cost.calibrate(2, models=("mlp",), quick=True, progress=True)
    assert faked["advanced"] == list(calibration._STEPS)


def test_on_cpu_lanes_the_largest_copy_is_the_steps_largest_batch(faked):
    # The steps calibrated are batches of up to 1024 images of 1x28x28 float32:
    # 1024 x 784 x 4 = 3,211,264 bytes; the smallest power of two that holds it is
    # 2**22 = 4,194,304 (2**21 is 2,097,152). Larger copies on CPU lanes stream at
    # another rate than the steps' (a GPU's 1 GiB copy would take a CPU seconds).
    largest_batch = 1024 * 28 * 28 * 4
    expected = 1 << math.ceil(math.log2(largest_batch))
    assert expected == 4_194_304
    for quick in (True, False):
        faked["sizes"].clear()
        cost.calibrate(2, models=("mlp",), quick=quick, progress=False)
        (sizes,) = faked["sizes"]
        assert max(sizes) == expected, quick


def _predict_default_batch() -> int:
    parser = argparse.ArgumentParser()
    add_predict_command(parser.add_subparsers())
    return parser.parse_args(["predict"]).batch


def test_ops_are_timed_at_the_default_batch_of_dpkit_predict(faked):
    # a prediction at dpkit predict's default batch on one lane reads a measured point of
    # each op's curve, not one interpolated between two sizes
    batch = _predict_default_batch()
    assert batch == 256
    for quick in (True, False):
        faked["rows"].clear()
        cost.calibrate(2, models=("mlp",), quick=quick, progress=False)
        (rows,) = faked["rows"]
        assert batch in rows, (quick, rows)


def test_the_description_names_the_machine_and_the_source_says_when(faked, monkeypatch):
    quick = cost.calibrate(2, models=("mlp",), quick=True, progress=False)
    assert "of this machine (lab-pc), calibrated" in quick.description
    # the source ends with the date and time, then how: "(quick)" only for a quick one
    assert quick.source.endswith(", 2030-01-02 03:04 (quick)"), quick.source
    full = cost.calibrate(2, models=("mlp",), quick=False, progress=False)
    assert full.source.endswith(", 2030-01-02 03:04"), full.source
    monkeypatch.setattr(calibration.platform, "node", lambda: "")  # a host with no name
    unnamed = cost.calibrate(2, models=("mlp",), quick=True, progress=False)
    assert "of this machine (here), calibrated" in unnamed.description


class _Recorded:
    """dpkit.trace's stand-in: events appended by the fake scatter below."""

    current: list[list[object]] = []

    def __init__(self) -> None:
        self.events: list[object] = []

    def __enter__(self) -> _Recorded:
        _Recorded.current.append(self.events)
        return self

    def __exit__(self, *exc: object) -> None:
        _Recorded.current.pop()


_Event = dataclasses.make_dataclass("_Event", ["device", "nbytes", "duration"])


def _fake_copies(monkeypatch, seconds):
    """dpkit.scatter records a copy to every lane but the first taking ``seconds(chunk)``."""

    def scatter(tensor, lanes):
        chunk = tensor[:1].nbytes
        for lane in lanes[1:]:
            _Recorded.current[-1].append(_Event(lane.name, chunk, seconds(chunk)))

    monkeypatch.setattr(dpkit, "trace", _Recorded)
    monkeypatch.setattr(dpkit, "scatter", scatter)


def test_on_cpu_lanes_every_timed_copy_comes_after_an_eviction_by_default(monkeypatch):
    # The default eviction adds 1 to a buffer of EVICT_BYTES before each timed copy: with a
    # small buffer here, after 3 repeats of 2 sizes every float of it reads 6.
    _fake_copies(monkeypatch, lambda chunk: 1e-6 + chunk / 2e9)
    monkeypatch.setattr(calibration, "EVICT_BYTES", 4096)
    made = []
    zeros = torch.zeros

    def recording_zeros(*args, **kwargs):
        made.append(zeros(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(torch, "zeros", recording_zeros)
    lanes = dpkit.virtual_devices(2, on="cpu")
    link = calibration.measure_link(lanes, 3, (2 * 1000, 2 * 1000 * 1000))
    buffers = [t for t in made if t.dim() == 1 and t.numel() == 4096 // 4]
    assert len(buffers) == 1, "no eviction buffer: copies timed from the caches"
    assert buffers[0].tolist() == [6.0] * 1024
    assert link.bandwidth == pytest.approx(2e9)


def test_copies_that_take_no_longer_for_more_bytes_read_as_a_very_fast_link(monkeypatch):
    # the same 5 us for 1 kB and 1 MB: a slope of zero, no bandwidth to divide by; the
    # link is then faster than anything measured, not an error
    _fake_copies(monkeypatch, lambda chunk: 5e-6)
    lanes = dpkit.virtual_devices(2, on="cpu")
    link = calibration.measure_link(lanes, 2, (2 * 1000, 2 * 1000 * 1000), evict=lambda: None)
    assert math.isfinite(link.bandwidth) and link.bandwidth >= 1e10


def test_on_cpu_lanes_the_rates_are_timed_on_work_sized_for_a_cpu(monkeypatch):
    # With every run "taking" 1 s, the rates read back the work timed: bytes moved by the
    # add (3 tensors: two read, one written) and the matmul's FLOPs (2 x side**3). At the
    # documented default's rates (8 GB/s, 60 GFLOP/s) each try must take milliseconds, not
    # the seconds a GPU's sizes would (1 GiB tensors: 0.4 s; a 4096 matmul: 2.3 s).
    monkeypatch.setattr(calibration, "_fastest", lambda work, repeats, on=(): 1.0)
    flops, bandwidth = calibration.measure_rates(1, dpkit.virtual_devices(2, on="cpu"))
    default = this_machine_default()
    assert bandwidth / default.memory_bandwidth <= 0.05  # seconds per try
    assert flops / default.peak_flops["float32"] <= 0.05


def test_measured_steps_are_repeats_in_two_rounds_each_after_a_warm_up():
    # the docstring: ``repeats`` steps timed, in two rounds, each round after one step to
    # warm up: 3 repeats are 2 + 1 timed, 5 steps run; 4 are 2 + 2, 6 run
    for repeats, runs in ((3, 5), (4, 6)):
        module = nn.Linear(4, 3)
        calls = []
        module.register_forward_hook(lambda *args, seen=calls: seen.append(1))
        lanes = dpkit.virtual_devices(2, on="cpu")
        ((_, _, batch, n, times),) = calibration.measure_steps(
            [(module, torch.ones(1, 4))], lanes, (1,), (1,), repeats
        )
        assert (batch, n, len(calls)) == (1, 1, runs), repeats
        assert set(times) == set(calibration.ONE_LANE_SEGMENTS)


def test_an_op_at_twice_the_work_is_a_point_of_its_own():
    # twice the work (a batch and its double) is another size, not noise of one: the curve
    # keeps both, so a prediction at the double reads the double's time
    assert calibration.op_curve([(100, 1.0), (200, 2.0)]) == ((100, 1.0), (200, 2.0))


def test_the_probes_compute_the_same_numbers_pass_after_pass_in_training():
    # calibration times passes of each probe again and again (in training mode) and takes
    # the fastest: as the course's transformer (no dropout, so every device computes the
    # same numbers), no probe draws random masks
    for module, sample in calibration.probes(quick=False):
        module.train()
        rows = torch.cat([sample, sample + 1])
        torch.testing.assert_close(module(rows), module(rows))


def test_a_full_calibration_times_a_softmax_which_no_course_model_has():
    # a user's classifier or hand-written attention: measured, not the roofline's guess
    from dpkit.cost.profiling import profile

    names = set()
    for module, sample in calibration.probes(quick=False)[2:3]:  # the LayerNorm-GELU MLP
        counted = profile(module, sample)
        names |= {op.name for op in counted.forward.ops + counted.backward.ops}
    assert {"aten._softmax", "aten._softmax_backward_data"} <= names
    assert {"aten.gelu", "aten.native_layer_norm"} <= names


def test_timed_calls_take_keyword_arguments_as_dataparallel_does():
    lanes = dpkit.virtual_devices(2, on="cpu")
    timed = calibration._Timed(nn.Linear(4, 3), device_ids=lanes)
    timed.took = {}
    x = torch.arange(8.0).reshape(2, 4)
    inputs, kwargs = timed.scatter(inputs=(x,), kwargs=None, device_ids=lanes)
    plain, plain_kwargs = dpkit.DataParallel.scatter(timed, (x,), None, lanes)
    assert len(inputs) == len(plain) == 2
    for got, want, row in zip(inputs, plain, (x[:1], x[1:])):
        assert torch.equal(got[0], want[0]) and torch.equal(got[0], row)
    assert kwargs == plain_kwargs and set(timed.took) == {"scatter"}


def _segment_steps(hardware, module, sample, counts=(1, 4), rows=(16,)):
    found = []
    for n in counts:
        for per_lane in rows:
            segments = calibration.predicted_segments(
                cost.predict(module, sample, per_lane * n, n, hardware)
            )
            keys = calibration.SEGMENTS if n > 1 else calibration.ONE_LANE_SEGMENTS
            found.append((module, sample, per_lane * n, n, {k: segments[k] for k in keys}))
    return found


def test_the_fit_recovers_a_gpu_machines_host_terms():
    # On a GPU the host's launches and the devices' work overlap: a term's effect on a step
    # bends where one overtakes the other. The fit's finite differences must stay small
    # (microseconds) to read each term's effect where the machine is, not a second away.
    base = cost.preset("8xA100-SXM-NVLink")
    truth = dataclasses.replace(
        base, op_overhead=4e-6, backward_op_overhead=2e-6, gil_handoff=5e-6,
        copy_overhead=8e-6, step_overhead=100e-6,
    )  # fmt: skip
    module, sample = build_model("mlp", seed=0), sample_input()
    fitted = calibration.fit_host_terms(base, _segment_steps(truth, module, sample))
    for name in calibration.FITTED:
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-3), name
