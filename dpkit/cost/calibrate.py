"""calibrate: this machine's virtual lanes measured into a :class:`~dpkit.cost.Hardware`.

The surprise first: on CPU lanes the "hardware" is mostly software. A copy between lanes is
a memcpy of a few microseconds plus dpkit's own Python around it; a replica's forward is a
handful of kernels plus Python's GIL, which its threads take turns holding; all the lanes'
threads share a couple of cores. So calibration times dpkit's own primitives (a traced
scatter, a traced replicate, a traced parallel_apply) as well as raw kernels, and fits each
of the cost model's overheads to what it saw. It takes a few seconds (``quick=True``: about
two) and shows a progress bar where tqdm is installed.

What is measured, in order:

1. copies: traced scatters over all the lanes of 4 KB to 16 MB: the link's bandwidth and
   latency per copy;
2. memory and FLOP/s: an elementwise add (bytes/s) and a square float32 matmul (FLOP/s);
3. ops: every aten op of the given models (by default the course's MLP, CNN and small
   transformer), timed alone at several chunk sizes, forward and backward: the measured
   seconds per kind of op (``Hardware.op_seconds``), and the Python and autograd overhead
   per op (eager time minus the ops' own);
4. threads: a traced parallel_apply of modules that do nothing (the stagger between
   threads' starts), and of modules of many tiny ops (the GIL contention that fits it);
5. cores: one thread of matmuls against several at once (how many lanes compute at once);
6. replicas and steps: a traced replicate (building one replica's module objects), and
   traced DataParallel steps of the models: the time outside and between the phases, and
   dpkit's own overhead per copy and per event inside a step; with three lanes or more, the
   steps on two lanes too, for the batch's copy phases' cost per call and per device;
7. phases in steps: each phase of the same models' steps on two device counts, at a row per
   lane (warm) and at 64 rows per lane (cold, some 16 MB touched a step), against what the
   model so far predicts for them: ``phase_extras`` and ``cold_extras`` (see
   :class:`~dpkit.cost.Hardware`), the part of a phase the model's own terms miss; and
   steps on one lane, whose overhead per step (``one_device_overhead``) is DataParallel's
   without its phases.

Every timing is the fastest of its repeats (see :func:`_fastest`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import os
import platform
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

import dpkit
from dpkit.cost.hardware import Hardware, Link, OpSamples
from dpkit.cost.models import COURSE_MODELS, course_model, sample_input
from dpkit.cost.presets import this_machine_default
from dpkit.cost.profile import profile, rows_like, run_passes
from dpkit.devices import VIRTUAL_GPU, Device

_STEPS = ("copies", "memory and FLOP/s", "ops", "cores", "threads", "replicas and steps")


def _fastest(work: Callable[[], Any], repeats: int, synchronize: Callable[[], None]) -> float:
    """The fastest of ``repeats`` timed runs: on a machine shared with other work the
    fastest run is the repeatable one, slower ones measure the others (as Python's timeit
    documentation advises for its repeats)."""
    times = []
    for _ in range(repeats):
        synchronize()
        start = time.perf_counter()
        work()
        synchronize()
        times.append(time.perf_counter() - start)
    return min(times)


@contextlib.contextmanager
def _progress(enabled: bool) -> Iterator[Callable[[str], None]]:
    """A progress bar over the calibration's steps (tqdm where installed, else nothing)."""
    bar = None
    if enabled:
        try:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(_STEPS), desc="calibrating", unit="step")
        except ImportError:
            bar = None

    def advance(name: str) -> None:
        if bar is not None:
            bar.set_postfix_str(name)
            bar.update(1)

    try:
        yield advance
    finally:
        if bar is not None:
            bar.close()


def _lanes(devices: int | Sequence[Device] | None) -> list[Device]:
    if devices is None:
        return dpkit.virtual_devices(4, on="cpu")
    if isinstance(devices, int):
        return dpkit.virtual_devices(devices, on="cpu")
    lanes = list(devices)
    if len(lanes) < 2:
        raise ValueError("calibrate needs at least 2 devices to time copies between them")
    return lanes


def _measure_copies(lanes: list[Device], repeats: int, sizes: Sequence[int]) -> Link:
    """Traced scatters of ``sizes`` bytes over all the lanes: the link between lanes, per
    copy (dpkit's overheads around a copy are measured inside real steps, by
    :func:`_measure_steps`).

    A step's scatter copies one chunk after another into fresh memory, so each size's time
    per copy is that of a copy among several: for each lane the fastest of the repeats, then
    the median over the lanes. Measured here, a lone copy between two lanes ran up to twice
    as fast as each copy of a scatter over 8 lanes did (14 GB/s for 6.4 MB, against 7 GB/s
    for 7 chunks of 1.6 MB); the model predicts steps, so it takes the copies of a scatter.
    """
    per_size: dict[int, float] = {}
    for nbytes in sizes:
        rows = len(lanes)
        tensor = torch.zeros(rows, max(1, nbytes // (4 * rows)), device=lanes[0].torch_device)
        fastest: dict[str, float] = {}
        for _ in range(repeats):
            with dpkit.trace() as recorded:
                dpkit.scatter(tensor, lanes)
            for event in recorded.events:
                if event.nbytes:
                    chunk = event.nbytes
                    fastest[event.device] = min(fastest.get(event.device, 1e9), event.duration)
        per_size[chunk] = statistics.median(fastest.values())
    # Two points, each the fastest, rather than a least-squares line: one slow copy of the
    # largest size (a busy machine) would otherwise tilt the line.
    smallest, largest = min(per_size), max(per_size)
    slope = (per_size[largest] - per_size[smallest]) / (largest - smallest)
    small = torch.zeros(16, device=lanes[0].torch_device)
    latency = _fastest(small.clone, repeats * 20, lambda: None)
    return Link(1.0 / slope if slope > 0 else 1e10, max(latency, 1e-7))


def _measure_rates(device: torch.device, repeats: int, synchronize: Callable[[], None]):
    size = 1 << 22  # 4 Mi floats: 16 MB per tensor, past the caches
    a, b = torch.ones(size, device=device), torch.ones(size, device=device)
    bandwidth = 3 * a.nbytes / _fastest(lambda: a.add(b), repeats, synchronize)
    n = 512
    x, y = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    flops = 2 * n**3 / _fastest(lambda: x.mm(y), repeats * 2, synchronize)
    return bandwidth, flops


def _by_work(samples: list[tuple[float, float]]) -> OpSamples:
    """Samples sorted by work, one per amount of work (the median of its times)."""
    by_work: dict[float, list[float]] = defaultdict(list)
    for work, seconds in samples:
        by_work[work].append(seconds)
    return tuple((work, statistics.median(by_work[work])) for work in sorted(by_work))


def _measure_ops(
    models: Sequence[tuple[nn.Module, torch.Tensor]],
    rows_list: Sequence[int],
    repeats: int,
    device: torch.device,
    synchronize: Callable[[], None],
) -> tuple[dict[str, OpSamples], float, float]:
    """Each aten op of ``models`` timed at each chunk size in ``rows_list``: samples of
    (work, seconds) per op kind, and the host's overhead per op in forward and backward."""
    samples: dict[str, list[tuple[float, float]]] = defaultdict(list)
    forward_overheads, backward_overheads = [], []
    for module, sample in models:
        module = module.to(device)
        cost = profile(module, sample.to(device))
        for rows in rows_list:
            inputs = rows_like(sample.to(device), rows)
            timed = [run_passes(module, inputs, None, timed=True) for _ in range(repeats)]
            for passes, ops_cost in ((0, cost.forward.ops), (1, cost.backward.ops)):
                runs = [run[passes] for run in timed]
                if any(len(ops) != len(ops_cost) for ops in runs):
                    continue  # a run that took another path: its ops cannot be matched
                # The fastest whole pass, op by op: each op's own fastest would add up to
                # less than any pass ever took (each picks a different quiet moment).
                fastest = min(runs, key=lambda ops: sum(op[3] for op in ops))
                for position, op in enumerate(ops_cost):
                    seconds = fastest[position][3]
                    flops = op.flops_at(rows)
                    sample_point = (flops if flops > 0 else op.bytes_at(rows), seconds)
                    samples[op.name].append(sample_point)  # for any op of this kind
                    samples[op.shape_key].append(sample_point)  # for this layer's shape
            if rows == rows_list[0]:
                own_forward = min(sum(op[3] for op in run[0]) for run in timed)
                own_backward = min(sum(op[3] for op in run[1]) for run in timed)
                params = [p for p in module.parameters() if p.requires_grad]

                def forward(module: nn.Module = module, inputs: torch.Tensor = inputs) -> None:
                    module(inputs)

                def backward(
                    module: nn.Module = module, inputs: torch.Tensor = inputs, params=params
                ) -> None:
                    output = module(inputs)
                    torch.autograd.grad([output], params, [torch.ones_like(output)])

                eager_forward = _fastest(forward, repeats * 5, synchronize)
                eager_both = _fastest(backward, repeats * 5, synchronize)
                forward_overheads.append((eager_forward - own_forward) / len(cost.forward))
                backward_overheads.append(
                    (eager_both - eager_forward - own_backward) / max(len(cost.backward), 1)
                )
    # the reduce-add's sums: adds of gradient-sized tensors
    for numel in (256, 1 << 14, 1 << 18, 1 << 21):
        a, b = torch.ones(numel, device=device), torch.ones(numel, device=device)
        seconds = _fastest(lambda a=a, b=b: a.add(b), repeats * 3, synchronize)
        samples["aten.add"].append((3 * a.nbytes, seconds))
    ops = {name: _by_work(found) for name, found in samples.items()}
    floor = 0.5e-6  # an op never costs the host less than this
    return (
        ops,
        max(statistics.median(forward_overheads), floor),
        max(statistics.median(backward_overheads), floor),
    )


def _apply_span(
    modules: Sequence[nn.Module], inputs: Sequence[torch.Tensor], lanes: list[Device], repeats: int
) -> tuple[float, float]:
    """The fastest span of a traced parallel_apply, and the fastest run's median stagger
    between its threads' starts."""
    spans, staggers = [], []
    for _ in range(repeats):
        with dpkit.trace() as recorded:
            dpkit.parallel_apply(list(modules), list(inputs), devices=lanes)
        events = [e for e in recorded.events if e.phase == "apply"]
        spans.append(max(e.end for e in events) - min(e.start for e in events))
        starts = sorted(e.start for e in events)
        staggers.append(statistics.median(b - a for a, b in zip(starts, starts[1:])))
    return min(spans), min(staggers)


def _measure_threads(
    models: Sequence[tuple[nn.Module, torch.Tensor]],
    lanes: list[Device],
    repeats: int,
    provisional: Hardware,
) -> tuple[float, float, dict[str, float]]:
    """The stagger between parallel_apply's thread starts (replicas that do nothing), and the
    GIL contention per op that makes the cost model's apply span match the measured one for
    each model's replicas on one-row chunks: the median over models, and each model's own
    (keyed by ``Profile.key``)."""
    from dpkit.cost.compute import pass_time
    from dpkit.cost.predict import _threads_end

    n = len(lanes)
    nothing = [torch.ones(1, 8, device=lane.torch_device) for lane in lanes]
    _, thread_start = _apply_span([nn.Identity() for _ in lanes], nothing, lanes, repeats)
    contentions: dict[str, float] = {}
    for module, sample in models:
        module = module.to(lanes[0].torch_device)
        cost = profile(module, sample)
        replicas = dpkit.replicate(module, lanes)
        chunks = [rows_like(sample, 1).to(lane.torch_device) for lane in lanes]
        span, _ = _apply_span(replicas, chunks, lanes, repeats)
        rate = provisional.flops_per_second(cost.dtype)
        own = pass_time(cost.forward, 1, provisional, rate, backward=False).device
        ops = len(cost.forward)

        def predicted(contention: float, own: float = own, ops: int = ops) -> float:
            starts = [(i + 1) * thread_start for i in range(n)]
            host = ops * (provisional.launch_overhead + contention)
            ends = _threads_end(starts, [host + own] * n, n * host, provisional.compute_units)
            return max(ends) - starts[0]

        low, high = 0.0, 1e-3
        if predicted(low) < span:
            for _ in range(40):
                middle = (low + high) / 2
                low, high = (middle, high) if predicted(middle) < span else (low, middle)
        contentions[cost.key] = low
    return thread_start, max(statistics.median(contentions.values()), 1e-7), contentions


def _per_event(events: Sequence[Any], phase: str, link: Link) -> float:
    """Seconds per event of a phase, less the link's time for its bytes: a phase's span holds
    its events and the Python between them (each event's span is built before it starts)."""
    chosen = [e for e in events if e.phase == phase]
    moved = sum(link.time(e.nbytes) for e in chosen if e.nbytes)
    span = max(e.end for e in chosen) - min(e.start for e in chosen)
    return (span - moved) / len(chosen)


def _per_tensor_copy(events: Sequence[Any], link: Link, event: float) -> float:
    """dpkit's seconds per tensor copied by replicate's and reduce's copies (the bulk of a
    step's copies by count), less the link's time and each event's own overhead."""
    costs = []
    for phase in ("replicate", "reduce"):
        chosen = [e for e in events if e.phase == phase and "what" not in e.details]
        copied = [e for e in chosen if e.nbytes]
        if not copied:
            continue
        span = max(e.end for e in chosen) - min(e.start for e in chosen)
        moved = sum(e.nbytes / link.bandwidth for e in copied)
        tensors = sum(e.details.get("tensors", 1) for e in copied)
        costs.append((span - moved - len(chosen) * event) / tensors - link.latency)
    return statistics.median(costs)


# The phases whose per-call and per-device costs are fitted from steps on two device counts.
FITTED_PHASES = ("scatter", "gather", "grad_scatter")


def _beside_bytes(events: Sequence[Any], phase: str, link: Link) -> float:
    """A phase's span in one step less the link's time for the bytes its events moved."""
    chosen = [e for e in events if e.phase == phase]
    span = max(e.end for e in chosen) - min(e.start for e in chosen)
    return span - sum(link.time(e.nbytes) for e in chosen if e.nbytes)


def _line_in_devices(points: dict[int, float]) -> tuple[float, float]:
    """``(per call, per device)`` through a value at each device count (least squares past
    two), clipped at zero where noise tilts it below; one count gives a per-call value."""
    line = _fit_line(list(points.items()))
    per_device = max(line[1], 0.0) if line is not None else 0.0
    fewest = min(points)
    return max(points[fewest] - fewest * per_device, 0.0), per_device


def _fit_phases(
    few: dict[str, list[float]], many: dict[str, list[float]], lanes: tuple[int, int]
) -> dict[str, tuple[float, float]]:
    """(per call, per device) for each fitted phase, from its time beside the bytes on two
    device counts (the median over models of each count's fastest step): the line through
    the two points, clipped at zero where noise tilts it below."""
    small, large = lanes
    return {
        phase: _line_in_devices(
            {small: statistics.median(few[phase]), large: statistics.median(many[phase])}
        )
        for phase in FITTED_PHASES
        if few.get(phase) and many.get(phase)
    }


def _walk(events: Sequence[Any]) -> float:
    """From the last replica's forward ending to the gather starting, in one step."""
    applied = max(e.end for e in events if e.phase == "apply")
    return min(e.start for e in events if e.phase == "gather") - applied


def _fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """Least squares ``y = a + b x`` through ``(x, y)`` points: ``(a, b)``, or None where
    the xs do not differ (one model on one device count)."""
    xs = [x for x, _ in points]
    if len(set(xs)) < 2:
        return None
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(y for _, y in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x in xs)
    return mean_y - slope * mean_x, slope


def _training_run(
    module: nn.Module, sample: torch.Tensor, lanes: Sequence[Device], rows: int
) -> tuple[nn.Module, nn.Module, torch.Tensor, torch.Tensor]:
    """A copy of ``module`` on ``lanes[0]``, DataParallel over ``lanes``, and a batch of
    ``rows`` rows like ``sample`` with labels: one configuration of calibration's steps."""
    home = lanes[0].torch_device
    module = copy.deepcopy(module).to(home)
    labels = torch.zeros(rows, dtype=torch.long, device=home)
    return (
        module,
        dpkit.DataParallel(module, device_ids=list(lanes)),
        rows_like(sample, rows).to(home),
        labels,
    )


def _traced_step(
    module: nn.Module, parallel: nn.Module, inputs: torch.Tensor, labels: torch.Tensor
) -> tuple[Any, float, float]:
    """One training step from zeroed gradients, traced: the trace, and when the forward
    started and the backward ended (``time.perf_counter``)."""
    from torch.nn.functional import cross_entropy

    module.zero_grad(set_to_none=True)
    with dpkit.trace() as recorded:
        start = time.perf_counter()
        cross_entropy(parallel(inputs), labels).backward()
        end = time.perf_counter()
    return recorded, start, end


def _in_a_row(items: Sequence[Any], times: int) -> Iterator[Any]:
    """Each item ``times`` times in a row: a configuration's steps one after another, as in a
    training loop (taking turns instead left each step's caches full of another model's data,
    and calibrated every phase's overheads a fifth to a half above a loop's)."""
    for item in items:
        for _ in range(times):
            yield item


def _measure_steps(
    models: Sequence[tuple[nn.Module, torch.Tensor]],
    lanes: list[Device],
    repeats: int,
    thread_start: float,
    link: Link,
) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """Traced DataParallel steps of each model, a row per lane, measure what isolated runs
    cannot: the time outside the phases and around the loss (``step_overhead``), between
    DataParallel's other phases less the threads' start (``dp_overhead``), the gap after the
    replicas' forwards per replica and forward op (``graph_overhead``), and dpkit's overhead
    per copy and per event *inside* a step, where caches are cold after the replicas ran
    (``copy_overhead``, ``event_overhead``). The fastest step's, then the median over models.

    With three lanes or more, the same steps on the first two lanes as well: each of
    :data:`FITTED_PHASES` per call and per device (``Hardware.phase_overheads``), from its
    time beside the bytes on two device counts."""
    found: dict[str, list[float]] = defaultdict(list)
    runs = [
        (*_training_run(module, sample, lanes, len(lanes)),
         len(profile(module, sample).forward), defaultdict(list))
        for module, sample in models
    ]  # fmt: skip
    # The same models on two lanes, for the phases' per-call costs (their own copies: a
    # module is replicated from the lane it is on).
    pairs = [_training_run(m, s, lanes[:2], 2) for m, s in models] if len(lanes) >= 3 else []
    beside: dict[int, dict[str, list[float]]] = {n: defaultdict(list) for n in (2, len(lanes))}
    pair_steps: list[dict[str, list[float]]] = [defaultdict(list) for _ in pairs]
    # Each model's steps in a row, as in a training loop (the benchmark measures such
    # steps); what a large working set leaves for the next step is the cold extras' part.
    for module, parallel, inputs, labels, ops, steps in _in_a_row(runs, repeats + 1):
        recorded, start, end = _traced_step(module, parallel, inputs, labels)
        events = recorded.events
        spans: dict[str, tuple[float, float]] = {}
        for e in events:
            first, last = spans.get(e.phase, (e.start, e.end))
            spans[e.phase] = (min(first, e.start), max(last, e.end))
        outside = spans["scatter"][0] - start + end - max(e for _, e in spans.values())
        loss = spans["grad_scatter"][0] - spans["gather"][1]
        between = sum(
            spans[after][0] - spans[before][1]
            for before, after in (("scatter", "replicate"), ("replicate", "apply"),
                                  ("backward", "reduce"))
        )  # fmt: skip
        steps["step_overhead"].append(outside + loss)
        steps["dp_overhead"].append(between - thread_start)
        walk = spans["gather"][0] - spans["apply"][1]
        steps["graph_overhead"].append(walk / (len(lanes) * ops))
        steps["walk"].append(walk)

        event = statistics.median(
            [_per_event(events, "scatter", link), _per_event(events, "grad_scatter", link)]
        )
        steps["event_overhead"].append(event)
        steps["copy_overhead"].append(_per_tensor_copy(events, link, event))
        for phase in FITTED_PHASES:
            steps["beside " + phase].append(_beside_bytes(events, phase, link))
    for pair, found_here in _in_a_row(list(zip(pairs, pair_steps)), repeats + 1):
        recorded, _, _ = _traced_step(*pair)
        for phase in FITTED_PHASES:
            found_here[phase].append(_beside_bytes(recorded.events, phase, link))
        found_here["walk"].append(_walk(recorded.events))
    for *_, steps in runs:
        for name, values in steps.items():
            # the first step warms up; the fastest step's glue, but the typical event: a
            # phase of several small events is never as fast as each one's fastest
            typical = name in ("copy_overhead", "event_overhead")
            found[name].append((statistics.median if typical else min)(values[1:]))
            if name.startswith("beside "):
                beside[len(lanes)][name.removeprefix("beside ")].append(min(values[1:]))
    walks = [(len(lanes) * ops, min(steps["walk"][1:])) for *_, ops, steps in runs]
    for steps, (*_, ops, _) in zip(pair_steps, runs):
        for phase, values in steps.items():
            if phase == "walk":
                walks.append((2 * ops, min(values[1:])))
            else:
                beside[2][phase].append(min(values[1:]))
    overheads = {
        name: max(statistics.median(values), 1e-7)
        for name, values in found.items()
        if not name.startswith("beside ") and name != "walk"
    }
    line = _fit_line(walks)
    if line is not None:  # the hand-back after the forwards: once per step, and per op
        fixed, per_op = line
        overheads["graph_overhead"] = max(per_op, 1e-7)
        overheads["dp_overhead"] += max(fixed, 0.0)
    fitted = _fit_phases(beside[2], beside[len(lanes)], (2, len(lanes))) if pairs else {}
    return overheads, fitted


# The phases whose extras calibrate fits: beyond the model's own terms in warm steps (the
# first two), and per doubling of the working set in cold ones (all four).
WARM_EXTRA_PHASES = ("replicate", "reduce")
COLD_EXTRA_PHASES = ("replicate", "gather", "grad_scatter", "reduce")
# Rows per lane of the cold steps: enough that the course's CNN and transformer touch some
# 16 MB per step on 4 lanes, many times a core's cache; a step then takes about 30 ms.
COLD_ROWS = 64
# A model's cold steps count only past this many doublings of the working set beyond
# warm_bytes: the MLP's touch about 1.2 MB, 0.2 doublings, and dividing its noise by 0.2
# made the cold extras five times what the steps showed.
MIN_COLD_DOUBLINGS = 2.0


def _phase_times(
    models: Sequence[tuple[nn.Module, torch.Tensor]],
    lanes: list[Device],
    counts: Sequence[int],
    rows: int,
    repeats: int,
) -> dict[tuple[int, int], dict[str, float]]:
    """Each phase's time (first start to last end, as ``Trace.summary`` gives it), and the
    step's (``"step"``: forward, loss and backward, by the wall clock) in traced
    DataParallel training steps of each model on the first ``n`` lanes for each ``n`` of
    ``counts``, ``rows`` rows per lane: the fastest after a warm-up step, keyed by (model's
    index, n). Each configuration's steps run in a row, as in :func:`_measure_steps`."""
    runs = [
        ((number, n), _training_run(module, sample, lanes[:n], rows * n))
        for number, (module, sample) in enumerate(models)
        for n in counts
    ]
    found: dict[tuple[int, int], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for key, run in runs:
        for attempt in range(repeats + 1):  # in a row, as in a training loop
            recorded, start, end = _traced_step(*run)
            if attempt:  # the first step warms up
                found[key]["step"].append(end - start)
                for row in recorded.summary():
                    found[key][row["phase"]].append(row["time_s"])
    return {key: {phase: min(times) for phase, times in by_phase.items()}
            for key, by_phase in found.items()}  # fmt: skip


def _fit_extras(
    hardware: Hardware,
    models: Sequence[tuple[nn.Module, torch.Tensor]],
    warm: dict[tuple[int, int], dict[str, float]],
    cold: dict[tuple[int, int], dict[str, float]],
    cold_rows: int,
) -> Hardware:
    """``hardware`` with ``phase_extras`` and ``cold_extras`` fitted: what the steps' phases
    took beyond the prediction of the same steps. Warm steps (a row per lane): the median
    over models at each device count, a line in the device count. Cold steps (``cold_rows``
    per lane): at each device count, the least-squares slope through the origin of the rest
    against each model's doublings of the working set beyond ``warm_bytes``, over the models
    past :data:`MIN_COLD_DOUBLINGS` (one whose steps stay in cache says nothing about cold
    ones); no such model, no cold extras."""
    from dpkit.cost.predict import predict

    def residuals(machine: Hardware, measured, rows: int):
        found: dict[int, list[tuple[float, dict[str, float]]]] = defaultdict(list)
        for (number, n), times in measured.items():
            module, sample = models[number]
            guess = predict(module, sample, rows * n, n, machine)
            predicted = {row["phase"]: row["time_s"] for row in guess.summary()}
            cost = profile(module, sample)
            working_set = cost.input_bytes(rows * n) + cost.activation_bytes(rows * n)
            doublings = max(0.0, math.log2(working_set / machine.warm_bytes))
            rest = {phase: times.get(phase, 0.0) - predicted.get(phase, 0.0) for phase in times}
            found[n].append((doublings, rest))
        return found

    extras = {}
    for phase in WARM_EXTRA_PHASES:
        at = {n: statistics.median(rest.get(phase, 0.0) for _, rest in found)
              for n, found in residuals(hardware, warm, 1).items()}  # fmt: skip
        extras[phase] = _line_in_devices(at)
    hardware = dataclasses.replace(hardware, phase_extras=extras)
    colds = {}
    by_count = residuals(hardware, cold, cold_rows)
    for phase in COLD_EXTRA_PHASES:
        at = {}
        for n, found in by_count.items():
            cold_enough = [(d, rest) for d, rest in found if d >= MIN_COLD_DOUBLINGS]
            if cold_enough:
                weight = sum(d * d for d, _ in cold_enough)
                at[n] = sum(d * rest.get(phase, 0.0) for d, rest in cold_enough) / weight
        if at:
            colds[phase] = _line_in_devices(at)
    return dataclasses.replace(hardware, cold_extras=colds)


def _fit_one_device(
    hardware: Hardware,
    models: Sequence[tuple[nn.Module, torch.Tensor]],
    steps: dict[tuple[int, int], dict[str, float]],
) -> Hardware:
    """``hardware`` with ``one_device_overhead``: ``step_overhead`` plus what steps on one
    lane (a row each, ``steps`` keyed by (model's index, 1)) took beyond their prediction,
    the median over models."""
    from dpkit.cost.predict import predict

    rest = [
        times["step"] - predict(models[number][0], models[number][1], 1, 1, hardware).step_time
        for (number, _), times in steps.items()
    ]
    overhead = max(hardware.step_overhead + statistics.median(rest), 1e-6)
    return dataclasses.replace(hardware, one_device_overhead=overhead)


def _measure_cores(device: torch.device, lanes: int, repeats: int) -> float:
    """How many threads compute at full speed at once: one thread's matmuls against
    ``lanes`` threads' (each the same work), at most ``lanes``. Many short tries: the fastest
    of them catch the cores free of other work, as the fastest of a measurement's steps do."""
    x = torch.randn(256, 256, device=device)
    repeats *= 4

    def work() -> None:
        for _ in range(10):
            x.mm(x)

    def together() -> None:
        threads = [threading.Thread(target=work) for _ in range(lanes)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    alone = _fastest(work, repeats, lambda: None)
    at_once = _fastest(together, repeats, lambda: None)
    return min(float(lanes), max(1.0, lanes * alone / at_once))


def _measure_replicas(lanes: list[Device], repeats: int) -> float:
    module = course_model("transformer").to(lanes[0].torch_device)
    durations = []
    for _ in range(repeats):
        with dpkit.trace() as recorded:
            dpkit.replicate(module, lanes)
        built = [e for e in recorded.events if e.details.get("what") == "modules"]
        modules = built[0].details["modules"]
        durations.append(built[0].duration / (modules * len(lanes)))
    return min(durations)


def calibrate(
    devices: int | Sequence[Device] | None = None,
    *,
    models: Sequence[nn.Module | str] = COURSE_MODELS,
    sample: torch.Tensor | None = None,
    quick: bool = False,
    progress: bool = True,
) -> Hardware:
    """Measure this machine's lanes (default: 4 virtual CPU lanes) into a Hardware.

    ``models`` are the models whose ops are timed (names of the course's models, or modules
    that take ``sample``, default a 1x28x28 image); ``quick`` measures fewer sizes with fewer
    repeats (about 2 s instead of about 10); ``progress`` shows a tqdm bar where installed.
    Calibrate in the process and with the torch threads the measurement will use: the numbers
    hold for this machine as it is loaded now.
    """
    lanes = _lanes(devices)
    first = lanes[0]
    gpu = first.kind == VIRTUAL_GPU or first.device_type == "cuda"
    device = first.torch_device

    def synchronize() -> None:
        if gpu:
            torch.cuda.synchronize(device)

    repeats = 3 if quick else 7
    rows_list = (1, 16, 128) if quick else (1, 8, 64, 512, 2048)
    sizes = (1 << 12, 1 << 18, 1 << 22) if quick else (1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24)
    given = sample if sample is not None else sample_input()
    chosen = [
        (course_model(m), sample_input()) if isinstance(m, str) else (m, given) for m in models
    ]
    with _progress(progress) as advance:
        link = _measure_copies(lanes, 3 * repeats, sizes)  # cheap: more tries, fewer stalls
        advance("copies")
        bandwidth, flops = _measure_rates(device, repeats, synchronize)
        advance("memory and FLOP/s")
        ops, launch, autograd = _measure_ops(chosen, rows_list, repeats, device, synchronize)
        advance("ops")
        cores = min(len(lanes), os.cpu_count() or 1)
        units = float(len(lanes)) if gpu else _measure_cores(device, cores, repeats)
        advance("cores")
        provisional = dataclasses.replace(
            this_machine_default(), peak_flops={"float32": flops}, memory_bandwidth=bandwidth,
            compute_units=units, launch_overhead=launch, op_seconds=ops,
        )  # fmt: skip
        thread_start, contention, by_model = _measure_threads(
            chosen, lanes, repeats * 2, provisional
        )
        advance("threads")
        replica = _measure_replicas(lanes, repeats)
        in_steps, phase_overheads = _measure_steps(chosen, lanes, repeats, thread_start, link)
        counts = sorted({2, len(lanes)})
        warm_times = _phase_times(chosen, lanes, counts, 1, repeats)
        cold_times = _phase_times(chosen, lanes, counts, COLD_ROWS, repeats)
        one_lane = _phase_times(chosen, lanes, [1], 1, repeats)
        advance("replicas and steps")
    default = this_machine_default()
    kind = "virtual GPU lanes" if gpu else "virtual CPU lanes"
    measured = Hardware(
        name="this-machine",
        description=f"{kind} of this machine ({platform.node() or 'here'}), calibrated, "
        f"{torch.get_num_threads()} torch thread(s)",
        device_name="GPU lane" if gpu else "CPU lane",
        source=f"calibrate() on {platform.platform()}, torch {torch.__version__}, "
        f"{time.strftime('%Y-%m-%d %H:%M')}" + (" (quick)" if quick else ""),
        peak_flops={"float32": flops},
        compute_efficiency=1.0,  # the peak *is* the FLOP/s measured
        memory_bandwidth=bandwidth,
        memory_efficiency=1.0,
        compute_units=units,
        host_to_device=link,
        device_to_device=link,
        node_to_node=link,
        devices_per_node=max(default.devices_per_node, len(lanes)),
        nodes=1,
        nics_per_node=1,
        peer_to_peer=True,
        funnel_through_device0=True,
        asynchronous=gpu,
        serial_backward=not gpu,
        launch_overhead=launch,
        autograd_overhead=autograd,
        gil_contention=contention,
        thread_start=thread_start,
        replica_overhead=replica,
        copy_overhead=in_steps["copy_overhead"],
        event_overhead=in_steps["event_overhead"],
        step_overhead=in_steps["step_overhead"],
        dp_overhead=in_steps["dp_overhead"],
        graph_overhead=in_steps["graph_overhead"],
        op_seconds=ops,
        phase_overheads=phase_overheads,
        gil_contention_by_model=by_model,
    )
    fitted = _fit_extras(measured, chosen, warm_times, cold_times, COLD_ROWS)
    return _fit_one_device(fitted, chosen, one_lane)
