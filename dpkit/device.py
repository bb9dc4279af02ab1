"""Devices: one handle for real accelerators, virtual lanes on one GPU and virtual lanes on CPU.

The surprise first: a *virtual* device is not a different ``torch.device``. Every CPU lane
lives in the same CPU memory and every GPU lane on the same GPU; what makes a lane a lane
is that dpkit gives it its own tensor copies (moving a tensor to another lane is a real
copy, with real bytes and real time), its own worker thread, and on a GPU its own CUDA
stream. Plain tensors that dpkit did not place belong to the *home lane*, lane 0, just as
a model that sits on ``cuda:0`` belongs to ``device_ids[0]`` in ``nn.DataParallel``. The tag
that says which lane a tensor is on, and the lanes' streams, are :mod:`dpkit.lanes`'.

Kinds of :class:`Device`:

==============  ===================================================  ===============
kind            what it is                                           ``torch_device``
==============  ===================================================  ===============
``real``        an accelerator, e.g. ``cuda:1``                      ``cuda:1``
``virtual-gpu`` lane *i* on one GPU, with its own CUDA stream        ``cuda:0``
``virtual-cpu`` lane *i* on the CPU, with its own thread and copies  ``cpu``
``host``        plain CPU memory as a source or gather target        ``cpu``
==============  ===================================================  ===============

A trace's events can carry two more kinds, which are labels, not devices: a cost model's
predictions and DDP's ranks (:data:`dpkit.tracing.PREDICTED`, :data:`dpkit.tracing.RANK`).
Figures name every kind in words from :data:`dpkit.tracing.KIND_LABELS`.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

REAL = "real"
VIRTUAL_GPU = "virtual-gpu"
VIRTUAL_CPU = "virtual-cpu"
HOST = "host"

# Under the placement check (dpkit.testing.placement_check), CPU lanes pretend to live on a
# device of their own, apart from plain CPU memory, as lanes on one GPU live on cuda:0.
CHECKED_LANE_MEMORY = torch.device("cpu", 0)
# Set by dpkit.testing.placement_check while it is on: called whenever checked lanes are made, so
# that the thread asking for them (a widget's callback may run in a thread of its own)
# follows lane tags too. It returns a context, which parallel_apply's workers enter so that a
# replica's thread is followed only while its forward runs.
_placement_check: Callable[[], Any] | None = None

# torch hands out CUDA streams from a pool of 32 per device and priority, round-robin: more
# lanes than that on one GPU would share streams and run one after another.
MAX_GPU_LANES = 32
# Each CPU lane runs a thread of its own: past this many, a slip (n=10**9) would build handles
# for minutes, then start as many threads, instead of failing at once.
MAX_CPU_LANES = 1024


@dataclass(frozen=True)
class Device:
    """A place where a replica runs: a real accelerator, a virtual lane, or the host CPU."""

    index: int
    kind: str
    torch_device: torch.device
    # Derived once, in __post_init__: every copy and every traced event reads them, and
    # torch.device.type builds a new string on each call.
    name: str = field(init=False, compare=False, repr=False)
    is_virtual: bool = field(init=False, compare=False, repr=False)
    device_type: str = field(init=False, compare=False, repr=False)  # "cpu", "cuda", ...
    # The torch device its bytes are in, as tensor.device says it: "cpu" or "cuda:i".
    memory: torch.device = field(init=False, compare=False, repr=False)
    # Whether tensors dpkit never placed are on this device: true for the host, a real
    # accelerator and the home lane (lane 0, the plain memory of its device), false for
    # lanes 1, 2, ... and for every lane under the placement check.
    holds_plain_memory: bool = field(init=False, compare=False, repr=False)
    # Whether its work runs on a CUDA stream of its own (lanes on one GPU), apart from the
    # caller's stream where copies are queued.
    has_own_stream: bool = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        where = self.torch_device
        if where.type != "cpu" and where.index is None:
            # "cuda" means the current device in torch, device 0 for dpkit as for DataParallel;
            # normalised so that Device(0, REAL, "cuda") and Device(0, REAL, "cuda:0") agree.
            where = torch.device(where.type, 0)
        memory = torch.device("cpu") if where.type == "cpu" else where
        is_virtual = self.kind in (VIRTUAL_GPU, VIRTUAL_CPU)
        plain = not is_virtual or (self.index == 0 and where != CHECKED_LANE_MEMORY)
        set_once = object.__setattr__  # the dataclass is frozen
        set_once(self, "torch_device", where)
        # A lane is named by the memory its bytes are in: "virtual:2 (cpu)", "virtual:2 (cuda:0)".
        set_once(self, "name", f"virtual:{self.index} ({memory})" if is_virtual else str(where))
        set_once(self, "is_virtual", is_virtual)
        set_once(self, "device_type", where.type)
        set_once(self, "memory", memory)
        set_once(self, "holds_plain_memory", plain)
        set_once(self, "has_own_stream", self.kind == VIRTUAL_GPU)

    def shares_memory_with(self, other: Device) -> bool:
        """Whether a tensor on this device is also on ``other`` without a copy: the same
        device, or the host and lane 0 of ordinary CPU lanes (one plain memory)."""
        both_plain = self.holds_plain_memory and other.holds_plain_memory
        return self == other or (both_plain and self.memory == other.memory)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"Device({self.name!r})"


DeviceLike = Device | int | str | torch.device

HOST_DEVICE = Device(-1, HOST, torch.device("cpu"))


def accelerator_type() -> str | None:
    """The accelerator torch can use here ("cuda", "xpu", ...), or None on a CPU-only machine.

    MPS is left out, as ``nn.DataParallel`` leaves it out: it has one device and no streams
    that DataParallel could use.
    """
    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6
    if accelerator is not None and accelerator.is_available():
        kind = accelerator.current_accelerator().type
        return None if kind == "mps" else kind
    return "cuda" if torch.cuda.is_available() else None


def accelerator_count() -> int:
    kind = accelerator_type()
    return 0 if kind is None else torch.get_device_module(kind).device_count()


def _check_count(n: Any, argument: str = "n") -> int:
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"{argument} must be a positive int (a device count), got {n!r}")
    if n < 1:
        raise ValueError(
            f"{argument} must be at least 1, got {n}: data parallelism needs one device per "
            f"replica; pass e.g. {argument}=4"
        )
    return n


def real_devices(n: int | None = None) -> list[Device]:
    """The first ``n`` real accelerators (all of them when ``n`` is None)."""
    count = accelerator_count()
    n = count if n is None else _check_count(n)
    if n > count:
        raise ValueError(
            f"n={n} real accelerators were asked for but this machine has {count}; "
            f"use dpkit.virtual_devices({n}) for virtual lanes, or dpkit.devices({n}) "
            "to fall back to them automatically"
        )
    kind = accelerator_type()
    return [Device(i, REAL, torch.device(kind, i)) for i in range(n)]


def virtual_devices(n: int, on: str | torch.device | None = None) -> list[Device]:
    """``n`` virtual lanes: on the single GPU when there is one (or ``on="cuda"``), else on CPU.

    ``on="cpu"`` forces CPU lanes even on a machine with a GPU.
    """
    n = _check_count(n)
    if on is None:
        on = accelerator_type() or "cpu"
    try:
        on = torch.device(on)
    except (RuntimeError, TypeError):
        raise ValueError(
            f"on={on!r} is not a device; use on='cpu' for CPU lanes, on='cuda' for lanes on "
            "the GPU, or leave it out to pick the GPU when there is one"
        ) from None
    if on.type == "cpu":
        if n > MAX_CPU_LANES:
            raise ValueError(
                f"n={n} lanes on the CPU: at most {MAX_CPU_LANES}, each runs a thread of its "
                f"own; use n<={MAX_CPU_LANES} (this machine has {os.cpu_count()} cores)"
            )
        if _placement_check is None:
            return [Device(i, VIRTUAL_CPU, torch.device("cpu")) for i in range(n)]
        _placement_check()
        return [Device(i, VIRTUAL_CPU, CHECKED_LANE_MEMORY) for i in range(n)]
    if on.type != accelerator_type():
        raise ValueError(
            f"on={str(on)!r}: no {on.type} accelerator is available here; use on='cpu'"
        )
    if n > MAX_GPU_LANES:
        raise _too_many_gpu_lanes(f"n={n} lanes", f"n<={MAX_GPU_LANES}")
    return [Device(i, VIRTUAL_GPU, on) for i in range(n)]  # Device makes "cuda" cuda:0


def _too_many_gpu_lanes(asked: str, fix: str) -> ValueError:
    return ValueError(
        f"{asked} on one GPU: at most {MAX_GPU_LANES} lanes, since torch's pool has "
        f"{MAX_GPU_LANES} CUDA streams per device and lanes sharing a stream would run one after "
        f"another; use {fix}, or dpkit.virtual_devices(n, on='cpu') for more lanes"
    )


def devices(n: int | None = None) -> list[Device]:
    """``n`` real accelerators where that many exist, else ``n`` virtual lanes.

    The lanes are on the one GPU if there is one, else on the CPU. With ``n=None``: every
    real accelerator, or four virtual CPU lanes on a machine without one.
    """
    count = accelerator_count()
    if n is None:
        n = count or 4
    return real_devices(n) if _check_count(n) <= count else virtual_devices(n)


# --------------------------------------------------------------------------------------
# Resolving what users pass (handles, ints, strings, torch.device) into Device handles.


def _resolve_int(index: int, like: Device | None) -> Device:
    if index < 0:
        return HOST_DEVICE  # torch's convention: -1 means the CPU
    if like is not None and like.is_virtual:
        if like.kind == VIRTUAL_GPU and index >= MAX_GPU_LANES:
            raise _too_many_gpu_lanes(f"lane {index}", f"lanes 0-{MAX_GPU_LANES - 1}")
        return Device(index, like.kind, like.torch_device)
    return devices(index + 1)[index]  # a real device where it exists, else a lane


def as_device(spec: DeviceLike, like: Device | None = None, argument: str = "device") -> Device:
    """Resolve one device spec. Ints follow ``like`` (the kind of the devices in use)."""
    if isinstance(spec, Device):
        return spec
    if isinstance(spec, bool):
        raise TypeError(f"{argument} must be a device, got {spec!r}")
    if isinstance(spec, int):
        return _resolve_int(spec, like)
    if not isinstance(spec, (str, torch.device)):
        raise TypeError(
            f"{argument} must be a dpkit.Device, an int, a string like 'cuda:0' or a "
            f"torch.device, got {type(spec).__name__}"
        )
    try:
        device = torch.device(spec)
    except RuntimeError as error:
        raise ValueError(f"{argument}={spec!r} is not a device name: {error}") from None
    if device.type == "cpu":
        return HOST_DEVICE
    index = device.index or 0
    if device.type != accelerator_type() or index >= accelerator_count():
        raise ValueError(
            f"{argument}={str(spec)!r} does not exist on this machine "
            f"({accelerator_count()} accelerators); use dpkit.virtual_devices(n) for "
            "virtual lanes or dpkit.devices(n) to pick what exists"
        )
    return Device(index, REAL, device)


def as_devices(specs: Iterable[DeviceLike] | None, argument: str = "devices") -> list[Device]:
    """Resolve a list of device specs into distinct Device handles of one kind.

    A list of ints names real accelerators when all of them exist, else virtual lanes (so
    ``device_ids=[0, 1, 2, 3]`` works on a laptop, on lanes that say they are virtual).
    """
    if specs is None:
        raise ValueError(f"{argument} is None; pass e.g. {argument}=dpkit.devices(4)")
    if isinstance(specs, (Device, int, str, torch.device)):
        raise TypeError(
            f"{argument} must be a list of devices, got a single {type(specs).__name__}; "
            f"wrap it in a list: [{specs!r}]"
        )
    specs = list(specs)
    if not specs:
        raise ValueError(f"{argument} is empty; pass at least one device, e.g. dpkit.devices(2)")
    ints = all(isinstance(s, int) and not isinstance(s, bool) for s in specs)
    like = virtual_devices(1)[0] if ints and max(specs) >= accelerator_count() else None
    resolved = [as_device(s, like=like, argument=argument) for s in specs]
    kinds = {d.kind for d in resolved}
    if len(kinds) > 1:
        raise ValueError(
            f"{argument} mixes kinds of device ({', '.join(sorted(kinds))}); use one kind, "
            "e.g. dpkit.devices(n) or dpkit.virtual_devices(n)"
        )
    if HOST in kinds:
        raise ValueError(
            f"{argument} contains the host CPU, which cannot run a replica; for CPU lanes "
            "use dpkit.virtual_devices(n, on='cpu')"
        )
    duplicates = sorted(d.name for d, times in Counter(resolved).items() if times > 1)
    if duplicates:
        raise ValueError(
            f"{argument} lists {', '.join(duplicates)} more than once; each replica needs its "
            "own device, e.g. dpkit.devices(4)"
        )
    return resolved


def to_device(obj: Any, device: DeviceLike) -> Any:
    """``obj`` put where ``device`` keeps the data it starts from: a tensor, a module, or lists,
    tuples and dicts of them, moved with ``.to(device.torch_device)`` (a module in place).

    The one way the course puts a model, its inputs and its targets on ``device_ids[0]``
    before ``DataParallel``: on a GPU box that is ``cuda:0``, on ordinary CPU lanes the plain
    memory (nothing moves), and under :mod:`dpkit.testing.placement_check` the lanes' own device.
    Lanes 1, 2, ... get their copies from scatter and replicate, never from here.
    """
    target = as_device(device, argument="device")
    # Under the placement check, the checked lanes' pretend device (cpu:0) is lane 0's.
    if _placement_check is not None and isinstance(device, (str, torch.device)):
        if torch.device(device) == CHECKED_LANE_MEMORY:  # a valid name: as_device took it
            target = virtual_devices(1)[0]  # lanes[0].torch_device: the checked lanes' memory
    if target.is_virtual and target.index != 0:
        raise ValueError(
            f"device={target}: only lane 0 holds data you create; scatter and replicate make "
            "the other lanes' copies. Pass devices[0]"
        )
    if isinstance(obj, (list, tuple)):
        moved = [to_device(item, target) for item in obj]
        return type(obj)(*moved) if hasattr(obj, "_fields") else type(obj)(moved)
    if isinstance(obj, dict):
        return type(obj)((key, to_device(value, target)) for key, value in obj.items())
    return obj.to(target.torch_device) if hasattr(obj, "to") else obj


# The lane the current worker thread runs on, for code that wants to know (dpkit.current_device).
_current = threading.local()


def current_device() -> Device | None:
    """The device the calling replica runs on inside ``parallel_apply``, else None."""
    return getattr(_current, "device", None)


def _set_current_device(device: Device | None) -> None:
    _current.device = device
