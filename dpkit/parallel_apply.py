"""parallel_apply: run replica *i* on input *i*, each in its own thread, on its own device.

``parallel_apply`` and its ``_worker`` read line for line against torch's. Each dpkit addition
is a named helper (defined after the function, or in :mod:`dpkit.lanes` for lanes) called
where a ``# dpkit:`` comment says what it adds.

The surprises first, as in ``torch.nn.parallel.parallel_apply``:

- One Python thread per replica. Threads overlap only while torch runs kernels without the
  GIL; a forward made of many small Python steps runs one replica at a time.
- Grad mode and autocast are thread-local in torch, so the caller's settings are carried
  into every worker explicitly. torch's own parallel_apply carries grad mode and one flag,
  ``torch.is_autocast_enabled()`` with no argument (CUDA's: False inside
  ``autocast("cpu")``), re-entered at the default dtype. dpkit carries, for the device type
  of each replica (the one autocast it enters), whether autocast is on and at which dtype,
  and inference mode (with torch's, a bfloat16 autocast becomes CUDA's default float16 in
  the workers; a BatchNorm under inference_mode fails on lanes 1 and up).
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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch import nn
from torch._utils import ExceptionWrapper

from dpkit import device as dpkit_device
from dpkit import lanes, tracing
from dpkit.device import Device, DeviceLike, _set_current_device, as_devices
from dpkit.nested import tensors_in


def get_a_var(obj: Any) -> torch.Tensor | None:
    """The first tensor found in ``obj`` (a tensor, or a list, tuple or dict holding one)."""
    return next(iter(tensors_in(obj)), None)


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
    ``devices=None`` each replica runs where its first input tensor lives (torch's: under the
    current device, whatever its input's). With ``timeout``
    (seconds), replicas still running after it raise ``TimeoutError`` (see the module
    docstring for what happens to their threads).
    """
    # dpkit: the lengths as torch checks them, and the types and timeout=, with clearer errors
    _check_arguments(modules, inputs, kwargs_tup, devices, timeout)
    if kwargs_tup is None:
        kwargs_tup = ({},) * len(modules)
    if devices is None:
        devices = [None] * len(modules)
    # dpkit: a missing device is found from its input, before any replica runs (torch: the
    # current device; its worker's search of the input never runs), and every device becomes
    # a dpkit Device (a lane, an accelerator, the host)
    devices = _resolve_devices(devices, inputs)
    # dpkit: torch's current stream per device, or a GPU lane's own, which waits for the caller's
    streams, caller_stream = lanes.lane_streams(devices)
    lock = threading.Lock()
    results: dict[int, Any] = {}
    # dpkit: torch's grad mode and autocast flag, and more of what torch keeps per thread
    modes = _CallersModes(devices)

    def _worker(
        i: int, module: nn.Module, input: Any, kwargs: dict[str, Any], device: Device, stream: Any
    ) -> None:
        try:
            # dpkit: torch's grad mode, device_index, stream and autocast, and more (_CallersModes)
            with modes.entered(device, stream):
                # this also avoids accidental slicing of `input` if it is a Tensor
                if not isinstance(input, (list, tuple)):
                    input = (input,)
                # dpkit: on a GPU lane, what the replica reads is recorded on the lane's stream
                lanes.record_reads(module, input, kwargs, device, stream)
                output = module(*input, **kwargs)
            # dpkit: the tensors the forward made are tagged with its lane
            lanes.tag_new_outputs(output, device, module, input, kwargs)
            with lock:
                results[i] = output
        except BaseException:  # dpkit: SystemExit and KeyboardInterrupt too (torch: Exception)
            with lock:
                results[i] = _ReplicaFailure(where=f"in replica {i} on device {device}")

    work = list(zip(range(len(modules)), modules, inputs, kwargs_tup, devices, streams))
    # dpkit: while tracing, each worker runs as a traced replica (see dpkit.tracing.applying)
    with tracing.applying(_worker, work, results) as worker:
        if len(modules) > 1 or timeout is not None:  # dpkit: timeout= needs a thread, even for one
            # dpkit: daemon threads, so a stuck replica cannot keep the process from exiting
            threads = [threading.Thread(target=worker, args=args, daemon=True) for args in work]
            for thread in threads:
                thread.start()
            _join(threads, work, timeout)  # dpkit: short joins (Ctrl-C gets through), timeout=
        else:
            worker(*work[0])

    # dpkit: the caller's stream waits for the lanes' and records their outputs
    lanes.lanes_done(streams, caller_stream, results)

    outputs = []
    for i in range(len(inputs)):
        output = results[i]
        if isinstance(output, ExceptionWrapper):
            output.reraise()
        outputs.append(output)
    return outputs


# --------------------------------------------------------------------------------------
# dpkit's additions, in the order parallel_apply calls them. Clearer errors first.

_WHAT_TO_PASS = {
    "modules": "the replicas, e.g. dpkit.replicate(model, devices)",
    "inputs": "one input per replica, e.g. the chunks of dpkit.scatter(x, devices)",
    "kwargs_tup": "one dict of keyword arguments per replica, or None",
    "devices": "one device per replica, e.g. dpkit.devices(n), or None",
}


def _check_arguments(
    modules: Any, inputs: Any, kwargs_tup: Any, devices: Any, timeout: float | None
) -> None:
    """torch's length checks, after checking that each argument is a sequence at all and
    that ``timeout`` is a number of seconds a thread can wait."""
    arguments = dict(modules=modules, inputs=inputs, kwargs_tup=kwargs_tup, devices=devices)
    for name, value in arguments.items():
        if value is None and name in ("modules", "inputs"):
            raise ValueError(f"{name} is None; pass {_WHAT_TO_PASS[name]}")
        if value is not None and not (hasattr(value, "__len__") and hasattr(value, "__getitem__")):
            raise TypeError(
                f"{name} must be a list or tuple, got a {type(value).__name__}; pass "
                f"{_WHAT_TO_PASS[name]} (a generator can be turned into one with list(...))"
            )
    check_timeout(timeout)
    for name, other in (("inputs", inputs), ("kwargs_tup", kwargs_tup), ("devices", devices)):
        if other is not None and len(other) != len(modules):
            raise ValueError(
                f"parallel_apply got {len(modules)} modules but {len(other)} {name}; pass one "
                f"entry of {name} per replica (e.g. from dpkit.scatter_kwargs)"
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
    # One range check: nan fails both comparisons, and an int past float's range (10**400) is
    # compared exactly (math.isfinite would raise OverflowError); threads wait no longer.
    if not 0 < timeout <= threading.TIMEOUT_MAX:
        raise ValueError(
            f"timeout must be a positive number of seconds, at most {threading.TIMEOUT_MAX:.0f} "
            f"(about 292 years, the longest a thread can wait), got {shown}; pass e.g. "
            "timeout=60, or timeout=None to wait as long as the replicas take"
        )
    return timeout


def _resolve_devices(devices: Sequence[DeviceLike | None], inputs: Sequence[Any]) -> list[Device]:
    """torch's ``_get_device_index`` for each device, in the caller, but for a missing one:
    where the replica's first input tensor lives (a clear error if it has none), where torch's
    ``_get_device_index(None, True)`` gives the current device."""
    found = []
    for i, (input, device) in enumerate(zip(inputs, devices)):
        if device is None:
            tensor = get_a_var(input)
            if tensor is None:
                raise ValueError(
                    f"in replica {i}, no device was given and no tensor input was found, so "
                    "the device cannot be resolved; pass devices=[...] to parallel_apply"
                )
            device = lanes.device_of(tensor)
        found.append(device)
    return as_devices(found, argument="devices")


class _CallersModes:
    """What torch keeps per thread, read in the caller and entered in each worker: torch's
    grad mode and autocast (for the replicas' device types, with its dtype, where torch
    carries one flag), and beyond torch's, inference mode and the intra-op thread count (the
    module docstring says why each matters)."""

    def __init__(self, devices: Sequence[Device]) -> None:
        self.grad_enabled = torch.is_grad_enabled()
        # torch keeps one autocast state per device type: the replicas' own types' are read
        self.autocast: dict[str, tuple[bool, torch.dtype]] = {}
        for kind in {device.device_type for device in devices}:
            self.autocast[kind] = (torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind))
        self.inference_mode = torch.is_inference_mode_enabled()
        self.num_threads = torch.get_num_threads()

    @contextmanager
    def entered(self, device: Device, stream: Any | None) -> Iterator[None]:
        """torch's worker's ``set_grad_enabled``, ``device_index``, ``stream`` and ``autocast``,
        the caller's other modes, and the device ``dpkit.current_device()`` names."""
        torch.set_grad_enabled(self.grad_enabled)
        if torch.get_num_threads() != self.num_threads:
            torch.set_num_threads(self.num_threads)
        enabled, dtype = self.autocast[device.device_type]
        # torch's device_index(device) and stream, on an accelerator (stream is None on CPU)
        accelerator = torch.get_device_module(device.device_type) if stream is not None else None
        _set_current_device(device)
        follow = dpkit_device._placement_check  # dpkit: the placement check follows replicas too
        try:
            with (
                accelerator.device(device.torch_device) if accelerator else nullcontext(),
                accelerator.stream(stream) if accelerator else nullcontext(),
                torch.autocast(device.device_type, dtype=dtype, enabled=enabled),
                torch.inference_mode() if self.inference_mode else nullcontext(),
                follow() if follow else nullcontext(),
            ):
                yield
        finally:
            _set_current_device(None)


# No hang without a way out.

# How often a waiting caller wakes up: a join without a limit would hold back a
# KeyboardInterrupt delivered by _thread.interrupt_main() until every worker finished.
_POLL_SECONDS = 0.05


def _join(threads: list[threading.Thread], work: list[tuple], timeout: float | None) -> None:
    """torch's ``thread.join()`` for each thread, in short joins, so that Ctrl-C gets
    through, and up to ``timeout`` seconds in all (``TimeoutError`` naming who still runs)."""
    deadline = math.inf if timeout is None else time.monotonic() + timeout
    for thread in threads:
        while thread.is_alive():
            left = deadline - time.monotonic()
            if left <= 0:
                running = [(args[0], args[4]) for t, args in zip(threads, work) if t.is_alive()]
                which = ", ".join(f"replica {index} on {device}" for index, device in running)
                raise TimeoutError(
                    f"parallel_apply: {which} still running after timeout={timeout} s. Python "
                    "cannot stop a thread: each keeps running in the background until its "
                    "forward returns, and its result is dropped (the threads are daemon "
                    "threads, so the process can still exit). Look for what the replica waits "
                    "on (a lock, a queue, another replica), or raise timeout if the work is "
                    "just slow"
                )
            thread.join(min(left, _POLL_SECONDS))


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
