"""A timeline places its plot from the texts around it (dpkit.viz.margins), with no layout
pass: every text must still be inside the figure, none on another, at every device count the
explorers offer and with device names longer than the course's.

The traces are built here event by event (every phase of a DataParallel training step), so
the test needs no measurement; the figure is painted as an explorer paints it.
"""

from __future__ import annotations

import itertools

import pytest
from matplotlib.legend import Legend
from matplotlib.text import Text

from dpkit.device import VIRTUAL_CPU
from dpkit.tracing import Event, Trace
from dpkit.viz import margins
from dpkit.viz.common import notebook_timeline
from dpkit.viz.explorer import figure_png
from dpkit.viz.figures import timeline

COURSE_NAME = "virtual:{} (cpu)"
LONG_NAME = "virtual-lane:{} (cuda:{}, H200 141GB)"  # too wide for one line beside the plot
VERY_LONG_NAME = "a-lane-whose-name-goes-on-and-on-and-on:{} (cuda:{}, NVIDIA H200 141GB)"


def _trace(devices: int, name: str) -> Trace:
    """Two steps of every phase of DataParallel training on ``devices`` lanes."""
    events = []
    for step in (1, 2):
        t = step * 10.0
        for lane in range(devices):
            device = name.format(lane, lane)
            events += [
                Event("scatter", device, t, t + 0.1, 100, step, VIRTUAL_CPU),
                Event("replicate", device, t + 0.1, t + 0.6, 100, step, VIRTUAL_CPU),
                Event(
                    "apply", device, t + 0.6 + 0.2 * lane, t + 2 + 0.2 * lane, 0, step, VIRTUAL_CPU
                ),  # fmt: skip
                Event("gather", device, t + 3.6, t + 3.7, 100, step, VIRTUAL_CPU),
                Event("grad_scatter", device, t + 3.8, t + 3.9, 100, step, VIRTUAL_CPU),
                Event("backward", device, t + 3.9, t + 6, 0, step, VIRTUAL_CPU),
            ]
        events.append(Event("reduce", name.format(0, 0), t + 6, t + 7, 100, step, VIRTUAL_CPU))
    trace = Trace()
    trace._events, trace._memory = events, []
    return trace


def _painted_texts(figure) -> list[tuple[str, object]]:
    """The texts painted outside the plot (tick labels, labels, title, marks) and each legend,
    as window boxes; a bar's own label sits on its bar by design and is left out."""
    figure_png(figure)  # lays out (here: measures the margins) and paints, as an explorer
    renderer = figure.canvas.get_renderer()
    legends = list(figure.findobj(Legend))
    in_legend = {id(t) for legend in legends for t in legend.findobj(Text)}
    axes = figure.axes[0]
    low, high = axes.get_xlim()
    texts = [
        (t.get_text(), t.get_window_extent(renderer))
        for t in figure.findobj(Text)
        if t.get_visible() and t.get_text().strip() and id(t) not in in_legend
        and t.get_in_layout() and t not in axes.xaxis.get_ticklabels(minor=True)
        and not (t in axes.xaxis.get_ticklabels() and not low <= t.get_position()[0] <= high)
    ]  # fmt: skip
    return texts + [(f"legend {i}", legend.get_window_extent(renderer)) for i, legend in
                    enumerate(legends)]  # fmt: skip


CASES = [(1, COURSE_NAME), (4, COURSE_NAME), (8, COURSE_NAME), (4, LONG_NAME),
         (8, VERY_LONG_NAME)]  # fmt: skip


@pytest.mark.parametrize(("devices", "name"), CASES)
@pytest.mark.parametrize("draw", [notebook_timeline, timeline])
def test_every_text_of_a_timeline_is_inside_the_figure_and_on_no_other(devices, name, draw):
    figure = draw(_trace(devices, name))
    texts = _painted_texts(figure)
    width, height = figure.bbox.width, figure.bbox.height
    outside = [t for t, box in texts if box.x0 < -1 or box.y0 < -1 or box.x1 > width + 1
               or box.y1 > height + 1]  # fmt: skip
    assert outside == []
    overlapping = [
        (a, b)
        for (a, box_a), (b, box_b) in itertools.combinations(texts, 2)
        if min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0) > 1
        and min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0) > 1
    ]
    assert overlapping == []


def test_the_plot_keeps_most_of_the_width_however_long_the_device_names():
    for name, expected in ((COURSE_NAME, "virtual:0 (cpu)"), (LONG_NAME, "virtual-lane:0\n(cuda:0"),
                           (VERY_LONG_NAME, "0")):  # fmt: skip
        figure = notebook_timeline(_trace(4, name))
        figure_png(figure)
        axes = figure.axes[0]
        assert axes.get_position().width > 0.5
        assert axes.yaxis.get_ticklabels()[0].get_text().startswith(expected)
    assert axes.get_ylabel() == "device index"  # said where rows are numbers only


def test_a_timeline_is_not_laid_out_by_a_constrained_layout():
    """The redraw's cost: a constrained layout measured every bar, twice (218 ms at 8
    devices); the timeline's margins come from its few texts."""
    figure = notebook_timeline(_trace(8, COURSE_NAME))
    assert isinstance(figure.get_layout_engine(), margins.MeasuredMargins)


def _left_margin(figure) -> float:
    figure_png(figure)
    return figure.axes[0].get_position().x0


def test_a_redraw_with_the_same_texts_measures_none_of_them(monkeypatch):
    """An explorer's move changes bars, not the names, legend or title: their sizes are
    remembered (13 of an 82 ms paint went into measuring them again at every move)."""
    figure_png(notebook_timeline(_trace(4, COURSE_NAME)))
    measured = []
    for cls in (Text, Legend):
        original = cls.get_window_extent

        def counting(self, *args, _original=original, **kwargs):
            measured.append(self)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(cls, "get_window_extent", counting)
    figure = notebook_timeline(_trace(4, COURSE_NAME))
    margins.place_plot(figure)
    assert measured == []


def test_margins_follow_a_change_of_font_that_leaves_the_texts_as_they_were():
    """The remembered sizes are keyed by the font settings too: the same names in a wider
    font get a wider margin, the one a fresh measurement gives."""
    import matplotlib

    narrow = _left_margin(notebook_timeline(_trace(4, COURSE_NAME)))
    with matplotlib.rc_context({"font.sans-serif": ["DejaVu Sans Mono"]}):
        wide = _left_margin(notebook_timeline(_trace(4, COURSE_NAME)))
        margins._sizes.clear()
        fresh = _left_margin(notebook_timeline(_trace(4, COURSE_NAME)))
    assert wide == fresh > narrow
