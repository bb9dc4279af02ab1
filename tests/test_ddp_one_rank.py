"""What a rank records, run in this process: a world of one rank, so the rank's own code
(dpkit.ddp.rank, dpkit.ddp.record) runs where a test can see each number it produces.

The model is small enough to count by hand: Linear(4, 3), ReLU, Linear(3, 2) has 12 + 3 +
6 + 2 = 23 float32 parameters, 92 bytes; a batch of 6 rows of 4 floats is 96 bytes, its
logits 6 x 2 floats 48 bytes, and autograd saves the ReLU's output (6 x 3 floats, 72 bytes),
which the second Linear saves as its input too: one tensor. With one rank DDP's all-reduce
of the mean is the identity, so its gradients are plain training's.
"""

from __future__ import annotations

import gc
import os
import queue
import socket
import threading

import pytest
import torch
import torch.distributed as dist
from torch import nn

from dpkit.ddp import process, rank
from dpkit.ddp.record import with_waiting
from dpkit.ddp.workload import Workload, shard

ROWS, STEPS = 6, 2
PARAMETER_BYTES = (4 * 3 + 3 + 3 * 2 + 2) * 4
INPUT_BYTES, OUTPUT_BYTES, SAVED_BYTES = ROWS * 4 * 4, ROWS * 2 * 4, ROWS * 3 * 4


def small_model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))


def small_data(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch, 4), torch.randint(0, 2, (batch,))


WORKLOAD = Workload(model=small_model, data=small_data, seed=3, name="small")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# run_rank joins a group of its own (the other tests' group is one per test)
class Writes(list):
    """A rank's (step, stage) pair that keeps every stage it was set to, with the step then."""

    def __init__(self):
        super().__init__([0, 0])
        self.stages = []

    def __setitem__(self, index, value):
        super().__setitem__(index, value)
        if index == 1:
            self.stages.append((self[0], value))


@pytest.mark.parametrize("meeting", ["file", "port"])
def test_a_rank_joins_trains_each_cap_and_reports_its_runs(meeting, tmp_path, monkeypatch):
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        monkeypatch.delenv(name, raising=False)
    where = process.Progress(Writes(), 0)
    messages = queue.Queue()
    port = free_port() if meeting == "port" else None
    plan = rank.Plan(WORKLOAD, 1, ROWS, 1, "gloo", port, 30.0, bucket_caps=(25.0, 1e-6),
                     store=str(tmp_path / "store"))  # fmt: skip
    threads = torch.get_num_threads()
    try:
        rank.run_rank(0, where, messages, None, plan)
        assert torch.get_num_threads() == plan.threads  # ranks share the cores: one each
        assert dist.get_world_size() == 1
        assert len(rank._held) == (1 if meeting == "port" else 0)  # the store it serves
    finally:
        torch.set_num_threads(threads)
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()
        rank._held.clear()  # rank 0's store (its server owns the socket), when it served one
    kind, who, runs = messages.get_nowait()
    assert (kind, who) == ("done", 0)
    assert [(run.rank, run.bucket_cap_mb) for run in runs] == [(0, 25.0), (0, 1e-6)]
    assert all(held(run, "input", 1) == [INPUT_BYTES] for run in runs)  # the whole batch
    one_step = [(0, process.WRAPPING), (1, process.BEFORE_FORWARD), (1, process.FORWARD),
                (1, process.BACKWARD), (1, process.OPTIMIZER), (1, process.AFTER_OPTIMIZER),
                (1, process.AFTER_OPTIMIZER)]  # fmt: skip
    # what the parent reads while it waits: a hung rank is named with its step and stage
    assert where.shared.stages == [(0, process.CONNECTING), (0, process.PREPARING), *one_step,
                                   *one_step, (1, process.FINISHED)]  # fmt: skip
    assert messages.empty()
    # gloo's connections on the loopback interface only
    assert os.environ["GLOO_SOCKET_IFNAME"] == os.environ["NCCL_SOCKET_IFNAME"]
    assert os.environ["GLOO_SOCKET_IFNAME"] in ("lo", "lo0")  # Linux's name, macOS's


@pytest.fixture
def group(tmp_path):
    """This process alone joins through a FileStore, as every rank of ``run_ddp`` does."""
    store = tmp_path / "store"
    plan = rank.Plan(WORKLOAD, 1, ROWS, STEPS, "gloo", None, 30.0, store=str(store))
    rank.join_group(plan, 0)
    assert (dist.get_rank(), dist.get_world_size(), dist.get_backend()) == (0, 1, "gloo")
    yield plan
    gc.collect()  # DDP's reducers before their group (dpkit.ddp.rank.free_reducers)
    dist.destroy_process_group()


def train(plan: rank.Plan, bucket_cap_mb: float | None = 25.0, go=None, messages=None):
    """``run_rank``'s training part: the batch drawn and sharded as it does, then the runs."""
    torch.manual_seed(plan.workload.seed)
    batch = shard(plan.workload.data(plan.batch), 0, plan.nproc)
    where = process.Progress([0, 0], 0)
    runs = rank.train_runs(
        0, where, messages or queue.Queue(), go, plan, bucket_cap_mb, batch, torch.device("cpu")
    )
    return runs, where


def events_of(run, phase: str, step: int | None = None) -> list[tuple]:
    return [e for e in run.events if e[0] == phase and (step is None or e[4] == step)]


def held(run, category: str, step: int) -> list[int]:
    return [nbytes for name, nbytes, at in run.memory if name == category and at == step]


def plain_gradients() -> dict[str, torch.Tensor]:
    """Step 1's gradients without DDP: the same seed, model and rows."""
    torch.manual_seed(WORKLOAD.seed)
    inputs, targets = WORKLOAD.data(ROWS)
    torch.manual_seed(WORKLOAD.seed)
    model = small_model()
    nn.functional.cross_entropy(model(inputs), targets).backward()
    return {name: p.grad for name, p in model.named_parameters()}


def test_every_step_records_forward_backward_one_bucket_and_the_optimizer(group):
    (run,), where = train(group)
    assert (run.rank, run.device, run.bucket_cap_mb) == (0, "cpu", 25.0)
    assert run.parameter_bytes == PARAMETER_BYTES
    (replicate,) = events_of(run, "replicate")
    assert (replicate[3], replicate[4]) == (0, 1)  # rank 0 receives nothing from itself
    assert "constructor" in replicate[5]["what"] and "broadcast" in replicate[5]["what"]
    assert replicate[1] <= replicate[2] <= events_of(run, "apply", 1)[0][1]
    for step in range(1, STEPS + 1):
        (apply,) = events_of(run, "apply", step)
        assert apply[5] == {"rows": ROWS}
        (backward,) = events_of(run, "backward", step)
        (allreduce,) = events_of(run, "allreduce", step)  # 92 bytes: one bucket
        assert allreduce[3] == PARAMETER_BYTES
        # Step 1's bucket lists the parameters in the model's order; step 2's, rebuilt in
        # its forward, in the order their gradients became ready in step 1: last layer first
        in_order = ["0.weight", "0.bias", "2.weight", "2.bias"]
        assert allreduce[5]["parameters"] == (in_order if step == 1 else in_order[::-1])
        assert allreduce[5]["last_bucket"] is True
        (optimizer,) = events_of(run, "optimizer", step)
        assert apply[1] <= apply[2] <= backward[1] <= backward[2] <= optimizer[1] <= optimizer[2]
        waiting = backward[5]["waiting_s"]
        assert waiting == pytest.approx(max(0.0, allreduce[2] - backward[2]))
    assert len(run.step_times) == STEPS
    for (start, end), step in zip(run.step_times, range(1, STEPS + 1)):
        (apply,) = events_of(run, "apply", step)
        (optimizer,) = events_of(run, "optimizer", step)
        assert start <= apply[1] and optimizer[2] <= end
    assert where.shared == [STEPS, process.AFTER_OPTIMIZER]
    assert run.gradients is None  # not asked for


def test_memory_per_step_is_counted_by_hand(group):
    (run,), _ = train(group)
    for step in range(1, STEPS + 1):
        assert held(run, "parameters", step) == [PARAMETER_BYTES]
        assert held(run, "input", step) == [INPUT_BYTES]
        assert held(run, "outputs", step) == [OUTPUT_BYTES]
        assert held(run, "activations", step) == [SAVED_BYTES]
        assert held(run, "gradients", step) == [PARAMETER_BYTES]
        assert held(run, "buckets", step) == [PARAMETER_BYTES]  # a second copy of the grads


def test_gradient_as_bucket_view_leaves_no_second_copy_once_the_buckets_are_built(group):
    viewed = rank.Plan(**{**group.__dict__, "variants": ((), (("gradient_as_bucket_view", True),))})
    copied, view = train(viewed)[0]
    assert held(copied, "buckets", STEPS) == [PARAMETER_BYTES]
    assert held(view, "buckets", STEPS) == [0]
    assert held(view, "gradients", STEPS) == [PARAMETER_BYTES]


def test_step_one_s_gradients_are_plain_training_s_when_asked_for(group):
    (run,), _ = train(rank.Plan(**{**group.__dict__, "keep_gradients": True}))
    expected = plain_gradients()
    assert set(run.gradients) == set(expected)
    for name, gradient in expected.items():
        torch.testing.assert_close(torch.from_numpy(run.gradients[name]), gradient)


def test_a_small_cap_gives_each_parameter_its_own_bucket_from_step_two(group):
    # DDP's first step uses its 1 MiB first bucket; its buckets are rebuilt in step 2's
    # forward, each parameter (4 to 24 bytes) then over a cap of 1 byte.
    (run,), _ = train(group, bucket_cap_mb=1e-6)
    buckets = events_of(run, "allreduce", STEPS)
    assert sorted(e[3] for e in buckets) == sorted([4 * 3 * 4, 3 * 4, 3 * 2 * 4, 2 * 4])
    assert [e[5]["last_bucket"] for e in buckets].count(True) == 1
    assert run.bucket_cap_mb == 1e-6


def test_compression_sends_half_the_bytes(group):
    (run,), _ = train(rank.Plan(**{**group.__dict__, "compression": "bf16"}))
    (allreduce,) = events_of(run, "allreduce", 1)
    assert allreduce[3] == PARAMETER_BYTES // 2
    assert allreduce[5]["compression"] == "bf16"


def test_blocks_wait_for_the_parent_s_go_and_time_out_without_it(group):
    blocks = rank.Plan(**{**group.__dict__, "blocks": 2, "steps": 1, "timeout": 0.5})
    go, messages = threading.Semaphore(2), queue.Queue()
    (run,), _ = train(blocks, go=go, messages=messages)
    assert [messages.get_nowait() for _ in range(2)] == [("waiting", 0, 0), ("waiting", 0, 1)]
    assert len(run.step_times) == 2  # one step per block
    with pytest.raises(TimeoutError, match="never started block 0"):
        train(blocks, go=threading.Semaphore(0))


def forward_only(model, inputs, targets, optimizer):
    with torch.no_grad():
        model(inputs)


def test_a_step_without_backward_holds_no_gradients_or_buckets(group):
    (run,), _ = train(rank.Plan(**{**group.__dict__, "workload": Workload(
        model=small_model, data=small_data, step=forward_only, seed=3)}))  # fmt: skip
    assert {e[0] for e in run.events} == {"replicate", "apply"}
    for step in range(1, STEPS + 1):
        assert held(run, "gradients", step) == [0]
        assert held(run, "buckets", step) == [0]
        assert held(run, "activations", step) == [0]  # no graph: nothing saved
        assert held(run, "outputs", step) == [OUTPUT_BYTES]


def test_the_wait_after_backward_is_until_the_step_s_last_all_reduce_ends():
    # Step 1: the backward ends at 4; its all-reduces end at 6 and then 5: waits 2.
    # Step 2: one all-reduce, ended at 9, before the backward's end at 10: no wait.
    # Step 3: a backward with no all-reduce (no_sync): no wait.
    events = [
        ("backward", 1.0, 4.0, 0, 1, {}),
        ("allreduce", 3.0, 6.0, 8, 1, {}),
        ("allreduce", 4.0, 5.0, 8, 1, {}),
        ("allreduce", 7.0, 9.0, 8, 2, {}),
        ("backward", 7.0, 10.0, 0, 2, {}),
        ("backward", 11.0, 12.0, 0, 3, {"kept": True}),
    ]
    waited = {e[4]: e[5] for e in with_waiting(events) if e[0] == "backward"}
    assert waited == {1: {"waiting_s": 2.0}, 2: {"waiting_s": 0.0},
                      3: {"kept": True, "waiting_s": 0.0}}  # fmt: skip
    assert [e for e in with_waiting(events) if e[0] == "allreduce"] == events[1:4]
