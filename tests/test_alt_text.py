"""Every figure an explorer draws carries a text alternative: its title and what it shows.

The figures of the first tests are drawn from traces built here event by event, so what the
text must say (devices, phases, times, bytes) is known without running dpkit. The explorers'
tests check that the text is the drawn figure's and that it sits in the widget, under the
image, after every redraw.
"""

from __future__ import annotations

import html

import pytest
import torch

import dpkit
from dpkit import pipeline as pp
from dpkit import viz
from dpkit.viz import beyond, scaling
from dpkit.viz.alt_text import figure_alt_text
from tests.test_viz_beyond import comparison, ddp_trace, dp_trace

pytest.importorskip("ipywidgets")


def test_a_timeline_names_its_title_devices_phases_and_longest_bars():
    text = figure_alt_text(viz.timeline(dp_trace()))
    assert text.startswith("Timeline of step 2 — virtual devices on the CPU.")
    assert "rows: virtual:0 (cpu), virtual:1 (cpu)" in text
    assert "phase: apply, backward, reduce" in text
    # dp_trace: apply runs 1.5 s and backward 2 s on each lane, the reduce 1 s (in ms here)
    assert "apply 1,500, backward 2,000, reduce 1,000" in text
    assert "time since the step began (ms)" in text


def test_a_ddp_timeline_names_its_communication_phase():
    text = figure_alt_text(viz.timeline(ddp_trace()))
    assert "rows: rank:0 (cpu), rank:1 (cpu)" in text
    assert "phase: apply, backward, allreduce, optimizer" in text


def test_a_memory_figure_names_devices_categories_and_bytes():
    text = figure_alt_text(viz.memory_per_device(ddp_trace()))
    assert text.startswith("Memory per device in step 2")
    assert "columns: rank:0 (cpu), rank:1 (cpu) (device)" in text
    assert "category: parameters, gradients, buckets" in text
    assert "bars 'gradients': 4 KB, 4 KB" in text  # each rank's own, as human_bytes writes it
    assert "12 KB" in text  # each rank's total, written above its bar


def test_a_figure_without_a_suptitle_takes_its_panel_title():
    text = figure_alt_text(viz.bytes_per_phase(dp_trace()))
    assert text.startswith("Bytes moved between devices per phase — virtual devices on the CPU.")
    assert "columns: apply, backward, reduce" in text


def _pipeline(monkeypatch):
    model = pp.mlp_blocks(32, blocks=4)
    inputs, targets = torch.randn(16, 32), torch.randint(0, 32, (16,))
    lanes = dpkit.virtual_devices(4)
    monkeypatch.setattr(beyond, "cores", lambda: 2)
    return beyond.pipeline_explorer(
        lambda p, m: pp.pipeline(model, lanes[:p], micro_batches=m), inputs, targets, repeats=1
    )


# Each explorer of the course, and a control to move with a value it takes.
EXPLORERS = {
    "split": (lambda _: viz.split_explorer(), "devices", 5),
    "replication": (lambda _: viz.replication_explorer(), "devices", 3),
    "timeline": (lambda _: viz.timeline_explorer(devices=2, batch=64), "devices", 3),
    "memory": (lambda _: viz.memory_explorer(devices=2, batch=64), "devices", 3),
    "backward": (lambda _: viz.backward_explorer(devices=2, batch=64), "devices", 3),
    "scaling": (
        lambda _: scaling.scaling_explorer(
            hardware="8xA100-SXM-NVLink", model_name="mlp", devices=8, batch=256
        ),
        "devices",
        4,
    ),
    "ddp": (lambda _: beyond.ddp_explorer(comparison(), run=comparison), "bucket MiB", 0.001),
    "pipeline": (_pipeline, "micro-batches", 4),
}


def _shown_under_the_image(explorer) -> str:
    children = explorer.widget.children
    index = children.index(explorer.image)
    return children[index + 1].value


def _title(figure) -> str:
    suptitle = figure._suptitle.get_text() if figure._suptitle is not None else ""
    return " ".join((suptitle or figure.axes[0].get_title()).split())


@pytest.mark.parametrize("name", EXPLORERS)
def test_every_explorer_shows_its_figures_text_alternative_after_every_redraw(name, monkeypatch):
    make, control, value = EXPLORERS[name]
    explorer = make(monkeypatch)
    for move in (None, value):
        if move is not None:
            explorer.controls[control].value = move
        text = explorer.alt_text
        assert text == figure_alt_text(explorer.last_figure)  # the figure shown, not the last
        assert text.startswith(_title(explorer.last_figure) + ".")
        assert len(text) > len(_title(explorer.last_figure)) + 40  # what it shows, too
        shown = _shown_under_the_image(explorer)
        assert "<details" in shown and html.escape(text) in shown


def test_the_text_follows_the_devices_shown():
    explorer = viz.timeline_explorer(devices=2, batch=64)
    assert "virtual:1" in explorer.alt_text and "virtual:2" not in explorer.alt_text
    explorer.controls["devices"].value = 3
    assert "virtual:2" in explorer.alt_text and "virtual:2" in _shown_under_the_image(explorer)


# -- a figure a notebook cell shows directly ----------------------------------------------


@pytest.fixture
def kernel():
    """An IPython shell whose displays are captured, showing figures as PNG as a notebook's
    inline backend does, with dpkit's figure descriptions switched on."""
    from IPython.core.displaypub import CapturingDisplayPublisher
    from IPython.core.interactiveshell import InteractiveShell
    from matplotlib.figure import Figure

    from dpkit.viz import described
    from dpkit.viz.explorer import figure_png

    shell = InteractiveShell.instance()
    shell.display_pub = CapturingDisplayPublisher()
    shell.display_formatter.formatters["image/png"].for_type(Figure, figure_png)
    assert described.describe_figures(shell)
    yield shell
    InteractiveShell.clear_instance()


def test_a_figure_shown_directly_carries_its_text_as_alt_and_under_it(kernel):
    from ipywidgets.widgets import widget

    from dpkit.viz.alt_text import alt_text_html
    from dpkit.viz.described import DESCRIPTION_PLAIN

    figure = viz.memory_per_device(ddp_trace())
    kernel.display_formatter.format(figure)  # what a cell ending in the figure does
    image, description = kernel.display_pub.outputs
    text = figure_alt_text(figure)
    assert image["data"]["image/png"].startswith(b"\x89PNG")
    assert image["metadata"]["image/png"]["alt"] == text
    assert image["data"]["text/plain"].startswith("<Figure size")  # as the kernel writes it
    # Under it, the explorers' collapsed description, in the same kind of widget
    model = description["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]
    assert widget._instances[model].value == alt_text_html(text)
    assert description["data"]["text/plain"] == DESCRIPTION_PLAIN  # the same on any machine


def test_a_figure_whose_text_cannot_be_read_is_still_shown_and_says_so(kernel, monkeypatch):
    from dpkit.viz import described

    def unreadable(_figure):
        raise ValueError("an artist it does not know")

    monkeypatch.setattr(described, "figure_alt_text", unreadable)
    kernel.display_formatter.format(viz.bytes_per_phase(dp_trace()))
    image, _description = kernel.display_pub.outputs
    assert image["data"]["image/png"].startswith(b"\x89PNG")
    assert "an artist it does not know" in image["metadata"]["image/png"]["alt"]


def test_importing_dpkit_viz_in_a_kernel_describes_its_figures():
    import subprocess
    import sys

    code = (
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "from matplotlib.figure import Figure\n"
        "shell = InteractiveShell.instance()\n"
        "printers = shell.display_formatter.ipython_display_formatter.type_printers\n"
        "assert Figure not in printers\n"
        "import dpkit.viz\n"
        "print(printers.get(Figure).__name__)\n"
    )
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert shown.stdout.strip() == "show_described", shown.stderr
