"""The bubble: how much of a pipelined step the devices sit idle, measured and predicted.

The surprise first: the formula ``(p - 1) / (m + p - 1)`` is a *best case*. It assumes p
stages that take exactly as long as each other, micro-batches that cost exactly ``1 / m``
of the batch, and sends that take no time. A real step is worse: the slowest stage sets
the pace, a small micro-batch runs a matrix product less efficiently than a big one, and
every micro-batch pays Python's overhead per layer. :func:`idle_fraction` measures the
idle share from a trace; :func:`bubble_sweep` sets it beside the formula for several
``m``, with the spread of repeated steps.

Where the machine has fewer cores than stages, stages would share cores and measure the
sharing, not the schedule. :func:`predict_schedule` then simulates GPipe's schedule from
each stage's forward and backward times measured alone (:func:`stage_times`): a
prediction, whose events are of kind ``predicted`` and say so in every figure.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

import dpkit
from dpkit import host_clock
from dpkit.comm import copy_to
from dpkit.pipeline.schedule import Pipeline
from dpkit.table import Table
from dpkit.threads import intra_op_threads
from dpkit.tracing import PREDICTED, Event, Phase, Trace


def bubble_formula(stages: int, micro_batches: int) -> float:
    """GPipe's idle share with equal stages: ``(p - 1) / (m + p - 1)``."""
    return (stages - 1) / (micro_batches + stages - 1)


def busy_seconds(events: Sequence[Event]) -> dict[str, float]:
    """Seconds each device was busy: the union of its events' intervals."""
    by_device: dict[str, list[tuple[float, float]]] = {}
    for event in events:
        by_device.setdefault(event.device, []).append((event.start, event.end))
    busy = {}
    for device, intervals in by_device.items():
        total, reached = 0.0, float("-inf")
        for start, end in sorted(intervals):
            if end > reached:
                total += end - max(start, reached)
                reached = end
        busy[device] = total
    return busy


def idle_fraction(trace: Trace | Sequence[Event], step: int | None = None) -> float:
    """The share of device-time idle in ``step`` (default: the last): 1 - busy / (p x span),
    the span running from the first event's start to the last one's end."""
    events = list(trace.events if hasattr(trace, "events") else trace)
    if not events:
        raise ValueError("the trace has no events: run a pipeline step inside dpkit.trace()")
    step = max(e.step for e in events) if step is None else step
    events = [e for e in events if e.step == step]
    span = max(e.end for e in events) - min(e.start for e in events)
    busy = busy_seconds(events)
    return 1 - sum(busy.values()) / (len(busy) * span)


def stage_times(
    pipe: Pipeline, inputs: torch.Tensor, targets: torch.Tensor, repeats: int = 3
) -> list[tuple[float, float]]:
    """Each stage's forward and backward on the whole batch, run alone (in one thread of its
    own, as a stage runs, nothing else of the model running): the median of ``repeats``, in
    seconds."""
    times: list[tuple[float, float]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            _time_stages(pipe, inputs, targets, repeats, times)
        except BaseException as error:  # raised again in the caller's thread
            errors.append(error)

    worker = threading.Thread(target=run, name="dpkit-stage-timer")
    worker.start()
    worker.join()
    if errors:
        raise errors[0]
    return times


def _time_stages(pipe: Pipeline, inputs: torch.Tensor, targets: torch.Tensor, repeats: int,
                 times: list[tuple[float, float]]) -> None:  # fmt: skip
    stage_input, lanes = inputs, pipe.devices
    with intra_op_threads(pipe.threads):
        for s, stage in enumerate(pipe.stages):
            # Where the stage runs, as Pipeline moves them: the batch onto stage 0's device,
            # each output onto the next stage's, the targets to the last (cuda:0, cuda:1, ...)
            stage_input = copy_to(stage_input, lanes[s], "send", source=lanes[s - 1] if s else None)
            last = s == pipe.p - 1
            stage_targets = copy_to(targets, lanes[s], "send") if last else None
            forward, backward = [], []
            for _ in range(repeats):
                leaf = stage_input.detach().requires_grad_(s > 0)
                start = host_clock.now(lanes)  # on GPUs: once the queued work is done
                output = stage(leaf)
                if last:
                    output = pipe.loss(output, stage_targets)
                middle = host_clock.now(lanes)
                output.backward(None if output.dim() == 0 else torch.ones_like(output))
                forward.append(middle - start)
                backward.append(host_clock.now(lanes) - middle)
            times.append((statistics.median(forward), statistics.median(backward)))
            stage_input = output.detach() if s < pipe.p - 1 else stage_input
    pipe.zero_grad()


def predict_schedule(times: Sequence[tuple[float, float]], micro_batches: int) -> Trace:
    """GPipe's schedule simulated from each stage's (forward, backward) seconds on the whole
    batch, each micro-batch taking ``1 / m`` of them and sends taking no time: a Trace of
    ``predicted`` events (``predicted:s (stage s)``), one step."""
    p, m = len(times), micro_batches
    forward_end = [[0.0] * m for _ in range(p)]
    events: list[Event] = []

    def add(phase: Phase, s: int, micro: int, start: float, seconds: float) -> float:
        details = {"stage": s, "micro_batch": micro}
        name = f"predicted:{s} (stage {s})"
        events.append(Event(phase.value, name, start, start + seconds, 0, 1, PREDICTED, details))
        return start + seconds

    for s in range(p):
        free = 0.0
        for micro in range(m):
            ready = forward_end[s - 1][micro] if s else 0.0
            free = forward_end[s][micro] = add(Phase.APPLY, s, micro, max(free, ready),
                                               times[s][0] / m)  # fmt: skip
    backward_end = [[0.0] * m for _ in range(p)]
    for s in reversed(range(p)):
        free = forward_end[s][m - 1]
        for micro in reversed(range(m)):
            ready = backward_end[s + 1][micro] if s < p - 1 else 0.0
            free = backward_end[s][micro] = add(Phase.BACKWARD, s, micro, max(free, ready),
                                                times[s][1] / m)  # fmt: skip
    trace = Trace()
    trace._events = sorted(events, key=lambda event: event.start)  # filled, not recorded
    trace.origin = 0.0
    return trace


def measure_steps(
    pipe: Pipeline, inputs: torch.Tensor, targets: torch.Tensor, repeats: int
) -> tuple[Trace, list[float]]:
    """``repeats`` traced steps (after one untraced warm-up step), each from zeroed
    gradients: the trace and each step's idle fraction. The gradients left are one step's."""
    pipe.zero_grad()
    pipe.step(inputs, targets)
    with dpkit.trace() as recorded:
        for _ in range(repeats):
            pipe.zero_grad()
            pipe.step(inputs, targets)
    steps = sorted({e.step for e in recorded.events})
    return recorded, [idle_fraction(recorded, step) for step in steps]


def bubble_sweep(
    make_pipeline: Callable[[int], Pipeline],
    inputs: torch.Tensor,
    targets: torch.Tensor,
    micro_batches: Sequence[int] = (1, 2, 4, 8),
    repeats: int = 5,
) -> Any:
    """For each ``m`` in ``micro_batches``: the formula's idle share and the measured one
    (median and quartiles of ``repeats`` steps), and the median step time.
    ``make_pipeline(m)`` builds the pipeline for ``m`` micro-batches."""
    rows = Table()
    for m in micro_batches:
        pipe = make_pipeline(m)
        recorded, idle = measure_steps(pipe, inputs, targets, repeats)
        q1, _, q3 = statistics.quantiles(idle, n=4) if len(idle) > 1 else (idle[0],) * 3
        spans = [
            max(e.end for e in recorded.events if e.step == step)
            - min(e.start for e in recorded.events if e.step == step)
            for step in sorted({e.step for e in recorded.events})
        ]
        rows.append(
            {
                "micro_batches": m,
                "formula": bubble_formula(pipe.p, m),
                "measured idle": statistics.median(idle),
                "q1": q1,
                "q3": q3,
                "step ms": statistics.median(spans) * 1e3,
            }
        )
    return rows


def single_device_gradients(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                            loss: Callable[..., torch.Tensor] = nn.functional.cross_entropy
                            ) -> dict[str, torch.Tensor]:  # fmt: skip
    """The reference: each parameter's gradient from the unsplit ``model`` on the whole batch
    (the model itself is not touched: a copy runs)."""
    import copy

    reference = copy.deepcopy(model)
    loss(reference(inputs), targets).backward()
    return {name: p.grad for name, p in reference.named_parameters()}
