"""Gradients of gradients through DataParallel: a gradient penalty (WGAN-GP, input-gradient
regularisers) differentiates the parameters' gradients, so backward runs through the backward
of replicate (``ReduceAddCoalesced``, whose own backward is a broadcast). torch supports it;
dpkit must give what one device gives.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import dpkit
from dpkit import tracing


def penalty(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The squared norm of d(output)/d(parameters), kept differentiable."""
    out = model(x)
    grads = torch.autograd.grad(out.square().sum(), list(model.parameters()), create_graph=True)
    return sum(g.square().sum() for g in grads)


@pytest.mark.parametrize("n", [2, 3])
def test_a_gradient_penalty_matches_one_device(n):
    torch.manual_seed(0)
    single = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    module = copy.deepcopy(single)
    x = torch.randn(9, 5)
    penalty(single, x).backward()
    lanes = dpkit.virtual_devices(n)
    with dpkit.trace() as tr:
        penalty(dpkit.DataParallel(module, lanes), x).backward()
    for expected, got in zip(single.parameters(), module.parameters()):
        torch.testing.assert_close(got.grad, expected.grad, rtol=1e-5, atol=1e-6)
    # The second backward broadcasts the gradients of the gradients back to the replicas:
    # the backward of replicate's backward, counted in the step the forward ran in.
    broadcasts = [e for e in tr.events if e.phase == tracing.Phase.GRAD_BROADCAST]
    assert sorted(e.device for e in broadcasts) == sorted(lane.name for lane in lanes)
    assert {e.step for e in tr.events} == {1}
