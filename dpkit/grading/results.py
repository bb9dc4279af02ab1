"""Check results: the per-check outcome, the friendly report, and the class CSV."""

from __future__ import annotations

import csv
import os
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

PASS, FAIL = "\u2713", "\u2717"  # check mark, ballot x


@dataclass(frozen=True)
class CheckResult:
    """One grader check: its task, its friendly name, whether it passed, and a hint if not."""

    task: int
    check: str
    passed: bool
    hint: str = ""


def results_from_records(
    records: Sequence[dict], stopped: str | None, tasks: Sequence[int]
) -> list[CheckResult]:
    """Per-check results from the harness's (authenticated) records; ``stopped`` says why a
    run ended early.

    Only a "passed" record passes a check. The first check without an outcome is the one
    that was running when the run ended, so it carries ``stopped``; the checks after it
    never ran.
    """
    collected = [r for r in records if r["event"] == "collected"]
    if not collected:
        why = stopped or "the grader collected no checks"
        return [CheckResult(task, "the grader runs", False, why) for task in tasks]
    failures: dict[str, str] = {}
    passed: set[str] = set()
    for record in records:
        if record["event"] == "failed":
            failures.setdefault(record["nodeid"], record["hint"])
        elif record["event"] == "passed":
            passed.add(record["nodeid"])
    results = []
    in_flight = True
    for check in collected:
        nodeid = check["nodeid"]
        if nodeid in failures:
            result = CheckResult(check["task"], check["check"], False, failures[nodeid])
        elif nodeid in passed:
            result = CheckResult(check["task"], check["check"], True)
        else:
            hint = stopped if in_flight and stopped else "did not run: the grading run ended early"
            in_flight = False
            result = CheckResult(check["task"], check["check"], False, hint)
        results.append(result)
    return results


# Control characters (C0, DEL, C1) and the Unicode controls that reorder or hide text.
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def clean_text(text: str) -> str:
    r"""``text`` safe for a terminal: every control character written out as ``\xNN``.

    An ANSI escape sequence loses its ESC and shows as plain text (``\x1b[31m``); a tab or
    a newline inside a hint becomes ``\x09`` or ``\x0a``.
    """

    def escape(match: re.Match[str]) -> str:
        code = ord(match.group())
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"

    return _UNSAFE.sub(escape, unicodedata.normalize("NFC", text))


FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def clean_cell(value: object) -> str:
    """One CSV cell that a spreadsheet shows as text: controls escaped, and a leading
    ``=``, ``+``, ``-``, ``@``, tab or CR (which start a formula) guarded by a ``'``."""
    text = str(value)
    if text.startswith(FORMULA_PREFIXES):
        text = "'" + text
    return clean_text(text)


def report(results: Sequence[CheckResult]) -> str:
    """A friendly report: a line per check (with a hint under each failure) and the total."""
    lines = []
    tasks = sorted({r.task for r in results})
    for task in tasks:
        mine = [r for r in results if r.task == task]
        if len(tasks) > 1:
            lines.append(f"Task {task}: {sum(r.passed for r in mine)}/{len(mine)} checks passed")
        for result in mine:
            lines.append(f"  {PASS if result.passed else FAIL} {clean_text(result.check)}")
            if not result.passed and result.hint:
                lines.append(f"      hint: {clean_text(result.hint)}")
    passed = sum(r.passed for r in results)
    verdict = "all checks pass" if passed == len(results) else "keep going"
    lines.append(f"{passed}/{len(results)} checks passed: {verdict}")
    return "\n".join(lines)


def check_writable(path: str | os.PathLike[str]) -> None:
    """Raise a clear ValueError now if ``path`` cannot be written (before a class is graded)."""
    existed = os.path.exists(path)
    if os.path.isdir(path):
        raise ValueError(f"--csv {str(path)!r} is a folder: give a file name, e.g. grades.csv")
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as error:
        raise ValueError(
            f"cannot write the CSV {str(path)!r} ({error.strerror}): choose a writable path"
        ) from None
    if not existed:
        os.remove(path)


def write_csv(rows: Sequence[tuple[str, CheckResult]], path: str | os.PathLike[str]) -> None:
    """One line per student and check: student, task, check, result (pass/fail), hint.

    Every cell is cleaned (:func:`clean_cell`): a folder name or a hint written by student
    code cannot become a formula or a terminal escape in the instructor's tools.
    """
    with open(path, "w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(["student", "task", "check", "result", "hint"])
        for student, r in rows:
            cells = [student, r.task, r.check, "pass" if r.passed else "fail", r.hint]
            writer.writerow([clean_cell(cell) for cell in cells])
