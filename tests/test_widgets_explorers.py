"""What every explorer owes a learner at any slider setting (issue 28, "Explorers").

- At one device DataParallel calls the module itself: the figure still shows that device's
  work and says so in one sentence (the trace alone held a 0.009 ms scatter).
- A figure's step number is the trace's own, and it is the step the notebook's text names.
- Text does not sit on text, and a note does not sit on bars; a legend names only what can
  be seen; a line of the scaling figure hidden under another is not named on its own.
- benchmarks/widgets.py times every explorer the course shows.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import nbformat
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.legend import Legend
from matplotlib.text import Text

from dpkit import viz
from dpkit.ddp import Comparison, DDPResult
from dpkit.device import VIRTUAL_CPU
from dpkit.tracing import RANK, Event, Trace
from dpkit.viz import beyond, scaling
from dpkit.viz.common import ONE_DEVICE
from dpkit.viz.explorer import figure_png

pytest.importorskip("ipywidgets")

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def _drawn_phases(figure) -> set[str]:
    """The phases with a bar in a timeline figure (each bar a labelled PolyCollection)."""
    return {
        c.get_label()
        for axes in figure.axes
        for c in axes.collections
        if isinstance(c, PolyCollection)
    }


def _all_text(figure) -> str:
    return "\n".join(t.get_text() for t in figure.findobj(Text))


# -- one device --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "phases"),
    [(viz.timeline_explorer, {"apply"}), (viz.backward_explorer, {"apply", "backward"})],
)
def test_at_one_device_the_timeline_shows_the_modules_own_work_and_says_why(make, phases):
    explorer = make(devices=2, batch=64)
    assert ONE_DEVICE not in _all_text(explorer.last_figure)
    explorer.controls["devices"].value = 1
    figure = explorer.last_figure
    assert phases <= _drawn_phases(figure)
    applies = [e for e in explorer.last_data.events if e.phase == "apply" and e.step == 2]
    assert len(applies) == 1 and applies[0].duration > 0
    assert ONE_DEVICE in figure.axes[0].get_title()
    assert ONE_DEVICE in explorer.marker.value


def test_at_one_device_the_memory_explorer_shows_what_the_device_holds():
    explorer = viz.memory_explorer(devices=1, batch=64)
    held = viz.held_per_device(explorer.last_data)
    assert list(held) == [explorer.last_data.output_device.name]
    categories = {r.category for r in explorer.last_data.memory}
    assert {"parameters", "activations", "outputs"} <= categories
    assert ONE_DEVICE in explorer.last_figure.axes[0].get_title()
    assert ONE_DEVICE in explorer.marker.value


@pytest.mark.parametrize(
    "make",
    [
        lambda: viz.split_explorer(),
        lambda: viz.replication_explorer(),
        lambda: scaling.scaling_explorer(devices=2),
    ],
    ids=["split", "replication", "scaling"],
)
def test_every_device_slider_at_one_says_what_dataparallel_does_there(make):
    explorer = make()
    explorer.controls["devices"].value = 2
    assert ONE_DEVICE not in _all_text(explorer.last_figure)
    explorer.controls["devices"].value = 1
    assert ONE_DEVICE in _all_text(explorer.last_figure)


def test_the_ddp_explorer_at_one_process_draws_both_sides_and_says_what_each_does():
    lane = "virtual:0 (cpu)"  # what DataParallel records on one device (test_trace.py)
    one_device = [Event("scatter", lane, 10.0, 10.1, 100, 1, VIRTUAL_CPU),
                  Event("apply", lane, 10.1, 11, 0, 1, VIRTUAL_CPU),
                  Event("backward", lane, 11, 13, 0, 1, VIRTUAL_CPU)]  # fmt: skip
    comparisons = {n: _ddp_comparison(n) for n in (1, 2)}
    comparisons[1].data_parallel = _filled(one_device)
    explorer = beyond.ddp_explorer(comparisons[2], run=comparisons.__getitem__)
    assert beyond.ONE_PROCESS not in explorer.marker.value
    explorer.controls["processes"].value = 1
    figure = explorer.last_figure
    assert beyond.ONE_PROCESS in explorer.marker.value
    assert ONE_DEVICE in figure.axes[0].get_title()
    assert {"apply", "backward"} <= _drawn_phases(figure)


# -- one step numbering ------------------------------------------------------------------


def _markdown(notebook: str) -> str:
    cells = nbformat.read(NOTEBOOKS / notebook, as_version=4).cells
    return "\n".join(c.source for c in cells if c.cell_type == "markdown")


@pytest.mark.parametrize(
    ("make", "notebook"),
    [
        (viz.timeline_explorer, "03_parallel_apply.ipynb"),
        (viz.backward_explorer, "05_training.ipynb"),
    ],
)
def test_the_title_names_the_second_step_the_notebook_says_is_drawn(make, notebook):
    assert "draws the second" in " ".join(_markdown(notebook).split())
    explorer = make(devices=2, batch=64)
    steps = sorted({e.step for e in explorer.last_data.events})
    assert steps == [1, 2]  # the trace's own numbers: the second step is step 2
    assert explorer.last_figure.axes[0].get_title().startswith("Timeline of step 2 ")


# -- no text on text, no note on bars ----------------------------------------------------


def _filled(events) -> Trace:
    trace = Trace()
    trace._events, trace._memory = list(events), []
    return trace


def _dataparallel_step(step: int, devices: int = 2) -> list[Event]:
    """Every phase of a DataParallel training step on CPU lanes, at made-up times."""
    t, events = step * 10.0, []
    for lane in range(devices):
        name = f"virtual:{lane} (cpu)"
        events += [
            Event("scatter", name, t, t + 0.1, 100, step, VIRTUAL_CPU),
            Event("replicate", name, t + 0.1, t + 0.6, 100, step, VIRTUAL_CPU),
            Event("apply", name, t + 0.6, t + 2, 0, step, VIRTUAL_CPU),
            Event("gather", name, t + 2, t + 2.1, 100, step, VIRTUAL_CPU),
            Event("grad_scatter", name, t + 2.2, t + 2.3, 100, step, VIRTUAL_CPU),
            Event("backward", name, t + 2.3, t + 5, 0, step, VIRTUAL_CPU),
        ]
    events.append(Event("reduce", "virtual:1 (cpu)", t + 5, t + 6, 100, step, VIRTUAL_CPU))
    return events


def _ddp_step(step: int, ranks: int = 2) -> list[Event]:
    t, events = step * 10.0, []
    for rank in range(ranks):
        name = f"rank:{rank} (cpu)"
        events += [
            Event("apply", name, t, t + 1, 0, step, RANK),
            Event("backward", name, t + 1, t + 4, 0, step, RANK),
            Event("allreduce", name, t + 2, t + 4.5, 4000, step, RANK, {"bucket": 0}),
            Event("optimizer", name, t + 5, t + 5.5, 0, step, RANK),
        ]
    return events


def _ddp_comparison(nproc: int = 2) -> Comparison:
    def result(cap: float) -> DDPResult:
        trace = _filled(_ddp_step(1, nproc) + _ddp_step(2, nproc))
        return DDPResult(trace, nproc, "gloo", 8, cap, 4000, [0.005, 0.004], [1, 2], None)

    data_parallel = _filled(_dataparallel_step(1, nproc) + _dataparallel_step(2, nproc))
    return Comparison(nproc, 8, 1, data_parallel, [0.006, 0.007], result(25.0), [result(0.001)])


def _boxes(figure, monkeypatch) -> tuple[list, list]:
    """The painted figure's text boxes (a legend counts as one box) and its bars' boxes."""
    drawn = []  # the texts painted (a tick label outside the view is kept but not drawn)
    draw = Text.draw
    monkeypatch.setattr(Text, "draw", lambda text, renderer: (drawn.append(text),
                                                              draw(text, renderer))[1])  # fmt: skip
    figure_png(figure)  # lays the figure out and paints it, as the explorer shows it
    monkeypatch.setattr(Text, "draw", draw)
    renderer = figure.canvas.get_renderer()
    legends = list(figure.findobj(Legend))
    in_legend = {id(t) for legend in legends for t in legend.findobj(Text)}
    texts = [
        (t.get_text(), t.get_window_extent(renderer))
        for t in drawn
        if t.get_text().strip() and id(t) not in in_legend
        and t.get_in_layout()  # a bar's own label sits on its bar, by design
    ]  # fmt: skip
    texts += [(f"legend {i}", legend.get_window_extent(renderer)) for i, legend in
              enumerate(legends)]  # fmt: skip
    bars = [
        (c.get_label(), path.get_extents(c.get_transform()))
        for axes in figure.axes
        for c in axes.collections
        if isinstance(c, PolyCollection)
        for path in c.get_paths()
    ]
    return texts, bars


def _overlapping(boxes_a, boxes_b=None) -> list[tuple[str, str]]:
    pairs = itertools.combinations(boxes_a, 2) if boxes_b is None else (
        itertools.product(boxes_a, boxes_b))  # fmt: skip
    return [
        (a, b)
        for (a, box_a), (b, box_b) in pairs
        if min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0) > 1  # > 1 px both ways
        and min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0) > 1
    ]


@pytest.mark.parametrize("step", [1, 2])
def test_no_text_of_the_ddp_explorers_figure_sits_on_other_text_or_on_bars(step, monkeypatch):
    explorer = beyond.ddp_explorer(_ddp_comparison(), run=lambda n: _ddp_comparison(n))
    explorer.controls["step"].value = step
    texts, bars = _boxes(explorer.last_figure, monkeypatch)
    assert any("hatched: one thread ran all 2 backwards" in t for t, _ in texts)
    assert _overlapping(texts) == []
    assert _overlapping(texts, bars) == []


@pytest.mark.parametrize("stages", [1, 2])
def test_no_text_of_the_pipeline_explorers_figure_sits_on_other_text_or_on_bars(
    stages, monkeypatch
):
    from dpkit import pipeline as pp

    def measured(pipe, inputs, targets, repeats):  # backward from a third of the step on
        events = []
        for stage in range(stages):
            name = f"virtual:{stage} (cpu)"
            events += [
                Event("apply", name, 0.001 * stage, 0.001 * (stage + 1), 0, 1, VIRTUAL_CPU),
                Event("backward", name, 0.004 - 0.001 * stage, 0.006, 0, 1, VIRTUAL_CPU),
            ]
        return _filled(events), [0.3] * repeats

    monkeypatch.setattr(pp, "measure_steps", measured)
    explorer = beyond.pipeline_explorer(lambda p, m: None, None, None, repeats=1)
    explorer.controls["stages"].value = stages
    texts, bars = _boxes(explorer.last_figure, monkeypatch)
    assert any(t.startswith("backward") for t, _ in texts)
    assert _overlapping(texts) == []
    assert _overlapping(texts, bars) == []


SETTINGS = {
    "timeline": (viz.timeline_explorer, [("devices", 1), ("devices", 2), ("devices", 8),
                                         ("batch", 8), ("batch", 2048)]),
    "backward": (viz.backward_explorer, [("devices", 1), ("devices", 2), ("devices", 8),
                                         ("batch", 8), ("batch", 2048)]),
    "memory": (viz.memory_explorer, [("devices", 1), ("devices", 2), ("devices", 8),
                                     ("loss", "inside"), ("batch", 8), ("batch", 1024)]),
    "split": (viz.split_explorer, [("devices", 1), ("devices", 2), ("devices", 16),
                                   ("batch", 512), ("batch", 1)]),
    "replication": (viz.replication_explorer, [("devices", 1), ("devices", 2), ("devices", 9),
                                               ("devices", 16), ("width", 2048)]),
    "scaling": (scaling.scaling_explorer, [("devices", 1), ("devices", 2), ("devices", 16),
                                           ("devices", 64), ("batch", 16), ("batch", 8192)]),
}  # fmt: skip


@pytest.mark.parametrize("name", list(SETTINGS))
def test_no_text_sits_on_other_text_or_on_bars_at_the_sliders_ends(name, monkeypatch):
    make, moves = SETTINGS[name]
    explorer = make()
    for label, value in moves:
        explorer.controls[label].value = value
        texts, bars = _boxes(explorer.last_figure, monkeypatch)
        assert (explorer.values, _overlapping(texts)) == (explorer.values, [])
        assert (explorer.values, _overlapping(texts, bars)) == (explorer.values, [])


# -- a legend names only what can be seen ------------------------------------------------


def test_the_memory_legend_names_only_categories_whose_bars_can_be_seen():
    explorer = viz.memory_explorer(devices=4, batch=256)
    explorer.controls["loss"].value = "inside"  # outputs and gathered: a few bytes each
    figure = explorer.last_figure
    figure_png(figure)
    axes = figure.axes[0]
    tallest = {
        container.get_label(): max(bar.get_window_extent().height for bar in container)
        for container in axes.containers
    }
    listed = [t.get_text() for t in axes.get_legend().get_texts()]
    assert listed and all(tallest[category] >= 1 for category in listed)  # pixels
    unseen = [category.lstrip("_") for category, px in tallest.items() if px < 1]
    assert {"outputs", "gathered"} <= set(unseen)
    assert all(category in axes.get_xlabel() for category in unseen)


def test_the_split_legend_names_idle_devices_only_when_some_are_idle():
    explorer = viz.split_explorer()
    explorer.controls["batch"].value = 3  # more devices than rows
    legend_text = _all_text(explorer.last_figure)
    assert "idle: no chunk" in legend_text
    explorer.controls["batch"].value = 512
    assert "idle: no chunk" not in _all_text(explorer.last_figure)


def test_the_scaling_figure_names_each_visible_line_once_and_marks_assumed_nodes():
    machines = ("2x8xA100-IB-HDR", "2x8xA100-100GbE", "2x8xA100-10GbE")
    rows = scaling.scaling_rows("wide-mlp", 64, (1, 2, 8, 16, 32), machines)
    axes = scaling.scaling_figure(rows).axes[0]
    labels = [t.get_text() for t in axes.get_legend().get_texts()]
    # DataParallel is one node: the same on all three machines, drawn and named once
    assert [label for label in labels if label.startswith("DataParallel")] == [
        "DataParallel, the 3 machines alike"
    ]
    assert len(labels) == 4
    lines = [line for line in axes.get_lines() if not line.get_label().startswith("_")]
    for line in lines:
        devices = list(line.get_xdata())
        if line.get_label().startswith("DataParallel"):
            assert max(devices) <= 8
    hollow = [
        line for line in axes.get_lines()
        if line.get_markerfacecolor() == "white" and len(line.get_xdata())
    ]  # fmt: skip
    assert {x for line in hollow for x in line.get_xdata()} == {32}  # past 2 x 8 devices
    assert "hollow" in axes.get_xlabel()


# -- every explorer is timed -------------------------------------------------------------


def test_the_redraw_benchmark_times_every_explorer_the_course_shows():
    from benchmarks import widgets

    exported = {
        name for names in viz._LAZY_EXPORTS.values() for name in names
        if name.endswith("_explorer")
    }  # fmt: skip
    timed = {widgets.EXPLORERS[name].factory for name in widgets.EXPLORERS}
    assert exported == timed
    assert all(widgets.EXPLORERS[name].goal_median_ms > 0 for name in widgets.EXPLORERS)
