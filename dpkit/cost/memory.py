"""What each device holds during a step: the memory half of a prediction.

The surprise first: in DataParallel device 0 runs out of memory first, and not because of
its replica. It holds the caller's whole batch, the gathered outputs and their gradient,
the module's ``.grad`` *and* its replica's gradients until the reduce, the reduce's 10 MiB
buffers and the optimizer's state. DDP's ranks are even, but each holds its gradients twice
(``.grad`` and the buckets) unless ``gradient_as_bucket_view=True``: about three times the
parameters' bytes with plain SGD, five with Adam.
"""

from collections.abc import Sequence

from dpkit.cost.collectives import COALESCE_BYTES
from dpkit.cost.profiling import Profile, op_kind

# Optimizer state per trainable parameter, in copies of it (torch.optim's state_dict):
# plain SGD none, SGD(momentum>0) its momentum_buffer, Adam and AdamW exp_avg, exp_avg_sq.
OPTIMIZER_COPIES = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}

Held = dict[str, int]

# cuBLAS's workspace, per thread and stream that runs a matmul on a device: torch gives each
# cuBLAS handle (one per thread) a workspace per stream (at::cuda::getCurrentCUDABlasHandle,
# CublasHandlePool.cpp), of CUBLAS_WORKSPACE_CONFIG's default size: 32 MiB on Hopper (sm90),
# 4096 KiB x 2 + 16 KiB x 8 on earlier GPUs. An H200 read 33,554,432 bytes after its first
# matmul and twice that after the first backward (benchmarks/results/gpu_cost_check_h200).
HOPPER = ("H100", "H200", "GH200")
WORKSPACE_HOPPER = 32 * 2**20
WORKSPACE_EARLIER = 4096 * 1024 * 2 + 16 * 1024 * 8
# A training step runs its matmuls in two threads per device: the forward's (the caller's,
# or parallel_apply's worker) and autograd's thread for that device, which runs the backward.
THREADS_WITH_MATMULS = 2


def optimizer_copies(optimizer: str) -> int:
    """Copies of the gradients an optimizer keeps as state."""
    try:
        return OPTIMIZER_COPIES[optimizer.lower()]
    except (KeyError, AttributeError):
        raise ValueError(
            f"optimizer={optimizer!r} is not known; use one of {', '.join(OPTIMIZER_COPIES)} "
            "(the state it keeps is what the memory prediction needs)"
        ) from None


def with_blas_workspaces(held: list[Held], model: Profile, device_name: str) -> list[Held]:
    """``held`` and the cuBLAS workspaces a GPU holds in a step of ``model`` (if it has matmuls)."""
    if not any(op_kind(op.name) == "matmul" for op in model.forward.ops):
        return held
    size = THREADS_WITH_MATMULS * (WORKSPACE_HOPPER if device_name in HOPPER else WORKSPACE_EARLIER)
    return [{**device, "cuBLAS workspaces": size} for device in held]


def _replica(model: Profile, rows: int) -> Held:
    return {
        "parameters": model.parameter_bytes + model.buffer_bytes,
        "input": model.input_bytes(rows),
        "activations": model.activation_bytes(rows),
        "outputs": model.output_bytes(rows),
    }


def dp_memory(model: Profile, sizes: Sequence[int], optimizer: str, gpu: bool) -> list[Held]:
    """Bytes per category on each device of a DataParallel step with chunks of ``sizes``
    rows; ``gpu``: torch's path (device 0 holds the batch; NCCL reduce buffers), else
    dpkit's lanes (each its chunk; the host reduces tensor by tensor)."""
    gradients = model.gradient_bytes
    held = [{**_replica(model, rows), "gradients": gradients} for rows in sizes]  # until the reduce
    first = held[0]
    first["gradients"] = gradients * (2 if len(sizes) > 1 else 1)  # .grad, and replica 0's
    first["optimizer"] = gradients * optimizer_copies(optimizer)
    if len(sizes) > 1:
        first["gathered"] = model.output_bytes(sum(sizes))
        # the loss's, scattered back: of the outputs that require grad
        first["output gradient"] = model.grad_output_bytes(sum(sizes))
    if gpu:
        first["input"] = model.input_bytes(sum(sizes))
        if len(sizes) > 1:  # each device flattens up to 10 MiB; device 0 also the result
            for index, device in enumerate(held):
                device["reduce buffers"] = min(gradients, COALESCE_BYTES) * (2 if index == 0 else 1)
    return held


def ddp_memory(model: Profile, sizes: Sequence[int], optimizer: str,
               gradient_as_bucket_view: bool) -> list[Held]:  # fmt: skip
    """Bytes per category on each rank of a DDP step."""
    gradients, state = model.gradient_bytes, model.gradient_bytes * optimizer_copies(optimizer)
    buckets = 0 if gradient_as_bucket_view else gradients
    return [{**_replica(model, rows), "gradients": gradients, "buckets": buckets,
             "optimizer": state} for rows in sizes]  # fmt: skip
