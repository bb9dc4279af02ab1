"""What the explorers share: figure sizes, naming the hardware, CPU threads, the demo model.

The surprise first: virtual CPU lanes share the machine's cores, and torch spreads every op
over all of them by default, so four lanes each asking for every core fight over them and
measure the fight, not data parallelism. :func:`intra_op_threads` gives torch one thread per
lane for the duration of a measurement; :func:`cores` says how many cores there are to share.

Every explorer module (``split``, ``replicas``, ``apply``, ``memory``, ``training``) takes
these from here rather than from each other.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import torch
from matplotlib.figure import Figure
from torch import nn

from dpkit.device import Device
from dpkit.threads import intra_op_threads  # noqa: F401 (the explorers import it from here)
from dpkit.tracing import KIND_LABELS, Trace
from dpkit.viz.explorer import drawn_marker
from dpkit.viz.figures import timeline

FIGURE_WIDTH = 7.0  # inches; every notebook figure is this wide
FIGURE_DPI = 90  # the trace figures: timelines, memory, training
DIAGRAM_DPI = 100  # the split and replication figures
MAX_DEVICES = 16  # the most devices the split and replication explorers offer

DeviceFactory = Callable[[int], Sequence[Device]]  # n -> n devices, as dpkit.devices


def compact(figure: Figure, width: float = FIGURE_WIDTH, height: float | None = None) -> Figure:
    """Resize a dpkit figure to notebook size (constrained layout re-flows it)."""
    old_width, old_height = figure.get_size_inches()
    figure.set_size_inches(width, height if height is not None else old_height * 0.8)
    figure.set_dpi(FIGURE_DPI)
    return figure


# What DataParallel does on one device, said wherever an explorer shows one (torch's
# DataParallel.forward: ``if len(self.device_ids) == 1: return self.module(*inputs[0], ...)``).
ONE_DEVICE = "1 device: DataParallel calls the module itself, no copies"


def one_device_note(recorded: Trace | Sequence[object]) -> str | None:
    """:data:`ONE_DEVICE` when the trace (or its events) shows one device, else None."""
    events = recorded.events if hasattr(recorded, "events") else recorded
    return ONE_DEVICE if len({e.device for e in events}) == 1 else None


def notebook_timeline(recorded: Trace) -> Figure:
    """The timeline of a trace's last step, notebook-sized: a row per device; on one device
    the title's second line says what DataParallel does there."""
    rows = len({e.device for e in recorded.events})
    figure = timeline(recorded)
    axes = figure.axes[0]
    text_lines = axes.get_xlabel().count("\n") + (rows == 1)  # beyond one line each
    # Tall enough for the legend beside it (a phase 0.2 inch), which must not reach the label
    legend_entries = len(axes.get_legend().get_texts()) if axes.get_legend() else 0
    height = max(1.3 + 0.42 * rows, 1.2 + 0.2 * legend_entries) + 0.22 * text_lines
    compact(figure, height=height)
    note = one_device_note(recorded)
    if note is not None:
        axes.set_title(f"{axes.get_title()}\n{note}", pad=14)
    return figure


def one_device_marker(data: object, values: dict[str, object]) -> str:
    """The explorers' marker line, with :data:`ONE_DEVICE` appended at one device."""
    line = drawn_marker(data, values)
    return f"{line} ({ONE_DEVICE})" if values.get("devices") == 1 else line


def hardware_of(lanes: Sequence[Device]) -> str:
    """How a figure names the devices it measured: "virtual devices on the CPU", ..."""
    return " + ".join(sorted({KIND_LABELS[d.kind] for d in lanes}))


def cores() -> int:
    """CPU cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def demo_model(seed: int = 0) -> nn.Module:
    """The MLP the apply and training explorers run: a step takes milliseconds on a CPU."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )
