"""dpkit: torch.nn.DataParallel taken apart, instrumented, and runnable without a GPU.

``nn.DataParallel`` is four primitives composed: scatter the batch, replicate the module,
parallel_apply the replicas, gather the outputs. dpkit implements each of them with
``torch.nn.parallel``'s semantics on real accelerators, on virtual lanes on one GPU (a CUDA
stream each) and on virtual lanes on the CPU (a thread and real copies each).
"""

from dpkit.comm import Transfer, add_transfer_listener
from dpkit.data_parallel import DataParallel, data_parallel
from dpkit.devices import (
    Device,
    as_device,
    as_devices,
    current_device,
    device_of,
    devices,
    to_device,
    virtual_devices,
)
from dpkit.environment import check_environment
from dpkit.gather import gather
from dpkit.parallel_apply import parallel_apply
from dpkit.replicate import replicate
from dpkit.scatter import (
    balanced_chunk_sizes,
    plan_chunks,
    scatter,
    scatter_kwargs,
    torch_chunk_sizes,
    weighted_chunk_sizes,
)
from dpkit.tracing import Event, Trace, register_phase_hook, trace

__version__ = "0.1.0"

__all__ = [
    "DataParallel",
    "Device",
    "Event",
    "Trace",
    "Transfer",
    "add_transfer_listener",
    "as_device",
    "as_devices",
    "balanced_chunk_sizes",
    "check_environment",
    "current_device",
    "data_parallel",
    "device_of",
    "devices",
    "gather",
    "parallel_apply",
    "plan_chunks",
    "register_phase_hook",
    "replicate",
    "scatter",
    "scatter_kwargs",
    "to_device",
    "torch_chunk_sizes",
    "trace",
    "virtual_devices",
    "weighted_chunk_sizes",
]
