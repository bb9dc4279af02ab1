"""Task 3: parallel_apply, one thread per replica.

Goal: run ``modules[i](inputs[i])`` for every replica at the same time, one Python thread
each, and return the outputs in replica order, as ``torch.nn.parallel.parallel_apply``.
The surprises: grad mode is thread-local in torch, so a new thread does not see the
caller's ``torch.no_grad()`` unless you carry it in; and an exception in a worker thread
is lost unless you catch it there and raise it again in the caller, saying which replica
failed (a bare "shape mismatch" from one of eight threads is no help).

You may use torch, ``threading`` and ``traceback``, but not ``dpkit.parallel_apply``:
writing it is the task. Grade your work with ``dpkit grade 3``.
"""

# ruff: noqa: F401 - these imports are what a solution uses; the stub does not yet.

from __future__ import annotations

import threading
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
from torch import nn

from dpkit.device import Device


@dataclass
class ReplicaFailure:
    """What a worker stores instead of an output when its replica raised. Given."""

    index: int
    device: Device
    exception: BaseException
    traceback: str


def apply_replica(
    index: int,
    module: nn.Module,
    input: Any,
    device: Device,
    grad_enabled: bool,
    results: dict[int, Any],
) -> None:
    """Run one replica in the calling thread; store its output in ``results[index]``.

    Set grad mode to ``grad_enabled`` first (the thread's own setting is the default, not
    the caller's). A tuple or list ``input`` holds the positional arguments; anything else
    is the single argument. If the module raises, store a :class:`ReplicaFailure` (with
    ``traceback.format_exc()``) instead of letting the exception escape the thread.
    """
    # TODO 3.1: run module on input with the caller's grad mode; store output or failure
    raise NotImplementedError(
        "TODO 3.1: run module on input with the caller's grad mode; store output or failure"
    )


def reraise(failure: ReplicaFailure) -> NoReturn:
    """Raise ``failure``'s exception again in the caller, saying where it happened.

    Raise an exception of the same type whose message begins with
    ``"in replica {index} on device {device}"`` and includes the worker's traceback text.
    If that type cannot be built from one message, raise a ``RuntimeError`` instead.
    """
    # TODO 3.2: raise the same type of exception, naming the replica and its device
    raise NotImplementedError(
        "TODO 3.2: raise the same type of exception, naming the replica and its device"
    )


def parallel_apply(
    modules: Sequence[nn.Module], inputs: Sequence[Any], devices: Sequence[Device]
) -> list[Any]:
    """Outputs of ``modules[i](inputs[i])``, in order, each replica run in its own thread.

    Start every thread (target :func:`apply_replica`) before joining any, so the replicas
    run at the same time. Then return the outputs in replica order; if any replica
    failed, :func:`reraise` the failure of the lowest index.
    """
    # TODO 3.3: start one thread per replica, join them all, return outputs in order
    raise NotImplementedError(
        "TODO 3.3: start one thread per replica, join them all, return outputs in order"
    )
