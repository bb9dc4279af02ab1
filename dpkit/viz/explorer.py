"""The widget layer every explorer shares: controls over a figure, redrawn as they move.

An :class:`Explorer` computes data from its controls' values, draws it into a matplotlib
figure, shows the figure as a PNG in an ``ipywidgets.Image`` and then updates a one-line
marker naming what is shown (a label with CSS class ``dpkit-marker``: the browser test
waits for it before comparing images). In a text-only view the explorer shows the marker.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from io import BytesIO
from typing import Any

from matplotlib.figure import Figure


def figure_png(figure: Figure) -> bytes:
    """The figure as PNG bytes (for an ``ipywidgets.Image`` or a test)."""
    buffer = BytesIO()
    figure.savefig(buffer, format="png", dpi=figure.dpi)
    return buffer.getvalue()


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


class Explorer:
    """Controls over a figure: ``compute(**values)`` -> data, ``draw(data)`` -> figure.

    Values are keyed by each control's label (its ``description``). ``.widget`` is the box to
    display (a cell ending in the explorer shows it); ``.controls[label].value = ...``
    redraws as a slider move does; ``.last_data``, ``.last_figure`` and ``.last_png`` hold
    what is shown; ``.marker`` is the line naming it, ``marker(data, values)`` its text.
    """

    def __init__(
        self,
        controls: Sequence[Any],
        compute: Callable[..., Any],
        draw: Callable[[Any], Figure],
        marker: Callable[[Any, dict[str, Any]], str] = drawn_marker,
    ) -> None:
        import ipywidgets as widgets

        self.controls: dict[str, Any] = {control.description: control for control in controls}
        self._compute, self._draw, self._describe = compute, draw, marker
        self.image = widgets.Image(format="png", layout=widgets.Layout(max_width="100%"))
        self.marker = widgets.Label(layout=widgets.Layout(width="auto"))
        self.marker.add_class("dpkit-marker")
        rows = [widgets.HBox(list(controls[i : i + 2])) for i in range(0, len(controls), 2)]
        self.widget = widgets.VBox([*rows, self.marker, self.image])
        self.last_data: Any = None
        self.last_figure: Figure | None = None
        self.last_png = b""
        for control in controls:
            control.observe(lambda _change: self.update(), names="value")
        self.update()

    @property
    def values(self) -> dict[str, Any]:
        return {label: control.value for label, control in self.controls.items()}

    def update(self) -> None:
        """Recompute and redraw from the controls' values; the marker changes last."""
        values = self.values
        self.last_data = self._compute(**values)
        self.last_figure = self._draw(self.last_data)
        self.last_png = figure_png(self.last_figure)
        # Shown at its own size: stretched to the cell's width it would blur.
        self.image.layout.width = (
            f"{round(self.last_figure.get_figwidth() * self.last_figure.dpi)}px"
        )
        self.image.value = self.last_png
        self.marker.value = self._describe(self.last_data, values)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        bundle = self.widget._repr_mimebundle_(**kwargs)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        data["text/plain"] = self.marker.value  # what a text-only (headless) view shows
        return bundle
