"""Notebook 07's figures and explorers: DataParallel beside DDP, and a model split's bubble.

The surprise first: starting DDP's processes costs seconds (the first time a fork server
imports torch for them; later a second or so each time), the training steps milliseconds.
So :func:`ddp_explorer` starts processes only when the process count changes to one not
seen yet, and then runs every bucket size at once with the same processes
(:func:`dpkit.ddp.compare_with_data_parallel` with ``sweep_caps_mb``); moving the step or
bucket sliders only redraws what was recorded. The
pipeline explorer runs in the notebook's own process (a thread per stage) and measures
live; with more stages than cores it shows a prediction instead, and says so.

What a measurement concluded is stated by :mod:`dpkit.verdict`, never by a figure's title:
:func:`ddp_against_data_parallel` (the step times, block by block) and
:func:`bubble_against_micro_batches` (idle shares, in interleaved rounds).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from dpkit import verdict
from dpkit.pipeline.bubble import bubble_formula, measure_steps
from dpkit.pipeline.schedule import Pipeline
from dpkit.tracing import Trace
from dpkit.viz.common import FIGURE_DPI, FIGURE_WIDTH, ONE_DEVICE, cores, one_device_note
from dpkit.viz.figures import (
    CATEGORY_COLORS,
    MAIN_BAND,
    MEASURED_COLOR,
    _legend_outside,
    _phase_order,
    add_bars,
    device_order,
    draw_timeline,
    hardware_title,
    human_bytes,
    phase_color,
)

ENGINE_COLORS = {"DataParallel": "#0072b2", "DDP": "#e69f00"}  # Okabe-Ito blue and orange
# The bubble figure's predicted stage counts, after the measured one (MEASURED_COLOR): Okabe-Ito
# vermillion, bluish green and reddish purple (matplotlib's default cycle is not CVD-safe).
STAGE_COLORS = ("#d55e00", "#009e73", "#cc79a7")
# A DDP rank waiting for its last all-reduce: hatched, unfilled (no phase's colour: no work).
WAITING = {"facecolor": "white", "edgecolor": "0.35", "hatch": "xxxx", "linewidth": 0.3}


def _figure(height: float, rows: int = 1, columns: int = 1, **options: Any) -> tuple[Figure, Any]:
    figure = Figure(figsize=(FIGURE_WIDTH, height), dpi=FIGURE_DPI, layout="constrained")
    return figure, figure.subplots(rows, columns, squeeze=False, **options)


def _step_events(trace: Trace, step: int | None) -> tuple[int, list[Any]]:
    events = trace.events
    steps = sorted({e.step for e in events})
    chosen = steps[-1] if step is None else step
    if chosen not in steps:
        raise ValueError(f"step={step} is not in the trace; it has steps {steps}")
    return chosen, [e for e in events if e.step == chosen]


def timelines_on_one_clock(traces: Sequence[tuple[str, Trace]], step: int | None = None) -> Figure:
    """One timeline per ``(name, trace)`` (default: each one's last step), stacked, on one
    time axis: the longer step draws longer."""
    chosen = [(name, trace, *_step_events(trace, step)) for name, trace in traces]
    lengths = [(max(e.end for e in ev) - min(e.start for e in ev)) * 1e3 for *_, ev in chosen]
    rows = sum(len({e.device for e in ev}) for *_, ev in chosen)
    phases = _phase_order(e.phase for *_, ev in chosen for e in ev)
    waits = any(e.details.get("waiting_s", 0) > 0 for *_, ev in chosen for e in ev)
    columns = 5
    legend_rows = -(-(len(phases) + waits) // columns)
    # One legend for all, below the stack: beside it, the timelines' long x labels ran into it.
    height = 1.2 + 0.42 * rows + 0.7 * len(chosen) + 0.1 + 0.2 * legend_rows
    figure, axes = _figure(height, len(chosen), 1)
    for (name, trace, number, events), ax in zip(chosen, axes[:, 0]):
        # No legend of its own (it would run into the next one's title): one for all, below.
        took = draw_timeline(ax, events, span_ms=max(lengths), legend=False)
        draw_waiting(ax, events)
        ax.xaxis.label.set_fontsize(8)  # a whole-width legend below leaves it no room beside
        title = hardware_title(trace, f"{name}, step {number}: {took:.1f} ms")
        if one_device_note(events) and any(e.phase == "scatter" for e in events):
            # DataParallel on one device: the module's own call is none of its phases
            title += f"\n{ONE_DEVICE}"
        ax.set_title(title, fontsize=9, pad=12)
    handles = [Patch(color=phase_color(p), label=p) for p in phases]
    if waits:
        handles.append(Patch(**WAITING, label="waiting"))
    figure.legend(
        handles=handles,
        title="phase",
        loc="outside lower center",
        ncols=columns,
        fontsize=8,
        frameon=False,
    )
    return figure


def draw_waiting(ax: Any, events: Sequence[Any]) -> None:
    """Hatch, on each DDP rank's compute track, its wait for the step's last all-reduce:
    from the backward's last gradient, for the backward's ``details["waiting_s"]``
    (:mod:`dpkit.ddp.record`); ``backward()`` returns only then, so the rank does nothing
    meanwhile. Placed as :func:`draw_timeline` places the bars."""
    devices = device_order(e.device for e in events)
    row = {name: i for i, name in enumerate(devices)}
    step_start = min(e.start for e in events)
    offset, height = MAIN_BAND  # a rank that waits has all-reduces: its row is split
    bars = []
    for event in events:
        waiting = event.details.get("waiting_s", 0.0) if event.phase == "backward" else 0.0
        if waiting > 0:
            start_ms = (event.end - step_start) * 1e3
            bars.append(((start_ms, waiting * 1e3), (row[event.device] + offset, height)))
    if bars:  # one artist for all of them: hatching is drawn per bar either way
        add_bars(ax, bars, **WAITING)


def traffic_and_memory(comparison: Any) -> Figure:
    """Per device, DataParallel beside DDP: bytes in and out per step (left) and bytes held,
    by category (right): device 0's funnel in DataParallel, DDP's even ranks."""
    from dpkit.ddp import traffic_per_device

    figure, axes = _figure(3.4, 1, 2)
    width, labelled = 0.38, set()
    for offset, (engine, trace, _) in zip((-width / 2, width / 2), comparison.engines()):
        traffic = traffic_per_device(trace)
        names = device_order(traffic)
        xs = [i + offset for i in range(len(names))]
        axes[0, 0].bar(xs, [traffic[n] for n in names], width, label=engine,
                       color=ENGINE_COLORS[engine])  # fmt: skip
        held = {row["device"]: row for row in trace.memory_summary()}
        bottom = [0] * len(names)
        for category, colour in CATEGORY_COLORS.items():
            heights = [held.get(n, {}).get(category, 0) for n in names]
            if any(heights):
                label = None if category in labelled else category
                labelled.add(category)
                axes[0, 1].bar(xs, heights, width, bottom=bottom, color=colour, label=label,
                               edgecolor=ENGINE_COLORS[engine], linewidth=1)  # fmt: skip
                bottom = [b + h for b, h in zip(bottom, heights)]
    n = comparison.nproc
    for ax, what in zip(axes[0], ("bytes in and out per step", "bytes held (last step)")):
        ax.set_xticks(range(n), [f"device {i}" for i in range(n)])
        ax.yaxis.set_major_formatter(lambda value, _: human_bytes(value))
        ax.set_ylabel(what)
    axes[0, 0].legend(fontsize=7, title="left bar | right bar", title_fontsize=7)
    axes[0, 0].set_title("traffic: DataParallel | DDP", fontsize=9)
    axes[0, 1].set_title("memory: DataParallel | DDP", fontsize=9)
    _legend_outside(axes[0, 1], "category")
    return figure


def bubble_figure(rows: Sequence[dict[str, Any]], predicted: dict[int, list[float]] | None = None,
                  stages: int = 2) -> Figure:  # fmt: skip
    """Idle share against micro-batches: measured (median, quartiles as a bar) and the
    formula for ``stages``; ``predicted``: more stage counts' predicted idle shares, by p."""
    figure, axes = _figure(3.2)
    ax = axes[0, 0]
    ms = [row["micro_batches"] for row in rows]
    medians = [row["measured idle"] for row in rows]
    spread = [[m - row["q1"] for m, row in zip(medians, rows)],
              [row["q3"] - m for m, row in zip(medians, rows)]]  # fmt: skip
    ax.errorbar(ms, medians, yerr=spread, marker="o", capsize=3, color=MEASURED_COLOR,
                label=f"measured, p={stages} (median, quartiles)")  # fmt: skip
    ax.plot(ms, [row["formula"] for row in rows], "k--", label=f"formula (p-1)/(m+p-1), p={stages}")
    for index, (p, idle) in enumerate(sorted((predicted or {}).items())):
        colour = STAGE_COLORS[index % len(STAGE_COLORS)]
        (line,) = ax.plot(
            ms, idle, marker="s", linestyle=":", color=colour, label=f"predicted, p={p}"
        )
        ax.plot(ms, [bubble_formula(p, m) for m in ms], "--", color=line.get_color(),
                linewidth=0.8, label=f"formula, p={p}")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xticks(ms, [str(m) for m in ms])
    ax.set_ylim(0, 1)
    ax.set_xlabel("micro-batches m")
    ax.set_ylabel("share of device-time idle")
    # neutral: whether the bubble shrank on this run is bubble_against_micro_batches' to say
    ax.set_title("Idle share against micro-batches: measured, formula, predicted", fontsize=9)
    _legend_outside(ax, "idle share")
    return figure


BUBBLE_WORDING = {
    verdict.Outcome.FASTER: "the idle share was smaller with more micro-batches in three "
    "rounds of four: the bubble shrank",
    verdict.Outcome.SLOWER: "the idle share was larger with more micro-batches in three "
    "rounds of four: per-micro-batch overheads outweighed the smaller bubble",
    verdict.Outcome.WITHIN_NOISE: "no difference beyond the run-to-run noise",
    verdict.Outcome.TOO_NOISY: "the rounds disagree; another program took cores during some",
}


def bubble_against_micro_batches(
    make_pipeline: Callable[[int], Pipeline],
    inputs: Any,
    targets: Any,
    fewer: int = 1,
    more: int = 8,
    rounds: int = 7,
) -> verdict.Verdict:
    """Whether the idle share at ``more`` micro-batches is smaller than at ``fewer``: in every
    round one traced step of each (after a warm-up step), back to back; the ratio is the idle
    share at ``fewer`` over the one at ``more`` (above 1: the bubble shrank)."""
    few, many = make_pipeline(fewer), make_pipeline(more)
    shares: dict[int, list[float]] = {fewer: [], more: []}
    for _ in range(rounds):
        for m, pipe in ((fewer, few), (more, many)):
            shares[m] += measure_steps(pipe, inputs, targets, repeats=1)[1]
    rounds_of = verdict.Rounds.of(shares[fewer], shares[more])
    return verdict.conclude(rounds_of, BUBBLE_WORDING, labels=verdict.SIZE_LABELS)


DDP_WORDING = {
    verdict.Outcome.FASTER: "DDP was faster than DataParallel in three rounds of four",
    verdict.Outcome.SLOWER: "DDP was slower than DataParallel in three rounds of four",
}


def ddp_against_data_parallel(comparison: Any) -> verdict.Verdict:
    """DDP's speed-up over DataParallel, from a :class:`dpkit.ddp.Comparison`'s interleaved
    blocks: the k-th DataParallel step and the k-th DDP step ran in the same block pair, so
    each pair is a round (DataParallel's time over DDP's: above 1, DDP was faster)."""
    data_parallel, ddp = comparison.data_parallel_step_times, comparison.ddp.step_times
    if len(data_parallel) != len(ddp):
        raise ValueError(
            f"{len(data_parallel)} DataParallel steps but {len(ddp)} DDP steps: the blocks "
            "do not pair"
        )
    return verdict.conclude(verdict.Rounds.of(data_parallel, ddp), DDP_WORDING)


# -------------------------------------------------------------------------------------
# Explorers


# What one process shows (torch: DataParallel.forward calls the module itself on one device;
# DDP's reducer still launches its all-reduces, which a group of one returns unchanged).
ONE_PROCESS = (
    "1 process: DataParallel calls the module itself; DDP still all-reduces each bucket, "
    "with no other rank to add"
)


def ddp_explorer(comparison: Any, run: Callable[[int], Any] | None = None) -> Any:
    """Sliders for the step, the process count (1-4) and the bucket size over DataParallel's
    and DDP's timelines of that step on one clock. ``comparison``: a
    :class:`dpkit.ddp.Comparison` with a sweep; ``run(nproc)`` makes one for another process
    count, called once per count on first use (default: as ``comparison`` was made)."""
    from ipywidgets import SelectionSlider

    from dpkit.viz.explorer import Explorer, int_slider

    caps = [result.bucket_cap_mb for result in [comparison.ddp, *comparison.sweep]]
    run = run or _rerun_like(comparison, caps)
    cache = {comparison.nproc: comparison}

    def compute(**values: Any) -> tuple[Trace, Trace, Any]:
        nproc = values["processes"]
        if nproc not in cache:
            cache[nproc] = run(nproc)
        chosen = cache[nproc]
        result = {r.bucket_cap_mb: r for r in [chosen.ddp, *chosen.sweep]}[values["bucket MiB"]]
        return (
            step_of(chosen.data_parallel, values["step"]),
            step_of(result.trace, values["step"]),
            result,
        )

    def draw(data: tuple[Trace, Trace, Any]) -> Figure:
        data_parallel, ddp, result = data
        return timelines_on_one_clock(
            [("DataParallel", data_parallel), (f"DDP, bucket_cap_mb={result.bucket_cap_mb:g}", ddp)]
        )

    def marker(data: tuple[Trace, Trace, Any], values: dict[str, Any]) -> str:
        _, ddp, result = data
        allreduces = [
            e for e in ddp.events if e.phase == "allreduce" and e.device.startswith("rank:0 ")
        ]
        line = (
            f"drawn: step={values['step']} processes={values['processes']} "
            f"bucket={values['bucket MiB']:g} MiB; rank 0 ran {len(allreduces)} all-reduce(s) "
            f"of {sum(e.nbytes for e in allreduces):,d} bytes in this step"
        )
        return f"{line} ({ONE_PROCESS})" if values["processes"] == 1 else line

    bucket = SelectionSlider(options=[(f"{c:g}", c) for c in caps], value=caps[0],
                             description="bucket MiB", continuous_update=False)  # fmt: skip
    steps = max(e.step for e in comparison.ddp.trace.events)
    controls = [
        int_slider("step", steps, 1, steps),
        int_slider("processes", comparison.nproc, 1, 4),
        bucket,
    ]
    return Explorer(controls, compute, draw, marker)


def step_of(trace: Trace, step: int) -> Trace:
    """A Trace of ``trace``'s events and memory in ``step`` (its last step if it has fewer)."""
    step = min(step, max(e.step for e in trace.events))
    kept = Trace()
    kept.origin = trace.origin  # times since the same moment as the whole trace's
    kept._events = [e for e in trace.events if e.step == step]  # filled, not recorded
    kept._memory = [
        (m.device, m.category, m.nbytes, m.step, m.kind) for m in trace.memory if m.step == step
    ]
    return kept


def _rerun_like(comparison: Any, caps: list[float]) -> Callable[[int], Any]:
    def run(nproc: int) -> Any:
        from dpkit.ddp import compare_with_data_parallel

        return compare_with_data_parallel(
            comparison.workload, nproc=nproc, batch=comparison.batch // comparison.nproc * nproc,
            threads=comparison.threads, bucket_cap_mb=caps[0], sweep_caps_mb=caps[1:],
        )  # fmt: skip

    return run


def pipeline_explorer(
    make_pipeline: Callable[[int, int], Any], inputs: Any, targets: Any, repeats: int = 3
) -> Any:
    """Sliders for micro-batches (1-16) and stages (1-4) over a model split's timeline.
    ``make_pipeline(stages, micro_batches)`` builds it. Up to as many stages as cores, the
    steps are measured (``repeats`` after a warm-up; the last drawn); beyond, the schedule
    is predicted from the stages' measured times (and titled predicted)."""
    from dpkit import pipeline as pp
    from dpkit.viz.explorer import Explorer, int_slider
    from dpkit.viz.figures import timeline

    def compute(**values: Any) -> tuple[Trace, float, float, bool]:
        p, m = values["stages"], values["micro-batches"]
        pipe = make_pipeline(p, m)
        if p <= cores():
            recorded, idle = pp.measure_steps(pipe, inputs, targets, repeats)
            trace, measured = step_of(recorded, 10**9), sorted(idle)[len(idle) // 2]
        else:
            trace = pp.predict_schedule(pp.stage_times(pipe, inputs, targets), m)
            measured = pp.idle_fraction(trace)
        return trace, measured, pp.bubble_formula(p, m), p > cores()

    def draw(data: tuple[Trace, float, float, bool]) -> Figure:
        trace, idle, formula, predicted = data
        rows = len({e.device for e in trace.events})
        figure = timeline(trace)
        figure.set_size_inches(FIGURE_WIDTH, 1.6 + 0.42 * rows)
        figure.set_dpi(FIGURE_DPI)
        what = "predicted" if predicted else "measured (median)"
        figure.axes[0].set_title(
            f"{hardware_title(trace, 'Model split')}\nidle {idle:.0%} {what}, formula "
            f"{formula:.0%}",
            fontsize=9,
            pad=14,  # above the "backward →" mark, as the timeline's own title
        )
        return figure

    def marker(data: tuple[Trace, float, float, bool], values: dict[str, Any]) -> str:
        _, idle, formula, predicted = data
        return (
            f"drawn: micro-batches={values['micro-batches']} stages={values['stages']}; idle "
            f"{idle:.2f} {'predicted' if predicted else 'measured'}, formula {formula:.2f}"
        )

    controls = [int_slider("micro-batches", 1, 1, 16), int_slider("stages", 2, 1, 4)]
    return Explorer(controls, compute, draw, marker)
