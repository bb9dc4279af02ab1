"""dpkit.verdict: the one way a notebook states a measured conclusion, on rounds made by hand
whose answer is known, and the sentence in the one form tests/verdict_checker.py parses."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dpkit.verdict import (
    SIZE_LABELS,
    Outcome,
    Rounds,
    conclude,
    conclude_from_quartiles,
    judge,
    machine_load,
)
from tests.verdict_checker import check_text, find_verdicts, unchecked_claims

WORDS = {
    Outcome.FASTER: "threads helped",
    Outcome.SLOWER: "threads hurt",
    Outcome.WITHIN_NOISE: "no difference",
    Outcome.TOO_NOISY: "cannot tell",
}


def _rounds(ratios: list[float]) -> Rounds:
    """Rounds whose ratios are exactly ``ratios``: A took 10 ms, B 10 / ratio ms."""
    return Rounds.of([10.0] * len(ratios), [10.0 / r for r in ratios])


@pytest.mark.parametrize(
    ("ratios", "expected"),
    [
        ([1.8, 1.9, 2.0, 2.1, 0.5], Outcome.FASTER),  # one slow round does not undo it
        ([0.4, 0.5, 0.45, 0.5, 3.0], Outcome.SLOWER),
        ([0.98, 1.01, 1.0, 1.03, 0.99], Outcome.WITHIN_NOISE),
        ([0.6, 1.5, 0.8, 1.3, 1.0], Outcome.TOO_NOISY),  # a median of 1 that means nothing
        ([0.6, 0.7, 1.0, 1.05, 1.08], Outcome.TOO_NOISY),  # the noise reaches only below 1
        ([1.2, 1.3, 1.25, 0.7, 0.75, 0.8, 1.0], Outcome.TOO_NOISY),  # two machines' moods
    ],
)
def test_the_outcome_is_the_one_the_middle_half_of_the_rounds_allows(ratios, expected):
    verdict = conclude(_rounds(ratios), WORDS)
    assert verdict.outcome is expected
    assert verdict.phrase == WORDS[expected]
    assert verdict.low <= verdict.ratio <= verdict.high


def test_a_median_above_1_with_over_a_quarter_of_the_rounds_below_is_no_speed_up():
    verdict = conclude(_rounds([0.8, 0.85, 0.9, 1.2, 1.3, 1.4, 1.5, 1.6]))
    assert verdict.ratio > 1 and verdict.low < 1
    assert verdict.outcome is Outcome.TOO_NOISY and not verdict.clear


def test_the_ratio_is_a_over_b_so_faster_means_b_took_less_time():
    serial, threads = [8.0, 8.2, 7.9, 8.1], [4.0, 4.1, 3.9, 4.2]
    assert conclude(Rounds.of(serial, threads)).outcome is Outcome.FASTER
    assert conclude(Rounds.of(threads, serial)).outcome is Outcome.SLOWER
    assert conclude(Rounds.of(serial, threads)).ratio == pytest.approx(2.0, rel=0.05)


def test_the_tolerance_separates_no_difference_from_too_noisy():
    assert judge(0.93, 1.08) is Outcome.WITHIN_NOISE
    assert judge(0.93, 1.08, tolerance=0.05) is Outcome.TOO_NOISY
    assert judge(0.8, 1.05) is Outcome.TOO_NOISY and judge(0.95, 1.2) is Outcome.TOO_NOISY
    assert judge(1.0, 1.0) is Outcome.WITHIN_NOISE  # the middle half at 1 exactly
    assert judge(1.001, 1.5) is Outcome.FASTER and judge(0.5, 0.999) is Outcome.SLOWER


def test_the_sentence_carries_the_numbers_it_was_computed_from():
    verdict = conclude_from_quartiles(1.23, 1.01, 1.56, WORDS)
    assert str(verdict) == "1.23x (middle half of the rounds: 1.01-1.56x) → faster: threads helped"
    noisy = str(conclude_from_quartiles(0.98, 0.71, 1.40, WORDS))
    assert noisy.endswith("→ too noisy to tell at this load (±10%): cannot tell")


def test_every_sentence_it_prints_passes_the_checker():
    for ratios in ([1.8, 1.9, 2.0, 2.1], [0.98, 1.0, 1.01, 1.02], [0.5, 1.5, 1.0, 0.9]):
        text = f"model: {conclude(_rounds(ratios), WORDS)}"
        (found,) = find_verdicts(text)
        assert found.problem() is None
        assert check_text(text) == []


def test_rounds_must_pair_and_be_enough_for_quartiles():
    with pytest.raises(ValueError, match="every round needs one of each"):
        Rounds.of([1.0] * 5, [1.0] * 4)
    with pytest.raises(ValueError, match="at least 4"):
        Rounds.of([1.0] * 3, [1.0] * 3)
    with pytest.raises(ValueError, match="positive"):
        Rounds.of([1.0, 1.0, 1.0, 0.0], [1.0] * 4)


def test_machine_load_sees_another_process_spinning():
    spin = "import time\nend = time.time() + 0.6\nwhile time.time() < end: pass"
    with machine_load() as load:
        subprocess.run([sys.executable, "-c", spin], check=True)
    assert load.cores >= 1
    if load.busy_elsewhere is None:  # not Linux: nothing to read
        assert "unknown" in str(load)
        return
    # the child is another process: at least part of a core, whatever else runs here
    assert 0.3 <= load.busy_elsewhere <= load.cores
    assert "cores busy" in str(load)


def test_the_checker_flags_a_verdict_its_numbers_contradict_and_an_unformed_claim():
    lying = "MatmulNet: 1.32x (middle half of the rounds: 0.86-1.40x) → faster: overlapped"
    (problem,) = check_text(lying)
    assert "means too noisy to tell at this load" in problem
    assert check_text("1.32x (middle half of the rounds: 1.01-1.40x) → faster") == []
    # a rounded 1.00 may have been 1.004: either side of 1 is accepted
    assert check_text("1.10x (middle half of the rounds: 1.00-1.20x) → faster") == []
    assert unchecked_claims("Same threads: the replicas overlapped.\n2 cores") == [
        "Same threads: the replicas overlapped."
    ]
    old_03 = "Same threads, same devices: the model's forward decides, by a factor of 0.4."
    assert unchecked_claims(old_03) == [old_03]  # printed whatever was measured


def test_sizes_print_smaller_and_larger_and_the_checker_reads_them_as_faster_and_slower():
    shares = conclude(
        Rounds.of([0.5, 0.55, 0.6, 0.52], [0.3, 0.31, 0.28, 0.33]), labels=SIZE_LABELS
    )
    assert str(shares) == (
        "1.72x (middle half of the rounds: 1.64-1.87x) → smaller: smaller in three rounds of four"
    )
    assert check_text(f"idle share: {shares}") == []
    (problem,) = check_text("0.60x (middle half of the rounds: 0.50-0.70x) → smaller")
    assert "means slower" in problem
    assert unchecked_claims("the bubble shrank from m=1 to m=8") != []  # 07's old sentence
