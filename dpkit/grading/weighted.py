"""More checks the parent decides: task 6's weighted chunk sizes and simulated step time.

The surprise first: the optimality check was a Hypothesis property in the grading process;
here the parent draws the cases (with the edges Hypothesis would try first: no rows, one
device, the slowest and fastest speeds) and computes the best step time itself, by handing
out the rows one at a time to the device that finishes soonest (a heap, so a case of 300
rows costs the parent well under a millisecond). Each function here is one side of a check
that :data:`dpkit.grading.decided.CHECKS` lists; sizes come back as
:func:`dpkit.grading.decided.pack_sizes` packs them.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Mapping, Sequence

import torch


def step_time(sizes: Sequence[int], speeds: Sequence[float]) -> float:
    return max(rows / speed for rows, speed in zip(sizes, speeds))


def best_step_time(batch: int, speeds: Sequence[float]) -> float:
    """The optimum: each row in turn to the device with the smallest (rows + 1) / speed."""
    sizes = [0] * len(speeds)
    heap = [(1 / speed, index) for index, speed in enumerate(speeds)]
    heapq.heapify(heap)
    for _ in range(batch):
        _, index = heapq.heappop(heap)
        sizes[index] += 1
        heapq.heappush(heap, ((sizes[index] + 1) / speeds[index], index))
    return step_time(sizes, speeds)


def _sizes(cases: Sequence[Sequence], values: Mapping[str, torch.Tensor]) -> list | None:
    """Each case's sizes as sent (flat sizes and their lengths); None if they do not fit."""
    sizes, lengths = values.get("sizes"), values.get("lengths")
    for tensor in (sizes, lengths):
        if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.int64 or tensor.ndim != 1:
            return None
    assert sizes is not None and lengths is not None
    if len(lengths) != len(cases) or bool((lengths < 0).any()) or lengths.sum() != len(sizes):
        return None
    return [part.tolist() for part in torch.split(sizes, lengths.tolist())]


NOT_SIZES = "the outputs sent for weighted_chunk_sizes are not the lists of sizes asked for"


def _split_hint(batch: int, speeds: Sequence[float], got: list[int]) -> str | None:
    if len(got) != len(speeds) or min(got, default=0) < 0 or sum(got) != batch:
        return (
            f"weighted_chunk_sizes({batch}, {list(speeds)}) returned {got}: one size >= 0 per "
            f"device, adding up to the batch {batch}"
        )
    return None


def split_inputs(rng: random.Random) -> list[list]:
    """Two (batch, three speeds) cases, then 1-3 rows over 5-8 equal devices (where rounding
    each device's share gives sizes that do not add up to the batch)."""
    cases = [
        [rng.randint(1, 60), [round(rng.uniform(0.5, 4.0), 2) for _ in range(3)]] for _ in range(2)
    ]
    return [*cases, [rng.randint(1, 3), [1.0] * rng.randint(5, 8)]]


def judge_split(cases: list, values: Mapping[str, torch.Tensor]) -> str | None:
    answers = _sizes(cases, values)
    if answers is None:
        return NOT_SIZES
    for (batch, speeds), got in zip(cases, answers):
        hint = _split_hint(batch, speeds, got)
        if hint is not None:
            return hint
    return None


def balance_inputs(rng: random.Random) -> list[list]:
    """Five (batch, equal speeds) cases, fewer rows than devices among them."""
    cases = [[rng.randint(0, 3), [1.0] * rng.randint(4, 8)]]
    cases += [[rng.randint(0, 40), [1.0] * rng.randint(1, 8)] for _ in range(4)]
    return cases


def judge_balance(cases: list, values: Mapping[str, torch.Tensor]) -> str | None:
    answers = _sizes(cases, values)
    if answers is None:
        return NOT_SIZES
    for (batch, speeds), got in zip(cases, answers):
        hint = _split_hint(batch, speeds, got)
        if hint is None and max(got, default=0) - min(got, default=0) > 1:
            hint = (
                f"{batch} rows over {len(speeds)} equal devices gave {got}; sizes should "
                "differ by at most one"
            )
        if hint is not None:
            return hint
    return None


def optimal_inputs(rng: random.Random) -> list[list]:
    """Sixty (batch, speeds) cases, the edges first: no rows, one device, a very slow and
    a very fast device, a case rounding fails, then batches of 0-300 over 1-8 speeds in
    [0.1, 10] (in 200 draws, each caught rounding by largest remainder)."""
    cases: list[list] = [[0, [1.0, 2.0]], [7, [3.5]], [300, [0.1, 10.0]], [1, [0.1, 0.1, 10.0]]]
    cases.append([2, [1.0, 3.0]])  # rounding shares by largest remainder gives [1, 1] here
    while len(cases) < 60:
        speeds = [round(rng.uniform(0.1, 10.0), 3) for _ in range(rng.randint(1, 8))]
        cases.append([rng.randint(0, 300), speeds])
    return cases


def judge_optimal(cases: list, values: Mapping[str, torch.Tensor]) -> str | None:
    answers = _sizes(cases, values)
    if answers is None:
        return NOT_SIZES
    for (batch, speeds), got in zip(cases, answers):
        hint = _split_hint(batch, speeds, got)
        if hint is not None:
            return hint
        took, best = step_time(got, speeds), best_step_time(batch, speeds)
        if not took <= best * (1 + 1e-9):
            return (
                f"sizes {got} for speeds {speeds} take {took:.4f}, but {best:.4f} is possible: "
                "give each row to the device with the smallest (rows + 1) / speed; rounding "
                "proportional shares is not enough"
            )
    return None


def simulated_inputs(rng: random.Random) -> list[list]:
    """Three (sizes, speeds, seconds per row) cases, an idle device in one."""
    cases = []
    for idle in (False, True, False):
        devices = rng.randint(2, 5)
        sizes = [rng.randint(1, 20) for _ in range(devices)]
        if idle:
            sizes[rng.randrange(devices)] = 0
        speeds = [round(rng.uniform(0.25, 4.0), 2) for _ in range(devices)]
        cases.append([sizes, speeds, round(rng.uniform(0.1, 1.0), 3)])
    return cases


def judge_simulated(cases: list, values: Mapping[str, torch.Tensor]) -> str | None:
    seconds = values.get("seconds")
    if not isinstance(seconds, torch.Tensor) or seconds.dtype != torch.float64:
        return "the outputs sent for simulated_step_time are not the times asked for"
    if seconds.shape != (len(cases),):
        return "the outputs sent for simulated_step_time do not answer the inputs chosen"
    for (sizes, speeds, per_row), got in zip(cases, seconds.tolist()):
        want = max(rows * per_row / speed for rows, speed in zip(sizes, speeds))
        if not abs(got - want) <= 1e-9 * max(want, 1.0):
            return (
                f"simulated_step_time({sizes}, {speeds}, {per_row}) gave {got}, but the slowest "
                f"device needs {want:.6g} s (rows * per_row_seconds / speed), and the step "
                "lasts as long as the slowest device"
            )
    return None


# --------------------------------------------------------------------------------------
# measure_step_time: the devices sleep at the same time, and the time is the wall clock's.

PER_ROW = 0.005  # seconds each row sleeps at speed 1


def measured_inputs(rng: random.Random) -> list:
    """4 or 5 devices' sizes and speeds (0.5, 1 or 2), each sleeping 50-60 ms: at once
    they take the longest sleep, one after another at least 150 ms more (the grader's
    fixed case left 145 ms for sleep's overshoot on a busy machine; so does this)."""
    while True:
        speeds = [rng.choice((0.5, 1.0, 2.0)) for _ in range(rng.randint(4, 5))]
        sizes = [max(1, round(rng.uniform(0.05, 0.06) * s / PER_ROW)) for s in speeds]
        sleeps = [rows * PER_ROW / speed for rows, speed in zip(sizes, speeds)]
        if max(sleeps) <= 0.07 and sum(sleeps) - max(sleeps) >= 0.15:
            return [sizes, speeds, PER_ROW]


def judge_measured(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    sizes, speeds, per_row = inputs
    times = values.get("seconds")  # (what measure_step_time returned, the call's own time)
    if not isinstance(times, torch.Tensor) or times.dtype != torch.float64:
        return "the outputs sent for measure_step_time are not the times asked for"
    if times.shape != (2,):
        return "the outputs sent for measure_step_time do not answer the inputs chosen"
    measured, outside = times.tolist()
    sleeps = [rows * per_row / speed for rows, speed in zip(sizes, speeds)]
    longest, together = max(sleeps), sum(sleeps)
    if not measured <= outside + 1e-3:
        return "the measured time is longer than the call itself"
    if not measured >= longest - 1e-3:
        return (
            f"measured {measured:.3f} s, but the slowest device sleeps {longest:.3f} s: sleep in "
            "each thread and time from the first start to the last join"
        )
    # One after another takes at least the sum: sleep never undershoots.
    if not measured < together - 0.005:  # NaN fails too
        return (
            f"measured {measured:.3f} s; the {len(sizes)} devices take {longest:.3f} s together, "
            f"{together:.3f} s one after another: start every thread before joining any"
        )
    return _judge_sleeps(sleeps, values.get("sleeps"))


def _judge_sleeps(sleeps: list[float], recorded: torch.Tensor | None) -> str | None:
    """The time.sleep calls the grader recorded, rows of (thread, seconds, start, end): one
    thread per device slept that device's time, and the sleeps overlapped. A returned time
    alone is easy to fake (one sleep of the slowest device's time, returned); these are the
    work itself. No clock is read here but the grader's: one after another, the sleeps span
    at least their sum, so a span shorter than the sum proves they ran at the same time."""
    if (
        not isinstance(recorded, torch.Tensor)
        or recorded.dtype != torch.float64
        or recorded.ndim != 2
        or recorded.shape[1] != 4
    ):
        return "the outputs sent for measure_step_time do not hold the sleeps recorded"
    by_thread: dict[float, float] = {}
    for thread, seconds, _, _ in recorded.tolist():
        by_thread[thread] = by_thread.get(thread, 0.0) + seconds
    slept = sorted(seconds for seconds in by_thread.values() if seconds != 0)
    want = sorted(seconds for seconds in sleeps if seconds != 0)  # an idle device may not sleep
    if len(slept) != len(want) or not all(abs(a - b) <= 1e-6 for a, b in zip(slept, want)):
        listed = ", ".join(f"{seconds:.4f}" for seconds in slept) or "nothing"
        return (
            f"the {len(want)} devices sleep {', '.join(f'{s:.4f}' for s in want)} s, each in a "
            f"thread of its own, but the threads' time.sleep calls added up to {listed} s: "
            "start a thread per device, each sleeping for its device's rows"
        )
    span = float(recorded[:, 3].max() - recorded[:, 2].min())
    if not span < sum(want) - 1e-3:  # NaN fails too
        return (
            f"the devices' sleeps ran one after another ({span:.3f} s from the first start to "
            f"the last end, {sum(want):.3f} s of sleep): start every thread before joining any"
        )
    return None
