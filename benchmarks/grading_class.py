"""How long ``dpkit grade --submissions`` takes for a class, and what one student costs.

    .venv/bin/python -m benchmarks.grading_class --students 4            # about a minute
    .venv/bin/python -m benchmarks.grading_class --students 60 --hang 3 --crash 3
    DPKIT_GRADE_FORKSERVER=0 .venv/bin/python -m benchmarks.grading_class --note "no fork server"

A class is made of copies of the reference solutions (every task), plus ``--hang``
students whose task 3 sleeps at import and ``--crash`` students whose task 1 calls
``os._exit(0)`` at import. It is graded through the command line, as an instructor would,
with ``--jobs`` (default: the cores); the wall time, the CPU time of every process it
started (the grader and all grading runs, from ``os.times`` of the children), the load
average before and after, and what each student scored are recorded. The goal (issue 33,
on a quiet 2-core machine, default settings): 60 correct students in under 3 minutes, and
60 with 3 hanging and 3 crashing in under 4. A smaller class gives the time per student;
``extrapolated_60_s`` scales it linearly to 60 students at the same ``--jobs``, and says
so. ``cpu_estimate_60_s`` is what the goal needs on a quiet machine if grading is CPU-bound
and the jobs keep every core busy: the CPU time per student x 60 / the cores. CPU time
measured beside other work is inflated (shared caches, frequency), so it errs long. The CPU
time counts every grading run only when each was waited for: runs forked by the fork server
(:mod:`dpkit.grading.forkserver`, the default where namespaces work) are; runs started with
``DPKIT_GRADE_FORKSERVER=0`` are killed once their results are in, and their CPU is lost to
the count. Results go to benchmarks/results/grading_class.json and .md.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXERCISES = ROOT / "exercises"
RESULTS = Path(__file__).resolve().parent / "results"


def make_class(folder: Path, students: int, hang: int, crash: int) -> None:
    solutions = sorted((EXERCISES / "solutions").glob("task*_*.py"))
    for index in range(students):
        student = folder / f"student{index:02d}"
        student.mkdir(parents=True)
        for path in solutions:
            source = path.read_text()
            # At the module's end: a line before its `from __future__` import would make the
            # file a SyntaxError, not a hang or a crash.
            if index < hang and path.name.startswith("task3_"):
                source += "\nimport time\n\ntime.sleep(3600)\n"
            elif hang <= index < hang + crash and path.name.startswith("task1_"):
                source += "\nimport os\n\nos._exit(0)\n"
            (student / path.name).write_text(source)


def grade(folder: Path, jobs: int | None, timeout: float | None) -> dict:
    out = folder.parent / "grades.csv"
    command = [sys.executable, "-m", "dpkit", "grade", "--submissions", str(folder)]
    command += ["--csv", str(out)]
    if jobs is not None:
        command += ["--jobs", str(jobs)]
    if timeout is not None:
        command += ["--timeout", str(timeout)]
    load_before = os.getloadavg()
    before = os.times()
    start = time.monotonic()
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - start
    after = os.times()
    if run.returncode != 0:
        raise SystemExit(f"grading failed ({run.returncode}):\n{run.stderr}")
    scores: dict[str, list[int]] = {}
    failed: dict[str, list[str]] = {}  # what each student lost, to tell a flaky check
    with open(out, newline="") as file:
        for row in csv.DictReader(file):
            score = scores.setdefault(row["student"], [0, 0])
            score[0] += row["result"] == "pass"
            score[1] += 1
            if row["result"] != "pass":
                lost = f"task {row['task']}: {row['check']}: {row['hint'][:300]}"
                failed.setdefault(row["student"], []).append(lost)
    lines = [line for line in run.stdout.splitlines() if line.startswith("[")]
    return {
        "wall_s": round(wall, 1),
        "children_cpu_s": round(
            (after.children_user - before.children_user)
            + (after.children_system - before.children_system),
            1,
        ),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "scores": {student: f"{p}/{n}" for student, (p, n) in sorted(scores.items())},
        "failed": failed,
        "first_line_s": _seconds(lines[0]) if lines else None,
        "lines": len(lines),
    }


def _seconds(line: str) -> float | None:
    try:
        return float(line.rsplit("(", 1)[1].split(" s)")[0])
    except (IndexError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--students", type=int, default=4, help="students in the class")
    parser.add_argument("--hang", type=int, default=0, help="of them, hanging in task 3")
    parser.add_argument("--crash", type=int, default=0, help="of them, crashing in task 1")
    parser.add_argument("--jobs", type=int, default=None, help="dpkit grade --jobs")
    parser.add_argument("--timeout", type=float, default=None, help="dpkit grade --timeout")
    parser.add_argument("--note", default="", help="what else ran on the machine")
    parser.add_argument("--out", type=Path, default=RESULTS / "grading_class.json")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="dpkit-bench-class-")) / "class"
    try:
        make_class(folder, args.students, args.hang, args.crash)
        result = grade(folder, args.jobs, args.timeout)
    finally:
        shutil.rmtree(folder.parent, ignore_errors=True)
    jobs = args.jobs or len(os.sched_getaffinity(0))
    result.update(
        {
            "when": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "students": args.students,
            "hang": args.hang,
            "crash": args.crash,
            "jobs": jobs,
            "cores": len(os.sched_getaffinity(0)),
            "per_student_s": round(result["wall_s"] / args.students, 2),
            "extrapolated_60_s": round(result["wall_s"] / args.students * 60),
            "cpu_per_student_s": round(result["children_cpu_s"] / args.students, 2),
            "cpu_estimate_60_s": round(
                result["children_cpu_s"] / args.students * 60 / len(os.sched_getaffinity(0))
            ),
            "fork_server": os.environ.get("DPKIT_GRADE_FORKSERVER", "1") != "0",
            "note": args.note,
        }
    )
    runs = json.loads(args.out.read_text()) if args.out.exists() else []
    runs.append(result)
    args.out.write_text(json.dumps(runs, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "scores"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
