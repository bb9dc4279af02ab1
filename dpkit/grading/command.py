"""``dpkit grade``: the command line over :mod:`dpkit.grading`."""

from __future__ import annotations

import argparse
import math
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
        grading.check_writable(args.csv)  # before the class is graded, not after
        rows = grading.grade_submissions(args.submissions, args.tasks, args.timeout)
        grading.write_csv(rows, args.csv)
        for student in dict.fromkeys(student for student, _ in rows):
            mine = [r for s, r in rows if s == student]
            name = grading.clean_text(student)
            print(f"{name}: {sum(r.passed for r in mine)}/{len(mine)} checks passed")
        print(f"wrote {len(rows)} rows to {args.csv}")
        return 0
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
        "--submissions", metavar="DIR", help="grade DIR/<student>/taskN_*.py for every student"
    )
    grade_parser.add_argument("--csv", metavar="OUT.csv", help="with --submissions: the CSV")
    grade_parser.add_argument(
        "--tasks", type=int, nargs="+", metavar="N", help="with --all or --submissions: only these"
    )
    grade_parser.add_argument(
        "--timeout",
        type=positive_seconds,
        default=60.0,
        help="seconds allowed per task, above 0 (default 60)",
    )
    grade_parser.set_defaults(run=_grade_command, grade_parser=grade_parser)
