"""A student's copy of the course: ``make handout OUT=DIR`` (or ``python scripts/handout.py DIR``).

What the students get is the course and the exercises, nothing that gives an answer away and
nothing they cannot run:

- every file git tracks here, from the working tree, except the instructor's: the solutions,
  the test suite, the benchmarks, the instructor's guide and templates (a template solution is
  an exercise's solution), the course's own CI files and the verdict checks nbval runs here;
- in their place, from ``docs/templates/handout/``: a README for students, a CI workflow that
  runs what a student can pass (the notebooks under nbval, ``make grade``), and GitHub
  Classroom autograding with one test per task (``.github/classroom/autograding.json``,
  written here from the tasks in ``exercises/``);
- a fresh git repository with one commit: the course's history holds the solutions.

With ``--repository https://github.com/OWNER/NAME`` (``make handout OUT=DIR REPOSITORY=...``),
the address the students' copy will have: notebook 00's Colab cell installs dpkit and the
course from it, and the README gets "Open in Colab" and "Launch Binder" links to it.

Before it commits, it checks that no file equals a solution or holds one of a solution's
function bodies, and refuses to write into a folder that is not empty.
"""

from __future__ import annotations

import ast
import fnmatch
import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from dpkit.grading.layout import task_files

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "docs" / "templates" / "handout"
SOLUTIONS = ROOT / "exercises" / "solutions"

# The instructor's files (fnmatch patterns on paths relative to the root).
LEFT_OUT = (
    "exercises/solutions/*",
    "tests/*",
    "benchmarks/*",
    "docs/instructors.md",
    "docs/templates/*",
    "scripts/gpu_*",
    "scripts/handout.py",
    ".ci/*",
    ".github/*",
    ".gitlab-ci.yml",
    "notebooks/conftest.py",  # nbval's verdict checks read tests/, which stays here
    "README.md",  # the students get the template's
)
# notebook 00's Colab cell names the course's repository here (empty in the course itself)
REPOSITORY_LINE = 'COURSE_REPOSITORY = ""'
START_NOTEBOOK = Path("notebooks/00_start_here.ipynb")
POINTS_PER_TASK = 10
MINUTES_PER_TASK = 10


def tracked_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return [Path(name) for name in listed.split("\0") if name]


def handed_out(files: list[Path]) -> list[Path]:
    """``files`` without the instructor's; a file deleted from the working tree is skipped."""
    return [
        path
        for path in files
        if (ROOT / path).is_file()
        and not any(fnmatch.fnmatch(path.as_posix(), pattern) for pattern in LEFT_OUT)
    ]


def autograding(exercises: Path) -> dict:
    """GitHub Classroom's autograding tests: one per task, worth its points when every check
    of ``dpkit grade N`` passes (it exits 0 only then)."""
    tasks = task_files(exercises).items()  # the grader's own reading of taskN_*.py
    return {
        "tests": [
            {
                "name": f"task {number}: {name}",
                "setup": "",
                "run": f".venv/bin/dpkit grade {number}",
                "input": "",
                "output": "",
                "comparison": "included",
                "timeout": MINUTES_PER_TASK,
                "points": POINTS_PER_TASK,
            }
            for number, name in tasks
        ]
    }


def _function_bodies(source: str) -> list[str]:
    """The source of each function body in ``source`` longer than a couple of lines."""
    bodies = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and len(node.body) > 2:
            segment = ast.get_source_segment(source, node)
            if segment:
                bodies.append("\n".join(segment.splitlines()[1:]).strip())
    return bodies


def leaks(out: Path) -> list[str]:
    """Files in ``out`` that equal a solution or hold one of its function bodies (but for the
    ones the stub hands out too: helpers a task gives)."""
    solutions = [path.read_text() for path in sorted(SOLUTIONS.glob("*.py"))]
    stubs = "\n".join(path.read_text() for path in sorted((ROOT / "exercises").glob("task*.py")))
    bodies = [b for text in solutions for b in _function_bodies(text) if b not in stubs]
    found = []
    for path in sorted(p for p in out.rglob("*") if p.is_file() and ".git" not in p.parts):
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        if text in solutions or any(body in text for body in bodies):
            found.append(str(path.relative_to(out)))
    return found


def point_at(out: Path, repository: str) -> None:
    """Name ``repository`` in the hand-out's notebook 00 (its Colab cell) and README (links)."""
    from course_site import launch_links, parse_repository  # beside this file

    owner, name = parse_repository(repository)
    notebook = out / START_NOTEBOOK
    text = notebook.read_text(encoding="utf-8")
    escaped = json.dumps(REPOSITORY_LINE)[1:-1]  # as it stands inside the notebook's JSON
    if escaped not in text:
        raise SystemExit(f"handout: {START_NOTEBOOK} has no line {REPOSITORY_LINE} to fill in")
    filled = json.dumps(f'COURSE_REPOSITORY = "https://github.com/{owner}/{name}"')[1:-1]
    notebook.write_text(text.replace(escaped, filled, 1), encoding="utf-8")
    links = launch_links(repository, "main", START_NOTEBOOK.name)
    colab, binder = re.findall(r'href="([^"]+)"', links)
    section = (
        f"\n## In the browser\n\nNo install: [Open in Colab]({html.unescape(colab)}) (run "
        f"the first cell: it installs dpkit and the course) or [Launch Binder]"
        f"({html.unescape(binder)}) (the CPU course, ready in a few minutes).\n"
    )
    for readme in (out / "README.md", out / "notebooks" / "README.md"):
        if readme.is_file():
            readme.write_text(readme.read_text(encoding="utf-8") + section, encoding="utf-8")


def make_handout(out: Path, repository: str | None = None) -> list[Path]:
    """Write the hand-out into ``out`` (an empty or new folder); return the files written."""
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"handout: {out} is not empty; give a new or empty folder")
    files = handed_out(tracked_files())
    for path in files:
        (out / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, out / path)
    for template in sorted(p for p in TEMPLATES.rglob("*") if p.is_file()):
        target = out / template.relative_to(TEMPLATES)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(template, target)
    grading = out / ".github" / "classroom" / "autograding.json"
    grading.parent.mkdir(parents=True, exist_ok=True)
    grading.write_text(json.dumps(autograding(out / "exercises"), indent=2) + "\n")
    if repository is not None:
        point_at(out, repository)
    found = leaks(out)
    if found:
        raise SystemExit(f"handout: refused, these files give a solution away: {found}")
    git = ["git", "-c", "user.name=dpkit handout", "-c", "user.email=handout@dpkit.invalid"]
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=out, check=True)
    subprocess.run(["git", "add", "-A"], cwd=out, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "The course, handed out"], cwd=out, check=True)
    return sorted(
        p.relative_to(out) for p in out.rglob("*") if ".git" not in p.parts and p.is_file()
    )


def main(argv: list[str]) -> int:
    repository = None
    if len(argv) == 3 and argv[1] == "--repository":
        repository = argv[2]
    elif len(argv) != 1:
        print("usage: python scripts/handout.py DIR [--repository URL]", file=sys.stderr)
        return 2
    out = Path(argv[0])
    try:
        written = make_handout(out, repository)
    except ValueError as error:  # an address that is not a GitHub repository's
        print(f"handout: {error}", file=sys.stderr)
        return 2
    tasks = len(autograding(out / "exercises")["tests"])
    print(f"hand-out in {out}: {len(written)} files, {tasks} tasks, one commit, no solutions")
    print(f"next: push it as the assignment's template repository (cd {out} && git remote add ...)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
