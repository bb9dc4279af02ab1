"""The figures of dpkit.viz: they render headless, show every device and phase, say what
hardware they came from, and default to the last step.

Expected values are computed from the trace's raw events and memory records, not from
another dpkit summary.
"""

from __future__ import annotations

from collections import defaultdict
from io import BytesIO

import pytest
import torch
from matplotlib.colors import to_rgba
from matplotlib.container import BarContainer
from torch import nn

import dpkit
from dpkit import viz
from dpkit.tracing import BACKWARD_PHASES, FORWARD_PHASES

# As on a GPU: code that leaves a model or a tensor off the devices fails (tests/conftest.py).
pytestmark = pytest.mark.placement_check

FIRST_BATCH, LAST_BATCH = 32, 64  # different sizes, so the two steps' numbers differ


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def _traced_steps(output_index: int = 0, batches=(FIRST_BATCH, LAST_BATCH)) -> dpkit.Trace:
    lanes = dpkit.virtual_devices(4, on="cpu")
    model = dpkit.to_device(_mlp(), lanes[0])
    parallel = dpkit.DataParallel(model, device_ids=lanes, output_device=lanes[output_index])
    with dpkit.trace() as recorded:
        for batch in batches:
            parallel(dpkit.to_device(torch.randn(batch, 16), lanes[0])).sum().backward()
    return recorded


@pytest.fixture(scope="module")
def two_steps() -> dpkit.Trace:
    return _traced_steps()


def _png(figure) -> bytes:
    buffer = BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _bars(axes) -> dict[str, BarContainer]:
    return {c.get_label(): c for c in axes.containers if isinstance(c, BarContainer)}


@pytest.mark.parametrize("draw", [viz.timeline, viz.bytes_per_phase, viz.memory_per_device])
def test_each_figure_renders_to_png_and_says_virtual(two_steps, draw):
    figure = draw(two_steps)
    assert _png(figure).startswith(b"\x89PNG")
    title = figure.axes[0].get_title()
    assert "virtual" in title
    assert two_steps.hardware in title


def test_timeline_has_one_row_per_used_device_in_order(two_steps):
    axes = viz.timeline(two_steps).axes[0]
    labels = [tick.get_text() for tick in axes.get_yticklabels()]
    assert labels == [f"virtual:{i} (cpu)" for i in range(4)]


def test_timeline_rows_shrink_when_the_batch_uses_fewer_devices():
    recorded = _traced_steps(batches=(2,))  # torch.chunk puts 2 rows on 2 of the 4 lanes
    axes = viz.timeline(recorded).axes[0]
    assert [t.get_text() for t in axes.get_yticklabels()] == ["virtual:0 (cpu)", "virtual:1 (cpu)"]


def test_timeline_legend_has_one_entry_per_phase_present(two_steps):
    axes = viz.timeline(two_steps).axes[0]
    legend = [text.get_text() for text in axes.get_legend().get_texts()]
    present = {e.phase for e in two_steps.events if e.step == 2}
    assert sorted(legend) == sorted(present)
    assert {"scatter", "replicate", "apply", "gather", "grad_scatter", "reduce"} <= set(legend)


def test_every_phase_the_trace_knows_has_its_own_colour():
    phases = FORWARD_PHASES + BACKWARD_PHASES
    assert set(phases) <= set(viz.PHASE_COLORS)
    assert len(set(viz.PHASE_COLORS.values())) == len(viz.PHASE_COLORS)


def test_each_phase_has_its_fixed_colour_in_every_figure(two_steps):
    def colour(phase: str) -> tuple[float, ...]:
        return to_rgba(viz.PHASE_COLORS[phase])

    timeline_axes = viz.timeline(two_steps).axes[0]
    legend = timeline_axes.get_legend()
    for text, handle in zip(legend.get_texts(), legend.legend_handles):
        assert tuple(handle.get_facecolor()) == colour(text.get_text())
    for bars in timeline_axes.collections:
        assert tuple(bars.get_facecolor()[0]) == colour(bars.get_label())

    bytes_axes = viz.bytes_per_phase(two_steps).axes[0]
    phases = [tick.get_text() for tick in bytes_axes.get_xticklabels()]
    for phase, bar in zip(phases, bytes_axes.containers[0]):
        assert bar.get_facecolor() == colour(phase)


def _timeline_bars(figure) -> list[tuple[float, float, float]]:
    axes = figure.axes[0]
    return sorted(
        (path.get_extents().x0, path.get_extents().x1, path.get_extents().y0)
        for collection in axes.collections
        for path in collection.get_paths()
    )


def test_figures_default_to_the_last_step(two_steps):
    default, last, first = (viz.timeline(two_steps, step) for step in (None, 2, 1))
    assert "step 2" in default.axes[0].get_title()
    assert _timeline_bars(default) == _timeline_bars(last)
    assert _timeline_bars(default) != _timeline_bars(first)

    memory = viz.memory_per_device(two_steps).axes[0]
    assert "step 2" in memory.get_title()
    input_bytes = list(_bars(memory)["input"].datavalues)
    assert input_bytes == [LAST_BATCH // 4 * 16 * 4] * 4  # rows x features x float32


def test_an_unknown_step_is_named_in_the_error(two_steps):
    with pytest.raises(ValueError, match=r"step=7 .* steps \[1, 2\]"):
        viz.timeline(two_steps, step=7)


def test_an_empty_trace_says_how_to_record_one():
    with dpkit.trace() as empty:
        pass
    for draw in (viz.timeline, viz.bytes_per_phase, viz.memory_per_device):
        with pytest.raises(ValueError, match="dpkit.trace"):
            draw(empty)


def test_bytes_per_phase_shows_the_bytes_each_phase_moves_per_step(two_steps):
    axes = viz.bytes_per_phase(two_steps).axes[0]
    expected: dict[str, float] = defaultdict(float)
    for event in two_steps.events:
        expected[event.phase] += event.nbytes / 2
    shown = dict(zip([t.get_text() for t in axes.get_xticklabels()], axes.containers[0].datavalues))
    assert shown == pytest.approx(dict(expected))
    assert shown["replicate"] > 0 and shown["apply"] == 0
    assert "bytes" in axes.get_ylabel()


@pytest.mark.parametrize("output_index", [0, 2])
def test_memory_shows_the_gathered_output_only_on_the_output_device(output_index):
    recorded = _traced_steps(output_index, batches=(LAST_BATCH,))
    axes = viz.memory_per_device(recorded).axes[0]
    gathered = list(_bars(axes)["gathered"].datavalues)
    assert gathered == [LAST_BATCH * 4 * 4 if i == output_index else 0 for i in range(4)]
    labels = [t.get_text() for t in axes.get_xticklabels()]
    assert "output device" in labels[output_index]
    assert sum("output device" in label for label in labels) == 1


def test_memory_stacks_every_category_in_order(two_steps):
    axes = viz.memory_per_device(two_steps).axes[0]
    assert list(_bars(axes)) == list(viz.MEMORY_CATEGORIES)
    legend = [text.get_text() for text in axes.get_legend().get_texts()]
    assert legend == list(viz.MEMORY_CATEGORIES)


def test_figures_accept_plain_lists(two_steps):
    events, memory = two_steps.events, two_steps.memory
    assert "virtual" in viz.timeline(events).axes[0].get_title()
    assert "virtual" in viz.bytes_per_phase(events).axes[0].get_title()
    assert "virtual" in viz.memory_per_device(memory).axes[0].get_title()


def test_human_bytes():
    assert [viz.human_bytes(n) for n in (0, 999, 1536, 2_821_752, 3e9)] == [
        "0 B",
        "999 B",
        "1.54 KB",
        "2.82 MB",
        "3 GB",
    ]
