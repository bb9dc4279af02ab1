"""What a trace holds: the phase vocabulary, events and memory records.

One definition of the phases serves the recorder, the exports and the figures: each
:class:`Phase` has its name (what events, hooks and tables call it), its pass (forward or
backward) and its colour. The copies :mod:`dpkit.comm` makes are named after torch's
``torch.nn.parallel.comm`` (:class:`Collective`); which phase a copy belongs to follows from
the collective and the pass (a scatter in backward is ``grad_scatter``), and so does what
the bytes it leaves on a device are (a forward scatter leaves the device its ``input``).

This module imports nothing of dpkit's: exports and figures read traces through it alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

FORWARD, BACKWARD = "forward", "backward"


class Phase(str, Enum):
    """A phase of a DataParallel step. A ``str``: ``Phase.SCATTER == "scatter"``."""

    SCATTER = "scatter"  # the batch split onto the devices
    REPLICATE = "replicate"  # the module copied onto the devices (and its replicas built)
    APPLY = "apply"  # each replica's forward, in its own thread
    GATHER = "gather"  # the outputs concatenated onto the output device
    GRAD_SCATTER = "grad_scatter"  # gather's backward: the output's gradient split
    BACKWARD = "backward"  # each replica's own backward
    REDUCE = "reduce"  # replicate's backward: gradients summed onto device_ids[0]
    GRAD_GATHER = "grad_gather"  # scatter's backward: the input's gradient gathered
    GRAD_BROADCAST = "grad_broadcast"  # reduce's backward (double backward)
    ALLREDUCE = "allreduce"  # DistributedDataParallel's gradient all-reduce
    OPTIMIZER = "optimizer"  # the optimizer's step (dpkit.ddp: each rank steps its own replica)

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def direction(self) -> str:
        """``"forward"`` or ``"backward"``: which pass of the step the phase is part of."""
        return _DIRECTION_AND_COLOUR[self][0]

    @property
    def colour(self) -> str:
        """Its colour in every figure: forward in blues and green, backward in reds, purples
        and yellows; every two phases stay apart under the common colour-vision deficiencies
        (:data:`PHASE_COLOURS`)."""
        return _DIRECTION_AND_COLOUR[self][1]


# Eleven colours from two published colour-blind-safe sets: Paul Tol's (Tol, "Colour
# schemes", SRON/EPS/TN/09-002, 2021: muted, light and vibrant) and Okabe & Ito's ("Color
# Universal Design", 2008). Chosen so that every pair differs by CIEDE2000 >= 10 under normal
# vision and under protanopia, deuteranopia and tritanopia as simulated by Machado, Oliveira &
# Fernandes (2009): tests/test_palette.py measures it. The previous palette (Tableau 10's)
# put apply and reduce 1.2 apart under deuteranopia.
_DIRECTION_AND_COLOUR = {
    Phase.SCATTER: (FORWARD, "#77aadd"),  # Tol light: light blue
    Phase.REPLICATE: (FORWARD, "#99ddff"),  # Tol light: pale cyan
    Phase.APPLY: (FORWARD, "#117733"),  # Tol muted: green
    Phase.GATHER: (FORWARD, "#332288"),  # Tol muted: indigo
    Phase.GRAD_SCATTER: (BACKWARD, "#ee3377"),  # Tol vibrant: magenta
    Phase.BACKWARD: (BACKWARD, "#999933"),  # Tol muted: olive
    Phase.REDUCE: (BACKWARD, "#882255"),  # Tol muted: wine
    Phase.GRAD_GATHER: (BACKWARD, "#ffaabb"),  # Tol light: pink
    Phase.GRAD_BROADCAST: (BACKWARD, "#aa4499"),  # Tol muted: purple
    Phase.ALLREDUCE: (BACKWARD, "#cc79a7"),  # Okabe-Ito: reddish purple
    Phase.OPTIMIZER: (BACKWARD, "#eedd88"),  # Tol light: light yellow; drawn in backward's half
}
FORWARD_PHASES = tuple(p.value for p in Phase if p.direction == FORWARD)
BACKWARD_PHASES = tuple(p.value for p in Phase if p.direction == BACKWARD)
PHASE_COLOURS = {p.value: p.colour for p in Phase}


class Collective(str, Enum):
    """What a copy of :mod:`dpkit.comm` does, in ``torch.nn.parallel.comm``'s words."""

    SCATTER = "scatter"
    BROADCAST = "broadcast"
    REDUCE = "reduce"  # reduce_add
    GATHER = "gather"

    def __str__(self) -> str:
        return self.value

    def phase(self, backward: bool) -> Phase:
        """The phase a copy of this kind is part of, in forward or in backward."""
        return (_BACKWARD_PHASE if backward else _FORWARD_PHASE)[self]


_FORWARD_PHASE = {
    Collective.SCATTER: Phase.SCATTER,
    Collective.BROADCAST: Phase.REPLICATE,
    Collective.REDUCE: Phase.REDUCE,
    Collective.GATHER: Phase.GATHER,
}
_BACKWARD_PHASE = {
    Collective.SCATTER: Phase.GRAD_SCATTER,
    Collective.BROADCAST: Phase.GRAD_BROADCAST,
    Collective.REDUCE: Phase.REDUCE,
    Collective.GATHER: Phase.GRAD_GATHER,
}


@dataclass(slots=True)
class Event:
    """One phase on one device: when it ran, how many bytes it moved, in which step.

    ``phase`` is a :class:`Phase`'s name (a plain ``str``, so that JSON and tables show it
    as it is), ``device`` the device's name and ``kind`` its kind (``"virtual-cpu"``, ...).
    """

    phase: str
    device: str
    start: float
    end: float
    nbytes: int = 0
    step: int = 0
    kind: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(slots=True)
class MemoryRecord:
    """Bytes one device holds in one category during one step.

    Counted categories, which add up: ``parameters`` (the replica's parameters and buffers;
    lane 0's are the module's own), ``input`` (its chunk), ``activations`` (tensors autograd
    saved for backward in that replica), ``outputs`` (what the replica returned) and
    ``gathered`` (the combined output on the output device).

    On real CUDA devices, two more from torch's caching allocator, each a total of everything
    the process holds there (optimizer state and the caller's own tensors too), so they do
    not add to the counted ones: ``allocated (torch)`` (``torch.cuda.memory_allocated`` at
    the end of the step's forward, what backward starts from) and ``peak (torch)``
    (``torch.cuda.max_memory_allocated`` from the step's forward until the next step begins
    or the trace ends: backward and the optimizer step included). Virtual lanes on one GPU
    share its allocator, so only their counted bytes are per lane.
    """

    device: str
    category: str
    nbytes: int
    step: int = 0
    kind: str = ""


# Kinds of events whose device is not a dpkit Device, only a name in a trace.
PREDICTED = "predicted"  # devices of the cost model (dpkit.cost): their events are predictions
RANK = "rank"  # the processes of torch's DistributedDataParallel (dpkit.ddp), a rank each

# What the primitives count, in the order figures and tables show it (others go after).
MEMORY_CATEGORIES = ("parameters", "input", "activations", "outputs", "gathered")
ALLOCATED, PEAK = "allocated (torch)", "peak (torch)"
ALLOCATOR_CATEGORIES = (ALLOCATED, PEAK)  # totals from torch's allocator, not parts of a sum

# What the bytes a forward copy leaves on a device are (a reduce happens only in backward).
HELD_AFTER = {
    Collective.SCATTER: "input",
    Collective.BROADCAST: "parameters",
    Collective.GATHER: "gathered",
}
