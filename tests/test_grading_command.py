"""``dpkit grade``'s command line (:mod:`dpkit.grading.command`) and the graders' helper
:func:`dpkit.grading.checks.must_raise`, in this process.

The command is checked through its own parts: the argparse types, the parser
:func:`command.add_grade_command` builds, the checks of a request's arguments, what is
printed and the exit code. The grading itself is replaced by stand-ins (``grading.grade``,
``grade_folder``, ``grade_submissions``) that record what they were asked and return
results written here, so no grading process is started; the CSVs, the summary and the
feedback are the real ones. A small ``exercises/`` folder in ``tmp_path`` (two tasks)
is what :func:`dpkit.grading.find_exercises` finds, the test running there.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import sys
from pathlib import Path

import pytest

from dpkit import grading
from dpkit.grading import checks, command
from dpkit.grading.layout import ExercisesNotFound

OK = grading.CheckResult


@pytest.fixture
def here(tmp_path, monkeypatch) -> Path:
    """``tmp_path`` as the working directory, with an ``exercises/`` folder of tasks 1, 2
    (each a stub and a grader, which is what ``--tasks`` is checked against)."""
    exercises = tmp_path / "exercises"
    (exercises / "graders").mkdir(parents=True)
    (exercises / "task1_scatter.py").write_text("")
    (exercises / "task2_gather.py").write_text("")
    for task in (1, 2):
        (exercises / "graders" / f"test_task{task}.py").write_text("")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="dpkit")
    command.add_grade_command(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def run(argv: list[str]) -> int:
    args = parse(argv)
    return args.run(args)


def refuse_grading(monkeypatch) -> None:
    """Any grading at all fails the test: a bad request must be refused before it."""

    def refused(*args, **kwargs):
        raise AssertionError("graded a request that should have been refused")

    for name in ("grade", "grade_folder", "grade_submissions"):
        monkeypatch.setattr(grading, name, refused)


# --------------------------------------------------------------------------------------
# The argparse types.


@pytest.mark.parametrize("text, seconds", [("2.5", 2.5), ("60", 60.0), ("1e-3", 0.001)])
def test_positive_seconds_accepts_any_finite_number_above_zero(text, seconds):
    assert command.positive_seconds(text) == seconds


@pytest.mark.parametrize("text", ["ten", "", "5s"])
def test_positive_seconds_says_a_number_was_expected(text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected a number of seconds") as bad:
        command.positive_seconds(text)
    assert repr(text) in str(bad.value)  # the text as given, quoted


@pytest.mark.parametrize("text", ["0", "-0", "-1", "nan", "inf", "-inf"])
def test_positive_seconds_refuses_zero_negative_and_non_finite_naming_the_default(text):
    with pytest.raises(argparse.ArgumentTypeError, match="must be a positive number") as bad:
        command.positive_seconds(text)
    assert repr(text) in str(bad.value) and "the default is 60" in str(bad.value)


@pytest.mark.parametrize("text, jobs", [("1", 1), ("2", 2), ("16", 16)])
def test_positive_jobs_accepts_whole_numbers_from_1(text, jobs):
    assert command.positive_jobs(text) == jobs


@pytest.mark.parametrize("text", ["0", "00", "-1", "1.5", "two", "", " 2", "\u00b2"])  # ², a digit
def test_positive_jobs_refuses_anything_else_quoting_it(text):
    with pytest.raises(argparse.ArgumentTypeError, match="whole number from 1") as bad:
        command.positive_jobs(text)
    assert repr(text) in str(bad.value)


# --------------------------------------------------------------------------------------
# The parser.


def test_the_parser_s_defaults_grade_one_task_in_60_s():
    args = parse(["grade", "3"])
    assert args.task == 3  # a number, not the text "3"
    assert args.timeout == 60.0
    assert not args.all
    unset = ("file", "dir", "submissions", "csv", "tasks", "jobs", "summary", "weights")
    assert all(getattr(args, name) is None for name in (*unset, "feedback"))
    assert args.run is command._grade_command
    assert isinstance(args.grade_parser, argparse.ArgumentParser)
    assert args.grade_parser.prog == "dpkit grade"


def test_the_parser_reads_every_option():
    args = parse(
        ["grade", "--submissions", "class", "--csv", "g.csv", "--tasks", "1", "3"]
        + ["--jobs", "4", "--summary", "s.csv", "--weights", "w.toml", "--feedback", "fb"]
        + ["--timeout", "2.5", "--file", "mine.py", "--dir", "d", "--all"]
    )
    assert (args.submissions, args.csv, args.summary) == ("class", "g.csv", "s.csv")
    assert (args.weights, args.feedback, args.file, args.dir) == ("w.toml", "fb", "mine.py", "d")
    assert args.tasks == [1, 3] and args.jobs == 4 and args.timeout == 2.5 and args.all
    assert args.task is None


@pytest.mark.parametrize(
    "argv, said",
    [
        (["grade", "1", "--timeout", "ten"], "argument --timeout: expected a number of seconds"),
        (["grade", "1", "--timeout=-inf"], "argument --timeout: must be a positive number"),
        (["grade", "--all", "--jobs", "1.5"], "argument --jobs: expected a whole number from 1"),
        (["grade", "one"], "invalid int value: 'one'"),
    ],
)
def test_the_parser_refuses_bad_values_naming_the_option(argv, said, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse(argv)
    assert exit_.value.code == 2
    assert said in capsys.readouterr().err


# --------------------------------------------------------------------------------------
# The checks of a request, before any grading.

ONE_OF = "give one of: a task number, --all, or --submissions DIR"
FILE_IN_A_CLASS = ["grade", "--submissions", "class", "--csv", "g.csv", "--file", "mine.py"]


@pytest.mark.parametrize(
    "argv, said",
    [
        (["grade"], ONE_OF),
        (["grade", "1", "--all"], ONE_OF),
        (["grade", "1", "--submissions", "class", "--csv", "g.csv"], ONE_OF),
        (["grade", "--all", "--submissions", "class", "--csv", "g.csv"], ONE_OF),
        (["grade", "--submissions", "class"], "--submissions needs --csv OUT.csv"),
        (["grade", "--all", "--file", "mine.py"], "--file grades one task: give its number"),
        (FILE_IN_A_CLASS, "--file grades one task: give its number"),
        # An option the way of grading does not use is refused, not ignored.
        (
            ["grade", "1", "--dir", "X", "--csv", "f.csv", "--tasks", "2"],
            "grading one task does not use --dir (with --all), --csv (with --submissions), "
            "--tasks (with --all or --submissions): leave them out",
        ),
        (["grade", "--all", "--jobs", "2"], "--all does not use --jobs (with --submissions)"),
        (["grade", "--all", "--feedback", "fb"], "--all does not use --feedback"),
        (["grade", "--submissions", "class", "--csv", "g.csv", "--dir", "d"], "does not use --dir"),
        # A path that is not there is a typo, refused, not graded as failed checks.
        (["grade", "1", "--file", "nothere.py"], "--file 'nothere.py' does not exist"),
        (["grade", "1", "--file", "exercises"], "--file 'exercises' is a folder, not a file"),
        (["grade", "--all", "--dir", "nodir"], "--dir 'nodir' does not exist"),
        (["grade", "--all", "--dir", "exercises/task1_scatter.py"], "is not a folder"),
        (["grade", "--submissions", "nodir", "--csv", "g.csv"], "--submissions 'nodir' does not"),
        # A task given twice would count its checks twice; one that is not there is named.
        (["grade", "--all", "--tasks", "1", "1"], "--tasks 1 1: task 1 is given twice"),
        (
            ["grade", "--submissions", "class", "--csv", "g.csv", "--tasks", "2", "1", "2"],
            "--tasks 2 1 2: task 2 is given twice: give each task once",
        ),  # fmt: skip
        (["grade", "--all", "--tasks", "3"], "--tasks 3: there is no task 3; the tasks are 1, 2"),
        # Two outputs at one path: the second written would replace the first.
        (
            ["grade", "--submissions", "class", "--csv", "s.csv", "--summary", "./s.csv"],
            "--csv and --summary are the same path, 's.csv': give each its own",
        ),  # fmt: skip
        (
            ["grade", "--submissions", "class", "--csv", "g.csv", "--feedback", "g-summary.csv"],
            "--summary and --feedback are the same path",
        ),  # fmt: skip
    ],
)
def test_an_unclear_request_is_refused_saying_what_to_give(argv, said, here, monkeypatch, capsys):
    refuse_grading(monkeypatch)
    (here / "class" / "ada").mkdir(parents=True)
    with pytest.raises(SystemExit) as exit_:
        run(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "dpkit grade: error: " in err and said in err  # from the grade command's parser
    assert {p.name for p in here.iterdir()} == {"exercises", "class"}  # nothing written


def test_a_bad_weights_file_or_summary_path_is_refused_before_grading(here, monkeypatch):
    refuse_grading(monkeypatch)
    (here / "class" / "ada").mkdir(parents=True)
    base = ["grade", "--submissions", "class", "--csv", "g.csv"]
    with pytest.raises(ValueError, match="cannot read the weights file 'none.toml'"):
        run([*base, "--weights", "none.toml"])
    with pytest.raises(ValueError, match="cannot write the CSV"):
        run([*base, "--summary", str(here / "no" / "s.csv")])
    assert not (here / "g.csv").exists(), "a CSV was written for a refused request"


# --------------------------------------------------------------------------------------
# One task, and --all.


def record_grade(monkeypatch, results):
    calls = []

    def grade(task, file, timeout):
        calls.append((task, file, timeout))
        return results

    monkeypatch.setattr(grading, "grade", grade)
    return calls


def test_one_task_names_the_file_it_grades_then_prints_the_report(here, monkeypatch, capsys):
    results = [OK(1, "splits the batch", True), OK(1, "keeps the order", False, "reversed")]
    calls = record_grade(monkeypatch, results)
    assert run(["grade", "1", "--timeout", "5"]) == 1  # a check failed
    assert calls == [(1, None, 5.0)]
    stub = here / "exercises" / "task1_scatter.py"
    assert capsys.readouterr().out == (f"grading task 1: {stub}\n" + grading.report(results) + "\n")


def test_one_task_from_another_file_names_that_file_resolved(here, monkeypatch, capsys):
    calls = record_grade(monkeypatch, [OK(2, "gathers", True)])
    (here / "mine.py").write_text("")
    assert run(["grade", "2", "--file", "mine.py"]) == 0
    assert calls == [(2, "mine.py", 60.0)]  # the file as given; the default limit
    assert capsys.readouterr().out.startswith(f"grading task 2: {here / 'mine.py'}\n")


def test_a_task_that_does_not_exist_is_named_then_refused(here, capsys):
    # grading.grade itself (no process is started for a task that does not exist).
    with pytest.raises(ValueError, match="there is no task 9; the tasks are 1, 2"):
        run(["grade", "9"])
    assert capsys.readouterr().out == f"grading task 9: {here / 'exercises' / 'task9'}\n"


@pytest.mark.parametrize(
    "passed, code",
    [([True, True], 0), ([True, False], 1), ([False, False], 1), ([], 1)],  # none: not a pass
)
def test_the_exit_code_is_0_only_when_every_check_passed(here, monkeypatch, passed, code):
    record_grade(monkeypatch, [OK(1, f"check {i}", p) for i, p in enumerate(passed)])
    assert run(["grade", "1"]) == code


def test_all_grades_the_exercises_folder_or_the_one_given(here, monkeypatch, capsys):
    calls = []
    results = [OK(1, "a", True), OK(2, "b", True)]

    def grade_folder(folder, tasks, timeout):
        calls.append((folder, tasks, timeout))
        return results

    monkeypatch.setattr(grading, "grade_folder", grade_folder)
    (here / "mine").mkdir()
    assert run(["grade", "--all"]) == 0
    assert run(["grade", "--all", "--dir", "mine", "--tasks", "2", "--timeout", "3"]) == 0
    assert calls == [(here / "exercises", None, 60.0), ("mine", [2], 3.0)]
    assert capsys.readouterr().out == (grading.report(results) + "\n") * 2
    results[1] = OK(2, "b", False, "wrong")
    assert run(["grade", "--all"]) == 1


# --------------------------------------------------------------------------------------
# Errors and Ctrl-C: a message and an exit code, not a traceback.


def test_no_exercises_folder_is_one_line_and_exit_code_2(here, monkeypatch, capsys):
    def missing(start=None):
        raise ExercisesNotFound("cannot find the exercises/ folder here")

    monkeypatch.setattr(grading, "find_exercises", missing)
    assert run(["grade", "1"]) == 2
    assert capsys.readouterr().err == "dpkit grade: error: cannot find the exercises/ folder here\n"


def test_ctrl_c_is_one_line_and_exit_code_130(here, monkeypatch, capsys):
    def interrupted(task, file, timeout):
        raise KeyboardInterrupt

    monkeypatch.setattr(grading, "grade", interrupted)
    assert run(["grade", "1"]) == 130
    err = capsys.readouterr().err
    assert err.startswith("dpkit grade: interrupted") and err.count("\n") == 1


# --------------------------------------------------------------------------------------
# A class: --submissions.


class FakeClass:
    """Stands in for grading.grade_submissions: records its call, reports the students
    given (the on_student calls), then raises ``then`` if given."""

    def __init__(self, students: dict[str, list[grading.CheckResult]], then=None) -> None:
        self.students = students
        self.then = then
        self.calls: list[tuple] = []
        self.cwd: str | None = None

    def __call__(self, submissions, tasks, timeout, exercises, jobs, on_student):
        self.calls.append((submissions, tasks, timeout, exercises, jobs))
        self.cwd = os.getcwd()
        for student, results in self.students.items():
            on_student(student, results)
        if self.then is not None:
            raise self.then
        return [(s, r) for s, results in self.students.items() for r in results]


def a_class(here: Path) -> Path:
    for student in ("ada", "bo", "cy"):  # three folders: three students, whatever is in them
        (here / "class" / student).mkdir(parents=True)
    return here / "class"


def read_csv(path: Path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as file:
        return list(csv.reader(file))


BO = [OK(1, "a", True), OK(1, "b", False, "timed out: after 5 s"), OK(2, "c", False, "no")]
ADA = [OK(1, "a", True), OK(1, "b", True)]


def test_a_class_prints_a_line_per_student_and_writes_both_csvs(here, monkeypatch, capsys):
    a_class(here)
    fake = FakeClass({"bo": BO, "ada": ADA})  # bo finishes first
    monkeypatch.setattr(grading, "grade_submissions", fake)
    argv = ["grade", "--submissions", "class", "--csv", "g.csv", "--tasks", "1", "2"]
    assert run([*argv, "--jobs", "2", "--timeout", "5"]) == 0
    assert fake.calls == [(str(here / "class"), [1, 2], 5.0, here / "exercises", 2)]
    # The class is graded from "/" (a run can read its grader's working directory), and
    # the working directory is back afterwards.
    assert fake.cwd == "/" and os.getcwd() == str(here)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    # Only the "crashed" or "timed out" hints are named; task 2's failure is not.
    assert re.fullmatch(
        r"\[1/3\] bo: 1/3 checks passed \(crashed or timed out in task 1\) \(\d+ s\)", lines[0]
    ), lines[0]
    assert re.fullmatch(r"\[2/3\] ada: 2/2 checks passed \(\d+ s\)", lines[1]), lines[1]
    assert lines[2] == f"wrote 5 rows to g.csv and 2 students to {here / 'g-summary.csv'}"
    # The CSVs where the command was run (not in "/"), students in order of name.
    assert read_csv(here / "g.csv") == [
        ["student", "task", "check", "result", "hint"],
        ["ada", "1", "a", "pass", ""],
        ["ada", "1", "b", "pass", ""],
        ["bo", "1", "a", "pass", ""],
        ["bo", "1", "b", "fail", "timed out: after 5 s"],
        ["bo", "2", "c", "fail", "no"],
    ]
    # 10 points a task: ada passed both of task 1's checks and had no task 2 rows; bo one
    # of two, and none of one.
    assert read_csv(here / "g-summary.csv") == [
        ["student", "task1", "task2", "total", "out_of"],
        ["ada", "10.0", "0.0", "10.0", "20.0"],
        ["bo", "5.0", "0.0", "5.0", "20.0"],
    ]
    assert not (here / "fb").exists()


def test_a_class_with_summary_weights_and_feedback_uses_each(here, monkeypatch, capsys):
    a_class(here)
    (here / "w.toml").write_text("[weights]\n1 = 20\n")
    monkeypatch.setattr(grading, "grade_submissions", FakeClass({"ada": ADA, "bo": BO[:2]}))
    argv = ["grade", "--submissions", "class", "--csv", "out/g.csv", "--summary", "s.csv"]
    (here / "out").mkdir()
    assert run([*argv, "--weights", "w.toml", "--feedback", "fb"]) == 0
    assert read_csv(here / "s.csv")[1:] == [
        ["ada", "20.0", "20.0", "20.0"],
        ["bo", "10.0", "10.0", "20.0"],
    ]
    assert not (here / "out" / "g-summary.csv").exists()
    assert sorted(p.name for p in (here / "fb").iterdir()) == ["ada.txt", "bo.txt"]
    assert "timed out: after 5 s" in (here / "fb" / "bo.txt").read_text()
    assert capsys.readouterr().out.endswith(
        f"wrote 4 rows to out/g.csv and 2 students to {here / 's.csv'}\n"
    )


def test_a_student_name_is_printed_with_its_control_characters_written_out(
    here, monkeypatch, capsys
):
    a_class(here)
    monkeypatch.setattr(grading, "grade_submissions", FakeClass({"eve\x1b[2J": ADA}))
    assert run(["grade", "--submissions", "class", "--csv", "g.csv"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "eve\\x1b[2J: 2/2 checks passed" in out


def test_ctrl_c_in_a_class_writes_the_students_so_far_and_exits_130(here, monkeypatch, capsys):
    a_class(here)
    fake = FakeClass({"ada": ADA}, then=KeyboardInterrupt())
    monkeypatch.setattr(grading, "grade_submissions", fake)
    assert run(["grade", "--submissions", "class", "--csv", "g.csv"]) == 130
    assert os.getcwd() == str(here)
    assert [row[0] for row in read_csv(here / "g.csv")] == ["student", "ada", "ada"]
    assert read_csv(here / "g-summary.csv")[1][0] == "ada"
    printed = capsys.readouterr()
    assert "wrote 2 rows to g.csv and 1 students to" in printed.out
    assert "interrupted" in printed.err


def test_a_class_that_fails_midway_still_writes_the_csv_and_says_why(here, monkeypatch):
    a_class(here)
    fake = FakeClass({"ada": ADA}, then=RuntimeError("disk full"))
    monkeypatch.setattr(grading, "grade_submissions", fake)
    with pytest.raises(RuntimeError, match="disk full"):
        run(["grade", "--submissions", "class", "--csv", "g.csv"])
    assert os.getcwd() == str(here)
    assert len(read_csv(here / "g.csv")) == 3


def test_a_class_that_fails_before_anyone_is_graded_writes_no_csv(here, monkeypatch):
    """No empty CSVs in place of last week's, as if a class of nobody had been graded."""
    a_class(here)
    (here / "g.csv").write_text("last week's\n")
    fake = FakeClass({}, then=ValueError("'class' holds no submissions"))
    monkeypatch.setattr(grading, "grade_submissions", fake)
    with pytest.raises(ValueError, match="holds no submissions"):
        run(["grade", "--submissions", "class", "--csv", "g.csv", "--feedback", "fb"])
    assert (here / "g.csv").read_text() == "last week's\n"
    assert not (here / "g-summary.csv").exists() and not (here / "fb").exists()


def test_ctrl_c_before_anyone_is_graded_writes_no_csv_and_says_so(here, monkeypatch, capsys):
    a_class(here)
    monkeypatch.setattr(grading, "grade_submissions", FakeClass({}, then=KeyboardInterrupt()))
    assert run(["grade", "--submissions", "class", "--csv", "g.csv"]) == 130
    assert not (here / "g.csv").exists() and not (here / "g-summary.csv").exists()
    summary = here / "g-summary.csv"
    assert capsys.readouterr().out == f"no student was graded: g.csv and {summary} not written\n"


def test_an_unwritable_feedback_folder_is_refused_before_grading_naming_it(here, monkeypatch):
    refuse_grading(monkeypatch)
    a_class(here)
    (here / "a_file").write_text("")
    base = ["grade", "--submissions", "class", "--csv", "g.csv"]
    with pytest.raises(ValueError, match="cannot write in the folder --feedback 'a_file/fb'"):
        run([*base, "--feedback", "a_file/fb"])
    with pytest.raises(ValueError, match="--feedback 'a_file' is a file: give a folder"):
        run([*base, "--feedback", "a_file"])
    assert not (here / "g.csv").exists()


def test_a_summary_path_that_is_a_folder_is_named_as_the_summary(here, monkeypatch):
    refuse_grading(monkeypatch)
    a_class(here)
    (here / "out").mkdir()
    with pytest.raises(ValueError, match="^--summary 'out' is a folder"):
        run(["grade", "--submissions", "class", "--csv", "g.csv", "--summary", "out"])


def test_a_missing_path_met_while_grading_is_not_called_a_missing_exercises_folder(
    here, monkeypatch, capsys
):
    """Only the exercises/ folder's absence is reported as such; any other file not found
    goes on to dpkit's own one-line error (what it is, and the path)."""
    a_class(here)
    missing = FileNotFoundError(2, "No such file or directory", "/gone/fb")
    monkeypatch.setattr(grading, "grade_submissions", FakeClass({"ada": ADA}, then=missing))
    with pytest.raises(FileNotFoundError):
        run(["grade", "--submissions", "class", "--csv", "g.csv"])
    assert capsys.readouterr().err == ""


# --------------------------------------------------------------------------------------
# checks.must_raise: a grader's "must raise", whose miss reads as a hint.


def test_must_raise_hands_back_the_exception_raised():
    error = TypeError("strings are not tensors")
    with checks.must_raise(TypeError, "gather(['a'], lanes[0])", "refuse strings") as raised:
        assert raised.value is None  # nothing yet
        raise error
    assert raised.value is error


def test_must_raise_accepts_a_subclass_or_any_of_a_tuple():
    with checks.must_raise(LookupError, "f()", "why") as raised:
        raise KeyError("k")
    assert isinstance(raised.value, KeyError)
    with checks.must_raise((TypeError, ValueError), "f()", "why") as raised:
        raise ValueError("v")
    assert isinstance(raised.value, ValueError)


def test_a_miss_fails_with_a_hint_naming_the_call_the_exception_and_why():
    with pytest.raises(pytest.fail.Exception) as failed:
        with checks.must_raise(TypeError, "gather(['a', 'b'], lanes[0])", "strings are no tensors"):
            pass
    assert str(failed.value) == (  # exact: the hint is built from must_raise's arguments
        "gather(['a', 'b'], lanes[0]) returned without raising TypeError: strings are no tensors"
    )
    assert failed.value.pytrace is False  # a hint, not a traceback


def test_a_miss_of_a_tuple_names_each_exception():
    with pytest.raises(pytest.fail.Exception, match=r"without raising TypeError or ValueError: "):
        with checks.must_raise((TypeError, ValueError), "f(1)", "why"):
            pass


def test_any_other_exception_goes_through_unchanged():
    stub = NotImplementedError("TODO 1.2")
    with pytest.raises(NotImplementedError) as through:
        with checks.must_raise(TypeError, "f()", "why"):
            raise stub
    assert through.value is stub


def test_the_help_shows_what_each_option_takes(capsys):
    from dpkit.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["grade", "--help"])
    assert exit_.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps to the terminal
    for usage in ("--submissions DIR", "--csv OUT.csv", "--tasks N [N ...]", "--jobs N",
                  "--summary OUT.csv", "--weights FILE.toml", "--feedback DIR"):  # fmt: skip
        assert usage in shown
    assert "--all grade every task" in shown


def test_a_student_s_crashed_and_timed_out_tasks_are_named_in_order(here, monkeypatch, capsys):
    a_class(here)
    cy = [OK(2, "c", False, "crashed: exit code 1"), OK(1, "a", False, "timed out: after 5 s"),
          OK(3, "d", False, "wrong: crashed is not the first word")]  # fmt: skip
    monkeypatch.setattr(grading, "grade_submissions", FakeClass({"cy": cy}))
    run(["grade", "--submissions", "class", "--csv", "g.csv"])
    first = capsys.readouterr().out.splitlines()[0]
    assert "0/3 checks passed (crashed or timed out in task 1, 2) (" in first


def test_each_student_s_line_is_flushed_as_they_finish(here, monkeypatch):
    """Piped (``| tee log``), an instructor sees each student as they finish, not at the end."""

    class Piped(io.StringIO):
        flushed_at: list[int] = []

        def flush(self) -> None:
            self.flushed_at.append(self.getvalue().count("\n"))

    a_class(here)
    monkeypatch.setattr(grading, "grade_submissions", FakeClass({"bo": BO, "ada": ADA}))
    monkeypatch.setattr(sys, "stdout", Piped())
    run(["grade", "--submissions", "class", "--csv", "g.csv"])
    assert {1, 2} <= set(Piped.flushed_at)  # after bo's line, and after ada's
