"""The explorers and measurements behind notebooks 03-05, driven from Python.

A slider is moved by setting its value, as the browser does; the test then checks that the
data behind the figure (a real trace) and the figure's PNG both changed, and that the marker
line names the new values. Timings are never asserted: only their structure.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import dpkit
from dpkit import viz
from dpkit.verdict import Outcome
from dpkit.viz import apply, common, memory

# As on a GPU: code that leaves a model or a tensor off the devices fails (tests/conftest.py).
pytestmark = pytest.mark.placement_check

pytest.importorskip("ipywidgets")


def _devices_in(recorded: dpkit.Trace, phase: str) -> set[str]:
    last = max(e.step for e in recorded.events)
    return {e.device for e in recorded.events if e.phase == phase and e.step == last}


def _bytes_of(recorded: dpkit.Trace, phase: str) -> int:
    last = max(e.step for e in recorded.events)
    return sum(e.nbytes for e in recorded.events if e.phase == phase and e.step == last)


def _scattered_rows(recorded: dpkit.Trace) -> int:
    last = max(e.step for e in recorded.events)
    scatters = [e for e in recorded.events if e.phase == "scatter" and e.step == last]
    return sum(e.details["rows"] for e in scatters)


PARAMETER_BYTES = sum(p.numel() * p.element_size() for p in common.demo_model().parameters())


# --------------------------------------------------------------------------------------
# timeline_explorer (notebook 03)


def test_timeline_explorer_has_labelled_sliders_that_redraw_on_release():
    explorer = viz.timeline_explorer(devices=4, batch=64)
    assert set(explorer.controls) == {"devices", "batch"}
    assert all(not c.continuous_update for c in explorer.controls.values())
    assert explorer.marker.value == "drawn: devices=4 batch=64"
    assert explorer.last_png.startswith(b"\x89PNG")
    assert explorer.image.value == explorer.last_png


def test_moving_the_devices_slider_reruns_the_trace_and_redraws():
    explorer = viz.timeline_explorer(devices=4, batch=64)
    before_png, before = explorer.last_png, explorer.last_data
    assert len(_devices_in(before, "apply")) == 4

    explorer.controls["devices"].value = 2

    assert explorer.last_data is not before
    assert len(_devices_in(explorer.last_data, "apply")) == 2
    assert explorer.last_png != before_png
    assert explorer.marker.value == "drawn: devices=2 batch=64"
    ticks = [t.get_text() for t in explorer.last_figure.axes[0].get_yticklabels()]
    assert len(ticks) == 2


def test_moving_the_batch_slider_scatters_the_new_batch():
    explorer = viz.timeline_explorer(devices=4, batch=64)
    explorer.controls["batch"].value = 16
    assert _scattered_rows(explorer.last_data) == 16
    assert explorer.marker.value == "drawn: devices=4 batch=16"


def test_the_timeline_says_it_came_from_virtual_devices():
    figure = apply.apply_timeline(apply.apply_trace(devices=3, batch=32))
    assert "virtual" in figure.axes[0].get_title()
    assert tuple(figure.get_size_inches())[0] == common.FIGURE_WIDTH


def test_the_explorer_shows_its_marker_where_widgets_do_not_render():
    explorer = viz.timeline_explorer(devices=2, batch=32)
    bundle = explorer._repr_mimebundle_()
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    assert data["text/plain"] == "drawn: devices=2 batch=32"
    assert "application/vnd.jupyter.widget-view+json" in data


# --------------------------------------------------------------------------------------
# The GIL measurement (notebook 03): structure, never speed


def test_apply_overlap_measures_both_ways_on_the_used_devices():
    result = apply.measure_apply_overlap(
        apply.PythonLoopNet(steps=5), torch.randn(3, 16), devices=4, repeats=1
    )
    assert result.devices == 3  # 3 rows: torch.chunk leaves the fourth device idle
    assert result.serial_ms > 0 and result.parallel_ms > 0 and result.busy_ms > 0
    assert result.speedup == pytest.approx(result.serial_ms / result.parallel_ms)
    assert result.busy_over_span == pytest.approx(result.busy_ms / result.parallel_ms)
    assert "virtual" in result.hardware


def test_the_intra_op_thread_setting_is_restored():
    before = torch.get_num_threads()
    apply.measure_apply_overlap(apply.MatmulNet(width=32), torch.randn(8, 32), repeats=1)
    assert torch.get_num_threads() == before


def test_the_overlap_figure_names_each_model_and_its_hardware():
    results = [
        apply.measure_apply_overlap(model, inputs, devices=2, repeats=1)
        for model, inputs in (
            (apply.PythonLoopNet(steps=5), torch.randn(4, 16)),
            (apply.MatmulNet(width=32), torch.randn(8, 32)),
        )
    ]
    axes = apply.overlap_figure(results).axes[0]
    assert [t.get_text() for t in axes.get_yticklabels()] == ["PythonLoopNet", "MatmulNet"]
    assert "virtual" in axes.get_title()


# --------------------------------------------------------------------------------------
# memory_explorer (notebook 04)


def test_moving_the_loss_into_forward_removes_the_output_devices_extra_load():
    explorer = viz.memory_explorer(devices=4, batch=64)
    assert set(explorer.controls) == {"devices", "batch", "loss"}
    outside = viz.held_per_device(explorer.last_data)
    before_png = explorer.last_png
    first, second = (d.name for d in dpkit.devices(2))
    gathered_logits = 64 * memory.CLASSES * 4
    assert outside[first] - outside[second] >= gathered_logits

    explorer.controls["loss"].value = memory.LOSS_INSIDE

    inside = viz.held_per_device(explorer.last_data)
    assert explorer.last_png != before_png
    assert inside[first] < outside[first] - gathered_logits
    assert inside[first] - inside[second] < 1000  # only the gathered per-replica losses
    assert explorer.marker.value == "drawn: devices=4 batch=64 loss=inside"


def test_the_devices_slider_changes_the_bars_of_the_memory_figure():
    explorer = viz.memory_explorer(devices=4, batch=64)
    explorer.controls["devices"].value = 2
    assert len(viz.held_per_device(explorer.last_data)) == 2
    labels = [t.get_text() for t in explorer.last_figure.axes[0].get_xticklabels()]
    assert len(labels) == 2 and "output device" in labels[0]


def test_the_loss_outside_forward_is_recorded_on_the_output_device_only():
    recorded = viz.memory_trace(devices=3, batch=32, loss="outside")
    loss_records = [r for r in recorded.memory if r.category == memory.LOSS_CATEGORY]
    assert [r.device for r in loss_records] == [dpkit.devices(1)[0].name]
    assert loss_records[0].nbytes >= 32 * memory.CLASSES * 4  # log-softmax of the logits


def test_memory_trace_only_reads_the_trace_and_keeps_the_loss_beside_it():
    run = viz.memory_trace(devices=3, batch=32, loss="outside")
    assert isinstance(run.trace, dpkit.Trace)
    assert memory.LOSS_CATEGORY not in {r.category for r in run.trace.memory}
    added = [r for r in run.memory if r not in run.trace.memory]
    assert [(r.device, r.category, r.nbytes) for r in added] == [
        (run.output_device.name, memory.LOSS_CATEGORY, run.loss_bytes)
    ]
    assert added[0].step == max(r.step for r in run.trace.memory)
    legend = viz.memory_figure(run).axes[0].get_legend().get_texts()
    assert memory.LOSS_CATEGORY in {text.get_text() for text in legend}
    inside = viz.memory_trace(devices=3, batch=32, loss="inside")
    assert inside.loss_bytes == 0 and inside.memory == inside.trace.memory


def test_memory_trace_names_the_argument_it_rejects():
    with pytest.raises(ValueError, match="loss must be"):
        viz.memory_trace(loss="sideways")


def test_with_loss_gives_the_exact_mean_for_uneven_chunks():
    torch.manual_seed(0)
    lanes = dpkit.devices(4)
    model = dpkit.to_device(memory.classifier(), lanes[0])
    inputs = torch.randn(10, memory.FEATURES)  # 3, 3, 3, 1 rows over 4 devices
    targets = torch.randint(0, memory.CLASSES, (10,))
    inputs, targets = dpkit.to_device((inputs, targets), lanes[0])
    sums = dpkit.DataParallel(viz.WithLoss(model), device_ids=lanes)(inputs, targets)
    assert sums.shape == (4,)
    expected = torch.nn.functional.cross_entropy(model(inputs), targets)
    assert torch.allclose(sums.sum() / 10, expected, atol=1e-6)


def test_memory_figures_share_a_scale_when_asked():
    recorded = viz.memory_trace(devices=2, batch=16, loss="inside")
    assert viz.memory_figure(recorded, top=1e8).axes[0].get_ylim() == (0, 1e8)
    tallest = max(viz.held_per_device(recorded).values())
    assert viz.memory_figure(recorded).axes[0].get_ylim()[1] > tallest


# --------------------------------------------------------------------------------------
# backward_explorer, equivalence, training, speed-up (notebook 05)


def test_backward_explorer_shows_the_reduce_onto_device_zero():
    explorer = viz.backward_explorer(devices=4, batch=64)
    recorded = explorer.last_data
    phases = {e.phase for e in recorded.events}
    assert {"grad_scatter", "backward", "reduce"} <= phases
    assert _bytes_of(recorded, "reduce") == 3 * PARAMETER_BYTES
    before_png = explorer.last_png

    explorer.controls["devices"].value = 3

    assert _bytes_of(explorer.last_data, "reduce") == 2 * PARAMETER_BYTES
    assert explorer.last_png != before_png
    legend = [t.get_text() for t in explorer.last_figure.axes[0].get_legend().get_texts()]
    assert "reduce" in legend


def test_backward_explorer_draws_the_second_of_two_steps_with_the_new_batch():
    explorer = viz.backward_explorer(devices=4, batch=64)
    explorer.controls["devices"].value = 2
    explorer.controls["devices"].value = 4
    explorer.controls["batch"].value = 128
    recorded = explorer.last_data
    assert {e.step for e in recorded.events} == {1, 2}  # the warm-up, then the step drawn
    assert "step 2" in explorer.last_figure.axes[0].get_title()
    assert _bytes_of(recorded, "reduce") == 3 * PARAMETER_BYTES
    scattered = sum(e.nbytes for e in recorded.events if e.phase == "scatter" and e.step == 2)
    assert scattered == 3 * (128 // 4) * 256 * 4  # the new batch's chunks for lanes 1..3


def test_dataparallel_training_matches_one_device():
    same = viz.compare_with_single_device(steps=3, devices=4, batch=30)
    assert same.max_parameter_difference < 1e-5
    assert same.max_loss_difference < 1e-5
    assert same.max_parameter_change > 1e-3  # training did move the parameters


def test_a_short_training_run_learns():
    run = viz.train(steps=40, devices=2, batch=64, progress=False)
    assert len(run.losses) == 40
    assert run.losses[-1] < 0.6 * run.losses[0]
    assert run.accuracy > 0.5
    assert "virtual" in viz.loss_curve(run).axes[0].get_title()


# --------------------------------------------------------------------------------------
# dpkit.viz exports


def test_importing_dpkit_viz_loads_no_widgets():
    code = "import sys, dpkit.viz; print('ipywidgets' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.split() == ["False"], result.stderr


@pytest.mark.parametrize(
    "name",
    [
        "timeline_explorer",
        "memory_explorer",
        "backward_explorer",
        "split_explorer",
        "replication_explorer",
        "Question",
        "measure_speedups",
    ],
)
def test_every_explorer_is_exported(name):
    assert callable(getattr(viz, name))
    assert name in viz.__all__


def test_an_unknown_name_gives_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        viz.nothing_here  # noqa: B018


def test_the_overlap_verdict_concludes_only_beyond_the_rounds_spread():
    def measured(low: float, high: float) -> apply.ApplyOverlap:
        return apply.ApplyOverlap(
            "M", 4, "virtual devices on the CPU", 10.0, 9.0, 30.0, (low, high)
        )

    assert measured(0.95, 1.08).verdict().endswith("no difference beyond the run-to-run noise")
    assert measured(1.2, 1.5).verdict().endswith("the replicas overlapped")
    assert measured(0.1, 0.3).verdict().endswith("slower than one after another")
    assert "1.11x (middle half of the rounds: 0.95-1.08x)" in measured(0.95, 1.08).verdict()


def test_speed_ups_beyond_the_cores_give_no_verdict():
    """4 replicas on 2 cores overlap 2x at most: an upper quartile above that means the
    one-after-another run was disturbed, and the row says so instead of "faster"."""

    def measured(low: float, high: float, cores: int) -> apply.ApplyOverlap:
        serial, parallel = (40.0,) * 4, (10.0,) * 4  # a median round of 4x
        return apply.ApplyOverlap(
            "M", 4, "virtual devices on the CPU", 40.0, 10.0, 30.0, (low, high),
            serial_rounds_ms=serial, parallel_rounds_ms=parallel, cores=cores,
        )  # fmt: skip

    disturbed = measured(1.5, 2.5, cores=2)
    assert disturbed.ceiling == 2 and disturbed.disturbed and not disturbed.overlapped
    assert disturbed.verdict() == (
        "4.00x (middle half of the rounds: 1.50-2.50x): no verdict: a quarter of the rounds or "
        "more sped up beyond the 2x that 4 replicas on 2 cores can give, so the "
        "one-after-another run was slowed by something the parallel one escaped"
    )
    assert "→" not in disturbed.verdict()  # no outcome for the verdict checker to read
    # on 4 cores the same rounds are overlap: 1.5-2.5x is within the 4x ceiling
    assert measured(1.5, 2.5, cores=4).overlapped
    notes = apply.beyond_the_cores([disturbed, measured(1.5, 1.9, cores=2)], cores=2)
    assert len(notes) == 1 and "up to 2.50x (the upper quartile)" in notes[0]


def test_start_gaps_are_compared_round_by_round_with_empty_replicas():
    def gaps(*ms: float) -> apply.ApplyOverlap:
        return apply.ApplyOverlap("M", 4, "cpu", 4.0, 2.0, 4.0, gap_rounds_ms=ms)

    # ratios 2, 3, 2.5, 4: quartiles (inclusive) 2.375 and 3.25, all above 1
    apart = apply.start_gaps_compared(gaps(2.0, 3.0, 2.5, 4.0), gaps(1.0, 1.0, 1.0, 1.0))
    assert str(apart).startswith("2.75x (middle half of the rounds: 2.38-3.25x) → further apart")
    assert str(apart).endswith(apply.GAP_WORDING[Outcome.FASTER])
    alike = apply.start_gaps_compared(gaps(1.0, 1.05, 0.98, 1.02), gaps(1.0, 1.0, 1.0, 1.0))
    assert alike.outcome is Outcome.WITHIN_NOISE


def test_the_timeline_trap_is_told_only_where_the_bars_overlap_beyond_the_speed_up():
    def run(busy: float, low: float, high: float) -> apply.ApplyOverlap:
        return apply.ApplyOverlap("Loop", 4, "cpu", 5.0, 10.0, busy, (low, high))

    # bars 30 ms over a 10 ms span: 3-fold, against a speed-up of 0.5x
    trap = apply.timeline_trap(run(30.0, 0.4, 0.6))
    assert trap.startswith("Loop's bars overlap 3.0-fold, yet its speed-up was 0.50x")
    assert "waiting for the GIL" in trap
    # 12 ms over 10: 1.2-fold, not more than 1.5 times the speed-up (at least 1)
    calm = apply.timeline_trap(run(12.0, 0.4, 0.6))
    assert calm.startswith("Loop's bars overlap only 1.2-fold this time")
    assert "did not show" in calm


def test_measured_overlap_reports_the_spread_of_its_rounds():
    result = apply.measure_apply_overlap(apply.MatmulNet(width=32), torch.randn(8, 32), repeats=3)
    low, high = result.speedup_quartiles
    assert 0 < low <= high


# --------------------------------------------------------------------------------------
# What spaces the replicas' starts (notebook 03, section 2b): structure, never speed


def test_the_overlap_measurement_records_start_gaps_batch_and_threads():
    result = apply.measure_apply_overlap(
        apply.MatmulNet(width=32), torch.randn(12, 32), devices=3, repeats=2, threads=1
    )
    assert (result.batch, result.threads, result.devices) == (12, 1, 3)
    assert result.start_gap_ms > 0  # three workers cannot all start at the same instant
    assert result.forward_ms == pytest.approx(result.serial_ms / 3)
    assert result.start_gap_ms < result.parallel_ms


def test_the_lanes_compute_with_the_intra_op_threads_the_measurement_sets():
    seen: list[int] = []

    class ThreadsSeen(torch.nn.Module):
        def forward(self, x):
            seen.append(torch.get_num_threads())
            return x

    apply.measure_apply_overlap(ThreadsSeen(), torch.randn(4, 2), devices=2, repeats=1, threads=1)
    assert seen and set(seen) == {1}  # in every worker thread, not only in the caller


def test_start_suspects_measures_each_suspect_and_tabulates_every_run():
    suspects = apply.start_suspects(devices=2, batches=(8, 16), repeats=1)
    assert [(r.batch, r.threads) for r in suspects.runs] == [(8, 1), (16, 1), (16, None)]
    assert suspects.empty is not None and suspects.empty.model == "Identity"
    assert suspects.thread_start_ms > 0 and suspects.python_ms > 0 and suspects.cores >= 1
    assert suspects.load_average is None or suspects.load_average >= 0
    rows = suspects.table().splitlines()
    assert rows[1].split()[0] == "8" and "1 per lane" in rows[1] and "(default)" in rows[3]
    # a row per run, then only notes on runs faster than the cores allow (a busy machine's)
    notes = rows[1 + len(suspects.runs) :]
    assert all(note.startswith("Batch ") and "is not overlap" in note for note in notes)
    beyond = [run for run in suspects.runs if run.speedup > min(run.devices, suspects.cores)]
    assert len(notes) == len(beyond)
