"""Exports of a Trace: rows for pandas, a per-phase summary, a per-device memory table, and
Chrome trace JSON. They read events and memory records only (:mod:`dpkit.tracing.events`).

The Chrome trace opens in https://ui.perfetto.dev and chrome://tracing with one track per
device; its process name says whether the devices were real, virtual or predicted.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from dpkit.device import HOST, REAL, VIRTUAL_CPU, VIRTUAL_GPU
from dpkit.tracing.events import (
    ALLOCATOR_CATEGORIES,
    BACKWARD,
    BACKWARD_PHASES,
    FORWARD,
    MEMORY_CATEGORIES,
    PREDICTED,
    RANK,
    Event,
    MemoryRecord,
)

# How figures, tables and traces name the kind each event carries: a device's, or a label's.
KIND_LABELS = {
    REAL: "real devices",
    VIRTUAL_GPU: "virtual devices on one GPU",
    VIRTUAL_CPU: "virtual devices on the CPU",
    HOST: "host CPU",
    PREDICTED: "predicted devices (cost model)",
    RANK: "processes (DistributedDataParallel, a rank each)",
}


def hardware_label(events: Sequence[Event]) -> str:
    """What the events ran on, in words: "virtual devices on the CPU", "real devices", ..."""
    kinds = sorted({e.kind for e in events if e.kind != HOST}) or [HOST]
    return " + ".join(KIND_LABELS.get(kind, kind) for kind in kinds)


def rows(events: Sequence[Event], origin: float) -> list[dict[str, Any]]:
    """One flat dict per event, times in seconds since ``origin``."""
    return [
        {
            "step": e.step,
            "phase": e.phase,
            "device": e.device,
            "kind": e.kind,
            "start_s": e.start - origin,
            "end_s": e.end - origin,
            "duration_s": e.duration,
            "nbytes": e.nbytes,
            **{f"detail_{key}": value for key, value in e.details.items()},
        }
        for e in events
    ]


def as_dataframe(table: list[dict[str, Any]]) -> Any:
    """A pandas DataFrame of ``table`` where pandas is installed, else the list itself."""
    try:
        import pandas
    except ImportError:
        return table
    return pandas.DataFrame(table)


class Summary(list):
    """Per-phase rows (time per step, bytes per step, share of the step) that print as a table,
    and ``step_s``: the mean wall time of a step, first event to last, which shares are of."""

    def __init__(self, rows: Iterable[dict[str, Any]], step_s: float) -> None:
        super().__init__(rows)
        self.step_s = step_s

    def __str__(self) -> str:
        header = f"{'phase':<14}{'time/step':>12}{'bytes/step':>14}{'share':>8}"
        rule = "-" * len(header)
        lines = [header, rule]
        for row in self:
            lines.append(
                f"{row['phase']:<14}{row['time_s'] * 1e3:>9.3f} ms"
                f"{row['nbytes']:>14,d}{row['share']:>8.1%}"
            )
        # Shares rarely add up to 100 %: say why under the table, where a learner adds them.
        lines += [
            rule,
            f"{'step':<14}{self.step_s * 1e3:>9.3f} ms{'':>14}{1:>8.1%}",
            "shares are of the step (first event to last) and need not add up to 100%:",
            "time in no phase is in no row; phases that run at the same time each count it",
        ]
        return "\n".join(lines)


def covered(intervals: Iterable[tuple[float, float]]) -> float:
    """How long at least one of ``intervals`` (start, end) runs: their union's length, which
    leaves out the gaps a phase's time (first event to last) counts."""
    total, reach = 0.0, -math.inf
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def gaps_note(events: Sequence[Event], phase: str, whose: str, noun: str) -> str | None:
    """A line saying how much of ``phase``'s time in the table its ``events`` (``whose``, in
    one step: "device 0's") actually take, where gaps between them make the two differ (an
    all-reduce's buckets, which wait for gradients); None where they do not."""
    intervals = [(e.start, e.end) for e in events if e.phase == phase]
    if not intervals:
        return None
    window = max(end for _, end in intervals) - min(start for start, _ in intervals)
    busy = covered(intervals)
    if window - busy <= 1e-3 * window:
        return None
    return (f"  ({phase}'s time runs from its first event to its last, gaps included: in the "
            f"last step {whose} {len(intervals)} {noun} took {busy * 1e3:.3f} ms of those "
            f"{window * 1e3:.3f} ms)")  # fmt: skip


class PhaseTotals:
    """Per phase, sums over steps of its wall time and its bytes, and the steps' own wall time
    (first event to last), of which a phase's time is its share: what :func:`summary` averages.
    A bounded trace adds the steps it drops here (:meth:`add`), so that its summary still
    covers every step of the run."""

    def __init__(self) -> None:
        self.time_s: dict[str, float] = defaultdict(float)
        self.nbytes: dict[str, int] = defaultdict(int)
        self.step_s = 0.0  # every step's wall time, summed
        self.order: dict[str, None] = {}  # phases in the order they first appeared
        self.steps = 0
        self.last_step: int | None = None  # the latest step added
        self._last_bounds = (0.0, 0.0)  # its first start and last end, which late events widen

    def add(self, events: Sequence[Event]) -> None:
        """Add whole steps' events; a step seen before (a late event of it) is not counted
        again as a step."""
        self.add_rows((e.step, e.phase, e.start, e.end, e.nbytes) for e in events)

    def add_rows(self, rows: Iterable[tuple[int, str, float, float, int]]) -> None:
        """:meth:`add` for events given as ``(step, phase, start, end, nbytes)`` rows."""
        steps: dict[int, list[float]] = {}  # step -> [first start, last end]
        phases: dict[tuple[int, str], list[Any]] = {}  # (step, phase) -> [start, end, bytes]
        order = self.order
        for step, phase, start, end, nbytes in rows:
            bounds = steps.get(step)
            if bounds is None:
                steps[step] = [start, end]
            else:
                bounds[0], bounds[1] = min(bounds[0], start), max(bounds[1], end)
            key = (step, phase)
            totals = phases.get(key)
            if totals is None:
                phases[key] = [start, end, nbytes]
                if phase not in order:
                    order[phase] = None
            else:
                totals[0], totals[1] = min(totals[0], start), max(totals[1], end)
                totals[2] += nbytes
        for step in sorted(steps):
            start, end = steps[step]
            if self.last_step is not None and step < self.last_step:
                continue  # late events of an older step: its length was counted
            if step == self.last_step:  # late events of the latest step may widen it
                start, end = min(start, self._last_bounds[0]), max(end, self._last_bounds[1])
                self.step_s -= self._last_bounds[1] - self._last_bounds[0]
            else:
                self.steps += 1
                self.last_step = step
            self._last_bounds = (start, end)
            self.step_s += end - start
        for (_, phase), (start, end, nbytes) in phases.items():
            self.time_s[phase] += end - start
            self.nbytes[phase] += nbytes

    def copy(self) -> PhaseTotals:
        other = PhaseTotals()
        other.time_s.update(self.time_s)
        other.nbytes.update(self.nbytes)
        other.order, other.steps, other.step_s = dict(self.order), self.steps, self.step_s
        other.last_step, other._last_bounds = self.last_step, self._last_bounds
        return other

    def summary(self) -> Summary:
        steps = max(self.steps, 1)
        rows = (
            {
                "phase": phase,
                "time_s": self.time_s[phase] / steps,
                "nbytes": int(self.nbytes[phase] / steps),
                # of the steps' time: the time column over the step's, in the same steps
                "share": self.time_s[phase] / self.step_s if self.step_s > 0 else 0.0,
            }
            for phase in self.order
        )
        return Summary(rows, step_s=self.step_s / steps)


def summary(events: Sequence[Event]) -> Summary:
    """Wall time of each phase per step (first start to last end, across devices), its bytes,
    and its share of the steps' wall time, averaged over steps.

    Phases overlap across devices (apply runs in parallel), so the time of a phase is its
    span, not the sum over devices. Shares need not add up to 100%: time outside every phase
    (the loss, Python between phases) is in none, and phases that overlap (an all-reduce
    during backward) are in both; the table says so under its rows.
    """
    totals = PhaseTotals()
    totals.add(events)
    return totals.summary()


class MemorySummary(list):
    """Per-device rows of one step's memory (bytes by category, ``counted``: their sum, and
    torch's allocator readings where there are any) that print as a table."""

    def __str__(self) -> str:
        if not self:
            return "no memory records"
        columns = [key for key in self[0] if key not in ("device", "step")]
        width = max(len(row["device"]) for row in self) + 2
        widths = [max(len(c), *(len(f"{row[c]:,d}") for row in self)) + 2 for c in columns]
        header = f"{'device':<{width}}" + "".join(f"{c:>{w}}" for c, w in zip(columns, widths))
        lines = [f"step {self[0]['step']}, bytes held", header, "-" * len(header)]
        for row in self:
            cells = "".join(f"{row[c]:>{w},d}" for c, w in zip(columns, widths))
            lines.append(f"{row['device']:<{width}}{cells}")
        return "\n".join(lines)


def memory_summary(records: Sequence[MemoryRecord], step: int | None = None) -> MemorySummary:
    """What each device held in ``step`` (default: the last): one row per device, a column
    per category, ``counted`` (the categories' sum; torch's allocator totals are not in it)."""
    if not records:
        return MemorySummary()
    step = max(r.step for r in records) if step is None else step
    chosen = [r for r in records if r.step == step]
    if not chosen:
        steps = sorted({r.step for r in records})
        raise ValueError(f"step={step} has no memory records; recorded steps: {steps}")
    present = dict.fromkeys(r.category for r in chosen)
    categories = [c for c in MEMORY_CATEGORIES if c in present]
    categories += [c for c in present if c not in MEMORY_CATEGORIES]
    counted = [c for c in categories if c not in ALLOCATOR_CATEGORIES]
    totals = [c for c in categories if c in ALLOCATOR_CATEGORIES]
    rows: dict[str, dict[str, Any]] = {}
    for record in chosen:
        row = rows.setdefault(
            record.device, {"device": record.device, "step": step, **dict.fromkeys(counted, 0)}
        )
        row[record.category] = row.get(record.category, 0) + record.nbytes
    for row in rows.values():
        row["counted"] = sum(row[c] for c in counted)
        for category in totals:
            row[category] = row.pop(category, 0)  # after "counted": not part of it
    return MemorySummary(rows.values())


def chrome_trace(events: Sequence[Event], origin: float) -> dict[str, Any]:
    """The Trace Event Format: one process, one thread (track) per device, "X" events."""
    tracks = {name: i for i, name in enumerate(dict.fromkeys(e.device for e in events))}
    trace_events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": hardware_label(events)}}
    ]
    trace_events += [
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": name}}
        for name, tid in tracks.items()
    ]
    trace_events += [
        {
            "name": e.phase,
            "cat": BACKWARD if e.phase in BACKWARD_PHASES else FORWARD,
            "ph": "X",
            "ts": (e.start - origin) * 1e6,
            "dur": e.duration * 1e6,
            "pid": 1,
            "tid": tracks[e.device],
            "args": {"step": e.step, "nbytes": e.nbytes, "kind": e.kind, **e.details},
        }
        for e in events
    ]
    return {"traceEvents": trace_events, "displayTimeUnit": "ms"}


def write_chrome_trace(events: Sequence[Event], origin: float, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(chrome_trace(events, origin), default=str, separators=(",", ":")))
    return path
