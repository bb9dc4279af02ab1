"""Step times of the plain model and of DataParallel, with their run-to-run spread.

The surprise first: DataParallel pays a fixed price every step (copy the model to every
other device, start one thread per replica, gather, reduce the gradients), whatever the
batch. A small batch is all price; a large one hides it. The two run in interleaved rounds
(in every round one step of each, back to back, as notebook 05 does), and the conclusion is
:mod:`dpkit.verdict`'s: faster or slower only where the middle half of the rounds' speed-ups
lies on one side of 1, otherwise within the noise or too noisy to tell at this load.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch
from torch import nn

import dpkit
from dpkit import host_clock, verdict
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
    """One training step of the plain model vs the same step through DataParallel, measured
    in the same rounds: ``single.rounds_ms[i]`` and ``parallel.rounds_ms[i]`` ran back to back."""

    batch: int
    devices: int
    single: Timing
    parallel: Timing

    def conclusion(self) -> verdict.Verdict:
        """What the rounds allow one to say about DataParallel against one device."""
        rounds = verdict.Rounds.of(self.single.rounds_ms, self.parallel.rounds_ms)
        return verdict.conclude(rounds, WORDING)


WORDING = {
    verdict.Outcome.FASTER: "DataParallel was faster than one device in three rounds of four",
    verdict.Outcome.SLOWER: "DataParallel was slower than one device in three rounds of four",
}


def _step_ms(net: nn.Module, model: nn.Module, inputs: torch.Tensor) -> float:
    start = host_clock.now()  # on a GPU: once its queued work is done, not at launch
    model.zero_grad(set_to_none=True)
    net(inputs).square().mean().backward()
    return (host_clock.now() - start) * 1e3


def compare_step_times(
    model: nn.Module, lanes: list[dpkit.Device], batch: int, rounds: int = 7
) -> StepComparison:
    """Time ``rounds`` training steps of ``model`` alone and through DataParallel on
    ``lanes`` in interleaved rounds (one step of each per round, after one warm-up step of
    each), with one intra-op thread (so that "one device" is the same compute in both)."""
    if rounds < 4:
        raise ValueError(f"rounds={rounds}: the quartiles of the noise need at least 4 rounds")
    in_features = next(module for module in model.modules() if isinstance(module, nn.Linear))
    inputs = dpkit.to_device(torch.randn(batch, in_features.in_features), lanes[0])
    parallel = dpkit.DataParallel(model, device_ids=lanes)
    single_ms, parallel_ms = [], []
    with intra_op_threads(1):
        _step_ms(model, model, inputs)
        _step_ms(parallel, model, inputs)
        for _ in range(rounds):
            single_ms.append(_step_ms(model, model, inputs))
            parallel_ms.append(_step_ms(parallel, model, inputs))
    return StepComparison(batch, len(lanes), Timing(tuple(single_ms)), Timing(tuple(parallel_ms)))
