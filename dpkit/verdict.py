"""One way to state a measured conclusion: faster, slower, within the noise, or too noisy to tell.

The surprise first: on a laptop shared with other programs, one measurement of A against B
flips from run to run, because another program took a core during some of it. So A and B are
measured in *rounds*: in every round they run back to back, so that both see the same moment
of the machine, and each round gives one ratio, A's time over B's (B's speed-up over A). The
middle half of the rounds' ratios (from the lower to the upper quartile) is the run-to-run
spread, and the conclusion is the one that spread allows (:func:`judge`):

- **faster**: the whole middle half lies above 1 (three rounds in four say B was faster);
- **slower**: the whole middle half lies below 1;
- **within the noise**: the middle half holds 1 and stays within ``tolerance`` of it (10%):
  whatever difference there is, it is smaller than the noise and than one worth reporting;
- **too noisy to tell at this load**: the middle half holds 1 and reaches further: a
  difference that matters could hide in the spread, so no conclusion; rerun on a quieter
  machine, or with more rounds.

Every conclusion prints in one form, the numbers first (:meth:`Verdict.__str__`)::

    1.23x (middle half of the rounds: 1.01-1.56x) → faster: the replicas overlapped
    0.98x (middle half of the rounds: 0.71-1.40x) → too noisy to tell at this load (±10%): ...

so that a reader (and ``tests/verdict_checker.py``) can check the outcome against them.
A comparison of sizes rather than times (an idle share, a byte count) prints *smaller* and
*larger* for faster and slower (``labels=SIZE_LABELS``): same rule, words that fit.
:func:`machine_load` measures how much of the machine other programs used meanwhile, for
the sentence that says why a lesson varies.
"""

from __future__ import annotations

import contextlib
import enum
import os
import statistics
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

TOLERANCE = 0.10  # the smallest difference worth reporting: 10% either way
ARROW = "→"


class Outcome(str, enum.Enum):
    """What the rounds allow one to say about B against A."""

    FASTER = "faster"
    SLOWER = "slower"
    WITHIN_NOISE = "within the noise"
    TOO_NOISY = "too noisy to tell at this load"


# What each outcome means for a speed-up; a caller passes its own words for its comparison.
DEFAULT_WORDING: Mapping[Outcome, str] = {
    Outcome.FASTER: "faster in three rounds of four",
    Outcome.SLOWER: "slower in three rounds of four",
    Outcome.WITHIN_NOISE: "no difference beyond the run-to-run noise",
    Outcome.TOO_NOISY: "the rounds disagree by more than that; rerun on a quieter machine",
}


# How the outcome prints when A and B are sizes, not times: B/A below 1 reads "smaller".
SIZE_LABELS: Mapping[Outcome, str] = {Outcome.FASTER: "smaller", Outcome.SLOWER: "larger"}


@dataclass(frozen=True)
class Rounds:
    """Interleaved measurements: in round ``i``, ``baseline[i]`` (A) and ``candidate[i]`` (B)
    ran back to back. Times in any one unit; only their ratios matter."""

    baseline: tuple[float, ...]
    candidate: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.baseline) != len(self.candidate):
            raise ValueError(
                f"rounds: {len(self.baseline)} baseline times but {len(self.candidate)} "
                "candidate times; every round needs one of each"
            )
        if len(self.baseline) < 4:
            raise ValueError(
                f"rounds: {len(self.baseline)} given; at least 4 are needed for the quartiles "
                "of the noise"
            )
        if min(self.baseline + self.candidate) <= 0:
            raise ValueError("rounds: every time must be positive")

    @classmethod
    def of(cls, baseline: Sequence[float], candidate: Sequence[float]) -> Rounds:
        return cls(tuple(baseline), tuple(candidate))

    @property
    def ratios(self) -> list[float]:
        """One ratio per round: A's time over B's (above 1: B was faster in that round)."""
        return [a / b for a, b in zip(self.baseline, self.candidate)]

    def quartiles(self) -> tuple[float, float, float]:
        """Lower quartile, median and upper quartile of the rounds' ratios."""
        return middle_half(self.ratios)


def middle_half(values: Sequence[float]) -> tuple[float, float, float]:
    """Lower quartile, median and upper quartile of ``values`` (one value: itself, thrice)."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    low, middle, high = statistics.quantiles(values, n=4, method="inclusive")
    return low, middle, high


def judge(low: float, high: float, tolerance: float = TOLERANCE) -> Outcome:
    """The outcome the middle half of the rounds' ratios (``low``-``high``) allows."""
    if low > 1:
        return Outcome.FASTER
    if high < 1:
        return Outcome.SLOWER
    if low >= 1 / (1 + tolerance) and high <= 1 + tolerance:
        return Outcome.WITHIN_NOISE
    return Outcome.TOO_NOISY


@dataclass(frozen=True)
class Verdict:
    """A conclusion with the numbers it was computed from; ``str()`` is the sentence."""

    outcome: Outcome
    ratio: float  # the median round's ratio
    low: float
    high: float
    phrase: str  # the caller's words for this outcome
    tolerance: float = TOLERANCE
    rounds: int | None = field(default=None, compare=False)
    labels: Mapping[Outcome, str] | None = field(default=None, compare=False)  # SIZE_LABELS

    def __str__(self) -> str:
        numbers = f"{self.ratio:.2f}x (middle half of the rounds: {self.low:.2f}-{self.high:.2f}x)"
        outcome = (self.labels or {}).get(self.outcome, self.outcome.value)
        if self.outcome in (Outcome.WITHIN_NOISE, Outcome.TOO_NOISY):
            outcome += f" (±{self.tolerance:.0%})"
        return f"{numbers} {ARROW} {outcome}" + (f": {self.phrase}" if self.phrase else "")

    @property
    def clear(self) -> bool:
        """Whether the rounds say one of the two was faster."""
        return self.outcome in (Outcome.FASTER, Outcome.SLOWER)


def _verdict(
    ratio: float,
    low: float,
    high: float,
    wording: Mapping[Outcome, str] | None,
    tolerance: float,
    rounds: int | None,
    labels: Mapping[Outcome, str] | None = None,
) -> Verdict:
    outcome = judge(low, high, tolerance)
    sized = {o: f"{label} in three rounds of four" for o, label in (labels or {}).items()}
    words = {**DEFAULT_WORDING, **sized, **(wording or {})}
    return Verdict(outcome, ratio, low, high, words[outcome], tolerance, rounds, labels)


def conclude(
    rounds: Rounds,
    wording: Mapping[Outcome, str] | None = None,
    tolerance: float = TOLERANCE,
    labels: Mapping[Outcome, str] | None = None,
) -> Verdict:
    """The conclusion ``rounds`` allow, in ``wording`` (a phrase per outcome; missing ones
    from :data:`DEFAULT_WORDING`); ``labels``: :data:`SIZE_LABELS` where A and B are sizes."""
    low, middle, high = rounds.quartiles()
    return _verdict(middle, low, high, wording, tolerance, len(rounds.ratios), labels)


def conclude_from_quartiles(
    ratio: float,
    low: float,
    high: float,
    wording: Mapping[Outcome, str] | None = None,
    tolerance: float = TOLERANCE,
) -> Verdict:
    """The same conclusion from rounds already reduced to their median and quartiles."""
    return _verdict(ratio, low, high, wording, tolerance, None)


# --------------------------------------------------------------------------------------
# The load: how much of the machine other programs used while the rounds ran


@dataclass
class Load:
    """Cores' worth of CPU time other processes used during a block, on a machine of
    ``cores`` cores; ``busy_elsewhere`` is None where the system does not say (not Linux)."""

    cores: int
    busy_elsewhere: float | None = None

    def __str__(self) -> str:
        if self.busy_elsewhere is None:
            return f"other programs' use of the {self.cores} cores unknown"
        return f"other programs kept {self.busy_elsewhere:.1f} of {self.cores} cores busy"


def _cpu_seconds_busy() -> tuple[float, int] | None:
    """All processes' CPU seconds so far, from /proc/stat, and the cores it counts."""
    try:
        with open("/proc/stat") as stat:
            lines = stat.read().splitlines()
    except OSError:
        return None
    fields = [int(value) for value in lines[0].split()[1:]]
    # user nice system idle iowait irq softirq steal: all but idle and iowait are busy
    busy = sum(fields[:3]) + sum(fields[5:8])
    cores = sum(line.startswith("cpu") and line[3:4].isdigit() for line in lines)
    return busy / os.sysconf("SC_CLK_TCK"), cores


@contextlib.contextmanager
def machine_load() -> Iterator[Load]:
    """Measure, over the block, how many cores other processes kept busy (all processes'
    CPU time minus this one's, over the wall time); filled in when the block ends."""
    before, own, start = _cpu_seconds_busy(), time.process_time(), time.perf_counter()
    load = Load(before[1] if before else (os.cpu_count() or 1))
    try:
        yield load
    finally:
        after, wall = _cpu_seconds_busy(), time.perf_counter() - start
        if before and after and wall > 0:
            others = (after[0] - before[0]) - (time.process_time() - own)
            load.busy_elsewhere = min(max(others / wall, 0.0), float(load.cores))
