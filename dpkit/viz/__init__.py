"""Figures built on a Trace (matplotlib, object-oriented API: headless and thread-safe).

``timeline(tr)``, ``bytes_per_phase(tr)`` and ``memory_per_device(tr)`` each return a
``matplotlib.figure.Figure``; show it in a notebook by leaving it as a cell's last line, or
save it with ``fig.savefig("timeline.png")``. Needs matplotlib (``pip install dpkit[lab]``).
"""

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
]
