"""Where the exercises are: the ``exercises/`` folder, its tasks, stubs and graders."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

TASK_FILE = re.compile(r"task(\d+)_\w+\.py")  # a student file: task1_scatter.py


class ExercisesNotFound(FileNotFoundError):
    """No ``exercises/`` folder: its own type, so that ``dpkit grade`` reports this one
    missing folder as such and no other missing path (an output folder) as it."""


def find_exercises(start: str | os.PathLike[str] | None = None) -> Path:
    """The ``exercises/`` folder: under ``start``, the current directory, or dpkit's checkout."""
    package_root = Path(__file__).resolve().parents[2]
    candidates = [Path(start)] if start is not None else [Path.cwd(), package_root]
    for base in candidates:
        for folder in (base, base / "exercises"):
            if (folder / "graders").is_dir():
                return folder.resolve()
    raise ExercisesNotFound(
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


def chosen_tasks(exercises: Path, tasks: Sequence[int] | None) -> list[int]:
    """The tasks to grade, in the order given (every task when ``tasks`` is None).

    A task given twice is a ValueError, not graded twice: its checks would count twice in
    the total and the summary. So is a task without a stub or a grader (:func:`check_task`).
    """
    if tasks is None:
        return task_numbers(exercises)
    chosen = list(tasks)
    twice = sorted({task for task in chosen if chosen.count(task) > 1})
    if twice:
        named = (
            f"task {twice[0]} is" if len(twice) == 1 else f"tasks {', '.join(map(str, twice))} are"
        )
        raise ValueError(f"{named} given twice: give each task once")
    for task in chosen:
        check_task(exercises, task)
    return chosen


def not_there(path: str | os.PathLike[str], folder: bool = False) -> str | None:
    """Why ``path``, named by the user, is not the file (or ``folder``) wanted, or None."""
    if not os.path.exists(path):
        return "does not exist"
    if folder and not os.path.isdir(path):
        return "is not a folder"
    if not folder and os.path.isdir(path):
        return "is a folder, not a file"
    return None


def submission_file(folder: Path, file_name: str) -> Path:
    """The file graded for ``file_name`` (``task1_scatter.py``) in a student's ``folder``.

    A lone ``task1_*.py`` or ``task1.py`` also counts, for submissions whose file was renamed.
    """
    exact = folder / file_name
    prefix = file_name.split("_")[0]
    others = sorted({*folder.glob(f"{prefix}_*.py"), *folder.glob(f"{prefix}.py")})
    return others[0] if not exact.is_file() and len(others) == 1 else exact


# --------------------------------------------------------------------------------------
# A class's submissions, as they arrive.

SKIPPED_FOLDERS = ("__MACOSX", "__pycache__")
# A task's file as students and LMS downloads name it: any case (Task1_Scatter.PY), with a
# copy's " (1)" or "-1" (a second download, a resubmission), or renamed (task1_mine.py).
_TASK = r"task(?P<task>\d+)(?:_[\w\- ]*?)?(?: ?\(\d+\)|-\d+)?\.py"
TASK_NAME = re.compile(_TASK, re.IGNORECASE)
FLAT_FILE = re.compile(rf"(?P<student>.+?)[_\-. ]+(?P<file>{_TASK})", re.IGNORECASE)
LOOKS_LIKE_WORK = re.compile(r"\.py|\.ipynb|task\d", re.IGNORECASE)  # named when not graded
SEARCH_DEPTH = 3  # folders below a student's folder searched for its files


@dataclass
class Students:
    """What :func:`find_students` found: each student's files (stub name -> a path, or a
    :class:`NotTaken` saying why none is graded), and warnings for the instructor."""

    students: dict[str, dict[str, Path | NotTaken]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


class NotTaken(str):
    """Why no file is graded for a task (two candidates, a link): the checks' hint."""


def _candidates(folder: Path, file_name: str) -> list[Path]:
    """Every file in ``folder`` and up to :data:`SEARCH_DEPTH` folders down that may be
    ``file_name``'s: its task's number in a name :data:`TASK_NAME` matches (the exact name,
    ``task1.py``, ``task1_mine.py``, ``Task1_Scatter (1).py``)."""
    task = _task_number(file_name)
    found: list[Path] = []
    level = [folder]
    for _ in range(SEARCH_DEPTH + 1):
        below = []
        for here in level:
            try:
                entries = sorted(os.scandir(here), key=lambda e: e.name)
            except OSError:
                continue
            for entry in entries:
                if entry.name.startswith((".", "__")) or entry.name in SKIPPED_FOLDERS:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    below.append(Path(entry.path))
                elif _task_number(entry.name) == task:
                    found.append(Path(entry.path))
        level = below
    return found


def _task_number(file_name: str) -> int | None:
    match = TASK_NAME.fullmatch(file_name)
    return int(match["task"]) if match else None


def _pick(student: str, root: Path, file_name: str, found: Students) -> Path | NotTaken | None:
    candidates = _candidates(root, file_name)
    if not candidates:
        return None
    if len(candidates) > 1:
        names = ", ".join(str(c.relative_to(root.parent)) for c in candidates[:4])
        found.warnings.append(f"{student}: two or more files could be {file_name}: {names}")
        return NotTaken(
            f"two or more files could be {file_name} ({names}): keep one and grade again"
        )
    chosen = candidates[0]
    if chosen.parent != root or chosen.name != file_name:
        found.warnings.append(f"{student}: graded {chosen.relative_to(root.parent)} as {file_name}")
    return chosen


def find_students(root: Path, names: dict[int, str]) -> Students:
    """Each student's files in ``root``, in the layouts an LMS download has:

    - a folder per student, ``root/ada/task1_scatter.py``, the files possibly a few folders
      down (``root/ada/submission/task1_scatter.py``, as a zip unpacks) or renamed
      (``task1_mine.py``, ``task1.py``);
    - one flat folder, ``root/ada_task1_scatter.py`` (the student's name or id, then ``_``,
      ``-`` or a space, then the task file's name, or ``taskN.py``).

    Either way a name may differ in case, end in a copy's `` (1)`` or ``-1``, and use ``.``
    before the task in a flat name (``kim.task1.py``); a warning names each file graded as a
    task's that is not the task's file name where it belongs. Two files that could both be one
    task's, the exact name among them, are an error for that task (no file is guessed); a
    student folder that is a symbolic link is not followed; a flat file that looks like work
    (``.py``, ``.ipynb``, ``taskN``) but is no task's is named in a warning.
    """
    found = Students()
    entries = sorted(os.scandir(root), key=lambda e: e.name)
    for entry in entries:
        if entry.name.startswith((".", "__")) or entry.name in SKIPPED_FOLDERS:
            continue
        if entry.is_symlink() and entry.is_dir():
            why = NotTaken(f"the folder {entry.name} is a symbolic link, which grading refuses")
            found.students[entry.name] = {name: why for name in names.values()}
            found.warnings.append(f"{entry.name}: a symbolic link, not followed")
        elif entry.is_dir(follow_symlinks=False):
            files = {}
            for name in names.values():
                picked = _pick(entry.name, Path(entry.path), name, found)
                if picked is not None:
                    files[name] = picked
            found.students[entry.name] = files
    flat: dict[str, dict[str, list[Path]]] = {}
    by_number = {str(task): name for task, name in names.items()}
    for entry in entries:
        if entry.name.startswith(".") or entry.is_dir(follow_symlinks=False):
            continue
        match = FLAT_FILE.fullmatch(entry.name)
        name = by_number.get(str(int(match["task"]))) if match else None
        if name is not None:
            files = flat.setdefault(match["student"], {})
            files.setdefault(name, []).append(Path(entry.path))
        elif LOOKS_LIKE_WORK.search(entry.name):
            found.warnings.append(
                f"{entry.name}: not graded, no task's file (name it student_taskN_*.py, "
                f"N one of {', '.join(by_number)}, or put it in a folder per student)"
            )
    for student, files in flat.items():
        if student in found.students:
            found.warnings.append(f"{student}: has a folder and flat files; the folder is graded")
            continue
        chosen: dict[str, Path | NotTaken] = {}
        for name, paths in files.items():
            if len(paths) > 1:
                listed = ", ".join(p.name for p in paths[:4])
                found.warnings.append(f"{student}: two or more files could be {name}: {listed}")
                chosen[name] = NotTaken(f"two or more files could be {name} ({listed})")
            else:
                chosen[name] = paths[0]
                # Named as in a student's folder: a file under another name is graded as
                # the task's, and the instructor is told which file that was.
                if FLAT_FILE.fullmatch(paths[0].name)["file"] != name:
                    found.warnings.append(f"{student}: graded {paths[0].name} as {name}")
        found.students[student] = chosen
    found.students = dict(sorted(found.students.items()))
    return found
