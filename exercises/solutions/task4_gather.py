"""Task 4: gather, with a backward that scatters the gradient back.

Goal: combine one output per replica into a single output on one device, as
``torch.nn.parallel.gather``. Tensors are concatenated along ``dim``; dicts, lists, tuples
and namedtuples are gathered element by element; ``None`` stays ``None``.
The surprises: replicas that each return a scalar (a loss, say) give a *vector* with one
entry per device, not a scalar; and the backward must send each slice of the gradient back
to the device its piece came from, so every replica's backward runs where it ran forward.

You may use torch, ``dpkit.comm.copy_to`` (a real, counted copy between devices; gradients
carry no lane tag, so pass ``source=``), ``dpkit.device_of`` and ``dpkit.lanes.place`` (tags
a tensor you made with the lane it lives on), but not ``dpkit.gather`` or
``dpkit.comm.gather``: writing them is the task. Grade your work with ``dpkit grade 4``.

On these virtual lanes, the lane a tensor is on is a tag that ``copy_to`` (or ``place``)
puts on the tensor it returns: any new tensor made from it (a view, ``clone()``,
arithmetic, ``torch.cat``) carries no tag and counts as lane 0's (on a GPU it would stay
where it is). So ``copy_to`` or ``place`` must be the last thing done to a tensor you hand
to a lane.
"""

# Reference solution: every TODO of the stub, done. Graded by the same grader.

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from dpkit.comm import copy_to
from dpkit.device import Device
from dpkit.lanes import device_of, place


class Gather(torch.autograd.Function):
    """Concatenate pieces from several devices on ``destination``; backward splits it back."""

    @staticmethod
    def forward(ctx: Any, destination: Device, dim: int, *pieces: torch.Tensor) -> torch.Tensor:
        """``torch.cat`` of the pieces along ``dim``, after moving each to ``destination``.

        Move with ``copy_to(piece, destination, "gather")`` (pieces already there are not
        copied; move before reshaping, as a new view carries no lane tag). If every piece is
        a 0-dim scalar and ``dim == 0``, gather them as 1-element vectors (the result is a
        vector). ``torch.cat`` makes a new tensor, which dpkit has not tagged and so takes to
        be on lane 0: return ``place(result, destination)``, which tags it with its lane.
        Save on ``ctx`` what backward needs: each piece's device (``device_of``), its size
        along ``dim``, and whether scalars were unsqueezed.
        """
        ctx.destination = destination
        ctx.dim = dim
        ctx.sources = [device_of(piece) for piece in pieces]
        # Move first: a view made here would carry no lane tag, and copy_to would not copy it.
        moved = [copy_to(piece, destination, "gather") for piece in pieces]
        ctx.scalars = dim == 0 and all(piece.dim() == 0 for piece in moved)
        if ctx.scalars:
            moved = [piece.view(1) for piece in moved]
        ctx.sizes = [piece.shape[dim] for piece in moved]
        # A new tensor: untagged, dpkit would take it to be on lane 0.
        return place(torch.cat(moved, dim), destination)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        """``None`` for ``destination`` and ``dim``, then one gradient per piece, on its device.

        Split ``grad_output`` by the saved sizes and move slice *i* back to piece *i*'s
        device with ``copy_to(slice, device, "grad_scatter", source=destination)``; a piece
        that was a scalar gets a scalar gradient.
        """
        grads = []
        for grad, source in zip(grad_output.split(ctx.sizes, ctx.dim), ctx.sources):
            grad = copy_to(grad, source, "grad_scatter", source=ctx.destination)
            grads.append(grad.view(()) if ctx.scalars else grad)
        return (None, None, *grads)


def gather(outputs: Sequence[Any], destination: Device, dim: int = 0) -> Any:
    """Gather one output per replica (all of the same structure) onto ``destination``.

    Tensors go through ``Gather.apply(destination, dim, *tensors)``; a dict gives a dict
    of the same type and keys, a list or tuple one of the same type, a namedtuple one of the
    same namedtuple type, ``None`` gives ``None``. Anything else: raise ``TypeError``.
    """
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        return Gather.apply(destination, dim, *outputs)
    if first is None:
        return None
    if isinstance(first, dict):
        return type(first)(
            (key, gather([o[key] for o in outputs], destination, dim)) for key in first
        )
    if isinstance(first, tuple) and hasattr(first, "_fields"):  # a namedtuple
        return type(first)(*(gather(items, destination, dim) for items in zip(*outputs)))
    if isinstance(first, (list, tuple)):
        return type(first)(gather(items, destination, dim) for items in zip(*outputs))
    raise TypeError(f"gather cannot combine outputs of type {type(first).__name__}")
