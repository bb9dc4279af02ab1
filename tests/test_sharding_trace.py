"""Every collective DDP, ZeRO-1 and FSDP issue in a step is an event in the trace, on its
rank's track, in the format of DDP's traces: which collective, its payload's bytes, when it
started (inside the call that issued it) and how long it ran; notebook 09 draws them as
timelines beside the cost model's step. One launch of two gloo ranks serves the module."""

from __future__ import annotations

import pytest
from matplotlib.collections import PolyCollection

import dpkit.cost as cost
from dpkit.ddp import sharding
from dpkit.viz import sharding as figure
from dpkit.viz.figures import SIDE_BAND

RANKS, STEPS = 2, 2
ISSUED = {"ddp": {"allreduce"}, "zero1": {"allreduce", "broadcast"},
          "fsdp": {"allgather", "reduce_scatter"}}  # fmt: skip


@pytest.fixture(scope="module")
def rows():
    return sharding.measure(ranks=RANKS, width=256, steps=STEPS)


@pytest.fixture(scope="module")
def traces(rows):
    return sharding.traces(rows)


def last_step(trace, rank, phases=sharding.COLLECTIVE_PHASES):
    device = f"rank:{rank} (cpu)"
    return [e for e in trace.events if e.step == STEPS and e.device == device and e.phase in phases]


def test_each_engines_collectives_are_events_on_every_ranks_track(traces):
    assert set(traces) == set(ISSUED)
    for engine, trace in traces.items():
        for rank in range(RANKS):
            events = last_step(trace, rank)
            assert {e.phase for e in events} == ISSUED[engine], engine
            for event in events:
                assert event.nbytes > 0 and event.end >= event.start and event.kind == "rank"
                assert event.details["ring_sent_bytes"] == pytest.approx(
                    event.nbytes * (1 if event.phase != "allreduce" else 2) / RANKS, abs=1
                )


def test_the_events_bytes_are_what_each_engine_moves(rows, traces):
    """Per step, payloads: DDP all-reduces the gradients once (the model's bytes); ZeRO-1
    also broadcasts every parameter once; FSDP all-gathers every parameter twice (forward,
    backward) and reduce-scatters every gradient once. The events add up to the bytes
    counted per collective (``sent``)."""
    model = rows[0]["model bytes"]
    for engine, trace in traces.items():
        for rank in range(RANKS):
            payload: dict[str, int] = {}
            for event in last_step(trace, rank):
                payload[event.phase] = payload.get(event.phase, 0) + event.nbytes
            expected = {
                "ddp": {"allreduce": model},
                "zero1": {"allreduce": model, "broadcast": model},
                "fsdp": {"allgather": 2 * model, "reduce_scatter": model},
            }[engine]
            assert payload == pytest.approx(expected, rel=0.01), engine  # FSDP's shards pad
            row = next(r for r in rows if r["engine"] == engine and r["rank"] == rank)
            sent = sum(e.details["ring_sent_bytes"] for e in last_step(trace, rank))
            assert sent == sum(row["sent"].values())


def test_each_collective_starts_inside_the_call_that_issues_it(traces):
    """One clock for the calls and the collectives: FSDP gathers the layers in the forward
    and again in backward, where it reduce-scatters; DDP's all-reduces run from backward;
    ZeRO-1 broadcasts the updated parameters from inside optimizer.step()."""
    where = {
        "ddp": {"allreduce": ("backward",)},
        "zero1": {"allreduce": ("backward",), "broadcast": ("optimizer",)},
        "fsdp": {"allgather": ("apply", "backward"), "reduce_scatter": ("backward",)},
    }
    for engine, trace in traces.items():
        for rank in range(RANKS):
            calls = {e.phase: e for e in last_step(trace, rank, ("apply", "backward", "optimizer"))}
            assert set(calls) == {"apply", "backward", "optimizer"}
            seen = set()
            for event in last_step(trace, rank):
                inside = [c for c, call in calls.items() if call.start <= event.start <= call.end]
                assert inside and inside[0] in where[engine][event.phase], (engine, event)
                seen.add(inside[0])
            if engine == "fsdp":
                assert seen == {"apply", "backward"}  # gathered for forward and for backward


def test_the_figure_draws_every_collective_on_its_communication_track(traces):
    predicted = {"ddp": 0.004, "zero1": 0.005, "fsdp": 0.006}
    drawn = figure.engine_timelines(traces, predicted)
    for ax, (engine, trace) in zip(drawn.axes, traces.items()):
        collectives = [e for r in range(RANKS) for e in last_step(trace, r)]
        bottoms = [c.get_paths()[0].vertices[:, 1].min()
                   for c in ax.collections if isinstance(c, PolyCollection)]  # fmt: skip
        lower = [y for y in bottoms if y - round(y) == pytest.approx(SIDE_BAND[0])]
        assert len(lower) == len(collectives), engine
        assert any(line.get_xdata()[0] == pytest.approx(predicted[engine] * 1e3)
                   for line in ax.get_lines())  # fmt: skip
        assert f"{predicted[engine] * 1e3:.1f} ms predicted" in ax.get_title(loc="left")


def test_the_predicted_collectives_are_the_ring_formulas(rows):
    bandwidth, latency = rows[0]["link"]
    assert 0 < bandwidth < float("inf") and latency > 0
    link = cost.Link(1e9, 1e-4)
    n, size = 4, 8e6
    half_ring = (n - 1) / n * size / 1e9 + (n - 1) * 1e-4  # n - 1 steps of 1/n of it
    for phase in ("allgather", "reduce_scatter"):
        assert sharding.predicted_collective_seconds(phase, size, n, link) == pytest.approx(
            half_ring
        )
    assert sharding.predicted_collective_seconds("allreduce", size, n, link) == pytest.approx(
        2 * half_ring
    )
    assert sharding.predicted_collective_seconds("broadcast", size, n, link) == pytest.approx(
        size / 1e9 + (n - 1) * 1e-4
    )


def test_activations_are_measured_and_no_engine_divides_them(rows):
    """Each rank keeps the activations of its own rows whatever the engine: what autograd
    saved in the forward, each storage once, parameters (FSDP's gathered ones) and the
    input left out: 3 ReLU outputs, log_softmax's output, the labels and nll_loss's
    total weight (0-d, float32)."""
    per_rank, width = 16 // RANKS, 256
    expected = 3 * per_rank * width * 4 + per_rank * 10 * 4 + per_rank * 8 + 4
    assert {(r["engine"], r["activations"]) for r in rows} == {
        (engine, expected) for engine in ISSUED
    }


def test_overlapping_collectives_count_once_in_the_time_spent_in_them():
    # ZeRO-1 issues its broadcasts together and then waits: their durations overlap
    assert sharding.busy_seconds([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)]) == 4.0
    assert sharding.busy_seconds([(0.0, 10.0), (1.0, 2.0)]) == 10.0
    assert sharding.busy_seconds([]) == 0.0
