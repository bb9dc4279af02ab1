"""Which of a replica's outputs parallel_apply puts on the replica's lane: only the tensors
its forward made. A tensor that already lives on a lane keeps it, and one that existed
before the forward (an input, a keyword argument, a submodule's buffer) stays where the
user put it: tagging it would move the user's tensor to that lane for good. Found missing
by mutation testing (issue 20)."""

from __future__ import annotations

import torch
from lanes import lanes
from torch import nn

import dpkit


class ReturnsHeld(nn.Module):
    """Returns a tensor it keeps in a list (a cache, say), which it did not make."""

    def __init__(self, held: torch.Tensor) -> None:
        super().__init__()
        self.cache = [held]

    def forward(self, x):
        return x * 2, self.cache[0]


class ReturnsMask(nn.Module):
    def forward(self, x, mask=None):
        return x * 2, mask


class ReturnsChildTable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.child = nn.Module()
        self.child.register_buffer("table", torch.arange(3.0))

    def forward(self, x):
        return x * 2, self.child.table


def test_a_returned_tensor_that_lives_on_another_lane_keeps_its_lane():
    devices = lanes(4)
    on_lane_3 = dpkit.scatter(torch.ones(4, 1, requires_grad=True), devices)[3]
    module = ReturnsHeld(on_lane_3)
    outputs = dpkit.parallel_apply(
        [module, module], [torch.ones(1), torch.ones(1)], devices=devices[:2]
    )
    assert [dpkit.device_of(made) for made, _ in outputs] == devices[:2]
    assert dpkit.device_of(outputs[1][1]) == devices[3]


def test_a_returned_keyword_argument_stays_where_the_user_put_it():
    devices = lanes(2)
    mask = torch.ones(1)
    outputs = dpkit.parallel_apply(
        [ReturnsMask(), ReturnsMask()],
        [torch.ones(1), torch.ones(1)],
        [{"mask": mask}, {"mask": mask}],
        devices,
    )
    assert dpkit.device_of(outputs[1][0]) == devices[1]
    assert outputs[1][1] is mask and dpkit.device_of(mask) == dpkit.device_of(torch.ones(1))


def test_a_returned_buffer_of_a_submodule_stays_where_it_was():
    devices = lanes(2)
    module = ReturnsChildTable()
    outputs = dpkit.parallel_apply(
        [module, module], [torch.ones(1), torch.ones(1)], devices=devices
    )
    assert dpkit.device_of(outputs[1][0]) == devices[1]
    assert dpkit.device_of(module.child.table) == dpkit.device_of(torch.ones(1))
