"""attempt: run one call and keep what happened (its value, its exception, its warnings).

The pitfall sections each run the failing call, then the fixed one. ``attempt`` turns the
usual ``try: ... except ...: print(...)`` block into one line, and prints what a user would
see: the exception's type and message (for an exception re-raised from a replica, the line
naming the replica and the worker's last line, as in a traceback), and any warning.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

import dpkit


def _holds_tensors(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):
        return any(_holds_tensors(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_tensors(item) for item in value)
    return False


def describe(value: Any) -> str:
    """A short description of a returned value: tensor shapes and dtypes in containers; a
    value without tensors as its repr (``load_state_dict``'s ``<All keys matched ...>``)."""
    if not _holds_tensors(value):
        return repr(value)
    if isinstance(value, torch.Tensor):
        return f"tensor{list(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    if isinstance(value, dict):
        items = ", ".join(f"{key!r}: {describe(item)}" for key, item in value.items())
        return f"{type(value).__name__}({items})" if type(value) is not dict else f"{{{items}}}"
    if isinstance(value, (list, tuple)):
        items = ", ".join(describe(item) for item in value)
        return f"[{items}]" if isinstance(value, list) else f"({items})"
    return repr(value)


@dataclass
class Outcome:
    """What one call did: returned ``value``, or raised ``error``; ``warnings`` it emitted."""

    value: Any = None
    error: BaseException | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def raised(self) -> bool:
        return self.error is not None

    def message_lines(self) -> list[str]:
        """The error's message as a user reads it: a replica's re-raised exception as its
        first line (replica and device) and its last (the worker's error); else every line."""
        if self.error is None:
            return []
        lines = [line.strip() for line in str(self.error).strip().splitlines() if line.strip()]
        if any(line.startswith("Original Traceback") for line in lines):
            return [lines[0], f"... {lines[-1]}"]
        return lines

    def __str__(self) -> str:
        shown = [f"warning: {message}" for message in self.warnings]
        if self.error is not None:
            first, *rest = self.message_lines() or [""]
            shown.append(f"{type(self.error).__name__}: {first}")
            shown.extend(f"    {line}" for line in rest)
        else:
            shown.append(f"returned {describe(self.value)}")
        return "\n".join(shown)

    __repr__ = __str__


def attempt(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Outcome:
    """Run ``call(*args, **kwargs)``; return what it returned or raised, with its warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            value = call(*args, **kwargs)
        except Exception as error:  # the point is to show it
            return Outcome(error=error, warnings=[str(w.message) for w in caught])
    return Outcome(value=value, warnings=[str(w.message) for w in caught])


def replicas_run(call: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """How many replicas ran during ``call(*args, **kwargs)``: the ``apply`` events a trace
    recorded (0 when the call never went through DataParallel)."""
    with dpkit.trace() as recorded:
        call(*args, **kwargs)
    return sum(event.phase == "apply" for event in recorded.events)
