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

from dpkit.devices import Device
from dpkit.threads import intra_op_threads  # noqa: F401 (the explorers import it from here)
from dpkit.tracing import Trace
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


def notebook_timeline(recorded: Trace) -> Figure:
    """The timeline of a trace's last step, notebook-sized: a row per device."""
    rows = len({e.device for e in recorded.events})
    return compact(timeline(recorded), height=1.3 + 0.42 * rows)


def hardware_of(lanes: Sequence[Device]) -> str:
    """How a figure names the devices it measured: "virtual devices on the CPU", ..."""
    return " + ".join(sorted({d.label for d in lanes}))


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
