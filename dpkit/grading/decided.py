"""Checks the parent decides: the student's outputs come back as data, the verdict is made here.

The surprise first: for most checks the grading process's word decides the grade, and that
process runs the student's code, so everything behind its word (the harness, its key, the
graders' asserts) is within the submission's reach. A check listed here is decided the
other way round, as a pilot of that split (see the threat model in docs/instructors.md):

- the parent (:mod:`dpkit.grading.sandbox`, which never imports a submission) chooses the
  inputs afresh for every run and hands them over in the run's environment;
- in the grading process the check calls the student's function on them, and sends the
  outputs as tensors (``torch.save``; read back with ``torch.load(weights_only=True)``,
  never unpickled as objects) with its signed record;
- the parent computes the right outputs itself, from its own copy of the inputs, and a
  check passes only if the grading process said so *and* the values it sent are right. A
  forged "passed" record, a swapped ``torch.equal`` or an ``__eq__`` that always agrees in
  the grading process gain nothing here; a check it leaves out of its records fails.

The inputs are all sent at once, before the submission is imported: they are fresh, so
no answer can have been stored in advance, and a pure function of two numbers gains
nothing from seeing the next input early. The grading process still computes the outputs,
so whether it used the student's own function (and no forbidden one) is the forbidden-call
rules' to police, as for every check.
"""

from __future__ import annotations

import base64
import io
import json
import os
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

ENVIRONMENT = "DPKIT_PARENT_INPUTS"  # the inputs the parent chose, as JSON, by check
VALUES_LIMIT = 256 * 1024  # characters of encoded values a check may send
MISSING = (
    "the grading process sent no readable outputs for this check; the grader decides it from the "
    "values your functions return"
)


@dataclass(frozen=True)
class ParentCheck:
    """A check the parent decides: where it is, its name (the test's docstring line), how
    the parent chooses its inputs and judges the outputs (a hint, or None when right)."""

    task: int
    test: str
    name: str
    choose: Callable[[random.Random], list]
    judge: Callable[[list, Mapping[str, torch.Tensor]], str | None]

    @property
    def key(self) -> str:
        return f"test_task{self.task}.py::{self.test}"


# --------------------------------------------------------------------------------------
# Task 1's chunk_sizes, for any batch and device count.


def chunk_sizes_inputs(rng: random.Random) -> list[list[int]]:
    """A hundred (batch, devices) pairs, smallest first (the first failure shown is the
    smallest), with the edges of the range among them."""
    pairs = {(1, 1), (1, 16), (16, 16), (17, 16), (300, 16), (300, 1)}
    while len(pairs) < 100:
        pairs.add((rng.randint(1, 300), rng.randint(1, 16)))
    return [list(pair) for pair in sorted(pairs)]


def pack_sizes(answers: Sequence[Sequence[int]]) -> dict[str, torch.Tensor]:
    """Lists of chunk sizes as two tensors: every size in a row, and each list's length."""
    flat = [size for sizes in answers for size in sizes]
    return {
        "sizes": torch.tensor(flat, dtype=torch.int64),
        "lengths": torch.tensor([len(sizes) for sizes in answers], dtype=torch.int64),
    }


def judge_chunk_sizes(pairs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    sizes, lengths = values.get("sizes"), values.get("lengths")
    for tensor in (sizes, lengths):
        if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.int64 or tensor.ndim != 1:
            return "the outputs sent for chunk_sizes are not the lists of sizes asked for"
    assert sizes is not None and lengths is not None
    if len(lengths) != len(pairs) or bool((lengths < 0).any()) or lengths.sum() != len(sizes):
        return "the outputs sent for chunk_sizes do not answer the inputs the grader chose"
    for (batch, devices), got in zip(pairs, torch.split(sizes, lengths.tolist())):
        want = [len(chunk) for chunk in torch.empty(batch).chunk(devices)]
        if got.tolist() != want:
            return (
                f"chunk_sizes({batch}, {devices}) returned {got.tolist()}, torch.chunk gives "
                f"{want}; note there may be fewer chunks than devices (6 rows over 4 devices: "
                "2, 2, 2)"
            )
    return None


CHECKS = (
    ParentCheck(
        1,
        "test_chunk_sizes_property",
        "chunk_sizes matches torch.chunk for any batch and device count",
        chunk_sizes_inputs,
        judge_chunk_sizes,
    ),
)


# --------------------------------------------------------------------------------------
# The parent's side.


def choose(tasks: Sequence[int]) -> dict[str, list]:
    """Fresh inputs for every parent-decided check of ``tasks``, by check."""
    rng = random.SystemRandom()
    return {check.key: check.choose(rng) for check in CHECKS if check.task in tasks}


def _check_of(nodeid: str, chosen: Mapping[str, list]) -> ParentCheck | None:
    return next((c for c in CHECKS if c.key in chosen and nodeid.endswith(c.key)), None)


def decode(text: Any) -> dict[str, torch.Tensor] | None:
    """Values a check sent, as tensors by name; None unless they are exactly that."""
    if not isinstance(text, str) or len(text) > VALUES_LIMIT:
        return None
    try:
        data = base64.b64decode(text, validate=True)
        values = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception:  # noqa: BLE001 - bad base64, or anything torch's safe loader refuses
        return None
    if not isinstance(values, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in values.items()
    ):
        return None
    return values


def decide(records: list[dict], chosen: Mapping[str, list]) -> list[dict]:
    """``records`` with the parent's verdict on its checks: a "passed" record stands only
    with values the parent finds right; a check missing from a run that finished fails."""
    decided, collected, tasks = [], set(), set()
    for record in records:
        check = _check_of(str(record.get("nodeid", "")), chosen)
        if record["event"] == "collected":
            tasks.add(record.get("task"))
            if check is not None:
                collected.add(check.key)
        if check is not None and record["event"] == "passed":
            values = decode(record.get("values"))
            try:
                hint = MISSING if values is None else check.judge(chosen[check.key], values)
            except Exception:  # noqa: BLE001 - a judge's slip on odd values fails the check,
                hint = MISSING  # it never stops the grader
            if hint is not None:
                record = {"event": "failed", "nodeid": record["nodeid"], "hint": hint}
        decided.append(record)
    if any(record["event"] == "finished" for record in records):
        for check in CHECKS:
            if check.key in chosen and check.key not in collected and check.task in tasks:
                nodeid = f"exercises/graders/{check.key}"
                first = next(
                    index
                    for index, r in enumerate(decided)
                    if r["event"] == "collected" and r.get("task") == check.task
                )
                listed = {"event": "collected", "nodeid": nodeid, "task": check.task}
                decided.insert(first, {**listed, "check": check.name})
                decided.append({"event": "failed", "nodeid": nodeid, "hint": MISSING})
    return decided


# --------------------------------------------------------------------------------------
# The grading process's side.


def inputs_for(nodeid: str) -> list | None:
    """The inputs the parent chose for the check ``nodeid``; None outside ``dpkit grade``."""
    chosen = json.loads(os.environ.get(ENVIRONMENT) or "{}")
    return next((inputs for key, inputs in chosen.items() if nodeid.endswith(key)), None)


def send(nodeid: str, values: Mapping[str, torch.Tensor]) -> None:
    """Send a check's outputs to the parent with its record (under ``dpkit grade`` only)."""
    if not os.environ.get(ENVIRONMENT):
        return
    from dpkit.grading.harness import record_values

    buffer = io.BytesIO()
    torch.save({name: tensor.detach().cpu() for name, tensor in values.items()}, buffer)
    record_values(nodeid, base64.b64encode(buffer.getvalue()).decode("ascii"))
