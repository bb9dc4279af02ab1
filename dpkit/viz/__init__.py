"""Figures and widgets built on dpkit: what the course notebooks import.

``timeline(tr)``, ``bytes_per_phase(tr)`` and ``memory_per_device(tr)`` each return a
``matplotlib.figure.Figure``; show it in a notebook by leaving it as a cell's last line, or
save it with ``fig.savefig("timeline.png")``. Needs matplotlib (``pip install dpkit[lab]``).

The explorers and the quiz (modules ``split``, ``replicas``, ``apply``, ``memory``,
``training``, ``quiz``) are loaded on first use, so ``import dpkit.viz`` needs neither
ipywidgets nor tqdm, and a module that is missing or broken fails only when it is used.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from dpkit.viz.figures import (
    CATEGORY_COLORS,
    MEMORY_CATEGORIES,
    PHASE_COLORS,
    bytes_per_phase,
    device_order,
    hardware_title,
    human_bytes,
    memory_per_device,
    phase_color,
    timeline,
)

# Lazily loaded names, by the module that defines them.
_LAZY_EXPORTS = {
    "quiz": ("Question", "check_your_understanding"),
    "apply": (
        "ApplyOverlap",
        "MatmulNet",
        "PythonLoopNet",
        "apply_timeline",
        "apply_trace",
        "gil_comparison",
        "measure_apply_overlap",
        "overlap_figure",
        "timeline_explorer",
    ),
    "memory": ("WithLoss", "held_per_device", "memory_explorer", "memory_figure", "memory_trace"),
    "training": (
        "SpeedupRow",
        "backward_explorer",
        "backward_timeline",
        "compare_with_single_device",
        "loss_curve",
        "measure_speedup",
        "speedup_figure",
        "train",
        "training_trace",
    ),
}
# Modules whose public names are found on demand (their own __all__, else what they define).
_DISCOVERED = ("split", "replicas")
SUBMODULES = ("figures", *_LAZY_EXPORTS, *_DISCOVERED)
_OWNER = {name: module for module, names in _LAZY_EXPORTS.items() for name in names}

__all__ = [
    "CATEGORY_COLORS",
    "MEMORY_CATEGORIES",
    "PHASE_COLORS",
    "bytes_per_phase",
    "device_order",
    "hardware_title",
    "human_bytes",
    "memory_per_device",
    "phase_color",
    "timeline",
    *_OWNER,
]


def _submodule(name: str) -> ModuleType:
    return importlib.import_module(f"{__name__}.{name}")


def _public_names(module: ModuleType) -> list[str]:
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and getattr(value, "__module__", None) == module.__name__
    ]


def _optional(name: str) -> ModuleType | None:
    """A discovered module, or None while it does not exist yet."""
    try:
        return _submodule(name)
    except ModuleNotFoundError as error:
        if error.name == f"{__name__}.{name}":
            return None
        raise


def __getattr__(name: str) -> Any:
    if name in SUBMODULES:
        return _submodule(name)
    if name in _OWNER:
        return getattr(_submodule(_OWNER[name]), name)
    for module_name in _DISCOVERED:
        module = _optional(module_name)
        if module is not None and name in _public_names(module):
            return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    discovered = [
        name
        for module in filter(None, map(_optional, _DISCOVERED))
        for name in _public_names(module)
    ]
    return sorted({*globals(), *__all__, *SUBMODULES, *discovered})
