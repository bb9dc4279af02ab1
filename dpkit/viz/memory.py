"""Memory per device: why the output device fills up first, and the fix.

The surprise first: DataParallel gathers every replica's output onto one device (the
output device, ``device_ids[0]`` by default), and a loss computed on that output runs there
too. With a wide output (a classifier over thousands of classes, a language model's
vocabulary) device 0 holds the whole batch's logits plus the loss's own saved tensors,
on top of its replica's share: it runs out of memory while the others have room. Computing
the loss inside ``forward`` gathers one number per replica instead.

Three layers: :func:`memory_trace` (data: one traced forward and loss, either way, as a
:class:`MemoryRun`), :func:`memory_figure` (:func:`dpkit.viz.figures.memory_per_device`,
notebook-sized) and :func:`memory_explorer` (sliders "devices" and "batch", toggle "loss").
Like all of :mod:`dpkit.viz`, this module only reads traces: the loss's bytes, which no trace
records, travel beside the trace in the :class:`MemoryRun`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
from matplotlib.figure import Figure
from torch import nn

import dpkit
from dpkit.tracing import ALLOCATOR_CATEGORIES, MemoryRecord, replica_graph
from dpkit.viz.common import (
    compact,
    intra_op_threads,
    one_device_marker,
    one_device_note,
)
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


@dataclass(frozen=True)
class MemoryRun:
    """What :func:`memory_trace` measured: the step's Trace and, with the loss outside
    forward, the bytes the loss saved for backward on the output device.

    The trace records what DataParallel's forward holds; a loss computed after it on the
    gathered output is none of DataParallel's doing, so no trace records it. ``memory`` is the
    trace's records plus one for those bytes (category ``LOSS_CATEGORY``, on the output device,
    in the trace's last step), so :func:`held_per_device` and the figures take a MemoryRun
    wherever they take a Trace. With the loss inside forward, the replicas' activations hold
    what it saves, and the trace counts them.
    """

    trace: dpkit.Trace
    loss: str  # LOSS_OUTSIDE or LOSS_INSIDE
    output_device: dpkit.Device
    loss_bytes: int = 0  # saved for backward by the loss outside forward; 0 inside

    @property
    def memory(self) -> list[MemoryRecord]:
        records = self.trace.memory
        if self.loss != LOSS_OUTSIDE:
            return records
        step = max(record.step for record in records)
        device = self.output_device
        held = MemoryRecord(device.name, LOSS_CATEGORY, self.loss_bytes, step, device.kind)
        return [*records, held]

    @property
    def events(self) -> list[dpkit.Event]:
        return self.trace.events

    @property
    def hardware(self) -> str:
        return self.trace.hardware


def memory_trace(devices: int = 4, batch: int = 256, loss: str = LOSS_OUTSIDE) -> MemoryRun:
    """One traced forward and loss on ``dpkit.devices(devices)``, the loss ``outside`` or
    ``inside`` the module's forward. With the loss outside, the bytes the loss saves for
    backward on the output device are measured too (see :class:`MemoryRun`). On one device
    the module's own call is recorded (DataParallel records it so).
    """
    if loss not in (LOSS_OUTSIDE, LOSS_INSIDE):
        raise ValueError(f"loss must be {LOSS_OUTSIDE!r} or {LOSS_INSIDE!r}, got {loss!r}")
    lanes = dpkit.devices(devices)
    model = dpkit.to_device(classifier(), lanes[0])
    torch.manual_seed(1)
    inputs = torch.randn(batch, FEATURES)
    targets = torch.randint(0, CLASSES, (batch,))
    inputs, targets = dpkit.to_device((inputs, targets), lanes[0])
    saved = 0
    # One intra-op thread, as every traced explorer runs: with torch's default, each replica's
    # thread starts an OpenMP team of its own and the teams spin against each other (a redraw
    # on 8 lanes took 0.5 s instead of 30 ms here, once in a dozen). The bytes are the same.
    with intra_op_threads(1), dpkit.trace() as recorded:
        if loss == LOSS_INSIDE:
            parallel = dpkit.DataParallel(WithLoss(model), device_ids=lanes)
            parallel(inputs, targets).sum() / batch
        else:
            parallel = dpkit.DataParallel(model, device_ids=lanes)
            logits = parallel(inputs)
            loss_value = nn.functional.cross_entropy(logits, targets)
            given = [logits, targets, *model.parameters()]
            saved = replica_graph.saved_bytes([loss_value], given)
    return MemoryRun(recorded, loss, parallel.output_device, saved)


def held_per_device(recorded: dpkit.Trace | MemoryRun, step: int | None = None) -> dict[str, int]:
    """Total bytes each device holds in ``step`` (default: the last), all counted categories
    (torch's allocator totals are no part of the sum)."""
    records = recorded.memory
    step = max(r.step for r in records) if step is None else step
    held: dict[str, int] = defaultdict(int)
    for record in records:
        if record.step == step and record.category not in ALLOCATOR_CATEGORIES:
            held[record.device] += record.nbytes
    return dict(held)


def memory_figure(recorded: dpkit.Trace | MemoryRun, top: float | None = None) -> Figure:
    """:func:`~dpkit.viz.figures.memory_per_device`, notebook-sized, its y axis up to ``top``
    bytes (default: 15% above the tallest bar), so two figures can share a scale."""
    figure = compact(memory_per_device(recorded, top=top), height=3.3)
    note = one_device_note(recorded.events)
    if note is not None:
        axes = figure.axes[0]
        axes.set_title(f"{axes.get_title()}\n{note}")
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
        marker=one_device_marker,
    )
