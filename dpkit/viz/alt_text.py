"""A figure's text alternative: its title and what it shows, read from the figure itself.

The surprise first: ipywidgets 8's ``Image`` has no alt text, and its ``tooltip`` (which would
become the ``<img>``'s title) breaks the view: ``DOMWidgetView.updateTooltip`` reads the
``description`` an Image does not have (ipywidgets 8.1; jupyter-widgets/ipywidgets#3921). So
an explorer shows the text under its image, in a collapsed ``<details>`` that a screen reader
and a keyboard reach (:func:`alt_text_html`).

:func:`figure_alt_text` reads what a reader of the figure reads: the title, each panel's axes
(categories such as devices, or the range of a numeric axis), its legend (phases, categories),
the numbers written on it (bar labels, annotations), the longest bar of each legend entry on a
timeline, and the lines and bars it holds. It reads artists and never draws, so a redraw pays
well under a millisecond for it, and any figure dpkit draws gets one without code of its own.
"""

from __future__ import annotations

import html
from collections import defaultdict
from typing import Any

from matplotlib.collections import PolyCollection
from matplotlib.container import BarContainer
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter

MAX_ITEMS = 12  # values listed per panel, and entries per list, before "and N more"


def _listed(items: list[str], unique: bool = True) -> str:
    kept = [item for item in items if item]
    kept = list(dict.fromkeys(kept)) if unique else kept
    more = len(kept) - MAX_ITEMS
    return ", ".join(kept[:MAX_ITEMS]) + (f" and {more} more" if more > 0 else "")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _is_number(text: str) -> bool:
    try:
        float(text.replace("\u2212", "-"))  # matplotlib writes a minus sign
    except ValueError:
        return False
    return True


def _categories(axis: Any) -> list[str]:
    """An axis's tick labels when they name things (devices, phases), else []."""
    locator = axis.get_major_locator()
    if not isinstance(locator, FixedLocator) and type(locator).__name__ != "StrCategoryLocator":
        return []
    labels = [_one_line(label) for label in axis.get_major_formatter().format_ticks(locator())]
    return labels if any(label and not _is_number(label) for label in labels) else []


def _number(axis: Any, value: float) -> str:
    """``value`` as the axis writes it where it has a formatter of its own (bytes), else 3
    significant digits."""
    formatter = axis.get_major_formatter()
    written = formatter(value) if isinstance(formatter, FuncFormatter) else ""
    return written or _short(value)  # a formatter for ticks only writes "" between them


def _short(value: float) -> str:
    """3 significant digits, without an exponent from 1,000 up: ``1,500``, ``0.0372``."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _axis(axes: Any, which: str) -> str:
    """``"x from 0 to 12.6: time (ms)"`` or ``"rows: virtual:0 (cpu), ..."``."""
    axis = getattr(axes, f"{which}axis")
    if not axis.get_visible():
        return ""
    label = _one_line(axis.get_label().get_text())
    names = _categories(axis)
    if names:
        return f"{'rows' if which == 'y' else 'columns'}: {_listed(names)}" + (
            f" ({label})" if label else ""
        )
    low, high = sorted(getattr(axes, f"get_{which}lim")())
    span = f"{which} from {_number(axis, low)} to {_number(axis, high)}"
    return f"{span}: {label}" if label else span


def _longest_bars(axes: Any) -> str:
    """A timeline's bars (``broken_barh``, labelled by phase): each label's longest bar."""
    longest: dict[str, float] = defaultdict(float)
    for collection in axes.collections:
        label = collection.get_label()
        if isinstance(collection, PolyCollection) and label and not label.startswith("_"):
            for path in collection.get_paths():
                xs = path.vertices[:, 0]
                longest[label] = max(longest[label], float(xs.max() - xs.min()))
    if not longest:
        return ""
    return "longest bar of each (in x units): " + _listed(
        [f"{k} {_short(v)}" for k, v in longest.items()]
    )


def _marks(axes: Any) -> list[str]:
    """Lines and bar series: their labels and the range of their values."""
    found = []
    for line in axes.get_lines():
        label = line.get_label()
        ys = [float(y) for y in line.get_ydata()]
        if label.startswith("_") or not ys:
            continue
        low, high = _number(axes.yaxis, min(ys)), _number(axes.yaxis, max(ys))
        span = low if low == high else f"{low} to {high}"
        found.append(f"line '{label}' {span}")
    unlabelled: list[str] = []
    for container in axes.containers:
        if not isinstance(container, BarContainer):
            continue
        label = container.get_label()
        horizontal = container.orientation == "horizontal"
        sizes = [
            _number(
                axes.xaxis if horizontal else axes.yaxis,
                bar.get_width() if horizontal else bar.get_height(),
            )
            for bar in container.patches
        ]
        if label and not label.startswith("_"):
            found.append(f"bars '{label}': {_listed(sizes, unique=False)}")
        else:
            unlabelled += sizes
    if unlabelled:
        found.append(f"bars: {_listed(unlabelled, unique=False)}")
    for image in axes.get_images():
        values = image.get_array()
        found.append(
            f"a colour map of {values.shape[0]} x {values.shape[1]} values "
            f"from {_short(float(values.min()))} to {_short(float(values.max()))}"
        )
    return found


def _panel(axes: Any, main_title: str) -> str:
    title = next(
        (_one_line(t.get_text()) for t in (axes.title, axes._left_title) if t.get_text()), ""
    )
    legend = axes.get_legend()
    parts = [
        _axis(axes, "y"),
        _axis(axes, "x"),
        (
            f"{_one_line(legend.get_title().get_text()) or 'key'}: "
            + _listed([_one_line(t.get_text()) for t in legend.get_texts()])
            if legend is not None
            else ""
        ),
        _longest_bars(axes),
        *_marks(axes),
        (
            "written on it: " + _listed([_one_line(t.get_text()) for t in axes.texts])
            if axes.texts
            else ""
        ),
    ]
    body = "; ".join(part for part in parts if part)
    lead = f"Panel '{title}'" if title and title != main_title else "It shows"
    return f"{lead}: {body}."


def figure_alt_text(figure: Figure) -> str:
    """A short text alternative for ``figure``: its title, then what each panel shows.

    >>> from matplotlib.figure import Figure
    >>> figure = Figure()
    >>> axes = figure.add_subplot(title="Chunk sizes")
    >>> bars = axes.bar(["cuda:0", "cuda:1"], [3, 2])
    >>> figure_alt_text(figure)
    'Chunk sizes. It shows: y from 0 to 3.15; columns: cuda:0, cuda:1; bars: 3, 2.'
    """
    suptitle = figure._suptitle.get_text() if figure._suptitle is not None else ""
    panels = [
        axes
        for axes in figure.axes
        if axes.get_visible() and axes.has_data() and axes.get_label() != "<colorbar>"
    ]
    titles = [_one_line(axes.get_title() or axes.get_title("left")) for axes in panels]
    main = _one_line(suptitle) or next((t for t in titles if t), "A figure")
    return " ".join([f"{main}.", *(_panel(axes, main) for axes in panels)])


def alt_text_html(text: str) -> str:
    """``text`` as a collapsed, keyboard- and screen-reader-reachable description."""
    return (
        '<details class="dpkit-alt-text"><summary>Text description of the figure</summary>'
        f"<p>{html.escape(text)}</p></details>"
    )
