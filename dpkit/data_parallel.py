"""DataParallel and data_parallel: scatter, replicate, parallel_apply and gather composed.

The surprises first, as in ``torch.nn.DataParallel``:

- The module is replicated on **every** forward; replicas are thrown away afterwards, so
  anything a forward writes to them (a counter attribute, say) is lost. Replica 0 shares
  storage with the module, so its in-place updates survive: BatchNorm's running statistics
  come from the chunk of ``device_ids[0]`` only.
- Hooks on the module run once per replica, each with that replica's chunk.
- A module returning a scalar (a loss) returns a vector with one entry per used device.
- A batch smaller than the number of devices leaves devices idle: only devices that got a
  chunk get a replica.
- The module must sit on ``device_ids[0]`` (for virtual lanes: lane 0, the plain memory).

Unlike ``torch.nn.DataParallel``, this one runs without an accelerator: on a laptop
``device_ids=dpkit.devices(4)`` gives four virtual CPU lanes. Its opt-in additions are
``chunk_sizes=`` (see :mod:`dpkit.scatter`) and ``timeout=`` (seconds; replicas still running
after it raise ``TimeoutError``, see :mod:`dpkit.parallel_apply`; with one device the module
then runs in a worker thread too, so that the timeout holds).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any, Generic, TypeVar

import torch
from torch import nn

from dpkit import tracing
from dpkit.device import Device, DeviceLike, as_device, as_devices, devices
from dpkit.gather import gather
from dpkit.lanes import device_of, resides_on
from dpkit.parallel_apply import check_timeout, parallel_apply
from dpkit.replicate import check_module, replicate
from dpkit.scatter import ChunkSizes, check_dim, scatter_kwargs

T = TypeVar("T", bound=nn.Module)


class DataParallel(nn.Module, Generic[T]):
    """Split the input across devices, run a replica of ``module`` on each, gather outputs."""

    def __init__(
        self,
        module: T,
        device_ids: Sequence[DeviceLike] | None = None,
        output_device: DeviceLike | None = None,
        dim: int = 0,
        *,
        chunk_sizes: ChunkSizes = None,
        timeout: float | None = None,
    ) -> None:
        super().__init__()
        # dpkit: no torch._C._log_api_usage_once (dpkit is not torch's API)
        check_module(module)  # dpkit: a clear error for what is not a Module, or is compiled
        self.dim = check_dim(dim)  # dpkit: a clear error now, not at the first forward
        self.module = module
        self.chunk_sizes = chunk_sizes  # dpkit: other splits than torch.chunk's
        self.timeout = check_timeout(timeout)  # dpkit: replicas that hang raise TimeoutError
        # dpkit: dpkit Devices, virtual lanes where there is no accelerator (torch: indices, and
        # without an accelerator no devices: forward then calls the module as it is)
        self.device_ids, self.output_device = _resolve(device_ids, output_device)
        self.src_device_obj = self.device_ids[0]  # dpkit: a Device, a GPU or a virtual lane
        # dpkit: no _check_balance (torch's warning about GPUs of unequal memory or cores)
        if len(self.device_ids) == 1:
            self.module.to(self.src_device_obj.torch_device)  # dpkit: the Device's torch device

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        with torch.autograd.profiler.record_function("DataParallel.forward"):
            # dpkit: no pass-through for empty device_ids (torch's, without an accelerator)
            _check_on_source(self.module, self.src_device_obj)  # dpkit: the fix in its error
            # dpkit: while tracing, a step begins here and its forward ends at the return
            with tracing.forward_step((*self.device_ids, self.output_device)):
                inputs, module_kwargs = self.scatter(inputs, kwargs, self.device_ids)
                # for forward function without any inputs, empty list and dict will be created
                # so the module can be executed on one device which is the first one in device_ids
                if not inputs and not module_kwargs:
                    inputs = ((),)
                    module_kwargs = ({},)

                if len(self.device_ids) == 1:
                    if self.timeout is None:  # dpkit: traced as replica 0's forward
                        return tracing.traced_call(
                            self.module, inputs[0], module_kwargs[0], self.src_device_obj
                        )
                    # dpkit: timeout= needs a worker thread, even for one device
                    return self.parallel_apply([self.module], inputs[:1], module_kwargs[:1])[0]
                replicas = self.replicate(self.module, self.device_ids[: len(inputs)])
                outputs = self.parallel_apply(replicas, inputs, module_kwargs)
                return self.gather(outputs, self.output_device)

    def replicate(self, module: T, device_ids: Sequence[DeviceLike]) -> list[T]:
        return replicate(module, device_ids, not torch.is_grad_enabled())

    def scatter(
        self,
        inputs: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        device_ids: Sequence[DeviceLike],
    ) -> Any:
        # dpkit: chunk_sizes=, other splits than torch.chunk's
        return scatter_kwargs(
            inputs, kwargs, device_ids, dim=self.dim, chunk_sizes=self.chunk_sizes
        )

    def parallel_apply(
        self, replicas: Sequence[T], inputs: Sequence[Any], kwargs: Any
    ) -> list[Any]:
        # dpkit: timeout=
        return parallel_apply(
            replicas, inputs, kwargs, self.device_ids[: len(replicas)], timeout=self.timeout
        )

    def gather(self, outputs: Any, output_device: DeviceLike) -> Any:
        return gather(outputs, output_device, dim=self.dim)

    def extra_repr(self) -> str:  # dpkit: torch's DataParallel has none
        names = ", ".join(d.name for d in self.device_ids)
        return f"device_ids=[{names}], output_device={self.output_device}, dim={self.dim}"


def data_parallel(
    module: nn.Module,
    inputs: Any,
    device_ids: Sequence[DeviceLike] | None = None,
    output_device: DeviceLike | None = None,
    dim: int = 0,
    module_kwargs: Any | None = None,
    *,  # dpkit: the opt-in additions, as in DataParallel
    chunk_sizes: ChunkSizes = None,
    timeout: float | None = None,
) -> Any:
    """Evaluate ``module(*inputs)`` in parallel on ``device_ids``: DataParallel as a function.

    As torch's ``data_parallel``, it never detaches the replicas (``DataParallel`` does
    when grad is off).
    """
    # dpkit: clear errors for module and timeout= before any work, not after the scatter (dim:
    # scatter_kwargs checks it, before any copy)
    check_module(module)
    check_timeout(timeout)
    if not isinstance(inputs, tuple):
        inputs = (inputs,) if inputs is not None else ()
    # dpkit: Devices, virtual lanes where there is no accelerator (torch: indices, and a
    # RuntimeError without an accelerator)
    device_ids, output_device = _resolve(device_ids, output_device)
    _check_on_source(module, device_ids[0])  # dpkit: the fix in its error
    with tracing.forward_step((*device_ids, output_device)):  # dpkit: as in DataParallel
        # dpkit: chunk_sizes=
        inputs, module_kwargs = scatter_kwargs(inputs, module_kwargs, device_ids, dim, chunk_sizes)
        # For module without any inputs, empty list and dict will be created
        # so the module can be executed on one device which is the first one in device_ids
        if not inputs and not module_kwargs:
            inputs = ((),)
            module_kwargs = ({},)
        # dpkit: no assertion that module_kwargs is not None: scatter_kwargs returns a tuple

        if len(device_ids) == 1:
            # dpkit: traced as replica 0's forward; timeout= needs a worker thread, even for one
            if timeout is None:
                return tracing.traced_call(module, inputs[0], module_kwargs[0], device_ids[0])
            return parallel_apply(
                [module], inputs[:1], module_kwargs[:1], device_ids[:1], timeout=timeout
            )[0]
        used_device_ids = device_ids[: len(inputs)]
        replicas = replicate(module, used_device_ids)
        # dpkit: timeout=
        outputs = parallel_apply(replicas, inputs, module_kwargs, used_device_ids, timeout=timeout)
        return gather(outputs, output_device, dim)


# --------------------------------------------------------------------------------------
# dpkit's additions: clearer errors, and devices resolved.


def _check_on_source(module: nn.Module, source: Device) -> None:
    named = chain(module.named_parameters(), module.named_buffers())
    for name, tensor in named:
        if resides_on(tensor, source):
            continue
        found = device_of(tensor)
        home = Device(0, source.kind, source.torch_device)  # lane 0 of the lanes in use
        if source.is_virtual and source.index != 0 and found.shares_memory_with(home):
            fix = (
                f"a module you create sits on lane 0 (the plain {source.torch_device} memory), "
                "so list lane 0 first: use device_ids=dpkit.virtual_devices(n)"
            )
        elif found.is_virtual and tensor.device == source.memory:
            # .to() cannot help: both lanes are the same torch device, so it copies nothing.
            fix = (
                f"{name!r} is a copy dpkit made for {found} (a chunk, a replica's tensor or a "
                "replica's output), and module.to() does not move a tensor between lanes of one "
                f"memory; give the module a copy of its own, e.g. module.{name} = "
                f"module.{name}.detach().clone() (wrapped in nn.Parameter for a parameter)"
            )
        else:
            fix = f"move it there first with module.to({str(source.torch_device)!r})"
        raise RuntimeError(
            "module must have its parameters and buffers on device "
            f"{source} (device_ids[0]) but found one of them on device: {found}; {fix}"
        )


def _resolve(
    device_ids: Sequence[DeviceLike] | None, output_device: DeviceLike | None
) -> tuple[list[Device], Device]:
    resolved = devices() if device_ids is None else as_devices(device_ids, argument="device_ids")
    output = (
        resolved[0]
        if output_device is None
        else as_device(output_device, like=resolved[0], argument="output_device")
    )
    if output.is_virtual and output not in resolved:
        # A virtual lane of any index can be named, so a typo would make a new lane.
        indices = ", ".join(str(d.index) for d in resolved)
        raise ValueError(
            f"output_device={output_device!r} names {output}, which is not one of device_ids; "
            f"use one of them (an index among {indices}), or -1 for the host CPU"
        )
    return resolved, output
