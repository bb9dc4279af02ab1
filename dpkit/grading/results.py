"""Check results: the per-check outcome, the friendly report, and the class CSV."""

from __future__ import annotations

import contextlib
import csv
import os
import tempfile
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from dpkit.grading.roster import Check

NOT_RUN = "did not run: the grading run ended early"
LEFT_OUT = (
    "the grading process reported no outcome for this check, which the grader defines: it scores 0"
)
PASS, FAIL = "\u2713", "\u2717"  # check mark, ballot x


@dataclass(frozen=True)
class CheckResult:
    """One grader check: its task, its friendly name, whether it passed, and a hint if not."""

    task: int
    check: str
    passed: bool
    hint: str = ""


def results_from_records(
    records: Sequence[dict],
    stopped: str | None,
    tasks: Sequence[int],
    checks: Sequence[Check] | None = None,
) -> list[CheckResult]:
    """Per-check results from the harness's (authenticated) records; ``stopped`` says why a
    run ended early.

    ``checks`` is the parent's list (:func:`dpkit.grading.roster.roster`): what is scored,
    whatever the records list; a check with no outcome fails, an outcome for a check not on
    the list counts for nothing (:func:`unlisted` names them). Without it (older callers,
    tests of the records alone) the records' "collected" checks are the list.

    Only a "passed" record passes a check. The first check without an outcome is the one
    that was running when the run ended, so it carries ``stopped``; the checks after it
    never ran. In a run that finished, a check without an outcome was left out.
    """
    collected = [r for r in records if r["event"] == "collected"]
    if not collected:
        why = stopped or "the grader collected no checks"
        return [CheckResult(task, "the grader runs", False, why) for task in tasks]
    if checks is not None:
        collected = [{"nodeid": c.nodeid, "task": c.task, "check": c.name} for c in checks]
    finished = stopped is None and any(r["event"] == "finished" for r in records)
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
            if finished and checks is not None:
                hint = LEFT_OUT
            else:
                hint = stopped if in_flight and stopped else NOT_RUN
            in_flight = False
            result = CheckResult(check["task"], check["check"], False, hint)
        results.append(result)
    return results


def unlisted(records: Sequence[dict], checks: Sequence[Check]) -> list[str]:
    """The node ids the records name that are not among ``checks``: outcomes or checks the
    grading process reported that the graders do not define, which count for nothing."""
    known = {check.nodeid for check in checks}
    named = (str(r.get("nodeid")) for r in records if "nodeid" in r)
    return [nodeid for nodeid in dict.fromkeys(named) if nodeid not in known]


# Characters a terminal or a spreadsheet does not show as themselves: controls (C0, DEL,
# C1), format characters (bidi overrides and isolates, U+061C, zero-width ones, U+2060,
# tag characters), line and paragraph separators (U+2028, U+2029), surrogates, private
# use and unassigned code points; and the blank fillers that draw nothing.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})
_INVISIBLE = frozenset("\u034f\u115f\u1160\u17b4\u17b5\u180e\u3164\uffa0")


def _unsafe(character: str) -> bool:
    return unicodedata.category(character) in _UNSAFE_CATEGORIES or character in _INVISIBLE


def clean_text(text: str) -> str:
    r"""``text`` safe for a terminal: every control or invisible character written out.

    An ANSI escape sequence loses its ESC and shows as plain text (``\x1b[31m``); a tab or
    a newline inside a hint becomes ``\x09`` or ``\x0a``; a right-to-left override
    ``\u202e``, a tag character ``\U000e0041``.
    """
    out = []
    for character in unicodedata.normalize("NFC", text):
        if _unsafe(character):
            code = ord(character)
            out.append(
                f"\\x{code:02x}"
                if code < 0x100
                else f"\\u{code:04x}"
                if code < 0x10000
                else f"\\U{code:08x}"
            )
        else:
            out.append(character)
    return "".join(out)


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
        hints = {r.hint for r in mine if not r.passed}
        once = len(mine) > 1 and not any(r.passed for r in mine) and len(hints) == 1
        for result in mine:
            lines.append(f"  {PASS if result.passed else FAIL} {clean_text(result.check)}")
            if not result.passed and result.hint and not once:
                lines.append(f"      hint: {clean_text(result.hint)}")
        if once and mine[0].hint:  # a file that cannot be imported: one hint, said once
            lines.append(f"      hint, every check: {clean_text(mine[0].hint)}")
    passed = sum(r.passed for r in results)
    verdict = "all checks pass" if passed == len(results) else "keep going"
    lines.append(f"{passed}/{len(results)} checks passed: {verdict}")
    return "\n".join(lines)


def check_writable(path: str | os.PathLike[str], flag: str = "--csv") -> None:
    """Raise a clear ValueError, naming ``flag``, now if ``path`` cannot be written (before
    a class is graded); the file is left as it was."""
    existed = os.path.exists(path)
    if os.path.isdir(path):
        raise ValueError(f"{flag} {str(path)!r} is a folder: give a file name, e.g. grades.csv")
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as error:
        raise ValueError(
            f"cannot write the CSV {flag} {str(path)!r} ({error.strerror}): choose a writable path"
        ) from None
    if not existed:
        os.remove(path)


def check_folder_writable(path: str | os.PathLike[str], flag: str = "--feedback") -> None:
    """Raise a clear ValueError, naming ``flag``, now unless files can be written in the
    folder ``path``; the folders this makes to find out are removed again."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{flag} {str(path)!r} is a file: give a folder, e.g. feedback/")
    made = []  # the folders that are not there yet, deepest first
    missing = os.path.abspath(path)
    while not os.path.lexists(missing):
        made.append(missing)
        missing = os.path.dirname(missing)
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as error:
        raise ValueError(
            f"cannot write in the folder {flag} {str(path)!r} ({error.strerror}): "
            "choose a writable folder"
        ) from None
    finally:
        for folder in made:
            with contextlib.suppress(OSError):
                os.rmdir(folder)


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


DEFAULT_WEIGHT = 10.0  # points a task is worth when no weights file says otherwise


def read_weights(path: str | os.PathLike[str] | None) -> dict[int, float]:
    """Each task's points from a small TOML file (``[weights]`` then ``1 = 10``, ``2 = 20``);
    a task it does not name is worth :data:`DEFAULT_WEIGHT`. No file: every task is."""
    if path is None:
        return {}
    import tomllib

    try:
        with open(path, "rb") as file:
            table = tomllib.load(file).get("weights", {})
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ValueError(f"cannot read the weights file {str(path)!r}: {error}") from None
    weights = {}
    for key, value in table.items():
        if not str(key).isdigit() or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(
                f"weights file {str(path)!r}: each line is 'TASK = POINTS' (e.g. 1 = 10), "
                f"got {key!r} = {value!r}"
            )
        weights[int(key)] = float(value)
    return weights


def summary_rows(
    rows: Sequence[tuple[str, CheckResult]], weights: dict[int, float] | None = None
) -> tuple[list[str], list[list[object]]]:
    """The per-student summary: a header and one row per student (id, each task's points,
    total, out of). A task's points are its weight times the share of its checks passed."""
    weights = weights or {}
    tasks = sorted({r.task for _, r in rows})
    students = list(dict.fromkeys(student for student, _ in rows))
    header = ["student", *(f"task{t}" for t in tasks), "total", "out_of"]
    table = []
    for student in students:
        points = []
        for task in tasks:
            mine = [r for s, r in rows if s == student and r.task == task]
            share = sum(r.passed for r in mine) / len(mine) if mine else 0.0
            points.append(round(share * weights.get(task, DEFAULT_WEIGHT), 2))
        out_of = sum(weights.get(t, DEFAULT_WEIGHT) for t in tasks)
        table.append([student, *points, round(sum(points), 2), round(out_of, 2)])
    return header, table


def write_summary(
    rows: Sequence[tuple[str, CheckResult]],
    path: str | os.PathLike[str],
    weights: dict[int, float] | None = None,
) -> None:
    """Write :func:`summary_rows` as a CSV, every cell cleaned like the long CSV's."""
    header, table = summary_rows(rows, weights)
    with open(path, "w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(header)
        for row in table:
            writer.writerow([clean_cell(cell) for cell in row])


def write_feedback(
    rows: Sequence[tuple[str, CheckResult]], folder: str | os.PathLike[str]
) -> list[str]:
    """One text file per student in ``folder``: their report. The file names written."""
    os.makedirs(folder, exist_ok=True)
    written = []
    for student in dict.fromkeys(student for student, _ in rows):
        mine = [r for s, r in rows if s == student]
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in student).lstrip(".")
        name, count = f"{safe or 'student'}.txt", 1
        while name in written:  # two names that differ only in unsafe characters
            count += 1
            name = f"{safe or 'student'}-{count}.txt"
        with open(os.path.join(folder, name), "w", encoding="utf-8") as file:
            file.write(f"Grading report for {clean_text(student)}\n\n{report(mine)}\n")
        written.append(name)
    return written
