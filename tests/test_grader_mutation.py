"""The graders' mutation audit (benchmarks/grader_mutation.py) plants the bugs it says and
judges them as the exercise tests would; no grading here, only text and fake outcomes."""

from __future__ import annotations

from benchmarks.grader_mutation import Variant, killed_by, mutants, spread

SOURCE = 'mark = "✗"\nx = a == 1 and not b\nassert (\n    x < 0.5\n), mark\ny = 1e-3\n'


def test_the_mutator_plants_one_edit_per_mutant_and_keeps_the_lines():
    found = {(m.line, m.description): m.source for m in mutants(SOURCE)}
    assert sorted(found) == [
        (2, "1 -> 2"),
        (2, "== -> !="),
        (2, "and -> or"),
        (2, "not removed"),
        (3, "assert removed"),
        (4, "0.5 -> 0.6"),
        (4, "< -> <="),
        (6, "0.001 -> 0.01"),
    ]
    # byte columns after a non-ASCII character land on the right text
    assert found[(2, "== -> !=")] == SOURCE.replace("a == 1", "a != 1")
    assert found[(2, "and -> or")] == SOURCE.replace("1 and not", "1 or not")
    assert found[(2, "not removed")] == SOURCE.replace("not b", "(b)")
    assert found[(4, "< -> <=")] == SOURCE.replace("x < 0.5", "x <= 0.5")
    removed = found[(3, "assert removed")]
    assert removed == SOURCE.replace("assert (\n    x < 0.5\n), mark", "pass\n\n")
    assert len(removed.splitlines()) == len(SOURCE.splitlines())  # later lines keep numbers
    assert found[(6, "0.001 -> 0.01")].endswith("y = 0.01\n")  # a tolerance ten times looser


def test_the_mutator_swaps_every_keyword_of_a_chain_and_skips_fstrings():
    found = {m.description: m.source for m in mutants('z = p or q or r\nf"{u is v}"\n')}
    assert found == {"or -> and": 'z = p and q and r\nf"{u is v}"\n'}
    spelled = {m.description for m in mutants("w = u is not v or k not in d\n")}
    assert spelled == {"is not -> is", "not in -> in", "or -> and"}


def test_a_cap_spreads_over_the_file():
    assert spread(list(range(10)), 3) == [0, 3, 6]
    assert spread([1, 2], None) == [1, 2]


VARIANTS = [
    Variant("solution", b"", (), ""),
    Variant("stub", b"", None, "not implemented yet"),
    Variant("wrong", b"", ("sizes",), "rounding"),
]


def graded(**changes: tuple[bool, str]) -> dict[str, list[tuple[str, bool, str]]]:
    """What the unmutated grader gives, with ``variant__check=(passed, hint)`` changed."""
    rows = {
        "solution": {"sizes": (True, ""), "report": (True, "")},
        "stub": {
            "sizes": (False, "not implemented yet (1)"),
            "report": (False, "not implemented yet (2)"),
        },
        "wrong": {"sizes": (False, "rounding is not enough"), "report": (True, "")},
    }
    for key, value in changes.items():
        variant, check = key.split("__")
        rows[variant][check] = value
    return {v: [(c, *outcome) for c, outcome in checks.items()] for v, checks in rows.items()}


def test_a_mutant_survives_when_every_grading_is_as_the_tests_expect():
    assert killed_by(graded(), VARIANTS) == ""


def test_a_mutant_is_killed_by_any_grading_the_tests_would_reject():
    assert killed_by(graded(solution__report=(False, "x")), VARIANTS) == (
        "solution: 'report' failed"
    )
    assert killed_by(graded(stub__sizes=(True, "")), VARIANTS) == "stub: 'sizes' passed"
    assert killed_by(graded(wrong__sizes=(True, "")), VARIANTS) == "wrong: 'sizes' passed"
    # the wrong answer's right part must pass; each hint must still name the mistake
    assert killed_by(graded(wrong__report=(False, "x")), VARIANTS) == "wrong: 'report' failed"
    assert "a hint without 'rounding'" in killed_by(graded(wrong__sizes=(False, "?")), VARIANTS)
    assert "stub: a hint" in killed_by(graded(stub__sizes=(False, "crashed")), VARIANTS)
    assert killed_by({"solution": []}, VARIANTS) == "solution: no checks ran"
