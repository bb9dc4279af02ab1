"""A class as it arrives and the reports an instructor uses (issue 33), without grading.

Where each student's files are found (the LMS layouts), the summary CSV and its weights,
feedback files, the similarity warning and the clean-up of deep folders: all of them plain
functions, tested here in a second or two. Grading itself is in test_grading_attacks.py.
"""

from __future__ import annotations

import contextlib
import csv
import os
import tempfile
from pathlib import Path

import pytest

from dpkit import grading
from dpkit.grading.cleanup import remove_tree
from dpkit.grading.layout import NotTaken, check_task, chosen_tasks, submission_file
from dpkit.grading.similarity import normalised, similar_pairs

EXERCISES = Path(__file__).resolve().parent.parent / "exercises"
NAMES = grading.task_files(EXERCISES)


def write(path: Path, text: str = "x = 1\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_files_are_found_in_every_layout_with_a_warning_when_unusual(tmp_path):
    write(tmp_path / "ada" / NAMES[1])  # where it belongs
    write(tmp_path / "bo" / "hw3" / "upload" / NAMES[1])  # a zip unpacked one level down
    write(tmp_path / "cy" / "task1_mine.py")  # renamed
    write(tmp_path / "dee_12_assignsubmission_file_task1_scatter.py")  # a flat download
    write(tmp_path / "eve-task2.py")
    found = grading.find_students(tmp_path, NAMES)
    files = found.students
    assert sorted(files) == ["ada", "bo", "cy", "dee_12_assignsubmission_file", "eve"]
    assert files["ada"][NAMES[1]] == tmp_path / "ada" / NAMES[1]
    assert files["bo"][NAMES[1]] == tmp_path / "bo" / "hw3" / "upload" / NAMES[1]
    assert files["cy"][NAMES[1]].name == "task1_mine.py"
    assert files["dee_12_assignsubmission_file"][NAMES[1]].name.endswith(NAMES[1])
    assert list(files["eve"]) == [NAMES[2]]
    warned = " ".join(found.warnings)
    assert "bo: graded bo/hw3/upload/task1_scatter.py" in warned
    assert "cy: graded cy/task1_mine.py" in warned
    assert "ada" not in warned


def test_two_candidates_are_an_error_and_links_are_not_followed(tmp_path):
    write(tmp_path / "ada" / "a" / NAMES[1])
    write(tmp_path / "ada" / "b" / NAMES[1])
    write(tmp_path / "real" / NAMES[1])
    os.symlink(tmp_path / "real", tmp_path / "linked")
    found = grading.find_students(tmp_path, NAMES)
    why = found.students["ada"][NAMES[1]]
    assert isinstance(why, NotTaken) and "two or more files could be" in why
    assert all(isinstance(v, NotTaken) for v in found.students["linked"].values())
    assert "symbolic link" in found.students["linked"][NAMES[1]]


def test_hidden_and_tool_folders_are_not_students_and_do_not_hide_files(tmp_path):
    """Folders an unzip or an editor leaves (.git, __MACOSX, .ipynb_checkpoints) are skipped
    at the top and inside a student's folder, without skipping what comes after them."""
    for junk in (".git", "__MACOSX", "__pycache__", "__notes", ".ipynb_checkpoints"):
        write(tmp_path / junk / NAMES[1])
        write(tmp_path / "ada" / junk / NAMES[2])
    write(tmp_path / "ada" / NAMES[1])  # sorted after ".git" and "__MACOSX"
    found = grading.find_students(tmp_path, NAMES)
    assert list(found.students) == ["ada"]
    assert found.students["ada"] == {NAMES[1]: tmp_path / "ada" / NAMES[1]}


def test_flat_files_that_could_be_one_task_are_listed_four_at_most(tmp_path):
    for suffix in "abcde":
        write(tmp_path / f"ada_task1_{suffix}.py")
    found = grading.find_students(tmp_path, NAMES)
    why = found.students["ada"][NAMES[1]]
    listed = "ada_task1_a.py, ada_task1_b.py, ada_task1_c.py, ada_task1_d.py"
    assert isinstance(why, NotTaken) and f"({listed})" in why and "_e.py" not in why
    (warning,) = found.warnings
    assert warning.startswith("ada: ") and warning.endswith(listed)


def test_names_as_an_lms_downloads_them_are_matched(tmp_path):
    """Issue 41: these students held full solutions and vanished from both CSVs."""
    for name in (
        "fay_task1_scatter (1).py",  # a second download
        "Gus_Task1_Scatter.py",  # any case
        "hal_task1_scatter.PY",
        "kim.task1.py",  # a dot before the task
        "lu_task1_scatter-2.py",  # a resubmission
    ):
        write(tmp_path / name)
    write(tmp_path / "max" / "Task2_Replicate (1).py")  # the same in a student's folder
    found = grading.find_students(tmp_path, NAMES)
    assert {s: list(f) for s, f in found.students.items()} == {
        "Gus": [NAMES[1]],
        "fay": [NAMES[1]],
        "hal": [NAMES[1]],
        "kim": [NAMES[1]],
        "lu": [NAMES[1]],
        "max": [NAMES[2]],
    }
    assert found.students["fay"][NAMES[1]].name == "fay_task1_scatter (1).py"
    # Each file graded under another name is named, in either layout.
    assert found.warnings == [
        "max: graded max/Task2_Replicate (1).py as task2_replicate.py",
        "Gus: graded Gus_Task1_Scatter.py as task1_scatter.py",
        "fay: graded fay_task1_scatter (1).py as task1_scatter.py",
        "hal: graded hal_task1_scatter.PY as task1_scatter.py",
        "kim: graded kim.task1.py as task1_scatter.py",
        "lu: graded lu_task1_scatter-2.py as task1_scatter.py",
    ]


def test_a_flat_file_under_another_name_is_named_as_in_a_folder(tmp_path):
    write(tmp_path / "eve_task1_mine.py")
    write(tmp_path / "cy" / "task1_mine.py")
    write(tmp_path / f"ada_{NAMES[1]}")  # the exact name: nothing to say
    write(tmp_path / "bo" / NAMES[1])
    found = grading.find_students(tmp_path, NAMES)
    assert found.warnings == [
        "cy: graded cy/task1_mine.py as task1_scatter.py",
        "eve: graded eve_task1_mine.py as task1_scatter.py",
    ]


def test_a_flat_file_that_is_no_task_s_is_named_in_a_warning(tmp_path):
    for name in ("ivy_task99.py", "notes.txt", "jo_scatter.py", "ann_task1.ipynb", ".DS_Store"):
        write(tmp_path / name)
    found = grading.find_students(tmp_path, NAMES)
    assert found.students == {}
    named = [warning.split(":")[0] for warning in found.warnings]
    assert named == ["ann_task1.ipynb", "ivy_task99.py", "jo_scatter.py"], found.warnings
    assert "not graded, no task's file" in found.warnings[0]


def test_the_exact_name_beside_another_candidate_is_an_error_too(tmp_path):
    """docs/instructors.md: two files that could both be one task's are an error; nothing
    is guessed, not even for the file with the exact name (it may be the untouched stub)."""
    write(tmp_path / "zed" / NAMES[1])
    write(tmp_path / "zed" / "task1.py")
    write(tmp_path / "yan" / NAMES[1])
    write(tmp_path / "yan" / "hw" / "task1_final.py")
    write(tmp_path / "dee_task1.py")
    write(tmp_path / f"dee_{NAMES[1]}")
    found = grading.find_students(tmp_path, NAMES)
    for student, listed in (
        ("zed", "zed/task1.py, zed/task1_scatter.py"),
        ("yan", "yan/task1_scatter.py, yan/hw/task1_final.py"),
        ("dee", "dee_task1.py, dee_task1_scatter.py"),
    ):
        why = found.students[student][NAMES[1]]
        assert isinstance(why, NotTaken) and listed in why, why
        assert any(w.startswith(f"{student}: two or more") for w in found.warnings)


def rows_of(*results: tuple[str, int, bool]) -> list[tuple[str, grading.CheckResult]]:
    return [(s, grading.CheckResult(t, f"check {i}", p)) for i, (s, t, p) in enumerate(results)]


def test_the_summary_weights_each_task_by_the_share_of_its_checks(tmp_path):
    rows = rows_of(
        ("ada", 1, True), ("ada", 1, False), ("ada", 2, True),
        ("bo", 1, False), ("bo", 1, False), ("bo", 2, True),
    )  # fmt: skip
    weights_file = tmp_path / "weights.toml"
    weights_file.write_text("[weights]\n1 = 20\n")
    weights = grading.read_weights(weights_file)
    out = tmp_path / "summary.csv"
    grading.write_summary(rows, out, weights)
    table = list(csv.reader(out.open()))
    assert table == [
        ["student", "task1", "task2", "total", "out_of"],
        ["ada", "10.0", "10.0", "20.0", "30.0"],  # half of task 1's 20, all of task 2's 10
        ["bo", "0.0", "10.0", "10.0", "30.0"],
    ]
    (tmp_path / "bad.toml").write_text("[weights]\none = 3\n")
    with pytest.raises(ValueError, match="TASK = POINTS"):
        grading.read_weights(tmp_path / "bad.toml")


def test_feedback_is_one_report_per_student_with_a_safe_file_name(tmp_path):
    rows = rows_of(("ada", 1, True), ("../../etc/x", 1, False), ("_../etc/x", 1, False))
    written = grading.write_feedback(rows, tmp_path / "feedback")
    assert sorted(written) == ["_.._etc_x-2.txt", "_.._etc_x.txt", "ada.txt"]
    assert sorted(os.listdir(tmp_path / "feedback")) == sorted(written)
    assert "1/1 checks passed" in (tmp_path / "feedback" / "ada.txt").read_text()


def test_similar_code_is_found_through_renames_comments_and_layout():
    stub = (EXERCISES / NAMES[1]).read_text()
    solution = (EXERCISES / "solutions" / NAMES[1]).read_text()
    renamed = solution.replace("pieces", "parts").replace("sizes", "plan")
    renamed = renamed.replace("    return tuple(", "    # my own comment\n\n    return tuple(")
    other = solution.replace("return []", "return list()")
    files = {"ada": {1: solution}, "bo": {1: renamed}, "cy": {1: stub}, "dee": {1: other}}
    pairs = {(p.first, p.second): p.ratio for p in similar_pairs(files, {1: stub})}
    assert pairs[("ada", "bo")] == 1.0
    assert 0.9 <= pairs[("ada", "dee")] < 1.0
    assert not any("cy" in pair for pair in pairs), "an untouched stub is nobody's copy"
    assert normalised("x = 1  # c\n") == normalised('"""doc"""\ny = 1\n')


@pytest.fixture
def quick_folder(tmp_path):
    """An empty folder, on tmpfs where there is one: on this VM's ext4 each rmdir took 3 ms
    (4.5 s for 1,500 levels), on tmpfs 0.1 s in all; what is removed, and how, is the same."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    folder = Path(tempfile.mkdtemp(prefix="dpkit-test-", dir=shm))
    try:
        yield folder
    finally:
        remove_tree(folder)


def test_a_folder_1500_levels_deep_is_removed(quick_folder):
    tmp_path = quick_folder
    here = os.open(tmp_path, os.O_RDONLY)
    top = here
    for _ in range(1500):
        os.mkdir("d", dir_fd=here)
        below = os.open("d", os.O_RDONLY, dir_fd=here)
        if here != top:
            os.close(here)
        here = below
    os.symlink("/etc", "link", dir_fd=here)  # removed as a link, never followed
    os.chmod(here, 0o500)  # a folder made read-only
    os.close(here)
    os.close(top)
    assert remove_tree(tmp_path / "d") is None
    assert not (tmp_path / "d").exists() and Path("/etc").is_dir()


@contextlib.contextmanager
def as_a_student(folder: Path):
    """Permissions as a student's run meets them. Root ignores them, so as root the block
    runs as the user nobody (the effective user and group; the real ones stay root's, to
    come back), in ``folder``, handed over to it first."""
    if os.geteuid() != 0:
        yield
        return
    os.chown(folder, NOBODY, NOBODY)
    os.setegid(NOBODY)
    os.seteuid(NOBODY)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


NOBODY = 65534


def test_folders_a_submission_locked_are_opened_up_and_removed():
    folder = Path(tempfile.mkdtemp(prefix="dpkit-test-"))  # in /tmp: nobody can reach it
    try:
        with as_a_student(folder):
            top = folder / "run"
            for sub in ("locked", "read-only", "read-only/inner"):
                (top / sub).mkdir(parents=True)
                (top / sub / "file.py").write_text("x = 1\n")
            (top / "loose.txt").write_text("")
            os.chmod(top / "read-only" / "inner", 0)  # nobody may list or enter it
            os.chmod(top / "read-only", 0o500)  # nor remove what is in it
            os.chmod(top / "locked", 0)
            assert remove_tree(top) is None
            assert not top.exists()
    finally:
        remove_tree(folder)


def test_what_cannot_be_removed_is_named_and_nothing_raises():
    if os.geteuid() != 0:
        pytest.skip("needs root, to give a student's folder one the student cannot open up")
    folder = Path(tempfile.mkdtemp(prefix="dpkit-test-"))
    try:
        (folder / "run" / "kept").mkdir(parents=True)  # root's, inside the student's own
        (folder / "run" / "kept" / "file.py").write_text("")
        os.chown(folder / "run", NOBODY, NOBODY)
        with as_a_student(folder):
            why = remove_tree(folder / "run")
        assert why == f"{folder / 'run'}: Operation not permitted", why
        assert (folder / "run" / "kept" / "file.py").exists()
    finally:
        remove_tree(folder)


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_jobs_must_be_a_whole_number_from_1(value, capsys):
    from dpkit.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["grade", "--submissions", ".", "--csv", "g.csv", "--jobs", value])
    assert exit_.value.code == 2 and "--jobs" in capsys.readouterr().err


@pytest.mark.slow
def test_ctrl_c_stops_a_class_at_once_and_writes_the_csv(tmp_path):
    """Ctrl-C while students are graded in parallel: every run stops within seconds (not
    when its time limit ends), the CSVs are written, the exit code is 130 (about 8 s). It
    waits until both runs have started (each leaves a file in its home), not a fixed time:
    on a busy machine, starting the grader alone took more than 4 s."""
    import signal
    import subprocess
    import sys
    import time

    hang = "open('started', 'w').close()\nimport time\ntime.sleep(600)\n"  # in its home
    for student in ("ada", "bo"):
        write(tmp_path / "class" / student / NAMES[1], hang)
    scratch = tmp_path / "tmp"  # where the runs' folders are made
    scratch.mkdir()
    restore = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "sys.argv = ['dpkit', *sys.argv[1:]]; runpy.run_module('dpkit', run_name='__main__')"
    )
    command = [sys.executable, "-c", restore, "grade", "--submissions", str(tmp_path / "class")]
    command += ["--csv", str(tmp_path / "g.csv"), "--tasks", "1", "--jobs", "2"]
    cli = subprocess.Popen(
        command,
        cwd=EXERCISES.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(scratch)},
    )
    deadline = time.monotonic() + 90  # both runs started, however busy the machine
    while len(list(scratch.rglob("started"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    started = len(list(scratch.rglob("started")))
    time.sleep(0.5)  # the import hangs for 10 s, the task for 60
    cli.send_signal(signal.SIGINT)
    sent = time.monotonic()
    out, err = cli.communicate(timeout=60)
    assert started == 2, f"{started} of the 2 runs had started after 90 s: {err}"
    assert cli.returncode == 130, (out, err)
    # A run left to its import's limit (10 s from the import's start) would end up to 9.5 s
    # after the signal; on a loaded machine (load 7 on 2 cores) stopping took 5.3 s.
    assert time.monotonic() - sent < 7, "Ctrl-C waited for the runs in flight"
    assert (tmp_path / "g.csv").exists() and (tmp_path / "g-summary.csv").exists()
    assert "interrupted" in err


def test_the_pipes_are_read_past_descriptor_1023():
    """A grading process with over a thousand files open (an xdist worker had one in CI) got
    pipes past 1023, which select() refuses: every student's grading failed with 'filedescriptor
    out of range in select()'. The reader polls instead."""
    import resource

    from dpkit.grading.sandbox import _Reader

    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 1200:
        pytest.skip("this machine allows fewer than 1,200 open files")
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    results, output = os.pipe(), os.pipe()
    try:
        assert results[0] > 1023
        os.write(results[1], b"signed results")
        os.write(output[1], b"printed")
        reader = _Reader(results[0], output[0])
        assert reader.read(1.0)
        assert bytes(reader.results) == b"signed results" and bytes(reader.output) == b"printed"
    finally:
        for fd in (*held, *results, *output):
            os.close(fd)


def test_the_exercises_folder_is_found_from_its_parent_itself_or_the_checkout(
    tmp_path, monkeypatch
):
    write(tmp_path / "course" / "exercises" / "graders" / "test_task1.py")
    found = tmp_path / "course" / "exercises"
    assert grading.find_exercises(tmp_path / "course") == found
    assert grading.find_exercises(found) == found
    with pytest.raises(FileNotFoundError) as error:
        grading.find_exercises(tmp_path / "elsewhere")
    assert str(tmp_path / "elsewhere") in str(error.value)
    assert "run dpkit grade from the root of the dpkit checkout" in str(error.value)
    monkeypatch.chdir(found / "graders")  # no exercises/ here: dpkit's own checkout's
    assert grading.find_exercises() == EXERCISES.resolve()
    monkeypatch.chdir(tmp_path / "course")
    assert grading.find_exercises() == found


def test_a_task_given_twice_or_not_there_is_refused_before_any_grading(tmp_path):
    """Graded twice, a task's checks would count twice (0/32 for a task of 16 checks)."""
    write(tmp_path / "ada" / NAMES[1])
    assert chosen_tasks(EXERCISES, None) == list(NAMES)
    assert chosen_tasks(EXERCISES, [3, 1]) == [3, 1]  # in the order given
    with pytest.raises(ValueError, match="^tasks 1, 3 are given twice: give each task once$"):
        chosen_tasks(EXERCISES, [3, 1, 1, 3, 3])
    with pytest.raises(ValueError, match="there is no task 99"):
        chosen_tasks(EXERCISES, [1, 99])
    # The library's entry points refuse them too, before a grading process is started.
    with pytest.raises(ValueError, match="task 1 is given twice"):
        grading.grade_folder(tmp_path / "ada", [1, 1])
    with pytest.raises(ValueError, match="task 1 is given twice"):
        grading.grade_submissions(tmp_path, [1, 2, 1])


def test_a_file_or_folder_that_is_not_there_is_an_error_not_failed_checks(tmp_path):
    with pytest.raises(ValueError, match="the file '.*nothere.py' does not exist"):
        grading.grade(1, tmp_path / "nothere.py")
    with pytest.raises(ValueError, match="the folder '.*nodir' does not exist"):
        grading.grade_folder(tmp_path / "nodir")
    with pytest.raises(ValueError, match="is a folder, not a file"):
        grading.grade(1, tmp_path)


def test_a_task_needs_its_stub_and_its_grader(tmp_path):
    write(tmp_path / "task1_scatter.py")
    write(tmp_path / "task3_apply.py")
    write(tmp_path / "graders" / "test_task1.py")
    check_task(tmp_path, 1)
    with pytest.raises(ValueError, match="there is no task 2; the tasks are 1, 3"):
        check_task(tmp_path, 2)
    with pytest.raises(ValueError, match="task 3 has no grader: .*test_task3.py is missing"):
        check_task(tmp_path, 3)


def test_a_lone_renamed_file_is_graded_for_its_task(tmp_path):
    exact = tmp_path / NAMES[1]
    assert submission_file(tmp_path, NAMES[1]) == exact  # nothing there: the expected name
    write(tmp_path / "task1.py")
    assert submission_file(tmp_path, NAMES[1]) == tmp_path / "task1.py"
    write(tmp_path / "task1_mine.py")  # two could be it: none is guessed
    assert submission_file(tmp_path, NAMES[1]) == exact
    write(exact)
    assert submission_file(tmp_path, NAMES[1]) == exact
