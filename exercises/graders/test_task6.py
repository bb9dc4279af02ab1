"""Grader for task 6: weighted scatter for unequal devices, and the straggler effect."""

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpkit.grading.checks import must_raise

pytestmark = pytest.mark.task6
EXERCISE = "task6_weighted.py"
FORBIDDEN = ("dpkit.scatter.weighted_chunk_sizes",)

# sleep() may overshoot on a busy machine; it never undershoots
SLACK = 0.25


def step_time(sizes, speeds) -> float:
    return max(rows / speed for rows, speed in zip(sizes, speeds))


def best_step_time(batch, speeds) -> float:
    """The optimum, by handing out rows one at a time to the device that finishes soonest."""
    sizes = [0] * len(speeds)
    for _ in range(batch):
        soonest = min(range(len(speeds)), key=lambda i: (sizes[i] + 1) / speeds[i])
        sizes[soonest] += 1
    return step_time(sizes, speeds)


def test_sizes_are_a_split(exercise):
    """weighted_chunk_sizes returns one whole-row size per device, adding up to the batch"""
    sizes = exercise.weighted_chunk_sizes(10, [1.0, 2.0, 3.0])
    assert len(sizes) == 3, f"3 speeds need 3 sizes, got {sizes}"
    assert all(isinstance(s, int) and s >= 0 for s in sizes), f"sizes must be ints >= 0: {sizes}"
    assert sum(sizes) == 10, f"sizes {sizes} add up to {sum(sizes)}, not the batch 10"
    with must_raise(
        ValueError,
        "weighted_chunk_sizes(10, [1.0, 0.0])",
        "a device of speed 0 never finishes: reject speeds that are not above 0",
    ):
        exercise.weighted_chunk_sizes(10, [1.0, 0.0])


def test_equal_speeds_balance(exercise):
    """equal speeds give sizes that differ by at most one row"""
    for batch, devices in [(10, 4), (6, 4), (3, 4), (12, 3)]:
        sizes = exercise.weighted_chunk_sizes(batch, [1.0] * devices)
        assert sum(sizes) == batch and max(sizes) - min(sizes) <= 1, (
            f"{batch} rows over {devices} equal devices gave {sizes}; sizes should differ "
            "by at most one"
        )


@settings(max_examples=150, deadline=None, database=None)
@given(
    batch=st.integers(0, 300),
    speeds=st.lists(st.floats(0.1, 10.0), min_size=1, max_size=8),
)
def test_sizes_are_optimal(exercise, batch, speeds):
    """weighted_chunk_sizes minimises the slowest device's time"""
    sizes = exercise.weighted_chunk_sizes(batch, speeds)
    assert sum(sizes) == batch and len(sizes) == len(speeds), f"{sizes} is not a split"
    got, best = step_time(sizes, speeds), best_step_time(batch, speeds)
    assert got <= best * (1 + 1e-9), (
        f"sizes {sizes} for speeds {speeds} take {got:.4f}, but {best:.4f} is possible: "
        "give each row to the device with the smallest (rows + 1) / speed; rounding "
        "proportional shares is not enough"
    )


def test_simulated_step_time(exercise):
    """simulated_step_time is the time of the slowest device"""
    got = exercise.simulated_step_time([4, 2, 2], [4.0, 1.0, 0.5], 0.5)
    assert got == pytest.approx(2.0), (
        f"got {got}: device 2 needs 2 rows * 0.5 s / speed 0.5 = 2.0 s, and the step lasts "
        "as long as the slowest device"
    )
    assert exercise.simulated_step_time([3, 0], [1.0, 2.0], 1.0) == pytest.approx(3.0)


def test_measure_step_time(exercise):
    """measure_step_time runs the devices at the same time and measures real time"""
    sizes, speeds, per_row = [10, 10, 20, 10], [1.0, 1.0, 2.0, 1.0], 0.005
    start = time.perf_counter()
    measured = exercise.measure_step_time(sizes, speeds, per_row)
    outside = time.perf_counter() - start
    assert measured <= outside + 1e-3, "the measured time is longer than the call itself"
    assert measured >= 0.05 - 1e-3, (
        f"measured {measured:.3f} s, but each device sleeps 0.05 s: sleep in each thread and "
        "time from the first start to the last join"
    )
    assert measured < 0.195, (  # one after another takes at least 0.2 s: sleep never undershoots
        f"measured {measured:.3f} s; the 4 devices take 0.05 s together, 0.2 s one after "
        "another: start every thread before joining any"
    )


def test_straggler_report(exercise):
    """weighted chunks beat torch's equal chunks on unequal devices"""
    speeds, per_row = [4.0, 1.0, 1.0, 1.0], 0.003
    report = exercise.straggler_report(64, speeds, per_row)
    missing = {"torch_chunks", "weighted_chunks", "torch_seconds", "weighted_seconds", "speedup"}
    missing -= set(report)
    assert not missing, f"the report lacks {sorted(missing)}"
    assert list(report["torch_chunks"]) == [16, 16, 16, 16], (
        f"torch_chunks is {report['torch_chunks']}; use dpkit.torch_chunk_sizes(64, 4)"
    )
    assert step_time(report["weighted_chunks"], speeds) == pytest.approx(9.25), (
        f"weighted_chunks {report['weighted_chunks']} are not optimal"
    )
    assert 0.048 - 1e-3 <= report["torch_seconds"] < 0.048 + SLACK, (
        f"torch_seconds is {report['torch_seconds']:.3f}; 16 rows on a speed-1 device take "
        "0.048 s: measure with measure_step_time"
    )
    assert 0.02775 - 1e-3 <= report["weighted_seconds"] < 0.02775 + SLACK, (
        f"weighted_seconds is {report['weighted_seconds']:.3f}, expected about 0.028 (37 rows "
        "at speed 4 take 37 * 0.003 / 4 s)"
    )
    ratio = report["torch_seconds"] / report["weighted_seconds"]
    assert report["speedup"] == pytest.approx(ratio), "speedup is torch_seconds / weighted_seconds"
    small = exercise.straggler_report(10, [1.0] * 8, 0.001)
    assert list(small["torch_chunks"]) == [2, 2, 2, 2, 2, 0, 0, 0], (
        f"straggler_report(10, 8 equal devices) gave torch_chunks {small['torch_chunks']}; "
        "torch.chunk makes 5 chunks of 2 rows: pad with 0 for the 3 idle devices, one size "
        "per device"
    )
    assert sorted(small["weighted_chunks"]) == [1, 1, 1, 1, 1, 1, 2, 2], (
        f"straggler_report(10, 8 equal devices) gave weighted_chunks "
        f"{small['weighted_chunks']}, not weighted_chunk_sizes(10, [1.0] * 8)"
    )
