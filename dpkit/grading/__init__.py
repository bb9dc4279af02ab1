"""Grading the exercises: ``dpkit grade N``, ``grade_and_report(N)``, a class into a CSV.

The surprise first: the graders never run inside the caller's process, nor where the
checkout is. Each grading run is a fresh process in a temporary folder (a private copy of
dpkit and the graders, the submission, an empty home; the reference solutions are not
there), with a memory cap and a wall-clock limit, in a session of its own; when it ends,
every process it started is killed. Its results count only when signed with a key the
student's code never sees before it runs (:mod:`dpkit.grading.harness`), so results
written to a file, an early ``os._exit(0)`` or a patched pytest score nothing; an audit
hook the student's code cannot remove refuses trace hooks, gc and ctypes
(:mod:`dpkit.grading.warden`). The threat model (students in a class, not an attacker
with root) is in ``docs/instructors.md``.

Commands (offline, no GPU needed)::

    dpkit grade 1                               # your exercises/task1_scatter.py
    dpkit grade 1 --file my_task1.py            # another file
    dpkit grade --all                           # every task in exercises/
    dpkit grade --submissions class/ --csv grades.csv   # class/<student>/taskN_*.py
    dpkit grade --submissions class/ --csv grades.csv --jobs 4 --feedback out/

From a notebook cell: ``from dpkit.grading import grade_and_report; grade_and_report(1)``.

The tasks are whatever ``exercises/taskN_*.py`` files there are (:func:`task_files`):
adding a task means adding its stub, its solution in ``solutions/``, its grader
``graders/test_taskN.py`` and its row in ``exercises/README.md`` (``tests/test_exercises.py``
checks that all four are there), and nothing else.

Files: ``layout`` (where the tasks and a class's files are), ``sandbox`` (one run: copies,
processes, the signed channel, a fresh process after a crash), ``apart`` (a class's runs in
namespaces), ``forkserver`` (a class's runs forked with torch imported), ``cleanup``
(removing a run's folder), ``harness`` (the grading process), ``warden`` (its one-way audit
hook), ``fence`` (its seccomp filter: no signals, tracing or memory access outside the
run), ``roster`` (the list of checks, read from the graders' text: what is scored),
``decided`` (checks the parent decides from the outputs sent back; its judges of returned
tensors, numbers, gradients, task 6's sizes and shapes are in ``outputs``, ``counted``,
``gradients``, ``weighted`` and ``shapes``), ``rules`` (each
task's forbidden calls), ``checks`` (helpers for graders), ``results`` (report, CSVs,
feedback), ``similarity`` (copied code), ``command`` (the CLI).
The threat model is in ``docs/instructors.md``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dpkit.grading import apart, forkserver
from dpkit.grading.cleanup import remove_tree
from dpkit.grading.command import add_grade_command as add_grade_command
from dpkit.grading.layout import (
    chosen_tasks,
    find_exercises,
    find_students,
    not_there,
    submission_file,
    task_files,
)
from dpkit.grading.layout import task_numbers as task_numbers
from dpkit.grading.results import (
    FAIL,
    PASS,
    CheckResult,
    clean_text,
    read_weights,
    report,
    results_from_records,
    write_csv,
    write_feedback,
    write_summary,
)
from dpkit.grading.results import check_folder_writable as check_folder_writable
from dpkit.grading.results import check_writable as check_writable
from dpkit.grading.results import clean_cell as clean_cell
from dpkit.grading.results import summary_rows as summary_rows
from dpkit.grading.sandbox import (
    STOP,
    Trusted,
    read_submission,
    read_trusted,
    run_graders,
    validate_timeout,
)
from dpkit.grading.similarity import similar_pairs

_results = results_from_records  # the name older tests use


def _warn_modified(trusted: Trusted) -> None:
    if trusted.modified:
        print(
            "dpkit grade: warning: these grading files differ from the last git commit: "
            + ", ".join(clean_text(path) for path in trusted.modified),
            file=sys.stderr,
        )


def grade(
    task: int,
    file: str | os.PathLike[str] | None = None,
    timeout: float = 60.0,
    exercises: str | os.PathLike[str] | None = None,
) -> list[CheckResult]:
    """Run task ``task``'s grader on ``file`` (default: the student file in exercises/).

    Never raises for anything the graded code does and never runs longer than ``timeout``
    seconds (plus a second or two to start): a hang or a crash gives failed checks whose
    hints say so. A bad ``task`` or ``timeout``, or a ``file`` that is not there (a typo,
    not a submission to fail), is a ValueError.
    """
    folder = find_exercises(exercises)
    validate_timeout(timeout)
    names = task_files(folder)
    if task not in names:
        known = ", ".join(map(str, names))
        raise ValueError(f"there is no task {task}; the tasks are {known}")
    if file is not None and (why := not_there(file)):
        raise ValueError(f"the file {str(file)!r} {why}: give the path of task {task}'s file")
    source = folder / names[task] if file is None else Path(file)
    trusted = read_trusted(folder)
    _warn_modified(trusted)  # a grade names the graders it came from: the last commit's
    return run_graders([task], folder, {names[task]: source.resolve()}, timeout, trusted)


def grade_folder(
    folder: str | os.PathLike[str],
    tasks: Sequence[int] | None = None,
    timeout: float = 60.0,
    exercises: str | os.PathLike[str] | None = None,
    trusted: Trusted | None = None,
) -> list[CheckResult]:
    """Grade the ``taskN_*.py`` files in ``folder`` (one process for all tasks).

    ``timeout`` is per task. A task whose file is missing fails every check with
    "file missing"; a lone ``task1_*.py`` or ``task1.py`` counts as task 1's file. A
    ``folder`` that is not there, or a task given twice, is a ValueError.
    """
    if why := not_there(folder, folder=True):
        raise ValueError(f"the folder {str(folder)!r} {why}: give the folder of taskN_*.py files")
    root = find_exercises(exercises)
    tasks = chosen_tasks(root, tasks)
    names = task_files(root)
    submissions = {
        names[task]: submission_file(Path(folder).resolve(), names[task]) for task in tasks
    }
    if trusted is None:  # a caller that passes its own has warned already
        trusted = read_trusted(root)
        _warn_modified(trusted)
    return run_graders(tasks, root, submissions, timeout, trusted)


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
    exercises: str | os.PathLike[str] | None = None,
    jobs: int | None = None,
    on_student: Callable[[str, list[CheckResult]], None] | None = None,
) -> list[tuple[str, CheckResult]]:
    """Grade every student's submission in ``folder``: ``(student, result)`` rows, by student.

    The layouts are in :func:`dpkit.grading.layout.find_students` (a folder per student,
    nested as an LMS zip unpacks, or one flat folder of ``student_taskN...py`` files).
    The graders, dpkit and every student's files are read once, before the first student
    runs, so a submission that edits files on disk cannot change anyone's grade. ``jobs``
    students are graded at a time (default: the machine's cores), each in fresh processes;
    ``on_student(student, results)`` is called as each one finishes. A student whose
    grading fails for any reason gets rows saying so; the class goes on.
    """
    validate_timeout(timeout)
    root = Path(folder)
    if not root.is_dir():
        raise ValueError(f"submissions folder {str(root)!r} does not exist")
    exercise_root = find_exercises(exercises)
    names = task_files(exercise_root)
    chosen = chosen_tasks(exercise_root, tasks)  # checked here, not once per student
    found = find_students(root, names)
    if not found.students:
        raise ValueError(
            f"{str(root)!r} holds no submissions: give one folder per student, or one folder "
            "of student_taskN_*.py files (see docs/instructors.md)"
        )
    for warning in found.warnings:
        print(f"dpkit grade: warning: {clean_text(warning)}", file=sys.stderr)
    trusted = read_trusted(exercise_root)
    _warn_modified(trusted)
    snapshot = {
        student: {name: read_submission(path) for name, path in files.items()}
        for student, files in found.students.items()
    }
    hidden = [root.resolve(), *apart.out_of_sight(exercise_root)]  # out of a run's sight
    scratch = Path(tempfile.mkdtemp(prefix="dpkit-class-"))  # every run's folder, in here
    jobs = default_jobs() if jobs is None else max(1, int(jobs))
    server = None  # runs forked with torch imported, in namespaces where they can be
    if forkserver.wanted():
        namespaces = apart.available() and apart.usable_for(scratch / "run")
        server = forkserver.start_server(str(scratch), namespaces)
    lock = threading.Lock()

    def one(student: str) -> list[CheckResult]:
        try:
            results = run_graders(
                chosen,
                exercise_root,
                snapshot[student],
                timeout,
                trusted,
                hidden,
                scratch,
                server,
                label=student,
            )
        except Exception as error:  # noqa: BLE001 - one student's failure never stops the class
            why = f"grading failed for this student: {type(error).__name__}: {error}"
            results = [CheckResult(task, "the grader runs", False, why) for task in chosen]
        if on_student is not None:
            with lock:
                on_student(student, results)
        return results

    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="dpkit-grade")
    try:
        graded = dict(zip(snapshot, pool.map(one, snapshot)))
    except BaseException:  # Ctrl-C: stop the runs in flight, start no more
        STOP.set()
        pool.shutdown(wait=True, cancel_futures=True)
        STOP.clear()
        raise
    finally:
        pool.shutdown()
        if server is not None:
            server.close()
        remove_tree(scratch)
    _warn_similar(snapshot, trusted, names, chosen)
    return [(student, result) for student in snapshot for result in graded[student]]


def _warn_similar(
    snapshot: dict[str, dict[str, bytes | str | None]],
    trusted: Trusted,
    names: dict[int, str],
    tasks: Sequence[int],
) -> None:
    sources = {
        student: {
            task: data.decode("utf-8", "replace")
            for task in tasks
            if isinstance(data := files.get(names.get(task, "")), bytes)
        }
        for student, files in snapshot.items()
    }
    stubs = {
        task: trusted.files.get(f"exercises/{names[task]}", b"").decode("utf-8", "replace")
        for task in tasks
        if task in names
    }
    for pair in similar_pairs(sources, stubs):
        print(f"dpkit grade: warning: {clean_text(pair.describe())}", file=sys.stderr)


def default_jobs() -> int:
    """Students graded at a time by default: the cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS
        return max(1, os.cpu_count() or 1)


# What an instructor calls (the guide, docs/instructors.md); the command's helpers
# (find_exercises, task_files, chosen_tasks, check_writable, ...) stay importable for dpkit's CLI.
__all__ = [
    "FAIL",
    "PASS",
    "CheckResult",
    "grade",
    "grade_and_report",
    "grade_folder",
    "grade_submissions",
    "read_weights",
    "report",
    "write_csv",
    "write_feedback",
    "write_summary",
]
