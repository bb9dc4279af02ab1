"""The widget layer every explorer shares: controls over a figure, redrawn as they move.

An :class:`Explorer` computes data from its controls' values, draws it into a matplotlib
figure, shows the figure as a PNG in an ``ipywidgets.Image`` and then updates a one-line
marker naming what is shown (a label with CSS class ``dpkit-marker``: the browser test
waits for it before comparing images). In a text-only view the explorer shows the marker.
Under the image, a collapsed "Text description of the figure" holds its text alternative
(:mod:`dpkit.viz.alt_text`: the title and what the figure shows), for a screen reader.

The surprise first: a redraw's time goes into matplotlib, not into the PNG encoder.
``savefig`` draws a constrained-layout figure twice (once to lay it out, once to paint it),
and the layout alone, which measures every tick label and title, costs as much as the
painting. So an explorer paints each figure once, on a canvas it keeps for figures of that
size (with its renderer, which holds matplotlib's text measurements), and remembers the
layout it computed: the next figure with the same decorations (the same size, titles, legend
entries and tick-label lengths; a batch slider moved, say) takes the remembered positions
instead of laying itself out again. ``benchmarks/widgets.py`` measures what each step saves.

The worst redraws were not drawing at all but Python's full garbage collection, which walks
every object the kernel holds (torch, matplotlib and ipywidgets alone: about 230,000) and
paused a redraw for about 100 ms every dozen moves. So each explorer, once its first
computation has run, collects and freezes what is alive then (:func:`gc.freeze`): the modules
that computation imported and the caches it filled (the scaling explorer's cost model alone
imports 120,000 objects' worth of torch and sympy, which full collections walked on every later
move: 217 ms of a 410 ms move) leave the collector's passes, and a second collection, of almost
nothing, makes the next full collections come early and short: each then walks the few
thousand objects a redraw leaves in reference cycles (a matplotlib figure), not the kernel.
The price: an object alive at that moment that later becomes part of unreachable reference
cycles is never freed (Python frees it only through the collector; most objects, freed by
reference counting, are unaffected): the first computation's data, and any object the
kernel's earlier cells left in cycles.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Hashable, Sequence
from io import BytesIO
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.layout_engine import ConstrainedLayoutEngine

from dpkit.viz.alt_text import alt_text_html, figure_alt_text

# zlib level 1: the image is a few tens of KB either way; level 6 (the default) costs more
# time for a few percent fewer bytes.
PNG_OPTIONS = {"compress_level": 1}
# Canvases an explorer keeps, one per figure size (a renderer of a 7 x 5 inch figure at 90 dpi
# holds 1.1 MB of pixels): as many sizes as a device slider's usual stops.
CANVASES_KEPT = 8


def figure_png(figure: Figure, canvas: FigureCanvasAgg | None = None) -> bytes:
    """The figure as PNG bytes (for an ``ipywidgets.Image`` or a test), painted once.

    ``canvas``: a canvas to paint on, kept between figures so that its renderer and the text
    measurements cached for it are reused (default: a new one).
    """
    if canvas is None:
        canvas = FigureCanvasAgg(figure)
    else:
        canvas.figure = figure
        figure.set_canvas(canvas)
    buffer = BytesIO()
    canvas.print_png(buffer, pil_kwargs=PNG_OPTIONS)
    FigureCanvasAgg(figure)  # its own canvas again: a later savefig must not paint the next one
    return buffer.getvalue()


# --------------------------------------------------------------------------------------
# Remembering a constrained layout


def _text_lines(text: Any) -> int:
    """How many lines a title or label takes (0 when empty): its height in the layout."""
    content = text.get_text() if text is not None else ""
    return content.count("\n") + 1 if content else 0


def _tick_label_length(axis: Any) -> tuple[int, float]:
    """The longest tick label the axis will draw (in characters), and their font size.

    Read from the axis's locator and formatter without drawing anything.
    """
    locations = axis.get_major_locator()()
    low, high = sorted(axis.get_view_interval())
    shown = [loc for loc in locations if low <= loc <= high] or list(locations)
    labels = axis.get_major_formatter().format_ticks(shown) if shown else []
    size = axis.get_ticklabels()[0].get_fontsize() if axis.get_ticklabels() else 0.0
    longest = max((len(label) for label in labels), default=0)
    return (longest if axis.get_visible() else 0), size


def _tick_label_height(axis: Any) -> tuple[bool, float, float]:
    """What sets the height of an x axis's tick labels: shown, font size and rotation."""
    labels = axis.get_ticklabels()
    first = labels[0] if labels else None
    return (
        axis.get_visible(),
        first.get_fontsize() if first else 0.0,
        first.get_rotation() if first else 0.0,
    )


def layout_signature(figure: Figure) -> Hashable | None:
    """What a constrained layout of ``figure`` depends on, read without drawing; None when the
    figure has no constrained layout to remember.

    Two figures with the same signature get the same layout: the same size, the same axes
    grid, the same number of lines in every title and label, the same entries in every legend
    beside an axes, y tick labels of the same length and x tick labels of the same font size
    and angle. Centred text (a title, an x label, the x tick labels, a legend below the plot)
    moves no margin by its length, only by its height, so its length is left out.
    """
    if not isinstance(figure.get_layout_engine(), ConstrainedLayoutEngine):
        return None
    axes_parts = []
    for axes in figure.axes:
        legend = axes.get_legend()
        axes_parts.append(
            (
                tuple(axes.get_position(original=True).bounds),
                _tick_label_length(axes.yaxis),
                _tick_label_height(axes.xaxis),
                _text_lines(axes.title),
                _text_lines(axes.xaxis.label),
                _text_lines(axes.yaxis.label),
                tuple(t.get_text() for t in legend.get_texts()) if legend else (),
                _text_lines(legend.get_title()) if legend else 0,
            )
        )
    return (
        tuple(figure.get_size_inches()),
        figure.dpi,
        tuple(axes_parts),
        tuple(len(legend.get_texts()) for legend in figure.legends),
        tuple(_text_lines(text) for text in figure.texts),
    )


class LayoutMemory:
    """Constrained layouts computed once and reused for figures with the same signature.

    ``apply(figure, signature)`` before painting: if a figure with the same
    :func:`layout_signature` was laid out before, its axes and figure texts take the remembered
    positions and the figure's layout engine is switched off (painting is then the only pass);
    returns whether it did. ``remember(figure, signature)`` after painting a figure that laid
    itself out.
    """

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self._layouts: dict[Hashable, Any] = {}
        self.hits = self.misses = 0

    def apply(self, figure: Figure, signature: Hashable | None) -> bool:
        saved = self._layouts.get(signature) if signature is not None else None
        if saved is None:
            self.misses += signature is not None
            return False
        axes_positions, text_placements = saved
        figure.set_layout_engine("none")
        for axes, position in zip(figure.axes, axes_positions):
            axes.set_position(position)
        for text, (position, alignment) in zip(figure.texts, text_placements):
            text.set_position(position)
            text.set_verticalalignment(alignment)
        self.hits += 1
        return True

    def remember(self, figure: Figure, signature: Hashable | None) -> None:
        if signature is None:
            return
        if len(self._layouts) >= self.capacity:
            self._layouts.pop(next(iter(self._layouts)))
        self._layouts[signature] = (
            [axes.get_position() for axes in figure.axes],
            [(text.get_position(), text.get_verticalalignment()) for text in figure.texts],
        )


def render(figure: Figure, canvas: FigureCanvasAgg, layouts: LayoutMemory | None) -> bytes:
    """Paint ``figure`` once to PNG, with a remembered layout where ``layouts`` has one."""
    if layouts is None:
        return figure_png(figure, canvas)
    signature = layout_signature(figure)
    if layouts.apply(figure, signature):
        return figure_png(figure, canvas)
    png = figure_png(figure, canvas)  # lays the figure out as it paints it
    layouts.remember(figure, signature)
    return png


# --------------------------------------------------------------------------------------
# Controls and the explorer


def int_slider(label: str, value: int, low: int, high: int, step: int = 1) -> Any:
    """An IntSlider that redraws once on release, labelled ``label`` (tests find it by it)."""
    import ipywidgets as widgets

    return widgets.IntSlider(
        value=value,
        min=low,
        max=high,
        step=step,
        description=label,
        continuous_update=False,
        style={"description_width": "initial"},
    )


def drawn_marker(_data: Any, values: dict[str, Any]) -> str:
    """The default marker: ``drawn: devices=4 batch=256``."""
    return "drawn: " + " ".join(f"{label}={value}" for label, value in values.items())


def _freeze_what_is_alive() -> None:
    """Move the objects alive now out of the collector's full passes, then collect again:
    Python starts a full collection only once the objects that survived the last one have
    grown by a quarter, and after this one that is a handful, so full collections come every
    few moves and walk only what those moves left behind."""
    gc.collect()
    gc.freeze()
    gc.collect()


class Explorer:
    """Controls over a figure: ``compute(**values)`` -> data, ``draw(data)`` -> figure.

    Values are keyed by each control's label (its ``description``). ``.widget`` is the box to
    display (a cell ending in the explorer shows it); ``.controls[label].value = ...``
    redraws as a slider move does; ``.last_data``, ``.last_figure`` and ``.last_png`` hold
    what is shown; ``.marker`` is the line naming it, ``marker(data, values)`` its text;
    ``.alt_text`` is the figure's text alternative, shown in ``.description`` under the image.
    ``busy(values)``, if given, says what a slow computation is doing (the marker shows it
    until the figure is drawn). ``.layouts`` remembers the figures' layouts
    (``reuse_layout=False``: lay out every figure).
    """

    def __init__(
        self,
        controls: Sequence[Any],
        compute: Callable[..., Any],
        draw: Callable[[Any], Figure],
        marker: Callable[[Any, dict[str, Any]], str] = drawn_marker,
        reuse_layout: bool = True,
        busy: Callable[[dict[str, Any]], str | None] | None = None,
    ) -> None:
        import ipywidgets as widgets

        self.controls: dict[str, Any] = {control.description: control for control in controls}
        self._compute, self._draw, self._describe = compute, draw, marker
        self._busy = busy  # what the marker says while a long computation runs, if anything
        self.layouts = LayoutMemory() if reuse_layout else None
        self._canvases: dict[tuple[float, float, float], FigureCanvasAgg] = {}
        self.image = widgets.Image(format="png", layout=widgets.Layout(max_width="100%"))
        self.marker = widgets.Label(layout=widgets.Layout(width="auto"))
        self.marker.add_class("dpkit-marker")
        self.description = widgets.HTML()  # the image's text alternative (Image has no alt)
        self.alt_text = ""
        rows = [widgets.HBox(list(controls[i : i + 2])) for i in range(0, len(controls), 2)]
        self.widget = widgets.VBox([*rows, self.marker, self.image, self.description])
        self.last_data: Any = None
        self.last_figure: Figure | None = None
        self.last_png = b""
        self._frozen = False
        for control in controls:
            control.observe(lambda _change: self.update(), names="value")
        self.update()

    @property
    def values(self) -> dict[str, Any]:
        return {label: control.value for label, control in self.controls.items()}

    def update(self) -> None:
        """Recompute and redraw from the controls' values; the marker changes last."""
        values = self.values
        waiting = self._busy(values) if self._busy is not None else None
        if waiting:  # shown at once: the browser gets the new value before compute returns
            self.marker.value = waiting
        self.last_data = self._compute(**values)
        if not self._frozen:  # after the first computation: what it imported and cached
            self._frozen = True
            _freeze_what_is_alive()
        self.last_figure = self._draw(self.last_data)
        self.last_png = render(self.last_figure, self._canvas_for(self.last_figure), self.layouts)
        # Shown at its own size: stretched to the cell's width it would blur.
        self.image.layout.width = (
            f"{round(self.last_figure.get_figwidth() * self.last_figure.dpi)}px"
        )
        self.image.value = self.last_png
        self.alt_text = figure_alt_text(self.last_figure)
        self.description.value = alt_text_html(self.alt_text)
        self.marker.value = self._describe(self.last_data, values)

    def _canvas_for(self, figure: Figure) -> FigureCanvasAgg:
        """A canvas kept for figures of this size: its renderer lives on, and with it
        matplotlib's measurements of texts, which it keeps per renderer (a canvas makes a new
        renderer whenever the figure's size changes, as a device count does)."""
        size = (*figure.get_size_inches(), figure.dpi)
        if size not in self._canvases:
            if len(self._canvases) >= CANVASES_KEPT:
                self._canvases.pop(next(iter(self._canvases)))  # the oldest
            self._canvases[size] = FigureCanvasAgg(Figure())
        return self._canvases[size]

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        bundle = self.widget._repr_mimebundle_(**kwargs)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        data["text/plain"] = self.marker.value  # what a text-only (headless) view shows
        return bundle
