"""Notebook 09's figure: DDP, ZeRO-1 and FSDP steps as timelines on one clock, each collective
on its rank's communication track, and the cost model's step time beside each.

The surprise first: the engines call different collectives for the same training. DDP
all-reduces its gradient buckets during backward; ZeRO-1 does the same, then broadcasts each
rank's updated parameters inside ``optimizer.step()``; FSDP all-gathers each layer's
parameters before its forward and again before its backward, and reduce-scatters its
gradients. :func:`engine_timelines` draws what :func:`dpkit.ddp.sharding.traces` recorded:
per rank, the calls it made (forward, ``backward()``, ``optimizer.step()``: each a whole
call, so the collectives it waited for are inside its bar) on the upper track, and every
collective on the thinner communication track under it, coloured by kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from dpkit.viz.common import FIGURE_DPI, FIGURE_WIDTH
from dpkit.viz.figures import (
    HIGHLIGHT_COLOR,
    MAIN_BAND,
    MIN_BAR_SHARE,
    SIDE_BAND,
    SMALLEST_PLOT_INCHES,
    _phase_order,
    device_order,
    label_if_it_fits,
    phase_color,
)

# The collectives beside DDP's all-reduce (which keeps its phase colour), from Paul Tol's
# sets (light cyan; dark blue of the "medium contrast" scheme) and Okabe & Ito's (bluish
# green): every two of these, the all-reduce's and the predicted line's (HIGHLIGHT_COLOR)
# differ by CIEDE2000 >= 13.9 under normal vision and the three simulated dichromacies
# (Machado et al. 2009, as tests/test_palette.py measures), and each differs as much from the
# calls' colours (apply, backward, optimizer) on the track above.
COLLECTIVE_COLOURS = {"allgather": "#88ccee", "reduce_scatter": "#114477", "broadcast": "#009e73"}
COLLECTIVES = ("allreduce", *COLLECTIVE_COLOURS)
ENGINE_NAMES = {"ddp": "DDP", "zero1": "ZeRO-1", "fsdp": "FSDP (ZeRO-3)"}


def colour_of(phase: str) -> str:
    """A collective's colour here, else the phase's own (:func:`dpkit.viz.figures.phase_color`)."""
    return COLLECTIVE_COLOURS.get(phase, phase_color(phase))


def _step_of(trace: Any, step: int | None) -> tuple[int, list[Any]]:
    steps = sorted({e.step for e in trace.events})
    chosen = steps[-1] if step is None else step
    if chosen not in steps:
        raise ValueError(f"step={step} is not in the trace; it has steps {steps}")
    return chosen, [e for e in trace.events if e.step == chosen]


def _draw(ax: Any, events: list[Any], span_ms: float) -> float:
    """One step's ``events``: a row per rank, its calls above, its collectives below; the
    step's length in ms."""
    devices = device_order(e.device for e in events)
    row = {name: i for i, name in enumerate(devices)}
    start = min(e.start for e in events)
    took = (max(e.end for e in events) - start) * 1e3
    min_width = span_ms * MIN_BAR_SHARE
    labelled_to: dict[tuple[int, float], float] = {}  # a track -> where its last label's bar ends
    for event in sorted(events, key=lambda e: e.start):
        offset, height = SIDE_BAND if event.phase in COLLECTIVES else MAIN_BAND
        left, width = (event.start - start) * 1e3, max(event.duration * 1e3, min_width)
        colour = colour_of(event.phase)
        track = (row[event.device], offset)
        ax.broken_barh([(left, width)], (track[0] + offset, height),
                       facecolors=colour, edgecolor="white", linewidth=0.3)  # fmt: skip
        if left < labelled_to.get(track, float("-inf")):
            continue  # it overlaps a labelled bar (DDP's buckets, ZeRO-1's broadcasts)
        if label_if_it_fits(
            ax,
            left + width / 2,
            track[0] + offset + height / 2,
            event.phase,
            colour,
            (width / (span_ms * 1.01) * SMALLEST_PLOT_INCHES[0], 1.0),
        ):
            labelled_to[track] = left + width  # fmt: skip
    ax.set_yticks(range(len(devices)), devices)
    side = [row[d] + SIDE_BAND[0] + SIDE_BAND[1] / 2 for d in devices]
    ax.set_yticks(side, ["communication"] * len(side), minor=True, fontsize=7)
    ax.tick_params(axis="y", which="minor", length=0, labelcolor="0.35")
    ax.set_ylim(len(devices) - 0.5, -0.5)  # rank 0 on top
    ax.set_xlim(0, span_ms * 1.01)
    ax.grid(axis="x", alpha=0.3)
    return took


def engine_timelines(
    traces: Mapping[str, Any],
    predicted_s: Mapping[str, float] | None = None,
    step: int | Mapping[str, int] | None = None,
) -> Figure:
    """One timeline per engine of ``traces`` (:func:`dpkit.ddp.sharding.traces`) for
    ``step`` (an int for all, a mapping by engine, or None: each one's last step), stacked
    on one time axis, so the longer step draws longer; with ``predicted_s`` (seconds by
    engine, e.g. :func:`dpkit.ddp.sharding.predicted_step_seconds`) a dashed line where the
    predicted step ends, and both times in the title."""
    steps = step if isinstance(step, Mapping) else dict.fromkeys(traces, step)
    chosen = {engine: _step_of(trace, steps.get(engine)) for engine, trace in traces.items()}
    if not chosen:
        raise ValueError("traces is empty: give one trace per engine, as sharding.traces makes")
    lengths = [
        (max(e.end for e in ev) - min(e.start for e in ev)) * 1e3 for _, ev in chosen.values()
    ]
    predicted_ms = {k: v * 1e3 for k, v in (predicted_s or {}).items()}
    span = max([*lengths, *(predicted_ms.get(engine, 0) for engine in chosen)])
    rows = sum(len({e.device for e in ev}) for _, ev in chosen.values())
    height = 1.0 + 0.5 * rows + 0.75 * len(chosen)
    figure = Figure(figsize=(FIGURE_WIDTH, height), dpi=FIGURE_DPI, layout="constrained")
    axes = figure.subplots(len(chosen), 1, squeeze=False, sharex=True)[:, 0]
    phases: list[str] = []
    for (engine, (number, events)), ax in zip(chosen.items(), axes):
        took = _draw(ax, events, span)
        phases += [e.phase for e in events]
        title = f"{ENGINE_NAMES.get(engine, engine)}, step {number}: {took:.1f} ms measured"
        if engine in predicted_ms:
            ax.axvline(predicted_ms[engine], color=HIGHLIGHT_COLOR, linestyle="--", linewidth=1.5)
            ax.annotate("predicted", (predicted_ms[engine], 0.0),
                        xycoords=("data", "axes fraction"), xytext=(3, 2),
                        textcoords="offset points", fontsize=7,
                        color=HIGHLIGHT_COLOR)  # fmt: skip
            title += f", {predicted_ms[engine]:.1f} ms predicted"
        ax.set_title(title, fontsize=9, loc="left")
    axes[-1].set_xlabel(
        "time since the step began (ms), 2 gloo ranks on this machine's CPU; upper track: the "
        "rank's calls (each whole,\nwaiting included), lower: its collectives; bars narrower "
        f"than {span * MIN_BAR_SHARE:.2g} ms are drawn at that width",
        fontsize=8,
    )
    handles: list[Any] = [Patch(color=colour_of(p), label=p) for p in _phase_order(phases)]
    if predicted_ms:
        handles.append(Line2D([], [], color=HIGHLIGHT_COLOR, linestyle="--",
                              label="predicted step"))  # fmt: skip
    figure.legend(handles=handles, title="phase", loc="outside right upper", fontsize=8,
                  frameon=False)  # fmt: skip
    return figure
