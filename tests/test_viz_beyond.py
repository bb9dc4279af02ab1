"""Notebook 07's figures and explorers, on hand-made traces (no processes start here), and the
timeline's communication track and the memory figure's DDP categories.

The traces are built here event by event, so what a figure must show is known without
running dpkit: an all-reduce that overlaps a backward on one rank, gradients and buckets.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from matplotlib.colors import to_rgba
from matplotlib.text import Text

import dpkit
from dpkit import pipeline as pp
from dpkit import viz
from dpkit.ddp import Comparison, DDPResult
from dpkit.device import VIRTUAL_CPU
from dpkit.tracing import RANK, Event, Trace
from dpkit.verdict import Outcome
from dpkit.viz import beyond
from dpkit.viz.explorer import figure_png
from tests.verdict_checker import check_text, unchecked_claims

pytest.importorskip("ipywidgets")


def filled(events, memory=()) -> Trace:
    trace = Trace()
    trace._events = list(events)
    trace._memory = list(memory)
    return trace


def ddp_trace(steps=2, stretch=1.0, allreduces=2) -> Trace:
    events, memory = [], []
    for step in range(1, steps + 1):
        t = step * 10.0
        for rank in range(2):
            name = f"rank:{rank} (cpu)"
            events += [
                Event("apply", name, t, t + 1 * stretch, 0, step, RANK),
                Event("backward", name, t + 1, t + 4 * stretch, 0, step, RANK),
                Event("optimizer", name, t + 5, t + 5.5, 0, step, RANK),
            ]
            for bucket in range(allreduces):  # overlapping the backward
                start = t + 2 + bucket
                events.append(Event("allreduce", name, start, start + 1.5, 4000, step, RANK,
                                    {"ring_sent_bytes": 2000, "bucket": bucket}))  # fmt: skip
            memory += [(name, category, 4000, step, RANK) for category in
                       ("parameters", "gradients", "buckets")]  # fmt: skip
    return filled(events, memory)


def dp_trace(steps=2) -> Trace:
    events, memory = [], []
    for step in range(1, steps + 1):
        t = step * 10.0
        for lane in range(2):
            name = f"virtual:{lane} (cpu)"
            events += [
                Event("apply", name, t + 0.5, t + 2, 0, step, VIRTUAL_CPU),
                Event("backward", name, t + 3, t + 5, 0, step, VIRTUAL_CPU),
            ]
            memory.append((name, "parameters", 4000, step, VIRTUAL_CPU))
        events.append(Event("reduce", "virtual:1 (cpu)", t + 5, t + 6, 4000, step, VIRTUAL_CPU,
                            {"destination": "virtual:0 (cpu)"}))  # fmt: skip
    return filled(events, memory)


def result(trace: Trace, cap: float) -> DDPResult:
    return DDPResult(trace, 2, "gloo", 8, cap, 4000, [0.005, 0.004], [1, 2], None)


def comparison(nproc=2) -> Comparison:
    return Comparison(nproc, 8, 1, dp_trace(), [0.006, 0.007], result(ddp_trace(), 25.0),
                      [result(ddp_trace(allreduces=3), 0.001)])  # fmt: skip


# -- the timeline's communication track, the memory figure's colours ------------------------


def _bars_by_phase(axes):
    found = {}
    for collection in axes.collections:
        for path in collection.get_paths():
            extents = path.get_extents()
            found.setdefault(collection.get_label(), []).append((extents.y0, extents.y1))
    return found


def test_allreduce_has_its_own_track_so_it_does_not_hide_backward():
    axes = viz.timeline(ddp_trace()).axes[0]
    bars = _bars_by_phase(axes)
    for backward in bars["backward"]:
        for allreduce in bars["allreduce"]:
            if round(sum(backward) / 2) == round(sum(allreduce) / 2):  # one rank's row
                assert allreduce[0] >= backward[1] - 1e-9  # stacked, not overlapping
    assert [t.get_text() for t in axes.get_yticklabels()] == ["rank:0 (cpu)", "rank:1 (cpu)"]
    minor = [t.get_text() for t in axes.get_yticklabels(minor=True)]
    assert minor == ["communication", "communication"]


def test_a_dataparallel_timeline_keeps_one_track_per_device():
    axes = viz.timeline(dp_trace()).axes[0]
    assert axes.get_yticklabels(minor=True) == []
    heights = {round(y1 - y0, 3) for bars in _bars_by_phase(axes).values() for y0, y1 in bars}
    assert heights == {0.7}


def test_gradients_and_buckets_have_colours_of_their_own_and_a_legend_entry():
    axes = viz.memory_per_device(ddp_trace()).axes[0]
    legend = [t.get_text() for t in axes.get_legend().get_texts()]
    assert {"gradients", "buckets"} <= set(legend)
    colours = {c.get_label(): c.patches[0].get_facecolor() for c in axes.containers}
    assert len({colours[c] for c in ("parameters", "gradients", "buckets")}) == 3
    assert to_rgba(viz.figures.OTHER_COLOR) not in colours.values()


# -- notebook 07's figures -----------------------------------------------------------------


def test_timelines_on_one_clock_share_the_longer_steps_axis():
    fast, slow = ddp_trace(), ddp_trace(stretch=3.0)
    figure = beyond.timelines_on_one_clock([("fast", fast), ("slow", slow)])
    limits = {axes.get_xlim() for axes in figure.axes}
    assert len(limits) == 1  # one clock
    assert "fast" in figure.axes[0].get_title() and "slow" in figure.axes[1].get_title()


def test_the_legend_of_timelines_on_one_clock_covers_no_text_and_stays_in_the_figure():
    """DataParallel (with its hatched one-thread note) over DDP with waiting, as notebook 07
    draws them: the legend beside the stack once ran into the top timeline's long x label."""
    waiting = filled(
        replace(e, details={"waiting_s": 0.5}) if e.phase == "backward" else e
        for e in ddp_trace(steps=1).events
    )
    phases = ("scatter", "replicate", "gather", "grad_scatter")  # every phase: a tall legend
    extra = [Event(p, "virtual:0 (cpu)", 10 + i, 10.5 + i, 100, 1, VIRTUAL_CPU)
             for i, p in enumerate(phases)]  # fmt: skip
    data_parallel = filled([*dp_trace(steps=1).events, *extra])
    figure = beyond.timelines_on_one_clock([("DataParallel", data_parallel), ("DDP", waiting)])
    figure_png(figure)  # lays out and paints, as the explorer does
    renderer = figure.canvas.get_renderer()
    (legend,) = figure.legends
    inside = {id(t) for t in legend.findobj(Text)}
    for axes in figure.axes:  # matplotlib keeps tick labels beyond the limits, unpainted
        low, high = axes.get_xlim()
        inside |= {
            id(t) for t in axes.xaxis.get_ticklabels() if not low <= t.get_position()[0] <= high
        }
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in figure.findobj(Text)
             if t.get_visible() and t.get_text().strip() and id(t) not in inside]  # fmt: skip
    legend_box = legend.get_window_extent(renderer)
    assert [text for text, box in boxes if box.overlaps(legend_box)] == []
    width = figure.bbox.width
    assert [text for text, box in boxes if box.x0 < -1 or box.x1 > width + 1] == []
    assert "waiting" in [t.get_text() for t in legend.get_texts()]


def test_traffic_and_memory_draws_both_engines_per_device():
    figure = beyond.traffic_and_memory(comparison())
    traffic = figure.axes[0]
    heights = sorted(round(bar.get_height()) for bar in traffic.patches)
    # DP: lane 1 moves the reduce's 4000 B, lane 0 the same; DDP: each rank 2 x 2 x 2000 B
    assert heights == [4000, 4000, 8000, 8000]


def test_bubble_figure_plots_measured_formula_and_predicted():
    rows = [{"micro_batches": m, "formula": pp.bubble_formula(2, m), "measured idle": 0.5,
             "q1": 0.4, "q3": 0.6} for m in (1, 2, 4)]  # fmt: skip
    figure = beyond.bubble_figure(rows, {4: [0.75, 0.6, 0.43]})
    labels = [t.get_text() for t in figure.axes[0].get_legend().get_texts()]
    assert any("measured" in label for label in labels)
    assert any("formula" in label for label in labels)
    assert any("predicted, p=4" in label for label in labels)


def test_the_bubble_figure_s_title_states_no_outcome():
    # at m=8 the idle share was measured above m=4's (0.42 against 0.38) under a title that
    # said the bubble shrinks: the figure names what it plots, the verdict says what happened
    rows = [{"micro_batches": m, "formula": pp.bubble_formula(2, m), "measured idle": idle,
             "q1": idle, "q3": idle} for m, idle in ((1, 0.5), (4, 0.38), (8, 0.42))]  # fmt: skip
    title = beyond.bubble_figure(rows).axes[0].get_title()
    assert unchecked_claims(title) == [] and "shrink" not in title


def test_ddp_against_data_parallel_pairs_the_steps_of_each_block():
    ddp_faster = comparison()
    ddp_faster.data_parallel_step_times = [0.010, 0.011, 0.012, 0.010, 0.011, 0.013]
    ddp_faster.ddp.step_times = [0.005, 0.006, 0.006, 0.005, 0.005, 0.007]
    conclusion = beyond.ddp_against_data_parallel(ddp_faster)
    assert conclusion.outcome is Outcome.FASTER and conclusion.rounds == 6
    assert "DDP was faster than DataParallel" in str(conclusion)
    assert check_text(str(conclusion)) == []
    ddp_faster.ddp.step_times = ddp_faster.ddp.step_times[:4]
    with pytest.raises(ValueError, match="6 DataParallel steps but 4 DDP steps"):
        beyond.ddp_against_data_parallel(ddp_faster)


def test_the_bubble_verdict_interleaves_its_rounds_and_speaks_of_sizes(monkeypatch):
    made, ran = {}, []
    idle = {1: 0.5, 8: 0.3}

    def measure(pipe, inputs, targets, repeats):
        ran.append(made[id(pipe)])
        return None, [idle[made[id(pipe)]]] * repeats

    def make(m):
        pipe = object()
        made[id(pipe)] = m
        return pipe

    monkeypatch.setattr(beyond, "measure_steps", measure)
    conclusion = beyond.bubble_against_micro_batches(make, None, None, fewer=1, more=8, rounds=5)
    assert ran == [1, 8] * 5  # one step of each per round, back to back
    assert str(conclusion).startswith("1.67x (middle half of the rounds: 1.67-1.67x) → smaller: ")
    assert "the bubble shrank" in str(conclusion)
    idle[8] = 0.6
    assert "→ larger: " in str(beyond.bubble_against_micro_batches(make, None, None, rounds=5))


# -- the explorers -------------------------------------------------------------------------


def test_ddp_explorer_starts_processes_once_per_new_count_only():
    calls = []

    def run(nproc):
        calls.append(nproc)
        return comparison(nproc)

    explorer = beyond.ddp_explorer(comparison(), run=run)
    assert calls == [] and "processes=2" in explorer.marker.value
    explorer.controls["bucket MiB"].value = 0.001
    assert "3 all-reduce(s)" in explorer.marker.value and calls == []
    explorer.controls["step"].value = 1
    explorer.controls["processes"].value = 3
    explorer.controls["processes"].value = 2
    explorer.controls["processes"].value = 3
    assert calls == [3]  # the first visit to 3 ran; going back and again did not
    assert explorer.last_png.startswith(b"\x89PNG")


def test_pipeline_explorer_measures_up_to_the_cores_and_predicts_beyond(monkeypatch):
    model = pp.mlp_blocks(32, blocks=4)
    inputs, targets = torch.randn(16, 32), torch.randint(0, 32, (16,))
    lanes = dpkit.virtual_devices(4)
    monkeypatch.setattr(beyond, "cores", lambda: 2)
    explorer = beyond.pipeline_explorer(
        lambda p, m: pp.pipeline(model, lanes[:p], micro_batches=m), inputs, targets, repeats=1
    )
    assert "micro-batches=1 stages=2" in explorer.marker.value
    assert "measured, formula 0.50" in explorer.marker.value
    explorer.controls["micro-batches"].value = 4
    assert "formula 0.20" in explorer.marker.value
    explorer.controls["stages"].value = 3
    assert "predicted" in explorer.marker.value
    assert "predicted" in explorer.last_figure.axes[0].get_title()


def test_one_step_of_a_trace_keeps_its_times_since_the_same_origin():
    parallel = dpkit.DataParallel(torch.nn.Linear(3, 2), device_ids=dpkit.virtual_devices(2))
    with dpkit.trace() as recorded:
        for _ in range(3):
            parallel(torch.randn(4, 3)).sum().backward()

    def times(trace: Trace) -> list[tuple]:
        rows = trace.rows()  # a DataFrame where pandas is installed, else dicts
        rows = rows.to_dict("records") if hasattr(rows, "to_dict") else rows
        return [(r["step"], r["phase"], r["start_s"], r["end_s"]) for r in rows]

    second = [row for row in times(recorded) if row[0] == 2]
    assert times(beyond.step_of(recorded, 2)) == second and second
