"""What a sharding rank records, run in this process as a world of one (dpkit.ddp.sharding's
rank side): the bytes it holds, the activations its forward saved and its collectives'
payloads, each counted by hand.

``wide_mlp(width=64, hidden=2)``: 784 -> 64 -> 64 -> 64 -> 10, 59,210 float32 parameters
(50,176 + 64, 4,096 + 64 twice, 640 + 10): 236,840 bytes; Adam keeps two copies. One rank
holds every shard, so every engine holds the same; what differs is what it sends.
"""

from __future__ import annotations

import gc

import pytest
import torch.distributed as dist

from dpkit.ddp import sharding

WIDTH, ROWS, STEPS = 64, 16, 2
PARAMETER_BYTES = 4 * (784 * 64 + 64 + 2 * (64 * 64 + 64) + 64 * 10 + 10)
PER_PARAMETER = sorted(4 * n for n in (784 * 64, 64, 64 * 64, 64, 64 * 64, 64, 64 * 10, 10))
# Saved for backward: the three ReLUs' outputs (ROWS x 64 floats each), the loss's
# log-softmax (ROWS x 10 floats), the labels (ROWS int64) and its total weight (one
# float); the input and the parameters are not activations.
SAVED = 3 * ROWS * 64 * 4 + ROWS * 10 * 4 + ROWS * 8 + 4


@pytest.fixture(scope="module")
def runs():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield {engine: sharding.train_engine(engine, WIDTH, ROWS, STEPS)
               for engine in sharding.ENGINES}  # fmt: skip
    finally:
        gc.collect()  # DDP's reducers before their group
        dist.destroy_process_group()


@pytest.mark.parametrize("engine", sharding.ENGINES)
def test_one_rank_holds_everything_and_saves_the_activations_counted_by_hand(runs, engine):
    run = runs[engine]
    assert (run["rank"], run["engine"]) == (0, engine)
    assert run["parameters"] == run["gradients"] == PARAMETER_BYTES
    assert run["optimizer state"] == 2 * PARAMETER_BYTES  # Adam's two moments
    assert run["activations"] == SAVED
    calls = [(e[0], e[4]) for e in run["events"] if e[0] in ("apply", "backward", "optimizer")]
    assert calls == [(phase, step) for step in (1, 2) for phase in ("apply", "backward",
                                                                   "optimizer")]  # fmt: skip
    starts = [e[1] for e in run["events"]]
    assert starts == sorted(starts) and all(e[1] <= e[2] for e in run["events"])


def payloads(run, phase: str, step: int) -> list[int]:
    return sorted(e[3] for e in run["events"] if e[0] == phase and e[4] == step)


def test_ddp_all_reduces_the_gradients_and_zero1_broadcasts_each_parameter(runs):
    for step in (1, 2):
        assert payloads(runs["ddp"], "allreduce", step) == [PARAMETER_BYTES]  # one bucket
        assert payloads(runs["zero1"], "allreduce", step) == [PARAMETER_BYTES]
        assert payloads(runs["zero1"], "broadcast", step) == PER_PARAMETER
    # FSDP gathers and scatters nothing when one rank holds every shard
    assert {e[0] for e in runs["fsdp"]["events"]} == {"apply", "backward", "optimizer"}
    # a ring sends 2 (n - 1) / n of an all-reduce's bytes from each rank: none from one
    assert runs["ddp"]["sent"] == {"all-reduce": 0}
    assert runs["zero1"]["sent"] == {"all-reduce": 0, "broadcast": 0}
    for event in runs["zero1"]["events"]:
        if event[0] == "broadcast":
            assert event[5] == {"ring_sent_bytes": 0, "function": "torch.distributed.broadcast"}


def test_the_collectives_are_torch_s_again_afterwards(runs):
    assert dist.broadcast.__module__ == "torch.distributed.distributed_c10d"
    assert dist.all_reduce.__qualname__ == "all_reduce"
