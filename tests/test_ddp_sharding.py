"""ZeRO-1 and FSDP hold what they promise, measured on two gloo ranks beside DDP: Adam's
state split over the ranks (ZeRO-1), and parameters, gradients and state all split (FSDP2's
fully_shard); the ZeRO paper's arithmetic predicts each. One launch serves the module."""

from __future__ import annotations

import pytest

from dpkit.ddp import sharding

RANKS = 2


@pytest.fixture(scope="module")
def rows():
    found = {}
    for row in sharding.measure(ranks=RANKS, width=256):
        found[row["engine"], row["rank"]] = row
    return found


def total(rows, engine, category):
    return sum(rows[engine, rank][category] for rank in range(RANKS))


def test_ddp_holds_everything_on_every_rank(rows):
    for rank in range(RANKS):
        row = rows["ddp", rank]
        assert row["parameters"] == row["gradients"] == row["model bytes"]
        assert row["optimizer state"] == 2 * row["model bytes"]  # Adam's two moments


def test_zero1_splits_the_optimizer_state_only(rows):
    model = rows["ddp", 0]["model bytes"]
    for rank in range(RANKS):
        row = rows["zero1", rank]
        assert row["parameters"] == row["gradients"] == model
        assert 0 < row["optimizer state"] < 2 * model
    assert total(rows, "zero1", "optimizer state") == 2 * model


def test_fsdp_splits_parameters_gradients_and_state(rows):
    model = rows["ddp", 0]["model bytes"]
    for category, whole in (("parameters", model), ("gradients", model),
                            ("optimizer state", 2 * model)):  # fmt: skip
        assert total(rows, "fsdp", category) == whole
        for rank in range(RANKS):
            assert rows["fsdp", rank][category] == whole // RANKS  # even shards here
            assert rows["fsdp", rank][category] == rows["fsdp", rank][f"predicted {category}"]


def test_the_bytes_each_engine_sends_are_the_zero_papers(rows):
    """Counted from the collectives each engine called in one step (a ring's share of each
    payload): DDP all-reduces the gradients, 2 (n-1)/n of the model; ZeRO-1 adds a broadcast
    of the updated parameters, (n-1)/n; FSDP all-gathers the parameters twice (forward and
    backward) and reduce-scatters the gradients: 3 (n-1)/n, 1.5x DDP's."""
    model = rows["ddp", 0]["model bytes"]
    share = (RANKS - 1) / RANKS * model
    for rank in range(RANKS):
        assert rows["ddp", rank]["sent"] == {"all-reduce": pytest.approx(2 * share, rel=1e-3)}
        zero1 = rows["zero1", rank]["sent"]
        assert zero1 == {"all-reduce": pytest.approx(2 * share, rel=1e-3),
                         "broadcast": pytest.approx(share, rel=1e-3)}  # fmt: skip
        fsdp = rows["fsdp", rank]["sent"]
        assert fsdp["all-gather"] == pytest.approx(2 * share, rel=0.01)  # shards may pad
        assert fsdp["reduce-scatter"] == pytest.approx(share, rel=0.01)
        assert sum(fsdp.values()) / sum(rows["ddp", rank]["sent"].values()) == pytest.approx(
            1.5, rel=0.01
        )
