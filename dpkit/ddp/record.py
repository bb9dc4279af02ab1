"""One rank's DDP training, recorded from the hooks DDP and autograd offer.

The surprise first: the recording sits *outside* torch's DistributedDataParallel, on hooks
it offers, so what runs is DDP itself, not a copy of it. Per step, on every rank:

=============  ==================================================================
``replicate``  step 1 only: DDP's constructor, which broadcasts rank 0's parameters
               and buffers to every rank (the only time DDP copies the model;
               DataParallel does it every forward). Bytes: what the rank received.
``apply``      the forward of this rank's replica, as DataParallel's ``apply``
               (module hooks on the DDP wrapper; DDP's own pre-forward work is
               inside: rebuilding its buckets at the start of step 2)
``backward``   the gradients' computation: from the output's gradient arriving (a
               hook on its autograd node) to the last parameter's gradient
               accumulated (post-accumulate-grad hooks). Not the waiting after it:
               ``details["waiting_s"]`` is how long the step's last all-reduce ran
               on after that, which the rank waits for before backward() returns;
               a timeline shows it as a gap on the rank's track, the all-reduces
               still running above it
``allreduce``  one per gradient bucket (:mod:`dpkit.ddp.hook`), overlapping backward
``optimizer``  the optimizer's step (its step pre- and post-hooks)
=============  ==================================================================

Memory per step: ``parameters``, ``input`` (the rank's rows), ``activations`` (what
autograd saved for backward, walked as dpkit's trace walks a replica), ``outputs``,
``gradients`` and ``buckets`` (DDP's flat all-reduce buffers: a second copy of the
gradients unless ``gradient_as_bucket_view=True``). On CUDA also torch's allocator totals.

Clock: ``time.perf_counter``, which on Linux is ``CLOCK_MONOTONIC``: one system-wide clock,
so the ranks' times line up without any correction (``time.get_clock_info("perf_counter")``
says so; macOS and Windows use system-wide counters too). On CUDA the times come from CUDA
events, mapped onto that clock after the run (:mod:`dpkit.tracing.clock`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from dpkit.ddp import process
from dpkit.ddp.hook import powersgd_rank, powersgd_state, recorded_allreduce
from dpkit.nested import tensor_nbytes, tensors_in
from dpkit.tracing import clock as trace_clock
from dpkit.tracing import replica_graph
from dpkit.tracing.events import ALLOCATED, PEAK, Phase

_queue_callback = torch.autograd.Variable._execution_engine.queue_callback


@dataclass
class RankRun:
    """One rank's record of one DDP run, in plain data (it travels back through a pipe)."""

    rank: int
    device: str
    pid: int
    bucket_cap_mb: float | None  # None: torch's default
    parameter_bytes: int
    events: list[tuple[str, float, float, int, int, dict[str, Any]]] = field(default_factory=list)
    memory: list[tuple[str, int, int]] = field(default_factory=list)  # category, bytes, step
    step_times: list[tuple[float, float]] = field(default_factory=list)  # (start, end) per step
    gradients: dict[str, Any] | None = None  # parameter name -> numpy array, step 1


class RankClock:
    """Readings of one clock for every rank: perf_counter on the CPU; CUDA events on a GPU,
    turned into perf_counter seconds after the run (:meth:`seconds`)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        if self.cuda:
            trace_clock.cuda_origin(device)  # fixes the GPU clock's origin before any work

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def seconds(self, mark: Any) -> float:
        if not self.cuda:
            return mark
        mark.synchronize()
        origin, origin_time = trace_clock.cuda_origin(self.device)
        return origin_time + origin.elapsed_time(mark) / 1000


class RankRecorder:
    """Records one rank's DDP training from DDP's and autograd's hooks (see the module doc)."""

    def __init__(
        self, rank: int, nproc: int, device: torch.device, where: process.Progress,
        compression: str | None = None, emulated_link: float | None = None,
    ):  # fmt: skip
        self.rank, self.nproc, self.where = rank, nproc, where
        self.compression = compression  # None, "bf16", "fp16", "powersgd[-R]" (dpkit.ddp.hook)
        self.powersgd = powersgd_state(compression) if powersgd_rank(compression) else None
        self.emulated_link = emulated_link  # bytes/s of an emulated link (dpkit.ddp.hook)
        self.link_free_at = 0.0  # when that link has sent every bucket so far
        self.clock = RankClock(device)
        self.step = 0
        self.events: list[tuple[str, Any, Any, int, int, dict[str, Any]]] = []
        self.memory: list[tuple[str, int, int]] = []
        self.bucket_bytes: dict[int, int] = {}  # step -> bytes the comm hook saw
        self.step_marks: list[tuple[Any, Any]] = []
        self.gradients: dict[str, Any] | None = None
        self._names: dict[int, str] = {}
        self._handles: list[Any] = []
        self._forward_start: Any = None
        self._forward_inputs: list[torch.Tensor] = []
        self._optimizer_start: Any = None
        self._last_gradient: Any = None  # when the latest parameter gradient was accumulated

    # -- what the hooks call

    def add(
        self, phase: str, start: Any, end: Any, nbytes: int, step: int, details: dict[str, Any]
    ) -> None:
        self.events.append((phase, start, end, nbytes, step, details))  # atomic: any thread

    def names_of(self, parameters: Sequence[torch.Tensor]) -> list[str]:
        return [self._names.get(p.data_ptr(), "?") for p in parameters]

    def hold(self, category: str, nbytes: int) -> None:
        self.memory.append((category, nbytes, self.step))

    # -- wiring

    def wrap(self, model: nn.Module, **ddp_options: Any) -> nn.parallel.DistributedDataParallel:
        """``DistributedDataParallel(model)``, timed as step 1's ``replicate``, with the
        recording all-reduce hook registered."""
        self._names = {p.data_ptr(): name for name, p in model.named_parameters()}
        self.parameters = [*model.parameters(), *model.buffers()]
        parameter_bytes = sum(map(tensor_nbytes, self.parameters))
        start = self.clock.mark()
        ddp = nn.parallel.DistributedDataParallel(model, **ddp_options)
        received = 0 if self.rank == 0 else parameter_bytes
        what = "DDP's constructor: rank 0's parameters and buffers broadcast, once"
        self.add(Phase.REPLICATE.value, start, self.clock.mark(), received, 1, {"what": what})
        ddp.register_comm_hook(self, recorded_allreduce)
        self._handles += [
            p.register_post_accumulate_grad_hook(self._on_gradient)
            for p in model.parameters()
            if p.requires_grad
        ]
        self._handles += [
            ddp.register_forward_pre_hook(self._on_forward, with_kwargs=True),
            ddp.register_forward_hook(self._on_forward_end),
        ]
        return ddp

    def watch(self, optimizer: torch.optim.Optimizer, keep_gradients: bool) -> None:
        self.keep_gradients = keep_gradients
        self._handles += [
            optimizer.register_step_pre_hook(self._on_optimizer),
            optimizer.register_step_post_hook(self._on_optimizer_end),
        ]

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()

    def run_step(self, step: Callable[..., Any], *args: Any) -> None:
        """One training step, numbered, timed, and its gradients and buckets counted."""
        self.step += 1
        self.where.at(process.BEFORE_FORWARD, self.step)
        if self.clock.cuda:
            torch.cuda.reset_peak_memory_stats(self.clock.device)
        start = self.clock.mark()
        step(*args)
        self.step_marks.append((start, self.clock.mark()))
        grads = [p.grad for p in self.parameters if getattr(p, "grad", None) is not None]
        self.hold("gradients", sum(map(tensor_nbytes, grads)))
        self.hold("buckets", self.bucket_bytes.get(self.step, 0))
        if self.clock.cuda:
            self.hold(PEAK, torch.cuda.max_memory_allocated(self.clock.device))
        self.where.at(process.AFTER_OPTIMIZER)

    # -- the hooks

    def _on_forward(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        self.where.at(process.FORWARD)
        self._forward_inputs = tensors_in([args, kwargs])
        self._forward_start = self.clock.mark()

    def _on_forward_end(self, module: nn.Module, args: Any, output: Any) -> None:
        end = self.clock.mark()
        inputs = self._forward_inputs
        rows = inputs[0].shape[0] if inputs and inputs[0].dim() else 0
        self.add(Phase.APPLY.value, self._forward_start, end, 0, self.step, {"rows": rows})
        outputs = [t for t in tensors_in(output) if t.grad_fn is not None]
        self.hold("parameters", sum(map(tensor_nbytes, self.parameters)))
        self.hold("input", sum(map(tensor_nbytes, inputs)))
        saved = replica_graph.walk(outputs, [*self.parameters, *inputs]).saved_nbytes
        self.hold("activations", saved)
        self.hold("outputs", sum(map(tensor_nbytes, tensors_in(output))))
        if self.clock.cuda:
            self.hold(ALLOCATED, torch.cuda.memory_allocated(self.clock.device))
        if outputs and torch.is_grad_enabled():
            started: list[Any] = []  # one backward per forward: the first output node to run
            step = self.step

            def on_backward(grad_outputs: Any) -> None:
                if not started:
                    started.append(self.clock.mark())
                    self._last_gradient = None
                    self.where.at(process.BACKWARD)
                    _queue_callback(lambda: self._on_backward_end(started[0], step))

            for node in {t.grad_fn for t in outputs}:
                node.register_prehook(on_backward)

    def _on_gradient(self, parameter: torch.Tensor) -> None:
        self._last_gradient = self.clock.mark()

    def _on_backward_end(self, start: Any, step: int) -> None:
        # A callback queued on autograd's engine: it runs once the engine is done, but
        # before or after DDP's own end-of-backward callback (which waits for the buckets'
        # all-reduces) depending on the run: measured here, it ran up to 30 ms before the
        # last all-reduce ended in one run and just after it in another. So the backward
        # event ends at the last gradient, which is neither, and the waiting is computed
        # from the all-reduces themselves (result()).
        end = self.clock.mark() if self._last_gradient is None else self._last_gradient
        self.add(Phase.BACKWARD.value, start, end, 0, step, {})

    def _on_optimizer(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.where.at(process.OPTIMIZER)
        if self.keep_gradients and self.step == 1:
            self.gradients = {
                self._names.get(p.data_ptr(), "?"): p.grad.detach().cpu().numpy().copy()
                for p in self.parameters
                if getattr(p, "grad", None) is not None
            }
        self._optimizer_start = self.clock.mark()

    def _on_optimizer_end(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        end = self.clock.mark()
        self.add(Phase.OPTIMIZER.value, self._optimizer_start, end, 0, self.step, {})
        self.where.at(process.AFTER_OPTIMIZER)

    def result(self, bucket_cap_mb: float | None) -> RankRun:
        """Everything recorded, in seconds of the shared clock (waits for the GPU first)."""
        if self.clock.cuda:
            torch.cuda.synchronize(self.clock.device)
        seconds = self.clock.seconds
        return RankRun(
            rank=self.rank,
            device=str(self.clock.device),
            pid=os.getpid(),
            bucket_cap_mb=bucket_cap_mb,
            parameter_bytes=sum(map(tensor_nbytes, self.parameters)),
            events=with_waiting(
                [
                    (phase, seconds(start), seconds(end), nbytes, step, details)
                    for phase, start, end, nbytes, step, details in self.events
                ]
            ),
            memory=list(self.memory),
            step_times=[(seconds(start), seconds(end)) for start, end in self.step_marks],
            gradients=self.gradients,
        )


def with_waiting(events: list[tuple]) -> list[tuple]:
    """``events`` with each backward's ``details["waiting_s"]``: how long the step's last
    all-reduce ended after the backward's last gradient (0 when it ended before)."""
    last_end: dict[int, float] = {}
    for phase, _, end, _, step, _ in events:
        if phase == Phase.ALLREDUCE.value:
            last_end[step] = max(end, last_end.get(step, end))
    return [
        (phase, start, end, nbytes, step,
         {**details, "waiting_s": max(0.0, last_end.get(step, end) - end)})
        if phase == Phase.BACKWARD.value
        else (phase, start, end, nbytes, step, details)
        for phase, start, end, nbytes, step, details in events
    ]  # fmt: skip
