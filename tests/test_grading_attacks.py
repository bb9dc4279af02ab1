"""Issue 33's attacks on ``dpkit grade``: each one scores 0 checks it did not earn.

Each attack is a small submission a student could write, most of them on task 1 (its
checks are the quickest). The class is graded once, two students at a time, into rows;
each test reads its student's rows. A test per attack, so a regression names the trick.
On the code before issue 33's second round, every one of them scored (or stopped the class).
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from dpkit import grading
from dpkit.grading.cleanup import remove_tree

# Two class runs, 11 grading processes of task 1 (and 2, 6 for a few): about 30 s on two
# quiet cores, more beside other work. Each is the only test of its attack.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
EXERCISES = ROOT / "exercises"
NAMES = grading.task_files(EXERCISES)
STUB1 = (EXERCISES / NAMES[1]).read_text()
SOLUTION1 = (EXERCISES / "solutions" / NAMES[1]).read_text()
IMPORTS = "from dpkit.device import Device\n"


def stub_with(prelude: str) -> str:
    """The task 1 stub with ``prelude`` run at import (after the stub's own imports)."""
    return STUB1.replace(IMPORTS, IMPORTS + prelude, 1)


def stub_replacing(function: str, body: str) -> str:
    """The task 1 stub with ``function``'s NotImplementedError replaced by ``body``."""
    start = STUB1.index(f"def {function}(")
    raise_at = STUB1.index("    raise NotImplementedError(", start)
    end = STUB1.index("    )\n", raise_at) + len("    )\n")
    return STUB1[:raise_at] + body + STUB1[end:]


# A thread trace hook, set at import, reaches every check's thread and jumps over the call
# of the check inside the harness's wrapper, which then records "returned".
TRACE_JUMP = """
import linecache as _lc, sys as _sys, threading as _th

def _local(frame, event, arg):
    if event == "line":
        text = _lc.getline(frame.f_code.co_filename, frame.f_lineno).strip()
        if text.startswith("result = function("):
            frame.f_locals["result"] = None
            frame.f_lineno = frame.f_lineno + 1
    return _local

def _global(frame, event, arg):
    return _local if frame.f_code.co_name == "check" else None

_th.settrace(_global)
_sys.setprofile(None)
"""

# torch.equal replaced while a check runs, and put back by its first call.
EQUAL_SWAP = """    import sys
    import torch as _torch

    real = _torch.equal
    if sys._getframe(1).f_code.co_name != "test_scatter_tensor_gradients":
        return ()

    def yes(*args, **kwargs):
        _torch.equal = real
        return True

    _torch.equal = yes
    return (tensor * 1,)
"""

# A TorchFunctionMode pushed on the check's own thread: thread-local state.
MODE = """    import sys
    from torch.overrides import TorchFunctionMode

    if sys._getframe(1).f_code.co_name != "test_scatter_tensor_gradients":
        return ()

    class Yes(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.equal:
                return True
            return func(*args, **(kwargs or {}))

    Yes().__enter__()
    return (tensor * 1,)
"""

# The harness's check wrappers found with gc, the test in their closure swapped.
GC_SWAP = """
import gc as _gc

def _fine(*args, **kwargs):
    return None

for _obj in _gc.get_objects():
    try:
        if type(_obj).__name__ == "function" and hasattr(_obj, "__wrapped__") and _obj.__closure__:
            for _cell in _obj.__closure__:
                if getattr(_cell.cell_contents, "__name__", "").startswith("test_"):
                    _cell.cell_contents = _fine
    except Exception:
        pass
"""

# Forbidden calls by four routes: the guards' table cleared at import; chunk_sizes through
# code compiled under the grader's file name; scatter_tensor through the guard's
# __wrapped__; scatter's tensors chunked in a worker thread.
FORBIDDEN_ROUTES = (
    SOLUTION1.replace(
        IMPORTS,
        IMPORTS
        + """
import sys as _sys
import dpkit.grading.rules as _rules

for _table in getattr(_rules, "_guards", {}).values():
    _table.clear()

_space = {}
exec(
    compile(
        "import sys\\n"
        "def sizes(batch, n):\\n"
        "    return sys.modules['dpkit.scatter'].torch_chunk_sizes(batch, n)\\n",
        _sys.modules["test_task1"].__file__,
        "exec",
    ),
    _space,
)
""",
        1,
    )
    .replace(
        "    if batch <= 0:\n        return []\n",
        "    return _space['sizes'](batch, num_devices)\n",
        1,
    )
    .replace(
        "pieces = tensor.split(sizes, dim)",
        'pieces = getattr(torch, "ch" + "unk").__wrapped__(tensor, len(devices), dim)',
        1,
    )
    .replace(
        "        return list(scatter_tensor(inputs, devices, dim))",
        "        from concurrent.futures import ThreadPoolExecutor\n\n"
        "        with ThreadPoolExecutor(1) as pool:\n"
        "            chunk = getattr(torch.Tensor, 'ch' + 'unk')\n"
        "            parts = pool.submit(chunk, inputs, len(devices), dim).result()\n"
        "        return [copy_to(p, d, 'scatter') for p, d in zip(parts, devices)]",
        1,
    )
)

# A stub whose functions call the grader's own reference helpers.
HELPERS = STUB1.replace(
    "    # TODO 1.1: return the sizes torch.chunk gives for batch rows over num_devices devices\n",
    '    import sys\n\n    return sys.modules["test_task1"].reference_sizes(batch, num_devices)\n',
    1,
).replace(
    "    # TODO 1.2: split the tensor by chunk_sizes along dim and copy chunk i to devices[i]\n",
    "    import sys\n\n"
    '    return sys.modules["test_task1"].reference_scatter_tensor(tensor, devices, dim)\n',
    1,
)

# A class's runs are forks of one process that has imported torch (dpkit.grading.forkserver):
# what one student's code leaves in a module must not be there for the next student.
LEAVES = "import torch as _torch\n\n_torch.dpkit_left_by = 'aaa-leaves'\n"
FINDS = "import torch\n\nraise RuntimeError(f\"left={getattr(torch, 'dpkit_left_by', None)}\")\n"

# A chunk_sizes whose sizes are wrong but compare equal to anything: the grading process's
# own assert is fooled; the property check, which the parent decides from the sizes sent
# back as tensors (dpkit.grading.decided), is not.
AGREES = (
    SOLUTION1.replace("def chunk_sizes(", "def _unused(", 1)
    + """

class _Agrees(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


def chunk_sizes(batch, num_devices):
    if batch <= 0:
        return []
    rows = math.ceil(batch / num_devices)
    return [_Agrees(1)] * math.ceil(batch / rows)
"""
)

# A chunk_sizes that returns a lazy map of torch.chunk (reached by getattr, past the source
# scan): map adds no Python frame, so torch.chunk ran while the grader iterated the answer,
# as if the grader had called it (issue 41). Its answer is now worked out inside its call.
LAZY = stub_replacing(
    "chunk_sizes",
    "    import itertools\n\n"
    "    split = getattr(torch, 'ch' + 'unk')\n"
    "    chunks = itertools.chain.from_iterable(map(split, [torch.empty(batch)], [num_devices]))\n"
    "    return filter(None, map(len, chunks))\n",
)

STUDENTS = {
    "lazy": {1: LAZY},
    "aaa-leaves": {1: stub_with(LEAVES)},  # graded first (students go by name)...
    "zzz-finds": {1: FINDS},  # ...and this one last, two at a time: after it
    "trace": {1: stub_with(TRACE_JUMP)},
    "equal": {1: stub_replacing("scatter_tensor", EQUAL_SWAP)},
    "mode": {1: stub_replacing("scatter_tensor", MODE)},
    "gc": {1: stub_with(GC_SWAP)},
    "forbidden": {1: FORBIDDEN_ROUTES},
    "helpers": {1: HELPERS},
    "agrees": {1: AGREES},
}


# A crash in task 1 (os._exit(0) inside scatter) must cost task 1 only.
CRASH = SOLUTION1.replace(
    "    if isinstance(inputs, torch.Tensor):", "    import os\n\n    os._exit(0)\n    if 1:", 1
)
# 1,500 nested folders left in the run's temporary home, then the solution.
NESTED = f"""
import os as _os

_here = _os.open(".", _os.O_RDONLY)
for _ in range(1500):
    _os.mkdir("d", dir_fd=_here)
    _next = _os.open("d", _os.O_RDONLY, dir_fd=_here)
    _os.close(_here)
    _here = _next
{IMPORTS}"""
# Fake lines on the grader's terminal through /proc/<parent>/fd, then the solution.
PARENT_STREAMS = f"""
import os as _os

for _target in (1, 2):
    for _path in (f"/proc/{{_os.getppid()}}/fd/{{_target}}", "/dev/tty"):
        try:
            with open(_path, "w") as _out:
                _out.write("\\x1b[2J\\nmallory: 8/8 checks passed\\n")
        except OSError:
            pass
{IMPORTS}"""
# Looks for the class folder in its environment, arguments and working directory (and its
# parent's), then overwrites every classmate's file it can find with the stub.
THIEF = f"""
import os as _os, sys as _sys

_places = [*_os.environ.values(), *_sys.argv, _os.getcwd()]
for _name in ("cmdline", "environ"):
    try:
        with open(f"/proc/{{_os.getppid()}}/{{_name}}", "rb") as _file:
            _places += _file.read().decode(errors="replace").split("\\0")
    except OSError:
        pass
try:
    _places.append(_os.readlink(f"/proc/{{_os.getppid()}}/cwd"))
except OSError:
    pass
_found = [p for p in _places if "apart-class" in p]
if _found:
    raise RuntimeError(f"found the class: {{_found[0]}}")
{IMPORTS}"""


# What a run can see of the machine: the folder its own folder is in, /proc, the network.
SEES = """
import os, socket

here = os.path.dirname(os.path.dirname(os.getcwd()))
runs = [name for name in os.listdir(here) if name.startswith("dpkit-grade-")]
processes = len([name for name in os.listdir("/proc") if name.isdigit()])
try:
    socket.create_connection(("192.0.2.1", 9), timeout=0.5)
    network = "yes"
except OSError as error:
    network = "unreachable" if error.errno == 101 else "yes"
raise RuntimeError(f"runs={len(runs)} processes={processes} network={network}")
"""

# One check of task 6 hangs: with --timeout 12 each check has 6 s, so only that one fails.
SOLUTION6 = (EXERCISES / "solutions" / NAMES[6]).read_text()
HANG6 = SOLUTION6.replace(
    "    return max(rows * per_row_seconds / speed",
    "    import time\n\n    time.sleep(3600)\n    return max(rows * per_row_seconds / speed",
    1,
)


# The solutions, found from the checkout's path: exercises/solutions/, the copies `make
# mutation` leaves in build/mutation/*/, and .git's history (issue 41).
SEEKER = f"""
import glob

_found = glob.glob({str(ROOT)!r} + "/**/solutions/task*.py", recursive=True)
_git = glob.glob({str(ROOT)!r} + "/.git/*")
raise RuntimeError(f"solutions={{len(_found)}} git={{len(_git)}}")
"""


@pytest.fixture(scope="module")
def apart(tmp_path_factory):
    """Students who crash, hang one check, nest folders, write to the grader's streams or
    look for the class, graded on tasks 1, 2 and 6 through the command line."""
    base = tmp_path_factory.mktemp("apart-class")
    solution2 = (EXERCISES / "solutions" / NAMES[2]).read_text()
    students = {
        "crash": {1: CRASH, 2: solution2},
        "nested": {1: SOLUTION1.replace(IMPORTS, NESTED, 1)},
        "snoop": {1: SOLUTION1.replace(IMPORTS, PARENT_STREAMS + THIEF, 1), 2: SEES},
        "hang": {6: HANG6},
        "seeker": {1: SEEKER},
    }
    for student, files in students.items():
        (base / student).mkdir()
        for task, source in files.items():
            (base / student / NAMES[task]).write_text(source)
    # Through the command line, from inside the class folder: the grader's own command line
    # and working directory both name the class.
    out = base.parent / "grades.csv"
    command = [sys.executable, "-m", "dpkit", "grade", "--submissions", str(base)]
    command += ["--csv", str(out), "--tasks", "1", "2", "6", "--timeout", "12", "--jobs", "2"]
    # The runs' folders on tmpfs where there is one: removing the 1,500 nested folders took
    # 4.5 s on this VM's ext4 (3 ms an rmdir), 0.1 s on tmpfs; the clean-up is the same code.
    shm = Path("/dev/shm")
    scratch = Path(tempfile.mkdtemp(dir=shm if os.access(shm, os.W_OK) else None))
    try:
        cli = subprocess.run(
            command,
            cwd=base,
            capture_output=True,
            text=True,
            timeout=300,
            env={**_with_path(), "TMPDIR": str(scratch)},
        )
    finally:
        remove_tree(scratch)
    assert cli.returncode == 0, cli.stderr
    by: dict[tuple[str, int], list[dict]] = {}
    with open(out, newline="") as file:
        for row in csv.DictReader(file):
            by.setdefault((row["student"], int(row["task"])), []).append(row)
    return by, cli.stdout + cli.stderr


def _with_path() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def report(rows: list[dict]) -> str:
    return "\n".join(f"{r['result']} {r['check']}: {r['hint']}" for r in rows)


def test_a_crash_costs_only_its_own_task(apart):
    by, _ = apart
    task1, task2 = by[("crash", 1)], by[("crash", 2)]
    assert task2 and all(r["result"] == "pass" for r in task2), report(task2)
    crashed = [r for r in task1 if r["hint"].startswith("crashed")]
    assert len(crashed) == 1 and "in task 1" in crashed[0]["hint"], report(task1)
    assert sum(r["result"] == "pass" for r in task1) == 6, report(task1)  # all but scatter's


def test_a_hanging_check_costs_that_check_only(apart):
    by, _ = apart
    results = by[("hang", 6)]
    hung = [r for r in results if r["result"] == "fail"]
    assert len(results) >= 6 and len(hung) == 1, report(results)
    assert "timed out after 6 s" in hung[0]["hint"], report(results)  # --timeout 12 / 2


def test_nested_folders_do_not_stop_the_class(apart):
    by, _ = apart
    results = by[("nested", 1)]
    assert len(results) == 8 and all(r["result"] == "pass" for r in results), report(results)


def test_a_submission_cannot_write_to_the_graders_streams(apart):
    by, output = apart
    assert "mallory" not in output and "\x1b[2J" not in output, output
    results = by[("snoop", 1)]
    assert all(r["result"] == "pass" for r in results), report(results)  # the solution: earned


def test_a_submission_cannot_find_the_class_folder(apart):
    by, output = apart
    results = by[("snoop", 1)]
    assert len(results) == 8 and all(r["result"] == "pass" for r in results), report(results)
    assert "[5/5] " in output, output  # a line per student as each finishes


def test_a_run_sees_no_solution_anywhere_in_the_checkout(apart):
    from dpkit.grading import apart as namespaces

    if not namespaces.available():
        pytest.skip(f"no namespaces here: {namespaces.WHY_NOT}")
    hint = apart[0][("seeker", 1)][0]["hint"]
    assert "solutions=0 git=0" in hint, hint


def test_a_run_sees_no_other_run_process_or_network(apart):
    from dpkit.grading import apart as namespaces

    if not namespaces.available():
        pytest.skip(f"no namespaces here: {namespaces.WHY_NOT}")
    hint = apart[0][("snoop", 2)][0]["hint"]
    assert "runs=1 processes=1 network=unreachable" in hint, hint


def test_runs_started_without_the_fork_server_are_apart_too(tmp_path, monkeypatch):
    """Where the fork server cannot start, each run starts as its own Python through
    util-linux's unshare (dpkit.grading.apart), with the same isolation."""
    from dpkit.grading import apart as namespaces

    if not namespaces.available():
        pytest.skip(f"no namespaces here: {namespaces.WHY_NOT}")
    from dpkit.grading import forkserver

    started = []
    monkeypatch.setattr(forkserver, "start_server", lambda *a: started.append(a))
    monkeypatch.setenv("DPKIT_GRADE_FORKSERVER", "0")
    (tmp_path / "class" / "snoop").mkdir(parents=True)
    (tmp_path / "class" / "snoop" / NAMES[2]).write_text(SEES)
    rows = grading.grade_submissions(tmp_path / "class", [2], timeout=30)
    assert not started, "DPKIT_GRADE_FORKSERVER=0 started the fork server"
    hint = rows[0][1].hint
    assert "runs=1 processes=1 network=unreachable" in hint, hint


def test_invisible_and_reordering_characters_are_escaped():
    sneaky = "\u061c\u2028\u2029\u2060\U000e0041\U000e007f\u200b\u202e\u2066\ufeff"
    cleaned = grading.clean_text(f"ok{sneaky}8/8")
    assert cleaned.isascii() and cleaned.startswith("ok") and cleaned.endswith("8/8"), cleaned
    assert cleaned.count("\\") == len(sneaky)
    assert grading.clean_cell(sneaky).isascii()


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The class above plus one student whose file is a link to the solution, graded once."""
    base = tmp_path_factory.mktemp("attacks")
    for student, files in STUDENTS.items():
        (base / "class" / student).mkdir(parents=True)
        for task, source in files.items():
            (base / "class" / student / NAMES[task]).write_text(source)
    (base / "class" / "symlink").mkdir()
    os.symlink(EXERCISES / "solutions" / NAMES[1], base / "class" / "symlink" / NAMES[1])
    rows = grading.grade_submissions(base / "class", [1], timeout=30, jobs=2)
    by: dict[str, list[grading.CheckResult]] = {}
    for student, result in rows:
        by.setdefault(student, []).append(result)
    return by


def passed(results) -> list[str]:
    return [r.check for r in results if r.passed]


def test_a_thread_trace_hook_scores_nothing(graded):
    results = graded["trace"]
    assert len(results) == 8 and not passed(results), grading.report(results)
    assert all("trace" in r.hint for r in results), grading.report(results)


def test_a_link_to_the_solution_is_refused_at_copy_time(graded):
    results = graded["symlink"]
    assert len(results) == 8 and not passed(results), grading.report(results)
    assert all("symbolic link" in r.hint for r in results), grading.report(results)


@pytest.mark.parametrize("student", ["equal", "mode"])
def test_a_comparison_replaced_during_a_check_gains_nothing(graded, student):
    results = graded[student]
    assert len(results) == 8 and not passed(results), grading.report(results)


def test_swapping_the_checks_found_with_gc_scores_nothing(graded):
    results = graded["gc"]
    assert len(results) == 8 and not passed(results), grading.report(results)
    assert all("gc.get_objects" in r.hint for r in results), grading.report(results)


def test_forbidden_calls_by_any_route_fail_their_checks(graded):
    results = {r.check: r for r in graded["forbidden"]}
    assert len(results) == 8 and not passed(results.values()), grading.report(results.values())
    routes = (
        "calls dpkit.chunk_plans.torch_chunk_sizes",
        "'__wrapped__'",
        "which your code started",
    )
    for name, result in results.items():
        assert any(route in result.hint for route in routes), (name, result.hint)


def test_a_lazy_answer_s_forbidden_call_is_the_student_s(graded):
    results = {r.check: r for r in graded["lazy"]}
    sizes = [r for name, r in results.items() if name.startswith("chunk_sizes")]
    assert len(sizes) == 2 and not passed(sizes), grading.report(results.values())
    assert all("calls torch.chunk" in r.hint for r in sizes), grading.report(sizes)


def test_what_a_student_leaves_in_torch_is_not_there_for_the_next(graded):
    """Each run is a fresh fork of a server that never runs a submission: a module attribute
    set by the first student of the class is not seen by the last."""
    results = graded["zzz-finds"]
    assert len(results) == 8 and all("left=None" in r.hint for r in results), grading.report(
        results
    )


def test_the_graders_reference_helpers_are_not_the_students(graded):
    results = graded["helpers"]
    assert len(results) == 8 and not passed(results), grading.report(results)


def test_sizes_equal_to_anything_fail_the_check_the_parent_decides(graded):
    results = {r.check: r for r in graded["agrees"]}
    decided = results["chunk_sizes matches torch.chunk for any batch and device count"]
    assert not decided.passed and "torch.chunk gives" in decided.hint, decided


if __name__ == "__main__":  # pragma: no cover - a quick look at one run
    sys.exit(pytest.main([__file__, "-q"]))
