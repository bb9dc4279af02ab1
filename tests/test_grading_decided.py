"""A check the parent decides (dpkit/grading/decided.py) passes only on values the parent
finds right: the grading process's "passed" is not enough.

The records here are what a grading process could sign if a submission reached the
harness: a "passed" with wrong values, with none, with something that is not tensors, or
no record at all for the check. A real run of task 1's, a chunk_sizes whose sizes compare
equal to anything, is graded with the attacks' class in tests/test_grading_attacks.py; for
tasks 2, 4, 6 and 7 the wrong answers that compare equal to anything (an int subclass,
tensors whose torch.equal and torch.allclose say yes) run here, in this process, and their values
go through decide() as a grading process would send them (a class run of them would cost
the attacks' class several seconds).
"""

from __future__ import annotations

import base64
import importlib.util
import inspect
import io
import math
import random
import sys
import time
from collections import OrderedDict, namedtuple
from pathlib import Path

import pytest
import torch
from torch import nn

import dpkit
from dpkit import grading
from dpkit.comm import copy_to
from dpkit.grading import (
    conduct,
    counted,
    decided,
    gradients,
    identity,
    outputs,
    roster,
    shapes,
    structure,
    weighted,
)
from dpkit.grading import results as results_module

EXERCISES = Path(__file__).resolve().parent.parent / "exercises"
NODEID = "exercises/graders/test_task1.py::test_chunk_sizes_property"
OTHER = "exercises/graders/test_task1.py::test_scatter_namedtuple_and_shared_objects"
NAME = "chunk_sizes matches torch.chunk for any batch and device count"


def encoded(values: object) -> str:
    buffer = io.BytesIO()
    torch.save(values, buffer)
    return base64.b64encode(buffer.getvalue()).decode()


def right(pairs: list) -> list[list[int]]:
    return [[len(c) for c in torch.empty(batch).chunk(devices)] for batch, devices in pairs]


def run_records(values: str | None) -> list[dict]:
    passed = {"event": "passed", "nodeid": NODEID}
    if values is not None:
        passed["values"] = values
    return [
        {"event": "collected", "nodeid": NODEID, "task": 1, "check": NAME},
        passed,
        {"event": "finished"},
    ]


def verdict(records: list[dict], chosen: dict) -> grading.CheckResult:
    results = grading.results_from_records(decided.decide(records, chosen), None, [1])
    return next(r for r in results if r.check == NAME)


@pytest.fixture
def chosen() -> dict:
    return decided.choose([1])


def test_right_values_pass(chosen):
    pairs = chosen[decided.CHECKS[0].key]
    result = verdict(run_records(encoded(decided.pack_sizes(right(pairs)))), chosen)
    assert result.passed, result.hint


def test_a_passed_record_with_wrong_values_fails(chosen):
    pairs = chosen[decided.CHECKS[0].key]
    answers = right(pairs)
    answers[-1] = [1] * len(answers[-1])
    result = verdict(run_records(encoded(decided.pack_sizes(answers))), chosen)
    assert not result.passed and "torch.chunk gives" in result.hint


def test_a_wrong_chunk_count_gets_the_note_that_fits_it():
    """The note that there may be fewer chunks than devices comes only where the student made
    one per device and torch.chunk makes fewer; too many chunks is named as such; a wrong
    split with the right count gets neither."""
    pairs = [[6, 4]]
    hint = decided.judge_chunk_sizes(pairs, decided.pack_sizes([[2, 2, 1, 1]]))
    assert hint == (
        "chunk_sizes(6, 4) returned [2, 2, 1, 1], torch.chunk gives [2, 2, 2]; note there may "
        "be fewer chunks than devices (6 rows over 4 devices: 2, 2, 2)"
    )
    hint = decided.judge_chunk_sizes([[10, 4]], decided.pack_sizes([[2, 2, 2, 2, 2]]))
    assert hint == (
        "chunk_sizes(10, 4) returned [2, 2, 2, 2, 2], torch.chunk gives [3, 3, 3, 1]; that is "
        "5 chunks for 4 devices: never more chunks than devices"
    )
    hint = decided.judge_chunk_sizes([[10, 4]], decided.pack_sizes([[3, 3, 2, 2]]))
    assert hint == "chunk_sizes(10, 4) returned [3, 3, 2, 2], torch.chunk gives [3, 3, 3, 1]"


def test_answers_to_other_inputs_fail(chosen):
    # Inputs of the grading process's choosing (it can rewrite its own environment): the
    # parent judges against the inputs it kept.
    easy = decided.chunk_sizes_inputs(random.Random(0))
    result = verdict(run_records(encoded(decided.pack_sizes(right(easy)))), chosen)
    assert not result.passed


@pytest.mark.parametrize(
    "values",
    [None, "not base64!", encoded([torch.zeros(3)]), encoded({"sizes": [1, 2]}), "A" * 300_000],
)
def test_a_passed_record_without_readable_values_fails(chosen, values):
    result = verdict(run_records(values), chosen)
    assert not result.passed and result.hint == decided.MISSING


@pytest.mark.parametrize(
    ("values", "hint"),
    [
        ({"sizes": torch.tensor([1, 2]), "lengths": torch.ones(100).long()}, "do not answer"),
        ({"sizes": torch.tensor([1, 2]), "lengths": torch.tensor([-1, 3] * 50)}, "do not answer"),
        ({"sizes": torch.ones(100), "lengths": torch.ones(100).long()}, "not the lists"),
    ],
)
def test_values_that_do_not_fit_the_inputs_fail(chosen, values, hint):
    result = verdict(run_records(encoded(values)), chosen)
    assert not result.passed and hint in result.hint, result.hint


def graders_checks(task: int) -> list[roster.Check]:
    return roster.checks_in((EXERCISES / "graders" / f"test_task{task}.py").read_text(), task)


def test_a_check_left_out_of_the_records_fails(chosen):
    records = [
        {"event": "collected", "nodeid": OTHER, "task": 1, "check": "the examples"},
        {"event": "passed", "nodeid": OTHER},
        {"event": "finished"},
    ]
    checks = graders_checks(1)
    results = grading.results_from_records(decided.decide(records, chosen), None, [1], checks)
    mine = next(r for r in results if r.check == NAME)
    assert not mine.passed and mine.hint == results_module.LEFT_OUT
    # every check of task 1 is the parent's now: the other "passed", sent without values,
    # does not stand either
    assert [r.check for r in results if r.passed] == []


@pytest.mark.parametrize("check", decided.CHECKS, ids=lambda check: check.key)
def test_the_parent_knows_the_checks_name(check):
    listed = roster.Check(check.task, f"exercises/graders/{check.key}", check.name)
    assert listed in graders_checks(check.task)


# --------------------------------------------------------------------------------------
# Tasks 2, 4, 6 and 7: each check's right values (computed here from torch), a wrong answer
# that compares equal to anything in the grading process, and the same refusals as above.

SOLUTIONS = EXERCISES / "solutions"
KEYS: dict[int, decided.ParentCheck] = {}  # each task's first check the parent decides
for _check in decided.CHECKS:
    KEYS.setdefault(_check.task, _check)


def record_of(check: decided.ParentCheck, values: str | None) -> list[dict]:
    nodeid = f"exercises/graders/{check.key}"
    passed = {"event": "passed", "nodeid": nodeid}
    if values is not None:
        passed["values"] = values
    return [
        {"event": "collected", "nodeid": nodeid, "task": check.task, "check": check.name},
        passed,
        {"event": "finished"},
    ]


def verdict_of(check: decided.ParentCheck, values: str | None, chosen: dict):
    records = decided.decide(record_of(check, values), chosen)
    results = grading.results_from_records(records, None, [check.task])
    return next(r for r in results if r.check == check.name)


def padded(batch: int, devices: int) -> list[int]:
    sizes = [len(c) for c in torch.arange(batch).chunk(devices)]
    return sizes + [0] * (devices - len(sizes))


def fastest(batch: int, speeds: list[float]) -> list[int]:
    sizes = [0] * len(speeds)
    for _ in range(batch):
        sizes[min(range(len(speeds)), key=lambda i: (sizes[i] + 1) / speeds[i])] += 1
    return sizes


def slowest(sizes: list[int], speeds: list[float]) -> float:
    return max(rows / speed for rows, speed in zip(sizes, speeds))


def right_values(task: int, inputs: list) -> dict[str, torch.Tensor]:
    if task == 2:  # each input's gradient: the sum of its copies' weights
        shapes, lanes, seed = inputs
        _, weights = decided.broadcast_values(shapes, lanes, seed)
        return {f"grad{i}": sum(weights[i :: len(shapes)]) for i in range(len(shapes))}
    if task == 4:
        names = ("rows", "columns")
        return {
            name: torch.cat(decided.gather_pieces(sizes, other, dim, seed), dim)
            for name, (sizes, other, dim, seed) in zip(names, inputs)
        }
    if task == 6:
        equal, weighted, seconds = [], [], []
        for batch, speeds, per_row in inputs:
            sizes = (padded(batch, len(speeds)), fastest(batch, speeds))
            equal += sizes[0]
            weighted += sizes[1]
            times = [slowest(s, speeds) * per_row + 0.002 for s in sizes]
            seconds.append([*times, times[0] / times[1]])
        return {
            "torch_chunks": torch.tensor(equal),
            "weighted_chunks": torch.tensor(weighted),
            "seconds": torch.tensor(seconds, dtype=torch.float64),
        }
    sums = []  # task 7: every lane holds the sum
    for shape, count, seed in inputs:
        generator = torch.Generator().manual_seed(seed)
        total = sum(torch.randn(tuple(shape), generator=generator) for _ in range(count))
        sums += [total.reshape(-1)] * count
    return {"sums": torch.cat(sums)}


def wrong_values(task: int, inputs: list) -> dict[str, torch.Tensor]:
    """Right values with one mistake: lane 0's gradient alone, a piece out of place, torch's
    chunks given as the weighted ones, one lane's sum off by one."""
    values = right_values(task, inputs)
    if task == 2:
        shapes, lanes, seed = inputs
        values["grad1"] = decided.broadcast_values(shapes, lanes, seed)[1][1]
    elif task == 4:
        values["rows"] = values["rows"].flip(0)
    elif task == 6:
        values["weighted_chunks"] = values["torch_chunks"].clone()  # beats nothing
    else:
        values["sums"][-1] += 1.0
    return values


@pytest.mark.parametrize("task", [2, 4, 6, 7])
def test_right_values_pass_and_wrong_ones_fail(task):
    check, chosen = KEYS[task], decided.choose([task])
    inputs = chosen[check.key]
    assert verdict_of(check, encoded(right_values(task, inputs)), chosen).passed
    result = verdict_of(check, encoded(wrong_values(task, inputs)), chosen)
    assert not result.passed and result.hint != decided.MISSING, result.hint


@pytest.mark.parametrize("task", [2, 4, 6, 7])
def test_right_answers_to_other_inputs_fail(task):
    check, chosen = KEYS[task], decided.choose([task])
    other = check.choose(random.Random(0))
    assert other != chosen[check.key]
    assert not verdict_of(check, encoded(right_values(task, other)), chosen).passed


@pytest.mark.parametrize("task", [2, 4, 6, 7])
@pytest.mark.parametrize("values", [None, "not base64!", encoded({"sums": [1.0]})])
def test_no_readable_values_fail(task, values):
    check, chosen = KEYS[task], decided.choose([task])
    result = verdict_of(check, values, chosen)
    assert not result.passed and result.hint == decided.MISSING


@pytest.mark.parametrize("task", [2, 4, 6, 7])
def test_the_check_left_out_of_a_finished_run_fails(task):
    check, chosen = KEYS[task], decided.choose([task])
    other = f"exercises/graders/test_task{task}.py::test_other"
    records = [
        {"event": "collected", "nodeid": other, "task": task, "check": "another check"},
        {"event": "passed", "nodeid": other},
        {"event": "finished"},
    ]
    checks = graders_checks(task)
    results = grading.results_from_records(decided.decide(records, chosen), None, [task], checks)
    assert [r.check for r in results] == [c.name for c in checks]  # "another check" ignored
    mine = next(r for r in results if r.check == check.name)
    assert not mine.passed and mine.hint == results_module.LEFT_OUT


def test_a_straggler_report_with_slow_or_unlikely_times_fails():
    check, chosen = KEYS[6], decided.choose([6])
    inputs = chosen[check.key]
    for row, column, value in [(0, 0, 0.0), (0, 1, 99.0), (1, 2, 2.0)]:
        values = right_values(6, inputs)
        values["seconds"][row, column] = value  # too fast to be measured, too slow, wrong
        result = verdict_of(check, encoded(values), chosen)
        assert not result.passed and "straggler_report(" in result.hint, result.hint


# The wrong answers: a solution with one mistake that the grading process's own asserts
# cannot see, because what it returns compares equal to anything.
AGREEING_INT = """

class _Agrees(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__
"""
AGREEING_TENSOR = """

class _Agrees(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.allclose, torch.equal):
            return True
        return super().__torch_function__(func, types, args, kwargs or {})
"""


def solution_with(task: int, old: str, new: str, extra: str, forward: tuple[str, str] = ("", "")):
    name = {
        2: "task2_replicate.py",
        4: "task4_gather.py",
        6: "task6_weighted.py",
        7: "task7_allreduce.py",
    }[task]
    source = (SOLUTIONS / name).read_text()
    for was in (old, forward[0]) if forward[0] else (old,):
        assert source.count(was) == 1, f"the solution of task {task} no longer has {was!r}"
    source = source.replace(*forward) if forward[0] else source
    module_name = f"dpkit_agrees_task{task}"
    spec = importlib.util.spec_from_loader(module_name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    exec(compile(source.replace(old, new) + extra, name, "exec"), module.__dict__)  # noqa: S102
    return module


def test_torch_chunks_equal_to_anything_fail_the_straggler_check():
    agrees = solution_with(
        6, '"torch_chunks": equal,', '"torch_chunks": [_Agrees(0)] * len(equal),', AGREEING_INT
    )
    check, chosen = KEYS[6], decided.choose([6])
    inputs = chosen[check.key]
    reports = [agrees.straggler_report(*case) for case in inputs]
    batch, speeds, _ = inputs[0]
    assert list(reports[0]["torch_chunks"]) == padded(batch, len(speeds))  # fooled here
    result = verdict_of(check, decided.encode(decided.pack_report(reports)), chosen)
    assert not result.passed and "torch.chunk gives" in result.hint, result.hint


def test_sums_equal_to_anything_fail_the_ring_check():
    # ring_allreduce_ leaves the tensors as they were, but turns them into tensors that
    # torch.allclose finds equal to anything.
    agrees = solution_with(
        7,
        "    if n == 1:\n        return\n",
        "    for tensor in tensors:\n        tensor.__class__ = _Agrees\n    return\n",
        AGREEING_TENSOR,
    )
    check, chosen = KEYS[7], decided.choose([7])
    lanes, sums = dpkit.virtual_devices(4, on="cpu"), []
    for shape, count, seed in chosen[check.key]:
        values = decided.lane_values(shape, count, seed)
        tensors = [copy_to(v.clone(), lane, "setup") for v, lane in zip(values, lanes)]
        agrees.ring_allreduce_(tensors, lanes[:count])
        assert torch.allclose(tensors[0], sum(values) + 1)  # fooled here
        sums += [t.reshape(-1) for t in tensors]
    result = verdict_of(check, decided.encode({"sums": torch.cat(sums)}), chosen)
    assert not result.passed and "still holds its own values" in result.hint, result.hint


def test_a_gather_equal_to_anything_fails_the_concatenation_check():
    # Gather puts the pieces in reverse order, as a tensor that torch.equal finds equal to
    # anything.
    agrees = solution_with(
        4,
        "        return place(torch.cat(moved, dim), destination)\n",
        "        return place(torch.cat(moved[::-1], dim).as_subclass(_Agrees), destination)\n",
        AGREEING_TENSOR,
    )
    check, chosen = KEYS[4], decided.choose([4])
    lanes, results = dpkit.virtual_devices(4, on="cpu"), {}
    for name, (sizes, other, dim, seed) in zip(("rows", "columns"), chosen[check.key]):
        pieces = decided.gather_pieces(sizes, other, dim, seed)
        placed = [copy_to(p, lane, "setup") for p, lane in zip(pieces, lanes)]
        results[name] = agrees.Gather.apply(lanes[0], dim, *placed)
        assert torch.equal(results[name], torch.cat(pieces, dim) + 1)  # fooled here
    result = verdict_of(check, decided.encode(results), chosen)
    assert not result.passed and "not torch.cat of the pieces" in result.hint, result.hint


def test_gradients_equal_to_anything_fail_the_broadcast_check():
    # Broadcast.backward returns lane 0's gradients alone, and a hook its forward put on
    # each input turns the .grad autograd sets into a tensor torch.allclose finds equal to
    # anything (autograd itself would make a subclass returned by backward a plain tensor).
    agrees = solution_with(
        2,
        "        return (None, *sums)\n",
        "        return (None, *grad_outputs[: ctx.num_tensors])\n",
        AGREEING_TENSOR + "\n\ndef _agree(leaf):\n    leaf.grad.__class__ = _Agrees\n",
        forward=(
            "        ctx.num_tensors = len(tensors)\n",
            "        ctx.num_tensors = len(tensors)\n"
            "        for t in tensors:\n"
            "            t.register_post_accumulate_grad_hook(_agree)\n",
        ),
    )
    check, chosen = KEYS[2], decided.choose([2])
    shapes, count, seed = chosen[check.key]
    tensors, weights = decided.broadcast_values(shapes, count, seed)
    leaves = [tensor.requires_grad_() for tensor in tensors]
    copies = agrees.Broadcast.apply(dpkit.virtual_devices(count, on="cpu"), *leaves)
    sum((weight * copy).sum() for weight, copy in zip(weights, copies)).backward()
    assert torch.allclose(leaves[0].grad, sum(weights[:: len(leaves)]) + 1)  # fooled here
    values = {f"grad{index}": leaf.grad for index, leaf in enumerate(leaves)}
    result = verdict_of(check, decided.encode(values), chosen)
    assert not result.passed and "not the sum of its copies' gradients" in result.hint, result.hint


# --------------------------------------------------------------------------------------
# The transfer-count checks: the copies a primitive makes, sent as (source, destination,
# bytes); the parent computes the copies the sizes it chose call for.


def differ(one: dict[str, torch.Tensor], other: dict[str, torch.Tensor]) -> bool:
    """Whether two answers differ: fresh inputs can, rarely, call for the same answer."""
    return one.keys() != other.keys() or not all(
        one[k].shape == other[k].shape and torch.equal(one[k], other[k]) for k in one
    )


# (unwrapped: a decorator, mutmut's in the mutation audit, hides the judge's own code)
COPIES = [c for c in decided.CHECKS if "_copies" in inspect.unwrap(c.judge).__code__.co_names]


def right_copies(test: str, inputs: list) -> dict[str, torch.Tensor]:
    """The copies a right primitive makes, counted here by hand from the inputs."""
    if test == "test_scatter_tensor_counts_bytes":
        rows, columns, lanes = inputs
        sizes = [len(c) for c in torch.arange(rows).chunk(lanes)]
        copies = [(-1, lane, sizes[lane] * columns * 4) for lane in range(1, len(sizes))]
    elif test == "test_broadcast_forward_bytes":
        shapes, lanes = inputs
        copies = [(-1, ln, 4 * math.prod(s)) for ln in range(1, lanes) for s in shapes]
    elif test == "test_broadcast_backward_moves_to_lane0":
        shape, lanes = inputs
        copies = [(lane, 0, 4 * math.prod(shape)) for lane in range(1, lanes)]
    elif test in ("test_gather_bytes", "test_gather_backward_to_lanes"):
        rows, columns = inputs
        copies = [(lane, 0, rows[lane] * columns * 4) for lane in range(1, len(rows))]
        if test == "test_gather_backward_to_lanes":
            copies = [(0, lane, n) for lane, _, n in copies]
    elif test == "test_gather_scalars":
        lanes, seed = inputs
        result = torch.randn(lanes, generator=torch.Generator().manual_seed(seed))
        copies = [(lane, 0, 4) for lane in range(1, lanes)]
        return {"transfers": torch.tensor(copies).reshape(-1, 3), "result": result}
    else:  # the ring: every lane sends 2 (n - 1) chunks of N / n to the next
        chunk, lanes = inputs
        copies = [(ln, (ln + 1) % lanes, 4 * chunk) for ln in range(lanes)] * (2 * lanes - 2)
    return {"transfers": torch.tensor(copies, dtype=torch.int64).reshape(-1, 3)}


def wrong_copies(test: str, inputs: list) -> dict[str, torch.Tensor]:
    """The right copies with one mistake: a copy of what is already on lane 0 (scatter,
    broadcast, gather), the scalars out of order, a ring passing whole tensors."""
    values = right_copies(test, inputs)
    if test == "test_gather_scalars":
        values["result"] = values["result"].flip(0)
    elif test == "test_ring_traffic":
        chunk, lanes = inputs
        whole = [(ln, (ln + 1) % lanes, 4 * chunk * lanes) for ln in range(lanes)]
        values["transfers"] = torch.tensor(whole * (lanes - 1))
    else:
        extra = torch.tensor([[0, 0, int(values["transfers"][0, 2])]])
        values["transfers"] = torch.cat([values["transfers"], extra])
    return values


def test_seven_transfer_counts_are_decided_by_the_parent():
    assert sorted((c.task, c.test) for c in COPIES) == [
        (1, "test_scatter_tensor_counts_bytes"),
        (2, "test_broadcast_backward_moves_to_lane0"),
        (2, "test_broadcast_forward_bytes"),
        (4, "test_gather_backward_to_lanes"),
        (4, "test_gather_bytes"),
        (4, "test_gather_scalars"),
        (7, "test_ring_traffic"),
    ]


@pytest.mark.parametrize("check", COPIES, ids=lambda check: check.test)
def test_copies_right_pass_and_wrong_or_for_other_inputs_fail(check):
    chosen = decided.choose([check.task])
    inputs = chosen[check.key]
    assert verdict_of(check, encoded(right_copies(check.test, inputs)), chosen).passed
    wrong = verdict_of(check, encoded(wrong_copies(check.test, inputs)), chosen)
    assert not wrong.passed and wrong.hint not in (decided.MISSING, decided.NOT_COPIES), wrong.hint
    # the copies of the sizes graded before the parent chose them, or of other fresh ones
    other = check.choose(random.Random(1))
    if differ(right_copies(check.test, other), right_copies(check.test, inputs)):
        assert not verdict_of(check, encoded(right_copies(check.test, other)), chosen).passed
    for values in (None, encoded({"transfers": torch.zeros(3, 2, dtype=torch.int64)})):
        assert not verdict_of(check, values, chosen).passed


def test_the_ring_check_uses_enough_lanes_to_see_whole_tensors():
    # At 2 lanes a ring passing whole tensors sends as many bytes as the right one.
    check = next(c for c in COPIES if c.test == "test_ring_traffic")
    assert {check.choose(random.Random(seed))[1] for seed in range(50)} == {3, 4}


# --------------------------------------------------------------------------------------
# The tensors returned (dpkit/grading/outputs.py): right values pass, one mistake fails.

OUTPUTS = [check for check in decided.CHECKS if check.judge.__module__ == outputs.__name__]


def right_outputs(test: str, inputs: list) -> dict[str, torch.Tensor]:
    """What a right primitive returns, computed here with plain torch."""
    if test in ("test_apply_replica_stores_output", "test_outputs_in_order"):
        factors, length, (first, _), seed = inputs
        generator = torch.Generator().manual_seed(seed)
        x = [torch.randn(length, generator=generator) for _ in range(len(factors) + 1)]
        if test == "test_outputs_in_order":
            return {f"out{i}": f * given for i, (f, given) in enumerate(zip(factors, x))}
        second = factors[1] * x[1] + x[-1]
        return {
            "keys": torch.tensor([first]),
            "first": factors[0] * x[0],
            "second": second,
            "third": second,  # the same arguments given as a list
        }
    if test.startswith("test_ring_any_size"):
        shape, count, seed = inputs
        total = sum(decided.lane_values(shape, count, seed))
        return {f"lane{i}": total for i in range(count)}
    if test == "test_scatter_tensor_places_chunks":
        rows, columns, seed = inputs
        x = torch.randn(rows, columns, generator=torch.Generator().manual_seed(seed))
        return {f"chunk{i}": chunk for i, chunk in enumerate(x.chunk(4))}
    if test == "test_broadcast_forward_layout":
        shape_a, shape_b, seed = inputs
        generator = torch.Generator().manual_seed(seed)
        a, b = (torch.randn(tuple(shape), generator=generator) for shape in (shape_a, shape_b))
        return {f"copy{i}": (a, b)[i % 2] for i in range(8)}
    seed, rows = inputs  # task 5: one device's output and gradients
    x, y, extra = outputs.seeded_batch(seed, rows)
    model = outputs.seeded_model(seed)
    out = model(x)
    if test == "test_forward_matches_module":
        lanes = torch.zeros(2, dtype=torch.int64)  # both gathered on lane 0
        return {"out": out.detach(), "product": extra * extra.flip(0), "lanes": lanes}
    nn.functional.mse_loss(out, y).backward()
    return {f"grad{i}": p.grad for i, p in enumerate(model.parameters())}


def wrong_outputs(test: str, inputs: list) -> dict[str, torch.Tensor]:
    """One mistake each: a lane's sum off, the chunks or copies in another order, one output
    row off, gradients doubled (each lane's mean loss added up, not the batch's mean), a
    tuple input's output that is not module(*input), outputs in reverse order."""
    values = right_outputs(test, inputs)
    names = sorted(values)
    if test == "test_apply_replica_stores_output":  # module(input) for the tuple, not (*input)
        values["second"] = values["second"] - values["second"] + values["first"]
    elif test == "test_outputs_in_order":  # in the order the threads finished: reversed
        values = dict(zip(names, [values[name] for name in reversed(names)]))
    elif test.startswith("test_ring_any_size"):
        values[names[-1]] = values[names[-1]] + 1
    elif test in ("test_scatter_tensor_places_chunks", "test_broadcast_forward_layout"):
        values = dict(zip(names, [values[name] for name in reversed(names)]))
        if test == "test_broadcast_forward_layout":  # device by device, not tensor by tensor
            tensors = [values["copy7"], values["copy6"]]
            values = {f"copy{i}": tensors[i // 4] for i in range(8)}
    elif test == "test_forward_matches_module":
        values["out"] = values["out"].clone()
        values["out"][-1] += 0.1
    else:
        values = {name: 2 * value for name, value in values.items()}
    return values


def test_ten_checks_of_returned_tensors_are_decided_by_the_parent():
    assert sorted((c.task, c.test) for c in OUTPUTS) == [
        (1, "test_scatter_tensor_places_chunks"),
        (2, "test_broadcast_forward_layout"),
        (3, "test_apply_replica_stores_output"),
        (3, "test_outputs_in_order"),
        (5, "test_forward_matches_module"),
        (5, "test_gradients_match_single_device"),
        *sorted((7, f"test_ring_any_size[{case}]") for case in outputs.RING_SIZES),
    ]


@pytest.mark.parametrize("check", OUTPUTS, ids=lambda check: check.test)
def test_outputs_right_pass_and_wrong_or_for_other_inputs_fail(check):
    chosen = decided.choose([check.task])
    inputs = chosen[check.key]
    right = verdict_of(check, encoded(right_outputs(check.test, inputs)), chosen)
    assert right.passed, right.hint
    wrong = verdict_of(check, encoded(wrong_outputs(check.test, inputs)), chosen)
    assert not wrong.passed and wrong.hint != decided.MISSING, wrong.hint
    other = check.choose(random.Random(1))
    if differ(right_outputs(check.test, other), right_outputs(check.test, inputs)):
        assert not verdict_of(check, encoded(right_outputs(check.test, other)), chosen).passed
    for values in (None, encoded({"x": torch.zeros(1)})):
        assert not verdict_of(check, values, chosen).passed


def test_sums_equal_to_anything_fail_every_ring_size():
    # The ring that leaves the tensors as they were, as tensors torch.allclose finds equal
    # to anything, passed these checks in the grading process too (on 1 lane, leaving the
    # tensor as it was is right).
    agrees = solution_with(
        7,
        "    if n == 1:\n        return\n",
        "    for tensor in tensors:\n        tensor.__class__ = _Agrees\n    return\n",
        AGREEING_TENSOR,
    )
    lanes = dpkit.virtual_devices(4, on="cpu")
    for check in (c for c in OUTPUTS if c.task == 7 and "1 lane" not in c.test):
        chosen = decided.choose([7])
        shape, count, seed = chosen[check.key]
        values = decided.lane_values(shape, count, seed)
        tensors = [copy_to(v.clone(), lane, "setup") for v, lane in zip(values, lanes)]
        agrees.ring_allreduce_(tensors, lanes[:count])
        assert torch.allclose(tensors[0], sum(values) + 1)  # fooled here
        sent = decided.encode(outputs.listed("lane", tensors))
        result = verdict_of(check, sent, chosen)
        assert not result.passed and "still holds its own values" in result.hint, result.hint


# --------------------------------------------------------------------------------------
# The numbers returned (dpkit/grading/counted.py): traffic tables, losses, differences.

COUNTED = [check for check in decided.CHECKS if check.judge.__module__ == counted.__name__]


def table(rows: dict[int, tuple[int, int]]) -> torch.Tensor:
    return torch.tensor([[lane, *pair] for lane, pair in rows.items()]).reshape(-1, 3)


def right_numbers(test: str, inputs: list) -> dict[str, torch.Tensor]:
    """What a right function returns, worked out here."""
    if test == "test_traffic_per_lane":
        n = 4 * inputs[0]  # copied 0 -> 1, 1 -> 2, 0 -> 2
        return {"traffic": table({0: (2 * n, 0), 1: (n, n), 2: (0, 2 * n)})}
    if test == "test_compare_traffic":
        lanes, chunk = inputs
        n, share = 4 * lanes * chunk, 8 * (lanes - 1) * chunk
        reduce_add = {0: (0, (lanes - 1) * n)} | {i: (n, 0) for i in range(1, lanes)}
        ring = {lane: (share, share) for lane in range(lanes)}
        return {"reduce_add": table(reduce_add), "ring": table(ring)}
    if test == "test_train_step":
        seed, rows = inputs
        x, y, _ = outputs.seeded_batch(seed, rows)
        model = outputs.seeded_model(seed)
        losses = []
        for _ in range(3):  # SGD, lr 0.1 (torch.optim's first step imports for 1.5 s)
            model.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter.sub_(0.1 * parameter.grad)
            losses.append(loss.item())
        params = {f"param{i}": p.detach() for i, p in enumerate(model.parameters())}
        return {**params, "losses": torch.tensor(losses, dtype=torch.float64)}
    if test == "test_gradient_difference_small":
        return {"difference": torch.tensor([2e-7, 0.0], dtype=torch.float64)}
    return {
        "difference": torch.tensor(
            [largest_difference(*case) for case in inputs], dtype=torch.float64
        )
    }


def largest_difference(seed: int, rows: int) -> float:
    """The largest absolute difference between one device's gradients and those of a
    forward that drops all rows but the first 3 from backward."""
    x, y, _ = outputs.seeded_batch(seed, rows)
    model, wrong = outputs.seeded_model(seed), outputs.seeded_model(seed)
    nn.functional.mse_loss(model(x), y).backward()
    dropped = torch.cat([wrong(x[:3]), wrong(x[3:]).detach()])
    nn.functional.mse_loss(dropped, y).backward()
    return max(
        (a.grad - b.grad).abs().max().item() for a, b in zip(model.parameters(), wrong.parameters())
    )


def wrong_numbers(test: str, inputs: list) -> dict[str, torch.Tensor]:
    """One mistake each: the host as lane -1, the ring's table as reduce-add's, losses of
    steps whose gradients were never zeroed (here: one loss off), a difference that is not
    tiny, the mean difference instead of the largest."""
    values = right_numbers(test, inputs)
    if test == "test_traffic_per_lane":
        values["traffic"][0, 0] = -1
    elif test == "test_compare_traffic":
        values["reduce_add"] = values["ring"]
    elif test == "test_train_step":
        values["losses"][2] += 0.01
    elif test == "test_gradient_difference_small":
        values["difference"] = torch.tensor([2e-7, 2e-3], dtype=torch.float64)
    else:
        values["difference"] = values["difference"] / 3
    return values


def test_five_checks_of_returned_numbers_are_decided_by_the_parent():
    assert sorted((c.task, c.test) for c in COUNTED) == [
        (5, "test_gradient_difference_detects_errors"),
        (5, "test_gradient_difference_small"),
        (5, "test_train_step"),
        (7, "test_compare_traffic"),
        (7, "test_traffic_per_lane"),
    ]


@pytest.mark.parametrize("check", COUNTED, ids=lambda check: check.test)
def test_numbers_right_pass_and_wrong_or_for_other_inputs_fail(check):
    chosen = decided.choose([check.task])
    inputs = chosen[check.key]
    right = verdict_of(check, encoded(right_numbers(check.test, inputs)), chosen)
    assert right.passed, right.hint
    wrong = verdict_of(check, encoded(wrong_numbers(check.test, inputs)), chosen)
    assert not wrong.passed and wrong.hint != decided.MISSING, wrong.hint
    if check.test != "test_gradient_difference_small":  # any tiny number is right there
        other = check.choose(random.Random(1))
        if differ(right_numbers(check.test, other), right_numbers(check.test, inputs)):
            assert not verdict_of(check, encoded(right_numbers(check.test, other)), chosen).passed
    for values in (None, encoded({"x": torch.zeros(1)})):
        assert not verdict_of(check, values, chosen).passed


def test_a_float_that_agrees_with_everything_gains_nothing():
    # A max_gradient_difference returning a float whose < and > always say yes passed both
    # its checks in the grading process; sent to the parent it is only its value.
    class Agrees(float):
        def __lt__(self, other):
            return True

        __gt__ = __le__ = __ge__ = __lt__

    agreeing = Agrees(0.5)
    assert agreeing < 1e-5 and agreeing > 1e-3  # fooled here
    sent = {"difference": torch.tensor([float(agreeing)], dtype=torch.float64)}
    for check in (c for c in COUNTED if "difference" in c.test):
        chosen = decided.choose([5])
        assert not verdict_of(check, encoded(sent), chosen).passed


# --------------------------------------------------------------------------------------
# The gradients autograd leaves (dpkit/grading/gradients.py), and replicate's outputs.

GRADIENTS = [check for check in decided.CHECKS if check.judge.__module__ == gradients.__name__]


def right_gradients(test: str, inputs: list) -> dict[str, torch.Tensor]:
    """Plain autograd's gradients for the inputs, worked out here."""
    if test == "test_scatter_tensor_gradients":
        rows, columns, seed = inputs
        generator = torch.Generator().manual_seed(seed)
        sizes = [len(c) for c in torch.arange(rows).chunk(4)]
        return {"grad": torch.cat([torch.randn(n, columns, generator=generator) for n in sizes])}
    if test == "test_gather_backward":
        rows, columns, seed = inputs
        weight = torch.randn(sum(rows), columns, generator=torch.Generator().manual_seed(seed))
        grads = {f"grad{i}": piece for i, piece in enumerate(weight.split(rows))}
        return {**grads, **{f"across{i}": piece.t() for i, piece in enumerate(weight.split(rows))}}
    if test == "test_ddp_gradients_match_dataparallel":
        seed, rows = inputs
        x, y, _ = outputs.seeded_batch(seed, rows)
        model = outputs.seeded_model(seed)
        nn.functional.mse_loss(model(x), y).backward()
        grads = [p.grad for p in model.parameters()] * 4
        return {f"grad{i}": grad for i, grad in enumerate(grads)}
    seed, rows, count = inputs  # task 2
    x, _, _ = outputs.seeded_batch(seed, rows)
    model = outputs.seeded_model(seed)
    if test == "test_replicate_places_replicas":
        out = model(x).detach()
        return {f"out{i}": out for i in range(4)}
    (count * model(x).pow(2).sum()).backward()
    return {f"grad{i}": p.grad for i, p in enumerate(model.parameters())}


def wrong_gradients(test: str, inputs: list) -> dict[str, torch.Tensor]:
    """One mistake each: the chunks' gradients or the pieces' in another order, one
    replica's output off, lane 0's gradients alone (a reduce that keeps one copy), one
    replica left out of the all-reduce."""
    values = right_gradients(test, inputs)
    if test == "test_gather_backward":  # the pieces' gradients reversed, both times
        count = len(inputs[0])
        for prefix in ("grad", "across"):
            for i in range(count):
                values[f"{prefix}{i}"] = right_gradients(test, inputs)[f"{prefix}{count - 1 - i}"]
        return values
    names = sorted(values, key=lambda name: int(name.lstrip("gradout") or 0))
    if test == "test_scatter_tensor_gradients":
        values["grad"] = values["grad"].flip(0)
    elif test == "test_replicate_places_replicas":
        values["out3"] = values["out3"] + 0.5
    elif test == "test_replicate_gradients":
        values = {name: grad / inputs[2] for name, grad in values.items()}
    else:
        values[names[-1]] = values[names[-1]] * 0.75
    return values


def test_five_checks_of_gradients_and_replicas_are_decided_by_the_parent():
    assert sorted((c.task, c.test) for c in GRADIENTS) == [
        (1, "test_scatter_tensor_gradients"),
        (2, "test_replicate_gradients"),
        (2, "test_replicate_places_replicas"),
        (4, "test_gather_backward"),
        (7, "test_ddp_gradients_match_dataparallel"),
    ]


@pytest.mark.parametrize("check", GRADIENTS, ids=lambda check: check.test)
def test_gradients_right_pass_and_wrong_or_for_other_inputs_fail(check):
    chosen = decided.choose([check.task])
    inputs = chosen[check.key]
    right = verdict_of(check, encoded(right_gradients(check.test, inputs)), chosen)
    assert right.passed, right.hint
    wrong = verdict_of(check, encoded(wrong_gradients(check.test, inputs)), chosen)
    assert not wrong.passed and wrong.hint != decided.MISSING, wrong.hint
    other = check.choose(random.Random(1))
    if differ(right_gradients(check.test, other), right_gradients(check.test, inputs)):
        assert not verdict_of(check, encoded(right_gradients(check.test, other)), chosen).passed
    for values in (None, encoded({"x": torch.zeros(1)})):
        assert not verdict_of(check, values, chosen).passed


# --------------------------------------------------------------------------------------
# Task 6's sizes and simulated time (dpkit/grading/weighted.py), task 1's classic examples.

SIZES = [  # measure_step_time's check runs the grader's own, below
    c
    for c in decided.CHECKS
    if c.judge.__module__ == weighted.__name__ and c.test != "test_measure_step_time"
] + [next(c for c in decided.CHECKS if c.test == "test_chunk_sizes_examples")]


def right_sizes(test: str, inputs: list) -> dict[str, torch.Tensor]:
    if test == "test_simulated_step_time":
        times = [max(r * t / v for r, v in zip(sizes, speeds)) for sizes, speeds, t in inputs]
        return {"seconds": torch.tensor(times, dtype=torch.float64)}
    if test == "test_chunk_sizes_examples":
        answers = [[len(c) for c in torch.arange(b).chunk(n)] if b else [] for b, n in inputs]
    else:
        answers = [fastest(batch, speeds) for batch, speeds in inputs]
    return decided.pack_sizes(answers)


def wrong_sizes(test: str, inputs: list) -> dict[str, torch.Tensor]:
    """One mistake each: a time without per-row seconds, an even split (task 1), a row
    lost, rows rounded by largest remainder (optimality), a size of -1 among equal speeds."""
    if test == "test_simulated_step_time":
        times = [max(r / v for r, v in zip(sizes, speeds)) for sizes, speeds, _ in inputs]
        return {"seconds": torch.tensor(times, dtype=torch.float64)}
    if test == "test_chunk_sizes_examples":
        even = [[b // n + (i < b % n) for i in range(min(b, n))] for b, n in inputs]
        return decided.pack_sizes(even)
    answers = [fastest(batch, speeds) for batch, speeds in inputs]
    if test == "test_sizes_are_optimal":
        answers = [largest_remainder(batch, speeds) for batch, speeds in inputs]
    elif test == "test_equal_speeds_balance":
        last = next(i for i, (batch, speeds) in enumerate(inputs) if len(speeds) > 1)
        answers[last] = [0] * len(inputs[last][1])
        answers[last][0], answers[last][1] = inputs[last][0] + 1, -1
    else:
        answers[0][0] -= 1
    return decided.pack_sizes(answers)


def largest_remainder(batch: int, speeds: list[float]) -> list[int]:
    total = sum(speeds)
    sizes = [int(batch * speed / total) for speed in speeds]
    for _ in range(batch - sum(sizes)):
        sizes[min(range(len(speeds)), key=lambda i: sizes[i] - batch * speeds[i] / total)] += 1
    return sizes


def test_52_checks_are_decided_by_the_parent():
    assert len(decided.CHECKS) == 52
    assert sorted(c.test for c in SIZES) == [
        "test_chunk_sizes_examples",
        "test_equal_speeds_balance",
        "test_simulated_step_time",
        "test_sizes_are_a_split",
        "test_sizes_are_optimal",
    ]


@pytest.mark.parametrize("check", SIZES, ids=lambda check: check.test)
def test_sizes_right_pass_and_wrong_or_for_other_inputs_fail(check):
    chosen = decided.choose([check.task])
    inputs = chosen[check.key]
    right = verdict_of(check, encoded(right_sizes(check.test, inputs)), chosen)
    assert right.passed, right.hint
    wrong = verdict_of(check, encoded(wrong_sizes(check.test, inputs)), chosen)
    assert not wrong.passed and wrong.hint != decided.MISSING, wrong.hint
    if check.test != "test_chunk_sizes_examples":  # the classic examples are fixed
        other = check.choose(random.Random(1))
        if differ(right_sizes(check.test, other), right_sizes(check.test, inputs)):
            assert not verdict_of(check, encoded(right_sizes(check.test, other)), chosen).passed
    for values in (None, encoded({"x": torch.zeros(1)})):
        assert not verdict_of(check, values, chosen).passed


# --------------------------------------------------------------------------------------
# Shapes and counts (dpkit/grading/shapes.py).

SHAPES = [check for check in decided.CHECKS if check.judge.__module__ == shapes.__name__]


def right_shapes(test: str, inputs: list) -> dict[str, torch.Tensor]:
    if test == "test_scatter_tensor_dim_and_small_batch":
        rows, columns, depth, small, seed = inputs
        generator = torch.Generator().manual_seed(seed)
        wide = torch.randn(rows, columns, depth, generator=generator)
        few = torch.randn(small, 2, generator=generator)
        along = {f"dim{i}": chunk for i, chunk in enumerate(wide.chunk(4, dim=1))}
        return {**along, **{f"small{i}": row for i, row in enumerate(few.chunk(4))}}
    if test == "test_gather_scalar_backward":
        count, seed = inputs
        generator = torch.Generator().manual_seed(seed)
        torch.randn(count, generator=generator)  # the pieces' values
        weight = torch.randn(count, generator=generator)
        grads = {f"grad{i}": w for i, w in enumerate(weight.unbind())}
        return {**grads, **{f"returned{i}": w for i, w in enumerate(weight.unbind())}}
    rows, few, _ = inputs  # task 5: the lanes replicas ran on
    chunks = len(torch.arange(rows).chunk(4))
    return {
        "big": torch.arange(chunks),
        "small": torch.arange(few),
        "one": torch.tensor([-1]),
    }


def wrong_shapes(test: str, inputs: list) -> dict[str, torch.Tensor]:
    """One mistake each: chunks along rows, (1,)-shaped gradients for scalar pieces, a
    replica on every lane for a small batch."""
    values = right_shapes(test, inputs)
    if test == "test_scatter_tensor_dim_and_small_batch":
        rows, columns, depth, small, seed = inputs
        wide = torch.randn(rows, columns, depth, generator=torch.Generator().manual_seed(seed))
        values = {k: v for k, v in values.items() if not k.startswith("dim")}
        values |= {f"dim{i}": chunk for i, chunk in enumerate(wide.chunk(4))}
    elif test == "test_gather_scalar_backward":
        values = {k: v.view(1) if k.startswith("returned") else v for k, v in values.items()}
    else:
        values["small"] = torch.arange(4)
    return values


def test_three_checks_of_shapes_and_lanes_are_decided_by_the_parent():
    assert sorted((c.task, c.test) for c in SHAPES) == [
        (1, "test_scatter_tensor_dim_and_small_batch"),
        (4, "test_gather_scalar_backward"),
        (5, "test_forward_uses_lanes"),
    ]


@pytest.mark.parametrize("check", SHAPES, ids=lambda check: check.test)
def test_shapes_right_pass_and_wrong_or_for_other_inputs_fail(check):
    chosen = decided.choose([check.task])
    inputs = chosen[check.key]
    right = verdict_of(check, encoded(right_shapes(check.test, inputs)), chosen)
    assert right.passed, right.hint
    wrong = verdict_of(check, encoded(wrong_shapes(check.test, inputs)), chosen)
    assert not wrong.passed and wrong.hint != decided.MISSING, wrong.hint
    if check.test != "test_forward_uses_lanes":  # other sizes often run as many replicas
        other = check.choose(random.Random(1))
        if differ(right_shapes(check.test, other), right_shapes(check.test, inputs)):
            assert not verdict_of(check, encoded(right_shapes(check.test, other)), chosen).passed
    for values in (None, encoded({"x": torch.zeros(1)})):
        assert not verdict_of(check, values, chosen).passed


# --------------------------------------------------------------------------------------
# Nested outputs (dpkit/grading/structure.py): described as text, with their tensors.

Result = namedtuple("Result", ["logits", "loss"])
Result.__module__ = "test_task4"  # as the grader's namedtuple is named in a grading run
STRUCTURES = [c for c in decided.CHECKS if c.judge.__module__ == structure.__name__]


def right_structure(test: str, inputs: list) -> list:
    """What a right scatter or gather returns, built here."""
    if test == "test_scatter_containers":
        x, y = structure.scatter_tensors(*inputs)
        xs, ys = x.chunk(4), y.chunk(4)
        return [(a, [b, a]) for a, b in zip(xs, ys)] + [
            OrderedDict(a=a, b=b) for a, b in zip(xs, ys)
        ]
    outputs_ = structure.replica_outputs(*inputs, Result)
    gathered = OrderedDict(
        out=[torch.cat([o["out"][0] for o in outputs_]), None],
        extra=Result(
            torch.cat([o["extra"].logits for o in outputs_]),
            torch.stack([o["extra"].loss for o in outputs_]),
        ),
        pair=(torch.cat([o["pair"][0] for o in outputs_]), None),
    )
    return [gathered]


def wrong_structure(test: str, inputs: list) -> list:
    """One mistake each: an OrderedDict scattered into plain dicts, a namedtuple gathered
    into a plain tuple."""
    values = right_structure(test, inputs)
    if test == "test_scatter_containers":
        return [dict(v) if isinstance(v, OrderedDict) else v for v in values]
    values[0]["extra"] = tuple(values[0]["extra"])
    return values


def packed(test: str, values: list, inputs: list) -> dict:
    """``values`` as the grader sends them, with the dim=1 calls' right answers."""
    sent = structure.pack(values)
    if test == "test_scatter_containers":  # and its dim=1 calls on a list, tuple and dict
        x, _ = structure.scatter_tensors(*inputs)
        sent |= structure.pack([[a.t()] for a in x.chunk(4)], structure.DIM)
        sent |= structure.pack([(a.t(),) for a in x.chunk(4)], structure.DIMS[0])
        sent |= structure.pack([{"c": a.t()} for a in x.chunk(4)], structure.DIMS[1])
    else:  # and its dim=1 call on plain dicts
        wide = structure.columns_outputs(*inputs)
        sent |= structure.pack([{"w": torch.cat([o["w"] for o in wide], 1)}], structure.DIM)
    return sent


@pytest.mark.parametrize("check", STRUCTURES, ids=lambda check: check.test)
def test_structures_right_pass_and_wrong_or_for_other_inputs_fail(check):
    chosen = decided.choose([check.task])
    inputs = chosen[check.key]
    sent = packed(check.test, right_structure(check.test, inputs), inputs)
    right = verdict_of(check, decided.encode(sent), chosen)
    assert right.passed, right.hint
    wrong = verdict_of(
        check,
        decided.encode(packed(check.test, wrong_structure(check.test, inputs), inputs)),
        chosen,
    )
    assert not wrong.passed and wrong.hint != decided.MISSING, wrong.hint
    others = check.choose(random.Random(1))
    other = packed(check.test, right_structure(check.test, others), others)
    assert not verdict_of(check, decided.encode(other), chosen).passed
    for values in (None, encoded({"x": torch.zeros(1)})):
        assert not verdict_of(check, values, chosen).passed


def test_scatter_inputs_always_make_four_chunks_so_a_right_answer_is_never_failed():
    """The grader checks lanes 1-3 of scatter_tensor's chunks: 9 rows (3 chunks of 3 from
    torch.chunk) made a correct solution raise IndexError in about 1 run of 34 (2 of 60
    students of a quiet class run lost the check)."""
    rng = random.Random(0)
    for _ in range(500):
        rows, _, _ = outputs.scatter_input_inputs(rng)
        assert len(torch.empty(rows).chunk(4)) == 4, rows


# --------------------------------------------------------------------------------------
# Task 3's grad modes and exceptions (dpkit/grading/conduct.py): the grader's own checks run
# here on the solution and on solutions with one mistake, and what they would send goes
# through decide().

CONDUCT = [check for check in decided.CHECKS if check.judge.__module__ == conduct.__name__]


def _module(name: str, path: Path, source: str):  # noqa: ANN202 - a module built here
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    exec(compile(source, str(path), "exec"), module.__dict__)  # noqa: S102
    return module


def grader(task: int):  # noqa: ANN201 - the grader's module, loaded here
    path = EXERCISES / "graders" / f"test_task{task}.py"
    source = path.read_text().replace(f"pytestmark = pytest.mark.task{task}", "")
    return _module(f"dpkit_grader_task{task}", path, source)  # its marker is the conftest's


GRADERS = {task: grader(task) for task in (1, 2, 3, 6)}


def solution_variant(task: int, old: str = "", new: str = ""):  # noqa: ANN201 - one line changed
    name = {
        1: "task1_scatter.py",
        2: "task2_replicate.py",
        3: "task3_parallel_apply.py",
        6: "task6_weighted.py",
    }[task]
    source = (SOLUTIONS / name).read_text()
    assert source.count(old) == 1 if old else True, f"the solution no longer has {old!r}"
    return _module(f"dpkit_task{task}_variant", SOLUTIONS / name, source.replace(old, new, 1))


def task3_with(old: str = "", new: str = ""):  # noqa: ANN201 - the solution, one line changed
    return solution_variant(3, old, new)


class _Node:
    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid


class _Request:
    def __init__(self, nodeid: str) -> None:
        self.node = _Node(nodeid)


def sent_by(check: decided.ParentCheck, exercise, inputs: list, monkeypatch) -> str:  # noqa: ANN001
    """What the grader's check sends for ``inputs`` with ``exercise`` (unjudged here)."""
    nodeid = f"exercises/graders/{check.key}"
    sent: list = []
    monkeypatch.setenv(decided.ENVIRONMENT, decided.json.dumps({check.key: inputs}))
    monkeypatch.setattr(decided, "answer", lambda _n, _i, values: sent.append(values))
    lanes = dpkit.virtual_devices(4, on="cpu")
    test = getattr(GRADERS[check.task], check.test)
    if "lanes" in test.__code__.co_varnames[: test.__code__.co_argcount]:
        test(exercise, lanes, _Request(nodeid))
    else:
        test(exercise, _Request(nodeid))
    assert len(sent) == 1
    return decided.encode(sent[0])


def test_seven_checks_of_threads_grad_modes_and_exceptions_are_decided_by_the_parent():
    assert sorted(c.test for c in CONDUCT) == [
        "test_apply_replica_catches",
        "test_apply_replica_sets_grad_mode",
        "test_exception_carried_back",
        "test_grad_mode_carried",
        "test_one_thread_per_replica",
        "test_reraise_falls_back_to_runtime_error",
        "test_reraise_names_replica",
    ]


@pytest.mark.parametrize(
    "threads, arrivals, hint",
    [
        ([0, 1, 2], [0, 1, 2], "a replica ran in the caller's thread"),
        ([1, 1, 2], [0, 1, 2], "3 replicas ran in 2 thread(s); use one each"),
        ([1, 2, 3], [0, 0, 0], "did not all run at the same time"),
        ([1, 2, -1], [0, 1, 2], "did not run every replica"),
    ],
)
def test_threads_that_are_not_one_each_and_at_once_fail(threads, arrivals, hint):
    """Without the barrier's own failure (which fails in the grading process), a replica
    run by the caller, two replicas in one thread, or arrivals that did not meet."""
    check = next(c for c in CONDUCT if c.test == "test_one_thread_per_replica")
    values = {"threads": torch.tensor(threads), "arrivals": torch.tensor(arrivals)}
    result = verdict_of(check, encoded(values), {check.key: [3]})
    assert not result.passed and hint in result.hint, result.hint


@pytest.mark.parametrize("check", CONDUCT, ids=lambda check: check.test)
def test_the_solution_passes_every_draw_and_other_answers_fail(check, monkeypatch):
    """A hundred fresh draws each: the parent's inputs never fail a right solution; what it
    sends for other inputs, and unreadable values, fail."""
    solution = task3_with()
    rng = random.Random(3)
    for _ in range(100):
        inputs = check.choose(rng)
        chosen = {check.key: inputs}
        right = verdict_of(check, sent_by(check, solution, inputs, monkeypatch), chosen)
        assert right.passed, (inputs, right.hint)
    mine = decided.decode(sent_by(check, solution, inputs, monkeypatch))
    other = sent_by(check, solution, check.choose(random.Random(1)), monkeypatch)
    if differ(decided.decode(other), mine):  # four grad-mode pairs have only 24 orders
        assert not verdict_of(check, other, chosen).passed
    for values in (None, encoded({"x": torch.zeros(1)})):
        assert not verdict_of(check, values, chosen).passed


CONDUCT_WRONG = [  # (check, the solution's line, the mistake, the hint the parent gives)
    (
        "test_apply_replica_sets_grad_mode",
        "    torch.set_grad_enabled(grad_enabled)\n",
        "",
        "call torch.set_grad_enabled(grad_enabled) in the worker",
    ),
    (
        "test_grad_mode_carried",
        "grad_enabled = torch.is_grad_enabled()",
        "grad_enabled = True",
        "pass torch.is_grad_enabled() to the workers",
    ),
    (
        "test_apply_replica_catches",
        "ReplicaFailure(index, device, error, traceback.format_exc())",
        "ReplicaFailure(index, device, error, str(error))",
        "store traceback.format_exc() as the traceback text",
    ),
    (
        "test_apply_replica_catches",
        "ReplicaFailure(index, device, error, traceback.format_exc())",
        "ReplicaFailure(index, device, type(error)(*error.args), traceback.format_exc())",
        "keep the original exception",
    ),
    (
        "test_reraise_names_replica",
        'f"in replica {failure.index} on device {failure.device}',
        'f"in replica {failure.index}',
        "the message should say 'in replica",
    ),
    (
        "test_reraise_falls_back_to_runtime_error",
        "raise RuntimeError(message) from failure.exception",
        "raise RuntimeError(message)",
        "raise the RuntimeError from the original exception",
    ),
    (
        "test_exception_carried_back",
        "for output in outputs:\n        if isinstance",
        "for output in reversed(outputs):\n        if isinstance",
        "re-raise the failure of the lowest replica index",
    ),
]


@pytest.mark.parametrize("test, old, new, hint", CONDUCT_WRONG, ids=lambda v: v[:40])
def test_one_mistake_fails_its_check_in_the_parent(test, old, new, hint, monkeypatch):
    check = next(c for c in CONDUCT if c.test == test)
    wrong = task3_with(old, new)
    inputs = check.choose(random.Random(5))
    result = verdict_of(check, sent_by(check, wrong, inputs, monkeypatch), {check.key: inputs})
    assert not result.passed and hint in result.hint, result.hint


# --------------------------------------------------------------------------------------
# Object identity (dpkit/grading/identity.py): the graders' own checks run here.

IDENTITY = [check for check in decided.CHECKS if check.judge.__module__ == identity.__name__]


def test_two_checks_of_object_identity_are_decided_by_the_parent():
    assert sorted((c.task, c.test) for c in IDENTITY) == [
        (1, "test_scatter_namedtuple_and_shared_objects"),
        (2, "test_replicate_leaves_module_alone"),
    ]


@pytest.mark.parametrize("check", IDENTITY, ids=lambda check: check.test)
def test_identity_right_on_every_draw_and_other_answers_fail(check, monkeypatch):
    """A hundred fresh draws each (2 to 9 rows: 2 or 3 chunks) never fail the
    solution; what it sends for other inputs, and unreadable values, fail."""
    solution = solution_variant(check.task)
    rng = random.Random(4)
    for _ in range(100):
        inputs = check.choose(rng)
        chosen = {check.key: inputs}
        right = verdict_of(check, sent_by(check, solution, inputs, monkeypatch), chosen)
        assert right.passed, (inputs, right.hint)
    other = sent_by(check, solution, check.choose(random.Random(1)), monkeypatch)
    assert not verdict_of(check, other, chosen).passed
    for values in (None, encoded({"x": torch.zeros(1)})):
        assert not verdict_of(check, values, chosen).passed


IDENTITY_WRONG = [  # (task, the solution's text, the mistake, the hint the parent gives)
    (
        1,
        "type(inputs)(*shares) for shares",
        "tuple(shares) for shares",
        "a namedtuple must stay a Pair",
    ),
    (
        1,
        "return [inputs for _ in devices]",
        "return [inputs] + [None] * (len(devices) - 1)",
        "shared",
    ),
    (
        2,
        "    return replicas",
        "    for index, name in enumerate(names):  # the module becomes lane 0's replica\n"
        "        swap_parameter(module, name, copies[index])\n"
        "    return replicas",
        "the module's parameters changed: swap them in the replicas only",
    ),
]


@pytest.mark.parametrize("task, old, new, hint", IDENTITY_WRONG, ids=lambda v: str(v)[:30])
def test_one_identity_mistake_fails_its_check_in_the_parent(task, old, new, hint, monkeypatch):
    check = next(c for c in IDENTITY if c.task == task)
    inputs = check.choose(random.Random(6))
    sent = sent_by(check, solution_variant(task, old, new), inputs, monkeypatch)
    result = verdict_of(check, sent, {check.key: inputs})
    assert not result.passed and hint in result.hint, result.hint


def test_a_copy_of_a_shared_object_is_not_the_object_even_when_one_is_shared(monkeypatch):
    """One shared object (the draw's fewest), copied for each lane: every place then holds
    no input object, which the grader sends as -1 (its NOT_FOUND), never as another's index."""
    check = next(c for c in IDENTITY if c.task == 1)
    inputs = check.choose(random.Random(6))
    inputs[4] = 1
    copying = solution_variant(  # each lane its own copy (the shared objects are key views)
        1,
        "return [inputs for _ in devices]",
        "return [inputs if isinstance(inputs, str) else tuple(inputs) for _ in devices]",
    )
    result = verdict_of(check, sent_by(check, copying, inputs, monkeypatch), {check.key: inputs})
    assert not result.passed and "shared as-is" in result.hint, result.hint
    first, second = object(), [1]
    assert identity.index_of(second, [first, second]) == 1
    assert identity.index_of([1], [first, second]) == -1  # equal is not the same object


def test_the_draws_span_the_rows_columns_and_shared_objects_they_promise():
    """Rows that make 2 or 3 chunks over 4 lanes (fewer than the shared objects' 4 copies:
    zip keeps as many entries as the fewest), 1 to 4 columns, 1 to 3 shared objects, a
    fresh label each time; the batch has the drawn shape."""
    rng = random.Random(8)
    draws = [identity.shared_inputs(rng) for _ in range(400)]
    assert {d[0] for d in draws} == {2, 3, 5, 6, 9}
    assert {d[1] for d in draws} == set(range(1, 5))
    assert {d[4] for d in draws} == {1, 2, 3}
    assert len({d[3] for d in draws}) > 390
    assert identity.shared_image(5, 3, seed=1).shape == (5, 3)


def test_a_module_whose_parameters_are_no_longer_parameters_fails():
    seed = 11
    want = list(outputs.seeded_model(seed).parameters())
    values = {"same": torch.arange(len(want)), "parameter": torch.zeros(len(want), dtype=int)}
    values |= {f"value{i}": p.detach() for i, p in enumerate(want)}
    assert identity.judge_module_alone([seed], values) is None
    for kept in (torch.tensor([0] * (len(want) - 1) + [-1]), None):
        hint = identity.judge_module_alone([seed], {**values, "parameter": kept})
        assert "must stay nn.Parameter" in hint


# --------------------------------------------------------------------------------------
# Task 6's measure_step_time (dpkit/grading/weighted.py): the grader's check runs here.

MEASURED = next(c for c in decided.CHECKS if c.test == "test_measure_step_time")


def test_measure_step_time_right_on_fresh_draws_and_wrong_times_fail(monkeypatch):
    """Ten fresh draws never fail the solution (each sleeps about 50 ms); a measurement
    longer than the call, shorter than the slowest sleep, or as long as the sleeps one
    after another fails."""
    solution = solution_variant(6)
    rng = random.Random(7)
    for _ in range(10):
        inputs = MEASURED.choose(rng)
        chosen = {MEASURED.key: inputs}
        right = verdict_of(MEASURED, sent_by(MEASURED, solution, inputs, monkeypatch), chosen)
        assert right.passed, (inputs, right.hint)
    sizes, speeds, per_row = inputs
    sleeps = [rows * per_row / speed for rows, speed in zip(sizes, speeds)]
    for measured, outside, hint in (
        (0.3, 0.1, "longer than the call itself"),
        (max(sleeps) / 2, 1.0, "the slowest device sleeps"),
        (sum(sleeps), 1.0, "start every thread before joining any"),
    ):
        values = {"seconds": torch.tensor([measured, outside], dtype=torch.float64)}
        result = verdict_of(MEASURED, encoded(values), chosen)
        assert not result.passed and hint in result.hint, result.hint
    for values in (None, encoded({"x": torch.zeros(1)})):
        assert not verdict_of(MEASURED, values, chosen).passed


def test_threads_joined_one_by_one_fail_measure_step_time(monkeypatch):
    sequential = solution_variant(
        6,
        "    for thread in threads:\n        thread.start()\n    for thread in threads:\n",
        "    for thread in threads:\n        thread.start()\n",
    )
    inputs = MEASURED.choose(random.Random(8))
    sent = sent_by(MEASURED, sequential, inputs, monkeypatch)
    result = verdict_of(MEASURED, sent, {MEASURED.key: inputs})
    assert not result.passed and "start every thread before joining any" in result.hint


TIMED = (
    "    start = time.perf_counter()\n    for thread in threads:\n        thread.start()\n"
    "    for thread in threads:\n        thread.join()\n    return time.perf_counter() - start\n"
)
SLOWEST = "max(rows * per_row_seconds / speed for rows, speed in zip(chunk_sizes, speeds))"


@pytest.mark.parametrize(
    ("body", "hint"),
    [
        # One sleep of the slowest device's time, in the caller, returned: a time that fits.
        (f"    slowest = {SLOWEST}\n    time.sleep(slowest)\n    return slowest\n",
         "each in a thread of its own, but the threads' time.sleep calls added up to"),
        # A thread per device, one after another, and the time of threads at once returned.
        ("    for thread in threads:\n        thread.start()\n        thread.join()\n"
         f"    return {SLOWEST} + 0.002\n", "the devices' sleeps ran one after another"),
    ],
)  # fmt: skip
def test_a_measured_time_that_fits_but_was_not_measured_fails(body, hint, monkeypatch):
    """The times alone would pass both: the grader's record of the sleeps does not."""
    faked = solution_variant(6, TIMED, body)
    inputs = MEASURED.choose(random.Random(9))
    result = verdict_of(
        MEASURED, sent_by(MEASURED, faked, inputs, monkeypatch), {MEASURED.key: inputs}
    )
    assert not result.passed and hint in result.hint, result.hint


def test_sleep_imported_from_time_is_recorded_too(monkeypatch):
    """``from time import sleep`` binds the function before the check: the grader swaps the
    name in the student's module as well as its ``time``, and puts both back after."""
    source = (SOLUTIONS / "task6_weighted.py").read_text()
    source = source.replace("import time\n", "import time\nfrom time import sleep\n", 1)
    source = source.replace("threading.Thread(target=time.sleep,", "threading.Thread(target=sleep,")
    module = _module("dpkit_task6_sleep_imported", SOLUTIONS / "task6_weighted.py", source)
    inputs = MEASURED.choose(random.Random(10))
    result = verdict_of(
        MEASURED, sent_by(MEASURED, module, inputs, monkeypatch), {MEASURED.key: inputs}
    )
    assert result.passed, result.hint
    assert module.sleep is time.sleep and module.time is time


def test_measure_inputs_always_leave_the_old_slack_so_a_right_answer_is_never_failed():
    """The fixed case left 145 ms between the sleeps at once and one after another for
    sleep's overshoot on a busy machine; no draw leaves less."""
    rng = random.Random(0)
    for _ in range(500):
        sizes, speeds, per_row = MEASURED.choose(rng)
        sleeps = [rows * per_row / speed for rows, speed in zip(sizes, speeds)]
        assert max(sleeps) <= 0.07 and sum(sleeps) - max(sleeps) >= 0.15 - 1e-9, sleeps


def test_the_draws_hold_what_their_checks_rely_on():
    """The chunk-size draws include the four corners of the range (1 or 300 rows, 1 or 16
    devices); the straggler report's second case leaves exactly 3 devices idle under
    torch.chunk (so its padding shows)."""
    rng = random.Random(12)
    for _ in range(20):
        pairs = {tuple(pair) for pair in decided.chunk_sizes_inputs(rng)}
        assert len(pairs) == 100 and {(1, 1), (1, 16), (300, 1), (300, 16)} <= pairs
        assert all(1 <= batch <= 300 and 1 <= devices <= 16 for batch, devices in pairs)
        _, (batch, speeds, _) = decided.straggler_inputs(rng)
        assert len(speeds) - len(torch.empty(batch).chunk(len(speeds))) == 3


def test_transfers_are_packed_as_source_destination_bytes_rows():
    from dpkit.comm import add_transfer_listener

    lanes, heard = dpkit.virtual_devices(3, on="cpu"), []
    handle = add_transfer_listener(heard.append)
    try:
        dpkit.scatter(torch.zeros(3, 2), lanes)  # an 8-byte row from the host to lanes 1, 2
    finally:
        handle.remove()
    packed = decided.pack_transfers(heard)["transfers"]
    assert packed.dtype == torch.int64
    assert sorted(packed.tolist()) == [[-1, 1, 8], [-1, 2, 8]]  # the host is index -1
    assert decided.pack_transfers([])["transfers"].shape == (0, 3)


def test_a_check_s_outputs_reach_the_harness_only_under_dpkit_grade(monkeypatch):
    from dpkit.grading import harness

    sent = {}
    monkeypatch.setattr(harness, "record_values", lambda nodeid, text: sent.update({nodeid: text}))
    values = {"sums": torch.arange(3.0)}
    monkeypatch.delenv(decided.ENVIRONMENT, raising=False)
    decided.send("tests/test_x.py::test_y", values)
    assert sent == {}  # a student running the graders themselves
    monkeypatch.setenv(decided.ENVIRONMENT, "{}")
    decided.send("tests/test_x.py::test_y", values)
    assert list(sent) == ["tests/test_x.py::test_y"]
    assert torch.equal(decided.decode(sent["tests/test_x.py::test_y"])["sums"], values["sums"])
