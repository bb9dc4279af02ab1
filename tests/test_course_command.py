"""pip install + ``dpkit course DIR`` + a graded exercise, without git (issue 31).

A wheel is built from a copy of the checkout, as pip builds one from a clean clone, and
unpacked where Python finds it instead of the checkout; then ``dpkit course`` writes the
course and ``dpkit grade 1`` grades the untouched stub in it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from dpkit.course import COURSE_FILES, course_files, write_course

ROOT = Path(__file__).resolve().parent.parent
# What a build reads from a checkout (the rest of the repository is not part of the package).
BUILD_INPUTS = ("dpkit", "notebooks", "exercises", "examples", "pyproject.toml", "setup.py",
                "MANIFEST.in", "README.md", "LICENSE")  # fmt: skip


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The wheel's files, unpacked: a site-packages holding dpkit as pip installs it."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "checkout"
    for name in BUILD_INPUTS:
        path = ROOT / name
        if path.is_dir():
            ignored = shutil.ignore_patterns("__pycache__", "_course", "*.egg-info")
            shutil.copytree(path, source / name, ignore=ignored)
        else:
            shutil.copy(path, source / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(work), str(source)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = work.glob("dpkit-*.whl")
    site = work / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    return site


def _dpkit(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-m", "dpkit", *args], cwd=cwd, env=env,
                          capture_output=True, text=True)  # fmt: skip


def test_the_wheel_carries_the_course_and_never_the_solutions(installed):
    packed = installed / "dpkit" / "_course"
    assert course_files(packed) == course_files(ROOT)
    names = {path.name for path in course_files(packed)}
    assert {"00_start_here.ipynb", "task1_scatter.py", "test_task1.py", "ddp_recipe.py"} <= names
    assert not list(packed.rglob("solutions")), "the solutions must stay out of the wheel"
    assert set(COURSE_FILES) == {p.name for p in packed.iterdir()}


def test_dpkit_course_writes_a_course_that_grades_its_stubs(installed, tmp_path):
    course = tmp_path / "my course"
    written = _dpkit(installed, "course", str(course), cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    assert "jupyter lab notebooks/00_start_here.ipynb" in written.stdout
    assert (course / "notebooks" / "00_start_here.ipynb").is_file()
    graded = _dpkit(installed, "grade", "1", cwd=course)
    assert "0/" in graded.stdout and "checks passed" in graded.stdout, graded.stdout + graded.stderr


def test_a_second_run_keeps_the_learners_edits_unless_told(tmp_path):
    write_course(tmp_path)
    edited = tmp_path / "exercises" / "task1_scatter.py"
    edited.write_text("# my work\n")
    with pytest.raises(ValueError, match=r"already holds .* and \d+ more; .*--overwrite"):
        write_course(tmp_path)
    assert edited.read_text() == "# my work\n"
    write_course(tmp_path, overwrite=True)
    assert edited.read_text() == (ROOT / "exercises" / "task1_scatter.py").read_text()


def test_a_file_as_the_target_is_a_clear_error(tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("")
    with pytest.raises(ValueError, match="is a file; give a folder"):
        write_course(target)


def test_what_is_in_the_way_is_refused_before_anything_is_written(tmp_path):
    (tmp_path / "exercises").write_text("my notes")  # a file where the course needs a folder
    with pytest.raises(ValueError, match=r": exercises is a file, and the course needs a folder"):
        write_course(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["exercises"]  # nothing written
    (tmp_path / "exercises").unlink()
    (tmp_path / "notebooks" / "00_start_here.ipynb").mkdir(parents=True)  # and the reverse
    with pytest.raises(ValueError, match=r"00_start_here.ipynb is a folder, and the course needs"):
        write_course(tmp_path, overwrite=True)  # --overwrite replaces files, not folders
    assert [p.name for p in tmp_path.rglob("*")] == ["notebooks", "00_start_here.ipynb"]


def test_an_empty_target_is_not_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="target is empty; give a folder"):
        write_course("")
    assert list(tmp_path.iterdir()) == []


# -- `dpkit course` in this process: its errors name FOLDER, in one line


@pytest.fixture
def course_here(capsys, monkeypatch):
    """``dpkit course ARGS`` through ``dpkit.cli.main``: (exit status, stdout, stderr)."""
    from dpkit import cli

    monkeypatch.delenv("DPKIT_DEBUG", raising=False)

    def run(*args: str) -> tuple[int, str, str]:
        status = cli.main(["course", *args])
        captured = capsys.readouterr()
        return status, captured.out, captured.err

    return run


def test_an_empty_folder_argument_is_refused_and_nothing_written(
    course_here, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    status, out, err = course_here("")
    assert (status, out) == (2, "")
    assert (
        err
        == "dpkit: error: ValueError: FOLDER is empty; give a folder, e.g. dpkit course my-course\n"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "where, words",
    [
        ("a_file", "FOLDER {}: is a file, not a folder; give a folder, e.g. dpkit course"),
        ("a_file/course", "FOLDER {}: cannot write there (Not a directory); give a folder you"),
    ],
)
def test_a_folder_that_cannot_be_written_is_a_one_line_error_naming_folder(
    course_here, tmp_path, where, words
):
    (tmp_path / "a_file").write_text("")
    status, out, err = course_here(str(tmp_path / where))
    assert (status, out) == (2, "")
    assert err.startswith("dpkit: error: ValueError: " + words.format(tmp_path / where))
    assert err.count("\n") == 1  # no traceback
    assert [p.name for p in tmp_path.iterdir()] == ["a_file"]


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_folder_the_system_will_not_make_is_a_one_line_error(course_here):
    status, _, err = course_here("/proc/dpkit-course")  # even root cannot make a folder here
    assert status == 2
    assert err.startswith("dpkit: error: ValueError: FOLDER /proc/dpkit-course: cannot write there")


def test_a_file_in_the_folder_where_the_course_needs_a_folder_names_folder(course_here, tmp_path):
    (tmp_path / "notebooks").write_text("")
    status, out, err = course_here(str(tmp_path))
    assert (status, out) == (2, "")
    # one line naming FOLDER, what is in the way and the fix; the whole text is
    # docs/bad_input.md's row (tests/test_bad_input_table.py)
    assert err.startswith(f"dpkit: error: ValueError: FOLDER {tmp_path}: notebooks is a file")
    assert "move it away or choose another folder" in err and err.count("\n") == 1
    assert [p.name for p in tmp_path.iterdir()] == ["notebooks"]


def test_the_next_step_quotes_a_folder_with_a_space(course_here, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    status, out, _ = course_here("my course")
    assert status == 0
    assert "next: cd 'my course' && jupyter lab notebooks/00_start_here.ipynb\n" in out
    assert (tmp_path / "my course" / "notebooks" / "00_start_here.ipynb").is_file()
