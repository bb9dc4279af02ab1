"""The measuring notebooks' verdicts agree with their own numbers, quiet and under load.

A lesson measured on a laptop must not state an outcome its numbers do not support, and the
laptop is rarely quiet. Two runs are checked:

- **under load**, in CI: ``make test`` runs nbval with ``DPKIT_NOTEBOOKS_UNDER_LOAD=1``, so each
  measuring notebook (03, 05, 06, 07, 08, 09) runs while two processes keep two cores busy, and
  notebooks/conftest.py reads every cell's fresh output with tests/verdict_checker.py. The first
  test here shows that gate failing on a contradicting verdict and an unchecked claim.
- **quiet**: the stored outputs, from ``make notebooks`` on a quiet machine, pass the same
  checker (the second test).

Under load on 2 cores (December 2026): 03 8-11 s, 05 17-19 s, 07 17-29 s, 08 5-10 s.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tests.verdict_checker import MEASURING, cell_problems, find_verdicts, printed_text

pytestmark = pytest.mark.notebooks

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"

# A cell printing a verdict its own quartiles contradict (their middle half holds 1).
CONTRADICTION = 'print("1.50x (middle half of the rounds: 0.90-1.60x) → faster: 4 lanes")'
UNCHECKED = 'print("4 lanes were faster")'


def _nbval(folder: Path, under_load: bool) -> subprocess.CompletedProcess:
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT)}
    env["DPKIT_NOTEBOOKS_UNDER_LOAD"] = "1" if under_load else "0"
    for name in ("IPYTHONDIR", "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR"):
        env[name] = str(folder / "state" / name.lower())
    command = [sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env",
               "-p", "no:cacheprovider", "-q", "--rootdir", str(folder), str(folder)]  # fmt: skip
    return subprocess.run(command, env=env, cwd=folder, capture_output=True, text=True)


def test_nbval_fails_a_cell_whose_verdict_its_numbers_contradict(tmp_path):
    """One nbval run, under load, of a measuring notebook's name holding a contradicted
    verdict (cell 1) and an outcome stated outside the form (cell 2): both cells fail, and
    the notebook's last cell for printing fewer verdicts than it should."""
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source)
                      for source in ("x = 1", CONTRADICTION, UNCHECKED)]  # fmt: skip
    for cell in notebook.cells:
        cell.metadata["tags"] = ["nbval-ignore-output"]  # the checker, not the comparison
    nbformat.write(notebook, tmp_path / "08_pitfalls.ipynb")  # a measuring notebook's name
    shutil.copy(NOTEBOOKS / "conftest.py", tmp_path / "conftest.py")
    result = _nbval(tmp_path, under_load=True)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED 08_pitfalls.ipynb::Cell 1" in result.stdout
    assert "FAILED 08_pitfalls.ipynb::Cell 2" in result.stdout
    assert "says 'faster' but 0.90-1.60x means too noisy" in result.stdout
    assert "states an unchecked outcome: 4 lanes were faster" in result.stdout
    assert "fewer than its 2" in result.stdout  # it printed one verdict of the two


@pytest.mark.parametrize("name", list(MEASURING))
def test_the_stored_quiet_run_s_verdicts_agree_with_their_numbers(name):
    notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    fewest, not_measurements = MEASURING[name]
    verdicts, problems = 0, []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type == "code":
            text = printed_text(cell)
            verdicts += len(find_verdicts(text))
            problems += [f"c{index}: {p}" for p in cell_problems(text, cell.id, not_measurements)]
    assert problems == [], "\n".join(problems)
    assert verdicts >= fewest, f"only {verdicts} verdicts stored"
