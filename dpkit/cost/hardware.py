"""What the cost model knows about a machine: a :class:`Hardware` made of :class:`Link` objects.

The surprise first: every number here is an *achieved* number, not the spec sheet's. A spec
sheet gives peaks (an A100's 19.5 TFLOP/s in float32, NVLink's 300 GB/s per direction);
real kernels and real copies reach a fraction of them. So a Hardware keeps the peak (with
its source, in :mod:`dpkit.cost.presets`) *and* the fraction assumed, and the model only
ever uses their product. Link bandwidths are stored already achieved (for NVLink and
InfiniBand, what nccl-tests reports as bus bandwidth), since that is what published
measurements give.

Three groups of fields:

- **compute, per device**: peak FLOP/s per dtype and the fraction reached, memory bandwidth
  and its fraction (for memory-bound ops), how many devices can compute at once at full speed,
  and, once :func:`dpkit.cost.calibrate` has run, measured seconds per kind of op;
- **links**: host↔device, device↔device and node↔node, each a bandwidth and a latency, and
  the topology: devices per node, network ports per node (shared by that node's devices),
  whether device-to-device copies go peer to peer or through host memory, and whether
  DataParallel's copies funnel one after another through device 0's link;
- **host overheads**: what the Python side costs per op, per copy, per thread, per replica
  module: on a GPU these hide behind the device's work, on CPU lanes they *are* the work.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace

import torch


@dataclass(frozen=True)
class Link:
    """One kind of connection: ``bandwidth`` achieved in one direction (bytes/s) and the
    ``latency`` of one transfer (s). A transfer of ``n`` bytes takes ``latency + n /
    bandwidth`` (the alpha-beta, or Hockney, model of a message)."""

    bandwidth: float
    latency: float

    def time(self, nbytes: float) -> float:
        """Seconds to move ``nbytes`` over this link, one transfer."""
        return self.latency + nbytes / self.bandwidth


# Op samples: for one kind of op (an aten op such as "aten.addmm"), measured (work, seconds)
# pairs, work being the op's FLOPs where it has any, else the bytes it reads and writes.
OpSamples = tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class Hardware:
    """A machine as the cost model sees it. Every field is documented; presets cite sources.

    Compute (per device):

    - ``peak_flops``: spec-sheet FLOP/s by dtype name (``"float32"``, ``"bfloat16"``, ...).
    - ``compute_efficiency``: the fraction of ``peak_flops`` that matmul-like ops reach.
    - ``memory_bandwidth``: spec-sheet bytes/s of the device's own memory (HBM, GDDR, DRAM).
    - ``memory_efficiency``: the fraction of ``memory_bandwidth`` memory-bound ops reach.
    - ``compute_units``: how many devices of one node can compute at full speed at once:
      every GPU has its own, so ``devices_per_node``; virtual CPU lanes share the cores.
    - ``op_seconds``: measured (work, seconds) samples per kind of op (``"aten.addmm"``) and
      per kind and shape (``"aten.addmm@401408"``, see ``OpCost.shape_key``), filled by
      :func:`~dpkit.cost.calibrate` on this machine; ops without samples use the roofline
      (FLOPs at the achieved FLOP/s or bytes at the achieved bandwidth, whichever is slower).

    Links (:class:`Link`, achieved bandwidth in one direction and latency per transfer):

    - ``host_to_device``: host memory to a device and back (PCIe on a GPU box).
    - ``device_to_device``: between two devices of one node (NVLink, PCIe peer to peer);
      for collectives, the bandwidth nccl-tests reports as bus bandwidth.
    - ``node_to_node``: one network port between nodes (InfiniBand, Ethernet).

    Topology:

    - ``devices_per_node``: devices in one node; more devices than that span nodes.
    - ``nodes``: nodes in the system as named (a prediction for more devices assumes more
      nodes of the same kind on the same network).
    - ``nics_per_node``: network ports per node; the node's devices share them.
    - ``peer_to_peer``: device-to-device copies go directly (True) or are staged through host
      memory, a copy down and a copy up over ``host_to_device`` (False).
    - ``funnel_through_device0``: DataParallel's copies to and from devices 1, 2, ... run one
      after another through device 0's link (True: one copy stream, as dpkit issues them, and
      one path out of device 0 through a switch or the PCIe root) or at once over separate
      links (False).
    - ``asynchronous``: the host queues work on the device and runs ahead (GPUs: a phase
      lasts the longer of the host's and the device's part), or does the work itself (CPU
      lanes: a phase lasts the sum).
    - ``serial_backward``: every replica's backward runs in one thread, one after another
      (torch's autograd on the CPU; each GPU has its own backward thread).

    Host overheads (seconds):

    - ``launch_overhead``: per op in forward: Python, torch's dispatcher, a kernel launch.
    - ``autograd_overhead``: per op in backward (the autograd engine, no Python).
    - ``gil_contention``: per op of a replica's forward while several replica threads run:
      handing Python's GIL from thread to thread (their Python runs one thread at a time).
    - ``gil_contention_by_model``: the same, fitted by :func:`~dpkit.cost.calibrate` for each
      model it measured, keyed by ``Profile.key``; other models take ``gil_contention`` (the
      median of these). It differs by model: with one number for all, the small
      transformer's replicas on 2-8 lanes at batch 16 were predicted to take twice as long
      as they did (``benchmarks/results/cost_accuracy.md``).
    - ``thread_start``: starting one worker thread of parallel_apply.
    - ``replica_overhead``: building one module object of one replica in replicate.
    - ``copy_overhead``: dpkit's Python around one tensor copy (on top of the link's latency).
    - ``event_overhead``: one phase on one device, its loop step and its trace span.
    - ``step_overhead``: per step, outside the phases: DataParallel's entry checks, the loss
      on the gathered output, autograd starting and finishing the backward.
    - ``dp_overhead``: per DataParallel step on several devices, between its phases: the
      lists of chunks and replicas, parallel_apply's set-up before its first thread, and the
      part of the hand-back after the forwards that every step pays whatever the model.
    - ``graph_overhead``: per op of a replica's forward, after the forwards: the replica's
      autograd graph handed back (and, while tracing, walked for its activations).
      :func:`~dpkit.cost.calibrate` fits that gap as a line over replicas × ops, across its
      models and two device counts: the per-step part goes to ``dp_overhead``, the slope here
      (one ratio per model had made a 101-op transformer's gap 2.9 ms where it took 1.0).

    - ``phase_overheads``: per phase of the batch's copies (``"scatter"``, ``"gather"``,
      ``"grad_scatter"``), ``(per call, per device)`` seconds of everything but the bytes,
      fitted by :func:`~dpkit.cost.calibrate` from steps on two device counts: it replaces
      ``event_overhead`` and ``copy_overhead`` for that phase. A step's scatter walks the
      inputs' structure and splits them once per call, then copies per device, which one
      number per event could not describe (2, 4 and 8 lanes here: 37, 56 and 74 us where it
      predicted 20, 42 and 83). Empty in the presets: there the events' overheads apply.
    - ``phase_extras``: per phase (``"replicate"``, ``"reduce"``), ``(per call, per device)``
      seconds that :func:`~dpkit.cost.calibrate` saw the phase take in steps beyond what
      the model's own terms give (the copies' overheads per tensor, the replica modules, the
      sums), added to the phase. Empty in the presets.
    - ``cold_extras``: per phase, ``(per call, per device)`` seconds added for each doubling
      of the step's working set (inputs and activations) beyond ``warm_bytes``: a phase
      that follows a large forward or backward finds its data and Python's own out of the
      caches. On this machine the reduce of a 36 KB CNN's gradients took 75 us on 2 lanes
      at batch 16 and 171 us at batch 4096. Fitted by calibrate from steps at two batch
      sizes; empty in the presets (a GPU's phases are its copies, not the host's caches).
    - ``warm_bytes``: the working set below which a step's data stays in the caches.
    - ``one_device_overhead``: ``step_overhead`` for a step on one device, where DataParallel
      calls the module itself (None: the same as on several). Calibrate fits it from steps
      on one lane: there the course's models each took 0.25-0.5 ms less per step than the
      overhead measured in steps on several lanes predicted.

    ``device_name`` names one device in figures ("A100", "CPU lane"); ``source`` says where
    the numbers come from (spec sheets and published measurements, or a calibration run).
    """

    name: str
    description: str
    device_name: str
    peak_flops: Mapping[str, float]
    compute_efficiency: float
    memory_bandwidth: float
    memory_efficiency: float
    compute_units: float
    host_to_device: Link
    device_to_device: Link
    node_to_node: Link
    devices_per_node: int
    nodes: int
    nics_per_node: int
    peer_to_peer: bool
    funnel_through_device0: bool
    asynchronous: bool
    serial_backward: bool
    launch_overhead: float
    autograd_overhead: float
    gil_contention: float
    thread_start: float
    replica_overhead: float
    copy_overhead: float
    event_overhead: float
    step_overhead: float
    dp_overhead: float
    graph_overhead: float
    source: str
    op_seconds: Mapping[str, OpSamples] = field(default_factory=dict)
    phase_overheads: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    gil_contention_by_model: Mapping[str, float] = field(default_factory=dict)
    phase_extras: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    cold_extras: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    warm_bytes: float = float(1 << 20)
    one_device_overhead: float | None = None

    def on_one_device(self) -> Hardware:
        """This hardware as a step on one device sees it: ``step_overhead`` replaced by
        ``one_device_overhead`` where that is known."""
        if self.one_device_overhead is None:
            return self
        return replace(self, step_overhead=self.one_device_overhead)

    def __post_init__(self) -> None:
        for spec in fields(self):
            value = getattr(self, spec.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(
                    f"Hardware {self.name!r}: {spec.name}={value!r} must be a positive finite "
                    "number (seconds, bytes/s, FLOP/s or a count)"
                )
        for name in ("phase_overheads", "phase_extras", "cold_extras"):
            for phase, pair in getattr(self, name).items():
                if len(pair) != 2 or not all(v >= 0 and math.isfinite(v) for v in pair):
                    raise ValueError(
                        f"Hardware {self.name!r}: {name}[{phase!r}]={pair!r} must be two "
                        "non-negative finite seconds (per call, per device)"
                    )
        for key, seconds in self.gil_contention_by_model.items():
            if not (seconds >= 0 and math.isfinite(seconds)):
                raise ValueError(
                    f"Hardware {self.name!r}: gil_contention_by_model[{key!r}]={seconds!r} must "
                    "be non-negative finite seconds"
                )
        for rate in self.peak_flops.values():
            if not rate > 0:
                raise ValueError(f"Hardware {self.name!r}: peak_flops must be positive")

    def phase_extra(self, phase: str, working_set: float) -> tuple[float, float]:
        """``(per call, per device)`` seconds a phase takes beyond the model's own terms in
        a step touching ``working_set`` bytes: ``phase_extras`` plus ``cold_extras`` for
        each doubling of the working set beyond ``warm_bytes``."""
        warm = self.phase_extras.get(phase, (0.0, 0.0))
        cold = self.cold_extras.get(phase, (0.0, 0.0))
        doublings = max(0.0, math.log2(max(working_set, 1.0) / self.warm_bytes))
        return warm[0] + cold[0] * doublings, warm[1] + cold[1] * doublings

    @property
    def max_devices(self) -> int:
        """Devices in the system as named (``nodes * devices_per_node``)."""
        return self.nodes * self.devices_per_node

    def flops_per_second(self, dtype: torch.dtype | str) -> float:
        """Achieved FLOP/s for ``dtype``: its peak times ``compute_efficiency``."""
        name = str(dtype).removeprefix("torch.")
        if name not in self.peak_flops:
            known = ", ".join(sorted(self.peak_flops))
            raise ValueError(
                f"hardware {self.name!r} has no peak FLOP/s for dtype {name}; it knows {known}. "
                "Cast the model (e.g. model.float()) or add the dtype to peak_flops"
            )
        return self.peak_flops[name] * self.compute_efficiency

    @property
    def achieved_memory_bandwidth(self) -> float:
        """Bytes/s that memory-bound ops reach: ``memory_bandwidth * memory_efficiency``."""
        return self.memory_bandwidth * self.memory_efficiency

    def device_link(self) -> Link:
        """The link a copy between two devices of one node takes: direct, or through the host
        (a copy down and a copy up: twice the latency, half the bandwidth)."""
        if self.peer_to_peer:
            return self.device_to_device
        host = self.host_to_device
        return Link(host.bandwidth / 2, 2 * host.latency)

    def network_share(self) -> Link:
        """One device's share of its node's network ports when every device of the node
        sends at once (as in the inter-node stage of a hierarchical all-reduce)."""
        ports = self.node_to_node
        share = ports.bandwidth * self.nics_per_node / self.devices_per_node
        return Link(min(share, ports.bandwidth), ports.latency)

    def summary(self) -> str:
        """One line: the name, then what it is (``dpkit predict --list`` prints these)."""
        return f"{self.name}: {self.description}"
