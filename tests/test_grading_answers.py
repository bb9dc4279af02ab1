"""The parent's checks give the verdicts and hints worked out here by hand (issue 32).

tests/test_grading_decided.py shows that a right answer passes and a wrong one fails on
the parent's random draws; these tests pin the answers themselves on cases small enough to
do on paper (a weighted split, a step time, a tolerance's edge), and check that the
parent's draws cover the ranges the graders promise (each check's docstring), so that a
check cannot go soft without a test saying so. Found by the mutation run
(``make mutation FILES=dpkit/grading/weighted.py``).
"""

from __future__ import annotations

import random

import pytest
import torch

from dpkit.grading import weighted
from dpkit.grading.decided import pack_sizes

# --------------------------------------------------------------------------------------
# Task 6's weighted split (dpkit/grading/weighted.py)


def times(*values: float) -> dict[str, torch.Tensor]:
    return {"seconds": torch.tensor(values, dtype=torch.float64)}


def test_step_time_is_the_slowest_devices_rows_over_its_speed():
    # 3 rows at speed 1 take 3 s, 1 row at speed 2 takes 0.5 s: the step lasts 3 s
    assert weighted.step_time([3, 1], [1.0, 2.0]) == 3.0
    assert weighted.step_time([2, 6], [1.0, 4.0]) == 2.0  # 2 / 1 against 6 / 4
    assert weighted.step_time([0, 5], [1.0, 2.0]) == 2.5


@pytest.mark.parametrize(
    ("batch", "speeds", "best"),
    [
        (0, [1.0, 2.0], 0.0),  # no rows, no time
        (7, [3.5], 2.0),  # one device takes every row
        (2, [1.0, 3.0], 2 / 3),  # both rows to the fast device; [1, 1] would take 1 s
        (2, [1.0, 1.5], 1.0),  # one row each: 2 rows at 1.5 would take 1.33 s
        (3, [1.0, 2.0], 1.0),  # [1, 2]
        (5, [1.0, 1.0], 3.0),  # [3, 2]
        (10, [1.0, 4.0], 2.0),  # [2, 8]
    ],
)
def test_best_step_time_hands_each_row_to_the_device_that_finishes_it_soonest(batch, speeds, best):
    assert weighted.best_step_time(batch, speeds) == pytest.approx(best, rel=1e-12)


def test_a_split_that_adds_up_is_judged_by_its_sizes_only():
    cases = [[5, [1.0, 2.0, 3.0]], [2, [0.5, 0.5, 4.0]]]
    assert weighted.judge_split(cases, pack_sizes([[1, 2, 2], [0, 0, 2]])) is None
    assert weighted.judge_split(cases, pack_sizes([[5, 0, 0], [2, 0, 0]])) is None
    hint = weighted.judge_split(cases, pack_sizes([[1, 2, 2], [0, 1, 2]]))
    assert hint == (
        "weighted_chunk_sizes(2, [0.5, 0.5, 4.0]) returned [0, 1, 2]: one size >= 0 per "
        "device, adding up to the batch 2"
    )
    for sizes in ([6, -1, 0], [2, 3], [1, 1, 1, 2]):  # a negative size, a device short, one more
        hint = weighted.judge_split(cases, pack_sizes([sizes, [0, 0, 2]]))
        assert hint is not None and f"returned {sizes}" in hint


@pytest.mark.parametrize(
    "values",
    [
        {"sizes": torch.tensor([5, 2], dtype=torch.int32), "lengths": torch.tensor([1, 1])},
        {"sizes": torch.tensor([5, 2]), "lengths": torch.tensor([1, 1], dtype=torch.int32)},
        {"sizes": torch.tensor([[5, 2]]), "lengths": torch.tensor([1, 1])},
        {"sizes": torch.tensor([5, 2]), "lengths": torch.tensor([[1, 1]])},
        {"sizes": torch.tensor([5, 2]), "lengths": torch.tensor([2])},  # one list for two cases
        {"sizes": torch.tensor([5, 2]), "lengths": torch.tensor([3, -1])},  # adds up, negative
        {"sizes": torch.tensor([5, 2]), "lengths": torch.tensor([1, 2])},  # one size short
        {"sizes": [5, 2], "lengths": torch.tensor([1, 1])},
        {"lengths": torch.tensor([1, 1])},
        {"sizes": torch.tensor([5, 2])},
    ],
)
def test_sizes_that_are_not_one_int64_list_per_case_are_refused(values):
    cases = [[5, [1.0]], [2, [2.0]]]
    assert weighted.judge_split(cases, pack_sizes([[5], [2]])) is None
    for judge in (weighted.judge_split, weighted.judge_balance, weighted.judge_optimal):
        assert judge(cases, values) == weighted.NOT_SIZES


def test_an_empty_list_of_sizes_is_told_as_what_came_back():
    cases = [[5, [1.0]], [2, [1.0, 2.0]]]
    values = pack_sizes([[], [0, 2]])
    assert weighted.judge_split(cases, values) == (
        "weighted_chunk_sizes(5, [1.0]) returned []: one size >= 0 per device, adding up to "
        "the batch 5"
    )


def test_equal_speeds_allow_sizes_one_apart_and_no_more():
    cases = [[10, [1.0, 1.0, 1.0]], [0, [1.0] * 4], [2, [1.0] * 5]]
    assert weighted.judge_balance(cases, pack_sizes([[3, 4, 3], [0] * 4, [1, 0, 0, 1, 0]])) is None
    hint = weighted.judge_balance(cases, pack_sizes([[4, 4, 2], [0] * 4, [1, 0, 0, 1, 0]]))
    assert hint == (
        "10 rows over 3 equal devices gave [4, 4, 2]; sizes should differ by at most one"
    )
    hint = weighted.judge_balance(cases, pack_sizes([[3, 4, 3], [0] * 4, [2, 0, 0, 0, 0]]))
    assert hint is not None and "2 rows over 5 equal devices gave [2, 0, 0, 0, 0]" in hint
    # a split that does not add up is told so first, unbalanced or not
    for sizes in ([3, 3, 3], [5, 0, 0]):
        hint = weighted.judge_balance(cases, pack_sizes([sizes, [0] * 4, [1, 0, 0, 1, 0]]))
        assert hint is not None and hint.endswith("adding up to the batch 10"), hint


def test_a_split_slower_than_the_best_is_told_both_times():
    cases = [[2, [1.0, 3.0]], [3, [1.0, 2.0]]]
    assert weighted.judge_optimal(cases, pack_sizes([[0, 2], [1, 2]])) is None
    hint = weighted.judge_optimal(cases, pack_sizes([[1, 1], [1, 2]]))  # largest remainder
    assert hint == (
        "sizes [1, 1] for speeds [1.0, 3.0] take 1.0000, but 0.6667 is possible: give each "
        "row to the device with the smallest (rows + 1) / speed; rounding proportional shares "
        "is not enough"
    )
    hint = weighted.judge_optimal(cases, pack_sizes([[0, 2], [0, 3]]))  # 1.5 s, not 1 s
    assert hint is not None and "take 1.5000, but 1.0000 is possible" in hint
    hint = weighted.judge_optimal(cases, pack_sizes([[0, 2], [1, 1]]))  # a row lost
    assert hint is not None and "returned [1, 1]" in hint


def test_the_simulated_time_is_the_slowest_devices_rows_times_seconds_per_row_over_speed():
    # max(2 * 0.5 / 1, 3 * 0.5 / 2) = max(1.0, 0.75); max(0, 4 * 0.25 / 4) = 0.25
    cases = [[[2, 3], [1.0, 2.0], 0.5], [[0, 4], [1.0, 4.0], 0.25]]
    assert weighted.judge_simulated(cases, times(1.0, 0.25)) is None
    hint = weighted.judge_simulated(cases, times(0.75, 0.25))
    assert hint == (
        "simulated_step_time([2, 3], [1.0, 2.0], 0.5) gave 0.75, but the slowest device needs "
        "1 s (rows * per_row_seconds / speed), and the step lasts as long as the slowest device"
    )
    hint = weighted.judge_simulated(cases, times(1.0, 1.0))  # rows / speed, no seconds per row
    assert hint is not None and "gave 1.0, but the slowest device needs 0.25 s" in hint
    not_times = "the outputs sent for simulated_step_time are not the times asked for"
    assert weighted.judge_simulated(cases, {"seconds": torch.ones(2)}) == not_times
    assert weighted.judge_simulated(cases, {}) == not_times
    not_answers = "the outputs sent for simulated_step_time do not answer the inputs chosen"
    for wrong_shape in (times(1.0), times(1.0, 0.25, 0.0), {"seconds": torch.ones(2, 1).double()}):
        assert weighted.judge_simulated(cases, wrong_shape) == not_answers


def test_the_simulated_time_is_right_to_one_part_in_a_billion_or_a_billionth_of_a_second():
    big = [[[20], [1.0], 0.5]]  # 10 s: within 1e-8 s
    assert weighted.judge_simulated(big, times(10.0 + 5e-9)) is None
    assert weighted.judge_simulated(big, times(10.0 - 5e-9)) is None
    assert weighted.judge_simulated(big, times(10.0 + 2e-8)) is not None
    one = [[[2], [1.0], 0.5]]  # 1 s: within 1e-9 s
    assert weighted.judge_simulated(one, times(1.0 + 5e-10)) is None
    assert weighted.judge_simulated(one, times(1.0 + 1.5e-9)) is not None
    small = [[[1], [4.0], 0.5]]  # 0.125 s: still within 1e-9 s, not 1.25e-10
    assert weighted.judge_simulated(small, times(0.125 + 8e-10)) is None
    assert weighted.judge_simulated(small, times(0.125 + 1.5e-9)) is not None
    assert weighted.judge_simulated(one, times(float("nan"))) is not None
    idle = [[[0], [1.0], 0.5]]  # 0 s: a billionth of a second either way, the edge included
    assert weighted.judge_simulated(idle, times(1e-9)) is None
    assert weighted.judge_simulated(idle, times(-1e-9)) is None
    assert weighted.judge_simulated(idle, times(1.5e-9)) is not None


# Two devices sleeping 50 ms each: 50 ms at once, 100 ms one after another.
MEASURED = [[10, 10], [1.0, 1.0], 0.005]
LONGER = "the measured time is longer than the call itself"
SHORTER = (
    "measured 0.048 s, but the slowest device sleeps 0.050 s: sleep in each thread and time "
    "from the first start to the last join"
)


def in_a_row(measured: str) -> str:
    return (
        f"measured {measured} s; the 2 devices take 0.050 s together, 0.100 s one after "
        "another: start every thread before joining any"
    )


@pytest.mark.parametrize(
    ("measured", "outside", "hint"),
    [
        (0.06, 0.07, None),
        (0.0705, 0.07, None),  # the call's own time is read a little later
        (0.07 + 1e-3, 0.07, None),  # a millisecond later at most
        (0.0715, 0.07, LONGER),
        (0.0495, 0.07, None),  # a millisecond's slack under the slowest sleep
        (10 * 0.005 / 1.0 - 1e-3, 0.07, None),  # the slack's edge
        (0.0484, 0.07, SHORTER),
        (0.0945, 0.2, None),  # 5 ms short of one after another
        (2 * (10 * 0.005 / 1.0) - 0.005, 0.2, in_a_row("0.095")),  # the edge  # 5 ms short at least
        (0.0972, 0.2, in_a_row("0.097")),
        (float("nan"), 0.2, LONGER),  # NaN fails every comparison
    ],
)
def test_a_measured_step_lies_between_the_slowest_sleep_and_the_sleeps_in_a_row(
    measured, outside, hint
):
    assert weighted.judge_measured(MEASURED, times(measured, outside)) == hint


def test_a_measured_step_must_be_two_float64_times():
    not_times = "the outputs sent for measure_step_time are not the times asked for"
    assert weighted.judge_measured(MEASURED, {"seconds": torch.ones(2)}) == not_times
    assert weighted.judge_measured(MEASURED, {}) == not_times
    not_answers = "the outputs sent for measure_step_time do not answer the inputs chosen"
    for wrong_shape in (times(0.06), times(0.06, 0.07, 0.08)):
        assert weighted.judge_measured(MEASURED, wrong_shape) == not_answers


def draws(choose, count: int = 400) -> list:
    return [choose(random.Random(seed)) for seed in range(count)]


def test_split_draws_two_batches_of_1_to_60_rows_over_three_speeds_in_half_to_four():
    cases = [case for drawn in draws(weighted.split_inputs) for case in drawn]
    assert {len(drawn) for drawn in draws(weighted.split_inputs, 20)} == {2}
    batches = [batch for batch, _ in cases]
    speeds = [speed for _, drawn in cases for speed in drawn]
    assert (min(batches), max(batches)) == (1, 60)
    assert {len(drawn) for _, drawn in cases} == {3}
    assert 0.5 <= min(speeds) < 0.52 and 3.98 < max(speeds) <= 4.0
    assert all(round(speed, 2) == speed for speed in speeds)
    assert any(round(speed, 1) != speed for speed in speeds)


def test_balance_draws_fewer_rows_than_devices_first_then_up_to_40_rows_over_1_to_8():
    drawn = draws(weighted.balance_inputs)
    assert {len(cases) for cases in drawn} == {5}
    first = [cases[0] for cases in drawn]
    assert {batch for batch, _ in first} == {0, 1, 2, 3}
    assert {len(speeds) for _, speeds in first} == {4, 5, 6, 7, 8}
    rest = [case for cases in drawn for case in cases[1:]]
    assert (min(b for b, _ in rest), max(b for b, _ in rest)) == (0, 40)
    assert {len(speeds) for _, speeds in rest} == set(range(1, 9))
    assert {speed for _, speeds in first + rest for speed in speeds} == {1.0}


def test_optimal_draws_the_edges_first_then_55_batches_of_0_to_300_over_1_to_8_speeds():
    drawn = draws(weighted.optimal_inputs, 60)
    assert {len(cases) for cases in drawn} == {60}
    assert drawn[0][:5] == [
        [0, [1.0, 2.0]],
        [7, [3.5]],
        [300, [0.1, 10.0]],
        [1, [0.1, 0.1, 10.0]],
        [2, [1.0, 3.0]],
    ]
    rest = [case for cases in drawn for case in cases[5:]]
    batches = [batch for batch, _ in rest]
    speeds = [speed for _, drawn_speeds in rest for speed in drawn_speeds]
    assert (min(batches), max(batches)) == (0, 300)
    assert {len(drawn_speeds) for _, drawn_speeds in rest} == set(range(1, 9))
    assert 0.1 <= min(speeds) < 0.12 and 9.98 < max(speeds) <= 10.0
    assert all(round(speed, 3) == speed for speed in speeds)
    assert any(round(speed, 2) != speed for speed in speeds)


def test_simulated_draws_three_cases_the_second_with_an_idle_device():
    drawn = draws(weighted.simulated_inputs)
    assert {len(cases) for cases in drawn} == {3}
    for cases in drawn:
        assert 0 in cases[1][0]
        assert 0 not in cases[0][0] and 0 not in cases[2][0]
    cases = [case for drawn_cases in drawn for case in drawn_cases]
    assert {len(sizes) for sizes, _, _ in cases} == {2, 3, 4, 5}
    assert all(len(speeds) == len(sizes) for sizes, speeds, _ in cases)
    sizes = [rows for drawn_sizes, _, _ in cases for rows in drawn_sizes if rows]
    assert (min(sizes), max(sizes)) == (1, 20)
    speeds = [speed for _, drawn_speeds, _ in cases for speed in drawn_speeds]
    assert 0.25 <= min(speeds) < 0.27 and 3.98 < max(speeds) <= 4.0
    assert all(round(speed, 2) == speed for speed in speeds)
    per_row = [seconds for _, _, seconds in cases]
    assert 0.1 <= min(per_row) < 0.11 and 0.99 < max(per_row) <= 1.0
    assert all(round(seconds, 3) == seconds for seconds in per_row)
    assert any(round(seconds, 2) != seconds for seconds in per_row)


def test_measured_draws_four_or_five_devices_at_half_one_or_two_sleeping_50_to_60_ms_each():
    drawn = draws(weighted.measured_inputs, 200)
    assert {per_row for _, _, per_row in drawn} == {weighted.PER_ROW} == {0.005}
    assert {len(sizes) for sizes, _, _ in drawn} == {4, 5}
    assert {speed for _, speeds, _ in drawn for speed in speeds} == {0.5, 1.0, 2.0}
    sleeps = [
        rows * per_row / speed
        for sizes, speeds, per_row in drawn
        for rows, speed in zip(sizes, speeds)
    ]
    assert 0.05 - 0.0025 <= min(sleeps) and max(sleeps) <= 0.06 + 0.0025
