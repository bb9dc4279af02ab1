"""What every rank trains: a model, its data, an optimizer and a training step.

The surprise first: nothing here may be defined in a notebook or a script's ``__main__``.
The ranks are processes that never ran the caller's code (forked by a fork server, or
spawned: the start methods CUDA and Jupyter allow), and a function reaches them by *name*,
``module.function``, which the new process imports. A notebook's functions live in the
kernel's ``__main__``, which no other process can import, so :func:`check_importable`
refuses them up front with the fix, instead of letting every rank die at start-up with an
``AttributeError``. Put them in a ``.py`` file next to the notebook and import them
(``functools.partial`` of such a function works too).

Every rank seeds torch with the same ``seed`` before it builds the model and the batch, so
all ranks start from the same weights (DDP would broadcast rank 0's anyway) and draw the same
full batch, of which each keeps its own rows (:func:`shard`).
"""

from __future__ import annotations

import functools
import pickle
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dpkit.models import (
    CLASSES,
    COURSE_MODELS,
    DDP_MODELS,
    IMAGE_SHAPE,
    build_model,
    wide_mlp,
)
from dpkit.models import WithUnusedLayer as WithUnusedLayer  # notebook 09 imports it from here

MODELS = COURSE_MODELS  # what dpkit demo trains (its CLI's choices); dpkit.ddp.MODELS


def random_images(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` random MNIST-shaped images (1x28x28) and random labels, as ``dpkit demo``."""
    return torch.randn(batch, *IMAGE_SHAPE), torch.randint(0, CLASSES, (batch,))


def sgd(parameters: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """Plain SGD, learning rate 0.01, as ``dpkit demo`` trains."""
    return torch.optim.SGD(parameters, lr=0.01)


def training_step(
    model: nn.Module, inputs: Any, targets: torch.Tensor, optimizer: torch.optim.Optimizer
) -> torch.Tensor:
    """One ordinary step: zero the gradients, forward, cross-entropy (the mean over this
    rank's rows), backward, optimizer step. The same code trains a plain model: DDP's
    all-reduce happens inside ``backward()``."""
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(inputs), targets)
    loss.backward()
    optimizer.step()
    return loss


@dataclass(frozen=True)
class Workload:
    """A model factory, a data factory, an optimizer factory and a training step.

    ``model()`` returns a fresh module; ``data(batch)`` the full batch ``(inputs, targets)``
    (each rank keeps its share); ``optimizer(parameters)`` an optimizer;
    ``step(model, inputs, targets, optimizer)`` one training step (the DDP-wrapped model
    is passed). The loss must be the *mean* over the rows a rank holds: DDP averages
    gradients over ranks, which equals the full batch's gradient only then.
    """

    model: Callable[[], nn.Module]
    data: Callable[[int], tuple[Any, torch.Tensor]] = random_images
    optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] = sgd
    step: Callable[..., Any] = training_step
    seed: int = 0
    name: str = "custom"


def named_workload(model: str) -> Workload:
    """The demo's model ``"mlp"``, ``"cnn"`` or ``"transformer"``, or ``"wide"``
    (:func:`dpkit.models.wide_mlp`), on random images, SGD."""
    if model == "wide":
        return Workload(model=wide_mlp, name=model)
    if model not in DDP_MODELS:
        raise ValueError(f"model={model!r} is not one of {', '.join(DDP_MODELS)}; pick one of them")
    return Workload(model=functools.partial(build_model, model), name=model)


def as_workload(workload: Workload | str) -> Workload:
    if isinstance(workload, str):
        return named_workload(workload)
    if not isinstance(workload, Workload):
        raise TypeError(
            f"workload must be a model name ({', '.join(DDP_MODELS)}) or a dpkit.ddp.Workload, got "
            f"{type(workload).__name__}"
        )
    check_importable(workload)
    return workload


def _defined_where(function: Any) -> tuple[str, str]:
    while isinstance(function, functools.partial):
        function = function.func
    return getattr(function, "__module__", "") or "", getattr(function, "__qualname__", "")


def check_importable(workload: Workload) -> None:
    """Refuse callables a spawned process cannot import, naming the field and the fix."""
    for field_name in ("model", "data", "optimizer", "step"):
        function = getattr(workload, field_name)
        module, qualname = _defined_where(function)
        problem = None
        if module in ("__main__", "__mp_main__"):
            problem = "is defined in __main__ (a notebook, or the script being run)"
        elif "<lambda>" in qualname or "<locals>" in qualname:
            problem = "is a lambda or a function defined inside another function"
        if problem is None:
            try:
                pickle.dumps(function)
            except Exception as error:  # pickle raises several types; all mean the same here
                problem = f"cannot be pickled ({type(error).__name__}: {error})"
        if problem is not None:
            raise ValueError(
                f"workload.{field_name}={qualname or function!r} {problem}, so the rank "
                "processes cannot import it (they start fresh and find functions by module "
                "and name); define it in a .py file, import it, and pass that function "
                "(functools.partial of it is fine)"
            )


def shard(batch: tuple[Any, torch.Tensor], rank: int, nproc: int) -> tuple[Any, torch.Tensor]:
    """Rank ``rank``'s rows of the full batch: the ``rank``-th of ``nproc`` equal slices,
    the rows ``torch.chunk`` (and so dpkit's scatter) would give that device."""
    inputs, targets = batch
    rows = targets.shape[0] // nproc

    def rows_of(tensor: torch.Tensor) -> torch.Tensor:
        return tensor[rank * rows : (rank + 1) * rows]

    if isinstance(inputs, torch.Tensor):
        return rows_of(inputs), rows_of(targets)
    return type(inputs)(rows_of(t) for t in inputs), rows_of(targets)
