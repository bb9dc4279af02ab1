"""Mutation audit of the exercise graders: would the tests notice a planted bug in a grader?

The surprise first: mutmut cannot audit the graders. It mutates ``dpkit/`` only, and a
grader runs in a grading process of its own, forked from a server, in a folder of its own,
so nothing mutmut plants there is ever graded. This driver plants the bugs itself, one at a
time, in the text of one ``exercises/graders/test_taskN.py``:

- a comparison flipped or loosened (``==`` to ``!=``, ``<`` to ``<=``, ``in`` to ``not in``);
- a number changed (``n`` to ``n + 1``, ``0.25`` to ``0.35``, a tolerance below 0.01 times 10);
- ``and`` and ``or`` swapped, an ``assert`` removed (``pass`` in its place), a ``not`` removed.

Each mutant is graded the way ``tests/test_exercises.py`` and
``tests/test_exercises_wrong_answers.py`` grade, against the reference solution, the
untouched stub and every wrong answer of that task listed in the second file; it is
*killed* when one of those tests would fail: the solution fails a check, the stub passes
one (or fails it without its TODO hint), or a wrong answer does not fail exactly its
checks with its hint. It *survives* otherwise: a weakness of the wrong-answer set, or an
equivalent mutant (one no answer can tell apart, e.g. a hint's check the grader's parent
decides anyway under ``dpkit grade``, :mod:`dpkit.grading.decided`).

The real grader file is never edited: each mutant is a private copy of the trusted files
(:class:`dpkit.grading.sandbox.Trusted`) with the grader's text swapped, laid out by the
sandbox in a run folder of its own; all runs are forked from one server (imports once).

    .venv/bin/python -m benchmarks.grader_mutation --task 6
    .venv/bin/python -m benchmarks.grader_mutation --all --max-mutants 60

Results, merged grader by grader into what earlier runs measured:
``benchmarks/results/grader_mutation.json`` and ``benchmarks/results/grader_mutation.md``.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXERCISES = ROOT / "exercises"
WRONG_ANSWERS = ROOT / "tests" / "test_exercises_wrong_answers.py"
RESULTS_JSON = ROOT / "benchmarks" / "results" / "grader_mutation.json"
RESULTS_MD = ROOT / "benchmarks" / "results" / "grader_mutation.md"
NOTES = "## Reading the survivors"


# --------------------------------------------------------------------------------------
# The mutator: one small edit of the source text per mutant, everything else byte for byte.


@dataclass(frozen=True)
class Mutant:
    line: int
    description: str
    source: str


SWAPS = {
    ast.Eq: "!=",
    ast.NotEq: "==",
    ast.Lt: "<=",
    ast.LtE: "<",
    ast.Gt: ">=",
    ast.GtE: ">",
    ast.Is: "is not",
    ast.IsNot: "is",
    ast.In: "not in",
    ast.NotIn: "in",
}
# the operator in the text between two operands (longest spellings first)
OPERATOR = re.compile(rb"==|!=|<=|>=|<|>|\bis\s+not\b|\bnot\s+in\b|\bis\b|\bin\b")


def changed_number(value: int | float) -> int | float:
    if isinstance(value, int):
        return value + 1
    if 0 < abs(value) < 0.01:  # a tolerance: ten times looser
        return value * 10
    return round(value + 0.1, 12)


def mutants(source: str) -> list[Mutant]:
    """Every single-edit mutant of ``source`` that compiles, by line."""
    data = source.encode()
    tree = ast.parse(data)
    starts = [0]  # byte offset of each line (ast's columns count UTF-8 bytes)
    for text in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(text))

    def span(node: ast.AST) -> tuple[int, int]:
        return (
            starts[node.lineno - 1] + node.col_offset,
            starts[node.end_lineno - 1] + node.end_col_offset,
        )

    # Python 3.11 gives nodes inside f-strings unreliable columns: leave them alone.
    in_fstrings = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.JoinedStr)
        for inner in ast.walk(node)
    }
    found: list[Mutant] = []

    def edit(node: ast.AST, what: str, *changes: tuple[int, int, bytes]) -> None:
        text = data
        for start, end, new in sorted(changes, reverse=True):
            text = text[:start] + new + text[end:]
        try:
            compile(text, "<mutant>", "exec")
        except SyntaxError:
            return
        found.append(Mutant(node.lineno, what, text.decode()))

    for node in ast.walk(tree):
        if id(node) in in_fstrings:
            continue
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for i, op in enumerate(node.ops):
                match = OPERATOR.search(data, span(operands[i])[1], span(operands[i + 1])[0])
                if match is not None:
                    new = SWAPS[type(op)]
                    old = b" ".join(match.group().split()).decode()
                    edit(node, f"{old} -> {new}", (*match.span(), new.encode()))
        elif isinstance(node, ast.BoolOp):
            old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
            gaps = [(span(a)[1], span(b)[0]) for a, b in zip(node.values, node.values[1:])]
            words = [re.compile(rf"\b{old}\b".encode()).search(data, *gap) for gap in gaps]
            if all(words):
                edit(node, f"{old} -> {new}", *((*w.span(), new.encode()) for w in words))
        elif isinstance(node, ast.Constant) and type(node.value) in (int, float):
            new_value = changed_number(node.value)
            edit(node, f"{node.value!r} -> {new_value!r}", (*span(node), repr(new_value).encode()))
        elif isinstance(node, ast.Assert):
            blank = b"\n" * (node.end_lineno - node.lineno)  # later lines keep their numbers
            edit(node, "assert removed", (*span(node), b"pass" + blank))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            start, end = span(node.operand)
            edit(node, "not removed", (*span(node), b"(" + data[start:end] + b")"))
    return sorted(found, key=lambda m: m.line)


def spread(items: list[Any], most: int | None) -> list[Any]:
    """At most ``most`` of ``items``, evenly spaced, so a cap still covers the whole file."""
    if most is None or len(items) <= most:
        return items
    return [items[i * len(items) // most] for i in range(most)]


# --------------------------------------------------------------------------------------
# Killed or survived: the expectations of tests/test_exercises*.py, for one grading.


@dataclass(frozen=True)
class Variant:
    """A file graded against each mutant, and what the tests expect of its grading."""

    name: str
    source: bytes
    must_fail: tuple[str, ...] | None  # the checks that must fail; None: all of them
    hint: str  # in the hint of its first failing check (of each, when all must fail)


def killed_by(outcomes: dict[str, list[tuple[str, bool, str]]], variants: Sequence[Variant]) -> str:
    """Why the tests would notice the mutant ('' when they would not): ``outcomes`` has each
    variant's (check, passed, hint) rows."""
    for variant in variants:
        rows = outcomes.get(variant.name) or []
        if not rows:
            return f"{variant.name}: no checks ran"
        for check, passed, _ in rows:
            must_fail = variant.must_fail is None or check in variant.must_fail
            if passed == must_fail:
                return f"{variant.name}: {check!r} {'passed' if passed else 'failed'}"
        if not variant.hint:
            continue
        if variant.must_fail is None:  # every check fails, each with the hint
            hints = [hint for _, _, hint in rows]
        else:  # its first failing check has the hint
            hints = [hint for check, _, hint in rows if check == variant.must_fail[0]]
        if not hints or not all(variant.hint in hint for hint in hints):
            return f"{variant.name}: a hint without {variant.hint!r}"
    return ""


def variants_of(task: int) -> list[Variant]:
    """The reference solution, the stub and the task's wrong answers from the tests."""
    spec = importlib.util.spec_from_file_location("grader_mutation_wrong", WRONG_ANSWERS)
    wrong = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = wrong  # its dataclass looks its module up there
    spec.loader.exec_module(wrong)
    name = wrong.NAMES[task]
    found = [
        Variant("solution", (EXERCISES / "solutions" / name).read_bytes(), (), ""),
        Variant(
            "stub", (EXERCISES / name).read_bytes(), None, f"not implemented yet (TODO {task}."
        ),
    ]
    for w in wrong.WRONG:
        if w.task == task:
            failing = tuple(w.failing) or None
            found.append(Variant(f"wrong: {w.mistake}", w.source().encode(), failing, w.hint))
    return found


# --------------------------------------------------------------------------------------
# Grading a mutant: dpkit's own runs, forked from one server for the whole audit.


class Grading:
    def __init__(self, jobs: int, timeout: float) -> None:
        from dpkit.grading import apart, forkserver, sandbox
        from dpkit.grading.layout import task_files

        self.sandbox, self.jobs, self.timeout = sandbox, jobs, timeout
        self.base = sandbox.read_trusted(EXERCISES)
        self.names = task_files(EXERCISES)
        self.scratch = Path(tempfile.mkdtemp(prefix="dpkit-grader-mutation-"))
        self.server = None
        if forkserver.wanted():
            namespaces = apart.available() and apart.usable_for(self.scratch / "run")
            self.server = forkserver.start_server(str(self.scratch), namespaces)

    def grade(self, task: int, grader: str, variants: Sequence[Variant]) -> dict[str, list]:
        files = dict(self.base.files)
        files[f"exercises/graders/test_task{task}.py"] = grader.encode()
        trusted = self.sandbox.Trusted(files)

        def one(variant: Variant) -> list[tuple[str, bool, str]]:
            try:
                results = self.sandbox.run_graders(
                    [task],
                    EXERCISES,
                    {self.names[task]: variant.source},
                    self.timeout,
                    trusted,
                    [EXERCISES / "solutions"],
                    self.scratch,
                    self.server,
                    label=variant.name,
                )
            except Exception as error:  # noqa: BLE001 - a mutant the roster cannot list
                return [("the grader runs", False, f"{type(error).__name__}: {error}")]
            return [(r.check, r.passed, r.hint) for r in results]

        with ThreadPoolExecutor(max_workers=self.jobs) as pool:
            return dict(zip([v.name for v in variants], pool.map(one, variants)))

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        shutil.rmtree(self.scratch, ignore_errors=True)


def audit(grading: Grading, task: int, most: int | None) -> dict[str, Any]:
    """One grader's mutants graded: counts, survivors and the seconds it took."""
    started = time.perf_counter()
    path = EXERCISES / "graders" / f"test_task{task}.py"
    source = path.read_text()
    variants = variants_of(task)
    baseline = killed_by(grading.grade(task, source, variants), variants)
    if baseline:  # the tests fail on the real grader: no mutant can be judged
        return {"task": task, "error": f"the unmutated grader already fails: {baseline}"}
    every = mutants(source)
    chosen = spread(every, most)
    lines = source.splitlines()
    rows = []
    for number, mutant in enumerate(chosen, 1):
        why = killed_by(grading.grade(task, mutant.source, variants), variants)
        rows.append({"line": mutant.line, "description": mutant.description, "killed_by": why})
        state = "killed" if why else "SURVIVED"
        print(
            f"task {task} [{number}/{len(chosen)}] line {mutant.line}",
            f"{mutant.description}: {state}",
            flush=True,  # before a forked run's copy of the buffer can print it again
        )
    survivors = [
        {**row, "code": lines[row["line"] - 1].strip()} for row in rows if not row["killed_by"]
    ]
    killed = len(rows) - len(survivors)
    return {
        "task": task,
        "grader": str(path.relative_to(ROOT)),
        "variants": [v.name for v in variants],
        "mutants_generated": len(every),
        "mutants": len(rows),
        "killed": killed,
        "survived": len(survivors),
        "kill_rate": round(killed / len(rows), 3) if rows else None,
        "seconds": round(time.perf_counter() - started, 1),
        "survivors": survivors,
        "graded": rows,
        "measured": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


# --------------------------------------------------------------------------------------
# Results.


def write_results(results: dict[str, Any]) -> None:
    RESULTS_JSON.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    out = [
        "# Mutation audit of the exercise graders",
        "",
        "Written by `.venv/bin/python -m benchmarks.grader_mutation` (see its docstring): each",
        "mutant is one planted bug in a grader, graded against the reference solution, the stub",
        "and the task's wrong answers of `tests/test_exercises_wrong_answers.py`; killed when",
        "`tests/test_exercises*.py` would fail on it.",
        "",
        "| grader | mutants (of generated) | killed | survived | kill rate | seconds | measured |",
        "|---|---|---|---|---|---|---|",
    ]
    graders = [results[k] for k in sorted(results, key=int)]
    for r in graders:
        if "error" in r:
            out.append(f"| task {r['task']} | {r['error']} | | | | | |")
            continue
        out.append(
            f"| `{r['grader']}` | {r['mutants']} ({r['mutants_generated']}) | {r['killed']} | "
            f"{r['survived']} | {r['kill_rate']:.1%} | {r['seconds']} | {r['measured']} |"
        )
    for r in graders:
        if r.get("survivors"):
            out += ["", f"## Survivors of task {r['task']}", ""]
            out += [
                f"- line {s['line']}, {s['description']}: `{s['code']}`" for s in r["survivors"]
            ]
    # the reading of the survivors is written by hand below the mark, and kept
    kept = RESULTS_MD.read_text() if RESULTS_MD.exists() else ""
    notes = kept[kept.index(NOTES) :] if NOTES in kept else f"{NOTES}\n"
    RESULTS_MD.write_text("\n".join(out) + "\n\n" + notes)


def smallest_first(tasks: Sequence[int]) -> list[int]:
    size = {t: (EXERCISES / "graders" / f"test_task{t}.py").stat().st_size for t in tasks}
    return sorted(tasks, key=size.__getitem__)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--task", type=int, action="append", help="a task's grader (repeatable)")
    which.add_argument("--all", action="store_true", help="every grader, smallest first")
    parser.add_argument("--max-mutants", type=int, default=None, help="per grader, spread out")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per grading run")
    parser.add_argument("--jobs", type=int, default=2, help="variants graded at a time")
    args = parser.parse_args(argv)
    numbers = sorted(int(p.stem[9:]) for p in (EXERCISES / "graders").glob("test_task*.py"))
    tasks = smallest_first(numbers if args.all else args.task)
    results = json.loads(RESULTS_JSON.read_text()) if RESULTS_JSON.exists() else {}
    grading = Grading(args.jobs, args.timeout)
    try:
        for task in tasks:
            results[str(task)] = audit(grading, task, args.max_mutants)
            write_results(results)  # after each grader, so an interrupted run keeps it
    finally:
        grading.close()


if __name__ == "__main__":
    main()
