"""Grader for task 6: weighted scatter for unequal devices, and the straggler effect.

Under ``dpkit grade`` every check is decided by the grader's parent process, from the
sizes, times and report computed here on inputs it chose
(:mod:`dpkit.grading.decided`, :mod:`dpkit.grading.weighted`).
"""

import contextlib
import threading
import time
import types

import pytest
import torch

from dpkit.grading import decided
from dpkit.grading.checks import must_raise

pytestmark = pytest.mark.task6
EXERCISE = "task6_weighted.py"
FORBIDDEN = ("dpkit.chunk_plans.weighted_chunk_sizes",)


def sizes_of(exercise, cases) -> list[list[int]]:
    """weighted_chunk_sizes on each (batch, speeds) case; whole-row sizes, as ints."""
    answers = []
    for batch, speeds in cases:
        sizes = exercise.weighted_chunk_sizes(batch, speeds)
        assert all(isinstance(s, int) for s in sizes), f"sizes must be ints >= 0: {sizes}"
        answers.append(list(sizes))
    return answers


def test_sizes_are_a_split(exercise, request):
    """weighted_chunk_sizes returns one whole-row size per device, adding up to the batch"""
    nodeid = request.node.nodeid
    cases = decided.inputs_here(nodeid)
    decided.answer(nodeid, cases, decided.pack_sizes(sizes_of(exercise, cases)))
    batch, speeds = 10, [1.0, 0.0]  # the hint names the call it makes
    call, why = (
        f"weighted_chunk_sizes({batch}, {speeds})",
        "a device of speed 0 never finishes: reject speeds that are not above 0",
    )
    with must_raise(ValueError, call, why):
        try:
            exercise.weighted_chunk_sizes(batch, speeds)
        except ZeroDivisionError as error:
            raise AssertionError(
                f"{call} raised ZeroDivisionError ({error}), not ValueError: {why}, before "
                "dividing by them"
            ) from error
    with must_raise(
        ValueError,
        "weighted_chunk_sizes(10, [2.0, -1.0])",
        "a negative speed is not a speed: reject every speed that is not above 0",
    ):
        exercise.weighted_chunk_sizes(10, [2.0, -1.0])


def test_equal_speeds_balance(exercise, request):
    """equal speeds give sizes that differ by at most one"""
    nodeid = request.node.nodeid
    cases = decided.inputs_here(nodeid)
    decided.answer(nodeid, cases, decided.pack_sizes(sizes_of(exercise, cases)))


def test_sizes_are_optimal(exercise, request):
    """weighted_chunk_sizes minimises the slowest device's time"""
    # Sixty cases the grader's parent drew, the edges among them; it computes the optimum.
    nodeid = request.node.nodeid
    cases = decided.inputs_here(nodeid)
    decided.answer(nodeid, cases, decided.pack_sizes(sizes_of(exercise, cases)))


def test_simulated_step_time(exercise, request):
    """simulated_step_time is the time of the slowest device"""
    nodeid = request.node.nodeid
    cases = decided.inputs_here(nodeid)
    seconds = [float(exercise.simulated_step_time(*case)) for case in cases]
    decided.answer(nodeid, cases, {"seconds": torch.tensor(seconds, dtype=torch.float64)})


class _TimeWithSleep(types.ModuleType):
    """The time module as the student's file sees it during the check: its own ``sleep``."""

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)


SLEEPS_KEPT = 1000  # sleeps recorded at most (one per device is asked for)


@contextlib.contextmanager
def recorded_sleeps(exercise):
    """Record each ``time.sleep`` the student's file calls: (thread, seconds, start, end).

    Only the file's own names are swapped (its ``time``, a ``sleep`` imported from it), not
    the time module itself: a call that hangs past the check's limit leaves nothing changed
    for the checks after it. The thread is an index: 0 the caller's, then each new thread.
    """
    real = time.sleep
    # By Thread object, kept here: a finished thread's ident may be given to the next one.
    threads = {threading.current_thread(): 0}
    records: list[list[float]] = []
    lock = threading.Lock()

    def sleep(seconds):
        start = time.perf_counter()
        real(seconds)
        end = time.perf_counter()
        with lock:
            if len(records) < SLEEPS_KEPT:
                thread = threads.setdefault(threading.current_thread(), len(threads))
                records.append([thread, float(seconds), start, end])

    namespace = vars(exercise)
    swapped = {name: value for name, value in namespace.items() if value is time or value is real}
    proxy = _TimeWithSleep("time")
    proxy.sleep = sleep
    namespace.update({name: proxy if value is time else sleep for name, value in swapped.items()})
    try:
        yield records
    finally:
        namespace.update(swapped)


def test_measure_step_time(exercise, request):
    """measure_step_time runs the devices at the same time and measures real time"""
    # The parent chose the sizes and speeds (4 or 5 devices sleeping 50-60 ms each) and
    # judges the time returned against the call's own time, and the sleeps recorded: a
    # thread per device, at the same time (dpkit.grading.weighted). A time alone could be
    # faked: one time.sleep of the slowest device's time, returned, looks right.
    nodeid = request.node.nodeid
    sizes, speeds, per_row = inputs = decided.inputs_here(nodeid)
    with recorded_sleeps(exercise) as records:
        start = time.perf_counter()
        measured = exercise.measure_step_time(sizes, speeds, per_row)
        outside = time.perf_counter() - start
        sleeps = torch.tensor(records, dtype=torch.float64).reshape(-1, 4)
    seconds = torch.tensor([float(measured), outside], dtype=torch.float64)
    sleeps[:, 2:] -= start  # from the call's start
    decided.answer(nodeid, inputs, {"seconds": seconds, "sleeps": sleeps})


def test_straggler_report(exercise, request):
    """weighted chunks beat torch's equal chunks on unequal devices"""
    # The parent chose the inputs and judges the report's chunks and times
    # (dpkit.grading.decided); the asserts below only give the first hints.
    nodeid = request.node.nodeid
    cases = decided.inputs_here(nodeid)
    reports = []
    for batch, speeds, per_row in cases:
        with recorded_sleeps(exercise) as records:
            report = exercise.straggler_report(batch, speeds, per_row)
        if isinstance(report, dict) and "weighted_chunks" in report:
            equal = decided.torch_chunk_sizes_padded(batch, len(speeds))
            want = sum(
                r * per_row / s
                for sizes in (equal, report["weighted_chunks"])
                for r, s in zip(sizes, speeds)
            )
            slept = sum(seconds for _, seconds, _, _ in records)
            assert abs(slept - want) <= 1e-6 * max(want, 1.0), (
                f"straggler_report({batch}, {speeds}, {per_row}) slept {slept:.4f} s in all, its "
                f"two steps take {want:.4f} s of sleep: measure both with measure_step_time, "
                "not with simulated_step_time or a formula"
            )
        missing = {"torch_chunks", "weighted_chunks", "torch_seconds", "weighted_seconds"}
        missing = (missing | {"speedup"}) - set(report)
        assert not missing, f"the report lacks {sorted(missing)}"
        want = decided.torch_chunk_sizes_padded(batch, len(speeds))
        assert list(report["torch_chunks"]) == want, (
            f"straggler_report({batch}, {speeds}, {per_row}) gave torch_chunks "
            f"{report['torch_chunks']}, not {want}: use dpkit.torch_chunk_sizes and pad with 0 "
            f"for the {want.count(0)} idle devices, one size per device"
        )
        reports.append(report)
    decided.answer(nodeid, cases, decided.pack_report(reports))
