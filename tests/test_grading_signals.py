"""A submission signals only the processes it started, with or without namespaces.

Without user namespaces (``DPKIT_GRADE_NAMESPACES=0``, or a machine that refuses them) a
grading run is a process of the instructor's user: ``os.kill(-1, SIGKILL)`` from a
submission would end every process of that user, the grader and the other students' runs
included. Each attack here is the task 1 solution with a signal sent at import by one
route; a refused signal fails the import, so the attack scores 0, and a bystander (a
``sleep`` this test starts, same user, its own process group) must still be alive after
the class. Every attack is safe to run on code without the defence: the ones that would
reach every process send signal 0 (a probe that changes nothing) or SIGCONT to the
bystander, never SIGKILL to -1.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from dpkit import grading
from dpkit.grading import apart

# Two class runs of 7 task-1 submissions (one per setting, shared by every test).
pytestmark = pytest.mark.slow

EXERCISES = Path(__file__).resolve().parent.parent / "exercises"
NAMES = grading.task_files(EXERCISES)
SOLUTION1 = (EXERCISES / "solutions" / NAMES[1]).read_text()
IMPORTS = "from dpkit.device import Device\n"

# Each prelude runs at import with BYSTANDER and GRADER (this test's process) defined:
# routes only the warden and the kernel see (a plain os.kill of a pid, getattr, a thread, a
# pidfd), and one the rules also refuse before the file runs (os.kill(-1, ...)).
ATTACKS = {
    "named": "import os, signal\nos.kill(BYSTANDER, signal.SIGKILL)\n",
    "getattr": "import os\ngetattr(os, 'ki' + 'll')(BYSTANDER, 9)\n",
    "group": (
        "import os, threading\n"
        "_errors = []\n"
        "def _hit():\n"
        "    try:\n"
        "        getattr(os, 'kill' + 'pg')(BYSTANDER, 9)\n"
        "    except BaseException as error:\n"
        "        _errors.append(error)\n"
        "_thread = threading.Thread(target=_hit)\n"
        "_thread.start()\n"
        "_thread.join()\n"
        "if _errors:\n"
        "    raise _errors[0]\n"
    ),
    "pidfd": (
        "import os, signal\n"
        "_fd = getattr(os, 'pidfd_' + 'open')(BYSTANDER)\n"
        "getattr(signal, 'pidfd_send_' + 'signal')(_fd, 9)\n"
    ),
    # Signal 0 to every process and to the grader: a probe that only says whether it may.
    "everyone": "import os\nos.kill(-1, 0)\n",
    "grader": "import os\ngetattr(os, 'ki' + 'll')(GRADER, 0)\n",
}
# Signalling its own processes stays allowed: a worker it forked, killed, is the solution.
OWN = (
    "import os, time\n"
    "_child = os.fork()\n"
    "if _child == 0:\n"
    "    time.sleep(60)\n"
    "    os._exit(0)\n"
    "getattr(os, 'ki' + 'll')(_child, 9)\n"
    "os.waitpid(_child, 0)\n"
)


def submission(prelude: str, bystander: int) -> str:
    pids = f"BYSTANDER = {bystander}\nGRADER = {os.getpid()}\n"
    return SOLUTION1.replace(IMPORTS, f"{pids}{prelude}{IMPORTS}", 1)


@pytest.fixture(scope="module", params=["namespaces", "DPKIT_GRADE_NAMESPACES=0"])
def graded(request, tmp_path_factory):
    """The attacks graded as one class (task 1), once per setting for every test of it,
    and whether the bystander lived."""
    folder = tmp_path_factory.mktemp("signals")
    with pytest.MonkeyPatch.context() as monkeypatch:
        if request.param != "namespaces":
            monkeypatch.setenv("DPKIT_GRADE_NAMESPACES", "0")
        apart.available.cache_clear()
        bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
        try:
            for student, prelude in {**ATTACKS, "own": OWN}.items():
                (folder / "class" / student).mkdir(parents=True)
                text = submission(prelude, bystander.pid)
                (folder / "class" / student / NAMES[1]).write_text(text)
            rows = grading.grade_submissions(folder / "class", [1], timeout=30, jobs=2)
            alive = bystander.poll() is None
        finally:
            bystander.send_signal(signal.SIGKILL)
            bystander.wait()
            apart.available.cache_clear()
    by: dict[str, list[grading.CheckResult]] = {}
    for student, result in rows:
        by.setdefault(student, []).append(result)
    return by, alive, bystander.returncode


def test_the_bystander_outlives_the_class(graded):
    _, alive, code = graded
    assert alive, f"the bystander was killed (exit {code})"


@pytest.mark.parametrize("student", sorted(ATTACKS))
def test_a_signal_outside_the_run_scores_nothing(graded, student):
    results = graded[0][student]
    assert len(results) == 8 and not any(r.passed for r in results), grading.report(results)


def test_the_refusal_names_the_call(graded):
    by = graded[0]
    for student in ("named", "getattr", "grader"):  # at run time, in the warden
        assert all("refuses os.kill" in r.hint for r in by[student]), grading.report(by[student])
    everyone = by["everyone"]  # before the file runs, by the rules
    assert all("uses os.kill outside the run" in r.hint for r in everyone), grading.report(everyone)


def test_signalling_its_own_processes_is_allowed(graded):
    results = graded[0]["own"]
    assert len(results) == 8 and all(r.passed for r in results), grading.report(results)
