"""Which traces record the work in this thread, and which step and pass of it the work is in.

A **scope** is the traces open in one thread and the count of steps their work has begun
(:class:`Scope`). ``with dpkit.trace():`` opens one in the thread that enters it (a nested
trace joins it); work started there carries it along: ``parallel_apply`` hands it to its
worker threads (:func:`within`), and an autograd function notes it with the step in its
forward and runs its backward under both (:func:`backward_of`), in whatever thread autograd
runs it. So a trace records the work started under it, and nothing another thread does
meanwhile. A thread outside every trace is in the shared scope :data:`NO_SCOPE`, which
records into nothing.

DataParallel's forward begins a step (:func:`begin_step`). Each of dpkit's autograd
functions notes the step and scope in its forward (as torch's note ``ctx.input_device``)
and runs its backward under them with :func:`backward_of`, both done by one class decorator
in :mod:`dpkit._functions`: so a copy made in a backward knows it moves gradients, and of
which step, without an argument threaded through every call. comm reads
:func:`in_backward` (on GPU lanes a gradient read or made on a lane's own stream is
recorded for torch's allocator); the trace reads both to name a copy's phase (``scatter``
or ``grad_scatter``) and file it under its step.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Scope:
    """The traces recording one thread's work (``recorders``, innermost last), the steps
    that work has begun (``step``), and the devices whose allocator a step reads."""

    __slots__ = ("recorders", "step", "allocator_devices")

    def __init__(self) -> None:
        self.recorders: list[Any] = []  # dpkit.tracing.Trace objects
        self.step = 0
        self.allocator_devices: tuple[Any, ...] = ()


NO_SCOPE = Scope()  # every thread outside a trace: records nothing; hooks alone count here


class _ThreadState(threading.local):
    """Per thread: its scope, and the step whose backward it runs (None: none). The class
    attributes are every new thread's values, read without a getattr default."""

    scope: Scope = NO_SCOPE
    step: int | None = None


_local = _ThreadState()


def current_scope() -> Scope:
    """The scope of the work this thread runs."""
    return _local.scope


def open_scope() -> Scope:
    """This thread's scope, a new one if it had none (an outermost trace begins: its steps
    count from 1)."""
    if _local.scope is NO_SCOPE:
        _local.scope = Scope()
    return _local.scope


def close_scope(scope: Scope) -> None:
    """Leave ``scope`` in this thread when no trace records in it any more."""
    if not scope.recorders and _local.scope is scope:
        _local.scope = NO_SCOPE


class within:  # noqa: N801 (a context manager named as the function it replaced)
    """Run the block in ``scope``: a worker thread does the work its caller started.
    (A class: entered by every traced worker, and cheaper than a generator.)"""

    __slots__ = ("scope", "before")

    def __init__(self, scope: Scope) -> None:
        self.scope = scope

    def __enter__(self) -> None:
        self.before = _local.scope
        _local.scope = self.scope

    def __exit__(self, *exc_info: Any) -> None:
        _local.scope = self.before


def begin_step() -> int:
    """A new step begins in this thread's scope (a DataParallel forward): its number."""
    _local.scope.step += 1
    return _local.scope.step


def current_step() -> int:
    """The step of the backward this thread runs, else the step the last forward began."""
    return _local.scope.step if _local.step is None else _local.step


def in_backward() -> bool:
    """Whether this thread runs the backward of an autograd function of dpkit's."""
    return _local.step is not None


@contextmanager
def backward_of(step: int, scope: Scope | None = None) -> Iterator[None]:
    """Run the block as part of ``step``'s backward (autograd functions' ``backward``).

    ``scope``, the forward's, is used where this thread records into no trace of its own:
    in autograd's threads (one per GPU). Where it does (a backward on the CPU runs in the
    thread that called ``backward()``), the traces open there record it.
    """
    before_step, before_scope = _local.step, _local.scope
    _local.step = step
    if scope is not None and not before_scope.recorders:
        _local.scope = scope
    try:
        yield
    finally:
        _local.step, _local.scope = before_step, before_scope
