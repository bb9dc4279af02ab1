"""The placement check: CPU lanes that live apart from plain CPU memory, as a GPU does.

The surprise first: on a laptop, code that forgets to put its model on the devices still
runs, because lane 0 of ordinary CPU lanes *is* the plain CPU memory every tensor starts
in. On a GPU box the same code fails (the model is on the CPU, not on ``cuda:0``). With the
placement check on, CPU lanes behave like lanes on a GPU: they live on a pretend device,
``cpu:0`` (:data:`dpkit.device.CHECKED_LANE_MEMORY`), and plain CPU tensors are on the
*host*, apart from every lane. So on a machine without a GPU:

- ``DataParallel`` refuses a model that was not moved to ``device_ids[0]``, with torch's
  message, and the fix is the GPU one: ``model.to(lanes[0].torch_device)``;
- ``x.to(lanes[0].torch_device)``, ``torch.randn(..., device=lanes[0].torch_device)`` and
  ``module.to(...)`` put data on lane 0; ``.cpu()`` and ``.to("cpu")`` bring it back;
- an operation that mixes data on the lanes with non-scalar data on the host raises
  torch's "Expected all tensors to be on the same device" (a target left on the CPU), and
  ``.numpy()`` of lane data raises as it does for CUDA tensors;
- in a replica's forward (:func:`dpkit.parallel_apply`'s worker threads) too, and there an
  operation that mixes data of two lanes raises as well, as on two GPUs. That catches the
  two classic mistakes that run on one GPU and fail on several: a tensor made without
  ``device=`` (``torch.ones(len(x))``), on the host; and a plain tensor attribute
  (``self.scale = torch.ones(5)``, not a buffer), which replicate does not copy, so the
  replica on lane 1 reads lane 0's. The message says what met what. Outside the replicas,
  data of two lanes may meet: every checked lane's torch device is ``cpu:0``, so code there
  cannot put data on lane 1 itself (model-parallel code's ``stage.to(lanes[1].torch_device)``
  is lane 0, as on one GPU);
- ``x.device`` of lane data is the lanes' device, ``cpu:0``, so ``device=x.device`` and
  ``.to(x.device)`` work as on a GPU: in a replica they put data on the replica's own lane
  (as ``cuda:i`` in torch's worker on GPU ``i``), elsewhere on lane 0. Data already on a
  lane stays there when moved to ``cpu:0`` outside a replica.

The check is for tests, and never turns on by itself (``import dpkit`` leaves it off). Ways
to turn it on: :func:`checking_placement` for a block; ``%load_ext dpkit.placement_check`` in
a notebook; ``DPKIT_CHECK_PLACEMENT=1`` in the environment of the ``dpkit`` command, or of a
Jupyter kernel whose IPython directory has the config :func:`write_kernel_config` writes
(``make test`` runs the course notebooks, the demo and the explorers so). It works by a
:class:`~torch.overrides.TorchFunctionMode` that follows lane tags through operations, in
the thread that turned it on (where the learner's code runs), in each thread that makes
checked lanes, and in each replica's worker thread in :func:`dpkit.parallel_apply`; and by
wrapping ``nn.Parameter`` construction so that a parameter made from lane data stays there.
A replica's parameters, buffers, inputs and keyword arguments are on its own lane
(replicate, broadcast and scatter tag them; replica 0 reads the module's own, on lane 0), so
a forward that reads only those runs. dpkit's own primitives and tracing move data between
lanes and the host on purpose and are not checked. The check slows every torch call in
those threads down.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = [
    "ENVIRONMENT_VARIABLE",
    "active",
    "checking_placement",
    "disable",
    "enable",
    "enable_from_environment",
    "load_ipython_extension",
    "write_kernel_config",
]
from torch.overrides import TorchFunctionMode

from dpkit import device
from dpkit.device import CHECKED_LANE_MEMORY, VIRTUAL_CPU, Device
from dpkit.lanes import _LANE_ATTRIBUTE as _TAG

ENVIRONMENT_VARIABLE = "DPKIT_CHECK_PLACEMENT"
HOME_LANE = Device(0, VIRTUAL_CPU, CHECKED_LANE_MEMORY)
_SET_DATA = torch.Tensor.data.__set__  # a new method-wrapper each time: compare with ==
_GET_DEVICE = torch.Tensor.device.__get__  # the same

# Operations torch allows across devices: copies between them, indexing a device's tensor
# with a host index, questions about tensors that read no data, and packing a padded batch
# (torch wants its ``lengths`` on the CPU whatever device the batch is on).
_CROSS_DEVICE = {
    torch._has_compatible_shallow_copy_type,
    torch._pack_padded_sequence,
    torch.Tensor.copy_,
    torch.Tensor.__getitem__,
    torch.Tensor.__setitem__,
    torch.Tensor.__deepcopy__,
    torch.Tensor.__repr__,
    torch.Tensor.__format__,
}
# dpkit's primitives move bytes between devices on purpose; the check is for their callers.
_PRIMITIVES = {
    "dpkit.comm", "dpkit.scatter", "dpkit.replicate", "dpkit.parallel_apply", "dpkit.gather",
    "dpkit.data_parallel", "dpkit._functions", "dpkit.device", "dpkit.context", "dpkit.nested",
    "dpkit.lanes",
}  # fmt: skip


def _lane(tensor: torch.Tensor) -> Device | None:
    return getattr(tensor, _TAG, None)


def _tensors(args: Any, kwargs: dict[str, Any]) -> Iterator[torch.Tensor]:
    """The tensors among an operation's arguments (and in lists or tuples of them)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (item for item in value if isinstance(item, torch.Tensor))


def _called_by_primitive() -> bool:
    """Whether the torch call being checked comes from dpkit's primitives (past torch's own
    Python wrappers such as ``Tensor.split``, and this module's own frames, however many,
    with the trampolines mutmut wraps them in during the mutation audit)."""
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module != __name__ and not module.startswith(("torch", "mutmut.")):
            return module in _PRIMITIVES or module.startswith("dpkit.tracing")
        frame = frame.f_back
    return False


def _replica_lane() -> Device | None:
    """The checked lane whose replica runs in this thread (``parallel_apply`` sets it), or None."""
    lane = device.current_device()
    return lane if lane is not None and lane.torch_device == CHECKED_LANE_MEMORY else None


def _check_same_device(func: Any, args: Any, kwargs: dict[str, Any]) -> Device | None:
    """The lane an operation's tensors are on (None: the host); raises as torch does when
    they are on a lane and on the host at once, or, in a replica, on two lanes (as on two
    GPUs). CPU scalars mix with anything, as with CUDA. Outside the replicas, data of two
    lanes may meet: every checked lane's torch device is ``cpu:0``, so code there cannot put
    data on lane 1 itself (a pipeline's ``stage.to(lanes[1].torch_device)``, as on one GPU)."""
    lane = other = host = None
    for tensor in _tensors(args, kwargs):
        found = _lane(tensor)
        if found is None:
            if tensor.dim() > 0 and tensor.device.type == "cpu":
                host = tensor
        elif lane is None:
            lane = found
        elif found is not lane and not found.shares_memory_with(lane):
            other = found
    mixed = host is not None or (other is not None and _replica_lane() is not None)
    if lane is not None and mixed and func not in _CROSS_DEVICE and not _called_by_primitive():
        raise RuntimeError(_mixed(getattr(func, "__name__", func), lane, other, host))
    return lane


def _mixed(name: Any, lane: Device, other: Device | None, host: torch.Tensor | None) -> str:
    """torch's message for an operation on two devices, and what met what on the lanes."""
    replica = _replica_lane()
    if host is not None:  # lane data met a tensor on the host
        devices = f"{CHECKED_LANE_MEMORY} and cpu"
        what = f"data on {lane} met a tensor of shape {tuple(host.shape)} left on the host CPU"
        fix = "move it with .to(lanes[0].torch_device), as on a GPU"
        if replica is not None:  # made in the forward without device=: on the CPU on a GPU box
            fix = "make it where the replica's data is, e.g. torch.ones(..., device=x.device)"
    else:  # in a replica: the tensor on another lane than the replica's is the stray one
        stray, own = (lane, other) if replica == other else (other, lane)
        devices = f"{stray} and {own}"
        what = f"a tensor of {stray} met {own}'s data"
        fix = (
            "a replica gets its own copies of its module's parameters and buffers only, and "
            "a tensor kept as a plain attribute is not copied: register it with "
            "self.register_buffer(name, tensor), or use it as .to(x.device), as on GPUs"
        )
    where = name if replica is None else f"{name}, in the replica on {replica}"
    return (
        "Expected all tensors to be on the same device, but found at least two devices, "
        f"{devices}! (in {where}; dpkit's placement check: {what}; {fix})"
    )


def _tag(result: Any, lane: Device | None) -> Any:
    """Put ``lane``'s tag on the tensors an operation returned (None: leave them on the host)."""
    if lane is None:
        return result
    if isinstance(result, (list, tuple)):
        for item in result:
            _tag(item, lane)
    elif isinstance(result, torch.Tensor) and _lane(result) is None:
        with suppress(AttributeError, RuntimeError):  # a tensor type that takes no attributes
            setattr(result, _TAG, lane)
    return result


def _to_host(tensor: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    """``tensor`` brought to the host: a copy without a lane tag, as ``.cpu()`` of a GPU tensor
    (``result`` is what torch returned, ``tensor`` itself when it saw nothing to move)."""
    return result.clone() if result is tensor and _lane(tensor) is not None else result


class _PlacementMode(TorchFunctionMode):
    """Follows lane tags through every torch call made in the thread that entered it."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _mode is None:  # the check is off: a mode left in another thread does nothing
            return func(*args, **kwargs)
        if func == _GET_DEVICE:  # x.device of lane data: the lanes' device, as cuda:i on a GPU
            if _lane(args[0]) is not None and not _called_by_primitive():
                return CHECKED_LANE_MEMORY  # so that device=x.device makes data on x's lane
            return func(*args, **kwargs)
        if func is torch.Tensor.to or func is torch.Tensor.cpu:
            return _move(func, args, kwargs)
        if func is torch.Tensor.numpy and _lane(args[0]) is not None:
            raise TypeError(
                f"can't convert {CHECKED_LANE_MEMORY} device type tensor to numpy (it is on "
                f"{_lane(args[0])}; dpkit's placement check). Use Tensor.cpu() to copy the "
                "tensor to host memory first."
            )
        if func == _SET_DATA:  # param.data = ... (how module.to() moves a parameter)
            result = func(*args, **kwargs)
            lane = _lane(args[1])
            if lane is not None or _lane(args[0]) is not None:
                setattr(args[0], _TAG, lane)
            return result
        lane = _check_same_device(func, args, kwargs)
        device = kwargs.get("device")
        if lane is None and device is not None and torch.device(device) == CHECKED_LANE_MEMORY:
            # a factory, torch.randn(..., device=x.device): on lane 0, in a replica on its lane
            lane = _replica_lane() or HOME_LANE
        result = func(*args, **kwargs)
        if args and result is args[0]:  # in place (host.copy_(x), x.add_(1)): stays put
            return result
        return _tag(result, lane)


def _move(func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """``tensor.to(...)`` or ``tensor.cpu()``: onto the lanes' device from the host is a copy
    onto lane 0, as onto ``cuda:0`` (in a replica, onto the replica's lane, as onto
    ``x.device``, which also brings another lane's data there); onto the CPU a copy to the
    host, as from a GPU."""
    tensor = args[0]
    if func is torch.Tensor.cpu:
        return _to_host(tensor, func(*args, **kwargs))
    target = torch._C._nn._parse_to(*args[1:], **kwargs)[0]  # a torch.device, or None
    result = func(*args, **kwargs)
    if target == CHECKED_LANE_MEMORY:
        lane, replica = _lane(tensor), _replica_lane()
        if lane is None or (replica is not None and not lane.shares_memory_with(replica)):
            if result.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr():
                result = result.clone()
            setattr(result, _TAG, replica or HOME_LANE)
            return result
    elif target is not None and target.type == "cpu":
        return _to_host(tensor, result)
    return _tag(result, _lane(tensor))  # on a lane already, it stays there


_original_parameter_new = nn.Parameter.__new__


def _parameter_new(cls, data=None, requires_grad=True):
    """``nn.Parameter(lane_tensor)`` stays on the lane, as ``nn.Parameter(cuda_tensor)`` does."""
    parameter = _original_parameter_new(cls, data, requires_grad)
    if _lane(data) is not None:
        setattr(parameter, _TAG, _lane(data))
    return parameter


_mode: _PlacementMode | None = None  # the mode of the thread that turned the check on
_followed = threading.local()  # .mode: set in each thread whose torch calls are followed


def _follow_this_thread() -> AbstractContextManager[None]:
    """Follow lane tags through this thread's torch calls too (once per thread): checked
    lanes are being made here, so the code that uses them runs here (a JupyterLab widget's
    callback runs in a kernel thread of its own, not where ``import dpkit`` ran), or a
    replica's forward is about to (``parallel_apply``'s worker enters the context returned).

    The mode stays for the thread's life, inert once the check is off; in a context, only
    until its end. A worker thread must not end with a mode on: torch frees it after the
    thread has let go of Python, which aborts a process exiting meanwhile ("terminate called
    without an active exception")."""
    if getattr(_followed, "mode", None) is not None:
        return nullcontext()
    mode = _followed.mode = _PlacementMode()
    mode.__enter__()
    return _unfollowing(mode)


@contextmanager
def _unfollowing(mode: _PlacementMode) -> Iterator[None]:
    try:
        yield
    finally:
        if getattr(_followed, "mode", None) is mode:
            _followed.mode = None
            mode.__exit__(None, None, None)


def enable() -> None:
    """Turn the check on in this thread and for the CPU lanes made from now on."""
    global _mode
    if _mode is not None:
        return
    _follow_this_thread()
    _mode = _followed.mode
    nn.Parameter.__new__ = staticmethod(_parameter_new)  # type: ignore[method-assign]
    device._placement_check = _follow_this_thread


def disable() -> None:
    """Turn the check off again; in the thread that turned it on, torch calls are no longer
    followed (other threads' modes stay, but do nothing)."""
    global _mode
    if _mode is None:
        return
    device._placement_check = None
    nn.Parameter.__new__ = staticmethod(_original_parameter_new)  # type: ignore[method-assign]
    mode, _mode = _mode, None
    if getattr(_followed, "mode", None) is mode:
        _followed.mode = None
        mode.__exit__(None, None, None)


def active() -> bool:
    return _mode is not None


@contextmanager
def checking_placement() -> Iterator[None]:
    """Inside the block, CPU lanes live apart from plain CPU memory (see the module doc)."""
    was_active = active()
    enable()
    try:
        yield
    finally:
        if not was_active:
            disable()


def enable_from_environment() -> None:
    """``DPKIT_CHECK_PLACEMENT=1`` turns the check on (the ``dpkit`` command and kernels with
    :func:`write_kernel_config`'s config call this; ``import dpkit`` does not)."""
    if os.environ.get(ENVIRONMENT_VARIABLE, "").strip() not in ("", "0"):
        enable()


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext dpkit.placement_check``: the check on in this kernel, from now on."""
    enable()


# A kernel's IPython config that reads the switch as the kernel starts.
KERNEL_CONFIG = (
    "# Written by dpkit.testing.placement_check.write_kernel_config: DPKIT_CHECK_PLACEMENT=1 in a\n"
    "# kernel's environment turns dpkit's placement check on as the kernel starts.\n"
    "c.InteractiveShellApp.exec_lines = [\n"
    '    "import dpkit.testing.placement_check as _p; _p.enable_from_environment(); del _p"\n'
    "]\n"
)


def write_kernel_config(ipython_dir: str | os.PathLike[str]) -> Path:
    """Write the config that makes Jupyter kernels started with ``IPYTHONDIR=ipython_dir``
    read ``DPKIT_CHECK_PLACEMENT`` (nbval's and the browser tests' kernels); return it."""
    path = Path(ipython_dir) / "profile_default" / "ipython_kernel_config.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(KERNEL_CONFIG)
    return path
