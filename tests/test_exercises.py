"""The exercises' graders mean something: solutions pass every check, stubs fail every check.

Each grading run is a subprocess (a fresh Python that imports torch), so the graders run
once per variant: every task against the reference solutions, every task against the
untouched stubs, then a small class of submissions including one that hangs.

The tasks are discovered from the ``exercises/taskN_*.py`` files, never counted here; the
tests check that each has a solution, a grader and a row in ``exercises/README.md``, and
that stub and solution agree on everything but the bodies (docstrings, signatures).
"""

from __future__ import annotations

import argparse
import ast
import csv
import re
import shutil
import time
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


@pytest.fixture(scope="module")
def solution_results() -> list[grading.CheckResult]:
    return grading.grade_folder(SOLUTIONS)


@pytest.fixture(scope="module")
def stub_results() -> list[grading.CheckResult]:
    return grading.grade_folder(EXERCISES)


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


def test_submissions_into_csv(tmp_path):
    """One student with solutions, one with stubs, one whose file hangs at import."""
    submissions = tmp_path / "class"
    for student in ("ada", "bo", "cy"):
        (submissions / student).mkdir(parents=True)
    for task in (1, 2):
        shutil.copy(SOLUTIONS / stub_of(task).name, submissions / "ada")
        shutil.copy(stub_of(task), submissions / "bo")
    (submissions / "cy" / stub_of(1).name).write_text("while True:\n    pass\n")
    # cy has no task 2 file at all
    start = time.monotonic()
    rows = grading.grade_submissions(submissions, tasks=[1, 2], timeout=10)
    assert time.monotonic() - start < 60, "grading must stop hung code, not wait for it"
    out = tmp_path / "grades.csv"
    grading.write_csv(rows, out)
    table = list(csv.DictReader(out.open()))
    assert list(table[0]) == ["student", "task", "check", "result", "hint"]
    by = {}
    for row in table:
        by.setdefault((row["student"], row["task"]), []).append(row)
    assert {key for key in by} == {(s, t) for s in ("ada", "bo", "cy") for t in ("1", "2")}
    assert all(r["result"] == "pass" for key in [("ada", "1"), ("ada", "2")] for r in by[key])
    assert all(r["result"] == "fail" for key in [("bo", "1"), ("bo", "2")] for r in by[key])
    assert len(by[("bo", "1")]) == len(by[("ada", "1")]), "every check gets a row"
    hung = by[("cy", "1")]
    assert len(hung) == len(by[("ada", "1")])
    assert all(r["result"] == "fail" and "timed out" in r["hint"] for r in hung), hung
    assert all("file missing" in r["hint"] for r in by[("cy", "2")])


def test_grade_and_report_prints_and_returns_bool(capsys):
    assert grading.grade_and_report(1, file=SOLUTIONS / stub_of(1).name) is True
    printed = capsys.readouterr().out
    assert grading.PASS in printed and "checks passed: all checks pass" in printed


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dpkit")
    grading.add_grade_command(parser.add_subparsers(dest="command"))
    return parser


def test_cli_grades_one_file(capsys):
    args = _parser().parse_args(["grade", "4", "--file", str(stub_of(4))])
    assert args.run(args) == 1
    printed = capsys.readouterr().out
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


def test_a_one_element_gradient_for_a_scalar_piece_is_caught(tmp_path):
    """Task 4: a backward that gives a scalar piece a (1,)-shaped gradient passes if only
    .grad is checked (autograd reshapes it); the grader must name the mistake."""
    source = (SOLUTIONS / stub_of(4).name).read_text()
    wrong = source.replace("grad.view(()) if ctx.scalars else grad", "grad")
    assert wrong != source
    submission = tmp_path / stub_of(4).name
    submission.write_text(wrong)
    results = {r.check: r for r in grading.grade(4, file=submission)}
    scalar = results["a scalar piece gets a scalar gradient"]
    assert not scalar.passed and "shape ()" in scalar.hint
    assert sum(not r.passed for r in results.values()) == 1  # and only that check fails


def test_an_import_error_names_the_line_and_the_cli_names_the_file(tmp_path, capsys):
    broken = tmp_path / stub_of(1).name
    broken.write_text("import torch\n\n\ndef chunk_sizes(batch, num_devices)\n    return []\n")
    results = grading.grade(1, file=broken)
    assert all("could not be imported (line 4): SyntaxError" in r.hint for r in results)
    raising = tmp_path / "raising" / stub_of(1).name
    raising.parent.mkdir()
    raising.write_text("x = 1\ny = {}['missing']\n")
    assert all("(line 2): KeyError" in r.hint for r in grading.grade(1, file=raising))
    args = _parser().parse_args(["grade", "1", "--file", str(broken)])
    args.run(args)
    assert f"grading task 1: {broken.resolve()}" in capsys.readouterr().out
