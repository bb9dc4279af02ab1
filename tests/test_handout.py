"""make handout OUT=DIR: a student's copy without solutions or history, whose own CI runs.

The hand-out is built in a temporary folder; its CI workflow's steps then run there: grading
task 1, and the notebooks' nbval step planned (its notebooks are this course's, which ``make
test`` runs under nbval; every grader against its stub is run there too).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = sorted((ROOT / "exercises" / "solutions").glob("*.py"))
REPOSITORY = "https://github.com/example-school/dp-course"  # where a class's copy would live
sys.path.insert(0, str(ROOT / "scripts"))

import handout  # noqa: E402

from dpkit.grading.layout import task_files  # noqa: E402


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("handout") / "course"
    made = subprocess.run([sys.executable, str(ROOT / "scripts" / "handout.py"), str(folder),
                           "--repository", REPOSITORY], capture_output=True, text=True)  # fmt: skip
    assert made.returncode == 0, made.stderr
    return folder


def _files(folder: Path) -> list[Path]:
    return [
        p for p in folder.rglob("*") if p.is_file() and ".git" not in p.relative_to(folder).parts
    ]


def test_no_solution_is_handed_out_in_any_file_or_in_the_history(out):
    assert SOLUTIONS, "the course's solutions are where this test looks for them"
    answers = {path.read_text() for path in SOLUTIONS}
    template = ROOT / "docs" / "templates" / "exercise" / "solutions" / "taskN_topic.py"
    answers.add(template.read_text())
    files = _files(out)
    assert not [p for p in files if "solution" in p.relative_to(out).as_posix()]
    assert not [p for p in files if p.suffix == ".py" and p.read_text() in answers]
    assert not (out / "tests").exists() and not (out / "benchmarks").exists()
    log = subprocess.run(["git", "log", "--oneline", "--all"], cwd=out, capture_output=True,
                         text=True, check=True).stdout.splitlines()  # fmt: skip
    assert len(log) == 1, log


def test_every_task_is_handed_out_with_its_grader_and_its_classroom_points(out):
    tasks = task_files(ROOT / "exercises")
    assert task_files(out / "exercises") == tasks
    for number in tasks:
        assert (out / "exercises" / "graders" / f"test_task{number}.py").is_file()
    grading = json.loads((out / ".github" / "classroom" / "autograding.json").read_text())
    assert [t["run"] for t in grading["tests"]] == [f".venv/bin/dpkit grade {n}" for n in tasks]
    assert {t["points"] for t in grading["tests"]} == {10}


def test_a_planted_solution_is_refused(tmp_path, monkeypatch):
    planted = tmp_path / "out"
    monkeypatch.setattr(handout, "LEFT_OUT", tuple(p for p in handout.LEFT_OUT
                                                 if p != "exercises/solutions/*"))  # fmt: skip
    with pytest.raises(SystemExit, match="give a solution away.*solutions/task1_scatter.py"):
        handout.make_handout(planted)


def test_the_handouts_workflows_pass_actionlint(out):
    from test_instructor_kit import lint_workflow

    for workflow in sorted((out / ".github" / "workflows").glob("*.yml")):
        result = lint_workflow(workflow)
        assert result.returncode == 0, f"{workflow.name}:\n{result.stdout}{result.stderr}"


def test_the_students_ci_runs_there(out):
    """The course workflow's steps, in the hand-out, with this environment's packages (the
    hand-out's own dpkit first on the path): grading runs and gives the untouched stub 0 points
    (exit 1: not every check passes, as the workflow expects), and the notebooks' step is the
    nbval command make test runs here (its notebooks are this course's, byte for byte, so
    make test's own nbval run stands for running it again)."""
    steps = (out / ".github" / "workflows" / "course.yml").read_text()
    assert "run: make check-notebooks" in steps and "run: make grade" in steps
    (out / ".venv").symlink_to(Path(sys.executable).parent.parent)
    # never reinstall into this environment (it would point dpkit at the hand-out)
    make = ["make", "-o", ".venv/.dpkit-installed", "-o", ".venv/.dpkit-test-tools-installed"]
    env = {**os.environ, "PYTHONPATH": str(out)}
    planned = subprocess.run([*make, "-n", "check-notebooks"], cwd=out, env=env,
                             capture_output=True, text=True)  # fmt: skip
    assert planned.returncode == 0 and "--nbval" in planned.stdout, planned.stdout
    assert "pip install" not in planned.stdout
    for notebook in (ROOT / "notebooks").glob("*.ipynb"):
        handed = (out / "notebooks" / notebook.name).read_text()  # but the repository named
        assert handed.replace(REPOSITORY, "") == notebook.read_text(), notebook.name
    graded = subprocess.run([*make, "grade", "TASKS=1"], cwd=out, env=env,
                            capture_output=True, text=True)  # fmt: skip
    assert graded.returncode != 0, graded.stdout
    assert re.search(r"\b0/\d+ checks passed", graded.stdout), graded.stdout


def _start_tree(tmp_path: Path) -> Path:
    (tmp_path / "notebooks").mkdir()
    notebook = ROOT / "notebooks" / "00_start_here.ipynb"
    (tmp_path / "notebooks" / notebook.name).write_bytes(notebook.read_bytes())
    (tmp_path / "README.md").write_text("# The course\n")
    return tmp_path


def test_a_handout_for_a_repository_sets_up_colab_and_links_to_it(out):
    """With --repository, notebook 00's Colab cell installs from that repository and the
    students' README opens notebook 00 there on Colab and Binder."""
    import nbformat

    tree = out
    cells = nbformat.read(tree / "notebooks" / "00_start_here.ipynb", 4).cells
    colab = next(cell for cell in cells if cell.get("id") == "colab")
    assert 'COURSE_REPOSITORY = "https://github.com/example-school/dp-course"' in colab.source
    for readme in (tree / "README.md", tree / "notebooks" / "README.md"):
        text = readme.read_text()
        assert ("https://colab.research.google.com/github/example-school/dp-course/blob/main/"
                "notebooks/00_start_here.ipynb") in text  # fmt: skip
        assert "https://mybinder.org/v2/gh/example-school/dp-course/main?labpath=" in text


def test_the_course_itself_names_no_repository_and_its_colab_cell_does_nothing_elsewhere():
    import nbformat

    cells = nbformat.read(ROOT / "notebooks" / "00_start_here.ipynb", 4).cells
    colab = next(cell for cell in cells if cell.get("id") == "colab")
    assert handout.REPOSITORY_LINE in colab.source
    assert 'if "google.colab" in sys.modules:' in colab.source
    assert [o.get("text") for o in colab.outputs] == ["Not on Colab: nothing to set up here.\n"]


def test_a_handout_for_an_address_not_on_github_is_refused(tmp_path):
    tree = _start_tree(tmp_path)
    with pytest.raises(ValueError, match="https://github.com/OWNER/NAME"):
        handout.point_at(tree, "gitlab.com/x/y")
