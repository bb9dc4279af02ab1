"""What a trace's exports promise the tools and people that read them: Chrome trace JSON that
Perfetto lays out right (one process, a track per device, microseconds), and summary tables
whose numbers and columns line up. Found missing by mutation testing (``make mutation``).
"""

from __future__ import annotations

import importlib
import json
import re

import pytest
import torch
from torch import nn

import dpkit
from dpkit import tracing
from dpkit.device import VIRTUAL_CPU
from dpkit.tracing import KIND_LABELS, PREDICTED, export
from dpkit.tracing.events import ALLOCATED, Event, MemoryRecord
from dpkit.tracing.export import covered, gaps_note

recorder = importlib.import_module("dpkit.tracing.recorder")


@pytest.fixture(scope="module")
def traced():
    """Two traced DataParallel steps on two CPU lanes."""
    torch.manual_seed(0)
    lanes = dpkit.virtual_devices(2)
    model = dpkit.DataParallel(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)), lanes)
    with dpkit.trace() as tr:
        for _ in range(2):
            model(torch.randn(6, 8)).sum().backward()
    return tr


def test_chrome_trace_is_one_process_with_a_track_per_device(traced, tmp_path):
    path = traced.to_chrome_trace(tmp_path / "new" / "folder" / "trace.json")
    document = json.loads(path.read_text())
    assert document["displayTimeUnit"] == "ms"
    meta = [e for e in document["traceEvents"] if e["ph"] == "M"]
    spans = [e for e in document["traceEvents"] if e["ph"] == "X"]
    (process,) = [e for e in meta if e["name"] == "process_name"]
    assert process["args"]["name"] == KIND_LABELS[VIRTUAL_CPU]
    threads = {e["tid"]: e for e in meta if e["name"] == "thread_name"}
    assert sorted(t["args"]["name"] for t in threads.values()) == [
        "virtual:0 (cpu)",
        "virtual:1 (cpu)",
    ]
    # Perfetto draws a thread's events on its track only when their pids agree.
    assert {t["pid"] for t in threads.values()} == {process["pid"]}
    assert {e["pid"] for e in spans} == {process["pid"]}
    events = traced.events
    assert len(spans) == len(events)
    for event, span in zip(events, spans):
        assert threads[span["tid"]]["args"]["name"] == event.device
        assert span["name"] == event.phase
        assert span["ts"] == pytest.approx((event.start - traced.origin) * 1e6, rel=1e-9)
        assert span["dur"] == pytest.approx(event.duration * 1e6, rel=1e-9)
        assert span["args"]["kind"] == VIRTUAL_CPU and span["args"]["step"] == event.step


def test_chrome_trace_writes_details_json_cannot_hold_as_text(tmp_path):
    event = Event(
        "custom", "virtual:0 (cpu)", 1.0, 1.5, 0, 1, VIRTUAL_CPU, {"dtype": torch.float16}
    )
    path = export.write_chrome_trace([event], 1.0, tmp_path / "a" / "b.json")
    (span,) = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]
    assert span["args"]["dtype"] == "torch.float16"
    assert span["ts"] == 0 and span["dur"] == pytest.approx(5e5)


def test_hardware_label_names_every_kind_and_kinds_it_does_not_know():
    def on(kind):
        return Event("apply", f"{kind}:0", 0.0, 1.0, kind=kind)

    assert export.hardware_label([on(VIRTUAL_CPU), on(PREDICTED)]) == (
        f"{KIND_LABELS[PREDICTED]} + {KIND_LABELS[VIRTUAL_CPU]}"
    )
    assert export.hardware_label([on("tpu-pod")]) == "tpu-pod"


def test_rows_carry_the_kind_of_device(traced):
    rows = traced.rows()
    assert set(rows["kind"]) == {VIRTUAL_CPU}
    assert (rows["start_s"] >= 0).all() and (rows["end_s"] >= rows["start_s"]).all()


def test_summary_prints_milliseconds_bytes_and_shares_in_columns(traced):
    summary = traced.summary()
    lines = str(summary).split("\n")
    assert lines[0].split() == ["phase", "time/step", "bytes/step", "share"]
    assert lines[1] == "-" * len(lines[0])
    assert len(lines) == 2 + len(summary) + 4  # a rule, the step's row and two lines of why
    step, ms, unit, share = lines[-3].split()
    assert (step, unit, share) == ("step", "ms", "100.0%")
    assert float(ms) == pytest.approx(summary.step_s * 1e3, abs=5e-4)
    for line, row in zip(lines[2:-4], summary):
        phase, ms, unit, nbytes, share = line.split()
        assert (phase, unit) == (row["phase"], "ms")
        assert float(ms) == pytest.approx(row["time_s"] * 1e3, abs=5e-4)
        assert int(nbytes.replace(",", "")) == row["nbytes"]
        assert float(share.rstrip("%")) == pytest.approx(row["share"] * 100, abs=0.05)


def test_a_step_that_took_no_time_has_no_share():
    events = [Event("scatter", "virtual:0 (cpu)", 2.0, 2.0, step=1, kind=VIRTUAL_CPU)]
    (row,) = export.summary(events)
    assert row["share"] == 0.0


def records(*rows):
    return [
        MemoryRecord(device, category, nbytes, step, VIRTUAL_CPU)
        for device, category, nbytes, step in rows
    ]


def test_memory_summary_adds_up_a_category_recorded_twice():
    (row,) = export.memory_summary(
        records(("virtual:0 (cpu)", "parameters", 100, 1), ("virtual:0 (cpu)", "parameters", 20, 1))
    )
    assert row["parameters"] == 120 and row["counted"] == 120


def test_allocator_totals_are_zero_where_a_device_has_none():
    table = export.memory_summary(
        records(
            ("virtual:0 (cpu)", "parameters", 10, 1),
            ("virtual:0 (cpu)", ALLOCATED, 4096, 1),
            ("virtual:1 (cpu)", "parameters", 10, 1),
        )
    )
    assert [row[ALLOCATED] for row in table] == [4096, 0]
    assert [row["counted"] for row in table] == [10, 10]
    str(table)  # prints, with the zero as a number


def test_memory_summary_prints_a_table_with_columns_two_spaces_apart():
    table = export.memory_summary(
        records(("virtual:0 (cpu)", "parameters", 1_234_567, 3), ("virtual:0 (cpu)", "input", 8, 3))
    )
    lines = str(table).split("\n")
    assert lines[0] == "step 3, bytes held"
    header, rule, row = lines[1:]
    assert rule == "-" * len(header)
    assert re.split(r" {2,}", header) == ["device", "parameters", "input", "counted"]
    assert re.split(r" {2,}", row) == ["virtual:0 (cpu)", "1,234,567", "8", "1,234,575"]
    # The device column is its widest name plus two; each number column is its widest cell
    # plus two, the cell right-aligned under its header.
    assert len(row) == len(header)
    assert header.index("parameters") == len("virtual:0 (cpu)") + 2 + 2
    for name, cell in [("parameters", "1,234,567"), ("input", "8"), ("counted", "1,234,575")]:
        end = header.index(name) + len(name)
        assert row[:end].endswith(cell) and row[end - len(cell) - 1] == " "
    ends = [header.index(name) + len(name) for name in ("parameters", "input", "counted")]
    assert [b - a for a, b in zip(ends, ends[1:])] == [len("input") + 2, len("1,234,575") + 2]
    assert export.memory_summary([]).__str__() == "no memory records"


def test_trace_memory_rows_list_each_record(traced):
    rows = traced.memory_rows()
    assert {"device", "category", "nbytes", "step"} <= set(rows.columns)
    assert len(rows) == len(traced.memory) > 0


def test_spans_of_phases_named_by_string_or_phase(traced):
    lane = dpkit.virtual_devices(1)[0]
    with dpkit.trace() as tr:
        with tracing.span("my_phase", lane):
            pass
        with tracing.span(tracing.Phase.SCATTER, lane):
            pass
        with recorder.host_span("my_host_work", lane):
            pass
        with recorder.host_span(tracing.Phase.REPLICATE, lane):
            pass
    assert [e.phase for e in tr.events] == ["my_phase", "scatter", "my_host_work", "replicate"]
    assert all(type(e.phase) is str for e in tr.events)


def test_memory_recorded_for_a_given_step_lands_in_that_step():
    lane = dpkit.virtual_devices(1)[0]
    with dpkit.trace() as tr:
        recorder.record_memory(lane, "parameters", 64, step=7)
    assert [(r.step, r.nbytes) for r in tr.memory] == [(7, 64)]


def test_covered_counts_overlaps_once_and_gaps_not_at_all():
    # 0-1 and 0.5-2 overlap (2 s together), 3-4 comes after a gap of 1 s: 3 s covered
    assert covered([(3.0, 4.0), (0.0, 1.0), (0.5, 2.0)]) == 3.0
    assert covered([(0.0, 2.0), (0.5, 1.0)]) == 2.0  # one inside another
    assert covered([]) == 0.0


def test_the_gaps_note_says_how_much_of_a_phases_span_its_events_take():
    def bucket(start, end):
        return Event("allreduce", "rank:0 (cpu)", start, end, 8, 2, "rank")

    # buckets 0-1 ms and 3-4 ms: the row spans 4 ms, the buckets take 2 of them
    note = gaps_note([bucket(0.0, 0.001), bucket(0.003, 0.004)], "allreduce", "rank 0's",
                     "all-reduces")  # fmt: skip
    assert note == (
        "  (allreduce's time runs from its first event to its last, gaps included: "
        "in the last step rank 0's 2 all-reduces took 2.000 ms of those 4.000 ms)"
    )
    back_to_back = [bucket(0.0, 0.001), bucket(0.001, 0.003)]
    assert gaps_note(back_to_back, "allreduce", "rank 0's", "all-reduces") is None
    assert gaps_note(back_to_back, "backward", "rank 0's", "passes") is None  # none of it
