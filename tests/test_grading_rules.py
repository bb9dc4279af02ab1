"""A task's rule, "write the function yourself", read from a submission's text before it
runs and from its module after the import (dpkit.grading.rules), on files written here:
each verdict names the line and the rule, as the grading process reports it."""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import pytest

from dpkit.grading import rules

FORBIDDEN = {"dpkit.torch_chunk_sizes", "dpkit.comm.broadcast_coalesced"}

SCANNED = [  # (source, what the verdict says; None: it may be graded)
    ("import math\nfrom exercises.solutions import task1_scatter\n",
     "task.py line 2 imports the reference solutions (exercises.solutions): the grade is "
     "for code you wrote"),
    ("import course.solutions.task1\n", "line 1 imports the reference solutions"),
    ("from exercises import task1_scatter\n", "line 1 imports the reference solutions"),
    ("from dpkit import torch_chunk_sizes\n",
     "task.py line 1 imports dpkit.torch_chunk_sizes, which this task asks you to write "
     "yourself: remove it"),
    # a forbidden function reached through another dpkit module is the same function
    ("\nfrom dpkit.scatter import torch_chunk_sizes as sizes\n",
     "line 2 imports dpkit.torch_chunk_sizes, which this task asks"),
    ("import dpkit\nx = dpkit.comm.broadcast_coalesced\n",
     "line 2 uses dpkit.comm.broadcast_coalesced, which this task asks"),
    ("from os import killpg\n", "line 1 imports os.killpg, which grading refuses"),
    ("import os\nos.killpg(0, 9)\n", "line 2 uses os.killpg, which grading refuses"),
    ("import os\nos.kill(-1, 9)\n", "line 2 uses os.kill outside the run, which grading"),
    ("import os\n\nos.kill(os.getppid(), 15)\n", "line 3 uses os.kill outside the run"),
    ("import os\nos.kill(os.getpid(), 19)\n", None),  # its own process: allowed
    ("import os\nos.kill()\n", None),
    ("from dpkit import scatter\nfrom . import helpers\nimport numpy\n", None),
    ("from other import torch_chunk_sizes\n", None),  # not dpkit's: the student's own
    ("def f(:\n", None),  # a syntax error: the import reports it, with its line
]  # fmt: skip


@pytest.mark.parametrize(("source", "verdict"), SCANNED)
def test_the_source_is_refused_naming_the_line_and_the_rule(source, verdict, tmp_path):
    path = tmp_path / "task.py"
    path.write_text(source)
    found = rules.scan_source(path, FORBIDDEN)
    if verdict is None:
        assert found is None
    else:
        assert found is not None and verdict in found, found


def test_a_file_that_is_not_text_is_left_to_the_import(tmp_path):
    path = tmp_path / "task.py"
    path.write_bytes(b"\xff\xfe\x00")
    assert rules.scan_source(path, FORBIDDEN) is None


def load(path: Path):
    spec = importlib.util.spec_from_file_location(f"student_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_stub_s_names_must_be_written_in_the_student_s_file(tmp_path):
    stub = tmp_path / "stub.py"
    stub.write_text(
        "import math\nLIMIT = 3\n\ndef scatter(x):\n    def inner():\n        pass\n\n"
        "class Lane:\n    def run(self):\n        pass\n"
    )
    assert rules.stub_names(stub) == ["scatter", "Lane"]
    own = tmp_path / "own.py"
    own.write_text("def scatter(x):\n    return x\n\nclass Lane:\n    pass\n")
    assert rules.not_written_here(load(own), own, ["scatter", "Lane", "missing"]) is None
    borrowed = tmp_path / "borrowed.py"
    borrowed.write_text("import math\nfrom collections import OrderedDict as Lane\n"
                        "scatter = math.sqrt\n")  # fmt: skip
    module = load(borrowed)
    assert rules.not_written_here(module, borrowed, ["scatter"]) == (
        "borrowed.py: scatter is math.sqrt, not a function written in your file; the task "
        "is to write it"
    )
    verdict = rules.not_written_here(module, borrowed, ["Lane"])
    assert verdict.startswith("borrowed.py: Lane is collections.OrderedDict, not a class")
    # a method taken from a class of another file is not written here either
    other = tmp_path / "other.py"
    other.write_text("class Helper:\n    def scatter(self, x):\n        return x\n")
    bound = types.ModuleType("student_bound")
    bound.scatter = load(other).Helper().scatter
    verdict = rules.not_written_here(bound, tmp_path / "bound.py", ["scatter"])
    assert verdict.startswith("bound.py: scatter is student_other.Helper.scatter, not a function")


def test_a_grader_s_forbidden_names_are_its_list():
    grader = type("Grader", (), {"FORBIDDEN": ["dpkit.scatter", "torch.chunk"]})
    assert rules.forbidden_names(grader) == ("dpkit.scatter", "torch.chunk")
    assert rules.forbidden_names(type("Plain", (), {})) == ()
