"""What the cost model knows about a machine: a :class:`Hardware` made of :class:`Link` objects.

The surprise first: a spec sheet's peak is never what a step gets. An A100's matmuls in
float32 run on its CUDA cores (19.5 TFLOP/s) unless TF32 is switched on, its convolutions
run in TF32 by default (156 TFLOP/s), and under autocast both run on tensor cores (312).
Real kernels reach a fraction of each peak, so a Hardware keeps the peaks (cited in
:mod:`dpkit.cost.presets`) and one achieved fraction, and the model only ever uses their
product. Link bandwidths are stored achieved (what nccl-tests reports as bus bandwidth, or
a spec sheet times a stated fraction), since that is what published measurements give.

How each field is used, in one place (:mod:`dpkit.cost.predict` is the rest):

- an op takes ``max(FLOPs / (peak[dtype] * efficiency[dtype]), bytes / (memory_bandwidth *
  memory_efficiency))`` on its device (``efficiency``: ``tensor_core_efficiency`` where it
  names the dtype, else ``matmul_efficiency``), or what ``op_seconds`` measured for its op;
- a copy or a collective of ``S`` bytes over a link takes ``latency + S / bandwidth`` per
  message (alpha-beta), see :mod:`dpkit.cost.collectives`;
- the host pays a few named overheads (the last group of fields), the same for every model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch


def _check(owner: str, name: str, value: object, kind: str = "positive") -> None:
    """Refuse what ``kind`` is not: ``"positive"`` a finite number above 0, ``"count"`` a
    whole one, ``"fraction"`` one in (0, 1], ``"flag"`` True or False."""
    if kind == "flag":
        if not isinstance(value, bool):
            raise TypeError(f"{owner}: {name}={value!r} must be True or False")
        return
    want = "a whole number" if kind == "count" else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{owner}: {name}={value!r} must be {want}, not {type(value).__name__}")
    if kind == "count" and value != int(value):
        raise ValueError(f"{owner}: {name}={value!r} must be a whole number (a count)")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{owner}: {name}={value!r} must be finite and above 0")
    if kind == "fraction" and value > 1:
        raise ValueError(f"{owner}: {name}={value!r} must be a fraction in (0, 1] of a peak")


def _sample(value: object) -> bool:
    """Whether ``value`` is work or seconds of a measured op: a finite number, 0 or more."""
    return isinstance(value, (int, float)) and math.isfinite(value) and value >= 0


@dataclass(frozen=True)
class Link:
    """One kind of connection: ``bandwidth`` achieved in one direction (bytes/s), the
    ``latency`` of one message (s), and where the numbers come from. A message of ``n``
    bytes takes ``latency + n / bandwidth`` (the alpha-beta, or Hockney, model)."""

    bandwidth: float
    latency: float
    source: str = ""

    def __post_init__(self) -> None:
        _check("Link", "bandwidth (bytes/s)", self.bandwidth)
        _check("Link", "latency (s)", self.latency)

    def time(self, nbytes: float) -> float:
        """Seconds to move ``nbytes`` over this link, one message."""
        return self.latency + nbytes / self.bandwidth


# Op samples: for one kind of op (an aten op such as "aten.addmm"), measured (work, seconds)
# pairs, work being the op's FLOPs where it has any, else the bytes it reads and writes.
OpSamples = tuple[tuple[float, float], ...]

_HOST = (
    "op_overhead", "backward_op_overhead", "gil_handoff", "thread_start", "module_overhead",
    "copy_overhead", "step_overhead",
)  # fmt: skip
_KINDS = {  # what __post_init__ checks each plain field is
    **dict.fromkeys(("memory_bandwidth", "memory_capacity", "compute_units", *_HOST), "positive"),
    **dict.fromkeys(("matmul_efficiency", "memory_efficiency"), "fraction"),
    **dict.fromkeys(("devices_per_node", "nodes", "nics_per_node"), "count"),
    **dict.fromkeys(("peer_to_peer", "virtual_lanes"), "flag"),
}


@dataclass(frozen=True)
class Hardware:
    """A machine as the cost model sees it.

    Compute, per device:

    - ``peak_flops``: spec-sheet FLOP/s by the dtype an op computes in: ``"float32"`` (CUDA
      cores), ``"tfloat32"``, ``"bfloat16"``, ``"float16"`` (tensor cores). Which one an op
      gets follows torch's defaults (:func:`dpkit.cost.compute.rate_key`).
    - ``matmul_efficiency``: the fraction of that peak matmuls and convolutions reach.
    - ``tensor_core_efficiency``: by dtype (``"tfloat32"``, ``"float16"``, ``"bfloat16"``),
      the fraction of that dtype's peak convolutions and matmuls reach on tensor cores,
      where it was measured apart; ``matmul_efficiency`` then serves the CUDA cores. A
      dtype it does not name uses ``matmul_efficiency``.
    - ``memory_bandwidth`` and ``memory_efficiency``: spec-sheet bytes/s of the device's
      memory and the fraction memory-bound ops (elementwise, norms, pooling) reach.
    - ``memory_capacity``: bytes one device holds (what "does it fit" is checked against).
    - ``compute_units``: devices of a node that compute at full speed at once (each GPU is
      its own; virtual CPU lanes share the cores).
    - ``op_seconds``: measured ``(work, seconds)`` per kind of aten op, filled by
      :func:`~dpkit.cost.calibrate` on this machine; ops without samples use the peaks.

    Links (:class:`Link`): ``host_to_device`` (PCIe on a GPU box), ``device_to_device``
    (inside a node: NVLink or PCIe; the bus bandwidth NCCL's ring reaches, also used for a
    plain copy), ``node_to_node`` (one network port). Topology: ``devices_per_node``,
    ``nodes`` (as named; a DDP prediction on more devices assumes more such nodes),
    ``nics_per_node`` (ports a node's devices share), ``peer_to_peer`` (False: copies and
    NCCL go through host memory, over ``host_to_device`` twice), ``allreduce_bandwidth``
    (NVLink SHARP on an H100 NVSwitch: the switch sums, each device sends and receives its
    bytes once, at this *algorithm* bandwidth; None: the ring only).

    ``virtual_lanes``: dpkit's virtual CPU
    lanes, where the host does every copy itself, through device 0, one after another, the
    lanes' threads share ``compute_units`` cores and autograd runs every replica's backward
    in one thread; False: GPUs, where the host queues work and runs ahead, torch's
    DataParallel broadcasts and reduces with NCCL, and each device has its backward thread.

    Host overheads, seconds, the same for every model:

    - ``op_overhead``: one call of a forward's Python into torch (Python, the dispatcher,
      the kernels it launches), and one tensor a copy moves;
    - ``backward_op_overhead``: one op of a backward (the autograd engine, no Python);
    - ``gil_handoff``: per op of a replica's forward while several replica threads run, the
      GIL handed from thread to thread (their Python runs one thread at a time);
    - ``thread_start``: parallel_apply starting one worker thread;
    - ``module_overhead``: replicate building one module object of one replica;
    - ``copy_overhead``: the host's part of one copy call or one collective, beyond its ops;
    - ``step_overhead``: one step outside its phases (DataParallel's checks, the loss's
      Python, autograd starting and finishing).
    """

    name: str
    description: str
    device_name: str
    source: str
    peak_flops: Mapping[str, float]
    matmul_efficiency: float
    memory_bandwidth: float
    memory_efficiency: float
    memory_capacity: float
    compute_units: float
    host_to_device: Link
    device_to_device: Link
    node_to_node: Link
    devices_per_node: int
    nodes: int
    nics_per_node: int
    peer_to_peer: bool
    virtual_lanes: bool
    op_overhead: float
    backward_op_overhead: float
    gil_handoff: float
    thread_start: float
    module_overhead: float
    copy_overhead: float
    step_overhead: float
    allreduce_bandwidth: float | None = None
    op_seconds: Mapping[str, OpSamples] = field(default_factory=dict)
    tensor_core_efficiency: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        owner = f"Hardware {self.name!r}"
        for name, kind in _KINDS.items():
            _check(owner, name, getattr(self, name), kind)
        for name in ("host_to_device", "device_to_device", "node_to_node"):
            if not isinstance(getattr(self, name), Link):
                raise TypeError(f"{owner}: {name} must be a dpkit.cost.Link")
        if not isinstance(self.peak_flops, Mapping) or "float32" not in self.peak_flops:
            raise ValueError(f"{owner}: peak_flops must map dtype names to FLOP/s, float32 too")
        for dtype, rate in self.peak_flops.items():
            _check(owner, f"peak_flops[{dtype!r}]", rate)
        for dtype, fraction in self.tensor_core_efficiency.items():
            _check(owner, f"tensor_core_efficiency[{dtype!r}]", fraction, "fraction")
            if dtype not in self.peak_flops:
                raise ValueError(f"{owner}: tensor_core_efficiency[{dtype!r}] must be of a "
                                 "dtype that peak_flops names")  # fmt: skip
        if self.allreduce_bandwidth is not None:
            _check(owner, "allreduce_bandwidth", self.allreduce_bandwidth)
        for op, samples in self.op_seconds.items():
            if not samples or not all(
                len(pair) == 2 and all(map(_sample, pair)) for pair in samples
            ):
                raise ValueError(f"{owner}: op_seconds[{op!r}] must be (work, seconds) pairs")

    @property
    def max_devices(self) -> int:
        """Devices in the system as named (``nodes * devices_per_node``)."""
        return self.nodes * self.devices_per_node

    def flops_per_second(self, rate: torch.dtype | str) -> float:
        """Achieved FLOP/s at ``rate`` (``"float32"``, ``"tfloat32"``, ``"bfloat16"``, ...)."""
        name = str(rate).removeprefix("torch.")
        if name not in self.peak_flops:
            known = ", ".join(sorted(self.peak_flops))
            raise ValueError(
                f"hardware {self.name!r} has no {name} rate (it has {known}): "
                f"{self.device_name} has no units for it; use another dtype or amp setting"
            )
        return self.peak_flops[name] * self.tensor_core_efficiency.get(name, self.matmul_efficiency)

    @property
    def achieved_memory_bandwidth(self) -> float:
        """Bytes/s that memory-bound ops reach: ``memory_bandwidth * memory_efficiency``."""
        return self.memory_bandwidth * self.memory_efficiency

    def device_link(self) -> Link:
        """Two devices of one node: directly, or through host memory (down and up)."""
        if self.peer_to_peer:
            return self.device_to_device
        host = self.host_to_device
        return Link(host.bandwidth / 2, 2 * host.latency, "through host memory: down and up")

    def network_link(self) -> Link:
        """What a collective spanning nodes gets from the network: NCCL runs a ring per
        port, so a node's ports add up (``nics_per_node`` x one port's bandwidth)."""
        port = self.node_to_node
        return Link(port.bandwidth * self.nics_per_node, port.latency, port.source)

    def summary(self) -> str:
        """One line: the name, then what it is (``dpkit predict --list`` prints these)."""
        return f"{self.name}: {self.description}"
