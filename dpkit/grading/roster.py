"""The checks each grader defines, read from its source: the parent's list, not the child's.

The surprise first: the list of checks a grade is made of (their ids, names and tasks) is
read here from the graders' text, with :mod:`ast`, never by importing them and never from
what the grading process reports. That process runs the student's code, so a list it sends
could leave out the checks a submission fails, or add checks that pass; the parent scores
this list instead (:func:`dpkit.grading.results.results_from_records`): a check the process
reports no outcome for fails, a check it reports that is not on the list counts for nothing.

What pytest would collect is mirrored for what the graders use: module-level ``test_*``
functions in source order, one check each, or one per id of a single
``pytest.mark.parametrize(..., ids=[...])`` whose ids are written out as strings (or, without
``ids=``, of one argument's literal numbers or plain strings, which pytest names by value); a
check's name is its docstring's first line, with the id in brackets (as
:func:`dpkit.grading.harness.check_name` names it in the grading process). A grader that
uses anything else (a test class, ids computed at import, two parametrize marks) is refused
with a clear error, so the two lists cannot silently differ.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

GRADERS = "exercises/graders"  # where the graders are in a run's folder (its pytest rootdir)


@dataclass(frozen=True)
class Check:
    """One check as the parent knows it: its task, pytest's node id, its friendly name."""

    task: int
    nodeid: str
    name: str


class RosterError(ValueError):
    """A grader written so that its checks cannot be listed without running it."""


def _parametrize_ids(function: ast.FunctionDef, where: str) -> list[str] | None:
    """The ids of the function's parametrize mark, or None if it has none."""
    marks = [
        decorator
        for decorator in function.decorator_list
        if isinstance(decorator, ast.Call) and ast.unparse(decorator.func).endswith("parametrize")
    ]
    if not marks:
        return None
    ids = next((k.value for k in marks[0].keywords if k.arg == "ids"), None)
    try:
        values = ast.literal_eval(ids) if ids is not None and len(marks) == 1 else None
        if ids is None and len(marks) == 1:
            values = _pytest_ids(*(ast.literal_eval(a) for a in marks[0].args[:2]))
    except ValueError:
        values = None
    if not isinstance(values, (list, tuple)) or not all(isinstance(v, str) for v in values):
        raise RosterError(
            f"{where}::{function.name}: give its one pytest.mark.parametrize literal string "
            "ids (ids=['10 over 4 lanes', ...]), so the grader's parent can list its checks "
            "without running it"
        )
    return list(values)


def _pytest_ids(argnames: object, argvalues: object) -> list[str] | None:
    """The ids pytest gives one argument's literal values when no ``ids=`` is written: the
    value itself for numbers, booleans, None and printable ASCII strings. None for anything
    else (several arguments, other values, or ids pytest would have to make unique)."""
    if not isinstance(argnames, str) or "," in argnames or not isinstance(argvalues, list):
        return None
    plain = (int, float, bool, type(None))
    ids = [
        value if isinstance(value, str) else str(value)
        for value in argvalues
        if isinstance(value, plain) or (isinstance(value, str) and value.isprintable() and value)
    ]
    ascii_only = all(id_.isascii() for id_ in ids)
    return ids if len(ids) == len(argvalues) == len(set(ids)) and ascii_only else None


@functools.lru_cache(maxsize=64)  # a class's runs share one trusted copy: parse it once
def checks_in(source: str | bytes, task: int) -> tuple[Check, ...]:
    """The checks grader ``test_task{task}.py`` defines, in the order pytest runs them."""
    where = f"{GRADERS}/test_task{task}.py"
    tree = ast.parse(source, filename=where)
    checks = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            raise RosterError(f"{where}: write checks as test_ functions, not in {node.name}")
        if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test"):
            continue
        doc = ast.get_docstring(node, clean=False)
        name = doc.strip().splitlines()[0] if doc and doc.strip() else node.name
        ids = _parametrize_ids(node, where)
        if ids is None:
            checks.append(Check(task, f"{where}::{node.name}", name))
        else:
            for id_ in ids:
                label = name if doc and doc.strip() else f"{node.name}[{id_}]"
                checks.append(Check(task, f"{where}::{node.name}[{id_}]", f"{label} ({id_})"))
    return tuple(checks)


def roster(files: Mapping[str, bytes], tasks: Sequence[int]) -> list[Check]:
    """Every check of ``tasks``, task by task, from the graders' text in ``files`` (the run's
    trusted copy, :class:`dpkit.grading.sandbox.Trusted`)."""
    return [
        check for task in tasks for check in checks_in(files[f"{GRADERS}/test_task{task}.py"], task)
    ]
