"""Task 2: replicate, with a broadcast whose backward reduce-adds the gradients.

Goal: one replica of a module per device, as ``torch.nn.parallel.replicate`` makes them.
The surprise: replica parameters are not leaves. They are the outputs of one autograd
function, ``Broadcast``, which copies every parameter to every device; its backward sums
the gradients of all the copies onto device 0 (a *reduce-add*). So after
``sum(replica(x_i)).backward()`` the original module's ``.grad`` holds the total, exactly
as if one device had seen the whole batch. Replica 0 shares storage with the module.

You may use torch, ``copy.deepcopy``, ``dpkit.comm.copy_to`` (a real, counted copy between
devices; gradients carry no lane tag, so pass ``source=``) and ``dpkit.device_of``, but not
``dpkit.replicate``, ``dpkit.comm.broadcast`` or ``dpkit.comm.reduce_add``: writing them is
the task. This task handles parameters only; buffers may stay as ``deepcopy`` left them.
Grade your work with ``dpkit grade 2``.

On these virtual lanes, the lane a tensor is on is a tag that ``copy_to`` puts on the tensor
it returns: any new tensor made from it (a view, ``clone()``, arithmetic) carries no tag and
counts as lane 0's (on a GPU it would stay where it is). So ``copy_to`` must be the last
thing done to a tensor you hand to a lane.
"""

# ruff: noqa: F401 - these imports are what a solution uses; the stub does not yet.

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, TypeVar

import torch
from torch import nn

from dpkit.comm import copy_to
from dpkit.device import Device

M = TypeVar("M", bound=nn.Module)


class Broadcast(torch.autograd.Function):
    """Copies of ``tensors`` on every device; the backward reduce-adds onto ``devices[0]``."""

    @staticmethod
    def forward(ctx: Any, devices: Sequence[Device], *tensors: torch.Tensor) -> Any:
        """All the copies as one flat tuple, device by device.

        For devices ``[d0, d1]`` and tensors ``(a, b)``: ``(a on d0, b on d0, a on d1, b on
        d1)``. Use ``copy_to(t, device, "broadcast")``: on ``d0`` it returns ``t`` itself (no
        copy), so replica 0 shares storage. Remember ``devices`` and ``len(tensors)`` on
        ``ctx`` for the backward.
        """
        # TODO 2.1: copy every tensor to every device and return the flat tuple of copies
        raise NotImplementedError(
            "TODO 2.1: copy every tensor to every device and return the flat tuple of copies"
        )

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor) -> Any:
        """One gradient per input: the sum of the gradients of its copies, on ``devices[0]``.

        ``grad_outputs`` is laid out like forward's outputs. Move each device's gradient to
        ``devices[0]`` with ``copy_to(g, devices[0], "reduce", source=that_device)``, then
        add. Return ``None`` for ``devices`` first, then the summed gradients.
        """
        # TODO 2.2: sum the gradients of each tensor's copies onto devices[0] (reduce-add)
        raise NotImplementedError(
            "TODO 2.2: sum the gradients of each tensor's copies onto devices[0] (reduce-add)"
        )


def swap_parameter(module: nn.Module, name: str, tensor: torch.Tensor) -> None:
    """Replace parameter ``name`` (dotted, e.g. ``"0.weight"``) of ``module`` by ``tensor``.

    A broadcast copy is not an ``nn.Parameter``, and ``nn.Module`` refuses to store a plain
    tensor under a parameter's name, so the parameter is removed first and the tensor set
    as a plain attribute (as torch's replicate does). Given: you need not change it.
    """
    owner_name, _, attribute = name.rpartition(".")
    owner = module.get_submodule(owner_name)
    del owner._parameters[attribute]
    setattr(owner, attribute, tensor)


def replicate(module: M, devices: Sequence[Device]) -> list[M]:
    """One replica of ``module`` per device; replica ``i``'s parameters live on ``devices[i]``.

    Make each replica with ``copy.deepcopy(module)``, then swap each of its parameters
    (:func:`swap_parameter`) for that device's output of ONE ``Broadcast.apply`` over all
    the module's parameters, so that their gradients reduce-add back into ``module``.
    The module itself must be left unchanged.
    """
    # TODO 2.3: deep-copy the module per device and swap in the broadcast parameter copies
    raise NotImplementedError(
        "TODO 2.3: deep-copy the module per device and swap in the broadcast parameter copies"
    )
