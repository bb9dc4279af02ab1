"""dpkit: torch.nn.DataParallel taken apart, instrumented, and runnable without a GPU.

``nn.DataParallel`` is four primitives composed: scatter the batch, replicate the module,
parallel_apply the replicas, gather the outputs. dpkit implements each of them with
``torch.nn.parallel``'s semantics on real accelerators, on virtual lanes on one GPU (a CUDA
stream each) and on virtual lanes on the CPU (a thread and real copies each).

``__all__`` is what a learner calls: the four primitives and ``DataParallel``, the devices,
``trace``. The subpackages hold the rest: ``dpkit.viz`` (explorers and figures),
``dpkit.cost``, ``dpkit.ddp``, ``dpkit.pipeline``, ``dpkit.grading``.
"""

import sys

from dpkit import device
from dpkit.chunk_plans import torch_chunk_sizes, weighted_chunk_sizes
from dpkit.comm import Transfer, add_transfer_listener
from dpkit.data_parallel import DataParallel, data_parallel
from dpkit.device import Device, current_device, devices, to_device, virtual_devices
from dpkit.environment import check_environment
from dpkit.gather import gather
from dpkit.lanes import device_of
from dpkit.parallel_apply import parallel_apply
from dpkit.replicate import replicate
from dpkit.scatter import scatter, scatter_kwargs
from dpkit.tracing import Trace, register_phase_hook, trace

# isort: split
# Importable from here as before, but not in __all__: how device specs are resolved, the
# planners behind chunk_sizes=, and a trace's event type (dpkit.tracing.Event).
from dpkit.chunk_plans import balanced_chunk_sizes as balanced_chunk_sizes
from dpkit.chunk_plans import plan_chunks as plan_chunks
from dpkit.device import as_device as as_device
from dpkit.device import as_devices as as_devices
from dpkit.tracing import Event as Event

# The module was dpkit/devices.py, hidden behind the dpkit.devices() function of the same
# name; imports from its old name (``from dpkit.devices import Device``) still find it.
sys.modules.setdefault("dpkit.devices", device)

__version__ = "0.1.0"

__all__ = [
    "DataParallel",
    "Device",
    "Trace",
    "Transfer",
    "add_transfer_listener",
    "check_environment",
    "current_device",
    "data_parallel",
    "device_of",
    "devices",
    "gather",
    "parallel_apply",
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
