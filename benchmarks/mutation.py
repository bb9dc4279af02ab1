"""Mutation testing of dpkit's core and beyond: how many planted bugs do the tests catch?

mutmut (pinned in requirements/mutation.txt) plants one small bug at a time (a ``<`` for a
``<=``, a dropped argument, ``None`` for a value, a string changed) in each function of a
core file and runs the tests that call that function (mutmut records which tests call
which function in a first, instrumented run of the suite). A mutant is *killed* when a test
fails (or hangs past mutmut's timeout), and *survives* when every test passes. Each
survivor is either a gap in the tests or an *equivalent* mutant, one no user could tell
from the original; the equivalent ones, with the reason, are listed in
``benchmarks/mutation_equivalents.md``. The kill rate is killed / (mutants - equivalent).

The tests for a core file are the fast CPU suite: ``tests/`` without the browser, slow, GPU
and notebook tests, the exercise graders and the widget tests. A file beyond the core
(``BEYOND_CORE``: the pipeline, the DDP plan and hook, ...) is tested by its package's own
test files, found by grep (those that name the module or its package, :func:`own_tests`),
not the whole suite; it is reported apart, so that the core's numbers stay the core's.

Each core file is tested in its own copy of the working tree, under
``build/mutation/<module>/`` (mutmut writes its mutants to ``mutants/`` there), so the
working tree is never touched and an interrupted run leaves nothing in it. The copies are
caches: a rerun tests only what is new (mutants of changed functions, mutants not yet
checked) and rechecks every survivor that is not listed as equivalent, against the tests as
they are now. ``--fresh`` throws a file's cache away.

A file of a thousand mutants takes hours here. ``--sample N`` tests N of its mutants drawn at
random (the same draw on every run, seeded by the file's name, so a larger N extends it) and
reports the kill rate with its 95 % interval. Start a sample from a fresh cache: mutmut tests
the mutants with the fastest tests first, so an interrupted full run is not a random sample.

mutmut tests a mutant against the tests it saw call the mutated function. A fixture shared by
a test file runs inside the first test that asks for it, so each function's tests are widened
to every test of their files (``benchmarks/mutmut_widened.py``, run in mutmut's place);
otherwise the file's other tests, which check what the fixture made, would never meet the
mutant.

mutmut counts a mutant whose tests run past its time limit as caught (a hang a user would
see), but on a loaded machine tests that pass run slow too. ``--recheck-timeouts`` tests those
mutants once more after the run, one at a time; one that really hangs stays caught.

    make mutation                              # every core file (hours on 2 cores)
    make mutation FILES=dpkit/comm.py          # one file, or several: FILES="a.py b.py"
    make mutation FILES=dpkit/pipeline/bubble.py   # a file beyond the core, its own tests
    .venv/bin/python -m benchmarks.mutation --beyond --head   # all of them, the last commit
    .venv/bin/python -m benchmarks.mutation --files dpkit/comm.py --fresh
    .venv/bin/python -m benchmarks.mutation --files dpkit/cost/profiling.py --sample 100

Results, merged file by file into what earlier runs measured:
``benchmarks/results/mutation.json`` and a readable ``benchmarks/results/mutation.md``.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from fnmatch import fnmatch
from pathlib import Path

from benchmarks.machine import machine

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "build" / "mutation"
RESULTS_JSON = ROOT / "benchmarks" / "results" / "mutation.json"
RESULTS_MD = ROOT / "benchmarks" / "results" / "mutation.md"
EQUIVALENTS_MD = ROOT / "benchmarks" / "mutation_equivalents.md"
# Where the copies' files are read from: the working tree, or (``--head``) the last commit
# unpacked here (one folder per run, so that two runs on different files can go at once),
# so that others' uncommitted edits in a shared tree stay out of a run.
HEAD_TREE = WORK / f"_head-{os.getpid()}"

# The core, in the order a partial run should take them.
CORE_FILES = (
    "dpkit/comm.py",
    "dpkit/scatter.py",
    "dpkit/chunk_plans.py",
    "dpkit/gather.py",
    "dpkit/_functions.py",
    "dpkit/replicate.py",
    "dpkit/parallel_apply.py",
    "dpkit/lanes.py",
    "dpkit/data_parallel.py",
    "dpkit/device.py",
    "dpkit/tracing/recorder.py",
    "dpkit/tracing/export.py",
)

# The fast CPU suite. The selection is the paths; the markers apply to every pytest run.
TEST_SELECTION = (
    "tests",
    "--ignore=tests/browser",
    "--ignore-glob=tests/test_notebooks*.py",
    "--ignore=tests/test_exercises.py",
    "--ignore-glob=tests/test_widgets_*.py",
)
MARKERS = "not browser and not slow and not gpu and not notebooks"
# Left out of the copies: the DistributedDataParallel tests start rank processes, which
# mutmut cannot follow to see what they call, and under a mutation run's load their ranks
# time out; the instructor kit's and the handout's tests follow the guide in a clone of the
# files git tracks, or read its history, which a copy (without .git, and without the tests
# left out above) has not. The course command's test builds a wheel of the copy's dpkit,
# which in a copy is mutmut's rewrite (each function a trampoline into mutmut), and runs it
# from a temporary folder: in mutmut's first run, the one that records which test calls
# which function, a trampoline called there (``HOST_DEVICE = Device(...)`` as dpkit is
# imported, say) looks for mutmut's config in that folder, finds none and fails, so the
# unmutated run fails before any mutant is tested. It checks packaging, not the core.
SKIPPED_TESTS = (
    "tests/test_ddp*.py",
    "tests/test_instructor_kit.py",
    "tests/test_handout.py",
    "tests/test_course_command.py",
)

# Beyond the core (issue 32): each file with the grep pattern of the test files that are
# its package's own (they name the module, or the package as the module's tests import
# it). A test file found so is copied even where SKIPPED_TESTS would leave it out; none of
# these patterns finds a test that calls ``ddp.run_ddp`` (the sharding and launcher tests
# start two ranks of their own for about a second).
_PIPELINE_TESTS = r"dpkit\.pipeline\b|from dpkit import .*\bpipeline\b"
# (and the runs of ``dpkit predict`` that docs/hardware_file.md shows, checked line by line)
_COST_TESTS = r"dpkit\.cost\b|from dpkit import .*\bcost\b|hardware_file\.md"


def _grading_tests(module: str) -> str:
    """The test files that import ``dpkit.grading.<module>``: by its dotted name, or by name
    from ``dpkit.grading`` (``from dpkit.grading import (a, b, ...)`` spans lines)."""
    return rf"dpkit\.grading\.{module}\b|from dpkit\.grading import (\([^)]*|[^\n(]*)\b{module}\b"


_GRADING_MACHINERY = (
    "decided", "sandbox", "forkserver", "harness", "rules", "conduct", "results", "apart",
    "roster", "cleanup", "identity", "layout",
)  # fmt: skip
BEYOND_CORE = {
    "dpkit/pipeline/stages.py": _PIPELINE_TESTS,
    "dpkit/pipeline/contrast.py": _PIPELINE_TESTS,
    "dpkit/pipeline/bubble.py": _PIPELINE_TESTS,
    "dpkit/pipeline/schedule.py": _PIPELINE_TESTS,
    "dpkit/ddp/plan.py": r"dpkit\.ddp\.plan\b|from dpkit\.ddp import .*\bplan\b",
    "dpkit/ddp/hook.py": r"dpkit\.ddp\.hook\b|from dpkit\.ddp import .*\bhook\b",
    "dpkit/cost/collectives.py": _COST_TESTS,
    "dpkit/cost/compute.py": _COST_TESTS,
    "dpkit/cost/memory.py": _COST_TESTS,
    "dpkit/cost/hardware.py": _COST_TESTS,
    "dpkit/cost/catalog.py": _COST_TESTS,
    "dpkit/cost/cli.py": _COST_TESTS,
    "dpkit/cost/prediction.py": _COST_TESTS,
    "dpkit/cost/profiling.py": _COST_TESTS,
    "dpkit/cost/calibration.py": _COST_TESTS,
    "dpkit/lane_memory.py": r"dpkit\.lane_memory\b|from dpkit import .*\blane_memory\b",
    # (the instructor kit's test only writes a kernel config, and needs a git clone)
    "dpkit/testing/placement_check.py": (
        r"placement_check import .*\bchecking_placement\b|dpkit\.testing\.placement_check import"
    ),
    # The parent's checks: each module is imported by name, on one line or in parentheses.
    "dpkit/grading/weighted.py": _grading_tests("weighted"),
    "dpkit/grading/gradients.py": _grading_tests("gradients"),
    "dpkit/grading/shapes.py": _grading_tests("shapes"),
    "dpkit/grading/similarity.py": _grading_tests("similarity"),
    "dpkit/grading/outputs.py": _grading_tests("outputs"),
    "dpkit/grading/counted.py": _grading_tests("counted"),
    "dpkit/grading/structure.py": _grading_tests("structure"),
    # The harness's own machinery, whose tests mostly reach it through the package
    # (``grading.grade_class``). mutmut records what each test calls in the test's own
    # process: code run only in the processes the harness forks (warden.py's audit hook,
    # fence.py's seccomp filter) is left out, and a function reached only there shows as
    # "no tests".
    **{
        f"dpkit/grading/{name}.py": rf"(?m){_grading_tests(name)}|^from dpkit import grading$"
        for name in _GRADING_MACHINERY
    },
    # the command line and the graders' helper, with grading itself replaced by stand-ins
    **{f"dpkit/grading/{name}.py": _grading_tests(name) for name in ("command", "checks")},
    # dpkit ddp's command line, with the run replaced by a stand-in; what a rank process
    # reports (its setup calls replaced: they change a process for good) and the parent's
    # look at /proc; the script launcher, its Ranks replaced
    **{
        f"dpkit/ddp/{name}.py": rf"from dpkit\.ddp import .*\b{name}\b"
        for name in ("command", "process", "script")
    },
    # the nodes' launcher and a node's training script, in this process (torchrun and the
    # process start replaced; a world of one trains): not the files that run torchrun
    "dpkit/ddp/nodes.py": (
        r"from dpkit\.ddp import (checks|command), nodes\b|dpkit\.ddp\.nodes import"
    ),
    "dpkit/ddp/train.py": r"from dpkit\.ddp import checks, train\b",
    # a rank's own code, run in the test's process by a world of one (test_ddp_one_rank.py)
    "dpkit/ddp/record.py": r"dpkit\.ddp\.record\b|from dpkit\.ddp import .*\b(merged_trace|rank)\b",
    "dpkit/ddp/rank.py": r"from dpkit\.ddp import .*\brank\b",
    "dpkit/ddp/workload.py": r"dpkit\.ddp\.workload\b|from dpkit\.ddp import .*\bDDP_MODELS\b",
    # two gloo ranks for about a second; the parent's arithmetic is most of the file
    "dpkit/ddp/sharding.py": r"from dpkit\.ddp import .*\bsharding\b",
    "dpkit/ddp/launch.py": r"from dpkit\.ddp import .*\blaunch\b",
    # the checks before any rank starts, in the caller's process (not the launching tests)
    "dpkit/ddp/checks.py": r"from dpkit\.ddp\.checks import",
    # The parent's tables, from rank records written by hand (test_ddp_tables.py), and the
    # launches they come from, in the lightest test files that make them (two gloo ranks
    # from the fork server, under a second each): the comparison with DataParallel and the
    # bucket sweep; the settings sweep (against one process's gradients); run_ddp's shared
    # run (test_ddp.py).
    "dpkit/ddp/compare.py": (
        r"from dpkit\.ddp import .*\bcompare\b|compare_with_data_parallel\("
        r"|single_process_gradients\("
    ),
    "dpkit/ddp/settings.py": r"from dpkit\.ddp import .*\bcompare\b|settings_sweep\(",
    "dpkit/ddp/run.py": (
        r"from dpkit\.ddp import .*\bcompare\b|settings_sweep\("
        r"|dpkit\.ddp on torch's real DistributedDataParallel"
    ),
}
BEYOND_CORE_GOAL = 0.90
# Test files that import dpkit.grading but are not its machinery's own: the exercises'
# graders (16 s a run), and the handout's test, which reads git history a copy has not.
NOT_THE_HARNESS_S = ("tests/test_exercises_wrong_answers.py", "tests/test_handout.py")
PYTEST_ARGS = ("-m", MARKERS, "-p", "no:cacheprovider")

# mutmut's wall-clock limit per mutant: (seconds its tests took + constant) * multiplier.
# A mutant that deadlocks a lane's thread is stopped there and counts as caught.
TIMEOUT_MULTIPLIER = 6.0
TIMEOUT_CONSTANT = 5.0

# mutmut's exit codes (mutmut/stats.py): what each says about a mutant.
KILLED_CODES = {1, 3}  # a test failed; pytest's internal error
TIMEOUT_CODES = {36, 24, -24, 152}  # ran past the limit: a hang a user would see
# mutmut's worker exits -1 (255) when pytest refuses the run (exit 4): a test id it was given
# is not found, because the test file holding it failed to import with the mutant on (it
# calls the mutated function as it is imported: ``dpkit.virtual_devices(...)`` in a
# parametrize list, ``HOST_DEVICE = Device(...)`` in dpkit). mutmut shows it as a timeout.
# The same ids were all found in mutmut's clean run, in the same kind of fresh worker
# (write_config: the fork server collects nothing), so the mutant is what broke them.
COLLECTION_CODES = {255}
SURVIVED = 0
NO_TESTS = {5, 33}  # no selected test calls the function
# The tests' process died of a signal (SIGABRT, SIGSEGV): a crash a user would see. (A
# mutant of dpkit.ddp.hook that raises while gloo's all-reduce is in flight leaves gloo to
# abort when the test's process group is destroyed.)
CRASHED_CODES = {-6, -11}
CAUGHT_CODES = KILLED_CODES | TIMEOUT_CODES | CRASHED_CODES | COLLECTION_CODES


def _status(code: int | None) -> str:
    if code is None:
        return "not checked"
    if code in KILLED_CODES:
        return "killed"
    if code in TIMEOUT_CODES:
        return "timeout"
    if code in COLLECTION_CODES:
        return "broke collection"
    if code in CRASHED_CODES:
        return "crashed"
    if code == SURVIVED:
        return "survived"
    if code in NO_TESTS:
        return "no tests"
    return f"other (exit {code})"


# --------------------------------------------------------------------------------------
# Equivalent mutants: benchmarks/mutation_equivalents.md


@dataclass(frozen=True)
class Equivalent:
    """A listed survivor, matched by function and changed lines (not by mutmut's number,
    which shifts when a function gains or loses a mutation): equivalent to the original, or
    (``gpu_only``) different only on a GPU, which the CPU tests cannot see."""

    name: str
    function: str
    change: tuple[str, ...]
    reason: str
    gpu_only: bool


def _function_of(mutant_name: str) -> str:
    return mutant_name.partition("__mutmut_")[0]


def _change_of(diff: str) -> tuple[str, ...]:
    """The removed and added lines of a unified diff, stripped: what the mutant changed."""
    return tuple(
        line[0] + line[1:].strip()
        for line in diff.splitlines()
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    )


_ENTRY = re.compile(
    r"^### `(?P<name>[^`]+)`\n+```diff\n(?P<diff>.*?)```\n+(?P<reason>.*?)(?=^##|\Z)",
    re.MULTILINE | re.DOTALL,
)


def load_equivalents(path: Path = EQUIVALENTS_MD) -> list[Equivalent]:
    """Entries of the form: a ``### `mutant name` `` heading, a ```` ```diff ```` block with the
    changed lines, then the reason in prose; those under a ``## ...`` heading that mentions
    a GPU are the GPU-only ones."""
    if not path.exists():
        return []
    entries = []
    for section in re.split(r"^(?=## )", path.read_text(), flags=re.MULTILINE):
        gpu_only = "GPU" in section.partition("\n")[0] and section.startswith("## ")
        entries += [
            Equivalent(
                name=match["name"],
                function=_function_of(match["name"]),
                change=_change_of(match["diff"]),
                reason=" ".join(match["reason"].split()),
                gpu_only=gpu_only,
            )
            for match in _ENTRY.finditer(section)
        ]
    return entries


def match_equivalent(name: str, diff: str, equivalents: list[Equivalent]) -> Equivalent | None:
    """The entry for this mutant: the same function and change, or an entry that lists only
    removed lines (every mutant of those lines) and the mutant changes some of those."""
    function, change = _function_of(name), _change_of(diff)
    removed = tuple(line for line in change if line.startswith("-"))

    def matches(entry: Equivalent) -> bool:
        if entry.function != function:
            return False
        if all(line.startswith("-") for line in entry.change):
            return bool(removed) and set(removed) <= set(entry.change)
        return entry.change == change

    return next((e for e in equivalents if matches(e)), None)


# A message's wording: what users read is tested once, from docs/bad_input.md's table;
# elsewhere tests check the error's type and the words that matter (issue 32). So a mutant
# that only rewrites a message's text as mutmut rewrites strings (wrapped in "XX", upper- or
# lower-cased) and survives is the tool's own equivalent, found here, not listed by hand. A
# command-line option's help is prose of the same kind (tests check that each has one).
WORDING = (
    "a message's wording: only the text of an error, a warning or an option's help changes"
    " (found by the tool)"
)


def message_lines(source: str) -> dict[str, set[str] | None]:
    """The source lines (stripped) holding the text of an error or a warning: string literals
    inside a ``raise``, an exception's or a warning's constructor, or ``warnings.warn``, or a
    sentence a function returns for a person to read (a grader's hint: a string of four
    words or more, not a value like ``"cpu"``) (value None: any string on the line is the
    message's); and of an argparse option's or command's ``help=`` or ``description=``
    (value: those strings, the only prose on a line that may also hold a default)."""
    lines = source.splitlines()

    def is_message(node: ast.AST) -> bool:
        if isinstance(node, ast.Raise):
            return True
        if isinstance(node, ast.Return):
            return _is_sentence(node.value)
        if not isinstance(node, ast.Call):
            return False
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        return name.endswith(("Error", "Exception", "Warning")) or name == "warn"

    found: dict[str, set[str] | None] = {}
    tree = ast.parse(source)
    for node in ast.walk(tree):  # the messages first: a help line inside one is a message
        if is_message(node):
            for line in _string_lines(node, lines):
                found[line] = None
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg in ("help", "description"):
            texts = {n.value for n in ast.walk(node.value) if isinstance(n, ast.Constant)}
            for line in _string_lines(node.value, lines):
                if found.get(line, set()) is not None:
                    found[line] = found.get(line, set()) | {t for t in texts if isinstance(t, str)}
    return found


def _is_sentence(node: ast.AST | None) -> bool:
    """A string literal or f-string whose own text has four words or more."""
    if isinstance(node, ast.JoinedStr):
        parts = [v.value for v in node.values if isinstance(v, ast.Constant)]
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
        parts = [node.value]
    else:
        return False
    return len("".join(parts).split()) >= 4


def _string_lines(node: ast.AST, lines: list[str]) -> list[str]:
    return [
        lines[n - 1].strip()
        for inner in ast.walk(node)
        if isinstance(inner, ast.Constant) and isinstance(inner.value, str)
        for n in range(inner.lineno, inner.end_lineno + 1)
    ]


def is_wording(diff: str, messages: dict[str, set[str] | None]) -> bool:
    """The mutant changes one line of a message (:func:`message_lines`) and only as mutmut
    rewrites a string: the line with "XX" around a literal, or in another case; on a line of
    help, only inside the help's own text."""
    change = _change_of(diff)
    if len(change) != 2 or not (change[0][0] == "-" and change[1][0] == "+"):
        return False
    before, after = change[0][1:], change[1][1:]
    if before not in messages or after == before:
        return False
    if after.replace("XX", "").lower() != before.lower():
        return False
    helps = messages[before]
    if helps is None:
        return True
    start = next((i for i, (x, y) in enumerate(zip(before, after)) if x != y), len(before))
    tail = next((i for i, (x, y) in enumerate(zip(before[::-1], after[::-1])) if x != y), 0)
    changed = before[start : len(before) - tail].replace("XX", "")
    return any(changed.lower() in text.lower() for text in helps)


# --------------------------------------------------------------------------------------
# A copy of the working tree per core file


def module_of(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def own_tests(target: str, files: list[str], source: Path = ROOT) -> list[str]:
    """The test files of ``files`` (``tests/test_*.py``) that are ``target``'s own: their
    text matches its pattern in :data:`BEYOND_CORE`, skipped ones included (``--ignore``
    and the markers still apply). Outside the test selection the suite is not run."""
    pattern = re.compile(BEYOND_CORE[target])
    if target.startswith("dpkit/grading/"):
        files = [name for name in files if name not in NOT_THE_HARNESS_S]
    # what the fast suite leaves out (its --ignore options) stays out here too
    ignored = [option.partition("=")[2] for option in TEST_SELECTION if option.startswith("--ig")]
    return [
        name
        for name in files
        if fnmatch(name, "tests/test_*.py")
        and not any(fnmatch(name, glob) or name.startswith(f"{glob}/") for glob in ignored)
        and pattern.search((source / name).read_text())
    ]


def selection_for(target: str, files: list[str], source: Path = ROOT) -> tuple[str, ...]:
    """What pytest is given for ``target``: the fast suite for a core file, the own test
    files for one beyond the core."""
    return TEST_SELECTION if target in CORE_FILES else tuple(own_tests(target, files, source))


def _tree_files() -> list[str]:
    """The working tree as git sees it: tracked files and new files it does not ignore."""
    listing = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted(p for p in listing.split("\0") if p and (ROOT / p).is_file())


def _head_files() -> list[str]:
    """The last commit's files, unpacked into :data:`HEAD_TREE` (afresh each run)."""
    if HEAD_TREE.exists():
        shutil.rmtree(HEAD_TREE)
    HEAD_TREE.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(HEAD_TREE)], input=archive.stdout, check=True)
    listing = subprocess.run(
        ["git", "ls-tree", "-r", "-z", "--name-only", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted(p for p in listing.split("\0") if p and (HEAD_TREE / p).is_file())


def sync_copy(workdir: Path, files: list[str], source_root: Path = ROOT) -> None:
    """Make ``workdir`` hold ``files`` as they are now. A changed file gets a new mtime, which
    is how mutmut tells that its mutants must be made again."""
    manifest = workdir / "copied-files.txt"
    before = set(manifest.read_text().splitlines()) if manifest.exists() else set()
    present = []
    for name in files:
        source, target = source_root / name, workdir / name
        try:
            content = source.read_bytes()
        except FileNotFoundError:  # removed since the listing (someone moved it meanwhile)
            continue
        present.append(name)
        if not target.exists() or target.read_bytes() != content:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        shutil.copymode(source, target)  # an executable stays one (binder/postBuild's test)
    for name in sorted(before - set(present)):
        (workdir / name).unlink(missing_ok=True)
    manifest.write_text("\n".join(present) + "\n")


# What the fork server imports before it forks the workers (see write_config).
PRELOAD = Path("mutmut-preload.txt")
PRELOADED_MODULES = ("torch",)  # 2 s to import; dpkit takes 0.02 s more


def write_config(
    workdir: Path,
    target: str,
    also_copy: list[str],
    selection: tuple[str, ...] = TEST_SELECTION,
    debug: bool = False,
) -> None:
    def lines(values) -> str:
        return "".join(f"\n    {value}" for value in values)

    (workdir / PRELOAD).write_text("".join(f"{name}\n" for name in PRELOADED_MODULES))
    (workdir / "setup.cfg").write_text(
        "# Written by benchmarks/mutation.py for this copy only.\n"
        "[mutmut]\n"
        "source_paths=dpkit\n"
        f"only_mutate={target}\n"
        f"also_copy={lines(also_copy)}\n"
        f"pytest_add_cli_args_test_selection={lines(selection)}\n"
        f"pytest_add_cli_args={lines(PYTEST_ARGS)}\n"
        # torch in the process that forks the workers has run nothing (see mutmut's README).
        "process_isolation=forkserver\n"
        # The fork server imports torch alone (PRELOAD), and neither collects the tests
        # (mutmut's default) nor imports dpkit. After a collection in the same process, pytest
        # escapes a test id made by an ``ids=`` function twice (a newline in it: "\\n" becomes
        # "\\\\n"), so a worker given that id (test_grading_decided's) could not find it and
        # tested no mutant of a function it calls (exit 255, which then counted as caught:
        # 158 of device.py's mutants were never tested). And code that runs as
        # dpkit is imported (HOST_DEVICE = Device(...), _functions' class decorator) ran
        # there, unmutated, for every worker: its mutants survived unseen. Each worker now
        # imports dpkit and collects its tests with its mutant on, as a user's import would.
        "forkserver_warmup=import\n"
        f"preload_modules_file={PRELOAD.name}\n"
        f"timeout_multiplier={TIMEOUT_MULTIPLIER}\n"
        f"timeout_constant={TIMEOUT_CONSTANT}\n" + ("debug=true\n" if debug else "")
        # mutmut shows its pytest runs' output (and names a failing test) only when debugging
    )


@contextmanager
def _inside(workdir: Path):
    """mutmut's functions read its config and files relative to the current directory."""
    from mutmut.configuration import reset_config

    here = os.getcwd()
    os.chdir(workdir)
    reset_config()
    try:
        yield
    finally:
        os.chdir(here)
        reset_config()


def _meta_path(workdir: Path, target: str) -> Path:
    return workdir / "mutants" / f"{target}.meta"


def read_results(workdir: Path, target: str) -> dict[str, int | None]:
    meta = _meta_path(workdir, target)
    return json.loads(meta.read_text())["exit_code_by_key"] if meta.exists() else {}


def diffs(workdir: Path, target: str, names: list[str]) -> dict[str, str]:
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    with _inside(workdir):
        return {name: get_diff_for_mutant(name, path=Path(target)) for name in names}


def recheck_survivors(workdir: Path, target: str, equivalents: list[Equivalent]) -> int:
    """Forget every verdict but a catch and a listed equivalent, so the run checks those
    mutants again against the tests as they are now. Returns how many were reset."""
    meta = _meta_path(workdir, target)
    if not meta.exists() or not (workdir / "mutants" / target).exists():
        return 0
    data = json.loads(meta.read_text())
    codes = data["exit_code_by_key"]
    undecided = [n for n, code in codes.items() if code is not None and code not in CAUGHT_CODES]
    try:
        diff_by_name = diffs(workdir, target, undecided)
    except Exception:  # an older or partial mutants folder: recheck them all
        diff_by_name = {}
    messages = message_lines((workdir / target).read_text()) if (workdir / target).exists() else {}
    reset = 0
    for name in undecided:
        diff = diff_by_name.get(name, "")
        if codes[name] == SURVIVED and (
            match_equivalent(name, diff, equivalents) or is_wording(diff, messages)
        ):
            continue
        codes[name] = None
        reset += 1
    meta.write_text(json.dumps(data, indent=4))
    return reset


def reset_timeouts(workdir: Path, target: str) -> list[str]:
    """Forget the verdict of every mutant mutmut stopped at its time limit, for a second run
    one at a time (``--recheck-timeouts``): on a loaded machine, tests that pass but run slow
    pass the limit too, and the mutant counts as caught (one survivor of data_parallel.py hid
    that way). A mutant that really hangs hangs again, and stays caught. Returns their names."""
    meta = _meta_path(workdir, target)
    if not meta.exists():
        return []
    data = json.loads(meta.read_text())
    codes = data["exit_code_by_key"]
    names = [name for name, code in codes.items() if code in TIMEOUT_CODES]
    for name in names:
        codes[name] = None
    meta.write_text(json.dumps(data, indent=4))
    return names


def run_file(
    target: str,
    *,
    fresh: bool,
    max_children: int,
    files: list[str],
    debug: bool = False,
    source_root: Path = ROOT,
    sample: int | None = None,
    recheck_timeouts: bool = False,
) -> tuple[float, bool]:
    """Run mutmut on one core file in its own copy: the seconds it took, and whether it
    started from nothing (every mutant tested, not only what a cache left open). ``debug``:
    mutmut prints each pytest run's output; ``sample``: test only that many, drawn at random;
    ``recheck_timeouts``: then the mutants stopped at the time limit once more, one at a time
    (:func:`reset_timeouts`)."""
    workdir = WORK / module_of(target)
    if fresh and workdir.exists():
        shutil.rmtree(workdir)
    full = not any(code is not None for code in read_results(workdir, target).values())
    workdir.mkdir(parents=True, exist_ok=True)
    sync_copy(workdir, files, source_root)
    also_copy = sorted({name.split("/", 1)[0] for name in files} - {"dpkit", "tests"})
    selection = selection_for(target, files, source_root)
    if not selection:
        raise SystemExit(f"{target}: no test file matches {BEYOND_CORE[target]!r}")
    write_config(workdir, target, also_copy, selection, debug)
    # Copies of deleted tests or files must not linger in mutmut's folder.
    for name in ["tests", *also_copy]:
        stale = workdir / "mutants" / name
        if stale.is_dir():
            shutil.rmtree(stale)
        elif stale.exists():
            stale.unlink()
    reset = recheck_survivors(workdir, target, load_equivalents())
    print(f"\n=== {target}: mutmut in {workdir.relative_to(ROOT)} ({reset} to recheck)", flush=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0")
    mutmut = [sys.executable, str(Path(__file__).with_name("mutmut_widened.py"))]
    start = time.monotonic()
    names: list[str] = []  # mutmut's default: every mutant not yet checked
    if sample is not None:
        names = unchecked_sample(workdir, target, sample, max_children, env)
        if not names:
            return time.monotonic() - start, False
    subprocess.run(
        [*mutmut, "run", "--max-children", str(max_children), *names],
        cwd=workdir,
        env=env,
        check=True,
    )
    timed_out = reset_timeouts(workdir, target) if recheck_timeouts else []
    if timed_out:
        print(f"{target}: {len(timed_out)} stopped at the time limit, once more alone", flush=True)
        subprocess.run(
            [*mutmut, "run", "--max-children", "1", *timed_out],
            cwd=workdir,
            env=env,
            check=True,
        )
    return time.monotonic() - start, full and sample is None


# How mutmut's ``run`` makes the mutants, without testing any (it has no command for that).
_GENERATE = (
    "from mutmut.__main__ import copy_also_copy_files, copy_src_dir, create_mutants, "
    "setup_source_paths\n"
    "from mutmut.mutation.trampoline import set_mutant_under_test\n"
    "set_mutant_under_test('mutant_generation')\n"
    "copy_src_dir(); copy_also_copy_files(); setup_source_paths(); create_mutants({children})"
)


def drawn(target: str, names: list[str], size: int) -> list[str]:
    """``size`` of ``names`` at random, the same on every run: those whose hash (of the file
    and the mutant's name) is smallest. A larger sample contains a smaller one, and a change
    to some functions leaves the others' mutants in or out of the sample as they were."""

    def rank(name: str) -> str:
        return hashlib.sha256(f"{target}:{name}".encode()).hexdigest()

    return sorted(names, key=rank)[:size]


def unchecked_sample(workdir: Path, target: str, size: int, children: int, env: dict) -> list[str]:
    """The mutants of ``target``'s sample not checked yet (making the mutants first)."""
    make = [sys.executable, "-c", _GENERATE.format(children=children)]
    subprocess.run(make, cwd=workdir, env=env, check=True)
    codes = read_results(workdir, target)
    return [name for name in drawn(target, list(codes), size) if codes[name] is None]


# --------------------------------------------------------------------------------------
# The report


def summarize(
    target: str,
    seconds: float | None,
    equivalents: list[Equivalent],
    full: bool = False,
    sample: int | None = None,
) -> dict:
    """One file's verdicts from its cache. ``sample``: the checked mutants are a random
    sample of that size (:func:`drawn`), so the rate gets a 95 % interval."""
    workdir = WORK / module_of(target)
    every = read_results(workdir, target)
    codes = every  # a sample's draw alone: not what an earlier draw (before a change) checked
    if sample:
        codes = {name: every[name] for name in drawn(target, list(every), sample)}
    statuses = {name: _status(code) for name, code in codes.items()}
    caught_statuses = ("killed", "timeout", "crashed", "broke collection")
    open_names = [n for n, s in statuses.items() if s not in (*caught_statuses, "not checked")]
    diff_by_name = diffs(workdir, target, open_names) if open_names else {}
    messages = message_lines((workdir / target).read_text())
    survivors, equivalent, gpu_only = [], [], []
    for name in sorted(open_names, key=_mutant_order):
        diff = diff_by_name[name]
        match = match_equivalent(name, diff, equivalents) if statuses[name] == "survived" else None
        if match is not None:
            listed = gpu_only if match.gpu_only else equivalent
            listed.append({"name": name, "diff": diff, "reason": match.reason})
        elif statuses[name] == "survived" and is_wording(diff, messages):
            equivalent.append({"name": name, "diff": diff, "reason": WORDING})
        else:
            survivors.append({"name": name, "status": statuses[name], "diff": diff})
    counts = {
        s: sum(1 for v in statuses.values() if v == s) for s in sorted(set(statuses.values()))
    }
    caught = sum(counts.get(status, 0) for status in caught_statuses)
    checked = len(codes) - counts.get("not checked", 0)
    source = (workdir / target).read_bytes()
    return {
        "file": target,
        "mutants": len(every),
        "checked": checked,
        "counts": counts,
        "caught": caught,
        "surviving": len(survivors),
        "equivalent": len(equivalent),
        "gpu_only": len(gpu_only),
        **_rates(caught, checked, len(equivalent), len(gpu_only)),
        "complete": counts.get("not checked", 0) == 0,
        "sample": sample,
        "interval": wilson(caught, checked - len(equivalent) - len(gpu_only)) if sample else None,
        "source_sha256": hashlib.sha256(source).hexdigest()[:16],
        "run_s": round(seconds, 1) if seconds is not None else None,
        "full_run_s": round(seconds, 1) if seconds is not None and full else None,
        "measured": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "survivors": survivors,
        "equivalents": equivalent,
        "gpu_only_mutants": gpu_only,
        **({} if target in CORE_FILES else {"tests": _selection_of(workdir)}),
    }


def wilson(caught: int, tested: int, z: float = 1.96) -> list[float] | None:
    """The 95 % (Wilson score) interval of a kill rate measured on a random sample."""
    if tested <= 0:
        return None
    rate, spread = caught / tested, z * z / tested
    center = (rate + spread / 2) / (1 + spread)
    half = z * ((rate * (1 - rate) + spread / 4) / tested) ** 0.5 / (1 + spread)
    return [round(center - half, 4), round(center + half, 4)]


def _rates(caught: int, checked: int, equivalent: int, gpu_only: int) -> dict:
    """The kill rate over the mutants the CPU tests can tell apart, and the same with the
    GPU-only ones counted as survivors."""

    def rate(denominator: int) -> float | None:
        return round(caught / denominator, 4) if denominator else None

    return {
        "kill_rate": rate(checked - equivalent - gpu_only),
        "kill_rate_counting_gpu_only": rate(checked - equivalent),
    }


def _mutant_order(name: str) -> tuple[str, int]:
    function, _, number = name.partition("__mutmut_")
    return function, int(number) if number.isdigit() else 0


def _machine() -> dict:
    from importlib.metadata import version

    # the tests run with one intra-op thread (run_file's OMP_NUM_THREADS=1), not this process's
    return machine(mutmut=version("mutmut"), pytest=version("pytest"), torch_threads=1)


def _staleness(measured: dict) -> str:
    """A mark for a file whose source changed after it was measured (its rate is then of
    the code as it was, and a rerun brings it up to date)."""
    path = ROOT / measured["file"]
    if not path.exists():
        return " (file gone)"
    now = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    return "" if now == measured.get("source_sha256") else " (source changed since)"


def _selection_of(workdir: Path) -> list[str]:
    """The test selection a copy's mutmut ran with (its setup.cfg)."""
    config = workdir / "setup.cfg"
    if not config.exists():
        return []
    text = config.read_text().partition("pytest_add_cli_args_test_selection=")[2]
    selection = []
    for line in text.splitlines()[1:]:
        if not line.startswith("    "):  # the next setting
            break
        selection.append(line.strip())
    return selection


def _merge(
    names: tuple[str, ...], per_file: dict[str, dict], old: list[dict], equivalents: list
) -> list[dict]:
    """``names``' entries: measured now, summarized again from a cache, or kept as before."""
    files = {entry["file"]: entry for entry in old}
    for name in names:
        entry = per_file.get(name)
        before = files.get(name, {})
        if entry is None and _meta_path(WORK / module_of(name), name).exists():
            entry = summarize(name, None, equivalents, sample=before.get("sample"))
        if entry is None:
            continue
        if entry["run_s"] is None and before:  # not run now: keep when it ran
            entry = dict(entry, run_s=before["run_s"], measured=before["measured"])
        if entry["full_run_s"] is None:
            entry = dict(entry, full_run_s=before.get("full_run_s"))
        files[name] = entry
    return [files[f] for f in names if f in files]


def _totals(ordered: list[dict], names: tuple[str, ...], goal: float) -> dict:
    def total(key: str) -> int:
        return sum(f.get(key, 0) for f in ordered)

    checked = sum(
        f.get("checked", f["mutants"] - f["counts"].get("not checked", 0)) for f in ordered
    )
    return {
        "goal": goal,
        **_rates(total("caught"), checked, total("equivalent"), total("gpu_only")),
        "mutants": total("mutants"),
        "checked": checked,
        "caught": total("caught"),
        "surviving": total("surviving"),
        "equivalent": total("equivalent"),
        "gpu_only": total("gpu_only"),
        "full_run_s": sum(f.get("full_run_s") or 0 for f in ordered),
        "files_not_measured": [f for f in names if f not in {e["file"] for e in ordered}],
    }


def write_results(per_file: dict[str, dict], equivalents: list[Equivalent]) -> dict:
    """Merge ``per_file`` into the results: the files with a cache here are summarized from
    it again (the equivalents may have changed), the others keep what an earlier run wrote.
    The core's totals are the core's files alone; ``beyond_core`` has its own."""
    old = json.loads(RESULTS_JSON.read_text()) if RESULTS_JSON.exists() else {}
    core = _merge(CORE_FILES, per_file, old.get("files", []), equivalents)
    beyond_names = tuple(BEYOND_CORE)
    beyond = _merge(
        beyond_names, per_file, old.get("beyond_core", {}).get("files", []), equivalents
    )
    result = {
        "tool": "mutmut",
        "tests": {"selection": list(TEST_SELECTION), "markers": MARKERS},
        **_totals(core, CORE_FILES, 0.95),
        "machine": _machine(),
        "files": core,
        "beyond_core": {
            "tests": "each file's own test files (benchmarks/mutation.py, BEYOND_CORE)",
            **_totals(beyond, beyond_names, BEYOND_CORE_GOAL),
            "files": beyond,
        },
    }
    RESULTS_JSON.parent.mkdir(parents=True, exist_ok=True)
    RESULTS_JSON.write_text(json.dumps(result, indent=2) + "\n")
    RESULTS_MD.write_text(render_markdown(result))
    return result


def _percent(rate: float | None) -> str:
    return "n/a" if rate is None else f"{100 * rate:.1f} %"


def _minutes(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds / 60:.1f} min"


def _table(files: list[dict], with_tests: bool = False) -> list[str]:
    lines = [
        "| file | mutants | caught | surviving | equivalent | GPU-only | kill rate |"
        " with GPU-only | full run | last run | measured |" + (" tests |" if with_tests else ""),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|" + ("---|" if with_tests else ""),
    ]
    for f in files:
        full, last = (_minutes(f.get(key)) for key in ("full_run_s", "run_s"))
        unchecked = f["counts"].get("not checked", 0)
        partial = f" ({unchecked} not checked)" if unchecked else ""
        if f.get("sample") and f.get("interval"):
            low, high = (f"{100 * bound:.0f}" for bound in f["interval"])
            partial = f" (random {f['checked']}: {low}-{high} %)"
        tests = ", ".join(Path(t).name for t in f.get("tests", []))
        lines.append(
            f"| `{f['file']}` | {f['mutants']} | {f['caught']} | {f['surviving']} |"
            f" {f['equivalent']} | {f['gpu_only']} | {_percent(f['kill_rate'])}{partial} |"
            f" {_percent(f['kill_rate_counting_gpu_only'])} | {full} | {last} |"
            f" {f['measured'][:16].replace('T', ' ')}{_staleness(f)} |"
            + (f" {tests} |" if with_tests else "")
        )
    return lines


def _overall(result: dict, label: str) -> str:
    return (
        f"**{label}: {_percent(result['kill_rate'])}** ({result['caught']} caught,"
        f" {result['surviving']} surviving, {result['equivalent']} equivalent,"
        f" {result['gpu_only']} GPU-only, of {result['mutants']} mutants;"
        f" {_percent(result['kill_rate_counting_gpu_only'])} counting GPU-only as surviving)."
    )


def _not_measured(result: dict) -> list[str]:
    if not result["files_not_measured"]:
        return []
    return ["", "Not measured yet: " + ", ".join(f"`{f}`" for f in result["files_not_measured"])]


def _mutants(files: list[dict], level: str) -> list[str]:
    lines = [f"{level} Surviving mutants", ""]
    survivors = [s for f in files for s in f["survivors"]]
    if not survivors:
        lines += ["None.", ""]
    for s in survivors:
        lines += [f"{level}# `{s['name']}` ({s['status']})", "", "```diff", s["diff"], "```", ""]
    for key, title in (("equivalents", "Equivalent"), ("gpu_only_mutants", "GPU-only")):
        names = [e["name"] for f in files for e in f[key]]
        lines += [f"{level} {title} mutants ({len(names)})", ""]
        lines += [", ".join(f"`{n}`" for n in names) if names else "None.", ""]
    return lines


def render_markdown(result: dict) -> str:
    lines = [
        "# Mutation testing of the core",
        "",
        "Written by `benchmarks/mutation.py` (`make mutation`); the numbers are in",
        "`mutation.json`, the reasons for the listed mutants in `../mutation_equivalents.md`.",
        "A mutant is caught when a test fails, it hangs past mutmut's timeout, the tests'",
        "process dies of a signal (an abort, a segfault), or a test file cannot be imported",
        "with it (broke collection). Kill rate = caught / (mutants",
        "checked - equivalent - GPU-only): GPU-only mutants change what happens on a GPU alone",
        "(CUDA streams, non-blocking copies), which the CPU tests cannot see; the last column",
        f"counts them as survivors. Goal: {_percent(result['goal'])}.",
        "",
        _overall(result, "Overall"),
        "",
        *_table(result["files"]),
        *_not_measured(result),
    ]
    machine = result["machine"]
    lines += [
        "",
        f"mutmut {machine['mutmut']}, pytest {machine['pytest']}, torch {machine['torch']},"
        f" Python {machine['python']}, {machine['cpu_cores']} cores. Tests:",
        f'`pytest -m "{result["tests"]["markers"]}" '
        + " ".join(result["tests"]["selection"])
        + "`.",
        "",
        *_mutants(result["files"], "##"),
    ]
    beyond = result.get("beyond_core")
    if beyond and beyond["files"]:
        lines += [
            "# Beyond the core",
            "",
            "Files outside the core (issue 32), each mutated against its package's own test",
            "files only (found by grep: the files that name the module or its package; last",
            "column), with the same markers. Their totals are apart from the core's above.",
            "A kill rate marked *random n: a-b %* was measured on n mutants drawn at random",
            "(`--sample`), with its 95 % interval; *(k not checked)*: a run stopped before the",
            "end, which tests the mutants with the fastest tests first (not a random sample).",
            f"Goal: {_percent(beyond['goal'])}.",
            "",
            _overall(beyond, "Beyond the core"),
            "",
            *_table(beyond["files"], with_tests=True),
            *_not_measured(beyond),
            "",
            *_mutants(beyond["files"], "##"),
        ]
    return "\n".join(lines)


def _print_overall(result: dict) -> None:
    print(
        f"\noverall {_percent(result['kill_rate'])} ({result['surviving']} surviving; "
        f"{_percent(result['kill_rate_counting_gpu_only'])} counting GPU-only mutants); "
        f"results in {RESULTS_JSON.relative_to(ROOT)} and {RESULTS_MD.relative_to(ROOT)}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--files",
        nargs="+",
        default=list(CORE_FILES),
        metavar="PATH",
        help="files to mutate: core files, or files beyond the core (BEYOND_CORE)",
    )
    parser.add_argument(
        "--beyond", action="store_true", help="every file beyond the core (not the core's)"
    )
    parser.add_argument("--fresh", action="store_true", help="throw away the files' caches first")
    parser.add_argument(
        "--sample",
        type=int,
        metavar="N",
        help="test N mutants per file, drawn at random (the same on every run), not all",
    )
    parser.add_argument(
        "--head",
        action="store_true",
        help="test the last commit's files, not the working tree (others' uncommitted edits"
        " in a shared tree stay out)",
    )
    parser.add_argument(
        "--max-children", type=int, default=os.cpu_count() or 2, help="mutants tested at once"
    )
    parser.add_argument(
        "--recheck-timeouts",
        action="store_true",
        help="after the run, test the mutants stopped at the time limit again, one at a time"
        " (a slow pass under load counts as caught; real hangs take their limit again)",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="rewrite the results from the caches, run nothing",
    )
    parser.add_argument(
        "--skip-tests",
        nargs="+",
        default=[],
        metavar="GLOB",
        help=f"test files to leave out of the copies besides {', '.join(SKIPPED_TESTS)}"
        " (someone's red work in progress, say)",
    )
    args = parser.parse_args(argv)
    if args.beyond:
        args.files = list(BEYOND_CORE)
    unknown = [f for f in args.files if f not in CORE_FILES and f not in BEYOND_CORE]
    if unknown:
        parser.error(
            f"not core files nor beyond the core: {unknown}; choose from "
            f"{list(CORE_FILES)} or {list(BEYOND_CORE)}"
        )
    equivalents = load_equivalents()
    if args.report_only:
        _print_overall(write_results({}, equivalents))
        return 0
    source_root = HEAD_TREE if args.head else ROOT
    tree = _head_files() if args.head else _tree_files()
    try:
        return _run(args, equivalents, tree, source_root)
    finally:
        shutil.rmtree(HEAD_TREE, ignore_errors=True)


def _run(args: argparse.Namespace, equivalents: list[Equivalent], tree: list[str],
         source_root: Path) -> int:  # fmt: skip
    skipped = (*SKIPPED_TESTS, *args.skip_tests)
    kept = [f for f in tree if not any(fnmatch(f, glob) for glob in skipped)]
    per_file, failed = {}, []
    for target in args.files:
        # a file beyond the core: its own tests are copied, skipped or not
        files = (
            kept if target in CORE_FILES else sorted({*kept, *own_tests(target, tree, source_root)})
        )
        try:
            try:
                seconds, full = run_file(
                    target,
                    fresh=args.fresh,
                    max_children=args.max_children,
                    files=files,
                    source_root=source_root,
                    sample=args.sample,
                    recheck_timeouts=args.recheck_timeouts,
                )
            except subprocess.CalledProcessError:
                # mutmut stops when the unmutated tests fail, without saying which. Once more:
                # a test that failed only under the machine's load passes this time.
                print(f"{target}: the unmutated tests failed; once more, showing", flush=True)
                seconds, full = run_file(
                    target,
                    fresh=False,
                    max_children=args.max_children,
                    files=files,
                    debug=True,
                    source_root=source_root,
                    sample=args.sample,
                    recheck_timeouts=args.recheck_timeouts,
                )
        except subprocess.CalledProcessError:
            print(f"{target}: mutmut failed; its cache is kept, run it again", flush=True)
            failed.append(target)
            continue
        per_file[target] = summarize(target, seconds, equivalents, full, args.sample)
        result = write_results(per_file, equivalents)  # after each file: a stop keeps it
        f = per_file[target]
        print(f"{target}: {_percent(f['kill_rate'])}, {f['surviving']} surviving", flush=True)
    if per_file:
        _print_overall(result)
        beyond = result["beyond_core"]
        if any(name in BEYOND_CORE for name in per_file):
            print(
                f"beyond the core {_percent(beyond['kill_rate'])} ({beyond['surviving']} surviving)"
            )
    if failed:
        print(f"not measured this time: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
