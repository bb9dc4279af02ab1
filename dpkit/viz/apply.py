"""parallel_apply, seen: a live timeline over devices and batch, and the GIL measured.

The surprise first: one Python thread per replica does not mean the replicas compute at
the same time. A thread holds the GIL while it runs Python code and lets go only inside
torch's kernels, so a forward made of many tiny ops runs one replica at a time, however
many devices there are, while a forward of a few big matmuls overlaps. Wall-clock spans
cannot tell the two apart (a thread waiting for the GIL still looks "busy in apply"), so
:func:`measure_apply_overlap` compares the parallel run with the same replicas run one
after another.

Three layers, as in every explorer of :mod:`dpkit.viz`:

- data: :func:`apply_trace` runs real traced DataParallel forwards and returns the Trace;
- figure: :func:`apply_timeline` draws it with :func:`dpkit.viz.figures.timeline`;
- widget: :func:`timeline_explorer` redraws on every slider change.

:class:`Explorer` (the widget layer shared by the apply, memory and training explorers)
keeps the last data, figure and PNG, so tests can move a slider and check both changed.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from dataclasses import dataclass

import torch
from matplotlib.figure import Figure
from torch import nn

import dpkit
from dpkit.tracing import Phase
from dpkit.viz.common import (
    FIGURE_DPI,
    FIGURE_WIDTH,
    cores,
    demo_model,
    hardware_of,
    intra_op_threads,
    notebook_timeline,
)
from dpkit.viz.explorer import Explorer, int_slider
from dpkit.viz.figures import OTHER_COLOR

# --------------------------------------------------------------------------------------
# The timeline explorer: devices x batch -> traced forward -> timeline


def apply_trace(
    devices: int = 4, batch: int = 256, steps: int = 2, threads: int | None = 1
) -> dpkit.Trace:
    """Trace ``steps`` DataParallel forwards of :func:`demo_model` on ``dpkit.devices(devices)``.

    The last step is the one to look at; the first warms up the worker threads.
    """
    lanes = dpkit.devices(devices)
    model = dpkit.to_device(demo_model(), lanes[0])
    parallel = dpkit.DataParallel(model, device_ids=lanes)
    inputs = dpkit.to_device(torch.randn(batch, 256), lanes[0])
    with intra_op_threads(threads), dpkit.trace() as recorded:
        for _ in range(steps):
            parallel(inputs)
    return recorded


def apply_timeline(recorded: dpkit.Trace) -> Figure:
    """The timeline of the last step, notebook-sized."""
    return notebook_timeline(recorded)


def timeline_explorer(devices: int = 4, batch: int = 256, max_devices: int = 8) -> Explorer:
    """Sliders "devices" and "batch" over a live timeline of one DataParallel forward."""
    return Explorer(
        [int_slider("devices", devices, 1, max_devices), int_slider("batch", batch, 8, 2048, 8)],
        compute=apply_trace,
        draw=apply_timeline,
    )


# --------------------------------------------------------------------------------------
# The GIL: a Python-loop forward vs a tensor-op forward


class PythonLoopNet(nn.Module):
    """A forward of many tiny ops in a Python loop: Python, under the GIL, sets its pace."""

    def __init__(self, width: int = 16, steps: int = 300) -> None:
        super().__init__()
        self.shift = nn.Parameter(torch.zeros(width))
        self.steps = steps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.steps):
            x = torch.tanh(x + self.shift)
        return x


class MatmulNet(nn.Module):
    """A forward of a few big matrix multiplications: torch lets go of the GIL inside each."""

    def __init__(self, width: int = 512, layers: int = 4) -> None:
        super().__init__()
        self.layers = nn.Sequential(*(nn.Linear(width, width) for _ in range(layers)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.layers(x))


@dataclass
class ApplyOverlap:
    """How much of ``devices`` replicas' apply work really ran at the same time."""

    model: str
    devices: int
    hardware: str
    serial_ms: float  # the same replicas on the same chunks, one after another, one thread
    parallel_ms: float  # wall span of parallel_apply (first start to last end)
    busy_ms: float  # sum over devices of each replica's apply duration in the parallel run
    # The speed-up of each round (serial over parallel, measured back to back), its 25th and
    # 75th percentiles: how much it moves from run to run on this machine.
    speedup_quartiles: tuple[float, float] = (0.0, 0.0)
    # In the parallel run: time from one replica's apply start to the next one's (median).
    start_gap_ms: float = 0.0
    threads: int | None = 1  # torch's intra-op threads per lane (None: torch's default)
    batch: int = 0  # rows of the whole input, before the scatter

    @property
    def forward_ms(self) -> float:
        """One replica's forward on its chunk, alone in one thread (the serial run's share)."""
        return self.serial_ms / self.devices

    @property
    def speedup(self) -> float:
        """Serial time over parallel time: how many replicas' worth of work ran at once."""
        return self.serial_ms / self.parallel_ms

    @property
    def overlapped(self) -> bool:
        """Whether the replicas clearly overlapped: a speed-up above 1 in three rounds of four
        (the lower quartile above 1), not a median that noise pushed past 1."""
        return self.speedup_quartiles[0] > 1.0

    @property
    def slowed_down(self) -> bool:
        """Whether threads clearly made it slower: the upper quartile below 1."""
        return self.speedup_quartiles[1] < 1.0

    def verdict(self) -> str:
        """The speed-up with its spread over rounds, and only the conclusion the spread allows."""
        low, high = self.speedup_quartiles
        measured = f"{self.speedup:.2f}x (middle half of the rounds: {low:.2f}-{high:.2f}x)"
        if self.overlapped:
            return f"{measured}: the replicas overlapped"
        if self.slowed_down:
            return f"{measured}: threads made it slower than one after another"
        return f"{measured}: no difference beyond the run-to-run noise"

    @property
    def busy_over_span(self) -> float:
        """Sum of per-device apply time over the wall span: counts waiting as busy."""
        return self.busy_ms / self.parallel_ms


def measure_apply_overlap(
    model: nn.Module,
    inputs: torch.Tensor,
    devices: int = 4,
    repeats: int = 5,
    threads: int | None = 1,
) -> ApplyOverlap:
    """Run ``model``'s replicas in parallel and one after another; medians of ``repeats``."""
    lanes = dpkit.devices(devices)
    model, inputs = dpkit.to_device((model, inputs), lanes[0])
    chunks = dpkit.scatter(inputs, lanes)
    lanes = lanes[: len(chunks)]
    replicas = dpkit.replicate(model, lanes, detach=True)
    serial, parallel, busy, gaps = [], [], [], []
    with intra_op_threads(threads), torch.no_grad():
        for _ in range(repeats + 1):  # the first round warms up
            with dpkit.trace() as recorded:
                dpkit.parallel_apply(replicas, chunks, devices=lanes)
            applies = sorted(
                (e for e in recorded.events if e.phase == Phase.APPLY), key=lambda e: e.start
            )
            parallel.append(max(e.end for e in applies) - applies[0].start)
            busy.append(sum(e.duration for e in applies))
            starts = [e.start for e in applies]
            gaps.append(
                statistics.median(b - a for a, b in zip(starts, starts[1:])) if starts[1:] else 0.0
            )
            start = time.perf_counter()
            for replica, chunk, lane in zip(replicas, chunks, lanes):
                dpkit.parallel_apply([replica], [chunk], devices=[lane])  # runs in this thread
            serial.append(time.perf_counter() - start)
    rounds = sorted(s / p for s, p in zip(serial[1:], parallel[1:]))
    low, _, high = statistics.quantiles(rounds, n=4) if len(rounds) > 1 else rounds * 3
    return ApplyOverlap(
        type(model).__name__,
        len(lanes),
        hardware_of(lanes),
        statistics.median(serial[1:]) * 1e3,
        statistics.median(parallel[1:]) * 1e3,
        statistics.median(busy[1:]) * 1e3,
        (low, high),
        statistics.median(gaps[1:]) * 1e3,
        threads,
        len(inputs),
    )


# --------------------------------------------------------------------------------------
# What spaces the replicas' starts: the suspects, measured


def thread_start_ms(repeats: int = 200) -> float:
    """Median time to start a Python thread that does nothing and wait for it to end, in ms."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        thread = threading.Thread(target=lambda: None)
        thread.start()
        thread.join()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def one_row_forward_ms(model: nn.Module, features: int, repeats: int = 50) -> float:
    """Median time of ``model``'s forward on one row in this thread, in ms: the Python and the
    op dispatch of a forward with next to no arithmetic, the part that holds the GIL."""
    row = torch.randn(1, features)
    times = []
    with intra_op_threads(1), torch.no_grad():
        for _ in range(repeats + 1):
            start = time.perf_counter()
            model(row)
            times.append(time.perf_counter() - start)
    return statistics.median(times[1:]) * 1e3


@dataclass
class StartSuspects:
    """What could make parallel_apply's replicas run one after another, each measured.

    ``runs``: the demo MLP's replicas, serial against parallel (:class:`ApplyOverlap`), at
    each batch with one intra-op thread per lane, then at the largest batch with torch's
    default threads (every op of every lane spread over all cores). ``empty``: the same
    measurement for replicas that compute nothing.
    """

    thread_start_ms: float  # a bare Python thread, started and joined
    python_ms: float  # the demo MLP's forward on one row: Python and dispatch, under the GIL
    cores: int
    runs: list[ApplyOverlap]
    # parallel_apply of replicas that compute nothing (nn.Identity): its start gap is the
    # Python each start costs (the caller's and the worker's), with no arithmetic at all.
    empty: ApplyOverlap | None = None
    # Processes running or waiting for a core, averaged over the last minute, at the end
    # (None where the system does not say): above ``cores``, lanes also wait for other programs.
    load_average: float | None = None

    def table(self) -> str:
        """One line per run: batch, threads, a replica's forward, the start gap, the speed-up."""
        lines = [
            f"{'batch':>6} {'intra-op threads':>17} {'one forward':>12} {'starts apart':>13}"
            "   speed-up (middle half of the rounds)"
        ]
        for run in self.runs:
            low, high = run.speedup_quartiles
            threads = "1 per lane" if run.threads == 1 else f"{torch.get_num_threads()} (default)"
            forward, gap = f"{run.forward_ms:.2f} ms", f"{run.start_gap_ms:.2f} ms"
            lines.append(
                f"{run.batch:>6} {threads:>17} {forward:>12} {gap:>13}"
                f"   {run.speedup:.2f}x ({low:.2f}-{high:.2f}x)"
            )
        return "\n".join(lines)


def start_suspects(
    devices: int = 4, batches: tuple[int, ...] = (256, 2048), repeats: int = 5
) -> StartSuspects:
    """Measure each suspect of :class:`StartSuspects` on the demo MLP (256 -> 512 -> 512 -> 10)."""
    runs = []
    for threads in (1, None):
        for batch in batches if threads == 1 else batches[-1:]:
            torch.manual_seed(0)
            inputs = torch.randn(batch, 256)
            runs.append(measure_apply_overlap(demo_model(), inputs, devices, repeats, threads))
    empty = measure_apply_overlap(nn.Identity(), torch.randn(batches[0], 256), devices, repeats)
    python_ms = one_row_forward_ms(demo_model(), 256)
    try:
        load: float | None = os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows; a system that does not report it
        load = None
    return StartSuspects(thread_start_ms(), python_ms, cores(), runs, empty, load)


def gil_comparison(devices: int = 4, repeats: int = 5) -> list[ApplyOverlap]:
    """The Python-loop forward and the matmul forward, measured the same way."""
    torch.manual_seed(0)
    return [
        measure_apply_overlap(PythonLoopNet(), torch.randn(64, 16), devices, repeats),
        measure_apply_overlap(MatmulNet(), torch.randn(1024, 512), devices, repeats),
    ]


def overlap_figure(results: list[ApplyOverlap]) -> Figure:
    """Per model: the replicas one after another vs in parallel threads, in ms."""
    figure = Figure(figsize=(FIGURE_WIDTH, 2.9), dpi=FIGURE_DPI, layout="constrained")
    axes = figure.add_subplot()
    rows = range(len(results))
    height = 0.38
    serial = axes.barh(
        [r - height / 2 for r in rows],
        [r.serial_ms for r in results],
        height,
        label="one after another (one thread)",
        color=OTHER_COLOR,
    )
    parallel = axes.barh(
        [r + height / 2 for r in rows],
        [r.parallel_ms for r in results],
        height,
        label="parallel_apply (a thread per replica)",
        color=Phase.APPLY.colour,
    )
    axes.bar_label(serial, fmt="%.1f ms", fontsize=8, padding=2)
    axes.bar_label(
        parallel,
        labels=[f"{r.parallel_ms:.1f} ms  (speed-up {r.speedup:.2f}x)" for r in results],
        fontsize=8,
        padding=2,
    )
    axes.set_yticks(list(rows), [r.model for r in results])
    axes.set_ylim(len(results) - 0.4, -0.6)
    axes.margins(x=0.45)
    axes.set_xlabel(f"time to apply {results[0].devices} replicas (ms, median)")
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2, fontsize=8, frameon=False)
    axes.set_title(f"Does parallel_apply overlap? — {results[0].hardware}", fontsize=10)
    return figure
