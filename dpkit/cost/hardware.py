"""What the cost model knows about a machine: a :class:`Hardware` made of :class:`Link` objects.

The surprise first: a spec sheet's peak is never what a step gets. Real kernels reach a
fraction of it, so a Hardware keeps the peaks (cited in :mod:`dpkit.cost.catalog`) and the
fractions, and the model only ever uses their product. Link bandwidths are stored achieved
(nccl-tests' bus bandwidth, or a spec sheet times a stated fraction).

How each field is used (:mod:`dpkit.cost.prediction` is the rest):

- an op takes ``max(FLOPs / (peak[dtype] * efficiency[dtype]), bytes / (memory_bandwidth *
  memory_efficiency))`` on its device (``efficiency``: ``tensor_core_efficiency`` where it
  names the dtype, else ``matmul_efficiency``), or what ``op_seconds`` measured for its op;
- a copy or a collective of ``S`` bytes over a link takes ``latency + S / bandwidth`` per
  message (alpha-beta), see :mod:`dpkit.cost.collectives`;
- ``peer_to_peer`` False: copies and NCCL's one-way broadcast and reduce go through host
  memory, over ``host_to_device`` twice (:meth:`Hardware.device_link`), while NCCL's
  all-reduce gets ``device_to_device``, which then holds NCCL's own path through host memory
  in both directions at once (its SHM transport, measured slower: 3.9 GB/s all-reduce on
  PCIe 3, presets [nccl-384]; :meth:`Hardware.collective_link`);
  ``nics_per_node``: NCCL runs a ring per port, so a node's ports add up;
- ``virtual_lanes``: dpkit's CPU lanes, where the host makes every copy itself, through
  device 0, the lanes' threads share ``compute_units`` cores and autograd runs every
  replica's backward in one thread; False: GPUs, where the host queues work and runs ahead;
- the host pays a few named overheads (the fields in seconds), the same for every model.

Each field declares its unit, which :func:`check` enforces, and a line about it.
"""

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import torch

# What a plain number of each unit looks like, for errors (hardware files are written by hand)
EXAMPLES = {"bytes": "80e9 for 80 GB, 85899345920 for 80 GiB", "seconds": "5e-6 for 5 us",
            "bytes/s": "25e9 for 25 GB/s, 12.5e9 for 100 Gb/s", "FLOP/s": "312e12 for 312 TFLOP/s",
            "fraction": "0.7", "count": "8", "whole number": "8"}  # fmt: skip
NOT_NUMBERS = {"text": (str, "text, in quotes"),
               "true/false": (bool, "True or False (true or false in a file)")}  # fmt: skip


def check(owner: str, name: str, value: object, unit: str) -> None:
    """Refuse ``value`` unless it is what ``unit`` says: text, a bool, or a finite number
    above 0 (a whole number for counts, at most 1 for a fraction)."""
    if unit in NOT_NUMBERS:
        kind, wanted = NOT_NUMBERS[unit]
        if not isinstance(value, kind):
            raise TypeError(f"{owner}: {name}={value!r} must be {wanted}")
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{owner}: {name}={value!r} must be a plain number of {unit} "
                        f"(SI units, no suffixes; e.g. {EXAMPLES[unit]})")  # fmt: skip
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{owner}: {name}={value!r} must be finite and above 0")
    if unit == "whole number" and value != int(value):
        raise ValueError(f"{owner}: {name}={value!r} must be a whole number (a count)")
    if unit == "fraction" and value > 1:
        raise ValueError(f"{owner}: {name}={value!r} must be a fraction in (0, 1] of a peak")


def _about(unit: str, about: str, **default: Any) -> Any:
    """A field's unit (what :func:`check` asks of it) and what it is, in a line."""
    return field(metadata={"unit": unit, "about": about}, **default)


def _is_pair(pair: object) -> bool:
    """A measured ``(work, seconds)``: two finite numbers, 0 or more."""
    two = isinstance(pair, (tuple, list)) and len(pair) == 2
    return two and all(isinstance(x, (int, float)) and math.isfinite(x) and x >= 0 for x in pair)


@dataclass(frozen=True)
class Link:
    """One kind of connection: a message of ``n`` bytes takes ``latency + n / bandwidth``
    (the alpha-beta, or Hockney, model)."""

    bandwidth: float = _about("bytes/s", "achieved, one way")
    latency: float = _about("seconds", "per message")
    source: str = _about("text", "", default="")

    def __post_init__(self) -> None:
        for spec in fields(self):
            check("Link", spec.name, getattr(self, spec.name), spec.metadata["unit"])

    def time(self, nbytes: float) -> float:
        return self.latency + nbytes / self.bandwidth


# Op samples: for one aten op ("aten.addmm"), measured (work, seconds) pairs, work being the
# op's FLOPs over the vector lanes it fills where it has any, else its bytes (OpCost.work_at).
OpSamples = tuple[tuple[float, float], ...]
TABLES = ("peak_flops", "tensor_core_efficiency", "op_seconds")  # one entry per dtype or op


@dataclass(frozen=True)
class Hardware:
    """A machine as the cost model sees it (how each field is used: the module's docstring;
    every preset's numbers cited: :mod:`dpkit.cost.catalog`)."""

    name: str = _about("text", "what the outputs call the machine")
    description: str = _about("text", "one line about it")
    device_name: str = _about("text", "what a device is called, e.g. A100")
    source: str = _about("text", "where the numbers come from")
    # Compute, per device (which peak an op gets: dpkit.cost.compute.rate_key)
    peak_flops: Mapping[str, float] = _about("FLOP/s", "spec-sheet peak by dtype; float32 needed")
    matmul_efficiency: float = _about("fraction", "of peak_flops matmuls and convolutions reach")
    memory_bandwidth: float = _about("bytes/s", "spec-sheet bandwidth of a device's memory")
    memory_efficiency: float = _about("fraction", "of memory_bandwidth elementwise ops reach")
    memory_capacity: float = _about("bytes", "one device's memory: what 'does it fit' checks")
    compute_units: float = _about("count", "devices of a node that compute at full speed at once")
    # Links, and how the devices are laid out
    host_to_device: Link = _about("link", "host memory to a device (PCIe)")
    device_to_device: Link = _about("link", "two devices of a node, NCCL's bus bandwidth")
    node_to_node: Link = _about("link", "one network port between nodes")
    devices_per_node: int = _about("whole number", "devices in one node")
    nodes: int = _about("whole number", "nodes as named (DDP on more devices assumes more)")
    nics_per_node: int = _about("whole number", "network ports a node's devices share")
    peer_to_peer: bool = _about("true/false", "false if copies go through host memory")
    virtual_lanes: bool = _about("true/false", "true for dpkit's virtual CPU lanes, false for GPUs")
    # Host overheads in seconds, the same for every model: on GPUs eager PyTorch's, assumed; on
    # CPU lanes calibrate() measures thread_start and module_overhead, fits the rest to steps.
    op_overhead: float = _about("seconds", "host time of one forward op, and per tensor copied")
    backward_op_overhead: float = _about("seconds", "host time of one backward op")
    gil_handoff: float = _about("seconds", "per op of a replica while several threads take turns")
    thread_start: float = _about("seconds", "parallel_apply starting one thread")
    module_overhead: float = _about("seconds", "replicate building one module object")
    copy_overhead: float = _about("seconds", "host time of one copy or collective call")
    step_overhead: float = _about("seconds", "one step outside its phases")
    # NVLink SHARP (H100 NVSwitch): the switch sums, each device sends and receives its bytes
    # once, at this algorithm bandwidth. None: the ring only
    allreduce_bandwidth: float | None = _about("bytes/s", "NVLS all-reduce", default=None)
    op_seconds: Mapping[str, OpSamples] = _about("[work, seconds] pairs", "", default_factory=dict)
    tensor_core_efficiency: Mapping[str, float] = _about("fraction", "", default_factory=dict)

    def __post_init__(self) -> None:
        owner = f"Hardware {self.name!r}"
        for spec in fields(self):
            value, unit = getattr(self, spec.name), spec.metadata["unit"]
            if value is None and spec.default is None:
                continue  # allreduce_bandwidth: None where NCCL's own rate is not known
            if spec.name in TABLES and not isinstance(value, Mapping):
                raise TypeError(f"{owner}: {spec.name} must map names to {unit}")
            if unit == "link" and not isinstance(value, Link):
                raise TypeError(f"{owner}: {spec.name} must be a dpkit.cost.Link")
            if spec.name not in TABLES and unit != "link":
                check(owner, spec.name, value, unit)
        if "float32" not in self.peak_flops:
            raise ValueError(f"{owner}: peak_flops must map dtype names to FLOP/s, float32 too")
        for dtype, rate in self.peak_flops.items():
            check(owner, f"peak_flops[{dtype!r}]", rate, "FLOP/s")
            if dtype != "tfloat32" and not isinstance(getattr(torch, str(dtype), 0), torch.dtype):
                raise ValueError(
                    f"{owner}: peak_flops[{dtype!r}] is not a dtype: use torch's names, float32 "
                    "(needed), tfloat32, bfloat16, float16"
                )
        for dtype, fraction in self.tensor_core_efficiency.items():
            check(owner, f"tensor_core_efficiency[{dtype!r}]", fraction, "fraction")
            if dtype not in self.peak_flops:
                raise ValueError(f"{owner}: tensor_core_efficiency[{dtype!r}] must be of a "
                                 "dtype that peak_flops names")  # fmt: skip
        for op, samples in self.op_seconds.items():
            if not (isinstance(samples, (tuple, list)) and samples and all(map(_is_pair, samples))):
                raise ValueError(f"{owner}: op_seconds[{op!r}] must be (work, seconds) pairs")
        self._warn_fast_shm(owner)

    def _warn_fast_shm(self, owner: str) -> None:
        """Without peer to peer, ``device_to_device`` is NCCL's path through host memory:
        a number above the two copies' ``host_to_device / 2`` is more likely a PCIe or NVLink
        rate (a hardware file written before that meaning) than a measurement of it."""
        shm, host = self.device_to_device.bandwidth, self.host_to_device.bandwidth
        if self.peer_to_peer or shm <= host / 2:
            return
        warnings.warn(
            f"{owner}: peer_to_peer is false, so device_to_device is what NCCL's collectives "
            f"get through host memory (its SHM transport), but it says {shm / 1e9:.3g} GB/s, "
            f"above host_to_device / 2 ({host / 2e9:.3g} GB/s). NCCL reached 3.9 GB/s of "
            "all-reduce bus bandwidth this way on PCIe 3 (github.com/NVIDIA/nccl/issues/384); "
            "measure yours with nccl-tests' all_reduce_perf under NCCL_P2P_DISABLE=1",
            stacklevel=4,
        )

    @property
    def max_devices(self) -> int:
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
        return self.memory_bandwidth * self.memory_efficiency

    def device_link(self) -> Link:
        """A copy between two devices of one node (scatter, gather; NCCL's broadcast and
        reduce, not its all-reduce): directly, or through host memory, down and up."""
        if self.peer_to_peer:
            return self.device_to_device
        host = self.host_to_device
        return Link(host.bandwidth / 2, 2 * host.latency, "through host memory: down and up")

    def collective_link(self) -> Link:
        """What NCCL's all-reduce gets between two devices of one node: ``device_to_device``
        (without peer to peer its SHM transport, not :meth:`device_link`'s two copies: CUDA
        overlaps a copy's two hops, 37 GB/s on PCIe 5, nccl#1264)."""
        return self.device_to_device

    def network_link(self) -> Link:
        """What a collective spanning nodes gets from the network: a ring per port."""
        port = self.node_to_node
        return Link(port.bandwidth * self.nics_per_node, port.latency, port.source)

    def summary(self) -> str:
        """One line: the name, then what it is (``dpkit predict --list`` prints these)."""
        return f"{self.name}: {self.description}"


HOST_TERMS = tuple(spec.name for spec in fields(Hardware) if spec.metadata["unit"] == "seconds")
