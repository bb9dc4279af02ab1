"""The split explorer: how scatter cuts a batch into one chunk per device, and who sits idle.

The surprise first: ``torch.chunk`` (and so ``nn.DataParallel``) cuts chunks of
``ceil(batch / devices)`` rows, so 10 rows over 8 devices are 5 chunks of 2 and 3 devices
get nothing: no chunk, no replica, no work. A batch smaller than the device count always
leaves devices idle, and so do some larger ones (36 rows over 7 devices use only 6).

Three layers, each usable alone:

- :func:`split_plan` runs a real :func:`dpkit.scatter` on the devices ``dpkit.devices(n)``
  picks here and reports what each device got (:class:`SplitPlan`);
- :func:`split_figure` draws a plan (a ``matplotlib.figure.Figure``, no pyplot state);
- :func:`split_explorer` puts sliders on top; every redraw also writes a one-line marker
  naming the values shown (``batch=10 devices=8 -> chunks [2, 2, 2, 2, 2], idle: 3 ...``),
  which a browser test waits for before it compares images.

:func:`scatter_table` shows what ``scatter_kwargs`` hands each device for nested inputs and
keyword arguments.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from dpkit.device import Device
from dpkit.device import devices as pick_devices
from dpkit.lanes import device_of
from dpkit.scatter import scatter, scatter_kwargs
from dpkit.tracing import Phase
from dpkit.tracing.export import as_dataframe
from dpkit.viz.common import DIAGRAM_DPI, FIGURE_WIDTH, MAX_DEVICES, ONE_DEVICE, DeviceFactory
from dpkit.viz.explorer import Explorer, int_slider
from dpkit.viz.figures import HIGHLIGHT_COLOR, hardware_title

SPLIT_MODES = {"torch": "torch.chunk", "balanced": "balanced"}
FEATURES = 3  # columns of the example input
SEQUENCE = 5  # time steps of the sequence-first example input (dim=1)
IDLE_COLOR = HIGHLIGHT_COLOR
MAX_BATCH = 512


def example_input(batch: int, dim: int = 0) -> torch.Tensor:
    """An input whose every entry is its sample's index, with the batch along ``dim``.

    ``dim=0``: shape ``(batch, 3)``, batch-first. ``dim=1``: shape ``(5, batch, 3)``,
    sequence-first, the layout of an RNN without ``batch_first``, which is what
    ``DataParallel(..., dim=1)`` is for.
    """
    if dim not in (0, 1):
        raise ValueError(f"dim={dim!r}: the explorer shows dim=0 (batch-first) or dim=1")
    samples = torch.arange(batch, dtype=torch.float32)
    if dim == 0:
        return samples[:, None].expand(batch, FEATURES).contiguous()
    return samples[None, :, None].expand(SEQUENCE, batch, FEATURES).contiguous()


@dataclass(frozen=True)
class SplitPlan:
    """What a real scatter of ``batch`` rows over ``num_devices`` devices gave each device.

    ``chunk_sizes`` and ``samples`` have one entry per device, in device order: an idle
    device has size 0 and no samples.
    """

    batch: int
    num_devices: int
    dim: int
    mode: str
    input_shape: tuple[int, ...]
    devices: tuple[Device, ...]
    chunk_sizes: tuple[int, ...]
    samples: tuple[tuple[int, ...], ...]

    @property
    def used_sizes(self) -> list[int]:
        """The chunk sizes of the devices that got one (what ``scatter`` returns)."""
        return [size for size in self.chunk_sizes if size]

    @property
    def used(self) -> int:
        return len(self.used_sizes)

    @property
    def idle(self) -> int:
        return self.num_devices - self.used

    @property
    def idle_devices(self) -> list[int]:
        return [i for i, size in enumerate(self.chunk_sizes) if size == 0]

    @property
    def even_share(self) -> float:
        return self.batch / self.num_devices

    @property
    def marker(self) -> str:
        """One line naming what is shown; a browser test waits for it."""
        line = (
            f"batch={self.batch} devices={self.num_devices} -> chunks {self.used_sizes}, "
            f"idle: {self.idle} (split={self.mode}, dim={self.dim})"
        )
        return f"{line} ({ONE_DEVICE})" if self.num_devices == 1 else line

    def __str__(self) -> str:
        return self.marker


def _positive_int(value: Any, name: str, largest: int | None = None) -> int:
    """``value`` if it is an int from 1 to ``largest``, else a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    if largest is not None and value > largest:
        raise ValueError(f"{name}={value} is more than the explorer shows; use at most {largest}")
    return value


def split_plan(
    batch: int,
    num_devices: int,
    dim: int = 0,
    mode: str = "torch",
    devices: DeviceFactory = pick_devices,
) -> SplitPlan:
    """Scatter a real ``batch``-row input over ``devices(num_devices)`` and report the chunks.

    ``mode="torch"`` splits as ``torch.chunk`` (what DataParallel does); ``"balanced"`` uses
    dpkit's ``chunk_sizes="balanced"`` (sizes differ by at most one, every device busy while
    there are rows enough). ``devices`` makes the device list (default ``dpkit.devices``:
    real accelerators where there are enough, else virtual lanes).
    """
    _positive_int(batch, "batch")
    _positive_int(num_devices, "num_devices")
    if mode not in SPLIT_MODES:
        raise ValueError(f"mode={mode!r} is not known; use one of {sorted(SPLIT_MODES)}")
    targets = list(devices(num_devices))
    x = example_input(batch, dim).to(targets[0].torch_device)
    chunks = scatter(x, targets, dim=dim, chunk_sizes=None if mode == "torch" else "balanced")
    sizes, samples = [0] * num_devices, [()] * num_devices
    for chunk in chunks:
        index = targets.index(device_of(chunk))
        sizes[index] = chunk.shape[dim]
        # Every entry holds its sample's index: read one feature (and one time step).
        rows = chunk[:, 0] if dim == 0 else chunk[0, :, 0]
        samples[index] = tuple(int(v) for v in rows.tolist())
    return SplitPlan(
        batch=batch,
        num_devices=num_devices,
        dim=dim,
        mode=mode,
        input_shape=tuple(x.shape),
        devices=tuple(targets),
        chunk_sizes=tuple(sizes),
        samples=tuple(samples),
    )


def split_figure(plan: SplitPlan) -> Figure:
    """One bar per device: the rows of its chunk; idle devices shaded and labelled."""
    figure = Figure(figsize=(FIGURE_WIDTH, 3.3), dpi=DIAGRAM_DPI, layout="constrained")
    axes = figure.add_subplot()
    positions = range(plan.num_devices)
    fontsize = 7 if plan.num_devices > 10 else 8
    bars = axes.bar(positions, plan.chunk_sizes, color=Phase.SCATTER.colour, width=0.7)
    labels = [str(size) if size else "" for size in plan.chunk_sizes]
    axes.bar_label(bars, labels=labels, fontsize=fontsize, padding=2)
    top = max(max(plan.chunk_sizes), plan.even_share) * 1.2
    for index in plan.idle_devices:
        axes.axvspan(index - 0.4, index + 0.4, color=IDLE_COLOR, alpha=0.15, linewidth=0)
        axes.text(
            index,
            top / 2,
            "idle",
            rotation=90,
            ha="center",
            va="center",
            color=IDLE_COLOR,
            fontsize=fontsize + 1,
            weight="bold",
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.7, "pad": 1},
        )
    axes.axhline(plan.even_share, color="0.35", linestyle="--", linewidth=1)
    axes.set_ylim(0, top)
    axes.set_xlim(-0.6, plan.num_devices - 0.4)
    axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xticks(list(positions), [str(d.index) for d in plan.devices], fontsize=fontsize)
    axes.set_xlabel("device index")
    axes.set_ylabel("samples in its chunk")
    figure.legend(
        handles=[
            Patch(color=Phase.SCATTER.colour, label="gets a chunk: a replica runs"),
            # only when a device is idle: a legend entry names something drawn
            *[Patch(color=IDLE_COLOR, alpha=0.3, label="idle: no chunk, no replica")]
            * (plan.idle > 0),
            Line2D(
                [],
                [],
                color="0.35",
                linestyle="--",
                label=f"batch / devices = {plan.even_share:.3g}",
            ),
        ],
        loc="outside lower center",
        ncol=3,
        fontsize=8,
        frameon=False,
    )
    device_word = "device" if plan.num_devices == 1 else "devices"
    figure.suptitle(
        f"batch {plan.batch} over {plan.num_devices} {device_word} with "
        f"{SPLIT_MODES[plan.mode]}: {plan.used} used, {plan.idle} idle",
        fontsize=10,
        weight="bold",
    )
    shape = "(" + ", ".join(map(str, plan.input_shape)) + ")"
    where = hardware_title(plan.devices, f"x of shape {shape} split along dim {plan.dim}")
    axes.set_title(where + (f"\n{ONE_DEVICE}" if plan.num_devices == 1 else ""), fontsize=9)
    return figure


# --------------------------------------------------------------------------------------
# Nested inputs and keyword arguments.


def structure(obj: Any) -> str:
    """A short picture of an input: tensors by shape, containers by content, others by value."""
    if isinstance(obj, torch.Tensor):
        return "tensor[" + ", ".join(map(str, obj.shape)) + "]"
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        inner = ", ".join(f"{k}={structure(v)}" for k, v in zip(obj._fields, obj))
        return f"{type(obj).__name__}({inner})"
    if isinstance(obj, tuple):
        return "(" + ", ".join(map(structure, obj)) + ("," if len(obj) == 1 else "") + ")"
    if isinstance(obj, list):
        return "[" + ", ".join(map(structure, obj)) + "]"
    if isinstance(obj, dict):
        return "{" + ", ".join(f"{k!r}: {structure(v)}" for k, v in obj.items()) + "}"
    return repr(obj)


def scatter_table(
    inputs: tuple[Any, ...],
    kwargs: dict[str, Any] | None,
    devices: Sequence[Device],
    dim: int = 0,
    chunk_sizes: Any = None,
) -> Any:
    """One row per device: the positional and keyword inputs ``scatter_kwargs`` gives it.

    A DataFrame where pandas is installed, else a list of dicts. Devices that get no chunk
    have a row saying so.
    """
    args, kws = scatter_kwargs(inputs, kwargs, devices, dim=dim, chunk_sizes=chunk_sizes)
    rows = []
    for index, device in enumerate(devices):
        if index < len(args):
            given = {"args": structure(args[index]), "kwargs": structure(kws[index])}
        else:
            given = {"args": "idle: no chunk", "kwargs": "idle: no chunk"}
        rows.append({"device": device.name, **given})
    return as_dataframe(rows)


# --------------------------------------------------------------------------------------
# Widgets: a figure redrawn into an Image, a marker line, and the controls by label.


def _split_controls(batch: int, num_devices: int, dim: int, mode: str) -> list[Any]:
    import ipywidgets as widgets

    return [
        int_slider("batch", batch, 1, MAX_BATCH),
        int_slider("devices", num_devices, 1, MAX_DEVICES),
        widgets.Dropdown(
            options=[
                (f"0: x is (batch, {FEATURES})", 0),
                (f"1: x is ({SEQUENCE}, batch, {FEATURES})", 1),
            ],
            value=dim,
            description="dim",
        ),
        widgets.ToggleButtons(
            options=[(label, key) for key, label in SPLIT_MODES.items()],
            value=mode,
            description="split",
        ),
    ]


def split_explorer(
    batch: int = 10,
    num_devices: int = 8,
    dim: int = 0,
    mode: str = "torch",
    devices: DeviceFactory = pick_devices,
) -> Explorer:
    """The split explorer widget: batch 1-512, devices 1-16, dim, torch.chunk vs balanced.

    ``.last_data`` is the :class:`SplitPlan` shown.
    """
    controls = _split_controls(
        _positive_int(batch, "batch", MAX_BATCH),
        _positive_int(num_devices, "num_devices", MAX_DEVICES),
        dim,
        mode,
    )
    return Explorer(
        controls,
        compute=lambda **v: split_plan(v["batch"], v["devices"], v["dim"], v["split"], devices),
        draw=split_figure,
        marker=lambda plan, _values: plan.marker,
    )


def idle_devices_table(num_devices: int, batches: Sequence[int]) -> Any:
    """For each batch size: chunks, used and idle devices under torch.chunk (real scatters)."""
    rows = []
    for batch in batches:
        plan = split_plan(batch, num_devices)
        rows.append(
            {
                "batch": batch,
                "chunk sizes": plan.used_sizes,
                "used": plan.used,
                "idle": plan.idle,
                "rows per chunk": math.ceil(batch / num_devices),
            }
        )
    return as_dataframe(rows)
