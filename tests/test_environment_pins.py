"""The course environment is pinned in requirements/course.txt and repeated in environment.yml;
the tools that test it are pinned in requirements/test.txt, apart, so a learner installs none.

These tests fail when one file is edited and the other is not, when torch drifts from the
exact pin (a looser spec lets pip pick a multi-GB CUDA build), or when the package's own torch
dependency stops being a lower bound.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COURSE_TXT = ROOT / "requirements" / "course.txt"
TEST_TXT = ROOT / "requirements" / "test.txt"
ENVIRONMENT_YML = ROOT / "environment.yml"
PYPROJECT = ROOT / "pyproject.toml"

PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[A-Za-z0-9.+!-]+)$")


def canonical(name: str) -> str:
    """PEP 503 normalisation: jupyterlab_widgets and jupyterlab-widgets are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pin(line: str, source: str) -> tuple[str, str]:
    match = PIN.match(line)
    if match is None:
        raise AssertionError(f"{source}: {line!r} is not an exact 'name==version' pin")
    return canonical(match["name"]), match["version"]


def pins_from_requirements(text: str, source: str = "requirements/course.txt") -> dict[str, str]:
    pins: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, version = parse_pin(line, source)
        assert name not in pins, f"{source} pins {name} twice"
        pins[name] = version
    return pins


def pip_section_from_environment(text: str) -> list[str]:
    """The items of the `- pip:` list, read line by line (no YAML parser needed)."""
    lines = text.splitlines()
    starts = [index for index, raw in enumerate(lines) if raw.strip() == "- pip:"]
    assert len(starts) == 1, "environment.yml needs exactly one '- pip:' section"
    pip_indent = len(lines[starts[0]]) - len(lines[starts[0]].lstrip())
    items: list[str] = []
    for raw in lines[starts[0] + 1 :]:
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        indent = len(raw) - len(raw.lstrip())
        if indent <= pip_indent or not stripped.startswith("- "):
            break
        items.append(stripped[2:].split(" #", 1)[0].strip())
    return items


def pins_from_environment(text: str) -> dict[str, str]:
    pins: dict[str, str] = {}
    for item in pip_section_from_environment(text):
        if item.startswith("-e ") or item.startswith("-r "):
            continue
        name, version = parse_pin(item, "environment.yml")
        assert name not in pins, f"environment.yml pins {name} twice"
        pins[name] = version
    return pins


def pin_differences(course: dict[str, str], conda: dict[str, str]) -> list[str]:
    problems = []
    for name in sorted(course.keys() - conda.keys()):
        problems.append(f"{name}=={course[name]} is in requirements/course.txt only")
    for name in sorted(conda.keys() - course.keys()):
        problems.append(f"{name}=={conda[name]} is in environment.yml only")
    for name in sorted(course.keys() & conda.keys()):
        if course[name] != conda[name]:
            problems.append(
                f"{name}: requirements/course.txt has {course[name]}, "
                f"environment.yml has {conda[name]}"
            )
    return problems


@pytest.fixture(scope="module")
def course_pins() -> dict[str, str]:
    return pins_from_requirements(COURSE_TXT.read_text())


@pytest.fixture(scope="module")
def environment_text() -> str:
    return ENVIRONMENT_YML.read_text()


def test_torch_is_pinned_exactly(course_pins):
    assert course_pins.get("torch") == "2.13.0"


@pytest.fixture(scope="module")
def test_pins() -> dict[str, str]:
    return pins_from_requirements(TEST_TXT.read_text(), "requirements/test.txt")


def test_course_pins_hold_what_a_learner_needs_and_no_test_tool(course_pins):
    needed = {"numpy", "jupyterlab", "ipywidgets", "jupyterlab-widgets", "ipykernel", "matplotlib",
              "pytest", "hypothesis"}  # fmt: skip  # the last two: dpkit grade runs the graders
    assert needed <= course_pins.keys(), f"missing pins: {sorted(needed - course_pins.keys())}"
    tools = {"pytest-xdist", "nbval", "playwright", "ruff"}
    assert not tools & course_pins.keys(), "test tools belong in requirements/test.txt"


def test_test_pins_hold_the_test_tools_and_repeat_no_course_pin(course_pins, test_pins):
    needed = {"pytest-xdist", "nbval", "nbformat", "nbconvert", "playwright", "ruff"}
    assert needed <= test_pins.keys(), f"missing pins: {sorted(needed - test_pins.keys())}"
    both = sorted(course_pins.keys() & test_pins.keys())
    assert not both, f"pinned in both requirement files (one place each): {both}"


def test_environment_yml_repeats_every_course_pin(course_pins, environment_text):
    problems = pin_differences(course_pins, pins_from_environment(environment_text))
    assert not problems, "requirements/course.txt and environment.yml disagree:\n" + "\n".join(
        problems
    )


def test_environment_yml_installs_dpkit_editable_on_python_311(environment_text):
    assert "-e ." in pip_section_from_environment(environment_text)
    assert re.search(r"^\s*-\s*python=3\.11\s*$", environment_text, re.MULTILINE)
    assert re.search(r"^name:\s*dpkit\s*$", environment_text, re.MULTILINE)


def test_a_one_sided_edit_is_caught():
    """Guards the comparison itself, on small made-up files: an edit to one side is reported."""
    course = "torch==2.13.0\nruff==0.17.6  # lint\n"
    conda = (
        "name: dpkit\ndependencies:\n  - pip\n  - pip:\n"
        "      - torch==2.13.0\n      - ruff==0.17.6\n      - -e .\n"
    )
    assert pin_differences(pins_from_requirements(course), pins_from_environment(conda)) == []

    bumped = conda.replace("torch==2.13.0", "torch==2.14.0")
    assert pin_differences(pins_from_requirements(course), pins_from_environment(bumped)) == [
        "torch: requirements/course.txt has 2.13.0, environment.yml has 2.14.0"
    ]
    dropped = course.replace("ruff==0.17.6  # lint\n", "")
    assert pin_differences(pins_from_requirements(dropped), pins_from_environment(conda)) == [
        "ruff==0.17.6 is in environment.yml only"
    ]
    with pytest.raises(AssertionError, match="not an exact"):
        pins_from_requirements("torch>=2.13\n")


def test_pyproject_torch_dependency_is_a_lower_bound():
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from 3.11")
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    torch_specs = [dep for dep in project["dependencies"] if re.match(r"^torch\b(?![-_.\w])", dep)]
    assert torch_specs == ["torch>=2.4"]
    assert project["requires-python"] == ">=3.10"
    for extra, deps in project.get("optional-dependencies", {}).items():
        for dep in deps:
            assert "==" not in dep, f"extra {extra!r} pins {dep!r}; extras take lower bounds only"


def test_binder_builds_the_learners_pins_on_environment_yml_s_python(environment_text):
    """binder/ (repo2docker): the course's pins through -r, torch from the CPU index, the same
    Python as environment.yml, and dpkit installed from the repository by postBuild."""
    binder = ROOT / "binder"
    lines = [
        line.strip()
        for line in (binder / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines == ["--extra-index-url https://download.pytorch.org/whl/cpu",
                     "-r ../requirements/course.txt"]  # fmt: skip
    assert (binder / lines[1].split()[1]).resolve() == COURSE_TXT
    python = re.search(r"^\s*-\s*python=(\d+\.\d+)\s*$", environment_text, re.MULTILINE)[1]
    assert (binder / "runtime.txt").read_text().strip() == f"python-{python}"
    post_build = binder / "postBuild"
    assert os.access(post_build, os.X_OK), "repo2docker runs postBuild only if it is executable"
    assert "pip install --no-cache-dir --no-deps -e ." in post_build.read_text()


def test_the_lab_extra_can_grade():
    """``pip install dpkit[lab]`` then ``dpkit course DIR`` and ``dpkit grade 1``: the graders
    run under pytest, some with hypothesis (without them every grade crashed)."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from 3.11")
    lab = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]["lab"]
    names = {canonical(re.split(r"[<>=!~ ;\[]", dep, maxsplit=1)[0]) for dep in lab}
    assert {"pytest", "hypothesis"} <= names, f"the lab extra: {sorted(names)}"


def test_make_venv_installs_the_torch_pin_with_pip_before_uv_installs_the_rest(tmp_path):
    """``make venv``'s plan: pip installs torch's exact pin first (pip follows the machine's
    settings; another installer resolving torch>=2.4 could pull a multi-GB CUDA build), then
    an exactly pinned uv, then the course's packages through uv with pip as the fallback."""
    torch_pin = next(
        line for line in COURSE_TXT.read_text().splitlines() if line.startswith("torch==")
    )
    plan = subprocess.run(
        ["make", "-n", "venv", f"VENV={tmp_path / 'venv'}"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    pip = f"{tmp_path / 'venv'}/bin/python -m pip install"
    torch_first = next(
        i for i, line in enumerate(plan) if line.startswith(pip) and torch_pin in line
    )
    uv_install = next(i for i, line in enumerate(plan) if re.search(r'"uv==[\d.]+"', line))
    course = next(i for i, line in enumerate(plan) if "-r requirements/course.txt" in line)
    assert torch_first < uv_install < course, plan
    assert plan[uv_install].startswith(pip)
    uv_route, pip_route = plan[course].split("else", 1)
    assert "bin/uv pip install" in uv_route and "-r requirements/course.txt -e ." in uv_route
    assert f"{pip} --no-compile" in pip_route and "-r requirements/course.txt -e ." in pip_route
