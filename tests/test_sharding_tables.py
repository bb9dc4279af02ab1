"""What notebook 09 prints about ZeRO-1 and FSDP, from rows written here by hand (times in
seconds on one clock, bytes made up): the traces, a typical step, the step table beside
its predictions, and the predicted step of each engine (dpkit.ddp.sharding)."""

from __future__ import annotations

import pytest
import torch

import dpkit.cost as cost
from dpkit.ddp import sharding

LINK = cost.Link(1000.0, 0.5, "made up: 1 kB/s, 0.5 s a step")


def step(start: float, end: float, number: int, broadcasts: list[tuple[float, float]]):
    """One rank's step: forward, backward, ZeRO-1's broadcasts of 400 bytes, optimizer."""
    middle = start + (end - start) / 2
    return [
        ("apply", start, start + 1, 0, number, {}),
        ("backward", start + 1, middle, 0, number, {}),
        *[("broadcast", a, b, 400, number, {}) for a, b in broadcasts],
        ("optimizer", middle, end, 0, number, {}),
    ]


def row(rank: int, events: list, engine: str = "zero1") -> dict:
    return {"engine": engine, "rank": rank, "events": events, "parameters": 800,
            "gradients": 800, "optimizer state": 800, "link": (2000.0 + rank, 0.25)}  # fmt: skip


# Rank 0's steps: 0-4 s, 10-13.5 s, 20-25 s; rank 1 ends each 0.2 s later.
ROWS = [
    row(0, step(0, 4, 1, [(3.0, 3.5)]) + step(10, 13.5, 2, [(12, 12.5), (12.2, 12.4)])
        + step(20, 25, 3, [(22, 23)])),
    row(1, step(0.5, 4.2, 1, [(3.1, 3.6)]) + step(10.1, 13.7, 2, [(12, 12.6)])
        + step(20.1, 25.2, 3, [(22, 23.1)])),
]  # fmt: skip


def test_a_trace_per_engine_has_a_track_per_rank_and_what_it_held():
    (trace,) = sharding.traces(ROWS).values()
    assert sorted({e.device for e in trace.events}) == ["rank:0 (cpu)", "rank:1 (cpu)"]
    assert len(trace.events) == sum(len(r["events"]) for r in ROWS)
    held = {(m.device[:6], m.category, m.step): m.nbytes for m in trace.memory}
    assert held == {(f"rank:{rank}", category, 3): 800 for rank in (0, 1)
                    for category in ("parameters", "gradients", "optimizer state")}  # fmt: skip
    assert sharding.step_seconds(trace, 1) == pytest.approx(4.2)  # 0 to rank 1's 4.2
    assert sharding.step_seconds(trace) == pytest.approx(5.2)  # the last: 20 to 25.2
    # The step of median length after the first (3.7 and 5.2 s): the lower of the two.
    assert sharding.typical_step(trace) == 2


def test_the_step_table_gives_rank_0_s_collectives_beside_the_ring_formulas():
    traces = sharding.traces(ROWS)
    table = sharding.step_table(traces, {"zero1": 2}, {"zero1": 3.0}, LINK)
    # Two broadcasts of 400 bytes overlapping from 12 to 12.5 s: 0.5 s busy, not 0.7. Each
    # predicted S / B + (n - 1) alpha = 0.4 + 0.5 s, one after the other: 1.8 s.
    assert list(table) == [
        {"engine": "zero1", "step": 2, "what": "the step", "calls": 1, "payload_bytes": 0,
         "measured_ms": pytest.approx(3700), "predicted_ms": pytest.approx(3000)},
        {"engine": "zero1", "step": 2, "what": "rank 0's broadcast", "calls": 2,
         "payload_bytes": 800, "measured_ms": pytest.approx(500),
         "predicted_ms": pytest.approx(1800)},
    ]  # fmt: skip


def test_rank_0_s_link_is_the_one_the_predictions_use():
    link = sharding.link_of(list(reversed(ROWS)))
    assert (link.bandwidth, link.latency) == (2000.0, 0.25)


def test_time_in_collectives_counts_overlaps_once():
    assert sharding.busy_seconds([]) == 0
    assert sharding.busy_seconds([(0, 2), (1, 3), (5, 6), (5.5, 5.8)]) == pytest.approx(4)
    assert sharding.busy_seconds([(1, 2), (2, 3)]) == pytest.approx(2)  # touching: both
    assert sharding.busy_seconds([(0, 4), (1, 2)]) == pytest.approx(4)  # inside: none more


def test_each_engine_s_collectives_are_priced_by_the_ring_formulas():
    # 1,200 bytes over 3 ranks at 1 kB/s, 0.5 s a step: a ring all-reduce 2 (n-1)/n S/B +
    # 2 (n-1) alpha = 1.6 + 2 s; an all-gather or a reduce-scatter half of it; a broadcast
    # S/B + (n-1) alpha = 1.2 + 1 s.
    price = sharding.predicted_collective_seconds
    assert price("allreduce", 1200, 3, LINK) == pytest.approx(3.6)
    assert price("allgather", 1200, 3, LINK) == pytest.approx(1.8)
    assert price("reduce_scatter", 1200, 3, LINK) == pytest.approx(1.8)
    assert price("broadcast", 1200, 3, LINK) == pytest.approx(2.2)
    ddp = type("Predicted", (), {"step_time": 10.0})
    assert sharding.predicted_step_seconds(ddp, 1200, 3, LINK) == pytest.approx(
        {"ddp": 10.0, "zero1": 12.2, "fsdp": 11.8}
    )


def test_the_zero_paper_s_bytes_per_rank_by_hand():
    # 1,000 bytes of parameters, Adam's two moments, 4 ranks; an odd count floors
    assert sharding.predicted_bytes(1000, 4, "ddp") == {
        "parameters": 1000, "gradients": 1000, "optimizer state": 2000}  # fmt: skip
    assert sharding.predicted_bytes(1000, 4, "zero1") == {
        "parameters": 1000, "gradients": 1000, "optimizer state": 500}  # fmt: skip
    assert sharding.predicted_bytes(1001, 4, "fsdp", state_copies=1) == {
        "parameters": 250, "gradients": 250, "optimizer state": 250}  # fmt: skip
    assert isinstance(sharding.predicted_bytes(1001, 3, "zero1")["optimizer state"], int)


@pytest.mark.parametrize("ranks", [1, 0, 2.0, True])
def test_sharding_is_measured_on_two_ranks_or_more(ranks):
    with pytest.raises(ValueError, match=r"ranks=.*2 ranks or more.*pass e.g. ranks=2"):
        sharding.measure(ranks=ranks)


def test_the_ddp_prediction_is_dpkit_predict_s_on_the_measured_link():
    """Notebook 09's prediction of DDP's step (``wide_mlp``, 2 ranks): a slower link only
    lengthens the all-reduce of its 236,840 bytes of gradients."""
    fast = sharding.ddp_prediction(64, 16, 2, cost.Link(1e9, 1e-6, "fast"))
    slow = sharding.ddp_prediction(64, 16, 2, cost.Link(1e6, 1e-6, "slow"))
    sent = [e for e in slow.events if e.phase == "allreduce"]
    assert sum(e.nbytes for e in sent) == 2 * 4 * 59_210  # every gradient, on each of 2 devices
    assert len({e.device for e in slow.events if e.phase == "apply"}) == 2
    # 2 (n-1)/n S/B more on the slow link: 0.237 s, where the fast one takes 0.24 ms
    assert slow.step_time - fast.step_time == pytest.approx(236_840 / 1e6 - 236_840 / 1e9, rel=0.05)


def test_the_ring_s_link_from_two_all_reduce_times_by_hand():
    # 4 ranks: a tiny all-reduce is 2 x 3 ring steps of 10 us; 3 MB puts 2 x 3/4 x 3 MB =
    # 4.5 MB on each rank's wire, 4.5 ms at 1 GB/s, after those 60 us
    bandwidth, latency = sharding.ring_link(60e-6, 4.5e-3 + 60e-6, 3_000_000, 4)
    assert latency == pytest.approx(10e-6)
    assert bandwidth == pytest.approx(1e9)
    # a large all-reduce read faster than the tiny one's latency (noise): its whole time
    assert sharding.ring_link(60e-6, 50e-6, 3_000_000, 4)[0] == pytest.approx(4.5e6 / 50e-6)
    # exactly all latency (2 ranks: 2 steps of 0.25 s), no time left for the bytes: the same
    assert sharding.ring_link(0.5, 0.5, 1000, 2) == (1000 / 0.5, 0.25)


def test_a_collective_s_payload_is_its_whole_tensor():
    shard, whole = torch.zeros(2), torch.zeros(8)  # float32: 8 and 32 bytes
    # all-gather (output, input): the gathered output; reduce-scatter (output, input): the input
    assert sharding._payload("all_gather_into_tensor", (whole, shard), {}) == 32
    assert sharding._payload("reduce_scatter_tensor", (shard, whole), {}) == 32
    assert sharding._payload("reduce_scatter_tensor", (), {"output": shard, "input": whole}) == 32
    assert sharding._payload("all_gather_into_tensor", (), {"output_tensor": whole}) == 32
    assert sharding._payload("all_reduce", (), {"tensor": shard}) == 8
    assert sharding._payload("broadcast", (), {}) == 0


def test_a_rank_s_main_reads_its_options_and_trains_each_engine_named(monkeypatch, tmp_path):
    """sharding_main as a world of one runs it (the ring's link is made up: one rank has no
    ring to time): each engine named, in order, at the width, batch and steps given."""
    monkeypatch.setattr(sharding, "measure_link", lambda: (1e9, 1e-5))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    threads = torch.get_num_threads()
    try:
        rows = sharding.sharding_main(["--init-method", (tmp_path / "store").as_uri(),
                                       "--engines", "zero1,ddp", "--width", "32", "--steps",
                                       "1", "--batch", "4"])  # fmt: skip
        assert torch.get_num_threads() == 1  # a rank's one intra-op thread
    finally:
        torch.set_num_threads(threads)
    assert [(row["engine"], row["link"]) for row in rows] == [("zero1", (1e9, 1e-5)),
                                                             ("ddp", (1e9, 1e-5))]  # fmt: skip
    # 784 -> 32 -> 32 -> 32 -> 10: 25,088 + 32 + 2 x (1,024 + 32) + 320 + 10 floats
    assert all(row["parameters"] == 4 * 27_562 for row in rows)
    # saved for backward at 4 rows: three ReLUs' 4 x 32 floats, the log-softmax's 4 x 10,
    # the labels' 4 int64 and the loss's total weight (tests/test_sharding_one_rank.py)
    assert all(row["activations"] == 3 * 4 * 32 * 4 + 4 * 10 * 4 + 4 * 8 + 4 for row in rows)
    assert {event[4] for row in rows for event in row["events"]} == {1}  # one step
    assert not torch.distributed.is_initialized()  # the group was destroyed
