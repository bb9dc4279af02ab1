"""The checks a grade is made of come from the graders' text, not from the grading process.

The records here are what a grading process could sign if a submission reached the harness
(by walking frames up to it): a list of checks that leaves out the ones it fails, invents
passing ones, renames checks or moves them to another task. They go through
``run_graders`` as a run's records would (its run is replaced by one returning them), so
the parent's whole path is tested: the roster, the results, the rerun after a crash.
That the roster is what pytest collects is checked on every real run of the solutions
(``tests/test_exercises.py``: no check is left out or unlisted).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dpkit import grading
from dpkit.grading import roster, sandbox

EXERCISES = Path(__file__).resolve().parent.parent / "exercises"
TRUSTED = sandbox.read_trusted(EXERCISES)
CHECKS = {task: roster.roster(TRUSTED.files, [task]) for task in (3, 4)}


def signed(checks: list[roster.Check], passing: set[str], *, finished: bool = True) -> list:
    """The records of a run that lists ``checks`` and passes those in ``passing``."""
    records: list[dict] = [
        {"event": "collected", "nodeid": c.nodeid, "task": c.task, "check": c.name} for c in checks
    ]
    for check in checks:
        if check.nodeid in passing:
            records.append({"event": "passed", "nodeid": check.nodeid})
        else:
            records.append({"event": "failed", "nodeid": check.nodeid, "hint": "wrong"})
    return records + ([{"event": "finished"}] if finished else [])


def graded(monkeypatch, runs: list, tasks=(3,)) -> list[grading.CheckResult]:
    """run_graders on ``tasks`` with its runs' records replaced by ``runs``, in turn."""
    replies = iter(runs)
    monkeypatch.setattr(sandbox, "_run_once", lambda *args, **kwargs: next(replies))
    return sandbox.run_graders(list(tasks), EXERCISES, {}, 60.0, TRUSTED)


def points(results: list[grading.CheckResult]) -> float:
    return grading.summary_rows([("s", r) for r in results])[1][0][-2]


def test_the_roster_lists_every_check_with_its_name():
    checks = roster.roster(TRUSTED.files, range(1, 8))
    assert len(checks) == 52 and len({c.nodeid for c in checks}) == 52
    ring = [c for c in checks if "test_ring_any_size" in c.nodeid]
    assert ring[0] == roster.Check(
        7,
        "exercises/graders/test_task7.py::test_ring_any_size[10 over 4 lanes]",
        "ring_allreduce_ works for any size and any number of lanes (10 over 4 lanes)",
    )


def test_a_child_that_drops_its_failing_checks_gains_nothing(monkeypatch, capsys):
    checks = CHECKS[3]
    passing = {c.nodeid for c in checks[:4]}
    honest = graded(monkeypatch, [(signed(checks, passing), None)])
    kept = [c for c in checks if c.nodeid in passing]  # the failing ones never mentioned
    forged = graded(monkeypatch, [(signed(kept, passing), None)])
    assert [(r.check, r.passed) for r in forged] == [(r.check, r.passed) for r in honest]
    assert points(forged) == points(honest) == round(10 * 4 / len(checks), 2)
    assert all(r.hint == grading.results.LEFT_OUT for r in forged[4:])


def test_a_child_that_invents_passing_checks_gains_nothing(monkeypatch, capsys):
    checks = CHECKS[3]
    records = signed(checks, set())
    for index in range(20):  # twenty passing checks of its own, in task 3 and task 4
        nodeid = f"exercises/graders/test_task3.py::test_made_up_{index}"
        records[-1:-1] = [
            {"event": "collected", "nodeid": nodeid, "task": 3 + index % 2, "check": "easy"},
            {"event": "passed", "nodeid": nodeid},
        ]
    results = graded(monkeypatch, [(records, None)])
    assert [r.check for r in results] == [c.name for c in checks]
    assert points(results) == 0
    assert "do not define, ignored: exercises/graders/test_task3.py::test_made_up_0" in (
        capsys.readouterr().err
    )


def test_a_child_cannot_rename_or_move_a_check(monkeypatch):
    checks = CHECKS[3]
    records = signed(checks, {checks[0].nodeid})
    records[0] = {**records[0], "task": 4, "check": "a check worth more"}
    results = graded(monkeypatch, [(records, None)])
    assert (results[0].task, results[0].check, results[0].passed) == (3, checks[0].name, True)


def test_a_crash_after_a_forged_list_reruns_from_the_graders_list(monkeypatch):
    # The run lists only task 3's first check, passes it and crashes: task 3's other checks
    # fail, the crash blamed on the first of them; task 4 runs again in a fresh run.
    three, four = CHECKS[3], CHECKS[4]
    first = (signed(three[:1], {three[0].nodeid}, finished=False), "crashed: here")
    again = (signed(four, {c.nodeid for c in four}), None)
    results = graded(monkeypatch, [first, again], tasks=(3, 4))
    assert [r.check for r in results] == [c.name for c in three + four]
    assert [r.hint for r in results[:3]] == ["", "crashed: here", grading.results.NOT_RUN]
    assert all(r.passed for r in results[len(three) :])


def test_a_grader_whose_checks_cannot_be_listed_is_refused():
    source = (EXERCISES / "graders" / "test_task7.py").read_text()
    computed = source.replace('ids=["10 over 4 lanes",', 'ids=[str(4) + " lanes",')
    with pytest.raises(roster.RosterError, match="literal string ids"):
        roster.checks_in(computed, 7)


GRADER_BY_VALUE = '''
import pytest


@pytest.mark.parametrize("rows", [10, 7, -1, 2.5, True, None])
def test_rows(rows):
    """rows"""


@pytest.mark.parametrize("name", ["ring", "tree"])
def test_names(name):
    """names"""


def test_plain():
    """plain"""
'''


def test_the_roster_names_literal_values_as_pytest_collects_them(tmp_path):
    """An instructor's grader (the template's) may parametrize over plain values without
    ids=: the roster names them as pytest does, checked against pytest's own collection."""
    graders = tmp_path / "exercises" / "graders"
    graders.mkdir(parents=True)
    (graders / "test_task8.py").write_text(GRADER_BY_VALUE)
    collected = pytest.main(
        ["--collect-only", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
         str(graders / "test_task8.py")],
        plugins=[collector := _Collector()],
    )  # fmt: skip
    assert collected == 0
    listed = [check.nodeid for check in roster.checks_in(GRADER_BY_VALUE, 8)]
    assert listed == collector.nodeids


def test_values_pytest_would_rename_are_refused():
    for names, values in [("v", '["a", "a"]'), ("v", '["", "b"]'), ("v", "[[1], [2]]"),
                          ("v", '["é"]'), ("a,b", "[1, 2]")]:  # fmt: skip
        source = (
            f'import pytest\n@pytest.mark.parametrize("{names}", {values})\ndef test_v(v): pass\n'
        )
        with pytest.raises(roster.RosterError, match="literal string ids"):
            roster.checks_in(source, 8)


class _Collector:
    def __init__(self) -> None:
        self.nodeids: list[str] = []

    def pytest_collection_finish(self, session) -> None:
        self.nodeids = [item.nodeid for item in session.items]
