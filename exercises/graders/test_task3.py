"""Grader for task 3: parallel_apply, one thread per replica.

Under ``dpkit grade`` the checks of what apply_replica stores and of the outputs' order are
decided by the grader's parent process, from the tensors sent back for factors and inputs
it chose (:mod:`dpkit.grading.outputs`); the others observe threads, grad modes and
exceptions, and stay in the grading process.
"""

import threading

import pytest
import torch
from torch import nn

from dpkit.grading import decided, outputs
from dpkit.grading.checks import must_raise

pytestmark = pytest.mark.task3
EXERCISE = "task3_parallel_apply.py"
FORBIDDEN = (
    "dpkit.parallel_apply.parallel_apply",
    "torch.nn.parallel.parallel_apply.parallel_apply",
)


class Recorder(nn.Module):
    """Multiplies by ``factor`` and remembers the thread and grad mode it ran under."""

    def __init__(self, factor: float, barrier: threading.Barrier | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.tensor(factor))
        self.barrier = barrier

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        self.thread = threading.get_ident()
        self.grad_enabled = torch.is_grad_enabled()
        if self.barrier is not None:
            self.barrier.wait()  # passes only when every replica is running at the same time
        return self.weight * x if y is None else self.weight * x + y


class Failing(nn.Module):
    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise self.error


def test_apply_replica_stores_output(exercise, lanes, request):
    """apply_replica stores the output under the replica's index"""
    # The grader's parent chose the factors, indices and inputs, and judges what is stored
    # (dpkit.grading.outputs).
    nodeid = request.node.nodeid
    factors, length, (first, second), seed = inputs = decided.inputs_here(nodeid)
    x = outputs.replica_tensors(len(factors), length, seed)
    results = {}
    exercise.apply_replica(first, Recorder(factors[0]), x[0], lanes[first], True, results)
    keys = torch.tensor(list(results), dtype=torch.int64)
    assert first in results, f"results should have key {first}, got {list(results)}"
    stored = results[first]
    module = Recorder(factors[1])
    exercise.apply_replica(second, module, (x[1], x[-1]), lanes[second], True, results)
    assert second in results, f"results should have key {second}, got {list(results)}"
    values = {"keys": keys, "first": stored, "second": results[second]}
    decided.answer(nodeid, inputs, values)


def test_apply_replica_catches(exercise, lanes):
    """apply_replica stores a ReplicaFailure instead of raising"""
    results = {}
    try:
        exercise.apply_replica(
            1, Failing(ValueError("boom")), torch.ones(1), lanes[1], True, results
        )
    except ValueError:
        pytest.fail("apply_replica let the exception escape; catch it and store it", pytrace=False)
    failure = results.get(1)
    assert isinstance(failure, exercise.ReplicaFailure), (
        f"results[1] should be a ReplicaFailure, got {type(failure).__name__}"
    )
    assert failure.index == 1 and failure.device == lanes[1], "record the index and the device"
    assert isinstance(failure.exception, ValueError), "keep the original exception"
    assert "boom" in failure.traceback, "store traceback.format_exc() as the traceback text"


def test_reraise_names_replica(exercise, lanes):
    """reraise keeps the exception type and names the replica and device"""
    try:
        raise KeyError("missing")
    except KeyError as error:
        failure = exercise.ReplicaFailure(3, lanes[3], error, "Traceback: the worker's text")
    with must_raise(
        KeyError,
        "reraise(ReplicaFailure(3, lanes[3], KeyError('missing'), ...))",
        "raise a new exception of the original's type, its message naming the replica",
    ) as raised:
        exercise.reraise(failure)
    message = str(raised.value)
    assert f"in replica 3 on device {lanes[3]}" in message, (
        f"the message should say 'in replica 3 on device {lanes[3]}', got {message!r}"
    )
    assert "the worker's text" in message, "include the worker's traceback in the message"


class NeedsTwo(Exception):
    """An exception type that cannot be built from one message."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"{code}: {detail}")


def test_reraise_falls_back_to_runtime_error(exercise, lanes):
    """reraise raises RuntimeError for a type that cannot be built from one message"""
    original = NeedsTwo(7, "bad input")
    failure = exercise.ReplicaFailure(2, lanes[2], original, "Traceback: the worker's text")
    try:
        exercise.reraise(failure)
    except NotImplementedError:  # a RuntimeError too: the stub's TODO, not a fallback
        raise
    except RuntimeError as error:
        assert f"in replica 2 on device {lanes[2]}" in str(error), (
            f"the RuntimeError should say 'in replica 2 on device {lanes[2]}', got {error}"
        )
        assert error.__cause__ is original, (
            "raise the RuntimeError from the original exception (raise ... from ...), so its "
            "traceback is kept"
        )
        return
    except Exception as error:  # noqa: BLE001 - what the student's reraise raised instead
        pytest.fail(
            f"reraise raised {type(error).__name__} ({error}) for an exception whose type "
            "needs two arguments, losing the replica and the original error: when "
            "type(exception)(message) fails, raise RuntimeError(message) from the original",
            pytrace=False,
        )
    pytest.fail("reraise returned instead of raising", pytrace=False)


def test_apply_replica_sets_grad_mode(exercise, lanes):
    """apply_replica runs the module under the grad mode it is given"""
    module, results = Recorder(1.0), {}
    with torch.enable_grad():
        exercise.apply_replica(0, module, torch.ones(1), lanes[0], False, results)
    assert module.grad_enabled is False, (
        "apply_replica(..., grad_enabled=False, ...) ran the module with grad enabled: call "
        "torch.set_grad_enabled(grad_enabled) in the worker before running the module"
    )


def test_outputs_in_order(exercise, lanes, request):
    """parallel_apply returns each replica's output, in replica order"""
    nodeid = request.node.nodeid
    factors, length, _, seed = inputs = decided.inputs_here(nodeid)
    x = outputs.replica_tensors(len(factors), length, seed)
    modules = [Recorder(factor) for factor in factors]
    got = exercise.parallel_apply(modules, x[: len(factors)], lanes[: len(factors)])
    assert isinstance(got, list), f"return a list, got {type(got).__name__}"
    decided.answer(nodeid, inputs, outputs.listed("out", got))


def test_one_thread_per_replica(exercise, lanes):
    """parallel_apply runs every replica at the same time, each in its own thread"""
    barrier = threading.Barrier(4, timeout=3)
    modules = [Recorder(1.0, barrier) for _ in range(4)]
    try:
        exercise.parallel_apply(modules, [torch.ones(1)] * 4, lanes)
    except threading.BrokenBarrierError:
        pytest.fail(
            "the replicas did not all run at the same time: start every thread before joining any",
            pytrace=False,
        )
    threads = {module.thread for module in modules}
    assert len(threads) == 4, f"4 replicas ran in {len(threads)} thread(s); use one each"


def test_grad_mode_carried(exercise, lanes):
    """parallel_apply carries the caller's grad mode into the threads"""
    modules = [Recorder(1.0) for _ in range(3)]
    with torch.no_grad():
        outputs = exercise.parallel_apply(modules, [torch.ones(1)] * 3, lanes[:3])
    if any(module.grad_enabled for module in modules):
        probe, results = Recorder(1.0), {}
        exercise.apply_replica(0, probe, torch.ones(1), lanes[0], False, results)
        missing = (  # the value never reached the workers, or they did not apply it
            "pass torch.is_grad_enabled() to the workers"
            if probe.grad_enabled is False
            else "each worker must apply the caller's mode with "
            "torch.set_grad_enabled(grad_enabled) before running its replica"
        )
        pytest.fail(
            "replicas ran with grad enabled under torch.no_grad(): grad mode is thread-local; "
            + missing,
            pytrace=False,
        )
    assert not any(output.requires_grad for output in outputs)
    outputs = exercise.parallel_apply(modules, [torch.ones(1)] * 3, lanes[:3])
    assert all(output.requires_grad for output in outputs), "with grad on, outputs need grad"


def test_exception_carried_back(exercise, lanes):
    """an exception in a replica is raised in the caller, naming the replica"""
    modules = [Recorder(1.0), Failing(ValueError("bad shape")), Recorder(1.0), Recorder(1.0)]
    with must_raise(
        ValueError,
        "parallel_apply on 4 replicas where replica 1 raises ValueError('bad shape')",
        "after joining the threads, re-raise the first failure with reraise",
    ) as raised:
        exercise.parallel_apply(modules, [torch.ones(1)] * 4, lanes)
    message = str(raised.value)
    assert "in replica 1" in message and "bad shape" in message, (
        f"the error should name replica 1 and keep the original message, got {message!r}"
    )
    modules = [Recorder(1.0), Failing(TypeError("late")), Failing(KeyError("early?"))]
    with must_raise(
        TypeError,
        "parallel_apply where replica 1 raises TypeError and replica 2 KeyError",
        "re-raise the failure of the lowest replica index, whichever finished first",
    ) as raised:
        exercise.parallel_apply(modules, [torch.ones(1)] * 3, lanes[:3])
    assert "in replica 1" in str(raised.value), (
        f"the TypeError should name replica 1, got {str(raised.value)!r}"
    )
