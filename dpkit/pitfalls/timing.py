"""Step times of the plain model and of DataParallel, with their run-to-run spread.

The surprise first: DataParallel pays a fixed price every step (copy the model to every
other device, start one thread per replica, gather, reduce the gradients), whatever the
batch. A small batch is all price; a large one hides it. A verdict here is only given when
the middle halves of the two sets of rounds do not overlap; otherwise the difference is
within the noise of this machine.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
from torch import nn

import dpkit
from dpkit.threads import intra_op_threads


@dataclass(frozen=True)
class Timing:
    """Milliseconds per round: median and quartiles of the measured rounds."""

    rounds_ms: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.rounds_ms)

    @property
    def quartiles(self) -> tuple[float, float]:
        low, _, high = statistics.quantiles(self.rounds_ms, n=4, method="inclusive")
        return low, high

    def __str__(self) -> str:
        low, high = self.quartiles
        return f"{self.median:.1f} ms (middle half of the rounds: {low:.1f}-{high:.1f} ms)"


@dataclass(frozen=True)
class StepComparison:
    """One training step of the plain model vs the same step through DataParallel."""

    batch: int
    devices: int
    single: Timing
    parallel: Timing

    @property
    def ratio(self) -> float:
        """How many times one device's step time DataParallel took."""
        return self.parallel.median / self.single.median

    @property
    def clear(self) -> bool:
        """Whether the two differ beyond the spread of their rounds (no quartile overlap)."""
        single_low, single_high = self.single.quartiles
        parallel_low, parallel_high = self.parallel.quartiles
        return single_high < parallel_low or parallel_high < single_low

    def verdict(self) -> str:
        if not self.clear:
            return f"batch {self.batch}: no difference beyond the run-to-run noise"
        slower = "slower" if self.ratio > 1 else "faster"
        times = self.ratio if self.ratio > 1 else 1 / self.ratio
        return f"batch {self.batch}: DataParallel was {times:.1f}x {slower} than one device"


def _step_ms(net: nn.Module, model: nn.Module, inputs: torch.Tensor, rounds: int) -> Timing:
    measured = []
    for _ in range(rounds + 1):  # the first round warms up
        start = time.perf_counter()
        model.zero_grad(set_to_none=True)
        net(inputs).square().mean().backward()
        measured.append((time.perf_counter() - start) * 1e3)
    return Timing(tuple(measured[1:]))


def compare_step_times(
    model: nn.Module, lanes: list[dpkit.Device], batch: int, rounds: int = 7
) -> StepComparison:
    """Time ``rounds`` training steps of ``model`` alone and through DataParallel on
    ``lanes``, with one intra-op thread (so that "one device" is the same compute in both)."""
    if rounds < 3:
        raise ValueError(f"rounds={rounds}: quartiles need at least 3 rounds; pass rounds>=3")
    in_features = next(module for module in model.modules() if isinstance(module, nn.Linear))
    inputs = dpkit.to_device(torch.randn(batch, in_features.in_features), lanes[0])
    parallel = dpkit.DataParallel(model, device_ids=lanes)
    with intra_op_threads(1):
        single = _step_ms(model, model, inputs, rounds)
        through_parallel = _step_ms(parallel, model, inputs, rounds)
    return StepComparison(batch, len(lanes), single, through_parallel)
