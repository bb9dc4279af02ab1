"""Three rules the docstrings state that a plausible one-line bug would break unnoticed
(issue 20): lane 0 is home for tensors dpkit put there, a gather onto the host copies only
what is not there already, and a nested trace does not restart the outer trace's steps."""

from __future__ import annotations

import torch
from lanes import lanes, recorded_transfers
from torch import nn

import dpkit
from dpkit.testing.placement_check import checking_placement


def test_a_module_holding_a_gathered_output_replicates_and_runs_without_copying_lane_0():
    """An encoder's gathered features (tagged with lane 0 by gather) kept as a buffer of a
    head: lane 0 is their home, so the head sits on device_ids[0] and replica 0 shares them."""
    devices = lanes(4)
    torch.manual_seed(0)
    encoder = nn.Linear(3, 5)
    with torch.no_grad():
        features = dpkit.DataParallel(encoder, device_ids=devices)(torch.randn(8, 3))
    assert dpkit.device_of(features) == devices[0]  # a tensor dpkit made, on lane 0

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(5, 2)
            self.register_buffer("bank", features)

        def forward(self, x):
            return self.linear(x) + self.bank.mean()

    head = Head()
    replicas = dpkit.replicate(head, devices)
    assert replicas[0].bank.data_ptr() == features.data_ptr()  # shared, not copied
    with recorded_transfers() as log:
        output = dpkit.DataParallel(head, device_ids=devices)(torch.randn(8, 5))
    assert output.shape == (8, 2)
    copied_to = {t.destination for t in log if t.op == "broadcast"}
    assert devices[0] not in copied_to and copied_to == set(devices[1:])


def _gather_bytes_by_lane(devices, output_device):
    torch.manual_seed(0)
    home = devices[0].torch_device
    model = nn.Linear(3, 2).to(home)
    x = torch.randn(8, 3, device=home)  # 2 rows per lane: an output piece is 2 x 2 floats
    parallel = dpkit.DataParallel(model, device_ids=devices, output_device=output_device)
    with recorded_transfers() as log, dpkit.trace() as tr:
        parallel(x).sum().backward()
    gathers = [t for t in log if t.op == "gather"]
    assert all(t.nbytes == 16 for t in gathers)
    traced = {
        phase: sum(e.nbytes for e in tr.events if e.phase == phase)
        for phase in ("gather", "grad_scatter")
    }
    return [t.source for t in gathers], traced


def test_gathering_onto_the_host_copies_only_what_is_not_already_there():
    """On CPU lanes the host and lane 0 are one memory: a gather onto the host (-1, "cpu")
    copies lanes 1..3 only, as a gather onto lane 0 does, and so does the backward's
    grad_scatter from the host. Lanes that live apart from the host (a GPU's; here the
    placement check's) copy all four."""
    devices = lanes(4)
    for output_device in (devices[0], -1, "cpu"):
        sources, traced = _gather_bytes_by_lane(devices, output_device)
        assert sources == devices[1:]
        assert traced == {"gather": 16 * 3, "grad_scatter": 16 * 3}
    with checking_placement():
        checked = lanes(4)
        sources, traced = _gather_bytes_by_lane(checked, -1)
    assert sources == checked
    assert traced == {"gather": 16 * 4, "grad_scatter": 16 * 4}


def test_a_nested_trace_keeps_counting_the_outer_traces_steps():
    devices = lanes(2)
    parallel = dpkit.DataParallel(nn.Linear(3, 2), device_ids=devices)
    x = torch.randn(4, 3)
    with dpkit.trace() as outer:
        for _ in range(3):
            parallel(x)
        with dpkit.trace() as inner:
            parallel(x)
    assert sorted({e.step for e in outer.events}) == [1, 2, 3, 4]
    assert {e.step for e in inner.events} == {4}
    with dpkit.trace() as fresh:  # an outermost trace counts from 1 again
        parallel(x)
    assert {e.step for e in fresh.events} == {1}
