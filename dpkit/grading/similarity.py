"""Which students handed in the same code: a warning for the instructor, never a grade.

Two files count as the same when their token streams match after normalising what a
copy-and-rename changes: comments, docstrings, blank lines and indentation are dropped,
and every name (variables, functions, arguments) becomes its order of first use, so
``total += x`` and ``acc += item`` read alike. Keywords, operators, literals and attribute
names stay. Files still equal to the task's stub are left out (everyone starts there).
"""

from __future__ import annotations

import difflib
import io
import keyword
import token
import tokenize
from collections.abc import Mapping
from dataclasses import dataclass

NEAR = 0.9  # SequenceMatcher ratio from which two normalised files are "near-identical"
_SKIPPED = {
    token.COMMENT,
    token.NL,
    token.NEWLINE,
    token.INDENT,
    token.DEDENT,
    token.ENCODING,
    token.ENDMARKER,
}


def normalised(source: str) -> tuple[str, ...]:
    """``source``'s tokens without layout, comments and docstrings, names numbered."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return tuple(source.split())
    names: dict[str, str] = {}
    out: list[str] = []
    previous = token.NEWLINE
    after_dot = False
    for tok in tokens:
        if tok.type in _SKIPPED:
            if tok.type in (token.NEWLINE, token.INDENT, token.DEDENT):
                previous = token.NEWLINE
            continue
        if tok.type == token.STRING and previous == token.NEWLINE:
            previous = token.STRING  # a docstring or a bare string statement
            continue
        previous = tok.type
        if tok.type == token.NAME and not keyword.iskeyword(tok.string) and not after_dot:
            out.append(names.setdefault(tok.string, f"n{len(names)}"))
        else:
            out.append(tok.string)
        after_dot = tok.string == "."
    return tuple(out)


@dataclass(frozen=True)
class Similar:
    """Two students' files for one task that match after normalising."""

    task: int
    first: str
    second: str
    ratio: float

    def describe(self) -> str:
        how = "identical" if self.ratio >= 1.0 else f"{self.ratio:.0%} alike"
        return (
            f"task {self.task}: {self.first} and {self.second} handed in {how} code "
            "(after normalising names and layout)"
        )


def similar_pairs(
    files: Mapping[str, Mapping[int, str]], stubs: Mapping[int, str], near: float = NEAR
) -> list[Similar]:
    """Pairs of students whose files for a task match at least ``near``.

    ``files``: student -> task -> source; ``stubs``: task -> the stub's source.
    """
    found = []
    for task, stub in stubs.items():
        start = normalised(stub)
        mine = {
            student: normalised(sources[task])
            for student, sources in files.items()
            if task in sources
        }
        mine = {s: t for s, t in mine.items() if t != start and len(t) > 0}
        students = sorted(mine)
        for i, first in enumerate(students):
            for second in students[i + 1 :]:
                a, b = mine[first], mine[second]
                if a == b:
                    found.append(Similar(task, first, second, 1.0))
                    continue
                matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
                if matcher.real_quick_ratio() >= near and matcher.quick_ratio() >= near:
                    ratio = matcher.ratio()
                    if ratio >= near:
                        found.append(Similar(task, first, second, ratio))
    return found
