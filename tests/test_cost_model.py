"""The cost model against answers worked out by hand: a 2-layer MLP on 2 devices of a made-up
GPU machine (every phase's time and bytes), memory per device, unit conversions, bucket
boundaries, and Hardware/Link refusing what makes no sense."""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import warnings

import pytest
import torch
from torch import nn

import dpkit.cost as cost
from dpkit.cost import Hardware, Link
from dpkit.cost.compute import op_time

TINY = 1e-12  # a host overhead too small to matter (validation wants every term above 0)
GB = 1e9


def made_up(**changes: object) -> Hardware:
    """A GPU machine with round numbers: 1 GFLOP/s, memory so fast that no op waits for it,
    a 1 GB/s device link with 1 us per message, host overheads of nothing."""
    link = Link(1 * GB, 1e-6, "made up")
    machine = Hardware(
        name="made-up", description="round numbers", device_name="toy", source="this test",
        peak_flops={"float32": 1e9}, matmul_efficiency=1.0, memory_bandwidth=1e15,
        memory_efficiency=1.0, memory_capacity=1e6, compute_units=2, host_to_device=link,
        device_to_device=link, node_to_node=link, devices_per_node=2, nodes=1,
        nics_per_node=1, peer_to_peer=True, virtual_lanes=False, op_overhead=TINY,
        backward_op_overhead=TINY, gil_handoff=TINY, thread_start=TINY, module_overhead=TINY,
        copy_overhead=TINY, step_overhead=TINY,
    )  # fmt: skip
    return dataclasses.replace(machine, **changes)


def two_layers() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


PARAMS = (8 * 4 + 8 + 2 * 8 + 2) * 4  # 232 bytes of float32
US = 1e-6


def spans(trace) -> dict[str, tuple[float, float]]:
    found: dict[str, tuple[float, float]] = {}
    for e in trace.events:
        first, last = found.get(e.phase, (e.start, e.end))
        found[e.phase] = (min(first, e.start), max(last, e.end))
    return found


def test_a_dataparallel_step_on_two_made_up_gpus_by_hand():
    trace = cost.predict(two_layers(), torch.randn(1, 4), 4, 2, made_up())
    got = spans(trace)
    # scatter: device 1's chunk, 2 rows x 4 floats = 32 B: 1 us + 32 ns
    scatter = 1 * US + 32e-9
    assert got["scatter"][1] == pytest.approx(scatter, abs=1e-10)
    # replicate: one NCCL broadcast of 232 B to 2 devices: 232 ns + 1 ring step of 1 us
    replicate = scatter + PARAMS / GB + 1 * US
    assert got["replicate"][1] == pytest.approx(replicate, abs=1e-10)
    # apply: 2 rows through Linear(4, 8) and Linear(8, 2): 2*2*4*8 + 2*2*8*2 = 192 FLOPs
    apply = replicate + 192e-9
    assert got["apply"] == pytest.approx((replicate, apply), abs=1e-10)
    # gather onto device 0: device 1's output, 2 rows x 2 floats = 16 B: 1 us + 16 ns
    gather = apply + 1 * US + 16e-9
    assert got["gather"][1] == pytest.approx(gather, abs=1e-10)
    # the output's gradient back to device 1, then each replica's backward: the weights'
    # gradients (2*2*2*8 and 2*2*8*4 FLOPs) and layer 2's input gradient (2*2*2*8): 256
    backward = gather + 1 * US + 16e-9 + 256e-9
    assert got["backward"][1] == pytest.approx(backward, abs=1e-10)
    # only then one NCCL reduce of the 232 B of gradients: 232 ns + 1 us
    reduce = backward + PARAMS / GB + 1 * US
    assert got["reduce"] == pytest.approx((backward, reduce), abs=1e-10)
    assert trace.step_time == pytest.approx(reduce, abs=1e-10)
    moved = {row["phase"]: row["nbytes"] for row in trace.summary()}
    assert moved == {"scatter": 32, "replicate": PARAMS, "apply": 0, "gather": 16,
                     "grad_scatter": 16, "backward": 0, "reduce": PARAMS}  # fmt: skip


def test_a_dataparallel_step_with_host_costs_on_two_made_up_gpus_by_hand():
    """The step above with the host's costs, each a round number of microseconds: where the
    host, not the GPUs, sets the pace (a thread's start, the GIL, dpkit's Python)."""
    machine = made_up(op_overhead=1 * US, copy_overhead=2 * US, backward_op_overhead=0.5 * US,
                      step_overhead=4 * US, thread_start=3 * US, gil_handoff=0.25 * US,
                      module_overhead=0.1 * US)  # fmt: skip
    profiled = cost.profile(two_layers(), torch.randn(1, 4))
    # the inputs to the arithmetic below: 3 calls into torch (linear, relu, linear), 16 ops
    # in the backward, 4 modules (the Sequential and its 3 layers)
    assert (profiled.forward.calls, len(profiled.backward.ops), profiled.modules) == (3, 16, 4)
    trace = cost.predict(two_layers(), torch.randn(1, 4), 4, 2, machine)
    at = {}
    for e in trace.events:
        at.setdefault((e.phase, int(e.device[10])), []).append((e.start / US, e.end / US))
    # entry, 1 us; scatter: 2 copies of 1 us of ops and 2 us of Python each, 7 us; then
    # device 1's 32 B at once: 1 us + 32 ns
    assert at["scatter", 1] == [pytest.approx((7, 8.032))]
    # replicate: the broadcast's call (2 us of Python, 1 us of op) starts at 10 us, 232 ns +
    # one ring step; meanwhile the host builds 4 modules x 2 replicas at 0.1 us each
    assert at["replicate", 1] == [pytest.approx((10, 11.232))]
    assert at["replicate", 0][1] == pytest.approx((10, 10.8))
    broadcast = next(e for e in trace.events if e.phase == "replicate" and e.nbytes)
    assert broadcast.details["tensors"] == 4  # 2 weights, 2 biases in the one call
    built = next(e for e in trace.events if e.details.get("what") == "modules")
    assert built.details["modules"] == 4
    # apply: thread 0 starts 3 us after the host is free (10.8), thread 1 3 us later; each
    # of their 3 calls holds the GIL 1.25 us, thread 0's first: 13.8 -> 17.55, then thread
    # 1's, which arrived at 16.8: 17.55 -> 21.3 (192 ns of kernels hide behind the calls)
    assert at["apply", 0] == [pytest.approx((13.8, 17.55))]
    assert at["apply", 1] == [pytest.approx((16.8, 21.3))]
    # gather, once the threads are joined (21.3): 2 x 3 us of Python, then device 1's 16 B
    # into device 0: 1 us + 16 ns
    assert at["gather", 1] == [pytest.approx((27.3, 28.316))]
    # the loss: 6 ops at 1 us and half the step's 4 us (35.3); the gradient's scatter runs in
    # autograd, without dpkit's Python: 2 x 1 us of ops, then 1 us + 16 ns
    assert at["grad_scatter", 1] == [pytest.approx((37.3, 38.316))]
    # each replica's backward from when its gradient arrived: 16 ops at 0.5 us
    assert at["backward", 0] == [pytest.approx((37.3, 45.3))]
    assert at["backward", 1] == [pytest.approx((38.316, 46.316))]
    # the reduce, after both: 232 ns + one ring step; then the last quarter of the step
    assert at["reduce", 0] == [pytest.approx((46.316, 47.548))]
    assert [e.details["replica"] for e in trace.events if e.phase == "apply"] == [0, 1]
    assert next(e for e in trace.events if e.phase == "reduce").details["tensors"] == 4
    assert trace.step_time == pytest.approx(48.548 * US)


def test_a_dataparallel_step_on_two_made_up_virtual_lanes_by_hand():
    """The same step and costs on virtual lanes (2 cores): the host makes every copy itself,
    the replicas' threads start one by one and take turns with the GIL, one backward runs
    them all, and the reduce adds on the host."""
    machine = made_up(virtual_lanes=True, op_overhead=1 * US, copy_overhead=2 * US,
                      backward_op_overhead=0.5 * US, step_overhead=4 * US, thread_start=3 * US,
                      gil_handoff=0.25 * US, module_overhead=0.1 * US)  # fmt: skip
    trace = cost.predict(two_layers(), torch.randn(1, 4), 4, 2, machine)
    at = {}
    for e in trace.events:
        at.setdefault((e.phase, int(e.device[10])), []).extend((e.start / US, e.end / US))
    # entry 1 us; scatter: a copy's 3 us of ops and Python each, device 1's with 1 us + 32 ns
    assert at["scatter", 0] + at["scatter", 1] == pytest.approx([1, 4, 4, 8.032])
    # replicate: per copy 4 tensors' ops (4 us) and 2 us of Python, device 1's 232 B with a
    # latency per tensor (4.232 us); then 4 modules x 2 replicas at 0.1 us
    assert at["replicate", 0] == pytest.approx([8.032, 14.032, 24.264, 25.064])
    assert at["replicate", 1] == pytest.approx([14.032, 24.264])
    # apply, 3 calls a thread, each 1.25 us holding the GIL and 64 ns of kernel without it:
    # the caller holds the GIL 3 us to start thread 0 (28.064), which then takes it first;
    # the caller's next 3 us start thread 1 at 32.314; the threads then alternate, thread
    # 0 done at 36.128, thread 1 (its calls at 32.314, 34.814, 37.378) at 38.692
    assert at["apply", 0] == pytest.approx([28.064, 36.128])
    assert at["apply", 1] == pytest.approx([32.314, 38.692])
    replicas = [e.details["replica"] for e in trace.events if e.phase == "apply"]
    assert replicas == [0, 1]
    added = next(e for e in trace.events if e.details.get("what") == "sum")
    assert added.details["tensors"] == 4
    # gather: device 0's piece stays (3 us of Python), device 1's 16 B (4.016 us); the loss
    # 8 us; the gradient's scatter 1 us of ops a copy, without dpkit's Python
    assert at["gather", 0] + at["gather", 1] == pytest.approx([38.692, 41.692, 41.692, 45.708])
    assert at["grad_scatter", 1] == pytest.approx([54.708, 56.724])
    # one backward for both replicas in the caller's thread: 2 x (16 x 0.5 us + 256 ns)
    assert at["backward", 0] == at["backward", 1] == pytest.approx([56.724, 73.236])
    # the reduce: device 1's gradients copied to device 0 as replicate copied (10.232 us
    # after device 0's 6 us), then added there: 4 tensors' ops, 4 us
    assert at["reduce", 0] == pytest.approx([73.236, 79.236, 89.468, 93.468])
    assert at["reduce", 1] == pytest.approx([79.236, 89.468])
    assert trace.step_time == pytest.approx(94.468 * US)


def test_a_replica_making_one_call_into_torch_holds_the_gil_once():
    torch.manual_seed(0)
    machine = made_up(op_overhead=1 * US, gil_handoff=0.25 * US, thread_start=3 * US)
    trace = cost.predict(nn.Linear(4, 2), torch.randn(1, 4), 4, 2, machine)
    assert cost.profile(nn.Linear(4, 2), torch.randn(1, 4)).forward.calls == 1  # F.linear
    first = next(e for e in trace.events if e.phase == "apply")
    assert first.end - first.start == pytest.approx(1.25 * US)  # its 32 ns kernel hides


def test_on_virtual_lanes_the_host_and_the_kernels_take_turns():
    slow_memory = made_up(virtual_lanes=True, memory_bandwidth=1 * GB, op_overhead=1 * US)
    one = cost.predict(two_layers(), torch.randn(1, 4), 4, 1, slow_memory)
    apply = next(e for e in one.events if e.phase == "apply")
    kernels = sum(op_time(op, 4, slow_memory) for op in cost.profile(two_layers(),
                  torch.randn(1, 4)).forward.ops)  # fmt: skip
    # one lane: the module itself, its 3 calls' Python then its kernels, one after the other
    assert apply.end - apply.start == pytest.approx(3 * US + kernels)
    two = cost.predict(two_layers(), torch.randn(1, 4), 4, 2, slow_memory)
    added = next(e for e in two.events if e.details.get("what") == "sum")
    # device 1's gradients added into device 0's: 4 adds at 1 us, each reading two and
    # writing one (3 x 232 B at 1 GB/s)
    assert added.end - added.start == pytest.approx(4 * US + 3 * PARAMS / GB)


def test_gather_copies_into_device_0_once_its_own_forward_is_done():
    # 3 rows: 2 on device 0 (192 ns of forward), 1 on device 1 (96 ns); device 1's output
    # waits for device 0's stream, where the copies into it queue
    trace = cost.predict(two_layers(), torch.randn(1, 4), 3, 2, made_up())
    apply = {e.device[10]: e for e in trace.events if e.phase == "apply"}
    assert apply["1"].end < apply["0"].end
    copy = next(e for e in trace.events if e.phase == "gather" and e.nbytes)
    assert copy.start == pytest.approx(apply["0"].end, abs=1e-11)


@pytest.mark.parametrize("lanes", [False, True])
def test_device_0_copies_its_own_gathered_piece_but_keeps_its_scattered_chunk(lanes):
    # torch's gather concatenates every piece into a new tensor on device 0, its own piece
    # too (read 16 B, write 16 B: 32 ns at 1 GB/s); scatter's chunk for device 0 is a view
    slow_memory = made_up(memory_bandwidth=1 * GB, virtual_lanes=lanes)
    trace = cost.predict(two_layers(), torch.randn(1, 4), 4, 2, slow_memory)
    own = {e.phase: e.end - e.start for e in trace.events if e.device.startswith("predicted:0")}
    host = 2 * TINY if lanes else 0.0  # on lanes the host makes the copy: an op, and Python
    assert own["gather"] == pytest.approx(2 * 16e-9 + host, abs=1e-15)
    assert own["scatter"] == pytest.approx(host, abs=1e-15)


def test_dataparallels_reduce_flattens_the_gradients_and_back():
    slow_memory = made_up(memory_bandwidth=1 * GB)  # 1 ns a byte
    trace = cost.predict(two_layers(), torch.randn(1, 4), 4, 2, slow_memory)
    reduce = next(e for e in trace.events if e.phase == "reduce")
    # into one buffer (read 232 B, write 232 B), reduced (232 ns + 1 us), and out again
    assert reduce.end - reduce.start == pytest.approx(2 * 464e-9 + PARAMS / GB + 1 * US)


def test_dataparallel_on_one_made_up_gpu_runs_the_module_itself_by_hand():
    """One device: no replicas, no threads, no reduce; the host's costs alone show."""
    machine = made_up(op_overhead=1 * US, copy_overhead=2 * US, backward_op_overhead=0.5 * US,
                      step_overhead=4 * US)  # fmt: skip
    profiled = cost.profile(two_layers(), torch.randn(1, 4))
    trace = cost.predict(two_layers(), torch.randn(1, 4), 4, 1, machine)
    assert {e.phase for e in trace.events} == {"scatter", "apply", "backward"}
    events = {e.phase: e for e in trace.events}
    # a quarter of the step's 4 us on entry, then scatter's one call (1 us of ops, 2 us of
    # dpkit's Python around a copy): the batch stays on device 0, nothing moves
    assert (events["scatter"].end, events["scatter"].nbytes) == (pytest.approx(4 * US), 0)
    # the module's forward: 1 us per call into torch (its 384 FLOPs take 384 ns)
    apply = events["apply"]
    assert (apply.start, apply.end) == pytest.approx((4 * US, (4 + profiled.forward.calls) * US))
    assert apply.details["replica"] == 0
    # the loss on the host: 6 ops at 1 us and half the step's 4 us; then 0.5 us a backward op
    backward = events["backward"]
    assert backward.start == pytest.approx(apply.end + 8 * US)
    assert backward.end - backward.start == pytest.approx(len(profiled.backward.ops) * 0.5 * US)
    assert trace.step_time == pytest.approx(backward.end + 1 * US)


def test_a_ddp_step_on_two_made_up_gpus_by_hand():
    trace = cost.predict(two_layers(), torch.randn(1, 4), 4, 2, made_up(), strategy="ddp")
    got = spans(trace)
    assert got["apply"][1] == pytest.approx(192e-9, abs=1e-10)  # no scatter, no replicate
    backward = 192e-9 + 256e-9
    assert got["backward"][1] == pytest.approx(backward, abs=1e-10)
    # one bucket (232 B < 1 MiB), ready when the last gradient is: 2 * 1/2 * 232 B / 1 GB/s
    # plus 2 ring steps of 1 us
    allreduce = PARAMS / GB + 2 * US
    buckets = [e for e in trace.events if e.phase == "allreduce"]
    first_gradient_ready = min(e.start for e in buckets)
    assert max(e.end for e in buckets) - first_gradient_ready == pytest.approx(allreduce, abs=1e-10)
    assert first_gradient_ready <= backward + 1e-10
    assert {e.nbytes for e in buckets} == {PARAMS}  # 2*(1/2)*S
    # then the sums are copied from the bucket back into .grad (memory so fast it is ~0)
    assert trace.step_time == pytest.approx(max(e.end for e in buckets), abs=1e-10)


def test_a_ddp_step_with_buffers_and_host_costs_on_two_made_up_gpus_by_hand():
    """As above, with a BatchNorm (buffers DDP broadcasts every forward) and the host's
    costs: 1 us a forward call, 0.5 us a backward op, 4 us a step. The op counts are the
    profile's (what torch ran), the times are worked out here."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    sample = torch.randn(1, 4)
    machine = made_up(op_overhead=1 * US, backward_op_overhead=0.5 * US, step_overhead=4 * US)
    profiled = cost.profile(model, sample)
    calls, backward_ops = profiled.forward.calls, len(profiled.backward.ops)
    assert profiled.buffer_sizes == (32, 32, 8)  # running mean and var (8 floats), a count
    trace = cost.predict(model, sample, 4, 2, machine, "ddp")
    events = {(e.phase, e.device[10]): e for e in trace.events}  # "predicted:<i> ..."
    # a quarter of the step's overhead on entry, then rank 0's 72 B of buffers broadcast:
    # one NCCL call, 72 ns + one ring step of 1 us
    start, buffers = 1 * US, 72e-9 + 1 * US
    for rank, moved in (("0", 0), ("1", 72)):
        broadcast = events["replicate", rank]
        assert (broadcast.start, broadcast.end) == pytest.approx((start, start + buffers))
        assert (broadcast.nbytes, broadcast.details["what"]) == (moved, "buffers")
    # the forward: its Python's calls at 1 us each outlast 2 rows' 192 FLOPs (192 ns)
    forward = events["apply", "1"]
    assert forward.start == pytest.approx(start + buffers, abs=1e-12)
    assert forward.end - forward.start == pytest.approx(calls * US, abs=1e-12)
    # the loss: 6 ops at 1 us (its 16 B are nothing at this memory) and half the step's 4 us
    backward = events["backward", "1"]
    assert backward.start - forward.end == pytest.approx(6 * US + 2 * US, abs=1e-12)
    # the backward: 0.5 us an op autograd runs, and 0.5 us a gradient copied into its bucket
    # (6 parameters), against 256 FLOPs (256 ns) on the device
    assert backward.end - backward.start == pytest.approx((backward_ops + 6) * 0.5 * US, abs=1e-12)
    # one bucket of 296 B, all-reduced (296 ns + 2 ring steps of 1 us) before the backward
    # ends; then 0.5 us a gradient copied back into .grad, and the last quarter of the step
    allreduce = events["allreduce", "1"]
    assert allreduce.end - allreduce.start == pytest.approx(296e-9 + 2 * US, abs=1e-12)
    assert allreduce.end < backward.end
    assert trace.step_time == pytest.approx(backward.end + 6 * 0.5 * US + 1 * US, abs=1e-12)
    # one rank broadcasts and all-reduces nothing
    alone = cost.predict(model, sample, 4, 1, machine, "ddp")
    assert not [e for e in alone.events if e.phase in ("replicate", "allreduce")]


def test_ddp_ranks_on_virtual_lanes_share_the_cores_and_buckets_wait_for_the_slowest_rank():
    lanes = made_up(virtual_lanes=True)  # 2 cores, 1 GFLOP/s each; host costs of nothing
    # 4 ranks of 2 rows on 2 cores run at half speed: the forward's 192 FLOPs take 384 ns,
    # the backward's 256 take 512 ns
    four = cost.predict(two_layers(), torch.randn(1, 4), 8, 4, lanes, "ddp")
    events = {(e.phase, e.device[10]): e for e in four.events}
    assert events["apply", "3"].end == pytest.approx(384e-9, abs=1e-10)
    assert events["apply", "3"].details["replica"] == 3
    backward = events["backward", "3"]
    assert backward.end - backward.start == pytest.approx(512e-9, abs=1e-10)
    # the first layer's weight gradient is ready after its 128 FLOPs, the last of the 256:
    # 256 ns alone, 512 ns at half speed; then a ring over 4 ranks, 3/2 x 232 B at 1 GB/s
    # plus 6 steps of 1 us
    allreduce = events["allreduce", "3"]
    assert allreduce.start == pytest.approx(backward.start + 512e-9, abs=1e-10)
    assert allreduce.end - allreduce.start == pytest.approx(348e-9 + 6e-6, abs=1e-10)
    assert (allreduce.details["bucket"], allreduce.details["tensors"]) == (0, 4)  # all 4
    # 3 rows on 2 ranks: 2 and 1, each on a core of its own; the bucket waits for rank 0's
    # backward (2 rows: 192 ns forward, 256 ns backward), not rank 1's (96 and 128 ns)
    uneven = cost.predict(two_layers(), torch.randn(1, 4), 3, 2, lanes, "ddp")
    slowest = next(e for e in uneven.events if e.phase == "backward" and e.device[10] == "0")
    assert slowest.end == pytest.approx(192e-9 + 256e-9, abs=1e-10)
    first_bucket = min(e.start for e in uneven.events if e.phase == "allreduce")
    assert first_bucket == pytest.approx(slowest.end, abs=1e-10)


class WithLargeBuffers(nn.Module):
    """Two 6 MB buffers (more than one 10 MiB NCCL call holds) beside a small layer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(4, 2)
        self.register_buffer("first", torch.zeros(1_500_000))
        self.register_buffer("second", torch.zeros(1_500_000))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


def test_ddp_broadcasts_buffers_in_calls_of_at_most_10_mib():
    trace = cost.predict(WithLargeBuffers(), torch.randn(1, 4), 4, 2, made_up(), "ddp")
    broadcast = next(e for e in trace.events if e.phase == "replicate" and e.nbytes)
    # 12 MB at 1 GB/s, in two NCCL calls (6 MB + 6 MB > 10 MiB): two ring steps of 1 us
    assert broadcast.end - broadcast.start == pytest.approx(12e6 / GB + 2 * US)


def test_dataparallel_broadcasts_and_reduces_in_calls_of_at_most_10_mib():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1000, 1500), nn.Linear(1500, 1000))
    trace = cost.predict(model, torch.randn(1, 1000), 4, 2, made_up())
    # 6 MB + 6 kB of the first layer, then 6 MB + 4 kB of the second: 12.01 MB at 1 GB/s,
    # in two NCCL calls (the second weight would take the first past 10 MiB): 2 x 1 us
    # (the reduce also flattens into a buffer and back: 4 x 12.01 MB at 1e15 B/s)
    flatten = 4 * 12_010_000 / 1e15
    for phase, extra in (("replicate", 0.0), ("reduce", flatten)):
        event = next(e for e in trace.events if e.phase == phase and e.nbytes)
        assert event.end - event.start == pytest.approx(12_010_000 / GB + 2 * US + extra)


def without_peer_to_peer() -> Hardware:
    """PCIe at 2 GB/s (1 us), and NCCL through host memory (SHM) measured at 0.5 GB/s (4 us):
    slower than two copies over PCIe, as on real machines (nccl#384: 3.9 GB/s on PCIe 3)."""
    return made_up(
        peer_to_peer=False, host_to_device=Link(2 * GB, 1e-6, "made-up PCIe"),
        device_to_device=Link(0.5 * GB, 4e-6, "made up: NCCL through host memory"),
    )  # fmt: skip


def test_without_peer_to_peer_the_all_reduce_takes_nccls_own_link_and_one_way_goes_down_and_up():
    machine = without_peer_to_peer()
    # DDP's all-reduce of 1 MB on 2 devices: 2 x 1/2 x 1 MB / 0.5 GB/s + 2 ring steps of 4 us
    assert cost.allreduce(1e6, 2, machine) == pytest.approx(2e-3 + 2 * 4 * US)
    ddp = cost.predict(two_layers(), torch.randn(1, 4), 4, 2, machine, "ddp")
    allreduce = spans(ddp)["allreduce"]
    assert allreduce[1] - allreduce[0] == pytest.approx(PARAMS / (0.5 * GB) + 2 * 4 * US, abs=1e-10)
    got = spans(cost.predict(two_layers(), torch.randn(1, 4), 4, 2, machine))
    # DataParallel's scatter copies 32 B down to the host and up: 1 GB/s, 2 x 1 us
    scatter = 2 * US + 32e-9
    assert got["scatter"][1] == pytest.approx(scatter, abs=1e-10)
    # its replicate and reduce are NCCL's one-way broadcast and reduce: not the all-reduce's
    # link (nccl#384 measured 10.3 and 3.9 GB/s) but down and up as a copy, 232 B at 1 GB/s
    # and one step of 2 x 1 us
    one_way = PARAMS / (1 * GB) + 2 * US
    assert got["replicate"][1] == pytest.approx(scatter + one_way, abs=1e-10)
    assert got["reduce"][1] - got["reduce"][0] == pytest.approx(one_way, abs=1e-10)


def test_a_pcie_rate_given_as_nccls_path_through_host_memory_is_warned_about():
    with pytest.warns(UserWarning, match=r"peer_to_peer is false.*1 GB/s.*above.*0\.5 GB/s"):
        made_up(peer_to_peer=False)  # device_to_device 1 GB/s: PCIe's own rate
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        without_peer_to_peer()
        cost.preset("T4-PCIe3")


class WithDetachedFeatures(nn.Module):
    """Logits (2 floats a row) and, detached, the input twice (8 floats a row): features a
    caller reads, no loss (as Hugging Face's models return logits beside their loss)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.head(x), torch.cat([x, x], dim=1).detach()


def test_dataparallel_scatters_a_gradient_only_for_outputs_that_require_grad():
    slow_memory = made_up(memory_bandwidth=1 * GB)  # 1 ns a byte: the loss shows
    trace = cost.predict(WithDetachedFeatures(), torch.randn(1, 4), 4, 2, slow_memory)
    moved = {row["phase"]: row["nbytes"] for row in trace.summary()}
    # gather copies both outputs of device 1's 2 rows: 2 x (2 + 8) floats = 80 B
    assert moved["gather"] == 80
    # the loss reads, and the gradient goes back for, the logits alone: 2 x 2 floats
    assert moved["grad_scatter"] == 16
    got = spans(trace)
    scatter_back = [e for e in trace.events if e.phase == "grad_scatter" and e.nbytes]
    assert scatter_back[0].end - scatter_back[0].start == pytest.approx(1 * US + 16e-9, abs=1e-10)
    # between them, the loss on device 0: 6 ops over the 4 rows' logits, 32 B each at 1 GB/s
    loss = got["grad_scatter"][0] - got["gather"][1]
    assert loss == pytest.approx(6 * 32e-9, abs=1e-10)
    assert trace.held[0]["output gradient"] == 32 and trace.held[0]["gathered"] == 160


class TwoHeads(nn.Module):
    """Two outputs that require grad, 2 floats a row each: a gradient for each goes back."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second = nn.Linear(4, 2), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.first(x), self.second(x)


def test_each_output_that_requires_grad_gets_its_own_gradient_copy():
    trace = cost.predict(TwoHeads(), torch.randn(1, 4), 4, 2, made_up())
    (back,) = [e for e in trace.events if e.phase == "grad_scatter" and e.nbytes]
    # hand-computed: device 1's 2 rows of both outputs, 2 x 16 B; a message's 1 us for each
    assert back.nbytes == 32
    assert back.end - back.start == pytest.approx(2 * US + 32e-9, abs=1e-10)


def test_the_loss_on_virtual_lanes_is_the_hosts_ops_and_their_bytes():
    # made-up lanes with 1 GB/s memory: the host runs the loss itself, its 6 ops' Python
    # (nothing here) and their work over the logits, 4 rows x 2 floats = 32 B each
    lanes = made_up(virtual_lanes=True, memory_bandwidth=1 * GB)
    got = spans(cost.predict(WithDetachedFeatures(), torch.randn(1, 4), 4, 2, lanes))
    loss = got["grad_scatter"][0] - got["gather"][1]
    assert loss == pytest.approx(6 * 32e-9, abs=1e-10)


def test_ddp_copies_gradients_into_its_buckets_and_back_even_on_one_rank():
    slow_memory = made_up(memory_bandwidth=1 * GB)  # 1 ns a byte: the copies show
    model, sample = two_layers(), torch.randn(1, 4)
    one_device = cost.predict(model, sample, 4, 1, slow_memory, strategy="dp")
    one_rank = cost.predict(model, sample, 4, 1, slow_memory, strategy="ddp")
    # into the buckets (read .grad, write the bucket: 2 x 232 B) and back (2 x 232 B)
    assert one_rank.step_time - one_device.step_time == pytest.approx(4 * PARAMS / GB, abs=1e-10)
    views = cost.predict(model, sample, 4, 2, slow_memory, "ddp", gradient_as_bucket_view=True)
    copies = cost.predict(model, sample, 4, 2, slow_memory, "ddp")
    # .grad a view of the bucket: an in-place divide stays, the copy back goes
    assert copies.step_time - views.step_time == pytest.approx(2 * PARAMS / GB, abs=1e-10)


def test_memory_per_device_by_hand():
    model, sample = two_layers(), torch.randn(1, 4)
    dp = cost.predict(model, sample, 4, 2, made_up(), optimizer="adam")
    zero, one = dp.held
    assert zero["parameters"] == one["parameters"] == PARAMS
    assert zero["gradients"] == 2 * PARAMS  # .grad and replica 0's, until the reduce
    assert one["gradients"] == PARAMS
    assert zero["optimizer"] == 2 * PARAMS and "optimizer" not in one  # Adam: 2 states
    assert zero["input"] == 4 * 16 and one["input"] == 2 * 16  # the whole batch on device 0
    assert zero["gathered"] == zero["output gradient"] == 4 * 2 * 4
    assert zero["reduce buffers"] == 2 * PARAMS and one["reduce buffers"] == PARAMS
    assert dp.memory_per_device[0] > dp.memory_per_device[1]
    ddp = cost.predict(model, sample, 4, 2, made_up(), "ddp", optimizer="momentum")
    for rank in ddp.held:  # parameters, gradients, buckets, momentum: 4x the parameters
        assert [rank[k] for k in ("parameters", "gradients", "buckets", "optimizer")] == [
            PARAMS
        ] * 4
    view = cost.predict(model, sample, 4, 2, made_up(), "ddp", gradient_as_bucket_view=True)
    assert all(rank["buckets"] == 0 for rank in view.held)
    roomy = made_up(memory_capacity=1e9)
    assert cost.predict(model, sample, 4, 2, roomy).fits
    assert not cost.predict(model, sample, 4, 2, made_up(memory_capacity=500)).fits


# torch's default cuBLAS workspace (CublasHandlePool.cpp): 32 MiB on Hopper, else 8 MiB + 128 KiB
HOPPER_WORKSPACE, EARLIER_WORKSPACE = 33_554_432, 8_519_680


def test_a_gpu_holds_two_cublas_workspaces_when_the_model_has_matmuls():
    """One per thread that runs matmuls on the device (the forward's, autograd's), each of
    torch's default size for the GPU's generation; none without a matmul, none on CPU lanes."""
    model, sample = two_layers(), torch.randn(1, 4)
    for device_name, size in (("toy", EARLIER_WORKSPACE), ("H100", HOPPER_WORKSPACE)):
        for strategy in ("dp", "ddp"):
            held = cost.predict(
                model, sample, 4, 2, made_up(device_name=device_name), strategy
            ).held
            assert [device["cuBLAS workspaces"] for device in held] == [2 * size] * 2
    pooled = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
    held = cost.predict(pooled, torch.randn(1, 1, 8, 8), 4, 2, made_up()).held
    assert all("cuBLAS workspaces" not in device for device in held)
    lanes = made_up(virtual_lanes=True)
    assert all("cuBLAS workspaces" not in d for d in cost.predict(model, sample, 4, 2, lanes).held)


def test_frozen_parameters_have_no_gradients_and_no_optimizer_state():
    model = two_layers()
    model[0].weight.requires_grad_(False)
    dp = cost.predict(model, torch.randn(1, 4), 4, 2, made_up(), optimizer="adam")
    trainable = PARAMS - 8 * 4 * 4
    assert dp.held[1]["gradients"] == trainable
    assert dp.held[0]["optimizer"] == 2 * trainable
    reduced = sum(e.nbytes for e in dp.events if e.phase == "reduce")
    assert reduced == trainable  # device 1's gradients only, and only the trainable ones
    frozen = two_layers().requires_grad_(False)
    none = cost.predict(frozen, torch.randn(1, 4), 4, 2, made_up(), "ddp")
    assert not [e for e in none.events if e.phase == "allreduce"]  # nothing to all-reduce


def test_gradients_and_optimizer_state_as_torch_holds_them():
    model = two_layers()
    optimizer = torch.optim.Adam(model.parameters())
    nn.functional.mse_loss(model(torch.randn(4, 4)), torch.randn(4, 2)).backward()
    optimizer.step()
    grads = sum(p.grad.nbytes for p in model.parameters())
    state = sum(
        t.nbytes for s in optimizer.state.values() for k, t in s.items() if k != "step"
    )  # exp_avg, exp_avg_sq (Adam's step counter is a 4-byte scalar per parameter)
    held = cost.predict(model, torch.randn(1, 4), 4, 1, made_up(), optimizer="adam").held[0]
    assert held["gradients"] == grads and held["optimizer"] == state


def test_amp_and_tf32_pick_the_units_torch_runs_on():
    fast = made_up(peak_flops={"float32": 1e9, "tfloat32": 8e9, "bfloat16": 16e9})
    model, sample = two_layers(), torch.randn(1, 4)
    fp32 = spans(cost.predict(model, sample, 4, 1, fast))["apply"]
    bf16 = spans(cost.predict(model, sample, 4, 1, fast, amp="bf16"))["apply"]
    # 4 rows: 2*4*4*8 + 2*4*8*2 = 384 FLOPs at 1 GFLOP/s (CUDA cores), then at 16
    assert fp32[1] - fp32[0] == pytest.approx(384e-9, abs=1e-11)
    assert bf16[1] - bf16[0] == pytest.approx(384e-9 / 16, abs=1e-11)
    previous = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True  # as set_float32_matmul_precision("high")
        tf32 = spans(cost.predict(model, sample, 4, 1, fast))["apply"]
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    assert tf32[1] - tf32[0] == pytest.approx(384e-9 / 8, abs=1e-11)
    with pytest.raises(ValueError, match="bfloat16.*T4"):
        cost.predict(model, sample, 4, 1, "T4-PCIe3", amp="bf16")


def test_tensor_cores_reach_their_own_fraction_and_cuda_cores_matmul_efficiency():
    units = {"float32": 1e9, "tfloat32": 8e9, "bfloat16": 16e9}
    fast = made_up(peak_flops=units, matmul_efficiency=0.5,
                   tensor_core_efficiency={"bfloat16": 0.25})  # fmt: skip
    assert fast.flops_per_second("float32") == 0.5e9
    assert fast.flops_per_second("tfloat32") == 4e9  # not named: matmul_efficiency's 0.5
    assert fast.flops_per_second("bfloat16") == 4e9  # 16e9 x 0.25
    model, sample = two_layers(), torch.randn(1, 4)
    bf16 = spans(cost.predict(model, sample, 4, 1, fast, amp="bf16"))["apply"]
    assert bf16[1] - bf16[0] == pytest.approx(384e-9 / 4, abs=1e-11)  # 384 FLOPs at 4 GFLOP/s


def test_convolutions_run_in_tf32_by_default_and_matmuls_do_not():
    from dpkit.cost.compute import rate_key
    from dpkit.cost.profiling import OpCost

    a100 = cost.preset("8xA100-SXM-NVLink")
    conv = OpCost("aten.convolution", (0.0, 1.0), (0.0, 1.0), kind="conv", dtype="float32")
    mm = OpCost("aten.mm", (0.0, 1.0), (0.0, 1.0), kind="matmul", dtype="float32")
    assert torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
    assert rate_key(conv, a100) == "tfloat32" and rate_key(mm, a100) == "float32"
    v100 = cost.preset("8xV100-NVLink")  # no TF32 before Ampere
    assert rate_key(conv, v100) == "float32"


def test_units_of_the_presets_match_the_spec_sheets():
    a100 = cost.preset("8xA100-SXM-NVLink")
    assert a100.memory_capacity == 80 * 1024**3  # "80GB": 81,920 MiB in nvidia-smi
    assert a100.memory_bandwidth == 2.039e12  # 2,039 GB/s: decimal gigabytes
    assert a100.peak_flops["float32"] == 19.5e12
    # 200 Gb/s HDR is 25 GB/s (bits to bytes), 96 % reached
    assert a100.node_to_node.bandwidth == pytest.approx(200e9 / 8 * 0.96)
    assert cost.preset("2x8xA100-10GbE").node_to_node.bandwidth == pytest.approx(10e9 / 8 * 0.5)


def test_ddp_buckets_close_once_a_gradient_takes_them_past_the_cap():
    mib = 1 << 20
    # reversed: 0.75 MiB (not yet 1 MiB), + 0.75 MiB -> 1.5 MiB, closed; then a 25 MiB cap
    assert cost.ddp_buckets([20 * mib, 6 * mib, mib * 3 // 4, mib * 3 // 4]) == [[3, 2], [1, 0]]
    assert cost.ddp_buckets([mib, 1], first_bucket_bytes=mib) == [[1, 0]]
    assert cost.ddp_buckets([5, mib]) == [[1], [0]]  # exactly the cap closes the bucket
    # a 1.5 MiB cap, buckets of 1.2 MB tensors: the second makes 2.4 MB, then it closes
    assert cost.ddp_buckets([1_200_000] * 3, bucket_bytes=1_572_864) == [[2], [1, 0]]
    # one byte short of a cap keeps a bucket open, the first and the later ones alike
    assert cost.ddp_buckets([5, mib - 1]) == [[1, 0]]
    assert cost.ddp_buckets([5, 999, mib], bucket_bytes=1000) == [[2], [1, 0]]


def test_a_gradient_is_ready_when_the_backward_op_making_it_ends():
    from dpkit.cost.prediction import gradient_ready
    from dpkit.cost.profiling import PassCost

    profiled = cost.profile(two_layers(), torch.randn(1, 4))
    machine = made_up(backward_op_overhead=1 * US)
    # 2 rows' backward: 16 ops, 1 us each on the host; 3 matmuls among them, the 2nd, 4th
    # and 12th, of 64, 64 and 128 FLOPs (64, 64, 128 ns), the rest nothing at this memory
    flops = [op.flops_at(2) for op in profiled.backward.ops]
    assert [i for i, f in enumerate(flops) if f] == [1, 3, 11] and sum(flops) == 256
    # ready after op 0, op 7 (the second matmul's 128 ns done), never used, after op 15
    probe = dataclasses.replace(profiled, gradient_ops=(0, 7, -1, 15))
    ready = gradient_ready(probe, 2, machine)
    assert ready == pytest.approx([1 * US, 8 * US + 128e-9, 16 * US + 256e-9, 16 * US + 256e-9])
    # no backward at all (nothing requires grad): every gradient at once, at the start
    idle = dataclasses.replace(profiled, backward=PassCost(()), gradient_ops=(-1,))
    assert gradient_ready(idle, 2, machine) == [0.0]


def test_a_sample_row_is_what_the_bytes_scale_with():
    model = two_layers()
    profile = cost.profile(model, torch.randn(3, 4))  # the sample's batch size is not used
    assert profile.input_bytes(10) == 10 * 4 * 4
    assert profile.output_bytes(10) == 10 * 2 * 4
    trace = cost.predict(model, torch.randn(3, 4), 10, 2, made_up())
    assert next(e.nbytes for e in trace.events if e.phase == "scatter" and e.nbytes) == 5 * 16


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"matmul_efficiency": 5}, "matmul_efficiency.*fraction"),
        ({"memory_efficiency": 0.0}, "memory_efficiency"),
        ({"devices_per_node": 2.5}, "devices_per_node.*whole"),
        ({"nodes": 0}, "nodes"),
        ({"peer_to_peer": "no"}, "peer_to_peer.*True or False"),
        ({"virtual_lanes": 1}, "virtual_lanes"),
        ({"step_overhead": float("nan")}, "step_overhead"),
        ({"peak_flops": {"float32": -1.0}}, "peak_flops"),
        ({"peak_flops": {"bfloat16": 1e12}}, "float32"),
        ({"peak_flops": {"float32": 1e12, "fp16": 1e12}}, r"peak_flops\['fp16'\] is not a dtype"),
        ({"device_name": 100}, "device_name.*text"),
        ({"nics_per_node": math.inf}, "nics_per_node.*finite"),
        ({"device_to_device": 5e9}, "device_to_device.*Link"),
        ({"allreduce_bandwidth": float("inf")}, "allreduce_bandwidth"),
        ({"tensor_core_efficiency": {"float32": 1.5}}, "tensor_core_efficiency.*fraction"),
        ({"tensor_core_efficiency": {"float16": 0.5}}, "a dtype that peak_flops names"),
        ({"tensor_core_efficiency": {"float32": 0.0}}, "tensor_core_efficiency"),
        ({"op_seconds": {"aten.mm": ((1e6, "2 us"),)}}, r"op_seconds\['aten.mm'\].*pairs"),
        ({"op_seconds": {"aten.mm": ((1e6,),)}}, r"op_seconds\['aten.mm'\].*pairs"),
        ({"op_seconds": [("aten.mm", ((1e6, 1e-3),))]}, "op_seconds must map names"),
    ],
)
def test_hardware_refuses_what_makes_no_sense(changes, words):
    with pytest.raises((TypeError, ValueError), match=rf"^Hardware 'made-up': .*(?:{words})"):
        made_up(**changes)  # the machine named first: a hardware file may hold several


@pytest.mark.parametrize(
    ("bandwidth", "latency"), [(0, 1e-6), (float("nan"), 1e-6), (1e9, -1.0), (1e9, math.inf)]
)
def test_a_link_refuses_what_would_divide_by_zero_or_poison_the_times(bandwidth, latency):
    with pytest.raises(ValueError, match=r"^Link: (bandwidth|latency)="):
        Link(bandwidth, latency)


def test_a_number_in_the_wrong_form_is_refused_with_its_unit_and_an_example():
    with pytest.raises(TypeError, match=r"peak_flops\['float32'\]='19.5 TFLOP/s' must be a plain "
                       r"number of FLOP/s \(SI units, no suffixes; e.g. 312e12"):  # fmt: skip
        made_up(peak_flops={"float32": "19.5 TFLOP/s"})
    with pytest.raises(TypeError, match=r"latency='5 us' must be a plain number of seconds"):
        Link(1e9, "5 us")


def test_a_rate_is_asked_for_by_name_or_by_torch_dtype_and_a_missing_one_names_the_others():
    a100 = cost.preset("8xA100-SXM-NVLink")
    assert a100.flops_per_second(torch.bfloat16) == a100.flops_per_second("bfloat16") > 0
    with pytest.raises(ValueError, match=r"no bfloat16 rate \(it has float16, float32\)"):
        cost.preset("T4-PCIe3").flops_per_second(torch.bfloat16)


def test_links_say_where_their_numbers_come_from():
    t4 = cost.preset("T4-PCIe3")  # no peer to peer: copies go down to the host and up
    assert t4.device_link().source == "through host memory: down and up"
    assert t4.network_link().source == t4.node_to_node.source


@pytest.mark.parametrize(("fraction", "warns"), [(0.4, False), (0.5, False), (0.51, True)])
def test_without_peer_to_peer_a_device_link_above_half_the_host_link_is_questioned(fraction, warns):
    host = Link(10 * GB, 1e-6, "PCIe")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        made_up(
            peer_to_peer=False, host_to_device=host, device_to_device=Link(fraction * 10 * GB, 1e-6)
        )
    questions = [str(w.message) for w in caught if "peer_to_peer is false" in str(w.message)]
    assert bool(questions) == warns
    if warns:  # the machine named, its number and the bound
        assert questions[0].startswith("Hardware 'made-up': ")
        assert "5.1 GB/s, above host_to_device / 2 (5 GB/s)" in questions[0]


def test_dataparallel_beyond_one_node_teaches_ddp():
    with pytest.raises(ValueError, match="one machine.*strategy='ddp'"):
        cost.predict(two_layers(), torch.randn(1, 4), 8, 3, made_up())
    assert cost.predict(two_layers(), torch.randn(1, 4), 8, 3, made_up(), "ddp").step_time > 0


@pytest.mark.parametrize("strategy", ["dp", "ddp"])
def test_virtual_lanes_are_one_machine_however_many(strategy):
    lanes = made_up(virtual_lanes=True)  # 2 devices a node, as the GPUs above
    trace = cost.predict(two_layers(), torch.randn(1, 4), 8, 3, lanes, strategy)
    assert trace.step_time > 0 and not any("node" in e.device for e in trace.events)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"optimizer": "lion"}, "optimizer"),
        ({"amp": "fp8"}, "amp"),
        ({"bucket_cap_mb": 0}, "bucket"),
    ],
)
def test_bad_options_are_named(kwargs, words):
    with pytest.raises(ValueError, match=words):
        cost.predict(two_layers(), torch.randn(1, 4), 4, 2, made_up(), **kwargs)


def test_ddp_buckets_wait_for_the_backward_work_not_the_bytes():
    """VGG's shape: the fully connected layers hold nearly all the bytes and little of the
    work, and their gradients come first; the convolutions' come at the very end."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(32 * 16, 2048), nn.ReLU(),
        nn.Linear(2048, 256),
    )  # fmt: skip
    sample = torch.randn(1, 3, 64, 64)
    profile = cost.profile(model, sample)
    ops = [op.name for op in profile.backward.ops]
    # the first conv's weight gradient is the last convolution_backward's; the last layer's
    # comes within its first few ops
    assert profile.gradient_ops[0] == max(i for i, n in enumerate(ops) if "convolution" in n)
    assert max(profile.gradient_ops[-2:]) < ops.index("aten.threshold_backward")
    from dpkit.cost.prediction import gradient_ready

    a100 = cost.preset("8xA100-SXM-NVLink")
    ready = gradient_ready(profile, 256, a100)
    backward = cost.compute.pass_time(profile.backward, 256, a100, True)
    fc_bytes = sum(profile.gradient_sizes[-4:])
    assert fc_bytes > 0.9 * profile.gradient_bytes  # 98 % of the bytes ...
    assert max(ready[-4:]) < 0.25 * ready[0]  # ... ready in its first quarter
    assert ready[0] == pytest.approx(backward.device + len(profile.backward) * 6e-6)


def test_the_host_pays_per_call_of_python_into_torch_not_per_aten_op():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4), nn.ReLU())
    assert cost.profile(mlp, torch.randn(1, 4, 4)).forward.calls == 5  # flatten, 2 x (linear, relu)
    gru = nn.GRU(8, 16, batch_first=True)
    forward = cost.profile(gru, torch.randn(1, 12, 8)).forward
    assert forward.calls <= 3 < 50 < len(forward)  # one torch.gru (and its zeros) runs them all
    machine = made_up(op_overhead=1e-6)
    host = cost.compute.pass_time(forward, 4, machine, backward=False).host
    assert host == pytest.approx(forward.calls * 1e-6)


class TwoInputs(nn.Module):
    """Two batched inputs and a keyword input, a dict out: DataParallel scatters and gathers
    each, and so must the prediction."""

    def __init__(self) -> None:
        super().__init__()
        self.left, self.right = nn.Linear(4, 3), nn.Linear(6, 3)

    def forward(self, a: torch.Tensor, b: torch.Tensor, *, mask: torch.Tensor) -> dict:
        joined = self.left(a) + self.right(b)
        return {"scores": joined * mask, "norm": joined.norm(dim=1)}


@pytest.mark.filterwarnings("error")  # a norm is a reduction, memory-bound: nothing to warn
def test_a_model_of_several_inputs_and_a_dict_output_is_predicted_as_dataparallel_runs_it():
    model = TwoInputs()
    sample = (torch.randn(1, 4), torch.randn(1, 6))
    trace = cost.predict(model, sample, 8, 2, made_up(), sample_kwargs={"mask": torch.ones(1, 3)})
    moved = {row["phase"]: row["nbytes"] for row in trace.summary()}
    assert moved["scatter"] == 4 * (4 + 6 + 3) * 4  # device 1's 4 rows of a, b and the mask
    assert moved["gather"] == 4 * (3 + 1) * 4  # its 4 rows of scores and of norm
    gathers = [e for e in trace.events if e.phase == "gather" and e.nbytes]
    assert trace.step_time > 0 and len(gathers) == 1


def test_replica_threads_take_turns_with_the_gil_call_by_call():
    from dpkit.cost.prediction import _threads

    # by hand, 2 threads on 2 cores, 4 calls of 1 s of Python then 3 s of kernel: A runs
    # Python 0-1, B waits for the GIL, runs 1-2; each call after is 4 s later: A ends at
    # 16, B at 17 (kernels overlap; the GIL only orders the Python)
    assert _threads([0.0, 0.0], 4, [1.0, 1.0], [3.0, 3.0], 2.0) == pytest.approx([16, 17])
    # Python-bound: the two threads' 8 s of Python run one after another, whatever the cores
    assert max(_threads([0.0, 0.0], 4, [1.0, 1.0], [0.1, 0.1], 8.0)) == pytest.approx(8.1)
    # one core: all of it, Python and kernels, 2 x 4 x (0.01 + 3) s, runs on it in turn
    assert max(_threads([0.0, 0.0], 4, [0.01, 0.01], [3.0, 3.0], 1.0)) == pytest.approx(24.08)
    # a thread asking for the GIL just as the holder lets it go gets it first, as in the
    # GIL queue below: B runs Python 0-1, kernel 1-2; A (from 1) Python 1-2 and a kernel of
    # nothing; at 2 B, whose kernel just ended, goes before A asking again: B 2-3 (kernel
    # 3-4), A 3-4, both done at 4 (A first would end A at 3 and B at 5)
    assert _threads([1.0, 0.0], 2, [1.0, 1.0], [0.0, 1.0], 2.0) == pytest.approx([4, 4])


def test_gpu_launches_take_the_gil_in_turns_first_come_first_served():
    from dpkit.cost.prediction import _threads

    # kernels of nothing (a GPU's launches return at once): the GIL alone orders the calls.
    # By hand: A from 0, B from 0.5, 2 calls of 1 s each: A 0-1, B 1-2, A 2-3, B 3-4
    assert _threads([0.0, 0.5], 2, [1.0, 1.0], [0.0, 0.0], 2.0) == pytest.approx([3, 4])
    # B asking just as A's call ends goes first: A, asking again, waits behind it (CPython
    # hands the GIL to a waiting thread when the holder drops it)
    assert _threads([0.0, 1.0], 2, [1.0, 1.0], [0.0, 0.0], 2.0) == pytest.approx([3, 4])
    # three threads from 0, one call of 0.5 s each: one after another
    assert _threads([0.0] * 3, 1, [0.5] * 3, [0.0] * 3, 3.0) == pytest.approx([0.5, 1, 1.5])


def test_processes_share_the_cores_fairly_without_a_gil():
    from dpkit.cost.prediction import _threads

    # 3 processes of 2 s each on 2 cores: each at 2/3 speed, all done at 3 s
    assert _threads([0.0] * 3, 1, [0.0] * 3, [2.0] * 3, 2.0) == pytest.approx([3, 3, 3])
    # 1 core, A (1 s) from 0, B (1 s) from 0.5: A alone to 0.5, then half speed each; A has
    # 0.5 s left, done at 1.5; B did 0.5 s by then, done alone at 2
    assert _threads([0.0, 0.5], 1, [0.0, 0.0], [1.0, 1.0], 1.0) == pytest.approx([1.5, 2.0])


def test_the_calls_counted_are_the_model_s_under_dpkit_s_placement_check_too():
    from dpkit.placement_check import checking_placement

    torch.manual_seed(0)
    plain = cost.profile(two_layers(), torch.randn(1, 4)).forward.calls
    with checking_placement():  # its TorchFunctionMode calls torch again for every call
        checked = cost.profile(two_layers(), torch.randn(1, 4)).forward.calls
    assert plain == checked == 3


@pytest.mark.skipif(
    "MUTANT_UNDER_TEST" in os.environ, reason="mutmut's trampolines add frames to every call"
)
def test_the_question_points_at_the_line_that_made_the_machine():
    numbers = {f.name: getattr(made_up(), f.name) for f in dataclasses.fields(Hardware)}
    numbers.update(peer_to_peer=False, device_to_device=Link(9 * GB, 1e-6))  # above 1 GB / 2
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        Hardware(**numbers)
    assert [(w.filename, w.lineno) for w in caught] == [(__file__, line)]
