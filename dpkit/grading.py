"""Grading the exercises: ``dpkit grade N``, ``grade_and_report(N)``, a class into a CSV.

The surprise first: the graders never run inside the caller's process. Each grading run is
a fresh ``python -m pytest`` over ``exercises/graders/`` in its own process group, with a
wall-clock limit; student code that hangs or crashes is stopped and reported as failed
checks, and the caller (a terminal, a notebook kernel, an instructor's loop over a class)
never hangs. Inside, every check also has its own time limit (see
``exercises/graders/conftest.py``), so one endless loop fails one check, not the run.

Commands (offline, no GPU needed)::

    dpkit grade 1                               # your exercises/task1_scatter.py
    dpkit grade 1 --file my_task1.py            # another file
    dpkit grade --all                           # every task in exercises/
    dpkit grade --submissions class/ --csv grades.csv   # class/<student>/taskN_*.py

From a notebook cell: ``from dpkit.grading import grade_and_report; grade_and_report(1)``.

The tasks are whatever ``exercises/taskN_*.py`` files there are (:func:`task_files`):
adding a task means adding its stub, its solution in ``solutions/``, its grader
``graders/test_taskN.py`` and its row in ``exercises/README.md`` (``tests/test_exercises.py``
checks that all four are there), and nothing else.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PASS, FAIL = "\u2713", "\u2717"  # check mark, ballot x


@dataclass(frozen=True)
class CheckResult:
    """One grader check: its task, its friendly name, whether it passed, and a hint if not."""

    task: int
    check: str
    passed: bool
    hint: str = ""


# --------------------------------------------------------------------------------------
# Where the exercises are.


def find_exercises(start: str | os.PathLike[str] | None = None) -> Path:
    """The ``exercises/`` folder: under ``start``, the current directory, or dpkit's checkout."""
    package_root = Path(__file__).resolve().parent.parent
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


TASK_FILE = re.compile(r"task(\d+)_\w+\.py")  # a student file: task1_scatter.py


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


def _grader(exercises: Path, task: int) -> Path:
    grader = exercises / "graders" / f"test_task{task}.py"
    if task not in task_files(exercises):
        known = ", ".join(map(str, task_numbers(exercises)))
        raise ValueError(f"there is no task {task}; the tasks are {known}")
    if not grader.is_file():
        raise ValueError(f"task {task} has no grader: {grader} is missing")
    return grader


# --------------------------------------------------------------------------------------
# Running graders in a subprocess and reading what they wrote.


def _check_timeout(timeout: float) -> float:
    """Each check's own limit: a share of the run's, so a hang leaves time for the rest."""
    return max(1.0, min(5.0, timeout / 2))


def _kill(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the pytest process and any threads it made
    except (AttributeError, ProcessLookupError, PermissionError):  # no process groups
        process.kill()


def _read_records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a kill
            pass
    return records


def _results(records: list[dict], stopped: str | None, tasks: Sequence[int]) -> list[CheckResult]:
    """Per-check results from the JSON lines; ``stopped`` says why a run ended early.

    The first check without an outcome is the one that was running when the run ended, so
    it carries ``stopped``; the checks after it never ran.
    """
    collected = [r for r in records if r["event"] == "collected"]
    if not collected:
        why = stopped or "the grader collected no checks"
        return [CheckResult(task, "the grader runs", False, why) for task in tasks]
    failures: dict[str, str] = {}
    passed: set[str] = set()
    for record in records:
        if record["event"] == "failed":
            failures.setdefault(record["nodeid"], record["hint"])
        elif record["event"] == "passed":
            passed.add(record["nodeid"])
    results = []
    in_flight = True
    for check in collected:
        nodeid = check["nodeid"]
        if nodeid in failures:
            result = CheckResult(check["task"], check["check"], False, failures[nodeid])
        elif nodeid in passed:
            result = CheckResult(check["task"], check["check"], True)
        else:
            hint = stopped if in_flight and stopped else "did not run: the grading run ended early"
            in_flight = False
            result = CheckResult(check["task"], check["check"], False, hint)
        results.append(result)
    return results


def _run_graders(
    tasks: Sequence[int], exercises: Path, environment: dict[str, str], timeout: float
) -> list[CheckResult]:
    graders = [str(_grader(exercises, task)) for task in tasks]
    limit = timeout * len(tasks)
    with tempfile.TemporaryDirectory(prefix="dpkit-grade-") as scratch:
        records_path = Path(scratch) / "results.jsonl"
        env = {k: v for k, v in os.environ.items() if not k.startswith("DPKIT_EXERCISE_")}
        package_root = str(Path(__file__).resolve().parent.parent)
        env.update(
            DPKIT_GRADE_RESULTS=str(records_path),
            DPKIT_CHECK_TIMEOUT=str(_check_timeout(timeout)),
            PYTHONDONTWRITEBYTECODE="1",
            PYTHONPATH=os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")])),
            **environment,
        )
        command = [sys.executable, "-m", "pytest", *graders, "-q", "-p", "no:cacheprovider"]
        process = subprocess.Popen(
            command,
            cwd=exercises.parent,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a process group of its own, killed as one
        )
        try:
            process.communicate(timeout=limit)
            stopped = None
            if process.returncode not in (0, 1):  # 0: all passed, 1: some failed
                stopped = (
                    f"crashed: the grading process ended here (exit code {process.returncode}); "
                    "does your code call sys.exit() or os._exit(), or crash Python?"
                )
        except subprocess.TimeoutExpired:
            _kill(process)
            process.communicate()
            stopped = (
                f"timed out: grading was stopped here after {limit:g} s; does your code loop "
                "forever or wait for a thread that never finishes?"
            )
        return _results(_read_records(records_path), stopped, tasks)


def grade(
    task: int, file: str | os.PathLike[str] | None = None, timeout: float = 60.0
) -> list[CheckResult]:
    """Run task ``task``'s grader on ``file`` (default: the student file in exercises/).

    Never raises for anything the graded code does and never runs longer than ``timeout``
    seconds (plus a second or two to start): a hang, a crash or a missing file gives failed
    checks whose hints say so.
    """
    exercises = find_exercises()
    environment = {} if file is None else {"DPKIT_EXERCISE_FILE": str(Path(file).resolve())}
    return _run_graders([task], exercises, environment, timeout)


def grade_folder(
    folder: str | os.PathLike[str],
    tasks: Sequence[int] | None = None,
    timeout: float = 60.0,
) -> list[CheckResult]:
    """Grade the ``taskN_*.py`` files in ``folder`` (one process for all tasks).

    ``timeout`` is per task. A task whose file is missing fails every check with
    "file missing".
    """
    exercises = find_exercises()
    tasks = task_numbers(exercises) if tasks is None else list(tasks)
    environment = {"DPKIT_EXERCISE_DIR": str(Path(folder).resolve())}
    return _run_graders(tasks, exercises, environment, timeout)


# --------------------------------------------------------------------------------------
# Reports.


def report(results: Sequence[CheckResult]) -> str:
    """A friendly report: a line per check (with a hint under each failure) and the total."""
    lines = []
    tasks = sorted({r.task for r in results})
    for task in tasks:
        mine = [r for r in results if r.task == task]
        if len(tasks) > 1:
            lines.append(f"Task {task}: {sum(r.passed for r in mine)}/{len(mine)} checks passed")
        for result in mine:
            lines.append(f"  {PASS if result.passed else FAIL} {result.check}")
            if not result.passed and result.hint:
                lines.append(f"      hint: {result.hint}")
    passed = sum(r.passed for r in results)
    verdict = "all checks pass" if passed == len(results) else "keep going"
    lines.append(f"{passed}/{len(results)} checks passed: {verdict}")
    return "\n".join(lines)


def grade_and_report(
    task: int, file: str | os.PathLike[str] | None = None, timeout: float = 60.0
) -> bool:
    """For a notebook cell: grade task ``task``, print the report, return whether all passed."""
    results = grade(task, file, timeout)
    print(report(results))
    return bool(results) and all(r.passed for r in results)


def grade_submissions(
    folder: str | os.PathLike[str],
    tasks: Sequence[int] | None = None,
    timeout: float = 60.0,
) -> list[tuple[str, CheckResult]]:
    """Grade ``folder/<student>/taskN_*.py`` for every student: ``(student, result)`` rows."""
    root = Path(folder)
    if not root.is_dir():
        raise ValueError(f"submissions folder {str(root)!r} does not exist")
    students = sorted(
        p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))
    )
    if not students:
        raise ValueError(f"{str(root)!r} holds no student folders (one folder per student)")
    return [
        (student.name, result)
        for student in students
        for result in grade_folder(student, tasks, timeout)
    ]


def write_csv(rows: Sequence[tuple[str, CheckResult]], path: str | os.PathLike[str]) -> None:
    """One line per student and check: student, task, check, result (pass/fail), hint."""
    with open(path, "w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(["student", "task", "check", "result", "hint"])
        for student, r in rows:
            writer.writerow([student, r.task, r.check, "pass" if r.passed else "fail", r.hint])


# --------------------------------------------------------------------------------------
# The command line: `dpkit grade`.


def _grade_command(args: argparse.Namespace) -> int:
    try:
        return _grade(args)
    except FileNotFoundError as error:  # no exercises/ folder here
        print(f"dpkit grade: error: {error}", file=sys.stderr)
        return 2


def _grade(args: argparse.Namespace) -> int:
    chosen = [args.task is not None, args.all, args.submissions is not None]
    if sum(chosen) != 1:
        args.grade_parser.error("give one of: a task number, --all, or --submissions DIR")
    if args.submissions is not None and args.csv is None:
        args.grade_parser.error("--submissions needs --csv OUT.csv")
    if args.file is not None and args.task is None:
        args.grade_parser.error("--file grades one task: give its number, e.g. dpkit grade 1")
    if args.submissions is not None:
        rows = grade_submissions(args.submissions, args.tasks, args.timeout)
        write_csv(rows, args.csv)
        for student in dict.fromkeys(student for student, _ in rows):
            mine = [r for s, r in rows if s == student]
            print(f"{student}: {sum(r.passed for r in mine)}/{len(mine)} checks passed")
        print(f"wrote {len(rows)} rows to {args.csv}")
        return 0
    if args.all:
        folder = args.dir if args.dir is not None else find_exercises()
        results = grade_folder(folder, args.tasks, args.timeout)
    else:
        # Say which file: run outside a checkout, the default is the checkout's own stub.
        exercises = find_exercises()
        default = exercises / task_files(exercises).get(args.task, f"task{args.task}")
        graded = Path(args.file) if args.file else default
        print(f"grading task {args.task}: {graded.resolve()}")
        results = grade(args.task, args.file, args.timeout)
    print(report(results))
    return 0 if results and all(r.passed for r in results) else 1


def add_grade_command(commands: argparse._SubParsersAction) -> None:
    """Add ``dpkit grade`` to the ``dpkit`` command's subcommands."""
    grade_parser = commands.add_parser(
        "grade",
        help="grade an exercise: pass/fail per check, with hints",
        description="Grade the exercises in exercises/ (offline; hung code is stopped).",
        epilog="examples: dpkit grade 1 | dpkit grade 3 --file mine.py | dpkit grade --all | "
        "dpkit grade --submissions class/ --csv grades.csv",
    )
    grade_parser.add_argument(
        "task", nargs="?", type=int, help="the task number: N of exercises/taskN_*.py"
    )
    grade_parser.add_argument("--file", help="grade this file (default: exercises/taskN_*.py)")
    grade_parser.add_argument("--all", action="store_true", help="grade every task")
    grade_parser.add_argument("--dir", help="with --all: the folder of taskN_*.py files")
    grade_parser.add_argument(
        "--submissions", metavar="DIR", help="grade DIR/<student>/taskN_*.py for every student"
    )
    grade_parser.add_argument("--csv", metavar="OUT.csv", help="with --submissions: the CSV")
    grade_parser.add_argument(
        "--tasks", type=int, nargs="+", metavar="N", help="with --all or --submissions: only these"
    )
    grade_parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds allowed per task (default 60)"
    )
    grade_parser.set_defaults(run=_grade_command, grade_parser=grade_parser)
