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
- Torch's intra-op thread count is carried too (``torch.get_num_threads()`` in the caller). A
  new thread starts with OpenMP's default team (every core) until torch initialises it, which
  an MKL matmul does not do, so ``torch.set_num_threads(1)`` in the caller would not reach the
  workers' matmuls (4x the CPU time of a small MLP step measured on 2 cores), nor would a count
  set in the caller's thread only (``omp_set_num_threads``, as threadpoolctl does).
- A single replica runs in the calling thread (with ``timeout=``, in a worker thread).
- ``SystemExit`` and ``KeyboardInterrupt`` raised in a replica are re-raised as themselves,
  with the replica and device in the message (a ``SystemExit`` keeps its exit code).

No hang without a way out (dpkit additions; torch's threads are joined without a limit):

- The caller waits with short timed joins, so Ctrl-C (or ``_thread.interrupt_main()``)
  reaches it at once, even while replicas run.
- ``timeout=`` (seconds, off by default) raises ``TimeoutError`` naming the replicas still
  running and their devices.
- Worker threads are daemon threads. Python cannot stop a thread, so after a timeout or a
  Ctrl-C a stuck replica keeps running in the background until its forward returns (its
  result is dropped), and the process can still exit while it runs.
- Each replica's output tensors are tagged with its lane, except tensors that existed before
  its forward (its inputs, its module's buffers and tensor attributes): dpkit marks no tensor
  it did not make. An output with a ``grad_fn`` was made by the forward; a leaf (any output
  under ``no_grad``) is looked up among those tensors after the forward, so a leaf the forward
  both stores on its module and returns stays untagged (only byte counts on lanes see it).

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

import math
import sys
import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack, nullcontext
from typing import Any

import torch
from torch import nn
from torch._utils import ExceptionWrapper

from dpkit import comm, tracing
from dpkit.context import NO_SCOPE, current_scope, within
from dpkit.devices import (
    _LANE_ATTRIBUTE,
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


# How often a waiting caller wakes up: a join without a limit would hold back a
# KeyboardInterrupt delivered by _thread.interrupt_main() until every worker finished.
_POLL_SECONDS = 0.05

_WHAT_TO_PASS = {
    "modules": "the replicas, e.g. dpkit.replicate(model, devices)",
    "inputs": "one input per replica, e.g. the chunks of dpkit.scatter(x, devices)",
    "kwargs_tup": "one dict of keyword arguments per replica, or None",
    "devices": "one device per replica, e.g. dpkit.devices(n), or None",
}


def _check_sequences(**arguments: Any) -> None:
    for name, value in arguments.items():
        if value is None and name in ("kwargs_tup", "devices"):
            continue
        if value is None:
            raise ValueError(f"{name} is None; pass {_WHAT_TO_PASS[name]}")
        if not hasattr(value, "__len__") or not hasattr(value, "__getitem__"):
            raise TypeError(
                f"{name} must be a list or tuple, got a {type(value).__name__}; pass "
                f"{_WHAT_TO_PASS[name]} (a generator can be turned into one with list(...))"
            )


def check_timeout(timeout: float | None) -> float | None:
    """``timeout`` if it is None or a positive, finite number of seconds; else a clear error."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(
            f"timeout must be a number of seconds or None, got {timeout!r}; pass e.g. timeout=60"
        )
    shown = repr(timeout) if len(repr(timeout)) <= 20 else f"a number of {len(str(timeout))} digits"
    # An int past float's range (10**400) is infinite for this check, not an OverflowError.
    if not (timeout > 0 and (isinstance(timeout, int) or math.isfinite(timeout))):
        raise ValueError(
            f"timeout must be a positive, finite number of seconds, got {shown}; pass e.g. "
            "timeout=60, or timeout=None to wait as long as the replicas take"
        )
    if timeout > threading.TIMEOUT_MAX:  # threads cannot wait longer (OverflowError)
        raise ValueError(
            f"timeout must be at most {threading.TIMEOUT_MAX:.0f} seconds (about 292 years, "
            f"the longest a thread can wait), got {shown}; pass timeout=None to wait as long "
            "as the replicas take"
        )
    return timeout


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


class _ReplicaFailure(ExceptionWrapper):
    """torch's ExceptionWrapper, for any exception a replica raised, ``SystemExit`` and
    ``KeyboardInterrupt`` included: re-raised as its own type, and a ``SystemExit`` with the
    exit code it was given (``sys.exit(3)`` in a replica still exits with status 3)."""

    def __init__(self, where: str) -> None:
        super().__init__(where=where)
        self.code = getattr(sys.exc_info()[1], "code", None)

    def reraise(self) -> None:
        if issubclass(self.exc_type, SystemExit):
            exception = SystemExit(f"Caught SystemExit {self.where}.\nOriginal {self.exc_msg}")
            exception.code = self.code
            raise exception
        super().reraise()


def _tensor_ids_before(module: nn.Module, input: Any, kwargs: dict[str, Any]) -> set[int]:
    """The tensors a replica could return without making them: its inputs, and its
    modules' buffers and tensor attributes (a replica's parameters are attributes too)."""
    ids = {id(t) for t in tensors_in(input)}
    if kwargs:
        ids.update(id(t) for t in tensors_in(kwargs))
    stack = [module]
    while stack:
        submodule = stack.pop()
        stack.extend(child for child in submodule._modules.values() if child is not None)
        ids.update(id(v) for v in submodule.__dict__.values() if isinstance(v, torch.Tensor))
        ids.update(id(t) for t in submodule._buffers.values() if t is not None)
    return ids


def _place_new(
    tensors: list[torch.Tensor], device: Device, module: nn.Module, input: Any, kwargs: Any
) -> None:
    """Tag with ``device`` the output tensors the replica's forward made. Tensors on a lane
    already keep their lane; a parameter or a tensor that existed before the forward is the
    user's (or another replica's), and tagging it would move it to this lane for good."""
    if not device.is_virtual:  # only virtual lanes are tags
        return
    new = [
        t
        for t in tensors
        if getattr(t, _LANE_ATTRIBUTE, None) is None and not isinstance(t, nn.Parameter)
    ]
    # An output with a grad_fn was made by autograd in this forward; a leaf may be older.
    if any(t.grad_fn is None for t in new):
        before = _tensor_ids_before(module, input, kwargs)
        new = [t for t in new if t.grad_fn is not None or id(t) not in before]
    for tensor in new:
        place(tensor, device)


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
    *,
    timeout: float | None = None,
) -> list[Any]:
    """Apply ``modules[i]`` to ``inputs[i]`` (and ``kwargs_tup[i]``) on ``devices[i]``.

    Each input is either the single argument or a tuple/list of positional arguments. With
    ``devices=None`` each replica runs where its first input tensor lives. With ``timeout``
    (seconds), replicas still running after it raise ``TimeoutError`` (see the module
    docstring for what happens to their threads).
    """
    _check_sequences(modules=modules, inputs=inputs, kwargs_tup=kwargs_tup, devices=devices)
    check_timeout(timeout)
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
    num_threads = torch.get_num_threads()
    scope = current_scope()  # the traces recording the caller: its workers' work too

    def worker(
        index: int,
        module: nn.Module,
        input: Any,
        kwargs: dict[str, Any],
        device: Device,
        stream: Any | None,
    ):
        torch.set_grad_enabled(grad_enabled)
        if torch.get_num_threads() != num_threads:
            torch.set_num_threads(num_threads)
        _set_current_device(device)
        try:
            with ExitStack() as stack:
                if scope is not NO_SCOPE:
                    stack.enter_context(within(scope))
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
            _place_new(tensors, device, module, input, kwargs)
            with lock:
                results[index] = output
        except BaseException:  # SystemExit and KeyboardInterrupt too: the caller re-raises them
            with lock:
                results[index] = _ReplicaFailure(where=f"in replica {index} on device {device}")
        finally:
            _set_current_device(None)

    work = list(zip(range(len(modules)), modules, inputs, kwargs_tup, resolved, streams))
    with (
        torch.autograd.profiler.record_function("dpkit.apply")
        if tracing.enabled() and torch.autograd._profiler_enabled()
        else nullcontext()
    ):
        _run_workers(worker, work, timeout)

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


def _run_workers(worker: Any, work: list[tuple[Any, ...]], timeout: float | None) -> None:
    """One thread per replica; a single replica runs in the calling thread, as in torch,
    unless there is a timeout to keep. Waits in short joins, so that Ctrl-C gets through."""
    if len(work) == 1 and timeout is None:
        worker(*work[0])
        return
    threads = [threading.Thread(target=worker, args=args, daemon=True) for args in work]
    for thread in threads:
        thread.start()
    deadline = math.inf if timeout is None else time.monotonic() + timeout
    for thread in threads:
        while thread.is_alive():
            left = deadline - time.monotonic()
            if left <= 0:
                raise _timed_out(threads, work, timeout)
            thread.join(min(left, _POLL_SECONDS))


def _timed_out(
    threads: list[threading.Thread], work: list[tuple[Any, ...]], timeout: float | None
) -> TimeoutError:
    running = [(args[0], args[4]) for thread, args in zip(threads, work) if thread.is_alive()]
    which = ", ".join(f"replica {index} on {device}" for index, device in running)
    return TimeoutError(
        f"parallel_apply: {which} still running after timeout={timeout} s. Python cannot stop "
        "a thread: each keeps running in the background until its forward returns, and its "
        "result is dropped (the threads are daemon threads, so the process can still exit). "
        "Look for what the replica waits on (a lock, a queue, another replica), or raise "
        "timeout if the work is just slow"
    )


def _device_of_input(index: int, input: Any) -> Device:
    tensor = get_a_var(input)
    if tensor is None:
        raise ValueError(
            f"in replica {index}, no device was given and no tensor input was found, so the "
            "device cannot be resolved; pass devices=[...] to parallel_apply"
        )
    return device_of(tensor)
