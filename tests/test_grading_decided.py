"""A check the parent decides (dpkit/grading/decided.py) passes only on values the parent
finds right: the grading process's "passed" is not enough.

The records here are what a grading process could sign if a submission reached the
harness: a "passed" with wrong values, with none, with something that is not tensors, or
no record at all for the check. A real run of the pilot, a chunk_sizes whose sizes compare
equal to anything, is graded with the attacks' class in tests/test_grading_attacks.py.
"""

from __future__ import annotations

import base64
import io
import random
from pathlib import Path

import pytest
import torch

from dpkit import grading
from dpkit.grading import decided

EXERCISES = Path(__file__).resolve().parent.parent / "exercises"
NODEID = "exercises/graders/test_task1.py::test_chunk_sizes_property"
OTHER = "exercises/graders/test_task1.py::test_chunk_sizes_examples"
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


def test_a_check_left_out_of_the_records_fails(chosen):
    records = [
        {"event": "collected", "nodeid": OTHER, "task": 1, "check": "the examples"},
        {"event": "passed", "nodeid": OTHER},
        {"event": "finished"},
    ]
    results = grading.results_from_records(decided.decide(records, chosen), None, [1])
    assert [r.check for r in results] == [NAME, "the examples"]
    assert not results[0].passed


def test_the_parent_knows_the_checks_name():
    grader = (EXERCISES / "graders" / "test_task1.py").read_text()
    check = decided.CHECKS[0]
    assert f'def {check.test}(exercise, request):\n    """{check.name}"""' in grader
