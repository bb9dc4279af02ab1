"""Where the exercises are: the ``exercises/`` folder, its tasks, stubs and graders."""

from __future__ import annotations

import os
import re
from pathlib import Path

TASK_FILE = re.compile(r"task(\d+)_\w+\.py")  # a student file: task1_scatter.py


def find_exercises(start: str | os.PathLike[str] | None = None) -> Path:
    """The ``exercises/`` folder: under ``start``, the current directory, or dpkit's checkout."""
    package_root = Path(__file__).resolve().parents[2]
    candidates = [Path(start)] if start is not None else [Path.cwd(), package_root]
    for base in candidates:
        for folder in (base, base / "exercises"):
            if (folder / "graders").is_dir():
                return folder.resolve()
    raise FileNotFoundError(
        "cannot find the exercises/ folder (with graders/ inside) in "
        + " or ".join(str(c) for c in candidates)
        + "; run dpkit grade from the root of the dpkit checkout"
    )


def task_files(exercises: Path) -> dict[int, str]:
    """Each task's student file name (``task1_scatter.py``, ...) by task number, in order."""
    found = {}
    for path in exercises.glob("task*_*.py"):
        match = TASK_FILE.fullmatch(path.name)
        if match:
            found[int(match.group(1))] = path.name
    return dict(sorted(found.items()))


def task_numbers(exercises: Path) -> list[int]:
    """The task numbers, in order: one per ``exercises/taskN_*.py``."""
    return list(task_files(exercises))


def check_task(exercises: Path, task: int) -> None:
    """Raise a clear ValueError unless ``task`` has a stub and a grader."""
    if task not in task_files(exercises):
        known = ", ".join(map(str, task_numbers(exercises)))
        raise ValueError(f"there is no task {task}; the tasks are {known}")
    grader = exercises / "graders" / f"test_task{task}.py"
    if not grader.is_file():
        raise ValueError(f"task {task} has no grader: {grader} is missing")


def submission_file(folder: Path, file_name: str) -> Path:
    """The file graded for ``file_name`` (``task1_scatter.py``) in a student's ``folder``.

    A lone ``task1_*.py`` or ``task1.py`` also counts, for submissions whose file was renamed.
    """
    exact = folder / file_name
    prefix = file_name.split("_")[0]
    others = sorted({*folder.glob(f"{prefix}_*.py"), *folder.glob(f"{prefix}.py")})
    return others[0] if not exact.is_file() and len(others) == 1 else exact
