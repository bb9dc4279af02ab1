"""A model split over devices, trained one batch at a time: naive, or pipelined (GPipe).

The surprise first: splitting a model over p devices does not, by itself, make anything
faster. Stage 1 cannot start before stage 0 has finished, and in backward stage 0 waits for
stage 1, so with one batch flowing through (``micro_batches=1``, the naive split) only one
device works at any moment: each is idle a fraction ``(p - 1) / p`` of the step. GPipe
(Huang et al. 2019, https://arxiv.org/abs/1811.06965) cuts the batch into ``m``
micro-batches: while stage 1 runs micro-batch 0, stage 0 already runs micro-batch 1. Every
stage runs all ``m`` forwards, then all ``m`` backwards (last micro-batch first); the
gradients add up over the micro-batches, so the step's gradients are the whole batch's.
What is left idle, the *bubble*, is the fill at the start and the drain at the end: with
equal stages, ``(p - 1) / (m + p - 1)`` of the step (:func:`dpkit.pipeline.bubble_formula`).

Naive and pipelined are one code path here: naive *is* ``micro_batches=1``.

Each stage runs in its own thread, on its own lane (its own device), as DataParallel's
replicas do; activations and gradients cross between neighbouring stages as real copies
(:func:`dpkit.comm.copy_to`), counted as the ``nbytes`` of the receiving stage's event.
Inside ``dpkit.trace()`` every micro-batch on every stage is an event: ``apply`` for its
forward, ``backward`` for its backward (``details``: stage, micro-batch, received bytes),
so a trace has a track per lane and every figure and export works on it. On a GPU each
stage works on its device's stream (a lane's own, on one GPU), and each event ends when
that stream has finished: times are the CPU clock's, read after the GPU's work, which
costs the overlap of queueing work with running it (fine for a contrast, not a benchmark).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from dpkit import context, tracing
from dpkit.comm import copy_to
from dpkit.device import Device, as_devices
from dpkit.lanes import stream_of
from dpkit.nested import tensor_nbytes
from dpkit.pipeline.stages import place_stages, split_model
from dpkit.threads import intra_op_threads
from dpkit.tracing import Event, Phase, replica_graph
from dpkit.tracing.recorder import emit

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
WAIT_S = 0.05  # how often a waiting stage checks whether another stage failed


class StageFailed(RuntimeError):
    """A stage raised; every stage was stopped. ``stage``, ``device``, ``micro_batch``."""

    def __init__(self, message: str, stage: int, device: str, micro_batch: int | None):
        super().__init__(message)
        self.stage, self.device, self.micro_batch = stage, device, micro_batch


class _Stopped(Exception):
    """Another stage failed: this one stops waiting."""


class Pipeline:
    """``stages[s]`` on ``devices[s]``, trained a batch at a time in ``micro_batches``.

    :meth:`step` runs forward and backward of one batch (no optimizer: step your own over
    :meth:`parameters`) and returns the batch's loss; its gradients add to those already
    there, as ``backward()`` does (:meth:`zero_grad` clears them). ``loss(outputs,
    targets)`` must be a mean over rows (as ``cross_entropy``): each micro-batch's loss is
    weighted by its share of the rows, so the gradients equal those of the whole batch
    through the unsplit model.
    ``threads``: torch intra-op threads while a step runs (1: a core per stage; None: as is).
    """

    def __init__(
        self,
        stages: Sequence[nn.Module],
        devices: Sequence[Any],
        micro_batches: int = 1,
        loss: Loss = nn.functional.cross_entropy,
        threads: int | None = 1,
    ) -> None:
        self.devices: list[Device] = as_devices(devices, argument="devices")
        place_stages(stages, self.devices)
        self.stages = list(stages)
        self.micro_batches = check_micro_batches(micro_batches)
        self.loss, self.threads = loss, threads

    @property
    def p(self) -> int:
        return len(self.stages)

    def parameters(self) -> list[nn.Parameter]:
        return [p for stage in self.stages for p in stage.parameters()]

    def zero_grad(self) -> None:
        """Forget the gradients: :meth:`step`, as ``backward()``, adds to them."""
        for parameter in self.parameters():
            parameter.grad = None

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        """Forward and backward of one batch, GPipe schedule; the batch's loss."""
        rows = inputs.shape[0]
        if rows < self.micro_batches:
            raise ValueError(
                f"a batch of {rows} rows cannot make micro_batches={self.micro_batches}: each "
                f"needs a row at least; use micro_batches<={rows} or a larger batch"
            )
        run = _Run(self, torch.tensor_split(inputs, self.micro_batches),
                   torch.tensor_split(targets, self.micro_batches), rows)  # fmt: skip
        with intra_op_threads(self.threads):
            run.start()
        return run.loss


def check_micro_batches(micro_batches: Any) -> int:
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(
            f"micro_batches must be a whole number of at least 1 (1: the naive split), got "
            f"{micro_batches!r}"
        )
    return micro_batches


def pipeline(
    model: nn.Module, devices: Sequence[Any], micro_batches: int = 1, **options: Any
) -> Pipeline:
    """``model`` (an ``nn.Sequential``) cut into ``len(devices)`` balanced stages, one per
    device, as a :class:`Pipeline`."""
    lanes = as_devices(devices, argument="devices")
    return Pipeline(split_model(model, len(lanes)), lanes, micro_batches, **options)


class _Run:
    """One step: a thread per stage, queues between neighbours, every stage stopped if one
    fails."""

    def __init__(self, pipe: Pipeline, inputs: Sequence[Any], targets: Sequence[Any], rows: int):
        self.pipe, self.inputs, self.targets, self.rows = pipe, inputs, targets, rows
        p = pipe.p
        self.forward_inbox = [queue.Queue() for _ in range(p)]  # activations into stage s
        self.backward_inbox = [queue.Queue() for _ in range(p)]  # gradients into stage s
        self.failed = threading.Event()
        self.errors: list[StageFailed] = []
        self.losses: list[float] = []
        self.step = tracing.begin_step(pipe.devices)

    @property
    def loss(self) -> float:
        return sum(self.losses)

    def start(self) -> None:
        scope = context.current_scope()  # the traces recording the caller: the stages' too
        workers = [
            threading.Thread(target=self._stage, args=(s, scope), name=f"dpkit-stage-{s}")
            for s in range(self.pipe.p)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        if self.errors:
            raise self.errors[0] from self.errors[0].__cause__

    def _take(self, inbox: queue.Queue) -> Any:
        while True:
            try:
                return inbox.get(timeout=WAIT_S)
            except queue.Empty:
                if self.failed.is_set():
                    raise _Stopped from None

    def _emit(self, phase: Phase, stage: int, micro: int, start: float, received: int) -> None:
        device = self.pipe.devices[stage]
        stream = stream_of(device)
        if stream is not None:
            # A GPU works asynchronously: the work is done, and the clock may be read, once
            # its stream has finished (this also makes what is sent next ready to read).
            stream.synchronize()
        # "thread": each stage runs its backward in its own thread, unlike DataParallel's
        # replicas on CPU lanes (figures draw those as one thread's work).
        details = {"stage": stage, "micro_batch": micro, "received_bytes": received,
                   "thread": "own"}  # fmt: skip
        emit(
            Event(phase.value, device.name, start, time.perf_counter(), received, self.step,
                  device.kind, details)
        )  # fmt: skip

    def _stage(self, s: int, scope: context.Scope) -> None:
        lane = self.pipe.devices[s]
        stream = stream_of(lane)  # a lane on one GPU: its own stream
        on_stream = (
            contextlib.nullcontext()
            if stream is None
            else torch.get_device_module(lane.device_type).stream(stream)
        )
        with context.within(scope), on_stream:
            self._run_stage(s)

    def _run_stage(self, s: int) -> None:
        micro = None
        try:
            saved = []
            for micro in range(len(self.inputs)):
                saved.append(self._forward(s, micro))
            self._hold_memory(s, saved)
            for micro in reversed(range(len(self.inputs))):
                self._backward(s, micro, *saved[micro])
        except _Stopped:
            return
        except BaseException as error:  # reported in the caller's thread
            device = self.pipe.devices[s]
            where = "" if micro is None else f", micro-batch {micro}"
            failure = StageFailed(
                f"stage {s} (on {device.name}{where}) raised {type(error).__name__}: {error}",
                s, device.name, micro,
            )  # fmt: skip
            failure.__cause__ = error
            self.errors.append(failure)
            self.failed.set()

    def _forward(self, s: int, micro: int) -> tuple[torch.Tensor, Any]:
        lanes, last = self.pipe.devices, s == self.pipe.p - 1
        if s == 0:
            start = time.perf_counter()
            # The batch onto stage 0's device, as model-parallel code does x.to("cuda:0"):
            # a copy on real devices; on CPU lanes lane 0's memory is the CPU's, no copy.
            given = self.inputs[micro]
            stage_input = copy_to(given, lanes[0], "send")
            received = 0 if stage_input is given else tensor_nbytes(stage_input)
        else:
            sent = self._take(self.forward_inbox[s])
            start = time.perf_counter()
            # Detached, then a leaf that wants its gradient: what backward sends back.
            stage_input = copy_to(sent, lanes[s], "send", source=lanes[s - 1])
            stage_input = stage_input.detach().requires_grad_()
            received = tensor_nbytes(stage_input)
        output = self.pipe.stages[s](stage_input)
        if last:
            share = self.targets[micro].shape[0] / self.rows  # mean of means = the batch's mean
            targets = copy_to(self.targets[micro], lanes[s], "send")  # where the loss is
            output = self.pipe.loss(output, targets) * share
            self.losses.append(output.item())
        self._emit(Phase.APPLY, s, micro, start, received)
        if not last:
            self.forward_inbox[s + 1].put(output.detach())
        return stage_input, output

    def _backward(self, s: int, micro: int, stage_input: torch.Tensor, output: Any) -> None:
        lanes, last = self.pipe.devices, s == self.pipe.p - 1
        if last:
            start, received = time.perf_counter(), 0
            output.backward()
        else:
            sent = self._take(self.backward_inbox[s])
            start = time.perf_counter()
            gradient = copy_to(sent, lanes[s], "send", source=lanes[s + 1])
            received = tensor_nbytes(gradient)
            output.backward(gradient)
        self._emit(Phase.BACKWARD, s, micro, start, received)
        if s > 0:
            self.backward_inbox[s - 1].put(stage_input.grad)

    def _hold_memory(self, s: int, saved: list[tuple[torch.Tensor, Any]]) -> None:
        """What stage ``s`` holds once its forwards are done: GPipe keeps every
        micro-batch's activations until its backward."""
        if not tracing.recording():
            return
        lane, stage = self.pipe.devices[s], self.pipe.stages[s]
        parameters = [*stage.parameters(), *stage.buffers()]
        inputs = [stage_input for stage_input, _ in saved]
        outputs = [output for _, output in saved if output.grad_fn is not None]
        activations = replica_graph.walk(outputs, [*parameters, *inputs]).saved_nbytes
        step = self.step
        tracing.record_memory(lane, "parameters", sum(map(tensor_nbytes, parameters)), step)
        tracing.record_memory(lane, "input", sum(map(tensor_nbytes, inputs)), step)
        tracing.record_memory(lane, "activations", activations, step)
