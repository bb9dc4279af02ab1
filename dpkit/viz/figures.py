"""Figures of a Trace: a timeline per device, bytes moved per phase, memory per device.

The surprise first: on virtual CPU lanes most communication phases last microseconds
while ``apply`` lasts milliseconds, so the timeline widens every bar to a minimum width
(said under the plot) or short phases would not show at all; hover the Chrome trace in
Perfetto for exact times.

Every function takes a :class:`~dpkit.tracing.Trace` (or a plain list of events or memory
records, e.g. from the cost model) and returns a ``matplotlib.figure.Figure`` built with
the object-oriented API only: no pyplot state, so it renders headless and in threads.
Every title says what the numbers came from (real, virtual or predicted devices), and a
phase has the same colour in every figure.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from dpkit.device import VIRTUAL_CPU
from dpkit.tracing.events import (
    ALLOCATED,
    ALLOCATOR_CATEGORIES,
    BACKWARD_PHASES,
    FORWARD_PHASES,
    MEMORY_CATEGORIES,
    PEAK,
    PHASE_COLOURS,
    Event,
    MemoryRecord,
)
from dpkit.tracing.export import hardware_label
from dpkit.viz.margins import MeasuredMargins

PHASE_COLORS = PHASE_COLOURS  # one colour per phase, from the phase vocabulary
# Colours with a role of their own; tests/test_palette.py checks each against the colours
# it is drawn with, as the phases' are checked, under the common colour-vision deficiencies.
OTHER_COLOR = "#bab0ac"  # a phase or category without a colour; one device, as a baseline
MEASURED_COLOR = "#0072b2"  # Okabe-Ito blue: a measured series
HIGHLIGHT_COLOR = "#d55e00"  # Okabe-Ito vermillion: predicted values, idle devices, a choice

# A category of memory has the colour of the phase that puts it there (its input arrives with
# scatter, a replica's parameters with replicate, ...), so the two figures read together.
CATEGORY_COLORS = {
    "parameters": PHASE_COLOURS["replicate"],
    "input": PHASE_COLOURS["scatter"],
    "activations": PHASE_COLOURS["apply"],
    "outputs": "#0072b2",  # apply's too, in a colour of its own (Okabe-Ito blue)
    "gathered": PHASE_COLOURS["gather"],
    # DDP's (dpkit.ddp): every rank's own gradients, and the flat all-reduce buffers
    # (buckets) that hold a second copy of them, in the all-reduce's colour.
    "gradients": PHASE_COLOURS["backward"],
    "buckets": PHASE_COLOURS["allreduce"],
    # the cost model's (dpkit.cost.memory): optimizer state and DataParallel's reduce buffers
    "optimizer": PHASE_COLOURS["optimizer"],
    "reduce buffers": PHASE_COLOURS["reduce"],
    "output gradient": PHASE_COLOURS["grad_scatter"],
}
# torch's allocator totals, drawn as marks across a device's bar, not stacked on it.
ALLOCATOR_STYLES = {
    ALLOCATED: {"color": "#222222", "linestyle": "-"},
    PEAK: {"color": "#222222", "linestyle": "--"},
}

# Communication that runs *alongside* compute on the same device (DDP all-reduces buckets
# while backward goes on): drawn on a thinner track of its own under the device's row, or
# it would hide the backward it overlaps.
SIDE_TRACK_PHASES = ("allreduce",)
MAIN_BAND = (-0.38, 0.46)  # a row's compute band (offset from the row's centre, height)
SIDE_BAND = (0.13, 0.25)  # its communication band, below it

# The narrowest bar the timeline draws, as a share of the step: a 5 µs scatter would
# otherwise be thinner than a pixel next to a 10 ms apply.
MIN_BAR_SHARE = 0.004

# Direct labels: a bar wide and tall enough for its name carries it, so that colour is not the
# only way to tell a phase or a category. Whether a name fits is estimated without drawing
# (measuring text costs a layout pass on every redraw), for the smallest plot area a notebook
# figure gives a timeline or a memory chart: a 7-inch figure less its tick labels and legend.
LABEL_FONT_SIZE = 7
SMALLEST_PLOT_INCHES = (4.0, 2.2)  # width, height
_CHARACTER_INCHES = 0.6 * LABEL_FONT_SIZE / 72  # DejaVu Sans's mean advance, with a margin

TraceLike = Any  # a Trace, or a sequence of Event / MemoryRecord


def human_bytes(nbytes: float) -> str:
    """``1536`` -> ``"1.5 KB"``: decimal units, as network and PCIe bandwidths are quoted."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(nbytes) < 1000 or unit == "GB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.3g} {unit}"
        nbytes /= 1000
    raise AssertionError("unreachable")


def phase_color(phase: str) -> str:
    return PHASE_COLORS.get(phase, OTHER_COLOR)


def _relative_luminance(colour: str) -> float:
    """WCAG 2's relative luminance of a colour (0 black, 1 white)."""
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in to_rgb(colour)]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def text_colour_on(background: str) -> str:
    """Black or white, whichever contrasts more with ``background`` (WCAG contrast ratio)."""
    luminance = _relative_luminance(background)
    return "black" if (luminance + 0.05) / 0.05 >= 1.05 / (luminance + 0.05) else "white"


def label_if_it_fits(
    axes: Any, x: float, y: float, text: str, background: str, inches: tuple[float, float]
) -> bool:
    """Write ``text`` centred at (``x``, ``y``) on a bar of ``background`` colour whose size on
    the smallest plot is ``inches`` (width, height), if it fits there; whether it did."""
    width, height = inches
    if width < len(text) * _CHARACTER_INCHES + 0.08 or height < LABEL_FONT_SIZE / 72 * 1.4:
        return False
    axes.text(
        x,
        y,
        text,
        ha="center",
        va="center",
        fontsize=LABEL_FONT_SIZE,
        color=text_colour_on(background),
        clip_on=True,
        in_layout=False,  # inside the plot: it moves no margin
    )
    return True


def hardware_title(trace: TraceLike, what: str) -> str:
    """``"<what> — virtual devices on the CPU"``: every figure says where its numbers came from."""
    hardware = trace.hardware if hasattr(trace, "hardware") else hardware_label(list(trace))
    return f"{what} — {hardware}"


def _events(trace: TraceLike) -> list[Event]:
    events = list(trace.events if hasattr(trace, "events") else trace)
    if not events:
        raise ValueError(
            "the trace has no events: run a DataParallel step inside `with dpkit.trace() as tr:`"
        )
    return events


def _memory(trace: TraceLike) -> list[MemoryRecord]:
    records = list(trace.memory if hasattr(trace, "memory") else trace)
    if not records:
        raise ValueError(
            "the trace has no memory records: run a DataParallel step inside "
            "`with dpkit.trace() as tr:` (memory is recorded while tracing only)"
        )
    return records


def _pick_step(items: Sequence[Any], step: int | None) -> tuple[int, list[Any]]:
    """The items of ``step`` (default: the last step, the one after any warm-up)."""
    steps = sorted({item.step for item in items})
    chosen = steps[-1] if step is None else step
    if chosen not in steps:
        raise ValueError(f"step={step} is not in the trace; it has steps {steps}")
    return chosen, [item for item in items if item.step == chosen]


def device_order(names: Iterable[str]) -> list[str]:
    """Device names in index order ("virtual:0 (cpu)", "cuda:1", ...); the host ("cpu") last."""
    first_seen = list(dict.fromkeys(names))

    def key(name: str) -> tuple[bool, float, int]:
        index = re.search(r":(\d+)", name)
        return (
            name == "cpu",
            int(index.group(1)) if index else float("inf"),
            first_seen.index(name),
        )

    return sorted(first_seen, key=key)


def _index_of(device: str) -> str:
    """``"virtual:5 (cpu)"`` -> ``"5"``; a name without an index stays as it is."""
    index = re.search(r":(\d+)", device)
    return index.group(1) if index else device


def _phase_order(phases: Iterable[str]) -> list[str]:
    known = FORWARD_PHASES + BACKWARD_PHASES
    present = list(dict.fromkeys(phases))
    return sorted(present, key=lambda p: (known.index(p) if p in known else len(known), p))


def _new_axes(width: float, height: float, layout: Any = "constrained") -> tuple[Figure, Any]:
    figure = Figure(figsize=(width, height), layout=layout)
    return figure, figure.add_subplot()


def _bytes_axis(axis: Any) -> None:
    axis.set_major_formatter(FuncFormatter(lambda value, _: human_bytes(value)))


def _legend_outside(axes: Any, title: str, handles: list[Any] | None = None) -> None:
    """A legend to the right of the plot, where it cannot hide a bar."""
    kwargs = {} if handles is None else {"handles": handles}
    axes.legend(
        **kwargs,
        title=title,
        loc="upper left",
        bbox_to_anchor=(1.01, 1),
        fontsize=8,
        frameon=False,
    )


def timeline(trace: TraceLike, step: int | None = None) -> Figure:
    """One row per device, one bar per event coloured by phase, in ms since the step began.

    ``step`` defaults to the last step recorded (the first one often includes warm-up).
    A device whose communication runs alongside its compute (DDP's all-reduces during
    backward, :data:`SIDE_TRACK_PHASES`) gets a thinner second track for it, labelled
    "communication", so the overlap shows instead of one bar hiding the other.
    """
    step, events = _pick_step(_events(trace), step)
    devices = device_order(e.device for e in events)
    # Its margins from its texts alone (dpkit.viz.margins): a constrained layout also measures
    # every bar, and cost more than painting the figure in an explorer.
    figure, axes = _new_axes(10, 1.4 + 0.55 * len(devices), layout=MeasuredMargins())
    draw_timeline(axes, events)
    axes.set_title(hardware_title(trace, f"Timeline of step {step}"), pad=14)
    return figure


def draw_timeline(
    axes: Any, events: Sequence[Event], span_ms: float | None = None, legend: bool = True
) -> float:
    """Draw one step's ``events`` into ``axes`` as :func:`timeline` does (no title); the
    step's length in ms. ``span_ms``: the x-axis length, to put several timelines on one
    clock (default: this step's own length); ``legend=False``: no legend of the phases beside
    it (a figure of several timelines gives one for all)."""
    devices = device_order(e.device for e in events)
    row = {name: i for i, name in enumerate(devices)}
    step_start = min(e.start for e in events)
    step_ms = (max(e.end for e in events) - step_start) * 1e3
    span_ms = step_ms if span_ms is None else span_ms
    min_width = span_ms * MIN_BAR_SHARE

    # Devices with communication alongside compute get two tracks in their row.
    split = {e.device for e in events if e.phase in SIDE_TRACK_PHASES}
    shared = _one_backward_thread(events)
    hatched_ids = {id(e) for e in shared}
    # One collection for each run of consecutive bars of a phase (the events come phase by
    # phase), not one per bar: adding a collection costs about a millisecond, and bars are
    # still drawn in the events' order, each run labelled with its phase.
    runs: list[tuple[tuple[str, str | None], list[Bar]]] = []
    for event in events:
        start_ms = (event.start - step_start) * 1e3
        if event.device not in split:
            offset, height = -0.35, 0.7
        else:
            offset, height = SIDE_BAND if event.phase in SIDE_TRACK_PHASES else MAIN_BAND
        width_ms = max(event.duration * 1e3, min_width)
        style = (event.phase, "////" if id(event) in hatched_ids else None)
        if not runs or runs[-1][0] != style:
            runs.append((style, []))
        runs[-1][1].append(((start_ms, width_ms), (row[event.device] + offset, height)))
        label_if_it_fits(
            axes,
            start_ms + width_ms / 2,
            row[event.device] + offset + height / 2,
            event.phase,
            phase_color(event.phase),
            (width_ms / (span_ms * 1.01) * SMALLEST_PLOT_INCHES[0], 1.0),
        )
    for (phase, hatch), bars in runs:
        add_bars(
            axes,
            bars,
            facecolors=phase_color(phase),
            label=phase,
            edgecolor="white",
            linewidth=0.3,
            hatch=hatch,
        )
    backward = [e.start for e in events if e.phase in BACKWARD_PHASES]
    if backward:
        first_backward = (min(backward) - step_start) * 1e3
        axes.axvline(first_backward, color="0.4", linestyle=":", linewidth=1)
        axes.annotate(
            "backward →",
            (first_backward, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(3, 2),
            textcoords="offset points",
            fontsize=8,
            color="0.3",
        )
    axes.set_yticks(range(len(devices)), devices)
    if split:  # name the thinner track: a minor tick under each split row
        side = [row[d] + SIDE_BAND[0] + SIDE_BAND[1] / 2 for d in devices if d in split]
        axes.set_yticks(side, ["communication"] * len(side), minor=True, fontsize=7)
        axes.tick_params(axis="y", which="minor", length=0, labelcolor="0.35")
    axes.set_ylim(len(devices) - 0.5, -0.5)  # device 0 on top
    axes.set_xlim(0, span_ms * 1.01)
    # Said under the axis, not in a box on the plot, where it hid bars and met the legend.
    hatched = (
        f"\nhatched: one thread ran all {len(shared)} backwards, interleaved (autograd on a CPU)"
        if shared
        else ""
    )
    axes.set_xlabel(
        f"time since the step began (ms); bars narrower than {min_width:.2g} ms "
        f"are drawn at that width{hatched}"
    )
    axes.grid(axis="x", alpha=0.3)
    if legend:
        phases = _phase_order(e.phase for e in events)
        _legend_outside(axes, "phase", [Patch(color=phase_color(p), label=p) for p in phases])
    return step_ms


Bar = tuple[tuple[float, float], tuple[float, float]]  # (x, width), (y, height), as broken_barh


def add_bars(axes: Any, bars: Sequence[Bar], **style: Any) -> PolyCollection:
    """Rectangles ``((x, width), (y, height))`` as one collection of ``style``, the shapes
    ``axes.broken_barh`` makes for one bar each: many bars, one artist to add and draw."""
    corners = [
        [(x, y), (x, y + height), (x + width, y + height), (x + width, y)]
        for (x, width), (y, height) in bars
    ]
    collection = PolyCollection(np.array(corners), **style)
    axes.add_collection(collection)
    return collection


def _one_backward_thread(events: Sequence[Event]) -> list[Event]:
    """The replicas' backward events when one thread ran them all: DataParallel on CPU lanes
    (autograd runs every replica's backward, interleaved, in the thread that called
    ``backward()``; on GPUs each device has its own) or a prediction of it. Drawn hatched
    and labelled, so that they do not read as backwards running in parallel."""
    found = [
        e
        for e in events
        if e.phase == "backward"
        and e.details.get("thread") != "own"  # dpkit.pipeline: a stage's own thread
        and (e.kind == VIRTUAL_CPU or e.details.get("thread") == "shared")
    ]
    return found if len({e.device for e in found}) > 1 else []


def bytes_per_phase(trace: TraceLike) -> Figure:
    """Bytes each phase moves between devices in one step (the mean over the recorded steps)."""
    events = _events(trace)
    steps = len({e.step for e in events})
    moved: dict[str, float] = defaultdict(float)
    for event in events:
        moved[event.phase] += event.nbytes / steps
    phases = _phase_order(moved)

    figure, axes = _new_axes(8, 4)
    bars = axes.bar(phases, [moved[p] for p in phases], color=[phase_color(p) for p in phases])
    axes.bar_label(bars, labels=[human_bytes(moved[p]) for p in phases], fontsize=8, padding=2)
    axes.margins(y=0.15)
    _bytes_axis(axes.yaxis)
    axes.set_ylabel("bytes moved per step")
    axes.set_xlabel("phase" + (f" (mean over {steps} steps)" if steps > 1 else ""))
    axes.tick_params(axis="x", labelrotation=20)
    axes.set_title(hardware_title(trace, "Bytes moved between devices per phase"))
    return figure


# The thinnest stacked segment a memory chart shows, on the smallest plot: thinner ones are
# left out of the legend (a legend entry whose bar cannot be seen sends the eye hunting) and
# named under the axis instead.
MIN_SEGMENT_INCHES = 1 / 72


def memory_per_device(
    trace: TraceLike, step: int | None = None, top: float | None = None
) -> Figure:
    """Stacked bars: what each device holds in one step, by category (default: the last step).

    The output device holds the ``gathered`` output on top of its own replica's share, the
    imbalance that makes ``nn.DataParallel``'s first GPU run out of memory first. On real
    CUDA devices a solid mark across the bar is torch's ``allocated (torch)`` at the end of
    forward and a dashed one its ``peak (torch)`` over the step: the gap above the bar is
    what dpkit does not count (optimizer state, the caller's tensors, temporaries).
    ``top``: the y axis's top in bytes (default: 15% above the tallest bar). A category whose
    every segment would be thinner than :data:`MIN_SEGMENT_INCHES` is named under the axis
    ("too thin to see") instead of in the legend.
    """
    step, records = _pick_step(_memory(trace), step)
    devices = device_order(r.device for r in records)
    held: dict[str, dict[str, int]] = {c: dict.fromkeys(devices, 0) for c in MEMORY_CATEGORIES}
    totals: dict[str, dict[str, int]] = {}
    for record in records:
        into = totals if record.category in ALLOCATOR_CATEGORIES else held
        into.setdefault(record.category, dict.fromkeys(devices, 0))
        into[record.category][record.device] += record.nbytes

    figure, axes = _new_axes(8, 4.2)
    # Beyond 4 devices the full names ("virtual:5 (cpu)") overlap: the index says it (the
    # title names the hardware)
    names = [_index_of(d) for d in devices] if len(devices) > 4 else devices
    output = "output\ndevice" if len(devices) > 4 else "output device"
    labels = [
        f"{name}\n{output}" if held["gathered"][d] else name for name, d in zip(names, devices)
    ]
    stacked = [sum(held[c][d] for c in held) for d in devices]
    allocator_top = max((n for per in totals.values() for n in per.values()), default=0)
    axis_top = top if top is not None else max([*stacked, allocator_top, 0]) * 1.15 or 1
    thin = [
        category
        for category, per_device in held.items()
        if any(per_device.values())
        and max(per_device.values()) / axis_top * SMALLEST_PLOT_INCHES[1] < MIN_SEGMENT_INCHES
    ]
    bottom = [0] * len(devices)
    for category, per_device in held.items():
        heights = [per_device[d] for d in devices]
        if not any(heights):
            continue
        axes.bar(
            labels,
            heights,
            bottom=bottom,
            label=f"_{category}" if category in thin else category,  # "_": not in the legend
            color=CATEGORY_COLORS.get(category, OTHER_COLOR),
            edgecolor="white",
            linewidth=0.5,
        )
        bottom = [b + h for b, h in zip(bottom, heights)]
    bar_inches = 0.8 * SMALLEST_PLOT_INCHES[0] / len(devices)
    base = [0] * len(devices)
    for category, per_device in held.items():  # a segment tall and wide enough is named
        colour = CATEGORY_COLORS.get(category, OTHER_COLOR)
        for x, device in enumerate(devices):
            size = per_device[device]
            share = size / axis_top
            inches = (bar_inches, share * SMALLEST_PLOT_INCHES[1])
            label_if_it_fits(axes, x, base[x] + size / 2, category, colour, inches)
            base[x] += size
    for x, total in enumerate(bottom):
        axes.annotate(
            human_bytes(total),
            (x, total),
            xytext=(0, 2),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=8,
        )
    for category, per_device in totals.items():
        marked = [(x, per_device[d]) for x, d in enumerate(devices) if per_device[d]]
        axes.hlines(
            [nbytes for _, nbytes in marked],
            [x - 0.45 for x, _ in marked],
            [x + 0.45 for x, _ in marked],
            linewidth=1.5,
            label=category,
            **ALLOCATOR_STYLES.get(category, {"color": OTHER_COLOR}),
        )
    # An explicit top leaves room for the totals (autoscaling ignores the annotations).
    axes.set_ylim(0, axis_top)
    _bytes_axis(axes.yaxis)
    axes.set_ylabel("bytes held")
    sizes = [f"{c} ({human_bytes(max(held[c].values()))})" for c in thin]
    device_word = "device index" if len(devices) > 4 else "device"
    axes.set_xlabel(device_word + (f"\ntoo thin to see: {', '.join(sizes)}" if thin else ""))
    _legend_outside(axes, "category")
    axes.set_title(hardware_title(trace, f"Memory per device in step {step}"))
    return figure
