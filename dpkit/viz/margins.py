"""A timeline's margins from the few texts around its plot, measured, not laid out.

The surprise first: a constrained layout of an 8-device timeline cost more than painting it
(218 ms of a 432 ms redraw on 2 cores, ``benchmarks/widgets.py``). It measures every artist
of the figure, every bar and bar label included, twice, to learn what only the texts outside
the plot decide: the device names on the left, the legend on the right, the title above and
the tick labels and x label below. :class:`MeasuredMargins` measures those texts alone (a
millisecond) when the figure is drawn, at the size it is drawn at, and puts the plot between
them; nothing inside the plot moves a margin (bar labels and the "backward →" mark, which sits
in the title's pad, are placed to stay inside).

A device name too long for :data:`MAX_NAME_SHARE` of the width is written on two lines, broken
before its "(": ``virtual:0`` over ``(cuda:0)``; still too long, the row is labelled by its index
(the title names the hardware), so the plot keeps most of the width.

Measured sizes are remembered (:func:`text_size`, :func:`legend_width`), by what decides them:
the text, its font, angle and line spacing, the dpi and the settings that choose and hint
fonts. An explorer's redraw after a slider move changes bar lengths and x tick labels, not the
device names, legend or title, so it measures a few new tick labels, not every text.
matplotlib keeps its own measurements per renderer, and a figure of a size not drawn before
gets a new one. Placing the backward explorer's plot took 11.6 ms of an 80 ms paint before
(CPU median over its benchmark moves), 5.5-6.3 ms after, most of it now making the x ticks,
which painting would make anyway.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from typing import Any

import matplotlib
from matplotlib.figure import Figure
from matplotlib.layout_engine import LayoutEngine

MARGIN_POINTS = 6.0  # between a text and the figure's edge
MAX_NAME_SHARE = 0.3  # the widest row name may take this share of the figure's width


class MeasuredMargins(LayoutEngine):
    """Place a figure's one plot between the texts around it, measured at draw time."""

    _adjust_compatible = True  # positions are set directly; subplots_adjust may as well
    _colorbar_gridspec = False

    def set(self) -> None:  # no parameters
        pass

    def execute(self, figure: Figure) -> None:
        place_plot(figure)


def _points(pixels: float, figure: Figure) -> float:
    return pixels * 72 / figure.dpi


# The settings that choose a text's font and how its glyphs are hinted (a change of either
# changes every size measured with it).
FONT_SETTINGS = (
    "font.family", "font.sans-serif", "font.serif", "font.monospace", "font.cursive",
    "font.fantasy", "text.usetex", "text.hinting", "text.hinting_factor", "text.kerning_factor",
    "mathtext.fontset", "mathtext.fallback",
)  # fmt: skip
REMEMBERED_SIZES = 4096  # sizes kept (a course's explorers measure a few hundred texts)
_sizes: dict[Hashable, Any] = {}


def _font_settings() -> tuple[Any, ...]:
    return tuple(
        tuple(value) if isinstance(value, list) else value
        for value in (matplotlib.rcParams[name] for name in FONT_SETTINGS)
    )


def _text_key(text: Any) -> Hashable:
    """What a text's size depends on: its string, font, angle, line spacing and math."""
    return (
        text.get_text(),
        hash(text.get_fontproperties()),  # FontProperties compare by this hash too
        text.get_rotation(),
        text.get_linespacing(),
        text.get_usetex(),
        getattr(text, "_parse_math", True),
    )


def _remembered(key: Hashable, measure: Any) -> Any:
    if key not in _sizes:
        if len(_sizes) >= REMEMBERED_SIZES:
            _sizes.pop(next(iter(_sizes)))  # the oldest
        _sizes[key] = measure()
    return _sizes[key]


def text_size(text: Any, renderer: Any, figure: Figure) -> tuple[float, float]:
    """Width and height of ``text`` in points (0, 0 when hidden or empty), measured once for
    each text, font and dpi (a wrapped text, whose width depends on where it sits, always)."""
    if text is None or not text.get_visible() or not text.get_text():
        return 0.0, 0.0

    def measure() -> tuple[float, float]:
        box = text.get_window_extent(renderer)
        return _points(box.width, figure), _points(box.height, figure)

    if text.get_wrap():
        return measure()
    return _remembered(("text", _text_key(text), figure.dpi, _font_settings()), measure)


def legend_width(legend: Any, renderer: Any, figure: Figure) -> float:
    """A legend's width in points, measured once for each set of entries, title and spacing."""
    key = (
        "legend",
        tuple(_text_key(t) for t in legend.get_texts()),
        _text_key(legend.get_title()) if legend.get_title().get_visible() else None,
        tuple(type(h).__name__ for h in legend.legend_handles),
        legend._ncols,
        legend._mode,  # "expand" spans the plot's width
        legend._fontsize,
        legend.handlelength,
        legend.handletextpad,
        legend.borderpad,
        legend.columnspacing,
        legend.markerscale,
        figure.dpi,
        _font_settings(),
    )
    return _remembered(key, lambda: _points(legend.get_window_extent(renderer).width, figure))


def _row_names_fit(axes: Any, renderer: Any, figure: Figure) -> float:
    """The width of the widest row name in points, shortened first where it is too wide."""
    axis = axes.yaxis
    limit = MAX_NAME_SHARE * figure.get_figwidth() * 72

    def widest() -> float:
        labels = axis.get_ticklabels() + axis.get_ticklabels(minor=True)
        return max((text_size(t, renderer, figure)[0] for t in labels), default=0.0)

    width = widest()
    if width <= limit:
        return width
    names = [t.get_text() for t in axis.get_ticklabels()]
    ticks = list(axis.get_ticklocs())
    axis.set_ticks(ticks, [name.replace(" (", "\n(", 1) for name in names])
    width = widest()
    if width <= limit:
        return width
    indices = [m.group(1) if (m := re.search(r":(\d+)", n)) else str(i) for i, n in
               enumerate(names)]  # fmt: skip
    axis.set_ticks(ticks, indices)
    if not axis.get_label_text():
        axis.set_label_text("device index")
    return widest()


def place_plot(figure: Figure) -> None:
    """Set the position of ``figure``'s first axes from the texts around it (in points):
    left, the row names and y label; right, a legend placed beside the plot; above, the
    title and its pad; below, the x tick labels and x label."""
    axes = figure.axes[0]
    renderer = figure._get_renderer()
    width, height = figure.get_figwidth() * 72, figure.get_figheight() * 72

    def size(text: Any) -> tuple[float, float]:
        return text_size(text, renderer, figure)

    ticks = axes.yaxis.get_major_ticks()
    tick_space = (ticks[0].get_tick_padding() + ticks[0].get_pad()) if ticks else 0.0
    left = MARGIN_POINTS + _row_names_fit(axes, renderer, figure) + tick_space
    if axes.yaxis.get_label_text():
        left += size(axes.yaxis.label)[1] + axes.yaxis.labelpad

    legend = axes.get_legend()
    right = MARGIN_POINTS
    if legend is not None and legend.get_visible():
        # anchored at x=1.01 of the plot: its width and that gap, one share of the plot's
        right += legend_width(legend, renderer, figure) + 0.01 * width

    x_ticks = axes.xaxis.get_major_ticks()
    x_tick_space = (x_ticks[0].get_tick_padding() + x_ticks[0].get_pad()) if x_ticks else 0.0
    x_tick_height = max((size(t)[1] for t in axes.xaxis.get_ticklabels()), default=0.0)
    bottom = MARGIN_POINTS + x_tick_space + x_tick_height
    if axes.get_xlabel():
        bottom += size(axes.xaxis.label)[1] + axes.xaxis.labelpad

    top = MARGIN_POINTS + size(axes.title)[1] + _title_pad(axes)

    axes.set_position(
        (left / width, bottom / height, 1 - (left + right) / width, 1 - (top + bottom) / height)
    )


def _title_pad(axes: Any) -> float:
    """The points between the plot's top and its title (``set_title(pad=...)``)."""
    offset = axes.titleOffsetTrans.get_matrix()[1, 2]  # in pixels at the figure's dpi
    return _points(offset, axes.figure)
