"""The exercises' graders mean something: solutions pass every check, stubs fail every check.

Each grading run is a subprocess (a fresh Python that imports torch), so the graders run
once per variant: every task against the reference solutions, every task against the
untouched stubs. Plausible wrong answers are in ``test_exercises_wrong_answers.py``; forged
grades, hangs, Ctrl-C and the class CSV in ``test_grading_integrity.py``.

The tasks are discovered from the ``exercises/taskN_*.py`` files, never counted here; the
tests check that each has a solution, a grader and a row in ``exercises/README.md``, and
that stub and solution agree on everything but the bodies (docstrings, signatures).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import re
import tokenize
from pathlib import Path

import pytest

from dpkit import grading

EXERCISES = Path(__file__).resolve().parent.parent / "exercises"
SOLUTIONS = EXERCISES / "solutions"
GRADERS = EXERCISES / "graders"
TASK_FILES = grading.task_files(EXERCISES)
TASKS = list(TASK_FILES)
STUBS = [EXERCISES / name for name in TASK_FILES.values()]
TODO = re.compile(r"TODO (\d+)\.(\d+): \S.*")


def stub_of(task: int) -> Path:
    return next(p for p in STUBS if p.name.startswith(f"task{task}_"))


def graded_without_notes(folder: Path) -> list[grading.CheckResult]:
    """``folder`` graded; the graders' list of checks (read from their text) must be what
    pytest ran: a check it lists but pytest did not run fails as left out, and one pytest
    ran that it does not list is noted on stderr."""
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors):
        results = grading.grade_folder(folder)
    assert "do not define" not in errors.getvalue(), errors.getvalue()
    left_out = [r.check for r in results if r.hint == grading.results.LEFT_OUT]
    assert not left_out, f"listed by the roster, never run by pytest: {left_out}"
    return results


@pytest.fixture(scope="module")
def solution_results() -> list[grading.CheckResult]:
    return graded_without_notes(SOLUTIONS)


@pytest.fixture(scope="module")
def stub_results() -> list[grading.CheckResult]:
    return graded_without_notes(EXERCISES)


def test_tasks_are_numbered_from_1_each_with_stub_solution_and_grader():
    assert TASKS == list(range(1, len(TASKS) + 1)), f"tasks {TASKS} skip a number"
    assert len(TASKS) >= 2
    assert grading.task_numbers(EXERCISES) == TASKS
    graders = sorted(int(p.stem[len("test_task") :]) for p in GRADERS.glob("test_task*.py"))
    assert graders == TASKS, "every task needs a grader, every grader a task"
    assert sorted(p.name for p in SOLUTIONS.glob("task*.py")) == sorted(TASK_FILES.values())
    for task, stub in zip(TASKS, STUBS):
        assert (SOLUTIONS / stub.name).is_file(), f"no reference solution for {stub.name}"
        grader = (GRADERS / f"test_task{task}.py").read_text()
        assert f'EXERCISE = "{stub.name}"' in grader
        assert f"pytestmark = pytest.mark.task{task}" in grader


@pytest.mark.parametrize("task", TASKS)
def test_solutions_pass_every_check(solution_results, task):
    mine = [r for r in solution_results if r.task == task]
    assert len(mine) >= 5, f"task {task} has only {len(mine)} checks"
    assert all(r.passed for r in mine), grading.report(mine)


@pytest.mark.parametrize("task", TASKS)
def test_stubs_fail_every_check(stub_results, task):
    """A grader that passes an untouched stub grades nothing: every check must fail, and
    fail because of a TODO (not a crash or a timeout of the grader itself)."""
    mine = [r for r in stub_results if r.task == task]
    assert mine, f"no checks ran for task {task}"
    passing = [r.check for r in mine if r.passed]
    assert not passing, f"the task {task} stub passes: {passing}"
    for result in mine:
        assert result.hint.startswith(f"not implemented yet (TODO {task}."), (
            f"{result.check!r} fails on the stub for another reason: {result.hint}"
        )


def test_stub_and_solution_checks_are_the_same(solution_results, stub_results):
    key = [(r.task, r.check) for r in solution_results]
    assert key == [(r.task, r.check) for r in stub_results]
    assert len(set(key)) == len(key), "two checks share a name; the report would be ambiguous"


def _comments(path: Path) -> list[str]:
    with path.open("rb") as file:
        tokens = tokenize.tokenize(file.readline)
        return [t.string.lstrip("# ") for t in tokens if t.type == tokenize.COMMENT]


def _not_implemented_messages(path: Path) -> list[str]:
    messages = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            if getattr(node.exc.func, "id", None) == "NotImplementedError":
                messages.append(node.exc.args[0].value)
    return sorted(messages, key=lambda m: int(TODO.match(m).group(2)))


@pytest.mark.parametrize("stub", STUBS, ids=[p.name for p in STUBS])
def test_todo_comments_match_not_implemented(stub):
    task = int(stub.name[4 : stub.name.index("_")])
    todos = [c for c in _comments(stub) if c.startswith("TODO")]
    messages = _not_implemented_messages(stub)
    assert todos == messages, "each '# TODO' comment must equal its NotImplementedError text"
    numbers = [TODO.match(m).groups() for m in messages]
    assert numbers == [(str(task), str(i)) for i in range(1, len(numbers) + 1)]
    assert 2 <= len(numbers) <= 4, "a task has 2-4 TODOs"
    # every TODO comment sits right above its raise
    lines = stub.read_text().splitlines()
    for index, line in enumerate(lines):
        if line.strip().startswith("# TODO"):
            text = line.strip()[2:]
            assert text in lines[index + 1] or text in lines[index + 2], f"{text} is not raised"


def _interface(body: list[ast.stmt], prefix: str = "") -> dict[str, str]:
    """What a student sees of a module besides function bodies, by qualified name: each
    function's decorators, signature and docstring; each class's decorators, bases,
    docstring, fields and methods; each module-level alias (``Traffic = dict[...]``)."""
    found = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            decorators = [f"@{ast.unparse(d)}" for d in node.decorator_list]
            if isinstance(node, ast.ClassDef):
                shape = f"({', '.join(ast.unparse(b) for b in node.bases)})"
            else:
                returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
                shape = f"({ast.unparse(node.args)}){returns}"
            docstring = ast.get_docstring(node)
            found[prefix + node.name] = "\n".join([*decorators, shape, repr(docstring)])
            if isinstance(node, ast.ClassDef):
                found.update(_interface(node.body, f"{prefix}{node.name}."))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            found[prefix + ast.unparse(target)] = ast.unparse(node)
    return found


@pytest.mark.parametrize("stub", STUBS, ids=[p.name for p in STUBS])
def test_solution_has_the_stub_api_and_no_todo(stub):
    solution = SOLUTIONS / stub.name

    def api(path: Path) -> list[str]:
        tree = ast.parse(path.read_text())
        return [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]

    assert api(solution) == api(stub)
    assert ast.get_docstring(ast.parse(solution.read_text())) == ast.get_docstring(
        ast.parse(stub.read_text())
    )
    assert not _not_implemented_messages(solution)
    assert not [c for c in _comments(solution) if c.startswith("TODO")]


@pytest.mark.parametrize("stub", STUBS, ids=[p.name for p in STUBS])
def test_stub_and_solution_have_the_same_docstrings_and_signatures(stub):
    """The stub is what students read, the solution what instructors maintain: an edit to
    one docstring or signature must reach the other (only function bodies may differ)."""
    stub_api = _interface(ast.parse(stub.read_text()).body)
    solution_api = _interface(ast.parse((SOLUTIONS / stub.name).read_text()).body)
    assert list(stub_api) == list(solution_api), "stub and solution define different names"
    differing = [name for name in stub_api if stub_api[name] != solution_api[name]]
    assert not differing, "\n\n".join(
        f"{name} differs:\nstub:     {stub_api[name]}\nsolution: {solution_api[name]}"
        for name in differing
    )


def test_the_interface_comparison_sees_a_changed_docstring_and_signature():
    original = _interface(ast.parse('def f(x: int) -> int:\n    """Doc."""\n').body)
    new_docstring = 'def f(x: int) -> int:\n    """Doc!"""\n'
    new_signature = 'def f(x: float) -> int:\n    """Doc."""\n'
    for edited in (new_docstring, new_signature):
        assert _interface(ast.parse(edited).body) != original
    body_only = 'def f(x: int) -> int:\n    """Doc."""\n    return x\n'
    assert _interface(ast.parse(body_only).body) == original


README_ROW = re.compile(r"^\| (\d+) \| `(task\d+_\w+\.py)` \|", re.M)


def test_exercises_readme_has_one_row_per_task():
    rows = README_ROW.findall((EXERCISES / "README.md").read_text())
    assert [(int(task), name) for task, name in rows] == list(TASK_FILES.items())


def test_grade_and_report_prints_and_returns_bool(monkeypatch, capsys):
    """A thin wrapper: print the report of grade(), return whether every check passed."""
    for results, want in [
        ([grading.CheckResult(1, "a", True), grading.CheckResult(1, "b", True)], True),
        ([grading.CheckResult(1, "a", True), grading.CheckResult(1, "b", False, "h")], False),
        ([], False),
    ]:
        monkeypatch.setattr(grading, "grade", lambda task, file, timeout, r=results: r)
        assert grading.grade_and_report(1) is want
        assert capsys.readouterr().out == grading.report(results) + "\n"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dpkit")
    grading.add_grade_command(parser.add_subparsers(dest="command"))
    return parser


def test_cli_grades_one_file_and_names_it(capsys):
    args = _parser().parse_args(["grade", "4", "--file", str(stub_of(4))])
    assert args.run(args) == 1
    printed = capsys.readouterr().out
    assert printed.startswith(f"grading task 4: {stub_of(4).resolve()}\n")
    assert grading.FAIL in printed and "hint: not implemented yet (TODO 4." in printed


@pytest.mark.parametrize(
    "argv", [["grade"], ["grade", "1", "--all"], ["grade", "--submissions", "x"]]
)
def test_cli_rejects_unclear_requests(argv, capsys):
    args = _parser().parse_args(argv)
    with pytest.raises(SystemExit) as exit_:
        args.run(args)
    assert exit_.value.code == 2


def test_unknown_task_is_a_clear_error():
    with pytest.raises(ValueError, match="there is no task 9; the tasks are 1, 2, 3"):
        grading.grade(9)


def test_run_ended_early_blames_the_running_check():
    records = [
        {"event": "collected", "nodeid": n, "task": 3, "check": n} for n in ("a", "b", "c")
    ] + [{"event": "passed", "nodeid": "a"}]
    results = grading._results(records, "timed out: stopped here", [3])
    assert [(r.passed, r.hint) for r in results] == [
        (True, ""),
        (False, "timed out: stopped here"),
        (False, "did not run: the grading run ended early"),
    ]
    assert grading._results([], "crashed", [5]) == [
        grading.CheckResult(5, "the grader runs", False, "crashed")
    ]


def test_report_lists_every_check_with_hints():
    text = grading.report(
        [grading.CheckResult(1, "sizes", True), grading.CheckResult(1, "scatter", False, "h")]
    )
    assert text.splitlines() == [
        f"  {grading.PASS} sizes",
        f"  {grading.FAIL} scatter",
        "      hint: h",
        "1/2 checks passed: keep going",
    ]
