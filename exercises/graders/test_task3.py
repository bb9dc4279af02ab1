"""Grader for task 3: parallel_apply, one thread per replica.

Under ``dpkit grade`` every check is decided by the grader's parent process, from what is
sent back for inputs it chose: what apply_replica stores and the outputs' order
(:mod:`dpkit.grading.outputs`), the threads and grad modes the grader's modules saw and the
exceptions' types and messages (:mod:`dpkit.grading.conduct`).
"""

import threading

import pytest
import torch
from torch import nn

from dpkit.grading import conduct, decided, outputs

pytestmark = pytest.mark.task3
EXERCISE = "task3_parallel_apply.py"
FORBIDDEN = (
    "dpkit.parallel_apply.parallel_apply",
    "torch.nn.parallel.parallel_apply.parallel_apply",
)
NOT_AN_INT = -1  # sent for a value that is not an int: the parent accepts no negative value
NOTHING = torch.tensor([])  # sent for a key not stored: the parent's hint names the keys


def as_int(value: object) -> int:
    return value if type(value) is int else NOT_AN_INT


def ones(count: int) -> list[torch.Tensor]:
    """Inputs whose values no check looks at."""
    return [torch.ones(())] * count


class Recorder(nn.Module):
    """Multiplies by ``factor`` and remembers the thread and grad mode it ran under."""

    def __init__(self, factor: float = 1.0, barrier: threading.Barrier | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.tensor(factor))
        self.barrier = barrier

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        self.thread = threading.get_ident()
        self.grad_enabled = torch.is_grad_enabled()
        if self.barrier is not None:  # passes only when every replica runs at the same time
            self.arrival = self.barrier.wait()  # 0 to parties - 1, one each
        return self.weight * x if y is None else self.weight * x + y


class LastToFirst(Recorder):
    """A Recorder that finishes after the replica behind it: replica 0 last.

    It waits for the next replica to start, then for that replica's thread to end (a
    thread per replica ends after apply_replica stores its output), each up to ``WAIT``
    seconds; so outputs in the order the threads finished come out reversed every time.
    """

    WAIT = 1.0

    def __init__(self, factor: float, after: "LastToFirst | None") -> None:
        super().__init__(factor)
        self.after = after
        self.started = threading.Event()

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        self.ran_in = threading.current_thread()
        self.started.set()
        after = self.after
        if after is not None and after.started.wait(self.WAIT):
            if after.ran_in is not self.ran_in:  # its own thread: wait until it ends
                try:
                    after.ran_in.join(self.WAIT)
                except RuntimeError:  # a thread that cannot be joined (not started here)
                    pass
        return super().forward(x, y)


def mode_seen(exercise, lanes, index, outer, given) -> bool | None:  # noqa: ANN001
    """The grad mode a module saw, run by apply_replica told ``given`` under ``outer``."""
    module = Recorder()
    with torch.set_grad_enabled(outer):
        exercise.apply_replica(index, module, torch.ones(()), lanes[index], given, {})
    return getattr(module, "grad_enabled", None)


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
    stored = results.get(first, NOTHING)
    module = Recorder(factors[1])
    exercise.apply_replica(second, module, (x[1], x[-1]), lanes[second], True, results)
    for index, given in ((first, "a tensor input x"), (second, "a tuple input (x, y)")):
        failure = results.get(index)  # the module takes both: a failure is apply_replica's
        error = getattr(failure, "exception", None)
        assert not isinstance(failure, exercise.ReplicaFailure), (
            f"apply_replica stored a ReplicaFailure for {given}, which the module takes "
            f"({type(error).__name__}: {error})"
            + ("; a tuple input holds the positional arguments" if index == second else "")
        )
    listed = {}  # a list input holds the positional arguments too
    exercise.apply_replica(second, Recorder(factors[1]), [x[1], x[-1]], lanes[second], True, listed)
    values = {"keys": keys, "first": stored, "second": results.get(second, NOTHING)}
    third = listed.get(second, NOTHING)
    values["third"] = third if isinstance(third, torch.Tensor) else NOTHING
    decided.answer(nodeid, inputs, values)


def test_apply_replica_catches(exercise, lanes, request):
    """apply_replica stores a ReplicaFailure instead of raising"""
    # The parent chose the replica, the exception type and a fresh message, and judges what
    # is stored (dpkit.grading.conduct).
    nodeid = request.node.nodeid
    index, kind, message = inputs = decided.inputs_here(nodeid)
    error, results = conduct.ERRORS[kind](message), {}
    try:
        exercise.apply_replica(index, Failing(error), torch.ones(()), lanes[index], True, results)
    except conduct.ERRORS[kind]:
        pytest.fail("apply_replica let the exception escape; catch it and store it", pytrace=False)
    failure = results.get(index)
    assert isinstance(failure, exercise.ReplicaFailure), (
        f"results[{index}] should be a ReplicaFailure, got {type(failure).__name__}"
    )
    device = getattr(failure, "device", None)
    fields = [
        as_int(failure.index),
        lanes.index(device) if device in lanes else NOT_AN_INT,
        0 if failure.exception is error else NOT_AN_INT,
    ]
    values = {
        "keys": torch.tensor([as_int(k) for k in results], dtype=torch.int64),
        "failure": torch.tensor(fields, dtype=torch.int64),
        "traceback": conduct.text(str(failure.traceback)),
    }
    decided.answer(nodeid, inputs, values)


def _raised(call) -> BaseException | None:  # noqa: ANN001 - a function of no arguments
    """What ``call`` raised (None: it returned); a stub's NotImplementedError goes through."""
    try:
        call()
    except NotImplementedError:
        raise
    except Exception as error:  # noqa: BLE001 - the parent judges its type and message
        return error
    return None


def test_reraise_names_replica(exercise, lanes, request):
    """reraise keeps the exception type and names the replica and device"""
    nodeid = request.node.nodeid
    index, lane, kind, message, worker = inputs = decided.inputs_here(nodeid)
    try:
        raise conduct.ERRORS[kind](message)
    except Exception as error:  # noqa: BLE001 - the type the parent chose
        failure = exercise.ReplicaFailure(
            index, lanes[lane], error, f"Traceback: the worker's text, {worker}"
        )
    raised = _raised(lambda: exercise.reraise(failure))
    values = {
        "kind": torch.tensor([conduct.kind_of(raised)], dtype=torch.int64),
        "message": conduct.text(str(raised)),
    }
    decided.answer(nodeid, inputs, values)


class NeedsTwo(Exception):
    """An exception type that cannot be built from one message."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"{code}: {detail}")


def test_reraise_falls_back_to_runtime_error(exercise, lanes, request):
    """reraise raises RuntimeError for a type that cannot be built from one message"""
    nodeid = request.node.nodeid
    index, lane, code, detail = inputs = decided.inputs_here(nodeid)
    original = NeedsTwo(code, detail)
    failure = exercise.ReplicaFailure(index, lanes[lane], original, "Traceback: the worker's text")
    raised = _raised(lambda: exercise.reraise(failure))
    cause = 0 if raised is not None and raised.__cause__ is original else NOT_AN_INT
    values = {
        "kind": torch.tensor([conduct.kind_of(raised), cause], dtype=torch.int64),
        "message": conduct.text(str(raised)),
    }
    decided.answer(nodeid, inputs, values)


def test_apply_replica_sets_grad_mode(exercise, lanes, request):
    """apply_replica runs the module under the grad mode it is given"""
    # The parent chose the order of the (caller's mode, mode given) pairs and judges the
    # mode the grader's module saw inside its forward (dpkit.grading.conduct).
    nodeid = request.node.nodeid
    pairs = decided.inputs_here(nodeid)
    # one pair per lane: the four pairs on the four lanes
    seen = [mode_seen(exercise, lanes, i, *pair) for i, pair in enumerate(pairs)]
    decided.answer(nodeid, pairs, {"seen": conduct.flags(seen)})


def test_outputs_in_order(exercise, lanes, request):
    """parallel_apply returns each replica's output, in replica order"""
    nodeid = request.node.nodeid
    factors, length, _, seed = inputs = decided.inputs_here(nodeid)
    x = outputs.replica_tensors(len(factors), length, seed)
    modules = []
    for factor in reversed(factors):  # each made with the one after it: they finish 3, 2, 1, 0
        modules.insert(0, LastToFirst(factor, modules[0] if modules else None))
    got = exercise.parallel_apply(modules, x[: len(factors)], lanes[: len(factors)])
    assert isinstance(got, list), f"return a list, got {type(got).__name__}"
    decided.answer(nodeid, inputs, outputs.listed("out", got))


def test_one_thread_per_replica(exercise, lanes, request):
    """parallel_apply runs every replica at the same time, each in its own thread"""
    # The parent chose how many replicas meet at the barrier; it judges the threads they
    # ran in (as indices: 0 the caller's, then each other thread in the order first seen)
    # and the barrier's arrival numbers (dpkit.grading.conduct).
    nodeid = request.node.nodeid
    (count,) = inputs = decided.inputs_here(nodeid)
    barrier = threading.Barrier(count, timeout=3)
    modules = [Recorder(barrier=barrier) for _ in range(count)]
    try:
        exercise.parallel_apply(modules, ones(count), [lanes[i % len(lanes)] for i in range(count)])
    except threading.BrokenBarrierError:
        pytest.fail(
            "the replicas did not all run at the same time: start every thread before joining any",
            pytrace=False,
        )
    ran = [getattr(module, "thread", None) for module in modules]
    seen = list(dict.fromkeys([threading.get_ident(), *ran]))  # in the order first seen
    values = {
        "threads": torch.tensor(
            [NOT_AN_INT if t is None else seen.index(t) for t in ran], dtype=torch.int64
        ),
        "arrivals": torch.tensor(
            [as_int(getattr(module, "arrival", None)) for module in modules], dtype=torch.int64
        ),
    }
    decided.answer(nodeid, inputs, values)


def test_grad_mode_carried(exercise, lanes, request):
    """parallel_apply carries the caller's grad mode into the threads"""
    nodeid = request.node.nodeid
    count, modes = inputs = decided.inputs_here(nodeid)
    seen, needs = [], []
    for mode in modes:
        modules = [Recorder() for _ in range(count)]
        with torch.set_grad_enabled(mode):
            got = exercise.parallel_apply(modules, ones(count), lanes[:count])
        seen += [getattr(module, "grad_enabled", None) for module in modules]
        needs += [getattr(output, "requires_grad", None) for output in got[:count]]
        needs += [None] * (count - len(got))
    # whether a wrong mode is the value the workers were given or their use of it: the
    # mode apply_replica told False applies (only the hint depends on it)
    probe = mode_seen(exercise, lanes, 0, True, False)
    values = {"seen": conduct.flags(seen), "requires_grad": conduct.flags(needs)}
    decided.answer(nodeid, inputs, {**values, "probe": conduct.flags([probe])})


def test_exception_carried_back(exercise, lanes, request):
    """an exception in a replica is raised in the caller, naming the replica"""
    # The parent chose which replicas fail, with which types and fresh messages; it judges
    # the type and message the caller received (dpkit.grading.conduct).
    nodeid = request.node.nodeid
    runs = decided.inputs_here(nodeid)
    values = {}
    kinds = []
    for number, (count, failures) in enumerate(runs):
        modules = [Recorder() for _ in range(count)]
        for index, kind, message in failures:
            modules[index] = Failing(conduct.ERRORS[kind](message))
        raised = _raised(lambda m=modules, c=count: exercise.parallel_apply(m, ones(c), lanes[:c]))
        kinds.append(conduct.kind_of(raised))
        values[f"message{number}"] = conduct.text(str(raised))
    values["kinds"] = torch.tensor(kinds, dtype=torch.int64)
    decided.answer(nodeid, runs, values)
