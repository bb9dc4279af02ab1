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
    try:
        return _grade(args)
    except FileNotFoundError as error:  # no exercises/ folder here
        print(f"dpkit grade: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the run and every process it started are already killed
        print(
            "dpkit grade: interrupted; stopped grading and every process it started",
            file=sys.stderr,
        )
        return 130


def _grade(args: argparse.Namespace) -> int:
    from dpkit import grading

    chosen = [args.task is not None, args.all, args.submissions is not None]
    if sum(chosen) != 1:
        args.grade_parser.error("give one of: a task number, --all, or --submissions DIR")
    if args.submissions is not None and args.csv is None:
        args.grade_parser.error("--submissions needs --csv OUT.csv")
    if args.file is not None and args.task is None:
        args.grade_parser.error("--file grades one task: give its number, e.g. dpkit grade 1")
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


def _grade_class(args: argparse.Namespace) -> int:
    """``--submissions``: a line per student as each finishes, the CSVs always written."""
    import time

    from dpkit import grading

    summary = args.summary or str(Path(args.csv).with_name(Path(args.csv).stem + "-summary.csv"))
    for path in (args.csv, summary):
        grading.check_writable(path)  # before the class is graded, not after
    weights = grading.read_weights(args.weights)
    done: list[tuple[str, list[grading.CheckResult]]] = []
    start = time.monotonic()
    names = grading.task_files(grading.find_exercises())
    folder = Path(args.submissions)
    total = len(grading.find_students(folder, names).students) if folder.is_dir() else 0

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
    finally:  # whatever happened, the students graded so far are written
        os.chdir(here)
        rows = [(student, r) for student, results in sorted(done) for r in results]
        grading.write_csv(rows, csv_path)
        grading.write_summary(rows, summary, weights)
        if feedback:
            grading.write_feedback(rows, feedback)
    print(f"wrote {len(rows)} rows to {args.csv} and {len(done)} students to {summary}")
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
