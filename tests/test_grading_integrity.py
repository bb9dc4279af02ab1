"""Grades that cannot be forged, and grading that always ends (issue 18, "Grading a class").

Each forgery here is a submission a student in a class could write: it gets 0 for the
checks it forges, and an honest student graded after it is graded as before. The whole
class is graded once (one process per student, as an instructor would), on a copy of
the exercises so that the submission that edits the graders on disk edits the copy.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from dpkit import grading
from dpkit.grading import apart, sandbox

ROOT = Path(__file__).resolve().parent.parent
EXERCISES = ROOT / "exercises"
STUB1 = (EXERCISES / "task1_scatter.py").read_text()
SOLUTION = {
    task: (EXERCISES / "solutions" / name).read_text()
    for task, name in grading.task_files(EXERCISES).items()
}
TASKS = [1, 2, 3, 4, 5, 6, 7]

FORGE_RESULTS = """
import json, os, sys
grader = sys.modules["test_task1"]
forged = [
    json.dumps({"seq": seq, "event": "passed", "nodeid": "graders/test_task1.py::" + name})
    + "\\t" + "0" * 64 + "\\n"
    for seq, name in enumerate(n for n in vars(grader) if n.startswith("test_"))
]
for fd in map(int, os.listdir("/proc/self/fd")):
    if fd > 2:
        try:
            os.write(fd, "".join(forged).encode())
        except OSError:
            pass
if os.environ.get("DPKIT_GRADE_RESULTS"):  # the old channel
    with open(os.environ["DPKIT_GRADE_RESULTS"], "a") as file:
        file.writelines(forged)
os._exit(0)
"""

PATCH_PYTEST = """
import _pytest.reports as reports
_original = reports.TestReport.from_item_and_call.__func__

def _always_passed(cls, item, call):
    report = _original(cls, item, call)
    report.outcome, report.longrepr = "passed", None
    return report

reports.TestReport.from_item_and_call = classmethod(_always_passed)
"""

PATCH_GRADER = """
import sys

def _nothing(*args, **kwargs):
    return None

for _name in ("test_task1", "conftest"):
    for _value in list(vars(sys.modules[_name]).values()):
        if getattr(_value, "__name__", "").startswith(("test_", "run_with")):
            try:
                _value.__code__ = _nothing.__code__
            except (AttributeError, ValueError):
                pass
"""

PATCH_TORCH = """
import torch
torch.equal = lambda *args, **kwargs: True
torch.allclose = lambda *args, **kwargs: True
"""

EDIT_GRADERS = """
import sys
from pathlib import Path

_passing = "import pytest\\npytestmark = pytest.mark.task1\\nEXERCISE = 'task1_scatter.py'\\n"
_names = [n for n in vars(sys.modules["test_task1"]) if n.startswith("test_")]
_passing += "".join(f"def {{n}}():\\n    pass\\n" for n in _names)
for _folder in (Path(sys.modules["conftest"].__file__).parent, Path({checkout!r})):
    try:
        (_folder / "test_task1.py").write_text(_passing)
    except OSError:  # in namespaces the checkout is out of sight: nothing there to edit
        pass
"""

EXIT_0_IN_SCATTER = SOLUTION[1].replace(
    "    if isinstance(inputs, torch.Tensor):", "    import os\n\n    os._exit(0)\n    if 1:", 1
)
CHUNK_AT_RUN_TIME = SOLUTION[1].replace(
    "pieces = tensor.split(sizes, dim)", 'pieces = getattr(tensor, "ch" + "unk")(len(devices), dim)'
)
IMPORTS_SOLUTION_AT_RUN_TIME = """
import importlib, sys
sys.path.insert(0, {root!r})
globals().update(vars(importlib.import_module("exercises.solutions.task2_replicate")))
"""
FLOODS_AND_HOGS = """
print("x" * 100_000_000)
hog = bytearray(8 * 1024**3)
"""
WHERE_AM_I = """
import importlib.util, os
found = [name for name in ("exercises", "solutions") if importlib.util.find_spec(name)]
raise RuntimeError(f"found={found} cwd={os.getcwd()} home={os.environ['HOME']}")
"""
IMPORTS_SOLUTION = "from exercises.solutions.task4_gather import *\n"
ALIAS = SOLUTION[6].replace("def weighted_chunk_sizes(", "def _mine(") + (
    '\nimport dpkit\nweighted_chunk_sizes = getattr(dpkit, "weighted_" + "chunk_sizes")\n'
)


def stub_with(prelude: str) -> str:
    """The task 1 stub with ``prelude`` run at import (after the stub's own imports)."""
    return STUB1.replace(
        "from dpkit.device import Device\n", "from dpkit.device import Device\n" + prelude, 1
    )


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """A class of forgers and an honest student after them, graded once into rows."""
    base = tmp_path_factory.mktemp("integrity")
    exercises = base / "exercises"
    shutil.copytree(EXERCISES / "graders", exercises / "graders")
    for name in grading.task_files(EXERCISES).values():
        shutil.copy(EXERCISES / name, exercises / name)
    checkout_grader = exercises / "graders" / "test_task1.py"
    before = checkout_grader.read_text()
    students = {
        "=HYPERLINK(1)\x1b[31m forge results": {1: stub_with(FORGE_RESULTS)},
        "b edit the graders, exit 0 in a check": {
            1: EXIT_0_IN_SCATTER.replace(
                "from dpkit.device import Device\n",
                "from dpkit.device import Device\n"
                + EDIT_GRADERS.format(checkout=str(exercises / "graders")),
                1,
            )
        },
        "c patch pytest": {1: stub_with(PATCH_PYTEST)},
        "d patch the grader": {1: stub_with(PATCH_GRADER)},
        "g honest stub": {1: STUB1, 5: WHERE_AM_I},
        # Graded among the first (students go by name), so that its task 7, which hangs
        # until the 12 s limit, runs beside the others rather than after them all.
        "a cheats": {
            1: CHUNK_AT_RUN_TIME,
            2: IMPORTS_SOLUTION_AT_RUN_TIME.format(root=str(ROOT)),
            3: FLOODS_AND_HOGS,
            4: IMPORTS_SOLUTION,
            6: ALIAS,
            7: "import time\n\ntime.sleep(3600)\n",
        },
    }
    names = grading.task_files(EXERCISES)
    for student, files in students.items():
        (base / "class" / student).mkdir(parents=True)
        for task, source in files.items():
            (base / "class" / student / names[task]).write_text(source)
    tracemalloc.start()
    # The grader's terminal (its standard output) kept in a file meanwhile: what the
    # students print must not reach it (one prints 100 MB).
    terminal, kept = base / "terminal.txt", os.dup(1)
    with terminal.open("wb") as sink:
        os.dup2(sink.fileno(), 1)
        try:
            rows = grading.grade_submissions(base / "class", TASKS, timeout=12, exercises=exercises)
        finally:
            os.dup2(kept, 1)
            os.close(kept)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # In namespaces every folder of the checkout is out of the runs' sight (issue 41,
    # dpkit.grading.apart.out_of_sight), so the edit cannot reach it; without them it does,
    # and must change no grade.
    edited = checkout_grader.read_text() != before
    assert edited != apart.available(), f"edited the checkout: {edited}"
    by: dict[tuple[str, int], list[grading.CheckResult]] = {}
    for student, result in rows:
        by.setdefault((student.split()[-1], result.task), []).append(result)
    return by, rows, peak, base


def hints(results):
    return [r.hint for r in results]


def test_forged_results_and_exit_0_at_import_score_nothing(graded):
    by = graded[0]
    results = by[("results", 1)]
    assert len(results) == 8 and not any(r.passed for r in results)
    assert "crashed" in results[0].hint and "exit code 0" in results[0].hint


def test_exit_0_inside_a_check_fails_that_check_and_the_rest(graded):
    results = by_check(graded[0][("check", 1)])  # the solution, but scatter calls os._exit(0)
    scatter = [name for name in results if name.startswith("scatter ")]
    assert len(scatter) == 2
    assert all(results[name].passed for name in results if name not in scatter), results
    assert "crashed" in results[scatter[0]].hint
    assert not results[scatter[1]].passed


@pytest.mark.parametrize("student", ["pytest", "grader"])
def test_patching_pytest_or_the_graders_scores_nothing(graded, student):
    results = graded[0][(student, 1)]
    assert len(results) == 8
    assert all(not r.passed and "tampered" in r.hint for r in results), hints(results)


def test_editing_the_graders_on_disk_changes_no_grade(graded):
    by = graded[0]
    results = by[("stub", 1)]  # graded after the submission that edited them
    assert len(results) == 8
    assert all(
        not r.passed and r.hint.startswith("not implemented yet (TODO 1.") for r in results
    ), hints(results)


def test_forbidden_calls_and_the_solutions_are_caught_with_a_hint(graded):
    by = graded[0]
    task1 = by_check(by[("cheats", 1)])
    called = [name for name in task1 if name.startswith(("scatter_tensor", "gradients"))]
    assert len(called) == 4
    for name, result in task1.items():
        if name in called:
            assert not result.passed and "calls torch.Tensor.chunk" in result.hint, result
        else:  # each check tests its own function: chunk_sizes and scatter are right
            assert result.passed, result
    assert all(
        "is exercises.solutions.task2_replicate." in r.hint and "not a" in r.hint
        for r in by[("cheats", 2)]
    ), hints(by[("cheats", 2)])
    assert all("imports the reference solutions" in r.hint for r in by[("cheats", 4)])
    assert all(
        "weighted_chunk_sizes is dpkit" in r.hint and "not a function written" in r.hint
        for r in by[("cheats", 6)]
    ), hints(by[("cheats", 6)])


def test_a_submission_runs_in_a_temporary_home_without_the_checkout(graded):
    hint = graded[0][("stub", 5)][0].hint
    assert "RuntimeError: found=[] cwd=" in hint, hint
    cwd, home = hint.split("cwd=")[1].split(" home=")
    assert cwd == home and "dpkit-grade-" in cwd and str(ROOT) not in cwd
    assert not Path(cwd).exists(), "the temporary folder is removed after the run"


def test_output_and_memory_are_capped(graded):
    by, _, parent_peak, _ = graded
    assert all("MemoryError" in r.hint for r in by[("cheats", 3)]), hints(by[("cheats", 3)])
    # 100 MB printed by a submission is read and dropped, not kept by the grader
    assert parent_peak < 20 * 1024**2, f"the grader's Python memory peaked at {parent_peak} B"
    # nor shown on the grader's terminal
    terminal = (graded[3] / "terminal.txt").read_bytes()
    assert b"x" * 1000 not in terminal and len(terminal) < 100_000, len(terminal)


def test_a_link_swapped_in_after_the_check_is_not_followed(tmp_path, monkeypatch):
    answers = tmp_path / "answers.py"
    answers.write_text("the reference solution\n")
    link = tmp_path / "task1_scatter.py"
    link.symlink_to(answers)
    assert "is a symbolic link, which grading refuses" in sandbox.read_submission(link)
    monkeypatch.setattr(sandbox, "refusal", lambda source: None)  # swapped in since the check
    why = sandbox.read_submission(link)
    assert isinstance(why, str) and why.startswith("task1_scatter.py could not be read ("), why


def test_the_class_csv_neutralises_formulas_and_escapes(graded):
    _, rows, _, base = graded
    out = base / "grades.csv"
    grading.write_csv(rows, out)
    text = out.read_text()
    assert "\x1b" not in text and "\n=" not in text and ",=" not in text
    assert "'=HYPERLINK(1)\\x1b[31m forge results" in text


def test_a_hang_and_a_missing_file_fail_every_check_saying_so(graded):
    by = graded[0]
    hung = by[("cheats", 7)]
    assert len(hung) >= 5 and all("timed out" in r.hint for r in hung), hints(hung)
    missing = by[("stub", 2)]
    assert missing and all(r.hint.startswith("file missing") for r in missing)


def test_a_patched_torch_or_grader_function_is_seen():
    """The harness's check for tampering, on its own: replacing a function the graders call,
    or the code of one, is named; putting it back clears it."""
    import torch

    from dpkit.grading.harness import Snapshot

    snapshot = Snapshot()
    assert snapshot.changed() is None
    equal = torch.equal
    torch.equal = lambda *args, **kwargs: True
    try:
        assert snapshot.changed() == "torch.equal"
    finally:
        torch.equal = equal
    assert snapshot.changed() is None
    code = grading.report.__code__
    # other code of the same shape (a function's free variables must match its closure)
    grading.report.__code__ = code.replace(co_consts=(*code.co_consts, "tampered"))
    try:
        assert snapshot.changed().endswith(".report.__code__")
    finally:
        grading.report.__code__ = code
    assert snapshot.changed() is None


def by_check(results):
    return {r.check: r for r in results}


# --------------------------------------------------------------------------------------
# Grading ends: a time limit that holds, Ctrl-C that stops everything.

STALL = """
import os, signal, time
_pids = {pids!r}
if os.fork() == 0:  # a grandchild in a session of its own, holding every inherited pipe
    os.setsid()
    if os.fork() == 0:
        with open(_pids, "a") as file:
            file.write(f"{{os.getpid()}}\\n")
        time.sleep(600)
    os._exit(0)
os.wait()
with open(_pids, "a") as file:
    file.write(f"{{os.getpid()}}\\n")
os.kill(os.getpid(), signal.SIGSTOP)  # the grading process itself stops
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as status:
            return "\nState:\tZ" not in status.read()
    except FileNotFoundError:
        return False


def still_alive(pids: list[int], within: float = 5.0) -> list[int]:
    """The processes of ``pids`` alive after up to ``within`` seconds: a SIGKILL is sent at
    once, but the kernel takes a moment to end a process, more on a loaded machine."""
    deadline = time.monotonic() + within
    while [pid for pid in pids if alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid in pids if alive(pid)]


def stalling_submission(tmp_path: Path) -> tuple[Path, Path]:
    pids = tmp_path / "pids"
    file = tmp_path / "task1_scatter.py"
    file.write_text(STALL.format(pids=str(pids)))
    return file, pids


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc (Linux)")
def test_a_timeout_kills_every_process_the_submission_started(tmp_path):
    file, pids = stalling_submission(tmp_path)
    start = time.monotonic()
    # Starting Python and torch has its own allowance (sandbox.STARTUP_SECONDS): the limit
    # counts from when the checks were collected, so 6 s is not raced by a busy machine.
    results = grading.grade(1, file=file, timeout=6)
    elapsed = time.monotonic() - start
    assert elapsed < 6 + 15, f"grading took {elapsed:.1f} s with a 6 s limit"
    assert "timed out" in results[0].hint and not any(r.passed for r in results)
    started = [int(line) for line in pids.read_text().split()]
    assert len(started) == 2
    assert not still_alive(started), "a process the submission started lives on"


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc (Linux)")
def test_a_timeout_kills_every_process_a_forked_run_started(tmp_path, monkeypatch):
    """Without namespaces a class's runs are still forks of the fork server, whose
    environment they cannot carry a marker in: the run's supervisor is a subreaper, so the
    grandchild that left the session with setsid is its child once orphaned, and killed."""
    from dpkit.grading import apart, forkserver

    monkeypatch.setattr(apart, "available", lambda: False)
    servers: list = []
    start = forkserver.start_server

    def started(*args):
        servers.append(start(*args))
        return servers[-1]

    monkeypatch.setattr(forkserver, "start_server", started)
    file, pids = stalling_submission(tmp_path)
    (tmp_path / "class" / "ada").mkdir(parents=True)
    shutil.copy(file, tmp_path / "class" / "ada" / file.name)
    rows = grading.grade_submissions(tmp_path / "class", [1], timeout=6)
    assert servers and servers[0] is not None and not servers[0].namespaces, servers
    assert "timed out" in rows[0][1].hint and not any(r.passed for _, r in rows)
    started = [int(line) for line in pids.read_text().split()]
    assert len(started) == 2
    assert not still_alive(started), "a process the submission started lives on"


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc (Linux)")
def test_ctrl_c_stops_everything_with_a_one_line_message(tmp_path):
    file, pids = stalling_submission(tmp_path)
    command = [sys.executable, "-m", "dpkit", "grade", "1", "--file", str(file), "--timeout", "120"]
    # A learner's Ctrl-C reaches a foreground process, whose SIGINT does the default. Under a
    # parent that ignores SIGINT (mutmut's workers, some background jobs) the CLI would
    # inherit SIG_IGN: start it through Python with the default handler back (not with
    # preexec_fn, which can deadlock a parent that runs threads).
    restore = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "sys.argv = ['dpkit', *sys.argv[1:]]; runpy.run_module('dpkit', run_name='__main__')"
    )
    command = [sys.executable, "-c", restore, *command[3:]]
    cli = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 90
    while (
        time.monotonic() < deadline and len(pids.read_text().split() if pids.exists() else []) < 2
    ):
        time.sleep(0.1)
    started = [int(line) for line in pids.read_text().split()]
    cli.send_signal(signal.SIGINT)
    out, err = cli.communicate(timeout=30)
    assert cli.returncode == 130, (out, err)
    assert err.strip().splitlines() == [
        "dpkit grade: interrupted; stopped grading and every process it started"
    ], err
    assert not still_alive(started), "Ctrl-C left a process running"


# --------------------------------------------------------------------------------------
# Bad requests are answered before any grading.


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf"])
def test_a_timeout_that_is_not_positive_is_rejected(value, capsys):
    from dpkit.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["grade", "1", "--timeout", value])
    assert exit_.value.code == 2
    assert "--timeout" in capsys.readouterr().err
    with pytest.raises(ValueError, match="positive, finite number of seconds"):
        grading.grade(1, timeout=float(value))


def test_a_timeout_past_float_s_range_is_rejected_not_a_crash():
    for too_long in (10**400, 10**5000):  # float() raises OverflowError; str() a ValueError
        with pytest.raises(ValueError, match="finite number of seconds, got an int too large"):
            grading.grade(1, timeout=too_long)


def test_an_unwritable_csv_is_reported_before_grading(tmp_path, capsys):
    from dpkit.cli import main

    (tmp_path / "class" / "ada").mkdir(parents=True)
    start = time.monotonic()
    code = main(
        ["grade", "--submissions", str(tmp_path / "class"), "--csv", str(tmp_path / "no" / "g.csv")]
    )
    assert code == 2 and time.monotonic() - start < 5
    assert "cannot write the CSV" in capsys.readouterr().err
    assert not (tmp_path / "no").exists()


def test_clean_cell_neutralises_every_formula_prefix_and_control():
    for prefix in "=+-@\t\r":
        assert grading.clean_cell(prefix + "1+1").startswith("'")
    assert grading.clean_cell("ok") == "ok"
    assert grading.clean_cell("a\x1b[31mred\x07\u202e") == "a\\x1b[31mred\\x07\\u202e"


@pytest.fixture
def committed_exercises(tmp_path) -> Path:
    """An exercises/ folder of the graders and task 1's stub, committed to a fresh git
    repository (the last commit graders are compared with)."""
    git = shutil.which("git")
    if git is None:
        pytest.skip("no git")
    exercises = tmp_path / "exercises"
    shutil.copytree(EXERCISES / "graders", exercises / "graders")
    shutil.copy(EXERCISES / "task1_scatter.py", exercises)
    for args in (
        ["init", "-q"],
        ["add", "."],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "graders"],
    ):
        subprocess.run([git, "-C", str(tmp_path), *args], check=True, capture_output=True)
    return exercises


def test_edited_graders_are_named_against_the_last_commit(committed_exercises):
    from dpkit.grading.sandbox import read_trusted

    exercises = committed_exercises
    assert read_trusted(exercises).modified == ()
    (exercises / "graders" / "test_task1.py").write_text("def test_x():\n    pass\n")
    assert read_trusted(exercises).modified == ("exercises/graders/test_task1.py",)


def test_grading_one_task_warns_of_graders_edited_since_the_last_commit(
    committed_exercises, capsys
):
    """Not only a class: ``dpkit grade 8`` right after an instructor edits task 8's grader."""
    exercises = committed_exercises
    grader = exercises / "graders" / "test_task1.py"
    grader.write_text(grader.read_text() + "\n# edited\n")
    grading.grade(1, exercises=exercises, timeout=30)
    warned = "differ from the last git commit: exercises/graders/test_task1.py"
    assert warned in capsys.readouterr().err
    grading.grade_folder(exercises, tasks=[1], exercises=exercises, timeout=30)
    assert warned in capsys.readouterr().err


def test_what_a_submission_prints_stays_off_the_grader_s_terminal(capfd):
    """A student grading their own work (no fork server: the run is a process of its own)."""
    submission = stub_with('print("printed by the submission " * 100)\n')
    names = grading.task_files(EXERCISES)
    results = sandbox.run_graders([1], EXERCISES, {names[1]: submission.encode()}, timeout=30)
    assert results and not any(r.passed for r in results)  # the stub's TODOs fail
    printed = capfd.readouterr()
    assert "printed by the submission" not in printed.out + printed.err


def test_a_file_grown_past_the_limit_since_the_check_is_refused(tmp_path, monkeypatch):
    grown = tmp_path / "task1_scatter.py"
    grown.write_bytes(b"#" * (sandbox.SUBMISSION_LIMIT + 1))
    assert "more than a task file's 1 MB limit" in sandbox.read_submission(grown)
    monkeypatch.setattr(sandbox, "refusal", lambda source: None)  # it grew since the check
    assert "over a task file's 1 MB limit" in sandbox.read_submission(grown)
    grown.write_bytes(b"#" * sandbox.SUBMISSION_LIMIT)  # at the limit: taken whole
    assert sandbox.read_submission(grown) == b"#" * sandbox.SUBMISSION_LIMIT
