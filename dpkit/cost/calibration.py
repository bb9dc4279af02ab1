"""calibrate: this machine's virtual lanes measured into a :class:`~dpkit.cost.Hardware`.

The surprise first: on CPU lanes the "hardware" is mostly software. A copy between lanes is
a memcpy plus dpkit's Python around it, a replica's forward is kernels plus Python that the
replicas' threads take turns running (the GIL), and all the lanes share a couple of cores.
So calibration times the copies, the cores, every aten op of generic probes and of the
models, and the primitives' own host costs, then fits the other host terms (:data:`FITTED`)
to untraced DataParallel steps through :func:`~dpkit.cost.predict` itself. Nothing is fitted
per model. About 4 s with ``quick=True``, 10 s without.
"""

import contextlib
import dataclasses
import functools
import math
import platform
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

import dpkit
from dpkit import host_clock
from dpkit.cost.catalog import this_machine_default
from dpkit.cost.hardware import Hardware, Link, OpSamples
from dpkit.cost.prediction import predict
from dpkit.cost.profiling import profile, rows_like, run_passes
from dpkit.device import Device
from dpkit.models import COURSE_MODELS, build_model, sample_input

_STEPS = ("copies", "cores", "ops", "primitives", "steps")
# the host terms fitted to measured steps (measure_steps, fit_host_terms)
FITTED = ("op_overhead", "backward_op_overhead", "gil_handoff", "copy_overhead", "step_overhead")
FLOOR = 1e-7  # no host term is fitted below 0.1 us
# a measured step: model, sample, batch, lanes, and seconds by phase ("step": the wall time)
Measured = tuple[nn.Module, torch.Tensor, int, int, dict[str, float]]


def _fastest(work: Callable[[], Any], repeats: int, on: Sequence[Device] = ()) -> float:
    """The fastest of ``repeats`` runs, the repeatable one on a shared machine (as timeit's
    documentation advises); on GPU lanes ``on``, of the work, not of its launch."""
    best = math.inf
    for _ in range(repeats):
        start = host_clock.now(on)
        work()
        best = min(best, host_clock.now(on) - start)
    return best


@contextlib.contextmanager
def _progress(enabled: bool) -> Iterator[Callable[[str], None]]:
    """A tqdm bar over the calibration's steps, where installed."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        yield lambda _: None
        return
    with tqdm(total=len(_STEPS), desc="calibrating", unit="step", disable=not enabled) as bar:
        yield lambda name: (bar.set_postfix_str(name), bar.update(1))


# Bytes measure_link writes between two timed copies on CPU lanes: more than the last-level
# cache (32 MiB on the course's 2-core AMD EPYC VM). A step's copies read tensors its own work
# pushed out of the caches; one scattered again and again is read from the cache: on that VM a
# 1.6 MB chunk took 52 us that way, 208 us after eviction; the steps' scatters took 200-320 us.
EVICT_BYTES = 64 * 2**20


def measure_link(
    lanes: Sequence[Device], repeats: int, sizes: Sequence[int],
    evict: Callable[[], None] | None = None,
) -> Link:  # fmt: skip
    """The link between lanes from traced scatters, each after ``evict`` (on CPU lanes by
    default, writing :data:`EVICT_BYTES`): the bandwidth is the slope between the smallest and
    largest size's median over lanes of their fastest copy (one slow copy would tilt a
    least-squares line), the latency a lone clone of 16 floats."""
    if evict is None and lanes[0].torch_device.type == "cpu":
        evict = functools.partial(torch.zeros(EVICT_BYTES // 4).add_, 1.0)
    per_size: dict[int, float] = {}
    for nbytes in sizes:
        rows = len(lanes)
        tensor = torch.zeros(rows, max(1, nbytes // (4 * rows)), device=lanes[0].torch_device)
        fastest: dict[str, float] = {}
        for _ in range(repeats):
            if evict is not None:
                evict()
            with dpkit.trace() as recorded:
                dpkit.scatter(tensor, list(lanes))
            for event in recorded.events:
                if event.nbytes:
                    fastest[event.device] = min(fastest.get(event.device, 1.0), event.duration)
                    chunk = event.nbytes
        per_size[chunk] = statistics.median(fastest.values())
    small, large = min(per_size), max(per_size)
    slope = (per_size[large] - per_size[small]) / (large - small)
    latency = _fastest(torch.zeros(16, device=lanes[0].torch_device).clone, repeats * 20, lanes)
    return Link(1.0 / slope if slope > 0 else 1e11, max(latency, FLOOR), "calibrate(): lanes")


def measure_cores(lanes: int, repeats: int) -> float:
    """Threads that compute at full speed at once (1 to ``lanes``): ``lanes`` times one
    thread's matmuls' time over ``lanes`` threads' each doing the same."""
    x = torch.randn(256, 256)

    def work() -> None:
        for _ in range(10):
            x.mm(x)

    def together(count: int) -> None:
        threads = [threading.Thread(target=work) for _ in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    alone = _fastest(work, repeats)  # in this thread: an error in the work shows
    at_once = _fastest(lambda: together(lanes), repeats)
    return min(float(lanes), max(1.0, lanes * alone / at_once))


def probes(quick: bool) -> list[tuple[nn.Module, torch.Tensor]]:
    """Generic modules (no course model) whose ops calibration times; more without ``quick``."""
    torch.manual_seed(0)
    found = [
        (nn.Sequential(nn.Linear(200, 512), nn.ReLU(), nn.Linear(512, 64), nn.ReLU(),
                       nn.Linear(64, 10)), torch.randn(1, 200)),
        (nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                       nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                       nn.Flatten(), nn.Linear(32 * 4 * 4, 10)), torch.randn(1, 3, 16, 16)),
    ]  # fmt: skip
    if not quick:
        found += [
            (nn.Sequential(nn.Linear(96, 384), nn.LayerNorm(384), nn.GELU(), nn.Linear(384, 96),
                           nn.Softmax(dim=-1), nn.Linear(96, 10)), torch.randn(1, 96)),
            (nn.TransformerEncoder(nn.TransformerEncoderLayer(
                32, 2, 96, dropout=0.0, batch_first=True), 1), torch.randn(1, 12, 32)),
        ]  # fmt: skip
    return found


def op_curve(points: Sequence[tuple[float, float]], ratio: float = 1.3) -> OpSamples:
    """One op's ``(work, seconds)`` points as a curve: points within ``ratio`` of each
    other's work merged (medians), then made non-decreasing (pool-adjacent-violators)."""
    groups: list[list[tuple[float, float]]] = []
    for work, seconds in sorted(points):
        if groups and work <= groups[-1][0][0] * ratio:
            groups[-1].append((work, seconds))
        else:
            groups.append([(work, seconds)])
    blocks = []  # [work, seconds, weight], merged while a later one is faster
    for group in groups:
        blocks.append([statistics.median(w for w, _ in group),
                       statistics.median(s for _, s in group), len(group)])  # fmt: skip
        while len(blocks) > 1 and blocks[-2][1] > blocks[-1][1]:
            (_, s0, n0), (w1, s1, n1) = blocks.pop(-2), blocks.pop()
            blocks.append([w1, (s0 * n0 + s1 * n1) / (n0 + n1), n0 + n1])
    return tuple((work, seconds) for work, seconds, _ in blocks)


def measure_ops(
    modules: Sequence[tuple[nn.Module, torch.Tensor]], rows_list: Sequence[int], repeats: int
) -> dict[str, OpSamples]:
    """Each aten op of ``modules`` at each of ``rows_list`` rows, forward and backward: the
    fastest whole pass's op times (each op's own fastest would add up to less than any pass
    took), less the recorder's own cost, as an :func:`op_curve` per op name."""
    points: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for module, sample in modules:
        cost = profile(module, sample)
        for rows in rows_list:
            inputs = rows_like(sample, rows)
            runs = [run_passes(module, inputs, None, timed=True)]
            spent = sum(op[3] for op in runs[0][0] + runs[0][1])
            # more tries for the short passes (cheap, and the noisiest), at most 0.05 s each
            for _ in range(max(repeats, min(4 * repeats, int(0.05 / max(spent, 1e-6)))) - 1):
                runs.append(run_passes(module, inputs, None, timed=True))
            for which, ops in ((0, cost.forward.ops), (1, cost.backward.ops)):
                # a run that took another path: its ops cannot be matched (no points if none)
                matching = [run[which] for run in runs if len(run[which]) == len(ops)]
                fastest = min(matching, key=lambda timed: sum(op[3] for op in timed), default=())
                for op, timed in zip(ops, fastest):
                    points[op.name].append((op.work_at(rows), timed[3]))
    # The recorder's own call (Python into the dispatcher) is in every time it takes: what
    # a typical op that does nothing (a view) took there, less a view called eagerly.
    views = [s for found in points.values() for work, s in found if work == 0]
    inside = statistics.median(views) - _fastest(torch.ones(2).t, 200) if views else 0.0
    return {name: op_curve([(w, max(s - inside, FLOOR)) for w, s in found])
            for name, found in points.items()}  # fmt: skip


def measure_rates(repeats: int, lanes: Sequence[Device] = ()) -> tuple[float, float]:
    """A float32 matmul's FLOP/s and an add's bytes/s on the lanes' device: the roofline for
    ops never timed (on a GPU large enough not to time the launch)."""
    on = lanes[0].torch_device if lanes else torch.device("cpu")
    side, floats = (512, 1 << 22) if on.type == "cpu" else (4096, 1 << 28)
    a, b = torch.ones(floats, device=on), torch.ones(floats, device=on)
    bandwidth = 3 * a.nbytes / _fastest(lambda: a.add(b), repeats, lanes)
    x = torch.randn(side, side, device=on)
    return 2 * side**3 / _fastest(lambda: x.mm(x), repeats, lanes), bandwidth


def measure_thread_start(lanes: Sequence[Device], repeats: int) -> float:
    """The median stagger of parallel_apply's threads' starts (the fastest of ``repeats``)."""
    inputs = [torch.ones(1, 8, device=lane.torch_device) for lane in lanes]
    staggers = []
    for _ in range(repeats):
        with dpkit.trace() as recorded:
            dpkit.parallel_apply([nn.Identity() for _ in lanes], inputs, devices=list(lanes))
        starts = sorted(e.start for e in recorded.events if e.phase == "apply")
        staggers.append(statistics.median(b - a for a, b in zip(starts, starts[1:])))
    return max(min(staggers), FLOOR)


def measure_module_overhead(lanes: Sequence[Device], repeats: int) -> float:
    """Seconds replicate takes per module per replica (the course's transformer)."""
    module = build_model("transformer", seed=0).to(lanes[0].torch_device)
    best = math.inf
    for _ in range(repeats):
        with dpkit.trace() as recorded:
            dpkit.replicate(module, list(lanes))
        built = next(e for e in recorded.events if e.details.get("what") == "modules")
        best = min(best, built.duration / (built.details["modules"] * len(lanes)))
    return max(best, FLOOR)


# what a measured step holds: the step's wall time, each call's, and loss.backward()'s
SEGMENTS = ("step", "scatter", "replicate", "apply", "gather", "backward_call")
# on one lane (no replicas, no threads): the step, the forward's call and the backward's
ONE_LANE_SEGMENTS = ("step", "forward_call", "backward_call")


class _Timed(dpkit.DataParallel):
    """DataParallel noting its four calls' wall times in ``self.took``, named as in SEGMENTS."""

    took: dict[str, float]

    def _timed(self, name: str, *args: Any, **kwargs: Any) -> Any:
        start = host_clock.now(self.device_ids)  # on GPU lanes: once their work is done
        result = getattr(dpkit.DataParallel, name)(self, *args, **kwargs)
        self.took[name.removeprefix("parallel_")] = host_clock.now(self.device_ids) - start
        return result

    scatter = functools.partialmethod(_timed, "scatter")
    replicate = functools.partialmethod(_timed, "replicate")
    parallel_apply = functools.partialmethod(_timed, "parallel_apply")
    gather = functools.partialmethod(_timed, "gather")


def measure_steps(
    modules: Sequence[tuple[nn.Module, torch.Tensor]], lanes: Sequence[Device],
    counts: Sequence[int], rows_per_lane: Sequence[int], repeats: int,
) -> list[Measured]:  # fmt: skip
    """Untraced DataParallel training steps of each module on ``counts`` lanes with
    ``rows_per_lane``, ``repeats`` in two rounds, each after one to warm up: the fastest wall
    time of the step, of ``loss.backward()``, and of the forward (one lane) or each of
    DataParallel's calls. Untraced, because a trace walks each replica's graph (a learner's
    loop does not), and its phases time the copies, not the Python around them (the MLP's
    scatter call of 32 rows on 2 lanes took 64 us, its traced copies 25 us)."""
    configs = []  # (module, sample, parallel, inputs, labels, times)
    for module, sample in modules:
        for n in counts:
            parallel = _Timed(module, device_ids=list(lanes[:n]))
            for rows in rows_per_lane:
                labels = torch.zeros(rows * n, dtype=torch.long, device=lanes[0].torch_device)
                inputs = rows_like(sample, rows * n)
                configs.append((module, sample, parallel, inputs, labels, defaultdict(list)))
    # two rounds through all steps: another tenant's burst of work lasts seconds, and a
    # step's fastest should come from more than one moment
    for measured in (repeats - repeats // 2, repeats // 2):
        for module, _, parallel, inputs, labels, times in configs:
            used = parallel.device_ids
            for attempt in range(measured + 1 if measured else 0):
                parallel.took = {}
                module.zero_grad(set_to_none=True)
                start = host_clock.now(used)
                output = parallel(inputs)
                forward = host_clock.now(used)
                loss = nn.functional.cross_entropy(output, labels)
                backward = host_clock.now(used)
                loss.backward()
                end = host_clock.now(used)
                if attempt:  # the first warms up
                    took = {"step": end - start, "backward_call": end - backward}
                    took |= parallel.took if len(used) > 1 else {"forward_call": forward - start}
                    for name, seconds in took.items():
                        times[name].append(seconds)
    return [(module, sample, len(labels), len(parallel.device_ids), {k: min(v) for k, v in
             times.items()}) for module, sample, parallel, _, labels, times in configs]  # fmt: skip


def predicted_segments(predicted: Any) -> dict[str, float]:
    """A predicted trace's times by what :func:`measure_steps` measures."""
    phases = {row["phase"]: row["time_s"] for row in predicted.summary()}
    phases["step"] = predicted.step_time
    for call, parts in (("forward_call", ("scatter", "replicate", "apply", "gather")),
                        ("backward_call", ("grad_scatter", "backward", "reduce"))):  # fmt: skip
        phases[call] = sum(phases.get(p, 0.0) for p in parts)
    return phases


def _relative_errors(hardware: Hardware, steps: Sequence[Measured]) -> np.ndarray:
    """Predicted over measured less one, for every measured time of every step."""
    errors = []
    for module, sample, batch, n, measured in steps:
        predicted = predicted_segments(predict(module, sample, batch, n, hardware))
        errors += [predicted.get(name, 0.0) / seconds - 1 for name, seconds in measured.items()]
    return np.array(errors)


def fit_host_terms(hardware: Hardware, steps: Sequence[Measured], rounds: int = 4) -> Hardware:
    """``hardware`` with the host terms :data:`FITTED` fitted to the measured ``steps`` (least
    squares of relative errors, Gauss-Newton with finite differences through ``predict``, so the
    fit follows its formulas), at least :data:`FLOOR`; a term no measured time depends on stays."""
    for _ in range(rounds):
        errors = _relative_errors(hardware, steps)
        columns = []
        for name in FITTED:
            delta = max(0.05 * getattr(hardware, name), 1e-6)
            bumped = dataclasses.replace(hardware, **{name: getattr(hardware, name) + delta})
            columns.append((_relative_errors(bumped, steps) - errors) / delta)
        jacobian = np.stack(columns, axis=1)
        used = np.abs(jacobian).sum(axis=0) > 0
        change = np.zeros(len(FITTED))
        change[used] = np.linalg.lstsq(jacobian[:, used], -errors, rcond=None)[0]
        hardware = dataclasses.replace(hardware, **{
            name: max(getattr(hardware, name) + step, FLOOR) for name, step in zip(FITTED, change)
        })  # fmt: skip
    return hardware


def calibrate(devices: int | Sequence[Device] | None = None, *,
              models: Sequence[nn.Module | str] = COURSE_MODELS,
              sample: torch.Tensor | None = None, quick: bool = False,
              progress: bool = True) -> Hardware:  # fmt: skip
    """Measure this machine's virtual CPU lanes (default: 4) into a Hardware.

    ``models``: course model names, or modules taking ``sample`` (default a 1x28x28 image),
    timed besides the probes; ``quick``: fewer probes, sizes and repeats. Calibrate with the
    torch threads the measurement will use (``OMP_NUM_THREADS=1`` for one per lane): the
    numbers hold for this machine as it is loaded now."""
    listed = isinstance(devices, Sequence)  # else a count (default 4) of virtual CPU lanes
    lanes = devices if listed else dpkit.virtual_devices(devices or 4, on="cpu")
    if len(lanes) < 2:
        raise ValueError("calibrate needs at least 2 devices to time copies between them")
    on = lanes[0].torch_device
    repeats, cores = (3, 2) if quick else (5, len(lanes))
    given = sample if sample is not None else sample_input()
    chosen = [(build_model(m, seed=0), sample_input()) if isinstance(m, str) else (m, given)
              for m in models]  # fmt: skip
    chosen = [(module.to(on), inputs.to(on)) for module, inputs in chosen]
    with _progress(progress) as advance:
        # On CPU lanes, up to chunks of the steps' sizes (a batch of 32-1024 images of 28x28
        # is 25 kB-1.6 MB a lane): out of the caches, chunks of 3-13 MB stream faster (11
        # GB/s on the course's VM) than the steps' chunks do (8 GB/s from 50 kB to 1.6 MB).
        # On a GPU a copy of 16 MB takes microseconds, as long as a launch: up to 1 GB there.
        largest = 1 << 22 if on.type == "cpu" else 1 << 30
        sizes = (1 << 12, largest) if quick else (1 << 12, 1 << 18, largest >> 2, largest)
        link = measure_link(lanes, 2 * repeats, sizes)
        advance("copies")
        # the most of three moments: another tenant's process takes a core and reads as fewer
        units = [measure_cores(cores, 4 * repeats)]
        advance("cores")
        rows = (2, 32, 256) if quick else (1, 8, 64, 256, 1024)
        ops = measure_ops(probes(quick) + chosen, rows, repeats)
        flops, bandwidth = measure_rates(repeats, lanes)
        advance("ops")
        units.append(measure_cores(cores, 4 * repeats))
        thread_start = measure_thread_start(lanes, 4 * repeats)
        module_overhead = measure_module_overhead(lanes, repeats)
        advance("primitives")
        units.append(measure_cores(cores, 4 * repeats))
        default = this_machine_default()
        hardware = dataclasses.replace(
            default, peak_flops={"float32": flops}, matmul_efficiency=1.0,
            memory_bandwidth=bandwidth, memory_efficiency=1.0, compute_units=max(units),
            host_to_device=link, device_to_device=link, node_to_node=link,
            devices_per_node=max(default.devices_per_node, len(lanes)), op_seconds=ops,
            thread_start=thread_start, module_overhead=module_overhead,
            description=f"virtual CPU lanes of this machine ({platform.node() or 'here'}), "
            f"calibrated, {torch.get_num_threads()} torch thread(s)",
            source=f"calibrate() on {platform.platform()}, torch {torch.__version__}, "
            f"{time.strftime('%Y-%m-%d %H:%M')}" + (" (quick)" if quick else ""),
        )  # fmt: skip
        steps = measure_steps(chosen, lanes, sorted({1, 2, len(lanes)}), (1, 16), 2 * repeats)
        hardware = fit_host_terms(hardware, steps)
        advance("steps")
    return hardware
