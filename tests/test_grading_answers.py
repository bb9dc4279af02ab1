"""The parent's checks give the verdicts and hints worked out here by hand (issue 32).

tests/test_grading_decided.py shows that a right answer passes and a wrong one fails on
the parent's random draws; these tests pin the answers themselves on cases small enough to
do on paper (a weighted split, a step time, a tolerance's edge), and check that the
parent's draws cover the ranges the graders promise (each check's docstring), so that a
check cannot go soft without a test saying so. Found by the mutation run of
dpkit/grading/{weighted,gradients,shapes,similarity,outputs,counted,structure}.py
(``make mutation FILES=dpkit/grading/weighted.py``, benchmarks/mutation.py's BEYOND_CORE).
"""

from __future__ import annotations

import random
from collections import OrderedDict, namedtuple

import pytest
import torch

from dpkit.grading import counted, gradients, outputs, shapes, structure, weighted
from dpkit.grading.decided import pack_sizes
from dpkit.grading.outputs import NOT_TENSORS, listed
from dpkit.grading.similarity import Similar, normalised, similar_pairs

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


# What the grader records of those sleeps (thread, seconds, start, end), when right: two
# threads other than the caller's (0), each sleeping 50 ms, at the same time.
AT_ONCE = [[1, 0.05, 0.001, 0.0512], [2, 0.05, 0.0011, 0.0513]]


def with_sleeps(seconds: float, outside: float, sleeps: list = AT_ONCE) -> dict:
    recorded = torch.tensor(sleeps, dtype=torch.float64).reshape(-1, 4)
    return {**times(seconds, outside), "sleeps": recorded}


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
    assert weighted.judge_measured(MEASURED, with_sleeps(measured, outside)) == hint


IN_THREADS = "each in a thread of its own, but the threads' time.sleep calls added up to"
ONE_AFTER_ANOTHER = "the devices' sleeps ran one after another"


@pytest.mark.parametrize(
    ("sleeps", "hint"),
    [
        (AT_ONCE, None),
        ([[2, 0.05, 0.0, 0.05], [1, 0.05, 0.001, 0.0512]], None),  # in any order
        ([[0, 0.05, 0.0, 0.05], [1, 0.05, 0.0, 0.0505]], None),  # the caller as one device
        ([[1, 0.025, 0.0, 0.025], [2, 0.05, 0.0, 0.05], [1, 0.025, 0.025, 0.051]], None),  # by row
        # The fake: one sleep of the slowest device's time in the caller, that time returned.
        ([[0, 0.05, 0.0, 0.0502]], f"the 2 devices sleep 0.0500, 0.0500 s, {IN_THREADS} 0.0500 s"),
        ([], f"{IN_THREADS} nothing s"),
        ([[1, 0.05, 0.0, 0.05], [1, 0.05, 0.05, 0.1]], f"{IN_THREADS} 0.1000 s"),  # one thread
        ([[1, 0.05, 0.0, 0.05], [2, 0.04, 0.0, 0.04]], f"{IN_THREADS} 0.0400, 0.0500 s"),
        ([[1, float("nan"), 0.0, 0.05], [2, 0.05, 0.0, 0.05]], IN_THREADS),
        # Two threads, one after another (their time made up): sleeps span at least the sum.
        ([[1, 0.05, 0.0, 0.0501], [2, 0.05, 0.0502, 0.1003]], ONE_AFTER_ANOTHER),
        ([[1, 0.05, 0.0, 0.05], [2, 0.05, 0.049, 0.099]], ONE_AFTER_ANOTHER),  # 1 ms: the edge
        ([[1, 0.05, 0.0, 0.05], [2, 0.05, 0.0489, 0.0989]], None),
        ([[1, 0.05, 0.0, 0.05], [2, 0.05, 0.0, float("nan")]], ONE_AFTER_ANOTHER),
        # times as a clock reads them, far from 0: the span is the last end less the first start
        ([[1, 0.05, 5000.001, 5000.0512], [2, 0.05, 5000.0011, 5000.0513]], None),
        ([[1, 0.05, 5000.0, 5000.0501], [2, 0.05, 5000.0502, 5000.1003]], ONE_AFTER_ANOTHER),
    ],
)
def test_the_sleeps_recorded_are_one_thread_per_device_at_the_same_time(sleeps, hint):
    """A returned time alone can be faked; the grader's record of the sleeps is the work."""
    got = weighted.judge_measured(MEASURED, with_sleeps(0.06, 0.07, sleeps))
    assert got == hint if hint is None else hint in got, got


def test_an_idle_device_need_not_sleep():
    idle = [[10, 0, 10], [1.0, 1.0, 1.0], 0.005]
    assert weighted.judge_measured(idle, with_sleeps(0.06, 0.07)) is None
    # or its thread sleeps no time at all: a thread of no sleep is no device's
    zero = [*AT_ONCE, [3, 0.0, 0.001, 0.001]]
    assert weighted.judge_measured(idle, with_sleeps(0.06, 0.07, zero)) is None


def test_a_measured_step_must_be_two_float64_times():
    not_times = "the outputs sent for measure_step_time are not the times asked for"
    assert weighted.judge_measured(MEASURED, {"seconds": torch.ones(2)}) == not_times
    assert weighted.judge_measured(MEASURED, {}) == not_times
    not_answers = "the outputs sent for measure_step_time do not answer the inputs chosen"
    for wrong_shape in (times(0.06), times(0.06, 0.07, 0.08)):
        assert weighted.judge_measured(MEASURED, wrong_shape) == not_answers
    no_sleeps = "the outputs sent for measure_step_time do not hold the sleeps recorded"
    right = with_sleeps(0.06, 0.07)["sleeps"]
    for sleeps in (None, torch.zeros(2, 3).double(), right.float(), right.flatten()):
        values = times(0.06, 0.07) | ({} if sleeps is None else {"sleeps": sleeps})
        assert weighted.judge_measured(MEASURED, values) == no_sleeps


def draws(choose, count: int = 400) -> list:
    return [choose(random.Random(seed)) for seed in range(count)]


def test_split_draws_two_batches_of_1_to_60_rows_over_three_speeds_in_half_to_four():
    cases = [case for drawn in draws(weighted.split_inputs) for case in drawn[:2]]
    assert {len(drawn) for drawn in draws(weighted.split_inputs, 20)} == {3}
    batches = [batch for batch, _ in cases]
    speeds = [speed for _, drawn in cases for speed in drawn]
    assert (min(batches), max(batches)) == (1, 60)
    assert {len(drawn) for _, drawn in cases} == {3}
    assert 0.5 <= min(speeds) < 0.52 and 3.98 < max(speeds) <= 4.0
    assert all(round(speed, 2) == speed for speed in speeds)
    assert any(round(speed, 1) != speed for speed in speeds)


def test_split_draws_then_a_few_rows_over_many_equal_devices_that_rounding_fails():
    """Rounding each device's share (batch * speed / total) adds up to the batch on most
    draws of three speeds; on 1-3 rows over 5-8 equal devices it never does."""
    small = [drawn[2] for drawn in draws(weighted.split_inputs)]
    assert {batch for batch, _ in small} == {1, 2, 3}
    assert {len(speeds) for _, speeds in small} == {5, 6, 7, 8}
    assert all(set(speeds) == {1.0} for _, speeds in small)
    for cases in draws(weighted.split_inputs, 50):
        rounded = [[round(b * s / sum(speeds)) for s in speeds] for b, speeds in cases]
        hint = weighted.judge_split(cases, pack_sizes(rounded))
        batch, speeds = cases[2]
        if sum(rounded[0]) == cases[0][0] and sum(rounded[1]) == cases[1][0]:
            assert hint == (
                f"weighted_chunk_sizes({batch}, {speeds}) returned {rounded[2]}: one size >= 0 "
                f"per device, adding up to the batch {batch}"
            )
        else:
            assert hint is not None and "adding up to the batch" in hint


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


# --------------------------------------------------------------------------------------
# Shapes and counts (dpkit/grading/shapes.py)


def test_the_dim_check_regenerates_the_tensors_from_one_generator_in_order():
    wide, small = shapes.dim_tensors(2, 5, 3, 2, 11)
    generator = torch.Generator().manual_seed(11)
    assert torch.equal(wide, torch.randn(2, 5, 3, generator=generator))
    assert torch.equal(small, torch.randn(2, 2, generator=generator))


def dim_values(along: list[torch.Tensor], few: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    return {**listed("dim", along), **listed("small", few)}


def test_six_columns_over_four_lanes_along_dim_one_make_three_chunks_of_two():
    inputs = [1, 6, 1, 2, 5]
    wide, small = shapes.dim_tensors(*inputs)
    right = [wide[:, 0:2], wide[:, 2:4], wide[:, 4:6]]
    rows = [small[0:1], small[1:2]]  # 2 rows make 2 chunks of one row
    assert shapes.judge_dim(inputs, dim_values(right, rows)) is None
    assert shapes.judge_dim(inputs, dim_values([wide], rows)) == (
        "6 columns over 4 lanes along dim=1 should give chunks of shapes [(1, 2, 1), (1, 2, 1), "
        "(1, 2, 1)], got [(1, 6, 1)]; split along dim, not along rows"
    )
    swapped = [right[1], right[0], right[2]]  # the right shapes, the chunks out of order
    assert "got [(1, 2, 1), (1, 2, 1), (1, 2, 1)]" in shapes.judge_dim(
        inputs, dim_values(swapped, rows)
    )
    four = [*rows, small[0:0], small[0:0]]  # an empty chunk for each idle lane
    assert shapes.judge_dim(inputs, dim_values(right, four)) == (
        "2 rows over 4 lanes make 2 chunks, got 4"
    )
    assert shapes.judge_dim(inputs, dim_values(right, rows[::-1])) == (
        "2 rows over 4 lanes make 2 chunks, got 2"
    )
    assert shapes.judge_dim(inputs, dim_values(right, [])) == (
        "2 rows over 4 lanes make 2 chunks, got 0"
    )
    # numbered from 0 without a gap: a chunk sent as dim1 alone is not a list of chunks
    gap = {"dim1": right[0], "dim2": right[1], **listed("small", rows)}
    assert "got []" in shapes.judge_dim(inputs, gap)
    assert shapes.judge_dim(inputs, {**dim_values(right, rows), "dim3": [1]}) == NOT_TENSORS
    assert shapes.judge_dim(inputs, {**dim_values(right, rows), "small2": 1}) == NOT_TENSORS


def test_a_scalar_piece_needs_a_scalar_gradient_its_entry_of_the_output_gradient():
    inputs = [3, 8]
    values, weight = shapes.scalar_pieces(*inputs)
    generator = torch.Generator().manual_seed(8)
    assert torch.equal(torch.stack(values), torch.randn(3, generator=generator))
    assert torch.equal(weight, torch.randn(3, generator=generator))
    right = {**listed("returned", weight.unbind()), **listed("grad", weight.unbind())}
    assert shapes.judge_scalar_grad(inputs, right) is None
    shaped = {**right, **listed("returned", [w.view(1) for w in weight.unbind()])}
    assert shapes.judge_scalar_grad(inputs, shaped) == (
        "Gather.backward returned gradients of shapes [(1,), (1,), (1,)] for 3 scalar pieces; "
        "a scalar piece needs a gradient of shape (): view each slice as a scalar"
    )
    wrong = "a scalar piece's gradient is not its entry of the output's gradient"
    for key in ("returned2", "grad0"):
        assert shapes.judge_scalar_grad(inputs, {**right, key: torch.tensor(0.5)}) == wrong
    assert shapes.judge_scalar_grad(inputs, {**right, "grad1": weight[1:2]}) == wrong
    for short in ({k: v for k, v in right.items() if k != key} for key in ("returned2", "grad2")):
        assert shapes.judge_scalar_grad(inputs, short) == NOT_TENSORS
    assert shapes.judge_scalar_grad(inputs, {**right, "grad3": weight[0]}) == NOT_TENSORS
    for key in ("returned1", "grad1"):  # one of either that is not a tensor
        assert shapes.judge_scalar_grad(inputs, {**right, key: 0.5}) == NOT_TENSORS


def lanes(big: list[int], small: list[int], one: list[int]) -> dict[str, torch.Tensor]:
    return {"big": torch.tensor(big), "small": torch.tensor(small), "one": torch.tensor(one)}


def test_nine_rows_run_replicas_on_three_lanes_and_two_rows_on_two():
    inputs = [9, 2, 0]  # torch.chunk makes 3 chunks of 3 rows of 9
    assert shapes.judge_lanes(inputs, lanes([0, 1, 2], [0, 1], [-1])) is None
    assert shapes.judge_lanes(inputs, lanes([2, -1, 0, 1], [0, 1], [-1])) is None
    assert shapes.judge_lanes(inputs, lanes([0, 1, 2, 3], [0, 1], [-1])) == (
        "replicas ran on lanes [0, 1, 2, 3]; expected one on each of the 3 lanes that got a "
        "chunk of 9 rows (through dpkit.parallel_apply)"
    )
    assert "ran on lanes [1, 2]" in shapes.judge_lanes(inputs, lanes([1, 2, -1], [0, 1], [-1]))
    assert shapes.judge_lanes([13, 1, 0], lanes([0, 1, 2], [0], [-1])).startswith(
        "replicas ran on lanes [0, 1, 2]; expected one on each of the 4 lanes"
    )
    assert shapes.judge_lanes(inputs, lanes([0, 1, 2], [0, 1, 2, 3], [-1])) == (
        "2 rows over 4 lanes should run 2 replicas, ran 4: replicate only onto the devices "
        "that got a chunk"
    )
    assert shapes.judge_lanes(inputs, lanes([0, 1, 2], [0, 1], [-1, -1])) == (
        "with one device, run the module once, directly"
    )
    for name in ("big", "small", "one"):
        values = lanes([0, 1, 2], [0, 1], [-1])
        assert shapes.judge_lanes(inputs, {**values, name: values[name].int()}) == NOT_TENSORS
        values.pop(name)
        assert shapes.judge_lanes(inputs, values) == NOT_TENSORS


def test_shape_draws_cover_the_sizes_the_graders_name():
    dim = draws(shapes.dim_inputs)
    assert {len(inputs) for inputs in dim} == {5}
    for position, sizes in enumerate(({1, 2, 3}, set(range(4, 13)), {1, 2, 3, 4}, {1, 2, 3})):
        assert {inputs[position] for inputs in dim} == sizes
    scalar = draws(shapes.scalar_grad_inputs)
    assert {count for count, _ in scalar} == {2, 3, 4}
    lane = draws(shapes.lanes_inputs)
    assert {rows for rows, _, _ in lane} == set(range(5, 17))
    assert {few for _, few, _ in lane} == {1, 2, 3}
    for drawn, seed_at in ((dim, 4), (scalar, 1), (lane, 2)):
        seeds = [inputs[seed_at] for inputs in drawn]
        assert len(set(seeds)) == len(seeds) and max(seeds) > 2**61 and min(seeds) >= 0
        torch.Generator().manual_seed(max(seeds) + 1)  # seeds torch's generator, + 1 too


# --------------------------------------------------------------------------------------
# Gradients (dpkit/grading/gradients.py): the small model's, by the chain rule by hand.


def test_each_chunks_weight_is_drawn_in_turn_and_the_inputs_gradient_is_them_stacked():
    weights = gradients.chunk_weights(5, 3, 4)  # torch.chunk: 2, 2 and 1 rows
    generator = torch.Generator().manual_seed(4)
    assert [tuple(w.shape) for w in weights] == [(2, 3), (2, 3), (1, 3)]
    for weight, rows in zip(weights, (2, 2, 1)):
        assert torch.equal(weight, torch.randn(rows, 3, generator=generator))
    inputs = [5, 3, 4]
    assert gradients.judge_scatter_grad(inputs, {"grad": torch.cat(weights)}) is None
    wrong = "x.grad is wrong: each row's gradient comes from its chunk"
    for grad in (torch.cat(weights).flip(0), torch.cat(weights)[:4], torch.cat(weights[:2])):
        assert gradients.judge_scatter_grad(inputs, {"grad": grad}) == wrong
    assert gradients.judge_scatter_grad(inputs, {"grad": [1.0]}) == NOT_TENSORS
    assert gradients.judge_scatter_grad(inputs, {}) == NOT_TENSORS


def test_each_gathered_piece_gets_its_own_rows_of_the_output_gradient():
    inputs = [[2, 2, 1, 1], 3, 9]
    weight = gradients.output_weight(*inputs)
    assert torch.equal(weight, torch.randn(6, 3, generator=torch.Generator().manual_seed(9)))
    pieces = [weight[0:2], weight[2:4], weight[4:5], weight[5:6]]
    across = listed("across", [piece.t() for piece in pieces])  # gathered along dim 1
    assert gradients.judge_gather_grad(inputs, {**listed("grad", pieces), **across}) is None
    for swapped, index in (([1, 0, 2, 3], 0), ([0, 1, 3, 2], 2)):
        got = listed("grad", [pieces[i] for i in swapped])
        assert gradients.judge_gather_grad(inputs, {**got, **across}) == (
            f"piece {index}'s gradient is not its slice of the output gradient: split by the "
            "sizes saved in forward"
        )
        got = listed("across", [pieces[i].t() for i in swapped])
        assert gradients.judge_gather_grad(inputs, {**listed("grad", pieces), **got}) == (
            f"gathered along dim 1, piece {index}'s gradient is not its slice of the output "
            "gradient: split it along the dim the forward concatenated (save it in ctx)"
        )
    short = listed("grad", [weight[0:2], weight[2:4], weight[4:6], weight[6:6]])
    assert "piece 2's gradient" in gradients.judge_gather_grad(inputs, {**short, **across})
    assert gradients.judge_gather_grad(inputs, listed("grad", pieces[:3])) == NOT_TENSORS
    assert gradients.judge_gather_grad(inputs, listed("grad", pieces)) == NOT_TENSORS


def by_hand(
    seed: int, rows: int, grad_out, params: list[torch.Tensor] | None = None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The model's output for its batch, and each parameter's gradient for a loss whose
    gradient by the output is ``grad_out(out, y)``: the chain rule through 4 -> 8 -> 2
    (with ``params`` for the seeded model's, when given)."""
    x, y, _ = outputs.seeded_batch(seed, rows)
    model = outputs.seeded_model(seed)
    w1, b1, w2, b2 = params or [p.detach() for p in model.parameters()]
    hidden = torch.tanh(x @ w1.T + b1)
    out = hidden @ w2.T + b2
    d_out = grad_out(out, y)
    d_pre = (d_out @ w2) * (1 - hidden**2)
    return out, {
        "0.weight": d_pre.T @ x,
        "0.bias": d_pre.sum(0),
        "2.weight": d_out.T @ hidden,
        "2.bias": d_out.sum(0),
    }


def test_every_replica_computes_the_models_output_to_a_millionth():
    inputs = [21, 5, 3]
    out, _ = by_hand(21, 5, lambda out, y: out)
    assert gradients.judge_replica_outputs(inputs, listed("out", [out] * 4)) is None
    off = [out, out, out + 0.5, out]
    assert gradients.judge_replica_outputs(inputs, listed("out", off)) == (
        "replica 2 computes something else"
    )
    tolerance = 1e-6 + 1e-5 * out.abs()  # torch.allclose's atol and rtol
    near = out.double() + 0.5 * tolerance
    far = out.double() + 3 * tolerance
    assert gradients.judge_replica_outputs(inputs, listed("out", [near.float()] * 4)) is None
    got = gradients.judge_replica_outputs(inputs, listed("out", [out, far.float(), out, out]))
    assert got == "replica 1 computes something else"
    assert gradients.judge_replica_outputs(inputs, listed("out", [out] * 3)) == NOT_TENSORS
    assert gradients.judge_replica_outputs(inputs, listed("out", [out, out, out[:4], out])) == (
        "replica 2 computes something else"
    )


def test_replicated_gradients_are_the_replicas_count_times_one_copys():
    seed, rows, count = inputs = [33, 4, 3]
    # the loss is count * sum(out ** 2): its gradient by the output is 2 * count * out
    _, grads = by_hand(seed, rows, lambda out, y: 2 * count * out)
    assert gradients.judge_replica_grads(inputs, listed("grad", grads.values())) is None
    once = [grad / count for grad in grads.values()]  # one replica's: no reduce-add
    assert gradients.judge_replica_grads(inputs, listed("grad", once)) == (
        "0.weight.grad is not the sum over the 3 replicas: one Broadcast.apply over all "
        "parameters, whose backward reduce-adds"
    )
    last = [*list(grads.values())[:3], grads["2.bias"] + 1e-3]
    assert "2.bias.grad is not the sum over the 3 replicas" in gradients.judge_replica_grads(
        inputs, listed("grad", last)
    )
    assert gradients.judge_replica_grads(inputs, listed("grad", once[:3])) == NOT_TENSORS
    # to 1e-5 either way: autograd adds the replicas' gradients in another order
    near = [grad + 5e-6 for grad in grads.values()]
    assert gradients.judge_replica_grads(inputs, listed("grad", near)) is None


def test_each_replicas_gradients_after_the_all_reduce_are_the_mean_squared_errors():
    seed, rows = inputs = [45, 8]
    # mse_loss averages over rows * 2 outputs: its gradient is 2 (out - y) / (rows * 2)
    _, grads = by_hand(seed, rows, lambda out, y: 2 * (out - y) / out.numel())
    every = [grad for _ in range(4) for grad in grads.values()]
    assert gradients.judge_ddp_grads(inputs, listed("grad", every)) is None
    off = list(every)
    off[14] = off[14] * 0.75  # replica 3's 2.weight: the replicas disagree (a broken ring)
    assert gradients.judge_ddp_grads(inputs, listed("grad", off)) == (
        "replica 3's 2.weight.grad differs from DataParallel's, and the replicas do not all "
        "hold the same 2.weight.grad: after the all-reduce every replica holds the sum "
        "(ring_allreduce_'s own checks test the ring)"
    )
    scaled = [grad * 0.75 if position % 4 == 2 else grad for position, grad in enumerate(every)]
    assert gradients.judge_ddp_grads(inputs, listed("grad", scaled)) == (
        "replica 0's 2.weight.grad differs from DataParallel's: all-reduce every parameter's "
        ".grad across the replicas"
    )
    # real DDP's average (the sum divided by the replicas) is named as such: off by n
    averaged = [grad / 4 for grad in every]
    assert gradients.judge_ddp_grads(inputs, listed("grad", averaged)) == (
        "replica 0's 0.weight.grad is DataParallel's divided by 4, the number of replicas (off "
        "by a factor n = 4): allreduce_gradients_ leaves the sum over the replicas, not the "
        "average real DDP takes"
    )
    off = list(every)
    off[5] = off[5] * 0.75  # replica 1's 0.bias
    assert gradients.judge_ddp_grads(inputs, listed("grad", off)).startswith(
        "replica 1's 0.bias.grad differs"
    )
    assert gradients.judge_ddp_grads(inputs, listed("grad", every[:15])) == NOT_TENSORS
    near = [grad - 5e-6 for grad in every]  # to 1e-5: the all-reduce adds in another order
    assert gradients.judge_ddp_grads(inputs, listed("grad", near)) is None


def test_gradient_draws_cover_the_sizes_the_graders_name():
    scatter = draws(gradients.scatter_grad_inputs)
    assert {rows for rows, _, _ in scatter} == set(range(5, 41))
    assert {columns for _, columns, _ in scatter} == set(range(1, 6))
    gather = draws(gradients.gather_grad_inputs)
    assert {len(rows) for rows, _, _ in gather} == {4}
    assert {r for rows, _, _ in gather for r in rows} == set(range(1, 6))
    assert {columns for _, columns, _ in gather} == set(range(1, 5))
    replica = draws(gradients.replica_inputs)
    assert {rows for _, rows, _ in replica} == set(range(2, 9))
    assert {count for _, _, count in replica} == {2, 3, 4}
    ddp = draws(gradients.ddp_inputs)
    assert {rows for _, rows in ddp} == {8, 12, 16}
    for drawn, seed_at in ((scatter, 2), (gather, 2), (replica, 0), (ddp, 0)):
        seeds = [inputs[seed_at] for inputs in drawn]
        assert len(set(seeds)) == len(seeds) and max(seeds) > 2**61 and min(seeds) >= 0
        torch.Generator().manual_seed(max(seeds) + 1)  # seeds torch's generator, + 1 too


# --------------------------------------------------------------------------------------
# Which students handed in the same code (dpkit/grading/similarity.py)


def test_names_are_numbered_by_first_use_and_keywords_literals_and_attributes_stay():
    assert normalised("total += x\n") == ("n0", "+=", "n1")
    source = 'def f(a):\n    """doc"""\n    return a.b + b + None  # why\n'
    assert normalised(source) == (
        "def", "n0", "(", "n1", ")", ":", "return", "n1", ".", "b", "+", "n2", "+", "None"
    )  # fmt: skip
    assert normalised('x = "s"\n') == ("n0", "=", '"s"')  # a string that is not a docstring
    assert normalised('"""doc"""\nclass A:\n    "doc"\n    y = 1\n') == (
        "class", "n0", ":", "n1", "=", "1"
    )  # fmt: skip
    assert normalised('f("a")\n"b"\n') == ("n0", "(", '"a"', ")")
    assert normalised("x = (\n") == ("x", "=", "(")  # no tokens: the words as they are


def test_pairs_are_found_from_nine_tenths_alike_the_edge_included():
    stub = "def f():\n    pass\n"
    nine = "x = 1 + 2 + 3 + 4\n"  # 9 tokens
    eleven = "y = 1 + 2 + 3 + 4 + 5\n"  # the 9 and 2 more: 2 * 9 / 20 = 0.9
    files = {"cy": {1: eleven}, "ada": {1: nine}}
    assert similar_pairs(files, {1: stub}) == [Similar(1, "ada", "cy", 0.9)]
    assert similar_pairs(files, {1: stub}, near=0.91) == []
    thirteen = "y = 1 + 2 + 3 + 4 + 5 + 6\n"  # 2 * 9 / 22 = 0.82
    assert similar_pairs({"ada": {1: nine}, "cy": {1: thirteen}}, {1: stub}) == []
    (pair,) = similar_pairs({"ada": {1: nine}, "cy": {1: thirteen}}, {1: stub}, near=0.8)
    assert pair.ratio == pytest.approx(18 / 22)
    assert pair.describe() == (
        "task 1: ada and cy handed in 82% alike code (after normalising names and layout)"
    )


def test_identical_pairs_are_listed_by_task_then_student_and_stubs_and_empty_files_left_out():
    stubs = {2: "def g():\n    pass\n", 1: "def f():\n    pass\n"}
    mine = "def f(a):\n    return a + 1\n"
    files = {
        "dee": {1: mine.replace("a", "b"), 2: mine},
        "bo": {1: mine, 2: "# nothing yet\n"},
        "cy": {1: stubs[1] + "# started\n", 2: stubs[2]},
        "ada": {2: mine + "\n\n"},
        "eve": {1: "", 2: "# nothing yet\n"},
    }
    assert similar_pairs(files, stubs) == [
        Similar(2, "ada", "dee", 1.0),
        Similar(1, "bo", "dee", 1.0),
    ]
    assert Similar(1, "bo", "dee", 1.0).describe() == (
        "task 1: bo and dee handed in identical code (after normalising names and layout)"
    )


# --------------------------------------------------------------------------------------
# Tensors a primitive returns (dpkit/grading/outputs.py)


def test_lane_values_are_drawn_in_turn_from_one_generator():
    values = outputs.lane_values([2, 3], 3, 6)
    generator = torch.Generator().manual_seed(6)
    assert len(values) == 3
    for value in values:
        assert torch.equal(value, torch.randn(2, 3, generator=generator))


def test_the_ring_sum_is_every_lanes_values_added_on_every_lane():
    assert outputs.RING_SIZES == {
        "10 over 4 lanes": ([10], 4),
        "3 over 4 lanes": ([3], 4),
        "2x3x5 over 3 lanes": ([2, 3, 5], 3),
        "7 on 1 lane": ([7], 1),
    }
    shape, count, seed = inputs = outputs.ring_size_inputs("2x3x5 over 3 lanes")(random.Random(0))
    assert (shape, count) == ([2, 3, 5], 3) and 0 <= seed < 2**62
    a, b, c = outputs.lane_values(shape, count, seed)
    total = a + b + c
    assert outputs.judge_ring_size(inputs, listed("lane", [total] * 3)) is None
    where = "after ring_allreduce_ of shape (2, 3, 5) over 3 lane(s), lane"
    steps = (
        "after n - 1 reduce-scatter steps lane i holds chunk (i + 1) % n summed; n - 1 "
        "all-gather steps pass those on"
    )
    assert outputs.judge_ring_size(inputs, listed("lane", [total, total, a + b])) == (
        f"{where} 2 does not hold the sum in 30 of its 30 element(s): {steps}"
    )
    assert outputs.judge_ring_size(inputs, listed("lane", [total, total + 1e-4, total])) == (
        f"{where} 1 does not hold the sum in 30 of its 30 element(s): {steps}"
    )
    assert outputs.judge_ring_size(inputs, listed("lane", [total, total.flatten(), total])) == (
        f"{where} 1 holds a tensor of shape (30,), not (2, 3, 5): sum into each lane's own tensor"
    )
    # the chunks' sizes are blamed only for what they left out: the end, never summed
    short = total.clone().view(-1)
    short[-2:] = b.view(-1)[-2:]
    assert outputs.judge_ring_size(inputs, listed("lane", [total, short.view_as(b), total])) == (
        f"{where} 1 still holds its own values in its last 2 element(s), which no chunk "
        "covered: the n chunks together must cover the whole flat tensor (nearly equal sizes, "
        "some empty when numel < n)"
    )
    half = total.clone().view(-1)
    half[:5] = a.view(-1)[:5]  # lane 0's own values, but at the start: the ring's steps
    assert outputs.judge_ring_size(inputs, listed("lane", [half.view_as(a), total, total])) == (
        f"{where} 0 does not hold the sum in 5 of its 30 element(s): {steps}"
    )
    assert outputs.judge_ring_size(inputs, listed("lane", [total, total, c])) == (
        f"{where} 2 still holds its own values: nothing was added to it (the n chunks must "
        "cover all 30 element(s), some empty when numel < n)"
    )
    assert outputs.judge_ring_size(inputs, listed("lane", [total, total, total + 5e-6])) is None
    assert outputs.judge_ring_size(inputs, listed("lane", [total] * 2)) == NOT_TENSORS
    assert outputs.judge_ring_size(inputs, {**listed("lane", [total] * 3), "x": total}) == (
        NOT_TENSORS  # a name that is not lane0, lane1, ...
    )


def test_rows_making_four_chunks_leave_out_nine_and_a_wrong_chunk_names_its_rows():
    assert outputs.FOUR_CHUNK_ROWS == [7, 8, *range(10, 41)]  # 9 rows: 3 chunks of 3
    inputs = [10, 2, 3]  # torch.chunk: 3, 3, 3 and 1 rows
    x = outputs.scatter_input(*inputs)
    assert torch.equal(x, torch.randn(10, 2, generator=torch.Generator().manual_seed(3)))
    chunks = [x[0:3], x[3:6], x[6:9], x[9:10]]
    assert outputs.judge_scatter_chunks(inputs, listed("chunk", chunks)) is None
    assert outputs.judge_scatter_chunks(inputs, listed("chunk", chunks[:3])) == (
        "10 rows over 4 lanes make 4 chunks, got 3"
    )
    even = [x[0:3], x[3:5], x[5:8], x[8:10]]
    assert outputs.judge_scatter_chunks(inputs, listed("chunk", even)) == (
        "chunk 1 of a (10, 2) tensor is not its rows 3 to 5, torch.chunk's chunk 1"
    )
    last = [*chunks[:3], x[0:1]]
    assert outputs.judge_scatter_chunks(inputs, listed("chunk", last)) == (
        "chunk 3 of a (10, 2) tensor is not its rows 9 to 9, torch.chunk's chunk 3"
    )
    assert outputs.judge_scatter_chunks(inputs, {"chunk0": x, "chunk2": x}) == NOT_TENSORS


def test_broadcast_lays_the_copies_out_device_by_device():
    inputs = [[3], [2, 2], 12]
    a, b = outputs.layout_tensors(*inputs)
    generator = torch.Generator().manual_seed(12)
    assert torch.equal(a, torch.randn(3, generator=generator))
    assert torch.equal(b, torch.randn(2, 2, generator=generator))
    assert outputs.judge_layout(inputs, listed("copy", [a, b] * 4)) is None
    tensor_by_tensor = [a, a, a, a, b, b, b, b]
    assert outputs.judge_layout(inputs, listed("copy", tensor_by_tensor)) == (
        "output 1 should be tensor 1 on lane 0: lay the copies out device by device, "
        "(a on d0, b on d0, a on d1, ...)"
    )
    assert outputs.judge_layout(inputs, listed("copy", [a, b] * 3 + [a, a])).startswith(
        "output 7 should be tensor 1 on lane 3:"
    )
    wrong_values = [a, b, a, b + 1, a, b, a, b]  # the right shapes
    assert outputs.judge_layout(inputs, listed("copy", wrong_values)).startswith(
        "output 3 should be tensor 1 on lane 1:"
    )
    assert outputs.judge_layout(inputs, listed("copy", [a, b] * 3)) == (
        "2 tensors on 4 lanes make 8 copies, got 6"
    )


def test_the_graders_model_and_batch_come_from_the_seed_alone():
    torch.manual_seed(0)
    model = outputs.seeded_model(7)
    torch.manual_seed(1)
    assert [(n, tuple(p.shape)) for n, p in outputs.seeded_model(7).named_parameters()] == [
        ("0.weight", (8, 4)),
        ("0.bias", (8,)),
        ("2.weight", (2, 8)),
        ("2.bias", (2,)),
    ]
    generator = torch.Generator().manual_seed(7)
    for parameter, again in zip(model.parameters(), outputs.seeded_model(7).parameters()):
        assert torch.equal(parameter, torch.randn(parameter.shape, generator=generator) / 2)
        assert torch.equal(parameter, again)
    x, y, extra = outputs.seeded_batch(7, 5)
    generator = torch.Generator().manual_seed(8)  # the batch's seed is the model's + 1
    for tensor, columns in ((x, 4), (y, 2), (extra, 3)):
        assert torch.equal(tensor, torch.randn(5, columns, generator=generator))


def test_the_data_parallel_forward_and_its_gradients_match_one_devices():
    seed, rows = inputs = [19, 6]
    out, grads = by_hand(seed, rows, lambda out, y: 2 * (out - y) / out.numel())
    _, _, extra = outputs.seeded_batch(seed, rows)
    product = extra * extra.flip(0)
    lane0 = {"lanes": torch.zeros(2, dtype=torch.int64)}  # both gathered on lane 0
    assert outputs.judge_forward(inputs, {"out": out, "product": product, **lane0}) is None
    assert outputs.judge_forward(inputs, {"out": out[:5], "product": product, **lane0}) == (
        "expected one (6, 2) output gathered from the replicas"
    )
    assert outputs.judge_forward(inputs, {"out": out + 1e-3, "product": product, **lane0}) == (
        "the output differs from module(x)"
    )
    assert outputs.judge_forward(inputs, {"out": out + 5e-6, "product": product, **lane0}) is None
    assert outputs.judge_forward(inputs, {"out": out, "product": extra * extra, **lane0}) == (
        "every positional input must be scattered, and the chunks passed as arguments"
    )
    assert outputs.judge_forward(inputs, {"out": out, "product": product[:5], **lane0}) == (
        "every positional input must be scattered, and the chunks passed as arguments"
    )
    assert outputs.judge_forward(inputs, {"out": out, **lane0}) == NOT_TENSORS
    assert outputs.judge_forward(inputs, {"product": product, **lane0}) == NOT_TENSORS
    assert outputs.judge_forward(inputs, {"out": out, "product": product}) == NOT_TENSORS
    for lanes, on in (([3, 0], "on lane 3"), ([0, 2], "on lane 2"), ([-1, 0], "on no lane")):
        where = {"lanes": torch.tensor(lanes)}
        assert outputs.judge_forward(inputs, {"out": out, "product": product, **where}) == (
            f"the output is {on}, not on devices[0] (lane 0): gather onto devices[0], where "
            "the labels and the loss are"
        )
    assert outputs.judge_gradients(inputs, listed("grad", grads.values())) is None
    near = [grad + 5e-6 for grad in grads.values()]  # to 1e-5: four lanes add in another order
    assert outputs.judge_gradients(inputs, listed("grad", near)) is None
    off = [*list(grads.values())[:3], grads["2.bias"] + 1e-3]
    assert outputs.judge_gradients(inputs, listed("grad", off)) == (
        "2.bias.grad differs from one device"
    )
    none = [grads["0.weight"], grads["0.bias"] * float("nan"), *list(grads.values())[2:]]
    assert outputs.judge_gradients(inputs, listed("grad", none)) == (
        "0.bias got no gradient through the data-parallel forward"
    )
    shaped = [grads["0.weight"].T, *list(grads.values())[1:]]
    assert outputs.judge_gradients(inputs, listed("grad", shaped)).startswith("0.weight got no")
    assert outputs.judge_gradients(inputs, listed("grad", list(grads.values())[:3])) == (
        NOT_TENSORS
    )


def test_apply_replica_stores_one_result_and_parallel_apply_keeps_replica_order():
    factors, length, (first, second), seed = inputs = [[2.0, -0.5, 1.5], 3, [2, 1], 14]
    x = outputs.replica_tensors(3, 3, 14)
    generator = torch.Generator().manual_seed(14)
    assert len(x) == 4
    for tensor in x:
        assert torch.equal(tensor, torch.randn(3, generator=generator))
    right = {"keys": torch.tensor([2]), "first": 2.0 * x[0], "second": -0.5 * x[1] + x[3]}
    right["third"] = right["second"]  # the same arguments given as a list
    assert outputs.judge_apply_replica(inputs, right) is None
    assert outputs.judge_apply_replica(inputs, {**right, "third": -0.5 * x[1]}) == (
        "a list input holds the positional arguments too, as a tuple does: module(*input)"
    )
    assert outputs.judge_apply_replica(inputs, {**right, "keys": torch.tensor([2, 1])}) == (
        "results should have key 2 only, got [2, 1]"
    )
    assert outputs.judge_apply_replica(inputs, {**right, "first": x[0]}) == (
        "results[2] is not module(input)"
    )
    assert outputs.judge_apply_replica(inputs, {**right, "second": -0.5 * x[1]}) == (
        "a tuple input holds the positional arguments: call module(*input)"
    )
    assert outputs.judge_apply_replica(inputs, {"keys": right["keys"]}) == NOT_TENSORS
    in_order = [2.0 * x[0], -0.5 * x[1], 1.5 * x[2]]
    assert outputs.judge_in_order(inputs, listed("out", in_order)) is None
    assert outputs.judge_in_order(inputs, listed("out", in_order[::-1])) == (
        "output 0 is not replica 0's: keep outputs in replica order, not in the order the "
        "threads finished"
    )
    assert outputs.judge_in_order(inputs, listed("out", in_order[:2])) == (
        "return a list with 3 outputs"
    )


def test_output_draws_cover_the_sizes_the_graders_name():
    scatter = draws(outputs.scatter_input_inputs)
    assert {rows for rows, _, _ in scatter} == set(outputs.FOUR_CHUNK_ROWS)
    assert {columns for _, columns, _ in scatter} == set(range(1, 6))
    layout = draws(outputs.layout_inputs)
    assert {a[0] for a, _, _ in layout} == set(range(1, 7)) and {len(a) for a, _, _ in layout} == {
        1
    }
    assert {tuple(b) for _, b, _ in layout} == {(r, c) for r in range(1, 5) for c in range(1, 5)}
    model = draws(outputs.model_inputs)
    assert {rows for _, rows in model} == set(range(5, 17))
    replica = draws(outputs.replica_inputs)
    assert {len(factors) for factors, _, _, _ in replica} == {2, 3, 4}
    factors = [f for drawn, _, _, _ in replica for f in drawn]
    assert -3.0 <= min(factors) < -2.95 and 2.95 < max(factors) <= 3.0
    assert all(round(f, 2) == f for f in factors) and any(round(f, 1) != f for f in factors)
    assert {length for _, length, _, _ in replica} == set(range(1, 6))
    assert {tuple(pair) for _, _, pair, _ in replica} == {
        (a, b) for a in range(1, 4) for b in range(1, 4) if a != b
    }
    for drawn, seed_at in ((scatter, 2), (layout, 2), (model, 0), (replica, 3)):
        seeds = [inputs[seed_at] for inputs in drawn]
        assert len(set(seeds)) == len(seeds) and max(seeds) > 2**61 and min(seeds) >= 0
        torch.Generator().manual_seed(max(seeds) + 1)  # seeds torch's generator, + 1 too


def test_long_files_of_repeated_tokens_are_compared_token_by_token():
    # 303 tokens, one apart: difflib's autojunk would drop "+" and "1" (over 1 % of a long
    # sequence) and find them 1 % alike; token by token they are 2 * 302 / 606 alike
    first, second = ("x = " + str(start) + " + 1" * 150 + "\n" for start in (2, 3))
    assert similar_pairs({"ada": {1: first}, "bo": {1: second}}, {1: "pass\n"}) == [
        Similar(1, "ada", "bo", 302 / 303)
    ]


def test_untouched_stubs_are_nobodys_copy_but_a_one_token_file_is_compared():
    stub = "def f():\n    pass\n"
    files = {"ada": {1: stub}, "bo": {1: "def g():\n    pass\n\n# later\n"}}
    assert similar_pairs(files, {1: stub}) == []
    one = {"ada": {1: "pass\n"}, "bo": {1: "pass  # done\n"}}
    assert similar_pairs(one, {1: stub}) == [Similar(1, "ada", "bo", 1.0)]


def test_the_ring_checks_draw_a_fresh_seed_for_each_size_each_run():
    for case, (shape, count) in outputs.RING_SIZES.items():
        drawn = draws(outputs.ring_size_inputs(case), 100)
        assert {(tuple(inputs[0]), inputs[1]) for inputs in drawn} == {(tuple(shape), count)}
        seeds = [seed for _, _, seed in drawn]
        assert len(set(seeds)) == len(seeds) and max(seeds) > 2**61 and min(seeds) >= 0
        torch.Generator().manual_seed(max(seeds))


# --------------------------------------------------------------------------------------
# Numbers a student's function returns (dpkit/grading/counted.py)


def table(rows: dict) -> dict[str, torch.Tensor]:
    return counted.pack_traffic(rows)


def test_three_copies_of_5_floats_send_40_20_0_bytes_and_receive_0_20_40():
    # lane 0 -> 1, 1 -> 2, 0 -> 2, 20 bytes each
    right = {0: (40, 0), 1: (20, 20), 2: (0, 40)}
    assert counted.judge_traffic([5], table(right)) is None
    assert counted.judge_traffic([5], table({2: (0, 40), 0: (40, 0), 1: (20, 20)})) is None
    assert counted.judge_traffic([5], table({0: (40, 0), 1: (20, 20)})) == (
        "got {0: (40, 0), 1: (20, 20)}, expected {0: (40, 0), 1: (20, 20), 2: (0, 40)}: sum "
        "Transfer.nbytes by source (sent) and by destination (received); the host (-1) "
        "counts as lane 0"
    )
    assert "got {0: (10, 0), 1: (5, 5), 2: (0, 10)}" in counted.judge_traffic(
        [5],
        table({0: (10, 0), 1: (5, 5), 2: (0, 10)}),  # elements, not bytes
    )
    not_table = "the outputs sent for traffic_per_lane are not a table of lanes"
    rows = table(right)["traffic"]
    for bad in (
        rows.int(),
        rows.flatten(),
        rows[:, :2],
        torch.cat([rows, torch.zeros(3, 1, dtype=torch.int64)], dim=1),
        torch.cat([rows, rows[:1]]),  # lane 0 twice
        rows.tolist(),
    ):
        assert counted.judge_traffic([5], {"traffic": bad}) == not_table
    assert counted.judge_traffic([5], {}) == not_table
    # nothing recorded is still a table of lanes, an empty one
    assert counted.pack_traffic({})["traffic"].dtype == torch.int64
    assert counted.judge_traffic([5], table({})).startswith("got {}, expected {0: (40, 0),")


def test_reduce_add_over_3_lanes_sends_each_chunk_to_lane_0_and_the_ring_sends_two_thirds():
    lanes, chunk = inputs = [3, 10]  # 30 floats: 120 bytes per lane
    reduce_add = {0: (0, 240), 1: (120, 0), 2: (120, 0)}
    ring = {lane: (160, 160) for lane in range(lanes)}  # 2 * (3 - 1) * 10 floats each way
    both = {**counted.pack_traffic(reduce_add, "reduce_add"), **counted.pack_traffic(ring, "ring")}
    assert counted.judge_compare(inputs, both) is None
    moved = {0: (0, 240), 1: (120, 0), 2: (120, 0), 3: (0, 0)}
    got = counted.judge_compare(inputs, {**both, **counted.pack_traffic(moved, "reduce_add")})
    assert got == (
        "reduce_add traffic {0: (0, 240), 1: (120, 0), 2: (120, 0), 3: (0, 0)}, expected "
        "{0: (0, 240), 1: (120, 0), 2: (120, 0)}: measure only the reduce_add call, with "
        "traffic_per_lane"
    )
    half = {lane: (80, 80) for lane in range(lanes)}
    assert counted.judge_compare(inputs, {**both, **counted.pack_traffic(half, "ring")}) == (
        "ring traffic {0: (80, 80), 1: (80, 80), 2: (80, 80)}, expected "
        "{0: (160, 160), 1: (160, 160), 2: (160, 160)}"
    )
    four = [4, 10]  # 160 bytes per lane, each ring lane 2 * 3 * 40 = 240 each way
    want = {
        **counted.pack_traffic({0: (0, 480), 1: (160, 0), 2: (160, 0), 3: (160, 0)}, "reduce_add"),
        **counted.pack_traffic({lane: (240, 240) for lane in range(4)}, "ring"),
    }
    assert counted.judge_compare(four, want) is None
    not_tables = "the outputs sent for compare_traffic are not two tables of lanes"
    for name in ("reduce_add", "ring"):
        assert counted.judge_compare(inputs, {k: v for k, v in both.items() if k != name}) == (
            not_tables
        )


def sgd_by_hand(seed: int, rows: int) -> tuple[list[float], list[torch.Tensor]]:
    """Three steps of plain SGD (lr 0.1) on the mean squared error, by the chain rule."""
    params = [p.detach().clone() for p in outputs.seeded_model(seed).parameters()]
    losses = []
    for _ in range(3):
        _, y, _ = outputs.seeded_batch(seed, rows)
        out, grads = by_hand(seed, rows, lambda out, y: 2 * (out - y) / out.numel(), params)
        losses.append(((out - y) ** 2).mean().item())
        params = [p - 0.1 * g for p, g in zip(params, grads.values())]
    return losses, params


def test_three_sgd_steps_give_the_losses_and_parameters_worked_out_by_hand():
    seed, rows = inputs = [27, 9]
    losses, params = sgd_by_hand(seed, rows)
    assert losses[0] > losses[1] > losses[2]  # it learns
    right = {"losses": torch.tensor(losses), **listed("param", params)}
    assert counted.judge_train(inputs, right) is None
    near = {"losses": torch.tensor(losses) + 5e-6, **listed("param", [p + 5e-6 for p in params])}
    assert counted.judge_train(inputs, near) is None
    first = {**right, "losses": torch.tensor([losses[0]] * 3)}  # no step taken
    hint = counted.judge_train(inputs, first)
    said, _, rest = hint.removeprefix(
        f"step 1: loss {losses[0]} differs from one device's "
    ).partition(";")
    assert float(said) == pytest.approx(losses[1], abs=1e-6)  # autograd's, by another route
    assert rest == " zero the gradients first and use mse_loss on the gathered output"
    off = {**right, "losses": torch.tensor([losses[0] + 2e-5, *losses[1:]])}
    assert counted.judge_train(inputs, off).startswith("step 0: loss")
    stale = {**right, **listed("param", [*params[:3], params[3] + 1e-4])}
    assert counted.judge_train(inputs, stale) == "after 3 steps the parameters differ"
    shaped = {**right, **listed("param", [params[0].T, *params[1:]])}
    assert counted.judge_train(inputs, shaped) == "after 3 steps the parameters differ"
    for wrong in (
        {**right, "losses": torch.tensor(losses[:2])},
        {**right, "losses": losses},
        {"losses": right["losses"], **listed("param", params[:3])},
    ):
        assert counted.judge_train(inputs, wrong) == NOT_TENSORS


def difference(*values: float, dtype=torch.float64) -> dict[str, torch.Tensor]:
    return {"difference": torch.tensor(values, dtype=dtype)}


def test_equal_gradients_differ_by_less_than_1e_5_and_by_no_negative_amount():
    cases = [[0, 6], [1, 7]]
    for value in (0.0, 1e-7, 9.9e-6):
        assert counted.judge_difference_small(cases, difference(value, 0.0)) is None
        assert counted.judge_difference_small(cases, difference(0.0, value)) is None
    for value in (1e-5, 0.5, -1e-9, float("nan")):
        assert counted.judge_difference_small(cases, difference(0.0, value)) == (
            f"got {value}; equal gradients differ by ~1e-7 at most"
        )
    for wrong in (
        difference(0.0, 0.0, dtype=torch.float32),
        difference(0.0),  # one case answered of two
        {"difference": torch.zeros(3).double()},
        {},
    ):
        assert counted.judge_difference_small(cases, wrong) == NOT_TENSORS


def dropped_rows_gradients(seed: int, rows: int) -> list[torch.Tensor]:
    """By hand: one device's gradients minus the wrong forward's are the gradients of the
    rows after the first 3 alone (the wrong forward detaches them)."""
    _, dropped = by_hand(
        seed, rows, lambda out, y: torch.cat([torch.zeros(3, 2), 2 * (out - y)[3:] / out.numel()])
    )
    return list(dropped.values())


def test_a_forward_that_drops_rows_from_backward_differs_by_those_rows_gradients():
    seed, rows = 31, 8
    x, _, _ = outputs.seeded_batch(seed, rows)
    model = outputs.seeded_model(seed)
    wrong = counted.first_rows_only(model, (x,), None)
    assert torch.allclose(wrong, model(x))
    after = torch.autograd.grad(wrong[3:].sum(), list(model.parameters()))
    assert all(not grad.any() for grad in after)  # rows 3 on reach no parameter
    inputs = [[seed, rows], [seed + 1, rows + 1]]
    want = [max(g.abs().max().item() for g in dropped_rows_gradients(*case)) for case in inputs]
    assert counted.judge_difference_large(inputs, difference(*want)) is None
    assert counted.judge_difference_large(inputs, difference(want[0] * (1 + 5e-4), want[1])) is None
    hint = counted.judge_difference_large(inputs, difference(want[0], want[1] * (1 - 2e-3)))
    said, _, rest = hint.removeprefix(
        f"a forward that drops 6 of 9 rows from backward gave a difference of "
        f"{want[1] * (1 - 2e-3)}, not the largest one, "
    ).partition(";")
    assert float(said) == pytest.approx(want[1], rel=1e-5)  # autograd's, to 6 digits
    assert rest == " compare the .grad of every parameter, using the forward you are given"
    smallest = min(g.abs().max().item() for g in dropped_rows_gradients(seed, rows))
    assert counted.judge_difference_large(inputs, difference(smallest, want[1])) is not None
    assert counted.judge_difference_large(inputs, difference(*want, dtype=torch.float32)) == (
        NOT_TENSORS
    )


def test_a_signed_maximum_fails_one_of_the_two_cases_whichever_way_it_subtracts():
    # the parent's cases: the largest gradient difference positive in the first, negative in
    # the second, checked here by hand
    inputs = counted.difference_inputs(random.Random(5))
    signs = []
    for case in inputs:
        dropped = dropped_rows_gradients(*case)
        largest = max(g.max().item() for g in dropped)
        smallest = min(g.min().item() for g in dropped)
        signs.append(largest > -smallest)
    assert signs == [True, False]
    for subtracted in (1, -1):  # one device's minus data-parallel's, or the other way round
        signed = [
            max((subtracted * g).max().item() for g in dropped_rows_gradients(*case))
            for case in inputs
        ]
        hint = counted.judge_difference_large(inputs, difference(*signed))
        assert hint is not None and hint.endswith(
            "take the largest absolute difference: .abs() before .max(), since a gradient "
            "may be smaller than one device's as well as larger"
        )


def test_counted_draws_cover_the_sizes_the_graders_name():
    assert {n for (n,) in draws(counted.traffic_inputs)} == set(range(1, 51))
    compare = draws(counted.compare_inputs)
    assert {lanes for lanes, _ in compare} == {3, 4}
    chunks = [chunk for _, chunk in compare]
    assert min(chunks) == 10 and max(chunks) == 300
    difference_cases = [case for drawn in draws(counted.difference_inputs) for case in drawn]
    for drawn, low in ((draws(counted.train_inputs), 8), (difference_cases, 6)):
        assert {rows for _, rows in drawn} == set(range(low, 17))
        seeds = [seed for seed, _ in drawn]
        assert len(set(seeds)) == len(seeds) and max(seeds) > 2**61 and min(seeds) >= 0


# --------------------------------------------------------------------------------------
# Nested outputs described as text (dpkit/grading/structure.py)

Result = namedtuple("Result", ["logits", "loss"])
Result.__module__ = "test_task4"  # as the grader's namedtuple is named in a grading run


def test_a_container_is_described_by_its_type_keys_and_where_its_tensors_and_nones_are():
    a, b = torch.zeros(1), torch.ones(2)
    assert structure.describe(a) == ("T", [a])
    assert structure.describe(None) == ("None", [])
    text, tensors = structure.describe((a, [b, a]))
    assert text == "builtins.tuple(T,builtins.list(T,T))" and tensors == [a, b, a]
    text, tensors = structure.describe(OrderedDict(b=b, a=[None, a]))
    assert text == "collections.OrderedDict{b:T,a:builtins.list(None,T)}" and tensors == [b, a]
    assert structure.describe({"x": Result(a, b)}) == (
        "builtins.dict{x:test_task4.Result(T,T)}",
        [a, b],
    )
    assert structure.describe(5) == ("object builtins.int", [])
    assert structure.describe([]) == ("builtins.list()", [])
    packed = structure.pack([(a, None), {"k": b}])
    assert bytes(packed["text"].tolist()).decode() == ("builtins.tuple(T,None)\nbuiltins.dict{k:T}")
    assert packed["text"].dtype == torch.uint8 and sorted(packed) == ["t0", "t1", "text"]
    assert packed["t0"] is a and packed["t1"] is b


def scatter_sent(
    lines: list[str],
    tensors: list[torch.Tensor],
    columns: list | None = None,
    tuples: list | None = None,
    dicts: list | None = None,
) -> dict[str, torch.Tensor]:
    """What the grader sends: the lines and tensors of scatter((x, [y, x])) and
    scatter(OrderedDict(...)), and ``columns``, ``tuples`` and ``dicts``, what
    scatter([x.T]), scatter((x.T,)) and scatter({'c': x.T}) gave with dim=1 (default: five
    rows' right answers)."""
    text = torch.tensor(list("\n".join(lines).encode()), dtype=torch.uint8)
    x, _ = structure.scatter_tensors(5, 17)
    parts = [x[0:2].t(), x[2:4].t(), x[4:5].t()]
    columns = [[part] for part in parts] if columns is None else columns
    tuples = [(part,) for part in parts] if tuples is None else tuples
    dicts = [{"c": part} for part in parts] if dicts is None else dicts
    dim_part = structure.pack(columns, structure.DIM)
    for prefix, given in zip(structure.DIMS, (tuples, dicts)):
        dim_part.update(structure.pack(given, prefix))
    return {"text": text, **{f"t{i}": t for i, t in enumerate(tensors)}, **dim_part}


def test_five_rows_scatter_into_three_tuples_and_three_ordered_dicts():
    inputs = [5, 17]  # torch.chunk: 2, 2 and 1 rows
    x, y = structure.scatter_tensors(*inputs)
    generator = torch.Generator().manual_seed(17)
    assert torch.equal(x, torch.randn(5, 2, generator=generator))
    assert torch.equal(y, torch.randn(5, generator=generator))
    pieces = [(x[0:2], y[0:2]), (x[2:4], y[2:4]), (x[4:5], y[4:5])]
    nested = "builtins.tuple(T,builtins.list(T,T))"
    mapping = "collections.OrderedDict{a:T,b:T}"
    tensors = [t for a, b in pieces for t in (a, b, a)] + [t for a, b in pieces for t in (a, b)]
    right = scatter_sent([nested] * 3 + [mapping] * 3, tensors)
    assert structure.judge_scatter(inputs, right) is None
    assert structure.judge_scatter(inputs, scatter_sent([nested] * 4 + [mapping] * 4, tensors)) == (
        "expected 3 entries (one per lane) for each input, got another number"
    )
    listed_ = "builtins.list(T,builtins.list(T,T))"
    got = structure.judge_scatter(inputs, scatter_sent([listed_] * 3 + [mapping] * 3, tensors))
    assert got == (
        "scatter((x, [y, x]), lanes) gave 'builtins.list(T,builtins.list(T,T))' on lane 0; a "
        "tuple input gives a tuple per device, a list a list"
    )
    got = structure.judge_scatter(
        inputs, scatter_sent([nested] * 3 + [mapping, "builtins.dict{a:T,b:T}", mapping], tensors)
    )
    assert got == (
        "scatter(OrderedDict(a=x, b=y), lanes) gave ['OrderedDict', 'dict'] per device; a "
        "mapping stays the same type, with its keys: build each device's dict with "
        "type(inputs)(...)"
    )
    even = [x[0:2], y[0:2], x[0:2]] + tensors[3:-1] + [y[3:4]]
    assert structure.judge_scatter(inputs, scatter_sent([nested] * 3 + [mapping] * 3, even)) == (
        "the pieces are not the rows of each tensor that torch.chunk gives each lane"
    )
    short = scatter_sent([nested] * 3 + [mapping] * 3, tensors[:-1])
    assert structure.judge_scatter(inputs, short) == (
        "the pieces are not the rows of each tensor that torch.chunk gives each lane"
    )
    one_off = [listed_, nested, nested] + [mapping] * 3  # lane 0's is named
    assert structure.judge_scatter(inputs, scatter_sent(one_off, tensors)).startswith(
        f"scatter((x, [y, x]), lanes) gave {listed_!r} on lane 0;"
    )
    for kinds, lines in (
        ("['Dict']", ["my.pkg.Dict{a:T,b:T}"] * 3),  # the type's name, not its module's
        ("['T']", ["T"] * 3),  # a tensor where a mapping should be
    ):
        hint = structure.judge_scatter(inputs, scatter_sent([nested] * 3 + lines, tensors))
        assert hint.startswith(f"scatter(OrderedDict(a=x, b=y), lanes) gave {kinds} per device;")
    for bad in (
        {**right, "text": right["text"].int()},
        {**right, "text": torch.tensor([255, 254], dtype=torch.uint8)},
        {},
        {k: v for k, v in right.items() if not k.startswith(structure.DIM)},
    ):
        assert structure.judge_scatter(inputs, bad) == NOT_TENSORS
    # dim=1: a scatter that drops dim for the list's element splits x.T's two rows instead
    dim_hint = (
        "scatter([x.T], lanes, dim=1) did not split x.T along dim 1: pass dim on to "
        "scatter_tensor and to every scatter call made for an element"
    )
    rows_split = [[piece] for piece in x.t().chunk(4, 0)]
    assert structure.judge_scatter(inputs, scatter_sent([nested] * 3 + [mapping] * 3, tensors,
                                                        rows_split)) == dim_hint  # fmt: skip
    as_tuples = [(a.t(),) for a, _ in pieces]  # the right pieces in the wrong container
    assert structure.judge_scatter(inputs, scatter_sent([nested] * 3 + [mapping] * 3, tensors,
                                                        as_tuples)) == dim_hint  # fmt: skip
    wrong_rows = [[a.t()] for a in x.split([1, 2, 2])]  # not torch.chunk's 2, 2, 1
    assert structure.judge_scatter(inputs, scatter_sent([nested] * 3 + [mapping] * 3, tensors,
                                                        wrong_rows)) == dim_hint  # fmt: skip
    # a tuple's or a plain dict's element scattered without dim (x.T's 2 rows, one per lane)
    rows_of = list(x.t().chunk(4, 0))
    lost_in_tuple = scatter_sent([nested] * 3 + [mapping] * 3, tensors,
                                 tuples=[(row,) for row in rows_of])  # fmt: skip
    assert structure.judge_scatter(inputs, lost_in_tuple) == (
        "scatter((x.T,), lanes, dim=1) did not split x.T along dim 1 (2 entries, expected 3): "
        "pass dim on to every scatter call made for an element, in every branch (tuple, list, "
        "dict, namedtuple)"
    )
    ordered = [OrderedDict(c=a.t()) for a, _ in pieces]  # a plain dict made an OrderedDict
    got = structure.judge_scatter(
        inputs, scatter_sent([nested] * 3 + [mapping] * 3, tensors, dicts=ordered)
    )
    assert got == (
        "scatter({'c': x.T}, lanes, dim=1) gave 'collections.OrderedDict{c:T}' on lane 0, "
        "expected 'builtins.dict{c:T}': a container stays its own type (a plain dict a plain "
        "dict: type(inputs)(...))"
    )


def gather_sent(lines: list[str], tensors: list[torch.Tensor], columns=None) -> dict:
    """What the gather check sends: its lines and tensors, and ``columns``, what the dim=1
    gather of plain dicts gave (default: the right answer for rows [2, 1], seed 23)."""
    text = torch.tensor(list("\n".join(lines).encode()), dtype=torch.uint8)
    if columns is None:
        wide = structure.columns_outputs([2, 1], 23)
        columns = {"w": torch.cat([o["w"] for o in wide], 1)}
    dim_part = structure.pack([columns], structure.DIM)
    return {"text": text, **{f"t{i}": t for i, t in enumerate(tensors)}, **dim_part}


def test_two_replicas_gather_into_one_dict_with_their_pieces_concatenated():
    rows, seed = inputs = [[2, 1], 23]
    generator = torch.Generator().manual_seed(seed)
    drawn = [
        (torch.randn(n, 1, generator=generator), torch.randn(1, 3, generator=generator),
         torch.randn((), generator=generator), torch.randn(n, 2, generator=generator))
        for n in rows
    ]  # fmt: skip
    outs = [structure.replica_outputs(rows, seed, Result)[i] for i in range(2)]
    for (out, logits, loss, pair), got in zip(drawn, outs):
        assert torch.equal(got["out"][0], out) and got["out"][1] is None
        assert torch.equal(got["extra"].logits, logits) and torch.equal(got["extra"].loss, loss)
        assert torch.equal(got["pair"][0], pair) and got["pair"][1] is None
    out = torch.cat([d[0] for d in drawn])  # (3, 1)
    logits = torch.cat([d[1] for d in drawn])  # (2, 3)
    loss = torch.stack([d[2] for d in drawn])  # (2,): scalars gather into a vector
    pair = torch.cat([d[3] for d in drawn])  # (3, 2)
    entries = {
        "out": "out:builtins.list(T,None)",
        "extra": "extra:test_task4.Result(T,T)",
        "pair": "pair:builtins.tuple(T,None)",
    }
    line = "collections.OrderedDict{" + ",".join(entries.values()) + "}"
    right = [out, logits, loss, pair]
    assert structure.judge_gather(inputs, gather_sent([line], right)) is None
    plain = line.replace("collections.OrderedDict", "builtins.dict")
    assert structure.judge_gather(inputs, gather_sent([plain], right)) == (
        "gathering OrderedDicts gave a plain dict: a dict gathers into a dict of the same type "
        "(type(first)(...)), with the same keys"
    )
    # keys in another order, as a set compares: the tensors come in that order
    swapped = "collections.OrderedDict{" + ",".join(entries[k] for k in ("pair", "extra", "out"))
    swapped += "}"
    assert structure.judge_gather(inputs, gather_sent([swapped], [pair, logits, loss, out])) is None
    assert structure.judge_gather(inputs, gather_sent([swapped], right)) == (
        "the gathered tensors are not the replicas' pieces concatenated (shapes [(3, 1), "
        "(2, 3), (2,), (3, 2)], expected [(3, 2), (2, 3), (2,), (3, 1)]): scalars gather into "
        "a vector"
    )
    flat = torch.cat([d[2].view(1) for d in drawn])
    assert structure.judge_gather(inputs, gather_sent([line], [out, logits, flat, pair])) is None
    assert "shapes [(3, 1), (2, 3), (1,), (3, 2)]" in structure.judge_gather(
        inputs, gather_sent([line], [out, logits, loss[:1], pair])
    )
    wrong_kind = "must stay a Result"
    for mistake in ("extra:builtins.tuple(T,T)", "pair:builtins.list(T,None)"):
        key = mistake.split(":")[0]
        changed = line.replace(entries[key], mistake)
        hint = structure.judge_gather(inputs, gather_sent([changed], right))
        assert hint == (
            f"gathering dicts of a list (with a None), a Result namedtuple and a plain tuple "
            f"gave {changed!r}; a dict gathers into a dict with the same keys, a list into a "
            f"list, a tuple into a tuple, None into None, and a namedtuple {wrong_kind}"
        )
    two = structure.judge_gather(inputs, gather_sent([line, line], right))
    assert two.startswith(f"gathering dicts of a list (with a None), a Result namedtuple and a "
                          f"plain tuple gave {line!r}")  # fmt: skip
    assert structure.judge_gather(inputs, {"t0": out}) == NOT_TENSORS
    empty = structure.judge_gather(inputs, gather_sent([""], right))
    assert empty.startswith(
        "gathering dicts of a list (with a None), a Result namedtuple and a plain tuple gave '';"
    )
    # the dim=1 gather of plain dicts: along dim 0, or into another type, is named
    wide = structure.columns_outputs(rows, seed)
    stacked = {"w": torch.cat([o["w"] for o in wide[::-1]], 1)}  # the pieces out of order
    dim_hint = (
        "gather of dicts along dim=1 did not concatenate their tensors along dim 1: pass dim "
        "on to every gather call made for an element"
    )
    assert structure.judge_gather(inputs, gather_sent([line], right, stacked)) == dim_hint
    ordered = OrderedDict(w=torch.cat([o["w"] for o in wide], 1))
    assert structure.judge_gather(inputs, gather_sent([line], right, ordered)) == dim_hint
    assert structure.judge_gather(inputs, {**gather_sent([line], right), "dim_text": out}) == (
        NOT_TENSORS
    )


def test_structure_draws_cover_the_sizes_the_graders_name():
    scatter = draws(structure.scatter_inputs)
    assert {rows for rows, _ in scatter} == set(range(5, 17))
    gather = draws(structure.gather_inputs)
    assert {len(rows) for rows, _ in gather} == {2, 3, 4}
    assert {n for rows, _ in gather for n in rows} == {1, 2, 3}
    for drawn in (scatter, gather):
        seeds = [seed for _, seed in drawn]
        assert len(set(seeds)) == len(seeds) and max(seeds) > 2**61 and min(seeds) >= 0
        torch.Generator().manual_seed(max(seeds) + 1)
