"""What a student and an instructor read (dpkit.grading.results): the report, the class CSV,
and the checks before a class is graded, from results written here by hand."""

from __future__ import annotations

import csv
import os

import pytest

from dpkit import grading
from dpkit.grading import results as results_module

Result = grading.CheckResult


def test_the_report_gives_each_task_its_count_and_each_failure_its_hint():
    results = [Result(1, "splits 10 rows", True), Result(1, "keeps dim", False, "use dim"),
               Result(3, "one thread each", True)]  # fmt: skip
    assert grading.report(results).split("\n") == [
        "Task 1: 1/2 checks passed",
        "  \u2713 splits 10 rows",
        "  \u2717 keeps dim",
        "      hint: use dim",
        "Task 3: 1/1 checks passed",
        "  \u2713 one thread each",
        "2/3 checks passed: keep going",
    ]
    one_task = [Result(2, "copies", True), Result(2, "moves", True)]
    assert grading.report(one_task).split("\n") == [
        "  \u2713 copies", "  \u2713 moves", "2/2 checks passed: all checks pass"]  # fmt: skip


def test_a_hint_every_check_of_a_task_failed_with_is_said_once():
    broken = "task1_scatter.py could not be imported (line 4): SyntaxError: expected ':'"
    results = [Result(1, "sizes", False, broken), Result(1, "scatter", False, broken),
               Result(2, "copies", False, "h"), Result(2, "moves", False, "h2")]  # fmt: skip
    assert grading.report(results).split("\n") == [
        "Task 1: 0/2 checks passed",
        "  \u2717 sizes",
        "  \u2717 scatter",
        f"      hint, every check: {broken}",
        "Task 2: 0/2 checks passed",
        "  \u2717 copies",
        "      hint: h",
        "  \u2717 moves",
        "      hint: h2",
        "0/4 checks passed: keep going",
    ]
    # the same hint on some checks only, or on one check alone, stays under each check
    some = [Result(3, "a", False, "h"), Result(3, "b", True), Result(3, "c", False, "h")]
    assert grading.report(some).count("hint: h") == 2
    assert grading.report([Result(3, "a", False, "h")]).split("\n")[1] == "      hint: h"


def test_a_run_that_collected_nothing_fails_each_task_saying_why():
    assert results_module.results_from_records([], "crashed at import", [1, 3]) == [
        Result(1, "the grader runs", False, "crashed at import"),
        Result(3, "the grader runs", False, "crashed at import"),
    ]
    (only,) = results_module.results_from_records([], None, [2])
    assert only.hint == "the grader collected no checks"


def test_the_class_csv_has_a_row_per_student_and_check(tmp_path):
    rows = [("ada", Result(1, "splits", True)), ("bo", Result(1, "splits", False, "chunk"))]
    grading.write_csv(rows, tmp_path / "grades.csv")
    with (tmp_path / "grades.csv").open(newline="") as file:
        assert list(csv.reader(file)) == [
            ["student", "task", "check", "result", "hint"],
            ["ada", "1", "splits", "pass", ""],
            ["bo", "1", "splits", "fail", "chunk"],
        ]


def test_the_csv_path_is_checked_before_grading_and_left_as_it_was(tmp_path):
    new = tmp_path / "grades.csv"
    grading.check_writable(new)
    assert not new.exists()  # nothing left behind where nothing was
    kept = tmp_path / "kept.csv"
    kept.write_text("last week's\n")
    grading.check_writable(kept)
    assert kept.read_text() == "last week's\n"
    with pytest.raises(ValueError, match="is a folder: give a file name"):
        grading.check_writable(tmp_path)
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(ValueError, match="cannot write the CSV .* choose a writable path"):
            grading.check_writable(locked / "grades.csv")
    with pytest.raises(ValueError, match="cannot write the CSV"):
        grading.check_writable(tmp_path / "no such folder" / "grades.csv")


def test_a_path_refused_is_named_with_the_option_it_came_from(tmp_path):
    with pytest.raises(ValueError, match="^--summary '.*' is a folder"):
        grading.check_writable(tmp_path, "--summary")
    with pytest.raises(ValueError, match="^cannot write the CSV --summary "):
        grading.check_writable(tmp_path / "no such folder" / "s.csv", "--summary")


def test_the_feedback_folder_is_checked_before_grading_and_left_as_it_was(tmp_path):
    new = tmp_path / "feedback" / "week 3"
    grading.check_folder_writable(new)
    assert not (tmp_path / "feedback").exists()  # nothing left behind where nothing was
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "ada.txt").write_text("last week's\n")
    grading.check_folder_writable(kept)
    assert [p.name for p in kept.iterdir()] == ["ada.txt"]
    (tmp_path / "a_file").write_text("")
    with pytest.raises(ValueError, match="^--feedback '.*a_file' is a file: give a folder"):
        grading.check_folder_writable(tmp_path / "a_file")
    with pytest.raises(ValueError, match="^cannot write in the folder --feedback .* choose a"):
        grading.check_folder_writable(tmp_path / "a_file" / "fb")
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(ValueError, match="Permission denied"):
            grading.check_folder_writable(locked)
        with pytest.raises(ValueError, match="Permission denied"):
            grading.check_folder_writable(locked / "fb")
