"""A task's rule, "write the function yourself", read from a submission's text before it
runs and from its module after the import (dpkit.grading.rules), on files written here:
each verdict names the line and the rule, as the grading process reports it."""

from __future__ import annotations

import importlib.util
import sys
import threading
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
    assert verdict.startswith("bound.py: scatter is student_other.Helper.scatter (compiled from")


def test_a_grader_s_forbidden_names_are_its_list():
    grader = type("Grader", (), {"FORBIDDEN": ["dpkit.scatter", "torch.chunk"]})
    assert rules.forbidden_names(grader) == ("dpkit.scatter", "torch.chunk")
    assert rules.forbidden_names(type("Plain", (), {})) == ()


# --------------------------------------------------------------------------------------
# While the checks run: forbidden functions guarded, on a library made here (a module
# named under dpkit, as the guard replaces references in dpkit's and torch's modules only).

LIBRARY = """
def helper(x):
    return x + 1


class Base:
    def chunk(self):
        return "chunked"


class Child(Base):
    pass


class Maker:
    @classmethod
    def make(cls):
        return cls.__name__
"""

GRADER = """
import pytest

FORBIDDEN = ["dpkit._rules_lib.helper"]


@pytest.fixture
def lanes():
    def inner():
        return 4

    return inner()


def reference_sizes(n):
    return [n]


def test_uses_the_helper(lib):
    return lib.helper(1)
"""


@pytest.fixture
def library(monkeypatch):
    lib = types.ModuleType("dpkit._rules_lib")
    exec(LIBRARY, lib.__dict__)
    alias = types.ModuleType("dpkit._rules_alias")
    alias.plus_one = lib.helper  # the same function under another name, elsewhere
    for module in (lib, alias):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    return lib, alias


def student_call(student: Path, expression: str, **names):
    """``expression`` evaluated as line 3 of the student's file."""
    code = compile("\n\n" + expression, str(student), "eval")
    return eval(code, dict(names))


def test_a_forbidden_function_refuses_the_student_s_file_alone(library, tmp_path):
    lib, alias = library
    student = tmp_path / "task1_scatter.py"
    original = lib.helper
    rules.forbid(["dpkit._rules_lib.helper", "dpkit._rules_lib.missing"], student, 1, tmp_path)
    assert lib.helper is not original and rules.lent(lib.helper) is original
    assert alias.plus_one is lib.helper  # the alias is guarded too
    assert (lib.helper.__name__, lib.helper.__module__) == ("helper", original.__module__)
    assert lib.helper(1) == 2  # anyone else (here the test, in the main thread) may call it
    for call in ("lib.helper(1)", "plus_one(1)"):
        with pytest.raises(rules.ForbiddenCall) as refused:
            student_call(student, call, lib=lib, plus_one=alias.plus_one)
        assert str(refused.value) == (  # exact: built from the file, line, name and task
            "task1_scatter.py line 3 calls dpkit._rules_lib.helper, which task 1 asks you to "
            "write yourself (the file's docstring says what you may use)"
        )
    guard = lib.helper
    rules.forbid(["dpkit._rules_lib.helper"], student, 1, tmp_path)
    assert lib.helper is guard  # guarded once
    assert rules.lent(original) is original


def test_a_thread_the_submission_started_is_refused_by_name(library, tmp_path):
    lib, _ = library
    rules.forbid(["dpkit._rules_lib.helper"], tmp_path / "task1_scatter.py", 1, tmp_path)
    errors = []

    def worker():
        try:
            lib.helper(1)
        except rules.ForbiddenCall as error:
            errors.append(str(error))

    thread = threading.Thread(target=worker, name="students-worker")
    thread.start()
    thread.join()
    assert errors == [
        "dpkit._rules_lib.helper was called from the thread 'students-worker', which your "
        "code started; task 1 asks you to write it yourself"
    ]


def test_methods_and_classmethods_are_guarded_where_they_are_defined(library, tmp_path):
    lib, _ = library
    student = tmp_path / "task4_gather.py"
    rules.forbid(["dpkit._rules_lib.Child.chunk", "dpkit._rules_lib.Maker.make"], student, 4,
                 tmp_path)  # fmt: skip
    assert lib.Child().chunk() == "chunked" and lib.Maker.make() == "Maker"
    assert isinstance(vars(lib.Maker)["make"], classmethod)  # still a classmethod
    for call in ("lib.Base().chunk()", "lib.Child().chunk()", "lib.Maker.make()"):
        with pytest.raises(rules.ForbiddenCall, match="task4_gather.py line 3 calls"):
            student_call(student, call, lib=lib)


def test_install_guards_each_grader_s_names_and_its_own_helpers(library, tmp_path):
    lib, _ = library
    (tmp_path / "test_task1.py").write_text(GRADER)
    spec = importlib.util.spec_from_file_location("grader_task1", tmp_path / "test_task1.py")
    grader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(grader)
    student = tmp_path / "task1_scatter.py"
    helper, test = grader.reference_sizes, grader.test_uses_the_helper
    rules.install([(grader, student, 1)])
    assert grader.test_uses_the_helper is test  # the checks themselves stay as they are
    assert rules.lent(grader.reference_sizes) is helper
    assert grader.test_uses_the_helper(lib) == 2  # the grader's own call is allowed
    with pytest.raises(rules.ForbiddenCall, match="line 3 calls dpkit._rules_lib.helper"):
        student_call(student, "lib.helper(1)", lib=lib)
    with pytest.raises(rules.ForbiddenCall) as refused:
        student_call(student, "reference_sizes(4)", reference_sizes=grader.reference_sizes)
    assert str(refused.value) == (  # exact: built from the file, line and the grader's name
        "task1_scatter.py line 3 calls the grader's own reference_sizes: the grade is for code "
        "you wrote"
    )
    # the grader's code, fixtures and nested functions included, counts as the grader's
    codes = rules.code_of([grader])
    fixture = grader.lanes._get_wrapped_function().__code__
    nested = next(c for c in fixture.co_consts if isinstance(c, types.CodeType))
    assert {fixture, nested, test.__code__} <= codes  # (its helpers are guards by now)
    # the grader's code, called from the student's file, may still use what it forbids
    assert student_call(student, "check(lib)", check=grader.test_uses_the_helper, lib=lib) == 2


# --------------------------------------------------------------------------------------
# The routes of issue 41: a lazy answer, code compiled under another file's name, a
# subclass of dpkit's finished class, a forbidden method on a built-in type.

LAZY = """
import dpkit._rules_lib as lib


def sizes(count):
    return map(lib.helper, range(count))


def written(count):
    return [lib.helper(1)] * count
"""


def test_a_lazy_answer_runs_inside_the_student_s_call(library, tmp_path):
    """map(helper, ...) returned, then iterated by the grader, calls helper with no student
    frame on the stack; answer_inside runs it inside the student's call."""
    lib, _ = library
    student = tmp_path / "task1_scatter.py"
    student.write_text(LAZY)
    module = load(student)
    rules.forbid(["dpkit._rules_lib.helper"], student, 1, tmp_path)
    assert list(module.sizes(2)) == [1, 2]  # the route: the caller's frame ran the helper
    rules.answer_inside(module, student, ["sizes", "written", "missing"])
    with pytest.raises(rules.ForbiddenCall) as refused:
        module.sizes(2)
    assert str(refused.value).startswith("task1_scatter.py line 5 calls dpkit._rules_lib.helper")
    with pytest.raises(rules.ForbiddenCall, match="line 10 calls dpkit._rules_lib.helper"):
        module.written(1)  # a direct call still names its own line
    assert module.sizes.__name__ == "sizes"


def test_an_iterator_answer_is_the_same_items_and_an_endless_one_is_refused(tmp_path):
    student = tmp_path / "task6_weighted.py"
    student.write_text(
        "import itertools\n\ndef sizes(n):\n    return (i * i for i in range(n))\n\n"
        "def endless():\n    return itertools.count()\n\ndef plain():\n    return [1, 2]\n"
    )
    module = load(student)
    rules.answer_inside(module, student, ["sizes", "endless", "plain"])
    answer = module.sizes(4)
    assert not isinstance(answer, list) and list(answer) == [0, 1, 4, 9]  # still an iterator
    assert module.plain() == [1, 2]
    with pytest.raises(ValueError, match=r"endless \(line 6\) returned an iterator of more than"):
        module.endless()


STUB_CLASS = """
class Gather:
    @staticmethod
    def forward(ctx, x):
        raise NotImplementedError

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError
"""

COMPILED_ELSEWHERE = """
namespace = {}
exec(compile("def forward(ctx, x):\\n    return x\\n", "/usr/lib/python3.11/functools.py",
             "exec"), namespace)


class Gather:
    forward = staticmethod(namespace["forward"])

    @staticmethod
    def backward(ctx, grad):
        return grad
"""

# the file's own function, compiled again under another name: equal code, another file
RECOMPILED = """
def forward(ctx, x):
    return x


_source = "".join(open(__file__).readlines()[:4])  # the function, the same lines
_namespace = {}
exec(compile(_source, "/usr/lib/python3.11/functools.py", "exec"), _namespace)
forward = _namespace["forward"]
"""

SUBCLASS = """
import dpkit._rules_lib as lib


class Gather(lib.Finished):
    pass
"""

OWN = """
import dpkit._rules_lib as lib


class Gather(lib.Base):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad
"""


def test_methods_must_be_compiled_from_the_student_s_file(library, tmp_path):
    lib, _ = library
    exec(  # dpkit's finished class, for a student to subclass
        "class Finished:\n    @staticmethod\n    def forward(ctx, x):\n        return x\n"
        "    @staticmethod\n    def backward(ctx, grad):\n        return grad\n",
        lib.__dict__,
    )
    lib.Finished.__module__ = "dpkit._rules_lib"
    stub = tmp_path / "stub.py"
    stub.write_text(STUB_CLASS)
    methods = rules.stub_methods(stub)
    assert methods == {"Gather": ["forward", "backward"]}

    def verdict(source: str, names=("Gather",)) -> str | None:
        path = tmp_path / "task4_gather.py"
        path.write_text(source)
        return rules.not_written_here(load(path), path, names, methods)

    assert verdict(OWN) is None
    assert verdict(COMPILED_ELSEWHERE) == (
        "task4_gather.py: Gather.forward is elsewhere.forward (compiled from "
        "/usr/lib/python3.11/functools.py), not a method written in your file; the task is "
        "to write it"
    )
    assert verdict(SUBCLASS) == (
        "task4_gather.py: Gather.forward is inherited from dpkit._rules_lib.Finished, not a "
        "method written in your file; the task is to write it"
    )
    assert verdict(RECOMPILED, ["forward"]).startswith(
        "task4_gather.py: forward is elsewhere.forward (compiled from /usr/lib/python3.11/"
    )


def test_dpkit_s_class_is_refused_whatever_the_case_of_its_name(tmp_path):
    path = tmp_path / "task2_replicate.py"
    path.write_text("from dpkit._functions import Broadcast as B\n")
    assert rules.scan_source(path, ["dpkit.comm.broadcast"]) == (
        "task2_replicate.py line 1 imports dpkit._functions.Broadcast, which this task asks "
        "you to write yourself: remove it"
    )


def test_a_method_of_a_built_in_type_is_guarded_there(tmp_path):
    """torch._C.TensorBase refuses setattr; its chunk is guarded all the same."""
    import torch

    student = tmp_path / "task1_scatter.py"
    original = torch._C.TensorBase.chunk
    try:
        rules.forbid(["torch._C.TensorBase.chunk"], student, 1, tmp_path)
        assert len(torch.arange(10).chunk(4)) == 4  # anyone else may call it
        with pytest.raises(rules.ForbiddenCall, match="line 3 calls torch._C.TensorBase.chunk"):
            student_call(student, "TensorBase.chunk(torch.arange(10), 4)",
                         TensorBase=torch._C.TensorBase, torch=torch)  # fmt: skip
    finally:
        rules._set(torch._C.TensorBase, "chunk", original)
    assert torch._C.TensorBase.chunk is original


def test_a_guard_that_cannot_be_put_in_place_stops_the_run(library, monkeypatch, tmp_path):
    monkeypatch.setattr(rules, "_set", lambda owner, attribute, value: None)  # it did nothing
    with pytest.raises(RuntimeError, match="cannot guard dpkit._rules_lib.Base.chunk: grading"):
        rules.forbid(["dpkit._rules_lib.Base.chunk"], tmp_path / "task1_scatter.py", 1, tmp_path)
