"""Grader plumbing: which file is graded, its rules, a time limit per check, the hints.

The surprise first: the graders never import the student's file at collection time. Each
check loads it through the ``exercise`` fixture, in a thread with a time limit, so a file
that loops forever on import fails every check with a clear message instead of hanging.

Which file is graded (first match wins):

- ``DPKIT_EXERCISE_FILE``: that file (for a run of one grader);
- ``DPKIT_EXERCISE_DIR``: the task's file name in that folder (``solutions/``, a submission);
- otherwise the student file next to this folder, e.g. ``exercises/task1_scatter.py``.

Before the import, the file's source is scanned and each grader's ``FORBIDDEN`` functions
are guarded (see :mod:`dpkit.grading.rules`); after it, the stub's functions and methods
must be the file's own, and each function's answer is worked out inside its call.
``DPKIT_CHECK_TIMEOUT`` (seconds, default 10) bounds each check. A failing check's hint
goes to :mod:`dpkit.grading.harness`, which sends the signed results when ``dpkit grade``
runs these graders. A plain ``python -m pytest exercises/graders`` works too, for a student
checking their own work: it runs the submission in the same process as the checks and
trusts it, so only ``dpkit grade`` is a grade.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import threading
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import Phase, settings

import dpkit
from dpkit.device import Device
from dpkit.grading import rules
from dpkit.grading.harness import record_hint
from dpkit.grading.layout import submission_file, task_numbers

EXERCISES = Path(__file__).resolve().parent.parent


# Hypothesis's explain phase traces a failing example with sys.settrace, which the grading
# process refuses (dpkit.grading.warden): the graders do without it.
settings.register_profile(
    "dpkit-grading", phases=tuple(phase for phase in Phase if phase is not Phase.explain)
)
settings.load_profile("dpkit-grading")


def check_timeout() -> float:
    return float(os.environ.get("DPKIT_CHECK_TIMEOUT", "10"))


def pytest_configure(config: pytest.Config) -> None:
    for task in task_numbers(EXERCISES):  # one marker per exercises/taskN_*.py
        config.addinivalue_line("markers", f"task{task}: the grader checks of exercise task {task}")


# --------------------------------------------------------------------------------------
# Loading the file under test.


def exercise_path(file_name: str) -> Path:
    """Where the file named ``file_name`` (e.g. ``task1_scatter.py``) is graded from.

    In ``DPKIT_EXERCISE_DIR`` a lone ``task1_*.py`` or ``task1.py`` also counts, for
    submissions whose file was renamed.
    """
    if os.environ.get("DPKIT_EXERCISE_FILE"):
        return Path(os.environ["DPKIT_EXERCISE_FILE"]).resolve()
    folder = Path(os.environ.get("DPKIT_EXERCISE_DIR") or EXERCISES).resolve()
    return submission_file(folder, file_name)


def run_with_timeout(function: Any, seconds: float, what: str) -> Any:
    """``function()`` in a daemon thread; its result, its exception, or a failure on timeout.

    Python cannot stop a thread, so a timed-out one is left behind (a daemon, it dies with
    the grading process); the check fails now instead of waiting for it.
    """
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = function()
        except BaseException as error:  # noqa: B036 - carried back to the caller's thread
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True, name=f"dpkit-grader: {what}")
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(
            f"{what} timed out after {seconds:g} s: look for a loop that never ends, a thread "
            "that is never joined, or a lock that is never released",
            pytrace=False,
        )
    if "error" in outcome:
        raise outcome["error"]
    if "value" not in outcome:  # the thread died before running it (a refused hook)
        pytest.fail(f"{what} did not run: its thread ended first", pytrace=False)
    return outcome["value"]


_loaded: dict[Path, Any] = {}
_loading = threading.Lock()


def _import(path: Path) -> ModuleType:
    name = f"dpkit_exercise_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and namedtuples look their module up here
    sys.dont_write_bytecode = True  # leave no __pycache__ in a student's folder
    spec.loader.exec_module(module)
    return module


def load_exercise(path: Path, grader: ModuleType) -> ModuleType:
    """The module at ``path``, imported once per grading run; fails the check if it cannot
    be, or if it breaks the task's rules (see :mod:`dpkit.grading.rules`)."""
    with _loading:
        if path not in _loaded:
            _loaded[path] = _checked_import(path, grader)
        loaded = _loaded[path]
    if isinstance(loaded, str):
        pytest.fail(loaded, pytrace=False)
    return loaded


def _checked_import(path: Path, grader: ModuleType) -> ModuleType | str:
    """The module, or why it cannot be graded."""
    refused = json.loads(os.environ.get("DPKIT_REFUSED_FILES") or "{}").get(path.name)
    if refused:  # a link or a special file, not copied (dpkit.grading.sandbox.refusal)
        return refused
    if not path.is_file():
        return f"file missing: no {path.name} in the submission; start from the stub in exercises/"
    broken = rules.scan_source(path, rules.forbidden_names(grader))
    if broken is not None:
        return broken
    try:
        module = run_with_timeout(lambda: _import(path), check_timeout(), f"importing {path.name}")
    except pytest.fail.Exception as failure:
        return str(failure.msg)
    except BaseException as error:  # noqa: B036 - a student's file may raise anything
        return _import_failure(path, error)
    stub = EXERCISES / grader.EXERCISE
    names = rules.stub_names(stub)
    borrowed = rules.not_written_here(module, path, names, rules.stub_methods(stub))
    if borrowed is not None:
        return borrowed
    rules.answer_inside(module, path, names)  # a lazy answer runs as the student's
    return module


def _import_failure(path: Path, error: BaseException) -> str:
    """Why ``path`` could not be imported, with the line of the student's file to look at."""
    what = traceback.format_exception_only(type(error), error)[-1].strip()
    line = getattr(error, "lineno", None) if isinstance(error, SyntaxError) else None
    if line is None:  # the deepest frame in the student's file
        frames = traceback.extract_tb(error.__traceback__)
        mine = [frame for frame in frames if Path(frame.filename) == path]
        line = mine[-1].lineno if mine else None
    where = f" (line {line})" if line is not None else ""
    return f"{path.name} could not be imported{where}: {what}"


@pytest.fixture(scope="module")
def exercise(request: pytest.FixtureRequest) -> ModuleType:
    """The module under test: the file named by the grader's ``EXERCISE``, found as above."""
    return load_exercise(exercise_path(request.module.EXERCISE), request.module)


@pytest.fixture
def lanes() -> list[Device]:
    """Four virtual lanes on the CPU (lane 0 is plain CPU memory; lanes 1-3 hold copies)."""
    return dpkit.virtual_devices(4, on="cpu")


@pytest.fixture
def transfers() -> Any:
    """Every copy between devices made while the check runs, as ``dpkit.Transfer`` records."""
    seen: list[dpkit.Transfer] = []
    handle = dpkit.add_transfer_listener(seen.append)
    yield seen
    handle.remove()


# --------------------------------------------------------------------------------------
# Every check runs in a thread with a time limit, so student code that hangs cannot hang us.


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool:
    arguments = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    run_with_timeout(lambda: pyfuncitem.obj(**arguments), check_timeout(), "this check")
    return True


# --------------------------------------------------------------------------------------
# The rules, guarded before any student file runs; a hint for every failure.


def task_of(module: ModuleType) -> int:
    return int(Path(module.__file__).stem[len("test_task") :])


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    graders = {item.module for item in items if hasattr(item, "module")}
    rules.install(
        [(grader, exercise_path(grader.EXERCISE), task_of(grader)) for grader in graders],
        plumbing=[sys.modules[__name__]],
    )


def hint_for(error: BaseException, student: Path | None = None) -> str:
    """One line a student can act on, from what a check raised.

    An exception of the student's code shows its message's first line and, when the message
    has more (dpkit's parallel_apply puts the replica's own error on the last line of a
    traceback it carries), its last line too; and the line of ``student``, the graded file,
    where it was raised: the deepest in the traceback carried in the message, else in the
    exception's own traceback.
    """
    message = str(error).strip()
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    first_line = lines[0] if lines else ""
    if isinstance(error, (pytest.fail.Exception, rules.ForbiddenCall)):
        return first_line
    if isinstance(error, NotImplementedError):
        return f"not implemented yet ({first_line})" if first_line else "not implemented yet"
    if isinstance(error, AssertionError):
        return first_line or "an assertion failed"
    what = f"{first_line} ... {last_error(message)}" if len(lines) > 1 else first_line
    line = student_line(error, message, student) if student is not None else None
    where = f" at {student.name} line {line}" if student is not None and line else ""
    return f"your code raised {type(error).__name__}{where}: {what}".rstrip(": ") + known(error)


NAMEDTUPLE_FROM_ONE = re.compile(r"__new__\(\) missing \d+ required positional argument")


def known(error: BaseException) -> str:
    """A note on the well-known mistake behind ``error``, or nothing."""
    if isinstance(error, TypeError) and NAMEDTUPLE_FROM_ONE.search(str(error)):
        # Pair(gen) hands the namedtuple one iterable where it wants one argument per field
        return (
            " (a namedtuple is built from its fields, one argument each: type(x)(*fields), "
            "not type(x)(iterable))"
        )
    return ""


def last_error(message: str, limit: int = 240) -> str:
    """The last exception a traceback in ``message`` ends with (``TypeError: ...``, one
    line even when its message runs over several, at most ``limit`` characters), else the
    message's last line."""
    raw = message.splitlines()
    starts = [i for i, line in enumerate(raw) if re.match(r"[A-Za-z_][\w.]*: ", line)]
    text = " ".join(" ".join(raw[starts[-1] if starts else -1 :]).split())
    if len(text) > limit:
        text = f"{text[: limit // 3]} ... {text[-(limit - limit // 3 - 5) :]}"
    return text


def student_line(error: BaseException, message: str, student: Path) -> int | None:
    """The line of ``student`` the error came from: the deepest one named in a traceback
    the message carries (a replica's, from parallel_apply), else in the error's own."""
    named = re.findall(rf'File "{re.escape(str(student))}", line (\d+)', message)
    if named:
        return int(named[-1])
    frames = traceback.extract_tb(error.__traceback__)
    mine = [frame.lineno for frame in frames if Path(frame.filename) == student]
    return mine[-1] if mine else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        error = call.excinfo.value if call.excinfo is not None else None
        student = exercise_path(item.module.EXERCISE) if hasattr(item, "module") else None
        record_hint(item.nodeid, hint_for(error, student) if error is not None else "failed")
    elif report.skipped:
        record_hint(item.nodeid, "skipped")
