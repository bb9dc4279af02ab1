"""The op timing and the memory split of dpkit.cost, against values worked by hand.

Found by the mutation audit of cost/compute.py and cost/memory.py: the whole-model tests
pass with the interpolation between measured op times, or a device's categories, changed.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import nn

import dpkit.cost as cost
from dpkit.cost.compute import elementwise_time, host_calls, interpolate, op_time
from dpkit.cost.memory import ddp_memory, dp_memory, optimizer_copies
from dpkit.cost.profiling import OpCost, PassCost

# (work, seconds): 2 s at 100, 8 s at 400, 16 s at 1,600
SAMPLES = ((100.0, 2.0), (400.0, 8.0), (1600.0, 16.0))


def test_an_op_time_between_two_samples_is_read_on_a_log_log_line():
    # 200 is half way from 100 to 400 in log(work), so log(seconds) is half way: 4 s
    assert interpolate(SAMPLES, 200.0) == pytest.approx(4.0)
    # 800: half way from 400 to 1,600, between 8 and 16 s in log: sqrt(8 * 16)
    assert interpolate(SAMPLES, 800.0) == pytest.approx(math.sqrt(8 * 16))
    assert interpolate(SAMPLES, 400.0) == pytest.approx(8.0)


def test_below_the_first_sample_an_op_costs_that_sample_and_beyond_the_last_its_rate():
    assert interpolate(SAMPLES, 100.0) == 2.0  # the sample itself, exactly
    assert interpolate(((100.0, 3.0), (400.0, 8.0)), 100.0) == 3.0  # not 3.0000000000000004
    assert interpolate(SAMPLES, 10.0) == 2.0  # a fixed cost: less work is no faster
    assert interpolate(SAMPLES, 3200.0) == pytest.approx(32.0)  # 16 s per 1,600, doubled


@pytest.mark.parametrize(
    ("samples", "work", "seconds"),
    [
        (((0.0, 1.0), (400.0, 8.0)), 200.0, 8.0),  # no log of a zero work: the next sample
        (((100.0, 0.0), (400.0, 8.0)), 200.0, 8.0),  # nor of a zero time
        (((100.0, 2.0), (400.0, 0.0)), 200.0, 0.0),
        (((1.0, 1.0), (100.0, 100.0)), 10.0, 10.0),  # samples of 1 are ordinary samples
        (((100.0, 1.0), (400.0, 4.0)), 200.0, 2.0),
        (((100.0, 0.5), (400.0, 1.0)), 200.0, math.sqrt(0.5)),
    ],
)
def test_samples_of_zero_fall_back_to_the_next_and_samples_of_one_are_ordinary(
    samples, work, seconds
):
    assert interpolate(samples, work) == pytest.approx(seconds)


def _machine(**op_seconds):
    return dataclasses.replace(cost.preset("8xA100-SXM-NVLink"), op_seconds=op_seconds)


def test_a_measured_op_is_timed_by_its_flops_and_a_data_movement_by_its_bytes():
    machine = _machine(**{"aten.mm": ((1.0, 5e-6), (1000.0, 1e-3))})
    matmul = OpCost("aten.mm", flops=(1000.0,), nbytes=(10.0,), kind="matmul")
    assert op_time(matmul, 4, machine) == pytest.approx(1e-3)  # its 1,000 FLOPs
    copy = OpCost("aten.mm", flops=(0.0,), nbytes=(1000.0,))  # no FLOPs: its bytes
    assert op_time(copy, 4, machine) == pytest.approx(1e-3)
    one = OpCost("aten.mm", flops=(1.0,), nbytes=(1000.0,), kind="matmul")
    assert op_time(one, 4, machine) == pytest.approx(5e-6)  # one FLOP is a FLOP
    # an op without samples takes the roofline: one FLOP at the A100's float32 rate
    roofline = OpCost("aten.addmm", flops=(1.0,), nbytes=(0.0,), kind="matmul")
    one_flop = 1 / machine.flops_per_second("float32")  # 7e-14 s: no absolute tolerance
    assert op_time(roofline, 4, machine) == pytest.approx(one_flop, rel=1e-9, abs=0)


def test_an_elementwise_op_takes_the_measured_add_where_there_is_one():
    machine = _machine(**{"aten.add": ((1e6, 1e-4), (1e7, 1e-3))})
    # 4 MB, log-log between 1 MB in 0.1 ms and 10 MB in 1 ms: 0.4 ms
    assert elementwise_time(4e6, machine) == pytest.approx(4e-4)
    plain = _machine()
    assert elementwise_time(4e6, plain) == pytest.approx(4e6 / plain.achieved_memory_bandwidth)


def test_a_forward_pays_the_host_per_python_call_where_counted_else_per_op():
    ops = tuple(OpCost(f"aten.op{i}", (0.0,), (8.0,)) for i in range(5))
    assert host_calls(PassCost(ops)) == 5
    assert host_calls(PassCost(ops, calls=2)) == 2  # a GRU: one call, many aten ops


@pytest.fixture(scope="module")
def linear():
    torch.manual_seed(0)
    return cost.profile(nn.Linear(8, 4), torch.randn(1, 8))


def test_dataparallel_on_one_device_holds_no_gathered_outputs_nor_reduce_buffers(linear):
    (alone,) = dp_memory(linear, [16], "sgd", gpu=True)
    assert alone["gradients"] == linear.gradient_bytes  # .grad only: no replica's to reduce
    assert not {"gathered", "output gradient", "reduce buffers"} & set(alone)
    assert "cuBLAS workspaces" not in alone  # none unless a workspace is given
    two = dp_memory(linear, [8, 8], "sgd", gpu=True)
    assert two[0]["gathered"] == linear.output_bytes(16)
    assert two[1]["reduce buffers"] == linear.gradient_bytes  # under 10 MiB: all of it


def test_ddp_ranks_hold_no_workspace_unless_given_and_their_buckets(linear):
    (rank,) = ddp_memory(linear, [16], "adam", gradient_as_bucket_view=False)
    assert rank["buckets"] == rank["gradients"] == linear.gradient_bytes
    assert rank["optimizer"] == 2 * linear.gradient_bytes
    assert "cuBLAS workspaces" not in rank


def test_an_unknown_optimizer_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match=r"^optimizer='lion' is not known; use one of sgd, "
                       r"momentum, adam, adamw \("):  # fmt: skip
        optimizer_copies("lion")
