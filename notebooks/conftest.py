"""nbval's run of the course, read as a learner reads it: no printed verdict may contradict the
numbers printed with it, on a quiet machine or a loaded one.

Every cell nbval runs in a measuring notebook (tests/verdict_checker.py's ``MEASURING``) goes
through the verdict checker: a verdict its quartiles contradict, or a measured outcome stated
outside dpkit.verdict's form, fails that cell; a notebook that printed fewer verdicts than it
should fails its last cell.

With ``DPKIT_NOTEBOOKS_UNDER_LOAD=1`` (``make test`` sets it, so CI runs it), each measuring
notebook runs while two other processes keep two cores busy, started before its first cell and
killed after its last: a classroom laptop is rarely quiet, and the lessons must hold there too.
Under pytest-xdist the two are shared out between the workers (one each for ``-n 2``), so the
machine holds two busy processes beside the notebooks, not two per notebook.
The other notebooks (00, 01, 02, 04) measure nothing and run quiet.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.verdict_checker

from tests.verdict_checker import (  # noqa: E402
    MEASURING,
    cell_problems,
    find_verdicts,
    printed_text,
)

UNDER_LOAD = os.environ.get("DPKIT_NOTEBOOKS_UNDER_LOAD") == "1"
SPIN = "while True: pass"
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
SPINNERS = max(1, 2 // WORKERS)  # per worker: two in all

_spinners: dict[str, list[subprocess.Popen]] = {}  # notebook -> the processes loading it
_verdicts: dict[str, int] = {}  # notebook -> verdicts its cells printed so far


def _measuring(item: pytest.Item) -> str | None:
    """The item's notebook name when it is an nbval cell of a measuring notebook."""
    if not hasattr(item, "test_outputs") or not hasattr(item, "cell"):
        return None
    name = Path(str(item.fspath)).stem
    return name if name in MEASURING else None


def pytest_runtest_setup(item: pytest.Item) -> None:
    name = _measuring(item)
    if name and UNDER_LOAD and name not in _spinners:
        _spinners[name] = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(SPINNERS)]


PLACEMENT_CHECK = os.environ.get("DPKIT_CHECK_PLACEMENT", "").strip() not in ("", "0")
_kernels_checked: set[str] = set()


def _placement_check_is_on(kernel: Any) -> bool:
    """Ask nbval's kernel, by a silent request, whether dpkit's placement check is on."""
    question = "__import__('dpkit.placement_check').placement_check.active()"
    msg_id = kernel.kc.execute("", silent=True, user_expressions={"on": question})
    while True:
        reply = kernel.kc.get_shell_msg(timeout=120)
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    kernel.await_idle(msg_id, 120)  # leaves nbval's iopub reading as it was
    answer = reply["content"].get("user_expressions", {}).get("on", {})
    return answer.get("data", {}).get("text/plain") == "True"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    notebook = str(item.fspath)
    if PLACEMENT_CHECK and hasattr(item, "cell") and notebook not in _kernels_checked:
        # DPKIT_CHECK_PLACEMENT=1 reaches a kernel only through the IPython config that
        # dpkit.placement_check.write_kernel_config writes: a missing one would let every
        # notebook run unchecked, silently.
        _kernels_checked.add(notebook)
        assert _placement_check_is_on(item.parent.kernel), (
            "DPKIT_CHECK_PLACEMENT=1, but the placement check is off in the notebook's kernel: "
            "write the kernel config first (python -m dpkit.placement_check $IPYTHONDIR)"
        )
    result = yield
    name = _measuring(item)
    if name is None or not item.test_outputs:
        return result
    text = printed_text({"outputs": item.test_outputs})
    _verdicts[name] = _verdicts.get(name, 0) + len(find_verdicts(text))
    problems = cell_problems(text, item.cell.get("id"), MEASURING[name][1])
    load = " under load" if UNDER_LOAD else ""
    assert not problems, f"printed{load}, contradicting its own numbers:\n" + "\n".join(problems)
    return result


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    name = _measuring(item)
    if name is None or (nextitem is not None and nextitem.fspath == item.fspath):
        return
    for spinner in _spinners.pop(name, []):
        spinner.kill()
        spinner.wait()
    printed, fewest = _verdicts.pop(name, 0), MEASURING[name][0]
    assert printed >= fewest, f"{name} printed {printed} verdicts, fewer than its {fewest}"


def pytest_sessionfinish() -> None:
    """A run stopped early (-x, Ctrl-C) leaves no spinner behind."""
    for spinners in _spinners.values():
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    _spinners.clear()
