"""Figures and widgets built on dpkit: what the course notebooks import.

``timeline(tr)``, ``bytes_per_phase(tr)`` and ``memory_per_device(tr)`` each return a
``matplotlib.figure.Figure``; show it in a notebook by leaving it as a cell's last line, or
save it with ``fig.savefig("timeline.png")``. Needs matplotlib (``pip install dpkit[lab]``).

The explorers and the quiz (modules ``split``, ``replicas``, ``apply``, ``memory``,
``training``, ``beyond``, ``speedup``, ``scaling``, ``prediction_check``, ``quiz``) are
loaded on first use, so ``import dpkit.viz`` needs neither ipywidgets nor tqdm, and a
module that is missing or broken fails only when it is used.
What they share (figure sizes, :func:`~dpkit.viz.common.intra_op_threads`, the demo model)
lives in ``dpkit.viz.common``. Everything here only reads traces; none writes into one.
Imported in a running kernel, it makes the kernel show every figure with its text alternative
under it, as the explorers do (:mod:`dpkit.viz.described`).
"""

from __future__ import annotations

import importlib
from typing import Any

from dpkit.viz.described import describe_figures
from dpkit.viz.figures import bytes_per_phase, memory_per_device, timeline

# isort: split
# The figures' colours and helpers, reachable as dpkit.viz.name though not in __all__.
from dpkit.viz.figures import CATEGORY_COLORS as CATEGORY_COLORS
from dpkit.viz.figures import MEMORY_CATEGORIES as MEMORY_CATEGORIES
from dpkit.viz.figures import PHASE_COLORS as PHASE_COLORS
from dpkit.viz.figures import device_order as device_order
from dpkit.viz.figures import hardware_title as hardware_title
from dpkit.viz.figures import human_bytes as human_bytes
from dpkit.viz.figures import phase_color as phase_color

# Names loaded on first use (ipywidgets and the explorers' models cost import time), by the
# module that defines them: everything ``dpkit.viz.name`` reaches, for the course and tests.
_LAZY_EXPORTS = {
    "explorer": ("Explorer", "figure_png", "int_slider"),
    "alt_text": ("figure_alt_text",),
    "quiz": ("Question", "check_your_understanding"),
    "split": (
        "SplitPlan",
        "example_input",
        "idle_devices_table",
        "scatter_table",
        "split_explorer",
        "split_figure",
        "split_plan",
    ),
    "replicas": (
        "ReplicationCost",
        "example_model",
        "model_cost",
        "replication_cost",
        "replication_explorer",
        "replication_figure",
    ),
    "apply": (
        "ApplyOverlap",
        "MatmulNet",
        "PythonLoopNet",
        "StartSuspects",
        "apply_timeline",
        "apply_trace",
        "gil_comparison",
        "measure_apply_overlap",
        "one_row_forward_ms",
        "overlap_figure",
        "start_suspects",
        "thread_start_ms",
        "timeline_explorer",
    ),
    "memory": (
        "MemoryRun",
        "WithLoss",
        "held_per_device",
        "memory_explorer",
        "memory_figure",
        "memory_trace",
    ),
    "beyond": (
        "bubble_figure",
        "ddp_explorer",
        "pipeline_explorer",
        "timelines_on_one_clock",
        "traffic_and_memory",
    ),
    "training": (
        "backward_explorer",
        "backward_timeline",
        "compare_with_single_device",
        "loss_curve",
        "train",
        "training_trace",
    ),
    "scaling": (
        "SpeedupGrid",
        "hardware_table",
        "phase_timeline",
        "scaling_explorer",
        "scaling_figure",
        "scaling_rows",
        "speedup_grid",
        "speedup_heatmap",
        "traffic",
    ),
    "prediction_check": ("Comparison", "comparison_figure", "measure_against_prediction"),
    "speedup": (
        "SpeedupSeries",
        "measure_speedups",
        "predicted_speedups",
        "speedup_spread_figure",
    ),
}
SUBMODULES = ("figures", "common", "margins", "described", *_LAZY_EXPORTS)
_OWNER = {name: module for module, names in _LAZY_EXPORTS.items() for name in names}

# What the course calls: the three figures of a trace, the explorers, the quiz, and the
# experiments the notebooks run (the rest stays reachable as ``dpkit.viz.name``).
__all__ = [
    "bytes_per_phase",
    "memory_per_device",
    "timeline",
    # explorers
    "backward_explorer",
    "ddp_explorer",
    "memory_explorer",
    "pipeline_explorer",
    "replication_explorer",
    "scaling_explorer",
    "split_explorer",
    "timeline_explorer",
    # the quiz
    "Question",
    "check_your_understanding",
    # the notebooks' experiments and their figures
    "WithLoss",
    "apply_timeline",
    "apply_trace",
    "compare_with_single_device",
    "comparison_figure",
    "gil_comparison",
    "held_per_device",
    "loss_curve",
    "measure_against_prediction",
    "measure_speedups",
    "memory_figure",
    "memory_trace",
    "overlap_figure",
    "predicted_speedups",
    "speedup_spread_figure",
    "split_figure",
    "split_plan",
    "start_suspects",
    "train",
    "training_trace",
]


def __getattr__(name: str) -> Any:
    if name in SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _OWNER:
        return getattr(importlib.import_module(f"{__name__}.{_OWNER[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_OWNER, *SUBMODULES})


describe_figures()  # in a kernel: every figure with its text alternative (a no-op elsewhere)
