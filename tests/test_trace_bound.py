"""Long runs: a trace keeps the last ``keep_steps`` steps, its summary covers all of them, its
memory stays flat over 10,000 steps, and dropping it gives its memory back.

Expectations come from an unbounded trace recording the same steps (nested traces see the
same events), from the records' own sizes, and from the process's memory, never from the
bounded trace itself.
"""

from __future__ import annotations

import gc
import math
import os
import tracemalloc
import weakref

import pytest
import torch
from lanes import lanes
from torch import nn

import dpkit
from dpkit import tracing
from dpkit.device import virtual_devices


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))


def train(steps: int, batch: int = 8) -> None:
    parallel = dpkit.DataParallel(mlp(), device_ids=lanes(4))
    x = torch.randn(batch, 5)
    for _ in range(steps):
        parallel(x).sum().backward()


def test_a_bounded_trace_keeps_the_last_steps_and_summarises_every_step():
    with dpkit.trace(keep_steps=None) as everything, dpkit.trace(keep_steps=5) as bounded:
        train(23)
    kept = sorted({e.step for e in bounded.events})
    assert kept == list(range(19, 24))
    assert bounded.events == [e for e in everything.events if e.step >= 19]
    assert bounded.memory == [r for r in everything.memory if r.step >= 19]
    assert bounded.dropped_steps == 18
    # the summary averages over all 23 steps, dropped ones included
    assert len({e.step for e in everything.events}) == 23
    for whole, kept_row in zip(everything.summary(), bounded.summary(), strict=True):
        assert kept_row["phase"] == whole["phase"]
        assert kept_row["nbytes"] == whole["nbytes"]
        assert math.isclose(kept_row["time_s"], whole["time_s"], rel_tol=1e-9)
        assert math.isclose(kept_row["share"], whole["share"], rel_tol=1e-9)
    assert str(bounded.memory_summary()) == str(everything.memory_summary())
    with pytest.raises(ValueError, match=r"step=3 was dropped.*keep_steps=5.*keep_steps=None"):
        bounded.memory_summary(step=3)


def test_the_first_kept_step_has_a_memory_summary_and_the_last_dropped_one_a_clear_error():
    with dpkit.trace(keep_steps=5) as bounded:
        train(23)
    assert str(bounded.memory_summary(step=19)).startswith("step 19, bytes")
    with pytest.raises(ValueError, match=r"^step=18 was dropped: .*keep_steps=5 .*from step 19"):
        bounded.memory_summary(step=18)


@pytest.mark.parametrize("keep, steps", [(1, 3), (8, 9)])
def test_a_closed_trace_holds_exactly_the_last_keep_steps(keep, steps):
    # While open, a trace drops steps in batches (a quarter of the bound at a time); when it
    # closes, it drops down to the bound: 9 steps kept 8 drop step 1 only then.
    with dpkit.trace(keep_steps=None) as everything, dpkit.trace(keep_steps=keep) as bounded:
        train(steps)
    first = steps - keep + 1
    assert sorted({e.step for e in bounded.events}) == list(range(first, steps + 1))
    assert bounded.memory == [r for r in everything.memory if r.step >= first]
    assert bounded.dropped_steps == steps - keep


def test_the_default_bound_is_documented_and_larger_than_a_course_run():
    assert dpkit.trace().keep_steps == tracing.recorder.DEFAULT_KEEP_STEPS >= 100
    assert dpkit.trace(keep_steps=None).keep_steps is None


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "10"])
def test_a_bad_bound_names_the_argument_and_the_fix(bad):
    with pytest.raises(ValueError, match=r"keep_steps must be a positive int.*keep_steps=100"):
        dpkit.trace(keep_steps=bad)


def _rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _synthetic_steps(steps: int, devices: list) -> None:
    """What a traced DataParallel step of 4 lanes records (30 events, 17 memory records,
    details like the primitives'), through the recorder's own entry points: thousands of
    steps in seconds."""
    for _ in range(steps):
        tracing.begin_step(devices)
        for device in devices:
            for collective in (tracing.Collective.SCATTER, tracing.Collective.BROADCAST):
                with tracing.copy_span(collective, device, rows=8, shape=(8, 5)) as span:
                    span.nbytes = 160
            with tracing.span(tracing.Phase.APPLY, device, replica=device.index):
                pass
            for category in ("input", "parameters", "activations", "outputs"):
                tracing.record_memory(device, category, 1 << 20)
        tracing.record_memory(devices[0], "gathered", 4096)
        for phase in ("grad_scatter", "backward", "reduce", "gather"):
            for device in devices:
                with tracing.span(phase, device):
                    pass
        with tracing.host_span(tracing.Phase.REPLICATE, devices[0], what="modules"):
            pass
        with tracing.copy_span(tracing.Collective.REDUCE, devices[0], what="sum"):
            pass


EVENTS, RECORDS = 30, 17  # a step of _synthetic_steps, as a DataParallel step of 4 lanes


def _stored_bytes(trace: dpkit.Trace) -> int:
    """Bytes of the columns a trace keeps its events and memory records in."""
    events, memory = trace._event_columns, trace._memory_columns
    arrays = [events.label, events.start, events.end, events.nbytes, events.step]
    arrays += [memory.label, memory.nbytes, memory.step]
    return sum(a.itemsize * len(a) for a in arrays) + 8 * len(events.details)


def _small_steps(steps: int, devices: list) -> None:
    """A cheaper step than _synthetic_steps (a quarter of its records), for 10,000 steps."""
    for step in range(steps):
        tracing.begin_step(devices)
        for device in devices:
            with tracing.copy_span(tracing.Collective.SCATTER, device, rows=step % 7) as span:
                span.nbytes = 160
            tracing.record_memory(device, "input", 160)
        with tracing.copy_span(tracing.Collective.REDUCE, devices[0], what="sum"):
            pass


def test_memory_stays_flat_over_10000_traced_steps_with_the_bound():
    devices = virtual_devices(4, on="cpu")
    with dpkit.trace(keep_steps=200) as tr:
        _small_steps(1000, devices)
        gc.collect()
        rss_1000, stored_1000 = _rss_mib(), _stored_bytes(tr)
        _small_steps(9000, devices)
        gc.collect()
        rss_10000, stored_10000 = _rss_mib(), _stored_bytes(tr)
    assert sorted({e.step for e in tr.events}) == list(range(9801, 10001))
    assert len(tr.memory) == 200 * 4
    assert tr.dropped_steps == 9800
    # what the trace stores stops growing at the bound (plus the quarter it drops in batches)
    assert stored_10000 <= stored_1000
    assert rss_10000 - rss_1000 < 20, (rss_1000, rss_10000)


def _traced_and_dropped(devices: list) -> tuple[int, int, weakref.ref]:
    """Bytes a traced run of 50 steps holds, bytes left after dropping it, and the trace."""
    before = tracemalloc.get_traced_memory()[0]
    with dpkit.trace(keep_steps=None) as tr:
        _synthetic_steps(50, devices)
    tr.summary()  # reading builds objects, which go with the reader
    held = tracemalloc.get_traced_memory()[0] - before
    alive = weakref.ref(tr)
    del tr
    return held, tracemalloc.get_traced_memory()[0] - before, alive


def test_a_record_costs_tens_of_bytes_and_dropping_the_trace_gives_them_back():
    devices = virtual_devices(4, on="cpu")
    gc.collect()
    gc.disable()  # freed by reference counts alone: nothing global holds it, no cycle
    tracemalloc.start()
    try:
        # The first run fills Python's free lists of tuples, lists and floats (kept for
        # reuse, held by no one); the second is measured.
        _traced_and_dropped(devices)
        held, left, alive = _traced_and_dropped(devices)
    finally:
        tracemalloc.stop()
        gc.enable()
    assert alive() is None
    records = 50 * (EVENTS + RECORDS)
    assert held / records < 80, f"{held / records:.0f} bytes a record"
    assert left < held / 20, f"{left} of {held} bytes still held after the trace was dropped"


def test_a_synthetic_step_records_what_a_data_parallel_step_of_4_lanes_does():
    with dpkit.trace() as real:
        train(1)
    with dpkit.trace() as synthetic:
        _synthetic_steps(1, virtual_devices(4, on="cpu"))
    assert (len(real.events), len(real.memory)) == (EVENTS, RECORDS)
    assert (len(synthetic.events), len(synthetic.memory)) == (EVENTS, RECORDS)


def test_events_read_from_a_trace_are_copies_the_trace_does_not_share():
    with dpkit.trace() as tr:
        train(2)
    first = tr.events[0]
    first.details["changed"] = True
    first.nbytes = -1
    assert "changed" not in tr.events[0].details and tr.events[0].nbytes != -1
