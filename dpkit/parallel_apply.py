"""parallel_apply: run replica *i* on input *i*, each in its own thread, on its own device.

The surprises first, as in ``torch.nn.parallel.parallel_apply``:

- One Python thread per replica. Threads overlap only while torch runs kernels without the
  GIL; a forward made of many small Python steps runs one replica at a time.
- Grad mode and autocast are thread-local in torch, so the caller's settings are carried
  into every worker explicitly. torch's own parallel_apply carries grad mode and one flag,
  ``torch.is_autocast_enabled()`` with no argument (CUDA's: False inside
  ``autocast("cpu")``), re-entered at the default dtype. dpkit carries, per device type,
  whether autocast is on and at which dtype, and inference mode (with torch's, a float16
  autocast becomes the default dtype in the workers; a BatchNorm under inference_mode
  fails on lanes 1 and up).
- An exception in one replica is re-raised in the caller with its original type, the words
  "in replica i on device d" and the worker's original traceback in the message.
- A single replica runs in the calling thread.

Streams, read in the caller's thread before any worker starts (a worker thread's own
current stream is its device's default stream, whatever stream the caller is on):

- On real devices each replica runs on the stream that is current *in the caller* for its
  device, as in torch: under ``with torch.cuda.stream(s)`` that is ``s``, where scatter
  queued the replica's input.
- On a GPU lane the replica runs on that lane's own CUDA stream, which first waits for the
  caller's stream (where scatter and replicate queued their copies); the caller's stream
  waits for every lane before the outputs are used. Tensors made on one of these streams and
  read on the other are recorded on the reader's (``Tensor.record_stream``): what a replica
  reads (its input, keyword arguments, parameters and buffers) on its lane's stream, since
  autograd may free them in the middle of backward while the lane's kernels still read them,
  and its CUDA outputs on the caller's stream.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from contextlib import ExitStack, nullcontext
from typing import Any

import torch
from torch import nn
from torch._utils import ExceptionWrapper

from dpkit import comm, tracing
from dpkit.devices import (
    Device,
    DeviceLike,
    _set_current_device,
    as_devices,
    device_of,
    place,
    stream_of,
)
from dpkit.nested import module_tensors, tensors_in
from dpkit.tracing import Phase


def get_a_var(obj: Any) -> torch.Tensor | None:
    """The first tensor found in ``obj`` (a tensor, or a list, tuple or dict holding one)."""
    found = tensors_in(obj)
    return found[0] if found else None


def _check_lengths(modules, inputs, kwargs_tup, devices) -> None:
    for name, other in (("inputs", inputs), ("kwargs_tup", kwargs_tup), ("devices", devices)):
        if other is not None and len(other) != len(modules):
            raise ValueError(
                f"parallel_apply got {len(modules)} modules but {len(other)} {name}; pass one "
                f"entry of {name} per replica (e.g. from dpkit.scatter_kwargs)"
            )


def _autocast_state() -> dict[str, tuple[bool, torch.dtype]]:
    """Whether autocast is on, and at which dtype, for each device type, in this thread."""
    states = {}
    for device_type in ("cpu", "cuda"):
        try:
            enabled = torch.is_autocast_enabled(device_type)
            dtype = torch.get_autocast_dtype(device_type)
        except (TypeError, AttributeError):  # torch < 2.4 spelled these per device type
            cpu = device_type == "cpu"
            enabled = torch.is_autocast_cpu_enabled() if cpu else torch.is_autocast_enabled()
            dtype = torch.get_autocast_cpu_dtype() if cpu else torch.get_autocast_gpu_dtype()
        states[device_type] = (enabled, dtype)
    return states


def _streams(devices: Sequence[Device]) -> tuple[list[Any], Any | None]:
    """The stream each replica runs on (None on CPU), and the caller's stream when lanes
    share one GPU (else None). Called in the caller's thread, whose streams these are."""
    first = devices[0]
    if first.device_type == "cpu":
        return [None] * len(devices), None
    module = torch.get_device_module(first.device_type)
    if first.has_own_stream:
        return [stream_of(device) for device in devices], module.current_stream(first.torch_device)
    # Real devices: the caller's current stream on each, as torch does; in a worker thread
    # current_stream would give the device's default stream instead.
    return [module.current_stream(device.torch_device) for device in devices], None


def _record_reads(module: nn.Module, input: Any, kwargs: dict[str, Any], stream: Any) -> None:
    """Record on a lane's stream the CUDA tensors its replica reads that were made on the
    caller's stream (see the module docstring)."""
    comm.record_use(module_tensors(module), stream)
    comm.record_use(tensors_in(input), stream)
    if kwargs:
        comm.record_use(tensors_in(kwargs), stream)


def _worker_context(
    stack: ExitStack,
    device: Device,
    stream: Any | None,
    caller_stream: Any | None,
    autocast: dict[str, tuple[bool, torch.dtype]],
    inference_mode: bool,
) -> None:
    device_type = device.device_type
    if stream is not None:
        module = torch.get_device_module(device_type)
        stack.enter_context(module.device(device.torch_device))
        if caller_stream is not None:
            stream.wait_stream(caller_stream)  # the lane's inputs were copied on the caller's
        stack.enter_context(module.stream(stream))
    autocast_type = device_type if device_type in autocast else "cpu"
    enabled, dtype = autocast[autocast_type]
    stack.enter_context(torch.autocast(autocast_type, dtype=dtype, enabled=enabled))
    if inference_mode:
        stack.enter_context(torch.inference_mode())


def parallel_apply(
    modules: Sequence[nn.Module],
    inputs: Sequence[Any],
    kwargs_tup: Sequence[dict[str, Any]] | None = None,
    devices: Sequence[DeviceLike | None] | None = None,
) -> list[Any]:
    """Apply ``modules[i]`` to ``inputs[i]`` (and ``kwargs_tup[i]``) on ``devices[i]``.

    Each input is either the single argument or a tuple/list of positional arguments. With
    ``devices=None`` each replica runs where its first input tensor lives.
    """
    _check_lengths(modules, inputs, kwargs_tup, devices)
    kwargs_tup = kwargs_tup if kwargs_tup is not None else ({},) * len(modules)
    devices = devices if devices is not None else [None] * len(modules)
    devices = [
        _device_of_input(i, input) if device is None else device
        for i, (input, device) in enumerate(zip(inputs, devices))
    ]
    resolved = as_devices(devices, argument="devices")
    streams, caller_stream = _streams(resolved)
    lock = threading.Lock()
    results: dict[int, Any] = {}
    # These modes are thread-local in torch, so each worker must be told the caller's.
    grad_enabled, autocast = torch.is_grad_enabled(), _autocast_state()
    inference_mode = torch.is_inference_mode_enabled()

    def worker(
        index: int,
        module: nn.Module,
        input: Any,
        kwargs: dict[str, Any],
        device: Device,
        stream: Any | None,
    ):
        torch.set_grad_enabled(grad_enabled)
        _set_current_device(device)
        try:
            with ExitStack() as stack:
                _worker_context(stack, device, stream, caller_stream, autocast, inference_mode)
                # Wrapping a lone tensor avoids unpacking it into rows.
                if not isinstance(input, (list, tuple)):
                    input = (input,)
                if caller_stream is not None:
                    _record_reads(module, input, kwargs, stream)
                with tracing.span(Phase.APPLY, device, replica=index):
                    output = module(*input, **kwargs)
            tensors = tensors_in(output)
            if caller_stream is not None:  # a GPU lane's CPU tensors (a count, say) are the host's
                tensors = [t for t in tensors if t.device == device.torch_device]
            for tensor in tensors:
                if not isinstance(tensor, nn.Parameter):  # never tag the module's own tensors
                    place(tensor, device)
            with lock:
                results[index] = output
        except Exception:
            with lock:
                results[index] = ExceptionWrapper(where=f"in replica {index} on device {device}")
        finally:
            _set_current_device(None)

    work = list(zip(range(len(modules)), modules, inputs, kwargs_tup, resolved, streams))
    with (
        torch.autograd.profiler.record_function("dpkit.apply")
        if tracing.enabled() and torch.autograd._profiler_enabled()
        else nullcontext()
    ):
        _run_workers(worker, work)

    if tracing.enabled():  # outputs, activations, backward timers: after the workers
        tracing.after_apply(work, results)

    if caller_stream is not None:
        for stream in streams:
            caller_stream.wait_stream(stream)
        # Made on a lane's stream, used on the caller's: keep the allocator from reusing it.
        comm.record_use(tensors_in(list(results.values())), caller_stream)

    outputs = []
    for index in range(len(inputs)):
        output = results[index]
        if isinstance(output, ExceptionWrapper):
            output.reraise()
        outputs.append(output)
    return outputs


def _run_workers(worker: Any, work: list[tuple[Any, ...]]) -> None:
    """One thread per replica; a single replica runs in the calling thread, as in torch."""
    if len(work) == 1:
        worker(*work[0])
        return
    threads = [threading.Thread(target=worker, args=args) for args in work]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _device_of_input(index: int, input: Any) -> Device:
    tensor = get_a_var(input)
    if tensor is None:
        raise ValueError(
            f"in replica {index}, no device was given and no tensor input was found, so the "
            "device cannot be resolved; pass devices=[...] to parallel_apply"
        )
    return device_of(tensor)
