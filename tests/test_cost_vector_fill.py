"""A convolution with few channels leaves most of the CPU's vector lanes empty and takes as
long as one with them filled: a calibrated machine prices its FLOPs over the lanes it fills
(issue 27). Every expected number here is worked out by hand."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import dpkit.cost as cost
from dpkit.cost import profiling
from dpkit.cost.calibration import measure_ops
from dpkit.cost.compute import op_time
from dpkit.cost.profiling import OpCost, vector_fill


@pytest.mark.parametrize(
    "vector_bytes, lanes_filled",
    [
        (64, 4 / 16 * 9 / 16),  # AVX-512: 16 float32 lanes; 4 outputs, 1 input x 3 x 3 = 9
        (32, 4 / 8 * 9 / 16),  # AVX2: 8 lanes; the 9 take two vectors
        (16, 4 / 4 * 9 / 12),  # 4 lanes: the outputs fill one vector, the 9 three
    ],
)
def test_the_fill_pads_both_sides_of_the_product_to_the_vector(
    monkeypatch, vector_bytes, lanes_filled
):
    monkeypatch.setattr(profiling, "VECTOR_BYTES", vector_bytes)
    assert vector_fill(nn.Conv2d(1, 4, 3).weight, groups=1) == pytest.approx(lanes_filled)


def test_wide_layers_fill_every_lane_and_other_ops_are_left_alone(monkeypatch):
    monkeypatch.setattr(profiling, "VECTOR_BYTES", 64)
    assert vector_fill(nn.Conv2d(16, 32, 3).weight, groups=1) == 1.0  # 32 and 144 = 9 x 16
    half = nn.Conv2d(16, 32, 3).weight.to(torch.bfloat16)  # 32 bfloat16 lanes: 144 of 160
    assert vector_fill(half, groups=1) == pytest.approx(1.0 * 144 / 160)
    assert vector_fill(nn.Conv2d(4, 4, 3, groups=4).weight, groups=4) == 1.0  # depthwise
    assert vector_fill(nn.Linear(3, 4).weight, groups=1) == 1.0
    # a 1-D convolution is one too: 4 outputs, 1 input x 3 taps, as a 2-D one's 3 x 3
    assert vector_fill(nn.Conv1d(1, 4, 3).weight, groups=1) == pytest.approx(4 / 16 * 3 / 16)
    assert vector_fill(torch.empty(4, 1, 3, 3, device="meta"), groups=1) == 1.0  # not a CPU's


def test_the_profile_reads_the_fill_off_each_convolutions_weight(monkeypatch):
    monkeypatch.setattr(profiling, "VECTOR_BYTES", 64)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 24, 3))
    profiled = cost.profile(model, torch.randn(1, 1, 8, 8))
    fills = {
        (op.name, round(op.fill, 6))
        for op in profiled.forward.ops + profiled.backward.ops
        if op.kind == "conv"
    }
    first, second = 4 / 16 * 9 / 16, 24 / 32 * 36 / 48  # 4 x 9; 24 x (4 x 3 x 3)
    assert fills == {
        ("aten.convolution", round(first, 6)),
        ("aten.convolution", round(second, 6)),
        ("aten.convolution_backward", round(first, 6)),
        ("aten.convolution_backward", round(second, 6)),
    }
    assert all(op.fill == 1.0 for op in profiled.forward.ops if op.kind != "conv")
    transposed = cost.profile(nn.ConvTranspose2d(1, 4, 3), torch.randn(1, 1, 8, 8))
    assert {op.fill for op in transposed.forward.ops + transposed.backward.ops} == {1.0}


def test_a_calibrated_curve_prices_a_quarter_filled_convolution_as_four_times_the_flops():
    # a made-up machine that measured 1 ns per FLOP: 1 ms at a million, 1 s at a billion
    curve = {"aten.convolution": ((1e6, 1e-3), (1e9, 1.0))}
    machine = dataclasses.replace(cost.preset("this-machine"), op_seconds=curve)
    quarter = OpCost("aten.convolution", (0.0, 1e6), (0.0, 8.0), kind="conv", fill=0.25)
    assert quarter.work_at(10) == 4e7
    assert op_time(quarter, 10, machine) == pytest.approx(0.04)  # 1e7 FLOPs as 4e7
    filled = dataclasses.replace(quarter, fill=1.0)
    assert op_time(filled, 10, machine) == pytest.approx(0.01)
    # A preset without measured curves prices FLOPs at its units' rate: its efficiencies
    # come from whole models' published steps, whose layers' fills they already hold.
    a100 = cost.preset("8xA100-SXM-NVLink")
    assert op_time(quarter, 10, a100) == op_time(filled, 10, a100)


def test_calibration_keys_a_convolutions_time_by_its_filled_work(monkeypatch):
    monkeypatch.setattr(profiling, "VECTOR_BYTES", 64)
    conv, sample = nn.Conv2d(1, 4, 3), torch.randn(1, 1, 6, 6)
    curves = measure_ops([(conv, sample)], (2,), repeats=1)
    flops = 2 * 4 * 9 * 4 * 4 * 2  # 2 per multiply-add, 4 outputs x 9, 4 x 4 pixels, 2 rows
    assert [work for work, _ in curves["aten.convolution"]] == [flops / (4 / 16 * 9 / 16)]
