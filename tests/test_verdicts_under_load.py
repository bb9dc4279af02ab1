"""Notebook 03 run on a loaded machine: every verdict it prints agrees with its own numbers.

A lesson measured on a laptop must not state an outcome its numbers do not support, and the
laptop is rarely quiet. So the notebook runs here in a fresh kernel while two other processes
keep two cores busy (started and killed by the test), and tests/verdict_checker.py reads what
each cell printed: every verdict in dpkit.verdict's form must agree with the quartiles printed
with it, and no line may state a measured outcome outside that form. About 20-30 s on 2 cores.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.verdict_checker import check_text, find_verdicts, printed_text, unchecked_claims

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

pytestmark = pytest.mark.notebooks

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "03_parallel_apply.ipynb"
SPIN = "while True: pass"


@pytest.fixture
def two_busy_processes() -> Iterator[list[subprocess.Popen]]:
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(2)]
    try:
        yield spinners
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


@pytest.fixture
def jupyter_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep Jupyter, IPython and matplotlib state out of the user's home."""
    monkeypatch.setenv("MPLBACKEND", "Agg")
    for name, folder in [
        ("MPLCONFIGDIR", "matplotlib"),
        ("IPYTHONDIR", "ipython"),
        ("JUPYTER_CONFIG_DIR", "jupyter/config"),
        ("JUPYTER_DATA_DIR", "jupyter/data"),
        ("JUPYTER_RUNTIME_DIR", "jupyter/runtime"),
    ]:
        monkeypatch.setenv(name, str(tmp_path / folder))


def test_every_verdict_in_03_agrees_with_its_numbers_on_a_loaded_machine(
    two_busy_processes, jupyter_state
):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    start = time.perf_counter()
    client = nbclient.NotebookClient(
        notebook,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )
    client.execute()
    wall = time.perf_counter() - start
    assert all(spinner.poll() is None for spinner in two_busy_processes), "the load ended early"

    verdicts, problems = 0, []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        text = printed_text(cell)
        verdicts += len(find_verdicts(text))
        problems += [f"c{index}: {problem}" for problem in check_text(text)]
        problems += [
            f"c{index} states an unchecked outcome: {line}" for line in unchecked_claims(text)
        ]
    # the speed-ups of section 2b, the default threads, the GIL's two models and their ratio
    assert verdicts >= 8, f"only {verdicts} verdicts printed"
    assert problems == [], "\n".join(problems)
    print(f"notebook 03 under two busy processes: {wall:.1f} s, {verdicts} verdicts checked")
