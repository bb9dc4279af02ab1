"""The stored notebooks are what learners open: they must be fresh, complete and teach to the end.

Static checks on the .ipynb files (nbval, run by ``make test``, re-executes them and
compares outputs). A notebook passes only as ``make notebooks`` leaves it:

- its code cells ran once each, top to bottom, in a fresh kernel (execution counts 1..N);
- no cell was edited after that run: ``make notebooks`` stamps each code cell with a hash of
  the source it ran, and the source must still match it;
- every code cell has outputs (unless tagged to be skipped), none of them an error, and no
  stderr that names a file (paths differ on every machine and break nbval);
- it shows at least one figure as a stored PNG, ends with a "check your understanding" quiz
  and lists the PyTorch issues behind its pitfalls.

Stamp after executing: ``python tests/test_notebooks.py --stamp notebooks/*.ipynb`` (what
``make notebooks`` does).
"""

from __future__ import annotations

import copy
import hashlib
import re
import sys
from pathlib import Path

import nbformat
import pytest

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
STAMP_KEY = "dpkit_executed_source"
SKIP_TAGS = {"nbval-skip", "skip-execution"}
FILE_IN_TEXT = re.compile(r"""(File "|[\w.-]+\.py\b|/[\w.-]+/[\w.-]+)""")


def source_hash(source: str) -> str:
    """What a code cell ran, as a short hash (trailing whitespace does not count)."""
    normalized = "\n".join(line.rstrip() for line in source.strip().splitlines())
    return hashlib.sha256(normalized.encode()).hexdigest()[:16]


def stamp(path: Path) -> None:
    """Record in each code cell the hash of the source it was just executed with."""
    notebook = nbformat.read(path, as_version=4)
    for cell in code_cells(notebook):
        cell.metadata[STAMP_KEY] = source_hash(cell.source)
    nbformat.write(notebook, path)


def code_cells(notebook) -> list:
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def stale_cells(notebook) -> list[str]:
    """Why the stored outputs do not come from the stored sources, one line per problem."""
    problems = []
    cells = code_cells(notebook)
    for number, cell in enumerate(cells, start=1):
        where = f"code cell {number} ({cell.source.strip().splitlines()[0][:50]!r})"
        if cell.execution_count != number:
            problems.append(f"{where} has execution count {cell.execution_count}, not {number}")
        stamped = cell.metadata.get(STAMP_KEY)
        if stamped is None:
            problems.append(f"{where} was never stamped by `make notebooks`")
        elif stamped != source_hash(cell.source):
            problems.append(f"{where} was edited after it ran")
    return problems


def tags(cell) -> set[str]:
    return set(cell.metadata.get("tags", []))


def read(path: Path):
    return nbformat.read(path, as_version=4)


needs_notebooks = pytest.mark.skipif(not NOTEBOOKS, reason="no notebooks in notebooks/ yet")
each_notebook = pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])


@needs_notebooks
@each_notebook
def test_ran_top_to_bottom_in_a_fresh_kernel_and_unedited_since(path):
    problems = stale_cells(read(path))
    assert not problems, (
        f"{path.name}: stored outputs are stale; run `make notebooks`.\n  " + "\n  ".join(problems)
    )


@needs_notebooks
@each_notebook
def test_every_code_cell_has_outputs_and_none_is_an_error(path):
    for number, cell in enumerate(code_cells(read(path)), start=1):
        if tags(cell) & SKIP_TAGS:
            continue
        assert cell.outputs, f"{path.name}: code cell {number} has no stored output"
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert not errors, f"{path.name}: code cell {number} stored {errors[0].ename}"


@needs_notebooks
@each_notebook
def test_no_stderr_naming_a_file(path):
    for number, cell in enumerate(code_cells(read(path)), start=1):
        for output in cell.outputs:
            if output.output_type == "stream" and output.name == "stderr":
                assert not FILE_IN_TEXT.search(output.text), (
                    f"{path.name}: code cell {number} wrote a file path to stderr (a warning?): "
                    f"{output.text[:200]!r}; filter or capture it"
                )


@needs_notebooks
@each_notebook
def test_shows_a_figure(path):
    images = [
        output
        for cell in code_cells(read(path))
        for output in cell.outputs
        if "image/png" in output.get("data", {})
    ]
    assert images, f"{path.name}: no figure stored as image/png"


@needs_notebooks
@each_notebook
def test_ends_with_a_quiz_and_the_pytorch_issues(path):
    notebook = read(path)
    assert any("check_your_understanding(" in c.source for c in code_cells(notebook)), (
        f"{path.name}: no quiz cell (dpkit.viz.quiz.check_your_understanding)"
    )
    headings = [
        line
        for cell in notebook.cells
        if cell.cell_type == "markdown"
        for line in cell.source.splitlines()
        if line.startswith("#")
    ]
    assert any("PyTorch issues" in h for h in headings), f"{path.name}: no 'PyTorch issues' section"


@needs_notebooks
def test_the_staleness_check_catches_an_edit_and_an_out_of_order_run():
    notebook = read(NOTEBOOKS[0])
    assert not stale_cells(notebook)

    edited = copy.deepcopy(notebook)
    cell = code_cells(edited)[-1]
    cell.source += "\nprint('changed')"
    assert any("edited after it ran" in p for p in stale_cells(edited))

    rerun = copy.deepcopy(notebook)
    code_cells(rerun)[0].execution_count = len(code_cells(rerun)) + 1
    assert any("execution count" in p for p in stale_cells(rerun))

    unrun = copy.deepcopy(notebook)
    code_cells(unrun)[0].execution_count = None
    assert stale_cells(unrun)

    whitespace_only = copy.deepcopy(notebook)
    code_cells(whitespace_only)[0].source += "   \n"
    assert not stale_cells(whitespace_only)


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "--stamp":
        sys.exit("usage: python tests/test_notebooks.py --stamp NOTEBOOK.ipynb ...")
    for name in sys.argv[2:]:
        stamp(Path(name))
