"""Reads a notebook's printed outputs and checks every verdict against the numbers printed with it.

A verdict prints in one form (dpkit.verdict)::

    1.23x (middle half of the rounds: 1.01-1.56x) → faster: ...
    0.98x (middle half of the rounds: 0.71-1.40x) → too noisy to tell at this load (±10%): ...
    1.80x (middle half of the rounds: 1.52-2.04x) → smaller: ... (sizes: smaller = faster)

The rule is restated here from the words of the course, not imported, so that a change to the
helper's rule that the notebooks' text no longer matches shows up: faster when the whole
middle half is above 1, slower when below, within the noise when it holds 1 and stays within
the tolerance, too noisy otherwise. Printed numbers are rounded, so an outcome is accepted when
numbers within half a unit of the last printed digit give it.

Lines that use a conclusion's words (faster, slower, overlapped, the noise, ...) without the
form are returned by :func:`unchecked_claims`: sentences this checker cannot check.

``python tests/verdict_checker.py notebooks/05_training.ipynb ...`` prints both for stored
outputs.
"""

from __future__ import annotations

import itertools
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

OUTCOMES = ("faster", "slower", "within the noise", "too noisy to tell at this load")
# A comparison of sizes (an idle share) says smaller and larger for faster and slower; of
# gaps between replicas' starts, further apart and closer together.
SIZE_WORDS = {
    "smaller": "faster",
    "larger": "slower",
    "further apart": "faster",
    "closer together": "slower",
}
DEFAULT_TOLERANCE = 0.10
_NUMBER = r"(\d+(?:\.\d+)?)"
VERDICT = re.compile(
    rf"{_NUMBER}x \(middle half of the rounds: {_NUMBER}-{_NUMBER}x\) → "
    rf"({'|'.join((*OUTCOMES, *SIZE_WORDS))})(?: \(±(\d+)%\))?"
)
# Words that state a measured outcome; a line holding one and no verdict cannot be checked.
CLAIM = re.compile(
    r"\b(faster|slower|overlapp?ed|the noise|noisy|speed-?up was|shrinks|shrank|shrinking|grows|"
    r"further apart|closer together|as far apart|"
    r"more than the noise|no difference|pays off|did not get faster|decides|by a factor of)\b",
    re.IGNORECASE,
)


# The notebooks that measure, with the fewest verdicts each prints and the cells whose words
# are not measurements (cell id: why). nbval checks every cell of theirs as it runs
# (notebooks/conftest.py), and tests/test_verdicts_under_load.py their stored outputs.
MEASURING: dict[str, tuple[int, dict[str, str]]] = {
    # at least: the start gaps, the default threads, the loop's speed-up and the two models'
    # ratio (a speed-up beyond the cores prints no verdict: its serial run was disturbed)
    "03_parallel_apply": (4, {}),
    # one per batch size
    "05_training": (5, {}),
    # the calibrated prediction against the measured steps (its other numbers are predicted)
    "06_communication_and_scaling": (
        1,
        {"c0afa55d": "DDP against DataParallel on the A100 preset: predicted, not measured"},
    ),
    # DDP against DataParallel; the bubble from m=1 and from m=4 to m=8
    "07_beyond_dataparallel": (3, {}),
    # batch 16 and batch 256
    "08_pitfalls": (
        2,
        {
            "5919d855": "the pitfalls' names (pitfalls.contents): symptoms users report",
            "a3081180": "the reading list's headings: the same names, with the issues",
        },
    ),
    # the graph walk of find_unused_parameters=True against static_graph=True, pair by pair
    "09_to_the_cluster": (
        1,
        {"483597f1": "dpkit plan's choice among strategies: predicted, not measured"},
    ),
}


def _expected(low: float, high: float, tolerance: float) -> str:
    if low > 1:
        return "faster"
    if high < 1:
        return "slower"
    if low >= 1 / (1 + tolerance) and high <= 1 + tolerance:
        return "within the noise"
    return "too noisy to tell at this load"


def _rounding(printed: str) -> float:
    """Half a unit of the last printed digit."""
    decimals = len(printed.partition(".")[2])
    return 0.5 * 10**-decimals


@dataclass(frozen=True)
class FoundVerdict:
    text: str  # the whole printed line
    ratio: str
    low: str
    high: str
    outcome: str
    tolerance: float

    def possible_outcomes(self) -> set[str]:
        """Every outcome the printed quartiles allow, given their rounding."""
        lows = [float(self.low) + d * _rounding(self.low) for d in (-1, 0, 1)]
        highs = [float(self.high) + d * _rounding(self.high) for d in (-1, 0, 1)]
        return {_expected(lo, hi, self.tolerance) for lo, hi in itertools.product(lows, highs)}

    def problem(self) -> str | None:
        """Why this verdict contradicts its numbers, or None."""
        ratio, low, high = float(self.ratio), float(self.low), float(self.high)
        slack = _rounding(self.ratio) + max(_rounding(self.low), _rounding(self.high))
        if not low - slack <= ratio <= high + slack or low > high:
            return f"the median {self.ratio}x lies outside its middle half {self.low}-{self.high}x"
        if self.outcome not in self.possible_outcomes():
            expected = " or ".join(sorted(self.possible_outcomes()))
            return f"says {self.outcome!r} but {self.low}-{self.high}x means {expected}"
        return None


def find_verdicts(text: str) -> list[FoundVerdict]:
    found = []
    for line in text.splitlines():
        for match in VERDICT.finditer(line):
            ratio, low, high, outcome, percent = match.groups()
            outcome = SIZE_WORDS.get(outcome, outcome)
            tolerance = int(percent) / 100 if percent else DEFAULT_TOLERANCE
            found.append(FoundVerdict(line.strip(), ratio, low, high, outcome, tolerance))
    return found


def check_text(text: str) -> list[str]:
    """One message per verdict in ``text`` that contradicts its own numbers."""
    return [f"{v.problem()}: {v.text}" for v in find_verdicts(text) if v.problem()]


def unchecked_claims(text: str) -> list[str]:
    """Lines that state a measured outcome in words but not in the verdict's form."""
    return [
        line.strip()
        for line in text.splitlines()
        if CLAIM.search(line) and not VERDICT.search(line)
    ]


def printed_text(cell: nbformat.NotebookNode | dict) -> str:
    """What a code cell printed: its streams and the plain text of its results."""
    parts = []
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            parts.append(output.text)
        elif output.output_type in ("execute_result", "display_data"):
            plain = output.get("data", {}).get("text/plain", "")
            if not plain.startswith("<Figure") and "widget" not in str(output.get("data", {})):
                parts.append(plain)
    return "".join(parts)


@dataclass(frozen=True)
class CellReport:
    index: int
    verdicts: int
    contradictions: list[str]
    unchecked: list[str]


def check_notebook(path: str | Path) -> list[CellReport]:
    """Per code cell with output: its verdicts, the contradicting ones, the unchecked claims."""
    notebook = nbformat.read(path, as_version=4)
    reports = []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        text = printed_text(cell)
        if text:
            reports.append(
                CellReport(
                    index, len(find_verdicts(text)), check_text(text), unchecked_claims(text)
                )
            )
    return reports


def cell_problems(text: str, cell_id: str | None, not_measurements: dict[str, str]) -> list[str]:
    """What a cell printed that a learner could not trust: verdicts its numbers contradict,
    and (unless the cell is one of ``not_measurements``) outcomes stated outside the form."""
    problems = check_text(text)
    if cell_id not in not_measurements:
        problems += [f"states an unchecked outcome: {line}" for line in unchecked_claims(text)]
    return problems


def main(paths: list[str]) -> int:
    status = 0
    for path in paths:
        print(f"== {path}")
        for report in check_notebook(path):
            for problem in report.contradictions:
                status = 1
                print(f"  c{report.index} CONTRADICTS: {problem}")
            for line in report.unchecked:
                print(f"  c{report.index} cannot check: {line}")
            if report.verdicts and not report.contradictions:
                print(f"  c{report.index}: {report.verdicts} verdict(s) agree with their numbers")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
