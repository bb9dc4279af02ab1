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

import dataclasses
import os
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch
from matplotlib.figure import Figure
from torch import nn

import dpkit
from dpkit import host_clock, verdict
from dpkit.tracing import Phase
from dpkit.viz.common import (
    FIGURE_DPI,
    FIGURE_WIDTH,
    cores,
    demo_model,
    hardware_of,
    intra_op_threads,
    notebook_timeline,
    one_device_marker,
)
from dpkit.viz.explorer import Explorer, int_slider
from dpkit.viz.figures import OTHER_COLOR

# --------------------------------------------------------------------------------------
# The timeline explorer: devices x batch -> traced forward -> timeline


def apply_trace(
    devices: int = 4, batch: int = 256, steps: int = 2, threads: int | None = 1
) -> dpkit.Trace:
    """Trace ``steps`` DataParallel forwards of :func:`demo_model` on ``dpkit.devices(devices)``.

    The last step is the one to look at; the first warms up the worker threads. On one device
    the module's own forward is recorded as its ``apply`` (DataParallel records it so).
    """
    lanes = dpkit.devices(devices)
    model = dpkit.to_device(demo_model(), lanes[0])
    parallel = dpkit.DataParallel(model, device_ids=lanes)
    inputs = dpkit.to_device(torch.randn(batch, 256), lanes[0])
    with intra_op_threads(threads), dpkit.trace() as recorded:
        for _ in range(steps):
            parallel(inputs)
    return recorded


def first_and_last_apply(recorded: dpkit.Trace) -> str:
    """What the last step of ``recorded`` shows of its first and last replicas' apply bars:
    whether the first ended before the last began, and by how much (one trace, no verdict)."""
    drawn = max(e.step for e in recorded.events)
    applies = sorted(
        (e for e in recorded.events if e.step == drawn and e.phase == Phase.APPLY),
        key=lambda e: e.start,
    )
    first, last = applies[0], applies[-1]
    apart = (last.start - first.end) * 1e3
    began = f"the last replica began {(last.start - first.start) * 1e3:.2f} ms after the first"
    if apart > 0:
        return f"In this trace {began}, {apart:.2f} ms after the first had ended: no overlap."
    return f"In this trace {began}, while the first still ran: their bars share {-apart:.2f} ms."


def apply_timeline(recorded: dpkit.Trace) -> Figure:
    """The timeline of the last step, notebook-sized."""
    return notebook_timeline(recorded)


def timeline_explorer(devices: int = 4, batch: int = 256, max_devices: int = 8) -> Explorer:
    """Sliders "devices" and "batch" over a live timeline of one DataParallel forward."""
    return Explorer(
        [int_slider("devices", devices, 1, max_devices), int_slider("batch", batch, 8, 2048, 8)],
        compute=apply_trace,
        draw=apply_timeline,
        marker=one_device_marker,
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


# What each outcome of "parallel_apply against the same replicas one after another" means.
OVERLAP_WORDING = {
    verdict.Outcome.FASTER: "the replicas overlapped",
    verdict.Outcome.SLOWER: "threads made it slower than one after another",
    verdict.Outcome.WITHIN_NOISE: "no difference beyond the run-to-run noise",
    verdict.Outcome.TOO_NOISY: "the rounds disagree; another program took cores during some",
}


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
    # Every round's times (ms), one after another and parallel_apply, measured back to back.
    serial_rounds_ms: tuple[float, ...] = ()
    parallel_rounds_ms: tuple[float, ...] = ()
    # Rounds in which the first replica's apply ended before the last one's began.
    first_done_before_last_began: int = 0
    load: verdict.Load | None = None  # what other programs used while the rounds ran
    # Every round's start gap and sum of apply bars (ms), as start_gap_ms and busy_ms's rounds.
    gap_rounds_ms: tuple[float, ...] = ()
    busy_rounds_ms: tuple[float, ...] = ()
    cores: int = 0  # the CPU cores the rounds could use (0: not known)

    @property
    def forward_ms(self) -> float:
        """One replica's forward on its chunk, alone in one thread (the serial run's share)."""
        return self.serial_ms / self.devices

    @property
    def speedup(self) -> float:
        """Serial time over parallel time, the median round's: how many replicas' worth of
        work ran at once."""
        if not self.serial_rounds_ms:
            return self.serial_ms / self.parallel_ms
        ratios = [a / b for a, b in zip(self.serial_rounds_ms, self.parallel_rounds_ms)]
        return verdict.middle_half(ratios)[1]

    def conclusion(self) -> verdict.Verdict:
        """The speed-up with its spread over the rounds, and only the conclusion it allows."""
        low, high = self.speedup_quartiles
        return verdict.conclude_from_quartiles(self.speedup, low, high, OVERLAP_WORDING)

    @property
    def ceiling(self) -> int:
        """The largest speed-up overlap can give: one replica per core at most."""
        return min(self.devices, self.cores) if self.cores else self.devices

    @property
    def disturbed(self) -> bool:
        """Whether a quarter of the rounds or more sped up beyond :attr:`ceiling`: then the
        one-after-another run was slowed by something the parallel one escaped (another
        program, or torch's own threads waiting for a busy core), and the speed-up says
        nothing about overlap."""
        return self.speedup_quartiles[1] > self.ceiling

    @property
    def overlapped(self) -> bool:
        """Whether the replicas clearly overlapped: a speed-up above 1 in three rounds of four
        (the lower quartile above 1), not a median that noise pushed past 1, nor rounds
        beyond what the cores can give."""
        return self.conclusion().outcome is verdict.Outcome.FASTER and not self.disturbed

    @property
    def slowed_down(self) -> bool:
        """Whether threads clearly made it slower: the upper quartile below 1."""
        return self.conclusion().outcome is verdict.Outcome.SLOWER

    def verdict(self) -> str:
        """:meth:`conclusion` as the sentence: numbers, outcome, and what it means; no
        outcome where the rounds are :attr:`disturbed`."""
        if self.disturbed:
            return f"{self.speedup_spread()}: {self.no_verdict()}"
        return str(self.conclusion())

    def speedup_spread(self) -> str:
        low, high = self.speedup_quartiles
        return f"{self.speedup:.2f}x (middle half of the rounds: {low:.2f}-{high:.2f}x)"

    def no_verdict(self) -> str:
        return (
            f"no verdict: a quarter of the rounds or more sped up beyond the {self.ceiling}x "
            f"that {self.devices} replicas on {self.cores} cores can give, so the "
            "one-after-another run was slowed by something the parallel one escaped"
        )

    @property
    def busy_over_span(self) -> float:
        """Sum of per-device apply time over the wall span: counts waiting as busy."""
        return self.busy_ms / self.parallel_ms


Setup = tuple[nn.Module, torch.Tensor, "int | None"]  # model, whole input, intra-op threads


def measure_apply_rounds(
    setups: list[Setup], devices: int = 4, repeats: int = 5
) -> list[ApplyOverlap]:
    """Each setup's replicas run in parallel and one after another, ``repeats`` rounds, the
    setups interleaved: in every round each setup runs once each way, back to back, so all
    of them see the same moments of the machine (and comparisons between them are fair)."""
    lanes = dpkit.devices(devices)
    prepared = []
    for model, inputs, _ in setups:
        model, inputs = dpkit.to_device((model, inputs), lanes[0])
        chunks = dpkit.scatter(inputs, lanes)
        used = lanes[: len(chunks)]
        prepared.append((dpkit.replicate(model, used, detach=True), chunks, used))
    measured: list[dict[str, list[float]]] = [
        {"serial": [], "parallel": [], "busy": [], "gap": [], "apart": []} for _ in setups
    ]
    with verdict.machine_load() as load, torch.no_grad():
        for _ in range(repeats + 1):  # the first round warms up
            for (_, _, threads), (replicas, chunks, used), rounds in zip(
                setups, prepared, measured
            ):
                with intra_op_threads(threads):
                    _one_round(replicas, chunks, used, rounds)
    results = []
    for (model, inputs, threads), (_, _, used), rounds in zip(setups, prepared, measured):
        serial, parallel = rounds["serial"][1:], rounds["parallel"][1:]
        low, _, high = verdict.middle_half([a / b for a, b in zip(serial, parallel)])
        results.append(
            ApplyOverlap(
                type(model).__name__,
                len(used),
                hardware_of(used),
                statistics.median(serial),
                statistics.median(parallel),
                statistics.median(rounds["busy"][1:]),
                (low, high),
                statistics.median(rounds["gap"][1:]),
                threads,
                len(inputs),
                tuple(serial),
                tuple(parallel),
                int(sum(rounds["apart"][1:])),
                load,
                tuple(rounds["gap"][1:]),
                tuple(rounds["busy"][1:]),
                cores(),
            )
        )
    return results


def _one_round(
    replicas: list[nn.Module],
    chunks: tuple[torch.Tensor, ...],
    lanes: list[dpkit.Device],
    rounds: dict[str, list[float]],
) -> None:
    """parallel_apply, traced, then the same replicas one after another; times in ms."""
    with dpkit.trace() as recorded:
        dpkit.parallel_apply(replicas, chunks, devices=lanes)
    applies = sorted((e for e in recorded.events if e.phase == Phase.APPLY), key=lambda e: e.start)
    starts = [e.start for e in applies]
    rounds["parallel"].append((max(e.end for e in applies) - starts[0]) * 1e3)
    rounds["busy"].append(sum(e.duration for e in applies) * 1e3)
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    rounds["gap"].append(statistics.median(gaps) * 1e3 if gaps else 0.0)
    rounds["apart"].append(float(applies[0].end < applies[-1].start))
    start = host_clock.now(lanes)  # on a GPU: once its queued work is done, not at launch
    for replica, chunk, lane in zip(replicas, chunks, lanes):
        dpkit.parallel_apply([replica], [chunk], devices=[lane])  # runs in this thread
    rounds["serial"].append((host_clock.now(lanes) - start) * 1e3)


def measure_apply_overlap(
    model: nn.Module,
    inputs: torch.Tensor,
    devices: int = 4,
    repeats: int = 5,
    threads: int | None = 1,
) -> ApplyOverlap:
    """Run ``model``'s replicas in parallel and one after another; medians of ``repeats``
    rounds (at least 4, for the quartiles of the noise)."""
    return measure_apply_rounds([(model, inputs, threads)], devices, repeats)[0]


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
        """One line per run: batch, threads, a replica's forward, the start gap, the speed-up
        over the same replicas one after another, and what its rounds allow one to say."""
        lines = [
            f"{'batch':>6} {'intra-op threads':>17} {'one forward':>12} {'starts apart':>13}"
            "   speed-up of parallel_apply over one after another"
        ]
        for run in self.runs:
            threads = "1 per lane" if run.threads == 1 else f"{torch.get_num_threads()} (default)"
            forward, gap = f"{run.forward_ms:.2f} ms", f"{run.start_gap_ms:.2f} ms"
            outcome: Any = dataclasses.replace(run.conclusion(), phrase="")
            if run.disturbed:
                outcome = f"{run.speedup_spread()}: no verdict (see below)"
            lines.append(f"{run.batch:>6} {threads:>17} {forward:>12} {gap:>13}   {outcome}")
        lines.extend(beyond_the_cores(self.runs, self.cores))
        return "\n".join(lines)

    def default_threads_conclusion(self) -> verdict.Verdict:
        """parallel_apply at the largest batch with torch's default intra-op threads (B)
        against one thread per lane (A), round by round (the rounds were interleaved)."""
        one_per_lane, default = self.runs[-2], self.runs[-1]
        rounds = verdict.Rounds.of(one_per_lane.parallel_rounds_ms, default.parallel_rounds_ms)
        return verdict.conclude(rounds, DEFAULT_THREADS_WORDING)


# parallel_apply with torch's default intra-op threads (B) against one per lane (A).
DEFAULT_THREADS_WORDING = {
    verdict.Outcome.FASTER: "torch's default threads were faster here: the lanes' ops found "
    "cores free",
    verdict.Outcome.SLOWER: "every lane's ops ask for every core, and the lanes wait for "
    "each other's threads",
    verdict.Outcome.WITHIN_NOISE: "no difference beyond the run-to-run noise: the lanes already "
    "kept the cores busy",
    verdict.Outcome.TOO_NOISY: "the rounds disagree; another program took cores during some",
}


def beyond_the_cores(runs: list[ApplyOverlap], cores: int) -> list[str]:
    """A note for each run whose rounds sped up beyond what its cores allow in a quarter of
    the rounds or more (:attr:`ApplyOverlap.disturbed`): the excess cannot come from
    replicas computing at once, so the run says nothing about overlap."""
    notes = []
    for run in runs:
        if run.disturbed:
            notes.append(
                f"Batch {run.batch}, {run.threads or 'default'} intra-op thread(s): speed-ups "
                f"up to {run.speedup_quartiles[1]:.2f}x (the upper quartile) are more than "
                f"{run.devices} replicas on {cores} cores can give ({run.ceiling}x). The excess "
                "is not overlap: the one-after-another run was slowed by something the parallel "
                "one escaped (another program, or torch's own threads waiting for a busy core), "
                "so this row says nothing about overlap."
            )
    return notes


def start_suspects(
    devices: int = 4, batches: tuple[int, ...] = (256, 2048), repeats: int = 5
) -> StartSuspects:
    """Measure each suspect of :class:`StartSuspects` on the demo MLP (256 -> 512 -> 512 -> 10),
    every setup in the same interleaved rounds (:func:`measure_apply_rounds`)."""
    setups: list[Setup] = []
    for threads in (1, None):
        for batch in batches if threads == 1 else batches[-1:]:
            torch.manual_seed(0)
            setups.append((demo_model(), torch.randn(batch, 256), threads))
    setups.append((nn.Identity(), torch.randn(batches[0], 256), 1))
    *runs, empty = measure_apply_rounds(setups, devices, repeats)
    python_ms = one_row_forward_ms(demo_model(), 256)
    try:
        load: float | None = os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows; a system that does not report it
        load = None
    return StartSuspects(thread_start_ms(), python_ms, cores(), runs, empty, load)


# A replica's start gap (B) against that of replicas that compute nothing (A), round by round.
GAP_WORDING = {
    verdict.Outcome.FASTER: "replicas already running keep the caller waiting for a core, or "
    "for the GIL between their kernels",
    verdict.Outcome.SLOWER: "the replicas that compute nothing started the farther apart this "
    "time, which Python alone does not explain: rerun on a quieter machine",
    verdict.Outcome.WITHIN_NOISE: "Python under the GIL paces the starts",
    verdict.Outcome.TOO_NOISY: "the rounds disagree; another program took cores during some",
}
# A gap is a size, not a time to beat: its ratio above 1 reads "further apart".
GAP_LABELS = {verdict.Outcome.FASTER: "further apart", verdict.Outcome.SLOWER: "closer together"}


def start_gaps_compared(run: ApplyOverlap, empty: ApplyOverlap) -> verdict.Verdict:
    """``run``'s start gap over the gap of replicas that compute nothing (``empty``), round
    by round (both measured in the same interleaved rounds): above 1 in three rounds of four,
    the replicas' own work spaces their starts, not the Python that starts them."""
    rounds = verdict.Rounds.of(run.gap_rounds_ms, empty.gap_rounds_ms)
    return verdict.conclude(rounds, GAP_WORDING, labels=GAP_LABELS)


def gil_comparison(devices: int = 4, repeats: int = 5) -> list[ApplyOverlap]:
    """The Python-loop forward and the matmul forward, measured the same way, in the same
    interleaved rounds."""
    torch.manual_seed(0)
    setups: list[Setup] = [
        (PythonLoopNet(), torch.randn(64, 16), 1),
        (MatmulNet(), torch.randn(1024, 512), 1),
    ]
    return measure_apply_rounds(setups, devices, repeats)


# How much more threads sped up the matmul forward (B's speed-up over A's, round by round).
FORWARD_DECIDES_WORDING = {
    verdict.Outcome.FASTER: "threads sped up the matmuls more than the loop: with the same "
    "threads and devices, the forward decides",
    verdict.Outcome.SLOWER: "threads sped up the loop more than the matmuls this time: the "
    "cores, not the GIL, set the pace (see below why this varies)",
    verdict.Outcome.WITHIN_NOISE: "threads sped up both alike this time: the cores, not the GIL, "
    "set the pace (see below why this varies)",
    verdict.Outcome.TOO_NOISY: "the rounds disagree; another program took cores during some",
}


def forward_decides(loop: ApplyOverlap, matmul: ApplyOverlap) -> verdict.Verdict:
    """The matmul forward's speed-up over the loop's, round by round (the same rounds)."""
    speedups = [
        [a / b for a, b in zip(run.serial_rounds_ms, run.parallel_rounds_ms)]
        for run in (loop, matmul)
    ]
    # as "times": the ratio A/B is the matmul's speed-up over the loop's
    rounds = verdict.Rounds.of(speedups[1], speedups[0])
    return verdict.conclude(rounds, FORWARD_DECIDES_WORDING)


def timeline_trap(result: ApplyOverlap) -> str:
    """Section 3's trap where this measurement shows it: ``result``'s apply bars add up to
    more than 1.5 times its speed-up (and than 1), threads that overlap on the timeline while
    they wait for the GIL. Where they do not, it says so, with how busy other programs kept
    the machine meanwhile (replicas waiting for a core spread their bars out)."""
    overlap = result.busy_over_span
    if overlap > 1.5 * max(result.speedup, 1):
        return (
            f"{result.model}'s bars overlap {overlap:.1f}-fold, yet its speed-up was "
            f"{result.verdict()}\nA bar that spans the phase may be a thread waiting for the "
            "GIL. Compare with a serial run, as above, before believing a timeline."
        )
    load = f" (meanwhile {result.load})" if result.load is not None else ""
    return (
        f"{result.model}'s bars overlap only {overlap:.1f}-fold this time, about what its "
        f"speed-up of {result.speedup:.2f}x accounts for: the trap did not show{load}. Rerun "
        "on a quieter machine to see it."
    )


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
