"""The replication explorer: what ``replicate`` copies on every forward, and to whom.

The surprise first: ``DataParallel`` replicates the module on **every** forward, so every
step copies all parameters and buffers to every device but the first: ``(devices - 1) x``
the model's bytes, step after step. Replica 0 copies nothing: it shares storage with the
module (which is why its in-place updates, such as BatchNorm's running statistics, are the
only ones that survive).

Three layers, each usable alone:

- :func:`replication_cost` runs a real :func:`dpkit.replicate` and counts the bytes copied
  to each device (:class:`ReplicationCost`), and checks which replicas share storage;
- :func:`replication_figure` draws it (a ``matplotlib.figure.Figure``, no pyplot state);
- :func:`replication_explorer` puts sliders for model width and device count on top, with
  a marker line naming the values shown (``width=256 devices=4 -> ...``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import lru_cache, reduce
from typing import Any

import torch
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter
from torch import nn

from dpkit.comm import add_transfer_listener
from dpkit.device import Device
from dpkit.device import devices as pick_devices
from dpkit.replicate import replicate
from dpkit.tracing import Phase
from dpkit.viz.common import DIAGRAM_DPI, FIGURE_WIDTH, MAX_DEVICES, ONE_DEVICE, DeviceFactory
from dpkit.viz.explorer import Explorer, int_slider
from dpkit.viz.figures import HIGHLIGHT_COLOR, hardware_title, human_bytes

IN_FEATURES, CLASSES = 64, 10
MAX_WIDTH = 2048
BUFFER_COLOR = "#4477aa"  # Tol bright blue: a darker blue than the replicate colour


def example_model(width: int) -> nn.Module:
    """A small MLP with BatchNorm (so it has buffers too); ``width`` sets its size."""
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ValueError(f"width must be a positive int (hidden units), got {width!r}")
    return nn.Sequential(
        nn.Linear(IN_FEATURES, width),
        nn.BatchNorm1d(width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.BatchNorm1d(width),
        nn.ReLU(),
        nn.Linear(width, CLASSES),
    )


def tensor_bytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _tensor_at(module: nn.Module, dotted_name: str) -> torch.Tensor:
    """``model.get_parameter`` for replicas, whose parameters are plain attributes."""
    return reduce(getattr, dotted_name.split("."), module)


@dataclass(frozen=True)
class ReplicationCost:
    """What one real ``replicate`` of a model over ``devices`` copied, device by device."""

    label: str
    width: int | None
    devices: tuple[Device, ...]
    parameter_bytes: int  # one replica's parameters
    buffer_bytes: int  # one replica's buffers (BatchNorm statistics, ...)
    copied_per_device: tuple[int, ...]  # bytes replicate copied to each device (measured)
    shares_storage: tuple[bool, ...]  # per replica: its tensors are the module's own

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def replica_bytes(self) -> int:
        return self.parameter_bytes + self.buffer_bytes

    @property
    def copied_bytes(self) -> int:
        """Bytes copied per forward, measured: ``replica_bytes x (devices - 1)``."""
        return sum(self.copied_per_device)

    @property
    def marker(self) -> str:
        """One line naming what is shown; a browser test waits for it."""
        what = f"width={self.width}" if self.width is not None else f"model={self.label}"
        copies = self.num_devices - 1
        line = (
            f"{what} devices={self.num_devices} -> copied {copies} x "
            f"{human_bytes(self.replica_bytes)} = {human_bytes(self.copied_bytes)} per forward"
        )
        return f"{line} ({ONE_DEVICE})" if self.num_devices == 1 else line

    def __str__(self) -> str:
        return self.marker


def replication_cost(
    model: nn.Module,
    num_devices: int,
    devices: DeviceFactory = pick_devices,
    label: str | None = None,
    width: int | None = None,
) -> ReplicationCost:
    """Replicate ``model`` over ``devices(num_devices)`` for real and count what was copied.

    The model must sit on the first device (for virtual lanes: where you created it).
    """
    targets = list(devices(num_devices))
    copied: dict[str, int] = defaultdict(int)

    def count(transfer: Any) -> None:
        copied[transfer.destination.name] += transfer.nbytes

    handle = add_transfer_listener(count)
    try:
        with torch.no_grad():
            replicas = replicate(model, targets, detach=True)
    finally:
        handle.remove()
    names = [name for name, _ in model.named_parameters()]
    names += [name for name, _ in model.named_buffers()]
    originals = [_tensor_at(model, name) for name in names]
    shares = tuple(
        all(
            _tensor_at(replica, name).data_ptr() == original.data_ptr()
            for name, original in zip(names, originals)
        )
        for replica in replicas
    )
    return ReplicationCost(
        label=label or type(model).__name__,
        width=width,
        devices=tuple(targets),
        parameter_bytes=tensor_bytes(model.parameters()),
        buffer_bytes=tensor_bytes(model.buffers()),
        copied_per_device=tuple(copied[d.name] for d in targets),
        shares_storage=shares,
    )


def replication_figure(cost: ReplicationCost) -> Figure:
    """Left: what each replica holds, copied or shared. Right: bytes copied per forward
    against the device count, the current count marked."""
    # Fixed positions, not a constrained layout: where constrained layout put the panels at
    # every setting (they moved by 2 % of the width), and laying out is half of a redraw.
    figure = Figure(figsize=(FIGURE_WIDTH, 3.3), dpi=DIAGRAM_DPI)
    held = figure.add_axes((0.095, 0.144, 0.445, 0.659))
    growth = figure.add_axes((0.64, 0.144, 0.355, 0.659))
    bytes_axis = FuncFormatter(lambda value, _: human_bytes(value))
    fontsize = 6 if cost.num_devices > 8 else 8

    positions = range(cost.num_devices)
    hatches = ["//" if shared else "" for shared in cost.shares_storage]
    color = Phase.REPLICATE.colour
    for bottom, height, colour in (
        (0, cost.parameter_bytes, color),
        (cost.parameter_bytes, cost.buffer_bytes, BUFFER_COLOR),
    ):
        bars = held.bar(positions, height, bottom=bottom, color=colour, width=0.7)
        for bar, hatch in zip(bars, hatches):
            bar.set_hatch(hatch)
            bar.set_alpha(0.45 if hatch else 1.0)
    for index, (copied, shared) in enumerate(zip(cost.copied_per_device, cost.shares_storage)):
        held.annotate(
            "shared" if shared else human_bytes(copied),
            (index, cost.replica_bytes),
            xytext=(0, 2),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=fontsize,
            rotation=90 if cost.num_devices > 8 else 0,
        )
    # Headroom for the labels above the bars under the legend (one column of three entries
    # up to 2 devices, one row of three beyond)
    held.set_ylim(0, cost.replica_bytes * (1.4 if cost.num_devices > 2 else 1.8))
    held.set_xticks(list(positions), [str(d.index) for d in cost.devices], fontsize=fontsize)
    held.set_xlabel("device index (above each bar: bytes copied there)")
    held.yaxis.set_major_formatter(bytes_axis)
    held.set_title("what each replica holds", fontsize=9)
    held.legend(
        handles=[
            Patch(color=color, label="parameters"),
            Patch(color=BUFFER_COLOR, label="buffers"),
            Patch(facecolor="white", edgecolor="0.3", hatch="//", label="shared with module"),
        ],
        loc="upper right",
        fontsize=7,
        frameon=False,
        ncol=3 if cost.num_devices > 2 else 1,
    )

    counts = list(range(1, MAX_DEVICES + 1))
    growth.plot(counts, [cost.replica_bytes * (n - 1) for n in counts], color=color, marker=".")
    growth.plot([cost.num_devices], [cost.copied_bytes], "o", color=HIGHLIGHT_COLOR, markersize=8)
    low = cost.num_devices < 9  # low on the line: the label goes above it, inside the axes
    growth.annotate(
        f"{cost.num_devices} device{'s' if cost.num_devices > 1 else ''}:\n"
        f"{human_bytes(cost.copied_bytes)}",
        (cost.num_devices, cost.copied_bytes),
        xytext=(8, 4) if low else (-8, 0),
        textcoords="offset points",
        ha="left" if low else "right",
        va="bottom" if low else "top",
        bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1},  # over the line
        fontsize=8,
        color=HIGHLIGHT_COLOR,
    )
    growth.set_xlabel("devices")
    growth.set_xticks([1, 4, 8, 12, 16])
    growth.yaxis.set_major_formatter(bytes_axis)
    growth.set_title("copied on every forward", fontsize=9)
    growth.grid(alpha=0.3)

    copies = cost.num_devices - 1
    what_replicate_does = (
        f"replicate copies {copies} x {human_bytes(cost.replica_bytes)} = "
        f"{human_bytes(cost.copied_bytes)} on every forward"
        if cost.num_devices > 1
        else ONE_DEVICE  # DataParallel does not call replicate at all
    )
    figure.suptitle(
        f"{what_replicate_does}\n"
        + hardware_title(
            cost.devices,
            f"{cost.label}: {human_bytes(cost.parameter_bytes)} parameters + "
            f"{human_bytes(cost.buffer_bytes)} buffers",
        ),
        fontsize=9,
    )
    return figure


@lru_cache(maxsize=8)
def _example_model_on(width: int, device: torch.device) -> nn.Module:
    """One :func:`example_model` per width and device, built once: at width 2048 building it
    (initialising 4 M weights) costs more than replicating it. Only its bytes are read."""
    return example_model(width).to(device)


def model_cost(width: int, num_devices: int, devices: DeviceFactory = pick_devices) -> Any:
    """:func:`replication_cost` of :func:`example_model` (``width``), on the first device."""
    targets = list(devices(num_devices))
    model = _example_model_on(width, targets[0].torch_device)
    return replication_cost(
        model, num_devices, lambda _: targets, label=f"MLP of width {width}", width=width
    )


def replication_explorer(
    width: int = 256, num_devices: int = 4, devices: DeviceFactory = pick_devices
) -> Explorer:
    """The replication explorer widget: MLP width 16-2048, devices 1-16.

    ``.last_data`` is the :class:`ReplicationCost` shown.
    """
    return Explorer(
        [
            int_slider("width", width, 16, MAX_WIDTH, step=16),
            int_slider("devices", num_devices, 1, MAX_DEVICES),
        ],
        compute=lambda **v: model_cost(v["width"], v["devices"], devices),
        draw=replication_figure,
        marker=lambda cost, _values: cost.marker,
    )
