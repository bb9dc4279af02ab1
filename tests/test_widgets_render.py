"""How an explorer paints: once per figure, with a remembered layout only where it is the
layout the figure would compute itself.

The pixels of a figure painted with a remembered layout are compared with the same figure
laid out afresh; nothing is compared with numbers copied from the code under test.
"""

from __future__ import annotations

import functools
from io import BytesIO

import numpy as np
import pytest
from matplotlib.figure import Figure
from PIL import Image

import dpkit
from dpkit.viz import explorer, split

pytest.importorskip("ipywidgets")

cpu_lanes = functools.partial(dpkit.virtual_devices, on="cpu")


def _pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(BytesIO(png)).convert("RGB"))


def _split_figure(batch: int = 10, devices: int = 8) -> Figure:
    return split.split_figure(split.split_plan(batch, devices, devices=cpu_lanes))


def _explorer(reuse_layout: bool = True) -> explorer.Explorer:
    return explorer.Explorer(
        [explorer.int_slider("batch", 10, 1, 512), explorer.int_slider("devices", 8, 1, 16)],
        compute=lambda batch, devices: split.split_plan(batch, devices, devices=cpu_lanes),
        draw=split.split_figure,
        reuse_layout=reuse_layout,
    )


def test_a_remembered_layout_paints_the_pixels_a_fresh_layout_would():
    # 8 -> 6 devices, batch 10: idle devices both times (3, then 1), so the same decorations
    # (the legend names idle devices only when some are), the layout remembered
    label, value = "devices", 6
    view = _explorer()
    view.controls[label].value = value
    assert view.layouts.hits == 1
    fresh = explorer.figure_png(_split_figure(**{label: value}))
    remembered = _pixels(view.last_png)
    assert remembered.shape == _pixels(fresh).shape
    assert (remembered != _pixels(fresh)).any(axis=-1).sum() == 0
    # The comparison can fail: a layout remembered from another figure is visibly wrong.
    wrong = _split_figure(**{label: value})
    other = _split_figure(500)  # y tick labels of three digits: a wider left margin
    explorer.figure_png(other)
    for axes, source in zip(wrong.axes, other.axes):
        axes.set_position(source.get_position())
    wrong.set_layout_engine("none")
    assert (_pixels(explorer.figure_png(wrong)) != _pixels(fresh)).any()


def test_longer_tick_labels_or_smaller_tick_fonts_get_a_fresh_layout():
    view = _explorer()
    # 3-digit y tick labels; then more than 10 devices, whose x tick labels are smaller.
    for label, value in [("batch", 500), ("devices", 16)]:
        misses = view.layouts.misses
        view.controls[label].value = value
        assert view.layouts.misses == misses + 1, label
    assert view.layouts.hits == 0


def test_reuse_layout_false_lays_out_every_figure():
    view = _explorer(reuse_layout=False)
    view.controls["batch"].value = 12
    assert view.layouts is None
    assert view.last_figure.get_layout_engine() is not None  # laid itself out


def test_a_figure_is_painted_once(monkeypatch):
    figure = _split_figure(10)
    draws = []
    original = Figure.draw
    monkeypatch.setattr(Figure, "draw", lambda self, r: (draws.append(self), original(self, r)))
    assert explorer.figure_png(figure).startswith(b"\x89PNG")
    assert draws == [figure]  # savefig would have drawn it twice (layout, then paint)


def test_an_earlier_figure_still_saves_itself_after_the_canvas_moved_on():
    view = _explorer()
    first_figure, first_png = view.last_figure, view.last_png
    view.controls["batch"].value = 300
    buffer = BytesIO()
    first_figure.savefig(buffer, format="png", dpi=first_figure.dpi)
    assert (_pixels(buffer.getvalue()) == _pixels(first_png)).all()
    assert (_pixels(view.last_png).shape != _pixels(first_png).shape) or (
        _pixels(view.last_png) != _pixels(first_png)
    ).any()
