"""Task 5: compose DataParallel, and prove it computes the same gradients as one device.

Goal: ``nn.DataParallel``'s forward is four calls: scatter the inputs, replicate the
module onto the devices that got a chunk, parallel_apply, gather. Compose them, train with
them, and show that the gradients equal single-device training on the whole batch.
The surprises: a batch smaller than the device count leaves devices idle (only devices
that got a chunk get a replica), and nothing in the backward needs writing: autograd runs
gather's backward (scatter of gradients) and replicate's (reduce-add onto device 0).

Use dpkit's primitives here, the reference versions of tasks 1-4: ``dpkit.scatter``,
``dpkit.replicate``, ``dpkit.parallel_apply`` and ``dpkit.gather`` (or your own, once they
pass). Not ``dpkit.DataParallel`` or ``dpkit.data_parallel``: composing them is the task.
Pass the devices to ``dpkit.parallel_apply`` by keyword, ``devices=...``: as in torch, its
third positional argument is ``kwargs_tup`` (one dict of keyword arguments per replica),
while task 3's ``parallel_apply(modules, inputs, devices)`` takes them third.
Grade your work with ``dpkit grade 5``.
"""

# Reference solution: every TODO of the stub, done. Graded by the same grader.

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

import dpkit
from dpkit.device import Device

Forward = Callable[[nn.Module, tuple[torch.Tensor, ...], Sequence[Device]], torch.Tensor]


def data_parallel_forward(
    module: nn.Module, inputs: tuple[torch.Tensor, ...], devices: Sequence[Device]
) -> torch.Tensor:
    """``module(*inputs)`` computed data-parallel over ``devices``, gathered on ``devices[0]``.

    ``inputs`` is a tuple of positional arguments, each split along dim 0. With one device,
    call the module directly. Replicate onto only as many devices as got a chunk.
    """
    if len(devices) == 1:
        return module(*inputs)
    chunks = dpkit.scatter(inputs, devices)
    used = list(devices)[: len(chunks)]
    replicas = dpkit.replicate(module, used)
    outputs = dpkit.parallel_apply(replicas, chunks, devices=used)
    return dpkit.gather(outputs, used[0])


def train_step(
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    devices: Sequence[Device],
) -> float:
    """One training step: data-parallel forward of ``x``, MSE loss against ``y``, backward, step.

    Zero the gradients first; use ``nn.functional.mse_loss`` on the gathered output (so the
    loss is a mean over the whole batch). Return the loss as a Python float.
    """
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(data_parallel_forward(module, (x,), devices), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def max_gradient_difference(
    make_module: Callable[[], nn.Module],
    x: torch.Tensor,
    y: torch.Tensor,
    devices: Sequence[Device],
    forward: Forward = data_parallel_forward,
) -> float:
    """The largest absolute difference between single-device and data-parallel gradients.

    Build two identical modules with ``make_module()`` (it seeds itself). Take the MSE
    loss gradients of one on the whole batch directly (``module(x)``), of the other through
    ``forward(module, (x,), devices)``; compare every parameter's ``.grad``; return the
    largest absolute difference as a float (0.0 when they are equal).
    """
    single, parallel = make_module(), make_module()
    nn.functional.mse_loss(single(x), y).backward()
    nn.functional.mse_loss(forward(parallel, (x,), devices), y).backward()
    return max(
        (a.grad - b.grad).abs().max().item()
        for a, b in zip(single.parameters(), parallel.parameters())
    )
