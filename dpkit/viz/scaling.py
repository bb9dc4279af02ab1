"""Communication and scaling on hardware you may not have: the figures of notebook 06.

The surprise first: on GPUs, DataParallel and DDP move about the same bytes per step. torch's
DataParallel broadcasts the parameters with NCCL (``S / B``) and reduces the gradients with
NCCL (``S / B``); DDP's ring all-reduce moves ``2 (n - 1) / n * S / B``. DataParallel is
slower because of *when* and *where*: it broadcasts every step, reduces only after the whole
backward (DDP's buckets overlap it), launches every replica's kernels from one process's
threads (the GIL), and piles the batch, the gathered outputs, the loss and the optimizer's
state on device 0. And it is one process: it cannot use a second node at all. Across nodes
the course's answer is DDP, whose all-reduce then runs at the network's pace.

Everything here reads traces from :func:`dpkit.cost.predict`; no number is typed in. Layers:

- data: :func:`traffic` (what a step moves over which link, how long), :func:`scaling_rows`
  (step time by device count), :func:`speedup_grid` (speed-up and efficiency over batch x
  devices, break-even batches), :func:`memory_table` (bytes per device, does it fit);
- figures: :func:`phase_timeline` (a row per phase: one step at a glance, for any number of
  devices), :func:`scaling_figure`, :func:`speedup_heatmap`;
- a widget: :func:`scaling_explorer` (hardware, model, devices 1-64, batch).

The prediction checked against this machine's own lanes is in
:mod:`dpkit.viz.prediction_check`.

Every figure of a prediction says "predicted" in its title.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from matplotlib.figure import Figure
from torch import nn

from dpkit import cost
from dpkit.chunk_plans import torch_chunk_sizes
from dpkit.models import PREDICTION_MODELS, build_model, sample_input
from dpkit.tracing import Trace
from dpkit.tracing.events import BACKWARD_PHASES, FORWARD_PHASES
from dpkit.tracing.export import as_dataframe
from dpkit.viz.common import FIGURE_DPI, FIGURE_WIDTH, ONE_DEVICE
from dpkit.viz.explorer import Explorer, int_slider
from dpkit.viz.figures import hardware_title, human_bytes, phase_color

MAX_DEVICES = 64
MAX_BATCH = 8192
BATCH_STEP = 16
DEFAULT_HARDWARE = "8xA100-SXM-NVLink"
STRATEGY_NAMES = {"dp": "DataParallel", "ddp": "DDP"}


def gpu_presets() -> list[str]:
    """The presets of GPU machines: all but ``"this-machine"``, whose numbers are a documented
    default until :func:`dpkit.cost.calibrate` measures the machine at hand."""
    return [name for name in cost.presets() if name != "this-machine"]


@cache
def model(name: str) -> nn.Module:
    """A course model by name (``"mlp"``, ``"cnn"``, ``"transformer"``), built once, so that
    its profile is cached and a sweep predicts in milliseconds."""
    return build_model(name, seed=0)


def predict(model_name: str, batch: int, devices: int, hardware: Any, strategy: str = "dp"):
    """:func:`dpkit.cost.predict` for a course model on 1x28x28 images."""
    return cost.predict(model(model_name), sample_input(), batch, devices, hardware, strategy)


def dp_fits_on(hardware: Any, devices: int) -> bool:
    """Whether DataParallel can use ``devices`` devices of ``hardware``: one process, so the
    devices of one node only."""
    return devices <= _hardware(hardware).devices_per_node


def _hardware(hardware: Any) -> cost.Hardware:
    return cost.preset(hardware) if isinstance(hardware, str) else hardware


def _index(device: str) -> int:
    found = re.search(r":(\d+)", device)
    return int(found.group(1)) if found else 0


# --------------------------------------------------------------------------------------
# What moves over which link


def link_names(hardware: Any) -> dict[str, str]:
    """A machine's two links in words: ``"node"`` (NCCL's between devices of one node, what
    DDP gets) and ``"network"`` (between nodes: a node's ports together), each its achieved
    bandwidth and its latency."""
    machine = _hardware(hardware)
    inside, network = machine.collective_link(), machine.network_link()
    how = "peer to peer" if machine.peer_to_peer else "NCCL through host memory"
    return {
        "node": f"{inside.bandwidth / 1e9:.3g} GB/s, {inside.latency * 1e6:.3g} us ({how})",
        "network": f"{network.bandwidth / 1e9:.3g} GB/s, {network.latency * 1e6:.3g} us",
    }


@dataclass(frozen=True)
class PhaseTraffic:
    """One phase of a predicted step: bytes moved to or from devices of device 0's node
    (``inside``) and of other nodes (``across``), the copies that moved them, its time."""

    phase: str
    inside: int
    across: int
    copies: int
    seconds: float


def phase_traffic(trace: Any) -> list[PhaseTraffic]:
    """What each phase of a predicted trace's last step moves, and over which link: a copy
    to or from a device beyond the first node (``Hardware.devices_per_node``) crosses the
    network, every other copy stays inside device 0's node."""
    per_node = trace.machine.devices_per_node
    last = max(e.step for e in trace.events)
    found: dict[str, dict[str, Any]] = {}
    for event in trace.events:
        if event.step != last:
            continue
        row = found.setdefault(
            event.phase,
            {"inside": 0, "across": 0, "copies": 0, "first": event.start, "last": event.end},
        )
        row["first"], row["last"] = min(row["first"], event.start), max(row["last"], event.end)
        if event.nbytes:
            row["copies"] += 1
            row["across" if _index(event.device) >= per_node else "inside"] += event.nbytes
    return [
        PhaseTraffic(phase, r["inside"], r["across"], r["copies"], r["last"] - r["first"])
        for phase, r in found.items()
    ]


def traffic(trace: Any) -> Any:
    """:func:`phase_traffic` as a table to read: a DataFrame where pandas is installed, else
    a list of dicts."""
    return as_dataframe(
        [
            {
                "phase": row.phase,
                "inside a node": human_bytes(row.inside),
                "across nodes": human_bytes(row.across),
                "copies": row.copies,
                "predicted ms": round(row.seconds * 1e3, 4),
            }
            for row in phase_traffic(trace)
        ]
    )


def hardware_table(names: Sequence[str] | None = None) -> Any:
    """The presets side by side (default: the GPU machines): devices per node, peak FLOP/s
    of the units float32 matmuls, float32 convolutions (TF32 by default) and autocast use,
    memory per device, and each link's achieved bandwidth with where it comes from (the
    device link: NCCL's, what DDP gets)."""
    machines = cost.presets()
    rows = []
    for name in names or gpu_presets():
        machine = machines[name]
        peaks = machine.peak_flops
        inside, network = machine.collective_link(), machine.network_link()
        rows.append(
            {
                "hardware": name,
                "per node": machine.devices_per_node,
                "fp32 TFLOP/s": round(peaks["float32"] / 1e12, 1),
                "tf32": round(peaks.get("tfloat32", peaks["float32"]) / 1e12, 1),
                "fp16/bf16": round(max(peaks.get("float16", 0), peaks.get("bfloat16", 0)) / 1e12),
                "memory GiB": round(machine.memory_capacity / 2**30),
                "device link GB/s": round(inside.bandwidth / 1e9, 1),
                "from": inside.source,
                "network GB/s per node": round(network.bandwidth / 1e9, 2),
                "network from": network.source,
            }
        )
    return as_dataframe(rows)


def memory_table(traces: Sequence[Any], labels: Sequence[str]) -> Any:
    """Bytes per device of predicted steps, one row per trace: device 0's, the largest of
    the others', the device's capacity and whether it fits (all predicted)."""
    rows = []
    for label, trace in zip(labels, traces):
        per_device = trace.memory_per_device
        others = max(per_device[1:], default=0)
        rows.append(
            {
                "step": label,
                "device 0": human_bytes(per_device[0]),
                "other devices (max)": human_bytes(others) if len(per_device) > 1 else "-",
                "capacity": human_bytes(trace.machine.memory_capacity),
                "fits": "yes" if trace.fits else "no",
            }
        )
    return as_dataframe(rows)


# --------------------------------------------------------------------------------------
# One step at a glance: a row per phase


def _phase_spans(trace: Trace) -> list[tuple[str, float, float, int]]:
    """(phase, start, end, bytes) of each phase of the trace's last step, in time order;
    times in seconds since the step began."""
    last = max(e.step for e in trace.events)
    events = [e for e in trace.events if e.step == last]
    origin = min(e.start for e in events)
    spans: dict[str, list[float]] = {}
    for e in events:
        first, end, moved = spans.get(e.phase, (e.start, e.end, 0))
        spans[e.phase] = [min(first, e.start), max(end, e.end), moved + e.nbytes]
    known = FORWARD_PHASES + BACKWARD_PHASES
    order = sorted(spans, key=lambda p: (spans[p][0], known.index(p) if p in known else 99))
    return [(p, spans[p][0] - origin, spans[p][1] - origin, int(spans[p][2])) for p in order]


def step_seconds(trace: Trace) -> float:
    """The last step's length: a prediction's own step time, else first start to last end."""
    if hasattr(trace, "step_time"):
        return trace.step_time
    spans = _phase_spans(trace)
    return max(end for _, _, end, _ in spans) - min(start for _, start, _, _ in spans)


def _draw_phases(axes: Any, trace: Trace, label: str, minimum_ms: float) -> None:
    spans = _phase_spans(trace)
    for row, (phase, start, end, moved) in enumerate(spans):
        width = max((end - start) * 1e3, minimum_ms)
        axes.barh(row, width, left=start * 1e3, height=0.7, color=phase_color(phase))
        text = f"{(end - start) * 1e3:.3g} ms" + (f", {human_bytes(moved)}" if moved else "")
        axes.annotate(
            text,
            (start * 1e3 + width, row),
            xytext=(3, 0),
            textcoords="offset points",
            va="center",
            fontsize=7,
        )
    axes.set_yticks(range(len(spans)), [phase for phase, *_ in spans], fontsize=8)
    axes.set_ylim(len(spans) - 0.5, -0.6)
    axes.set_title(label, fontsize=9, loc="left")
    axes.grid(axis="x", alpha=0.3)


def phase_timeline(traces: Sequence[Trace], labels: Sequence[str] | None = None) -> Figure:
    """One panel per trace, one row per phase (first start to last end across devices), on a
    shared time axis: DP against DDP, or measured against predicted. Each bar is annotated
    with its time and the bytes it moved; the figure's title says where the numbers came from
    (predicted, virtual or real devices)."""
    if not traces:
        raise ValueError("traces must hold at least one trace (e.g. from dpkit.cost.predict)")
    labels = list(labels) if labels is not None else [t.hardware for t in traces]
    longest = max(step_seconds(t) for t in traces) * 1e3
    rows = sum(len(_phase_spans(t)) for t in traces)
    figure = Figure(
        figsize=(FIGURE_WIDTH, 1.0 + 0.22 * rows + 0.35 * len(traces)),
        dpi=FIGURE_DPI,
        layout="constrained",
    )
    heights = [len(_phase_spans(t)) + 1 for t in traces]
    panels = figure.subplots(
        len(traces), 1, sharex=True, squeeze=False, gridspec_kw={"height_ratios": heights}
    )[:, 0]
    for axes, trace, label in zip(panels, traces, labels):
        _draw_phases(axes, trace, label, longest * 0.004)
        seconds = step_seconds(trace)
        axes.axvline(seconds * 1e3, color="0.3", linestyle=":", linewidth=1)
    panels[-1].set_xlim(0, longest * 1.3)
    panels[-1].set_xlabel("time since the step began (ms); dotted: the step's end")
    kinds = sorted({t.hardware for t in traces})
    where = kinds[0] if len(kinds) == 1 else " vs ".join(kinds)
    figure.suptitle(f"One training step, phase by phase — {where}", fontsize=9)
    return figure


# --------------------------------------------------------------------------------------
# Scaling with the device count


@dataclass(frozen=True)
class ScalingRow:
    hardware: str
    strategy: str
    devices: int
    batch: int
    step_ms: float
    communication_ms: float  # the phases that move bytes between devices, as predicted

    @property
    def label(self) -> str:
        return f"{STRATEGY_NAMES[self.strategy]}, {self.hardware}"


COMMUNICATION = ("scatter", "replicate", "gather", "grad_scatter", "reduce", "allreduce")


def scaling_rows(
    model_name: str,
    batch_per_device: int,
    device_counts: Sequence[int],
    hardware_names: Sequence[str],
    strategies: Sequence[str] = ("dp", "ddp"),
) -> list[ScalingRow]:
    """Predicted step times as the device count grows, the batch growing with it
    (``batch_per_device`` rows per device: the usual way to scale out). DataParallel only
    up to one node's devices: it is one process."""
    rows = []
    for name in hardware_names:
        for strategy in strategies:
            for n in device_counts:
                if strategy == "dp" and not dp_fits_on(name, n):
                    continue
                trace = predict(model_name, batch_per_device * n, n, name, strategy)
                moved = sum(
                    row["time_s"] for row in trace.summary() if row["phase"] in COMMUNICATION
                )
                rows.append(
                    ScalingRow(
                        name, strategy, n, batch_per_device * n, trace.step_time * 1e3, moved * 1e3
                    )
                )
    return rows


def scaling_figure(rows: Sequence[ScalingRow]) -> Figure:
    """Predicted step time against the device count, a line per hardware and strategy; the
    batch per device stays the same, so a flat line is perfect scaling.

    Lines that coincide (DataParallel within one node, where the network between nodes is not
    used) are drawn once, naming every machine, so the legend names no line hidden under
    another. A point past the devices a preset names (DDP on more nodes than it has, which the
    cost model predicts by assuming more such nodes) is drawn hollow, and said so.
    """
    figure = Figure(figsize=(FIGURE_WIDTH, 3.2), dpi=FIGURE_DPI, layout="constrained")
    axes = figure.add_subplot()
    curves: dict[tuple[str, tuple[tuple[int, float], ...]], list[str]] = {}
    for label in dict.fromkeys(r.label for r in rows):
        mine = [r for r in rows if r.label == label]
        points = tuple((r.devices, round(r.step_ms, 9)) for r in mine)
        curves.setdefault((mine[0].strategy, points), []).append(mine[0].hardware)
    beyond = False
    for (strategy, points), machines in curves.items():
        style = "o-" if strategy == "dp" else "s--"
        counts, times = [n for n, _ in points], [ms for _, ms in points]
        (line,) = axes.plot(
            counts, times, style, markersize=4,
            label=f"{STRATEGY_NAMES[strategy]}, "
            + (machines[0] if len(machines) == 1 else f"the {len(machines)} machines alike"),
        )  # fmt: skip
        largest = min(_hardware(name).max_devices for name in machines)
        past = [(n, ms) for n, ms in points if n > largest]
        if past:
            beyond = True
            axes.plot(*zip(*past), style[0], markersize=5, markerfacecolor="white",
                      color=line.get_color(), linestyle="none")  # fmt: skip
    counts = sorted({r.devices for r in rows})
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xticks(counts, [str(c) for c in counts])
    axes.minorticks_off()
    axes.set_xlabel(
        f"devices ({rows[0].batch // rows[0].devices} rows per device)"
        + ("\nhollow: more nodes than the machine has (predicted as if alike)" if beyond else "")
    )
    axes.set_ylabel("step time (ms), predicted")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1))
    axes.set_title("Step time as devices are added — predicted devices (cost model)", fontsize=9)
    return figure


# --------------------------------------------------------------------------------------
# Speed-up and efficiency over batch x devices


@dataclass(frozen=True)
class SpeedupGrid:
    """Predicted speed-up of ``devices[j]`` devices over one at batch ``batches[i]`` (the same
    batch split, as DataParallel splits it): ``speedup[i][j] = step(1) / step(n)``."""

    model: str
    hardware: str
    strategy: str
    batches: tuple[int, ...]
    devices: tuple[int, ...]
    step_ms: tuple[tuple[float, ...], ...]  # [batch][devices]; NaN: DDP cannot run it
    single_ms: tuple[float, ...]  # [batch], on one device

    @property
    def speedup(self) -> list[list[float]]:
        return [[one / many for many in row] for one, row in zip(self.single_ms, self.step_ms)]

    @property
    def efficiency(self) -> list[list[float]]:
        """Speed-up per device: 1 is perfect, 1/n is no gain at all."""
        return [[s / n for s, n in zip(row, self.devices)] for row in self.speedup]

    def break_even(self, devices: int) -> int | None:
        """The smallest batch of the grid at which ``devices`` devices beat one (None: none)."""
        column = self.devices.index(devices)
        for batch, row in zip(self.batches, self.speedup):
            if row[column] > 1:
                return batch
        return None


def speedup_grid(
    model_name: str,
    hardware: str,
    batches: Sequence[int] = (16, 64, 256, 1024, 4096, 16384),
    devices: Sequence[int] = (2, 4, 8, 16, 32, 64),
    strategy: str = "dp",
) -> SpeedupGrid:
    """Predict every (batch, devices) pair of the grid, and one device at each batch; for
    DataParallel, only the device counts one node has; for DDP, NaN where the batch leaves a
    rank without rows."""
    if strategy == "dp":
        devices = [n for n in devices if dp_fits_on(hardware, n)]

    def step_ms(batch: int, n: int) -> float:
        if strategy == "ddp" and len(torch_chunk_sizes(batch, n)) < n:
            return math.nan  # a rank would have no rows: no DDP step to predict
        return predict(model_name, batch, n, hardware, strategy).step_time * 1e3

    single = tuple(step_ms(b, 1) for b in batches)
    table = tuple(tuple(step_ms(b, n) for n in devices) for b in batches)
    return SpeedupGrid(
        model_name, hardware, strategy, tuple(batches), tuple(devices), table, single
    )


def speedup_heatmap(grid: SpeedupGrid) -> Figure:
    """Left: the speed-up over one device; right: the efficiency (speed-up per device). Each
    cell is written in; cells where more devices are slower than one are marked."""
    figure = Figure(figsize=(FIGURE_WIDTH, 3.1), dpi=FIGURE_DPI, layout="constrained")
    panels = figure.subplots(1, 2, sharey=True)
    most = max(v for row in grid.speedup for v in row if not math.isnan(v))
    for axes, values, title, scale in (
        (panels[0], grid.speedup, "speed-up over 1 device", most),
        (panels[1], grid.efficiency, "efficiency (speed-up / devices)", 1.0),
    ):
        image = axes.imshow(
            values, cmap="viridis", vmin=0, vmax=max(scale, 1.0), aspect="auto", origin="lower"
        )
        for i, row in enumerate(values):
            for j, value in enumerate(row):
                slower = grid.speedup[i][j] < 1
                text = f"{value:.2g}" if value >= 0.01 else "<.01"
                if math.isnan(value):
                    text = "-"  # a rank would have no rows
                axes.text(
                    j,
                    i,
                    text + ("*" if slower else ""),
                    ha="center",
                    va="center",
                    fontsize=6.5,
                    color="white" if value < scale / 2 else "black",
                )
        axes.set_xticks(range(len(grid.devices)), [str(n) for n in grid.devices], fontsize=8)
        axes.set_xlabel("devices")
        axes.set_title(title, fontsize=9)
        figure.colorbar(image, ax=axes, shrink=0.8)
    panels[0].set_yticks(range(len(grid.batches)), [str(b) for b in grid.batches], fontsize=8)
    panels[0].set_ylabel("batch (whole step)")
    empty = any(math.isnan(v) for row in grid.speedup for v in row)
    figure.suptitle(
        f"{STRATEGY_NAMES[grid.strategy]}, {grid.model}: speed-up, predicted on "
        f"{grid.hardware} (* slower than 1 device"
        + ("; -: a rank would get no rows" if empty else "")
        + ")",
        fontsize=9,
    )
    return figure


# --------------------------------------------------------------------------------------
# The widget


@dataclass(frozen=True)
class ScalingView:
    hardware: str
    model: str
    devices: int
    batch: int
    dp: Any  # None beyond one node: DataParallel is one process
    ddp: Any  # None where the batch leaves ranks without rows: each DDP rank needs its own

    @property
    def marker(self) -> str:
        dp = f"{self.dp.step_time * 1e3:.3g} ms" if self.dp is not None else "one node only"
        ddp = f"{self.ddp.step_time * 1e3:.3g} ms" if self.ddp is not None else "too few rows"
        return (
            f"batch={self.batch} devices={self.devices} hardware={self.hardware} "
            f"model={self.model}: predicted step DataParallel {dp}, DDP {ddp}"
        )


def scaling_view(hardware: str, model_name: str, devices: int, batch: int) -> ScalingView:
    """DataParallel and DDP predicted for the same step on the same hardware (DataParallel
    None past one node; DDP None where torch.chunk's split leaves a rank without rows)."""
    dp = ddp = None
    if dp_fits_on(hardware, devices):
        dp = predict(model_name, batch, devices, hardware, "dp")
    if len(torch_chunk_sizes(batch, devices)) == devices:
        ddp = predict(model_name, batch, devices, hardware, "ddp")
    return ScalingView(hardware, model_name, devices, batch, dp, ddp)


def scaling_view_figure(view: ScalingView) -> Figure:
    """DataParallel above DDP, phase by phase, predicted, on one time axis, each left out
    where it cannot run, saying why (DataParallel past one node, DDP without rows for every
    rank)."""
    machine = cost.preset(view.hardware)
    nodes = -(-view.devices // machine.devices_per_node)
    where = f"{view.devices} device(s)" + (f" on {nodes} nodes" if nodes > 1 else "")
    chunks = len(torch_chunk_sizes(view.batch, view.devices))
    why_not = {
        "DataParallel": f"one process uses one node's {machine.devices_per_node} devices",
        "DDP": f"batch {view.batch} makes {chunks} chunks, so {view.devices - chunks} of "
        f"{view.devices} ranks would get no rows",
    }
    traces, labels, missing = [], [], []
    for name, trace in (("DataParallel", view.dp), ("DDP", view.ddp)):
        if trace is None:
            missing.append(f"no {name}: {why_not[name]}")
            continue
        traces.append(trace)
        labels.append(f"{name}: {trace.step_time * 1e3:.3g} ms per step")
        if name == "DataParallel" and view.devices == 1:
            labels[-1] += f" ({ONE_DEVICE})"
    title = f"{view.model}, batch {view.batch}, {where}"
    if not traces:
        figure = Figure(figsize=(FIGURE_WIDTH, 1.2), dpi=FIGURE_DPI, layout="constrained")
        figure.text(0.02, 0.5, "\n".join(missing), fontsize=9, va="center")
        figure.suptitle(f"Predicted on {view.hardware}: {title}", fontsize=9)
        return figure
    labels[-1] += "".join(f" ({why})" for why in missing)
    figure = phase_timeline(traces, labels)
    title = hardware_title(traces[-1], title)
    if nodes > machine.nodes:  # the cost model predicts DDP there by assuming more nodes
        title += f"\n(the machine has {machine.nodes} nodes; more alike are assumed)"
    figure.suptitle(re.sub(r", d?dp\b", "", title), fontsize=9)
    return figure


def scaling_explorer(
    hardware: str = DEFAULT_HARDWARE, model_name: str = "cnn", devices: int = 8, batch: int = 1024
) -> Explorer:
    """Dropdowns "hardware" and "model", sliders "devices" (1-64) and "batch" (16-8192):
    DataParallel and DDP predicted for that step. ``.last_data`` is the :class:`ScalingView`."""
    import ipywidgets as widgets

    if hardware not in gpu_presets():
        raise ValueError(f"hardware={hardware!r}: use one of {', '.join(gpu_presets())}")
    if model_name not in PREDICTION_MODELS:
        raise ValueError(f"model_name={model_name!r}: use one of {', '.join(PREDICTION_MODELS)}")
    if not 1 <= devices <= MAX_DEVICES:
        raise ValueError(f"devices={devices}: the explorer shows 1 to {MAX_DEVICES}")
    if not BATCH_STEP <= batch <= MAX_BATCH:
        raise ValueError(f"batch={batch}: the explorer shows {BATCH_STEP} to {MAX_BATCH}")
    controls = [
        widgets.Dropdown(options=gpu_presets(), value=hardware, description="hardware"),
        widgets.Dropdown(options=list(PREDICTION_MODELS), value=model_name, description="model"),
        int_slider("devices", devices, 1, MAX_DEVICES),
        int_slider("batch", batch, BATCH_STEP, MAX_BATCH, BATCH_STEP),
    ]
    profiled: set[str] = set()

    def busy(values: dict[str, Any]) -> str | None:
        """A model seen for the first time is profiled first (1-2 s): say so meanwhile."""
        if values["model"] in profiled:
            return None
        profiled.add(values["model"])
        return f"profiling {values['model']} (its ops, on the CPU) before the first prediction..."

    return Explorer(
        controls,
        compute=lambda **v: scaling_view(v["hardware"], v["model"], v["devices"], v["batch"]),
        draw=scaling_view_figure,
        marker=lambda view, _values: view.marker,
        busy=busy,
    )
