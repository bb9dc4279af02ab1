"""A class's grading run in namespaces (dpkit.grading.apart): what the run can see, checked
by running a shell in one, and which folders it may cover."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dpkit.grading import apart


def test_a_wrapped_run_sees_its_own_files_alone(tmp_path):
    if not apart.available():
        pytest.skip(f"no user namespaces here: {apart.WHY_NOT}")
    parent = tmp_path / "class"  # where every run of a class is made
    (parent / "dpkit-grade-other").mkdir(parents=True)
    (parent / "dpkit-grade-other" / "answers.py").write_text("the other student's\n")
    scratch = parent / "dpkit-grade-mine"
    files = scratch / scratch.name  # the run's files, one level down
    (files / "home").mkdir(parents=True)
    (files / "mine.py").write_text("mine\n")
    solutions = tmp_path / "solutions"
    solutions.mkdir()
    (solutions / "task1.py").write_text("the reference\n")
    shell = (
        f"pwd; echo $$; ls -A {parent}; echo ---; ls -A {solutions}; echo ---; "
        f"cat {scratch}/mine.py; grep -c : /proc/net/dev"
    )
    command = apart.wrap(["/bin/sh", "-c", shell], scratch, [solutions])
    ran = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split("\n") == [
        f"{scratch}/home",  # its own files at the scratch folder's own path
        "1",  # the first process of its own PID namespace
        scratch.name,  # the class's folder shows this run alone
        "---",  # the solutions are covered by an empty folder
        "---",
        "mine",
        "1",  # one network interface: the loopback
        "",
    ]


def test_a_folder_python_lives_under_cannot_be_covered(tmp_path):
    assert apart.usable_for(tmp_path / "class" / "run")
    assert not apart.usable_for(Path(sys.prefix) / "run")  # the interpreter is below
    # dpkit itself is below, the interpreter not: every path is looked at
    assert not apart.usable_for(Path(apart.__file__).parent / "run")


def test_every_folder_of_the_checkout_is_covered_but_the_one_python_lives_in(tmp_path, monkeypatch):
    """Copies of the solutions sit anywhere in a checkout (build/mutation/*/ after `make
    mutation`, .git): a class's runs see none of its folders, except Python's own."""
    checkout = tmp_path / "course"
    for folder in ("exercises/solutions", "build/mutation/x/exercises/solutions", ".git"):
        (checkout / folder).mkdir(parents=True)
    (checkout / ".venv" / "bin").mkdir(parents=True)
    (checkout / "README.md").write_text("a file: nothing to cover\n")
    monkeypatch.setattr(sys, "prefix", str(checkout / ".venv"))
    covered = apart.out_of_sight(checkout / "exercises")
    assert covered == [checkout / name for name in (".git", "build", "exercises")]
    # a checkout at / would cover the system: its solutions alone, then
    assert apart.out_of_sight(Path("/exercises")) == [Path("/exercises/solutions")]
