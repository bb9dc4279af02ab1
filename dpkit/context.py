"""Which step, and which pass of it, the work in this thread belongs to.

DataParallel's forward begins a step (:func:`begin_step`). An autograd function notes the
step in its forward (``ctx.step = current_step()``, as torch's note ``ctx.input_device``)
and runs its backward under it (``with backward_of(ctx.step):``), in whatever thread autograd
runs it: so a copy made in a backward knows it moves gradients, and of which step, without
an argument threaded through every call. comm reads :func:`in_backward` (on GPU lanes a
gradient read or made on a lane's own stream is recorded for torch's allocator); the trace
reads both to name a copy's phase (``scatter`` or ``grad_scatter``) and file it under its
step.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_step = 0
_backward = threading.local()  # .step: the step whose backward this thread runs, if any


def begin_step() -> int:
    """A new step begins (a DataParallel forward): its number."""
    global _step
    _step += 1
    return _step


def restart_steps() -> None:
    """Count steps from 1 again (an outermost ``dpkit.trace()`` begins)."""
    global _step
    _step = 0


def current_step() -> int:
    """The step of the backward this thread runs, else the step the last forward began."""
    step = getattr(_backward, "step", None)
    return _step if step is None else step


def in_backward() -> bool:
    """Whether this thread runs the backward of an autograd function of dpkit's."""
    return getattr(_backward, "step", None) is not None


@contextmanager
def backward_of(step: int) -> Iterator[None]:
    """Run the block as part of ``step``'s backward (autograd functions' ``backward``)."""
    before = getattr(_backward, "step", None)
    _backward.step = step
    try:
        yield
    finally:
        _backward.step = before
