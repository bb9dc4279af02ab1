"""``dpkit grade``: the command line over :mod:`dpkit.grading`."""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path


def positive_seconds(text: str) -> float:
    """An argparse type: seconds, a finite number above 0 (argparse names the option)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(
            f"must be a positive number of seconds, got {text!r} (the default is 60)"
        )
    return value


def _grade_command(args: argparse.Namespace) -> int:
    from dpkit.grading.layout import ExercisesNotFound

    try:
        return _grade(args)
    except ExercisesNotFound as error:  # no exercises/ folder here (other paths: dpkit's main)
        print(f"dpkit grade: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the run and every process it started are already killed
        print(
            "dpkit grade: interrupted; stopped grading and every process it started",
            file=sys.stderr,
        )
        return 130


# The options each way of grading uses (--timeout: all three). Any other option given is
# refused: ignored, it would look as if it had been applied.
USES = {
    "one task": ("file",),
    "--all": ("dir", "tasks"),
    "--submissions": ("csv", "tasks", "jobs", "summary", "weights", "feedback"),
}
OPTIONS = ("file", "dir", "csv", "tasks", "jobs", "summary", "weights", "feedback")


def _refuse_unused(args: argparse.Namespace, mode: str) -> None:
    unused = [n for n in OPTIONS if getattr(args, n) is not None and n not in USES[mode]]
    if unused:
        where = [
            f"--{name} (with {' or '.join(m for m in USES if name in USES[m])})" for name in unused
        ]
        grading_what = "grading one task" if mode == "one task" else mode
        args.grade_parser.error(
            f"{grading_what} does not use {', '.join(where)}: "
            f"leave {'it' if len(unused) == 1 else 'them'} out"
        )


def _refuse_not_there(args: argparse.Namespace, flag: str, folder: bool, what: str) -> None:
    from dpkit.grading.layout import not_there

    path = getattr(args, flag.lstrip("-"))
    if path is not None and (why := not_there(path, folder)):
        args.grade_parser.error(f"{flag} {path!r} {why}: give {what}")


def _grade(args: argparse.Namespace) -> int:
    from dpkit import grading

    chosen = [args.task is not None, args.all, args.submissions is not None]
    if sum(chosen) != 1:
        args.grade_parser.error("give one of: a task number, --all, or --submissions DIR")
    if args.submissions is not None and args.csv is None:
        args.grade_parser.error("--submissions needs --csv OUT.csv")
    if args.file is not None and args.task is None:
        args.grade_parser.error("--file grades one task: give its number, e.g. dpkit grade 1")
    mode = "one task" if args.task is not None else "--all" if args.all else "--submissions"
    _refuse_unused(args, mode)
    # A path that is not there is a typo to fix, not a submission to fail check by check.
    _refuse_not_there(args, "--file", False, f"the path of your task {args.task} file")
    _refuse_not_there(args, "--dir", True, "the folder of your taskN_*.py files")
    _refuse_not_there(args, "--submissions", True, "the folder of the class's submissions")
    if args.tasks is not None:
        try:
            grading.chosen_tasks(grading.find_exercises(), args.tasks)
        except ValueError as error:
            args.grade_parser.error(f"--tasks {' '.join(map(str, args.tasks))}: {error}")
    if args.submissions is not None:
        return _grade_class(args)
    if args.all:
        folder = args.dir if args.dir is not None else grading.find_exercises()
        results = grading.grade_folder(folder, args.tasks, args.timeout)
    else:
        # Say which file: run outside a checkout, the default is the checkout's own stub.
        exercises = grading.find_exercises()
        default = exercises / grading.task_files(exercises).get(args.task, f"task{args.task}")
        graded = Path(args.file) if args.file else default
        print(f"grading task {args.task}: {graded.resolve()}", flush=True)
        results = grading.grade(args.task, args.file, args.timeout)
    print(grading.report(results))
    return 0 if results and all(r.passed for r in results) else 1


def _check_outputs(args: argparse.Namespace, summary: str) -> None:
    """Refuse, before the class is graded, outputs that cannot be written or that clash."""
    from dpkit import grading

    outputs = {"--csv": args.csv, "--summary": summary, "--feedback": args.feedback}
    seen: dict[str, str] = {}  # each output's real path: the flag that gave it
    for flag, path in outputs.items():
        if path is None:
            continue
        first = seen.setdefault(os.path.realpath(path), flag)
        if first != flag:  # the one written second would replace the first
            args.grade_parser.error(
                f"{first} and {flag} are the same path, {outputs[first]!r}: give each its own"
            )
    grading.check_writable(args.csv, "--csv")
    grading.check_writable(summary, "--summary")
    if args.feedback is not None:
        grading.check_folder_writable(args.feedback, "--feedback")


def _grade_class(args: argparse.Namespace) -> int:
    """``--submissions``: a line per student as each finishes; the CSVs written when at
    least one student was graded (after an error or Ctrl-C too, with those students)."""
    import time

    from dpkit import grading

    summary = args.summary or str(Path(args.csv).with_name(Path(args.csv).stem + "-summary.csv"))
    _check_outputs(args, summary)
    weights = grading.read_weights(args.weights)
    done: list[tuple[str, list[grading.CheckResult]]] = []
    start = time.monotonic()
    names = grading.task_files(grading.find_exercises())
    total = len(grading.find_students(Path(args.submissions), names).students)

    def finished(student: str, results: list[grading.CheckResult]) -> None:
        done.append((student, results))
        name = grading.clean_text(student)
        stopped = sorted({r.task for r in results if r.hint.startswith(("crashed", "timed out"))})
        note = f" (crashed or timed out in task {', '.join(map(str, stopped))})" if stopped else ""
        print(
            f"[{len(done)}/{total}] {name}: {sum(r.passed for r in results)}/{len(results)} checks "
            f"passed{note} ({time.monotonic() - start:.0f} s)",
            flush=True,
        )

    interrupted = False
    exercises = grading.find_exercises()
    paths = [args.submissions, args.csv, summary, args.feedback]
    submissions, csv_path, summary, feedback = (
        None if p is None else os.path.abspath(p) for p in paths
    )
    here = os.getcwd()
    # A submission can read where its grader runs (/proc/<parent>/cwd): not in the class.
    os.chdir("/")
    try:
        grading.grade_submissions(
            submissions, args.tasks, args.timeout, exercises, args.jobs, on_student=finished
        )
    except KeyboardInterrupt:
        interrupted = True
    finally:  # the students graded so far are written; with none, last run's files stay
        os.chdir(here)
        rows = [(student, r) for student, results in sorted(done) for r in results]
        if done:
            grading.write_csv(rows, csv_path)
            grading.write_summary(rows, summary, weights)
            if feedback:
                grading.write_feedback(rows, feedback)
    if done:
        print(f"wrote {len(rows)} rows to {args.csv} and {len(done)} students to {summary}")
    else:  # interrupted before the first student finished
        print(f"no student was graded: {args.csv} and {summary} not written")
    if interrupted:
        raise KeyboardInterrupt
    return 0


def positive_jobs(text: str) -> int:
    """An argparse type: a whole number of students graded at a time, at least 1."""
    if not (text.isascii() and text.isdigit()) or int(text) < 1:  # not "²", a digit int() refuses
        raise argparse.ArgumentTypeError(f"expected a whole number from 1, got {text!r}")
    return int(text)


def add_grade_command(commands: argparse._SubParsersAction) -> None:
    """Add ``dpkit grade`` to the ``dpkit`` command's subcommands."""
    grade_parser = commands.add_parser(
        "grade",
        help="grade an exercise: pass/fail per check, with hints",
        description="Grade the exercises in exercises/ (offline; each run isolated, hung "
        "code stopped; see exercises/README.md for what isolation does and does not cover).",
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
        "--submissions",
        metavar="DIR",
        help="grade every student in DIR (DIR/<student>/taskN_*.py, or DIR/<student>_taskN_*.py)",
    )
    grade_parser.add_argument("--csv", metavar="OUT.csv", help="with --submissions: the CSV")
    grade_parser.add_argument(
        "--tasks", type=int, nargs="+", metavar="N", help="with --all or --submissions: only these"
    )
    grade_parser.add_argument(
        "--jobs",
        type=positive_jobs,
        metavar="N",
        help="with --submissions: students graded at a time (default: the cores)",
    )
    grade_parser.add_argument(
        "--summary",
        metavar="OUT.csv",
        help="with --submissions: the per-student summary (default: the CSV's name + -summary)",
    )
    grade_parser.add_argument(
        "--weights",
        metavar="FILE.toml",
        help="with --submissions: each task's points ([weights] then 1 = 10; default 10 each)",
    )
    grade_parser.add_argument(
        "--feedback", metavar="DIR", help="with --submissions: a report per student in DIR"
    )
    grade_parser.add_argument(
        "--timeout",
        type=positive_seconds,
        default=60.0,
        help="seconds allowed per task, above 0 (default 60)",
    )
    grade_parser.set_defaults(run=_grade_command, grade_parser=grade_parser)
