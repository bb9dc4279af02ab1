"""Memory per device: why the output device fills up first, and the fix.

The surprise first: DataParallel gathers every replica's output onto one device (the
output device, ``device_ids[0]`` by default), and a loss computed on that output runs there
too. With a wide output (a classifier over thousands of classes, a language model's
vocabulary) device 0 holds the whole batch's logits plus the loss's own saved tensors,
on top of its replica's share: it runs out of memory while the others have room. Computing
the loss inside ``forward`` gathers one number per replica instead.

Three layers: :func:`memory_trace` (data: one traced forward and loss, either way),
:func:`memory_figure` (:func:`dpkit.viz.figures.memory_per_device`, notebook-sized) and
:func:`memory_explorer` (sliders "devices" and "batch", toggle "loss").
"""

from __future__ import annotations

from collections import defaultdict

import torch
from matplotlib.figure import Figure
from torch import nn

import dpkit
from dpkit import replica_graph, tracing
from dpkit.viz.apply import compact
from dpkit.viz.explorer import Explorer, int_slider
from dpkit.viz.figures import memory_per_device

CLASSES = 4096  # wide enough that the gathered logits outweigh a replica's share
FEATURES = 64
LOSS_OUTSIDE, LOSS_INSIDE = "outside", "inside"
LOSS_CATEGORY = "loss (outside forward)"


def classifier(seed: int = 0) -> nn.Module:
    """A small network with a wide output: CLASSES logits per example."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, 128), nn.ReLU(), nn.Linear(128, CLASSES))


class WithLoss(nn.Module):
    """Wraps a model so each replica returns its own loss, not its logits.

    Each replica returns its chunk's *summed* loss as a 1-element vector: gather then makes a
    vector of per-replica sums (no scalar warning), and ``.sum() / batch`` is the exact mean
    loss even when the chunks have different sizes (a mean of per-chunk means is not).
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.model(inputs)
        return nn.functional.cross_entropy(logits, targets, reduction="sum").reshape(1)


def memory_trace(devices: int = 4, batch: int = 256, loss: str = LOSS_OUTSIDE) -> dpkit.Trace:
    """One traced forward and loss on ``dpkit.devices(devices)``, the loss ``outside`` or
    ``inside`` the module's forward. With the loss outside, the bytes the loss saves for
    backward on the output device are measured and recorded as ``LOSS_CATEGORY``.
    """
    if loss not in (LOSS_OUTSIDE, LOSS_INSIDE):
        raise ValueError(f"loss must be {LOSS_OUTSIDE!r} or {LOSS_INSIDE!r}, got {loss!r}")
    lanes = dpkit.devices(devices)
    model = classifier()
    torch.manual_seed(1)
    inputs = torch.randn(batch, FEATURES)
    targets = torch.randint(0, CLASSES, (batch,))
    with dpkit.trace() as recorded:
        if loss == LOSS_INSIDE:
            parallel = dpkit.DataParallel(WithLoss(model), device_ids=lanes)
            parallel(inputs, targets).sum() / batch
        else:
            parallel = dpkit.DataParallel(model, device_ids=lanes)
            logits = parallel(inputs)
            loss_value = nn.functional.cross_entropy(logits, targets)
            given = [logits, targets, *model.parameters()]
            saved = replica_graph.saved_bytes([loss_value], given)
            tracing.record_memory(parallel.output_device, LOSS_CATEGORY, saved)
    return recorded


def held_per_device(recorded: dpkit.Trace, step: int | None = None) -> dict[str, int]:
    """Total bytes each device holds in ``step`` (default: the last), all counted categories
    (torch's allocator totals are no part of the sum)."""
    records = recorded.memory
    step = max(r.step for r in records) if step is None else step
    held: dict[str, int] = defaultdict(int)
    for record in records:
        if record.step == step and record.category not in tracing.ALLOCATOR_CATEGORIES:
            held[record.device] += record.nbytes
    return dict(held)


def memory_figure(recorded: dpkit.Trace, top: float | None = None) -> Figure:
    """:func:`~dpkit.viz.figures.memory_per_device`, notebook-sized, its y axis up to ``top``
    bytes (default: 15% above the tallest bar), so two figures can share a scale."""
    figure = compact(memory_per_device(recorded), height=3.3)
    if top is not None:
        figure.axes[0].set_ylim(0, top)
    return figure


def memory_explorer(devices: int = 4, batch: int = 256, max_devices: int = 8) -> Explorer:
    """Sliders "devices" and "batch" and a toggle "loss" (outside / inside forward)."""
    import ipywidgets as widgets

    loss = widgets.ToggleButtons(
        options=[LOSS_OUTSIDE, LOSS_INSIDE],
        value=LOSS_OUTSIDE,
        description="loss",
        tooltips=["loss computed on the gathered output", "loss computed in each replica"],
        style={"button_width": "80px"},
    )
    return Explorer(
        [
            int_slider("devices", devices, 1, max_devices),
            int_slider("batch", batch, 8, 1024, 8),
            loss,
        ],
        compute=memory_trace,
        draw=memory_figure,
    )
