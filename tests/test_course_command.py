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
