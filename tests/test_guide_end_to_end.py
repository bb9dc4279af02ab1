"""The instructor's guide followed to the end: a notebook and an exercise added, committed,
and the whole ``make test`` green in that clone (``make test-guide``; issue 31).

``tests/test_instructor_kit.py`` runs each of make test's checks on the new files within CI's
budget; this test runs ``make test`` itself, so a check that finds notebooks or tasks in a way
the guide does not prepare for (a test list, a README table, a figure's text alternative, a
wrong answer per task) fails here. It takes as long as ``make test`` and one notebook's run,
so it is skipped unless ``DPKIT_SLOW=1``, and it is in neither ``make test`` nor CI.

Every step is read from ``docs/instructors.md`` in the clone and run as written: the ``cp``
of the notebook template, its row in ``notebooks/README.md``, ``make notebooks
NOTEBOOKS=...``, the commands that fill in the exercise templates, the exercise's row, the
``Wrong`` entry, and the commit. Only "write it" is the test's own: each placeholder the
template names is replaced by a sentence. The clone is of the last commit, and it shares this
interpreter's environment (``.venv`` is a link to it, left as up to date as in the checkout,
and the clone's own dpkit comes first on ``PYTHONPATH``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
GUIDE = Path("docs") / "instructors.md"
NOTEBOOK_TOPIC = "guide_check"
MAKE_TEST_TIMEOUT = 45 * 60  # seconds; make test takes 6-8 minutes on 2 cores

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("DPKIT_SLOW") != "1",
        reason="runs the whole make test in a clone (10-20 minutes): make test-guide, or "
        "DPKIT_SLOW=1",
    ),
]


def guide_step(guide: str, pattern: str) -> str:
    """The one passage of the guide that ``pattern``'s group matches: the step as written."""
    found = re.findall(pattern, guide, re.S)
    assert len(found) == 1, f"docs/instructors.md: {len(found)} matches for the step {pattern!r}"
    return found[0]


def insert_row(table_file: Path, row: str, last_row: str) -> None:
    """``row`` after the last line of ``table_file`` that matches ``last_row``."""
    lines = table_file.read_text().splitlines()
    at = max(i for i, line in enumerate(lines) if re.match(last_row, line))
    lines.insert(at + 1, row)
    table_file.write_text("\n".join(lines) + "\n")


def clone_module(path: Path) -> ModuleType:
    """A test module of the clone, imported under a name of its own (registered, as its
    dataclasses need)."""
    spec = importlib.util.spec_from_file_location(f"clone_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def write_notebook(path: Path, placeholders: list[str], number: str) -> None:
    """The instructor's writing, reduced to what the checks read: every placeholder the
    template names replaced by a sentence (an issue link stays a link)."""
    notebook = json.loads(path.read_text())
    for cell in notebook["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        text = "".join(cell["source"])
        text = re.sub(r"<!--.*?-->\n*", "", text, flags=re.S)
        text = text.replace("NN · Title", f"{number} · Guide check")
        for placeholder in filter(lambda p: p.startswith("*"), placeholders):
            # the template's spans may break across lines: match any whitespace between words
            spread = r"\s+".join(map(re.escape, placeholder.split()))
            sentence = "A sentence the instructor wrote."
            if "pytorch/pytorch#" in placeholder:
                sentence = (
                    "[pytorch/pytorch#7092](https://github.com/pytorch/pytorch/issues/7092): "
                    "a report this notebook would explain."
                )
            text = re.sub(spread, sentence, text)
        cell["source"] = text.splitlines(keepends=True)
    path.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")


def environment(work: Path) -> dict[str, str]:
    """This environment without what would point the clone's tests elsewhere or make them
    recurse into this test, with the clone's dpkit first and a git identity to commit with
    (the variables win over any git configuration)."""
    # (MAKEFLAGS would hand make test-guide's variables and options to every make in the clone)
    dropped = ("PYTEST_", "DPKIT_SLOW", "DPKIT_BROWSER_NOTEBOOKS", "DPKIT_EXERCISE_",
               "DPKIT_GRADE_RESULTS", "PYTHONPATH", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    env.update(
        PYTHONPATH=str(work / "dpkit"),
        GIT_AUTHOR_NAME="Guide Test",
        GIT_AUTHOR_EMAIL="guide@example.invalid",
        GIT_COMMITTER_NAME="Guide Test",
        GIT_COMMITTER_EMAIL="guide@example.invalid",
    )
    return env


def test_the_guide_followed_in_a_clone_keeps_make_test_green(tmp_path):
    venv = Path(sys.prefix)
    if not (venv / "bin" / "jupyter").exists() or shutil.which("make") is None:
        pytest.skip("needs the course environment (.venv with jupyter) and GNU make")
    clone = tmp_path / "dpkit"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=300)
    env = environment(tmp_path)
    # The clone's .venv is this environment, as up to date as in the checkout: its install
    # stamps stay newer than the clone's requirement files, so no make in it (nor any a test
    # starts) reinstalls; .venv is a link, which .gitignore's `.venv/` does not cover.
    (clone / ".venv").symlink_to(venv, target_is_directory=True)
    with (clone / ".git" / "info" / "exclude").open("a") as exclude:
        exclude.write(".venv\n")
    for name in ("pyproject.toml", *(p.name for p in (ROOT / "requirements").glob("*.txt"))):
        original = ROOT / name if name == "pyproject.toml" else ROOT / "requirements" / name
        copied = clone / original.relative_to(ROOT)
        if copied.exists():
            os.utime(copied, (original.stat().st_atime, original.stat().st_mtime))
    make = ["make", "--no-print-directory"]
    planned = subprocess.run([*make, "-n", "test"], cwd=clone, env=env, capture_output=True,
                             text=True, timeout=120)  # fmt: skip
    assert "pip install" not in planned.stdout, f"make would reinstall .venv:\n{planned.stdout}"

    def run(command: str | list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
        shell = isinstance(command, str)
        args = ["bash", "-euo", "pipefail", "-c", command] if shell else command
        done = subprocess.run(args, cwd=clone, env=env, capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
        assert done.returncode == 0, f"{command}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        return done

    guide = (clone / GUIDE).read_text()

    # Add a notebook: copy the template to the next number, its row, write it, run it.
    numbers = [int(p.name[:2]) for p in (clone / "notebooks").glob("[0-9][0-9]_*.ipynb")]
    name = f"{max(numbers) + 1:02d}_{NOTEBOOK_TOPIC}"
    copy = guide_step(
        guide, r"`(cp docs/templates/notebook_template\.ipynb notebooks/NN_topic\.ipynb)`"
    )
    run(copy.replace("NN_topic", name))
    notebook_row = guide_step(guide, r"``(\| `NN_topic` \| [^`]*\|)``")
    insert_row(clone / "notebooks" / "README.md", notebook_row.replace("NN_topic", name),
               r"\| `\d\d_")  # fmt: skip
    kit = clone_module(clone / "tests" / "test_instructor_kit.py")  # its placeholder finder
    notebook = clone / "notebooks" / f"{name}.ipynb"
    assert kit.placeholders_left(notebook), "the template's placeholders went unnoticed"
    write_notebook(notebook, kit.template_placeholders(), name[:2])
    assert kit.placeholders_left(notebook) == []
    make_notebook = guide_step(guide, r"`(make notebooks NOTEBOOKS=notebooks/NN_topic\.ipynb)`")
    started = time.monotonic()
    run([*make, *make_notebook.replace("NN_topic", name).split()[1:]])
    notebook_seconds = time.monotonic() - started

    # Add an exercise: the guide's commands for task 8, its row, its wrong answer, the commit.
    fill = guide_step(guide, r"```bash\n(n=\d+ topic=\w+ .*?fill\(\).*?)```")
    task, topic = re.match(r"n=(\d+) topic=(\w+)", fill).groups()
    tasks = [int(m[1]) for p in (clone / "exercises").glob("task*_*.py")
             if (m := re.match(r"task(\d+)_", p.name))]  # fmt: skip
    assert int(task) == max(tasks) + 1, f"the guide adds task {task}, the next is {max(tasks) + 1}"
    run(fill)
    exercise_row = guide_step(guide, r"add the row ``(\| \d+ \| `task\d+_\w+\.py` \| [^`]*\|)``")
    insert_row(clone / "exercises" / "README.md", exercise_row, r"\| \d+ \| `task")
    wrong = guide_step(guide, r"```python\n(\s*Wrong\(\n.*?\n\s*\),\n)\s*```")
    wrong_file = clone / "tests" / "test_exercises_wrong_answers.py"
    source = wrong_file.read_text()
    end = re.search(r"^WRONG = \[\n.*?^\]\n", source, re.S | re.M)
    assert end, "tests/test_exercises_wrong_answers.py has no WRONG list"
    entry = "\n".join(line[2:] if line.startswith("  ") else line for line in wrong.splitlines())
    wrong_file.write_text(source[: end.end() - 2] + entry + "\n" + source[end.end() - 2 :])
    commit = guide_step(guide, r"```bash\n( *git add [^\n]*\n *git commit [^\n]*\n) *```")
    run(textwrap.dedent(commit))
    status = run(["git", "status", "--porcelain"]).stdout
    assert status == "", f"the guide's commit left files out:\n{status}"
    assert f"task{task}_{topic}.py" in run(["git", "show", "--stat", "HEAD"]).stdout

    # The whole make test, as the README says to run it.
    log = Path(os.environ.get("DPKIT_GUIDE_LOG") or tmp_path / "make-test.log")
    started = time.monotonic()
    with log.open("w") as out:
        made = subprocess.run(
            [*make, "test", "PYTEST_ARGS=-rA"],
            cwd=clone,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=MAKE_TEST_TIMEOUT,
        )
    seconds = time.monotonic() - started
    output = log.read_text()
    summary = "\n".join(output.splitlines()[-60:])
    print(f"make notebooks for {name}: {notebook_seconds:.0f} s; make test: {seconds:.0f} s")
    assert made.returncode == 0, f"make test failed in the clone ({seconds:.0f} s):\n{summary}"
    # The new files were among what it ran, not skipped.
    for test_id in (
        f"tests/test_notebooks.py::test_shows_a_figure[{name}]",
        f"tests/test_exercises.py::test_solutions_pass_every_check[{task}]",
        f"tests/test_exercises.py::test_stubs_fail_every_check[{task}]",
        "tests/test_exercises_wrong_answers.py::test_a_wrong_answer_fails_its_checks_with_its_hint"
        "[the replicas' means averaged without their rows]",
    ):
        assert any(line.startswith("PASSED") and test_id in line for line in output.splitlines()), (
            f"make test did not pass {test_id}:\n{summary}"
        )
