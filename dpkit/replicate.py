"""replicate: one copy of a module per device, rebuilt on every forward of DataParallel.

The surprises first, all as in ``torch.nn.parallel.replicate``:

- Replica 0 *shares storage* with the original module: its buffers are the original
  tensors, and its parameters are views of the original memory made by the broadcast (not
  leaves: their ``grad_fn`` is ``BroadcastBackward``), so in-place updates such as
  BatchNorm's running statistics made by replica 0 land in the original module. Every
  other replica holds its own copies, and what it writes to them is lost.
- Replica parameters are not ``nn.Parameter`` leaves: they are outputs of a broadcast, set
  as plain attributes, so ``replica.parameters()`` is empty. Gradients flow back through
  the broadcast, whose backward reduce-adds them onto the source device.
- Buffers that require grad go through autograd too; the others are detached copies.
- With ``detach=True`` (DataParallel uses it when grad mode is off) nothing is tracked.

``replicate`` reads line for line against torch's; each dpkit addition is marked
``# dpkit:`` where it applies and defined after the function.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, TypeVar

import torch
from torch import nn

from dpkit import comm, tracing
from dpkit._functions import Broadcast
from dpkit.device import Device, DeviceLike, as_devices

T = TypeVar("T", bound=nn.Module)


@tracing.replicating  # dpkit: while tracing, building the replica modules is timed from outside
def replicate(network: T, devices: Sequence[DeviceLike], detach: bool = False) -> list[T]:
    """One replica of ``network`` per device; replica 0 shares storage with ``network``."""
    # dpkit: torch's check that no Python module hides under a ScriptModule, and clear errors
    # for what torch would fail on later (no module, a lazy parameter, a compiled module)
    _check_replicable(network)

    # dpkit: dpkit Devices (lanes too); no devices is an error, where torch returns []
    devices = as_devices(devices)
    num_replicas = len(devices)

    params = list(network.parameters())
    param_indices = {param: idx for idx, param in enumerate(params)}
    param_copies = _broadcast_coalesced_reshape(params, devices, detach)

    buffers = list(network.buffers())
    # dpkit: two list comprehensions for torch's loop over the buffers, the same split
    buffers_rg = [buf for buf in buffers if buf.requires_grad and not detach]
    buffers_not_rg = [buf for buf in buffers if not (buf.requires_grad and not detach)]

    buffer_indices_rg = {buf: idx for idx, buf in enumerate(buffers_rg)}
    buffer_indices_not_rg = {buf: idx for idx, buf in enumerate(buffers_not_rg)}

    buffer_copies_rg = _broadcast_coalesced_reshape(buffers_rg, devices, detach=detach)
    buffer_copies_not_rg = _broadcast_coalesced_reshape(buffers_not_rg, devices, detach=True)

    modules = list(network.modules())
    module_copies: list[list[nn.Module]] = [[] for _ in devices]
    module_indices: dict[nn.Module, int] = {}

    for i, module in enumerate(modules):
        module_indices[module] = i
        for j in range(num_replicas):
            replica = module._replicate_for_data_parallel()
            # DDP reads replicated parameters from here (torch PR #33907 hid them).
            replica._former_parameters = OrderedDict()
            module_copies[j].append(replica)

    # dpkit: torch's loops, with each test for an absent entry moved inside the loop over
    # replicas (torch: outside it, with module_idx, param_idx, buffer_idx looked up once)
    for i, module in enumerate(modules):
        for key, child in module._modules.items():
            for j in range(num_replicas):
                replica = module_copies[j][i]
                if child is None:
                    replica._modules[key] = None
                else:
                    setattr(replica, key, module_copies[j][module_indices[child]])
        for key, param in module._parameters.items():
            for j in range(num_replicas):
                replica = module_copies[j][i]
                if param is None:
                    replica._parameters[key] = None
                else:
                    param_copy = param_copies[j][param_indices[param]]
                    # parameters in replicas are no longer leaves,
                    # so setattr them as non-parameter attributes
                    setattr(replica, key, param_copy)
                    # expose the parameter for DDP
                    replica._former_parameters[key] = param_copy
        for key, buf in module._buffers.items():
            for j in range(num_replicas):
                replica = module_copies[j][i]
                if buf is None:
                    replica._buffers[key] = None
                elif buf.requires_grad and not detach:
                    setattr(replica, key, buffer_copies_rg[j][buffer_indices_rg[buf]])
                else:
                    setattr(replica, key, buffer_copies_not_rg[j][buffer_indices_not_rg[buf]])

    return [module_copies[j][0] for j in range(num_replicas)]  # type: ignore[misc]


# --------------------------------------------------------------------------------------
# dpkit's additions, in the order replicate calls them.


def check_not_compiled(module: nn.Module, where: str = "module") -> None:
    """A clear error for a ``torch.compile``'d module (an ``OptimizedModule``): its replicas
    would keep calling the original module's compiled forward, not their own copies."""
    if type(module).__name__ == "OptimizedModule" and hasattr(module, "_orig_mod"):
        raise TypeError(
            f"{where} was compiled with torch.compile, and its replicas would all run the "
            "original module's compiled forward, not their own copies; pass the plain module "
            "(model._orig_mod, or the model before torch.compile). DataParallel makes new "
            "replicas on every forward, which torch.compile cannot follow; for compiled data "
            "parallelism, compile each rank's model under DistributedDataParallel (dpkit.ddp)"
        )


def check_module(module: Any) -> None:
    """Clear errors for what is not a Module, or is compiled (DataParallel checks when made)."""
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"module must be a torch.nn.Module, got {type(module).__name__}; to run a plain "
            "function on every device, wrap it in an nn.Module"
        )
    check_not_compiled(module)


def _check_replicable(network: nn.Module) -> None:
    """Clear errors for what torch would fail on later, then torch's own first check."""
    check_module(network)
    for name, param in network.named_parameters():
        if isinstance(param, nn.parameter.UninitializedParameter):
            raise ValueError(
                f"module has an uninitialised (lazy) parameter {name!r}; run one forward on a "
                "single device first (e.g. model(x[:1])) so its shape is known, then replicate"
            )
    for submodule in network.modules():  # the module itself passed check_module above
        check_not_compiled(submodule, "a submodule of module")
    # torch's check that no Python module hides under a ScriptModule (its private helper, read
    # when called: torch.nn.parallel's replicate function hides the module of the same name)
    from torch.nn.parallel.replicate import _replicatable_module

    if not _replicatable_module(network):
        raise RuntimeError(
            "Cannot replicate network where python modules are children of ScriptModule"
        )


def _broadcast_coalesced_reshape(
    tensors: Sequence[torch.Tensor], devices: Sequence[Device], detach: bool
) -> list[list[torch.Tensor]]:
    """torch's helper of the same name: one list of copies per device, through the Broadcast
    function (tracked by autograd) or, with ``detach``, comm's broadcast (not tracked). dpkit
    copies each tensor as it is, not coalesced, and gives empty lists for no tensors (torch:
    [])."""
    if len(tensors) == 0:
        return [[] for _ in devices]  # dpkit: one empty list per device (torch: [])
    if detach:
        # dpkit: no complex mask: comm's copies keep complex tensors complex (torch views the
        # outputs of comm.broadcast_coalesced back as complex)
        return comm.broadcast(tensors, devices)
    tensor_copies = Broadcast.apply(devices, *tensors)
    n = len(tensors)
    return [list(tensor_copies[i : i + n]) for i in range(0, len(tensor_copies), n)]
