"""docs/hardware_file.md answers a practitioner's question with ``dpkit predict`` runs: every
line it shows of a run must be what that run prints today (a model change that moves a
number, or a new column in the memory table, shows here, not in a reader's terminal)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from dpkit.cli import main

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "hardware_file.md"


def shown_runs() -> list[tuple[str, list[str], int]]:
    """Each ``$ dpkit predict ...`` in the doc's code blocks: the command, the lines shown
    after it (``...`` and ``# remarks`` left out), and the exit status (``echo $?``)."""
    runs = []
    for block in re.findall(r"^```\n(.*?)^```", DOC.read_text(), re.M | re.S):
        for chunk in re.split(r"^\$ ", block, flags=re.M)[1:]:
            command, *lines = chunk.rstrip("\n").split("\n")
            if command == "echo $?":
                runs[-1] = (*runs[-1][:2], int(lines[0]))
                continue
            assert command.startswith("dpkit predict "), command
            shown = [re.sub(r"\s+# .*$", "", line) for line in lines if line not in ("", "...")]
            runs.append((command, shown, 0))
    return runs


RUNS = shown_runs()


def test_the_doc_shows_runs_of_every_kind():
    assert len(RUNS) >= 8
    assert any(status == 2 for _, _, status in RUNS)  # DataParallel across nodes, refused
    assert any("--hardware-file" in command for command, _, _ in RUNS)


@pytest.mark.parametrize(("command", "shown", "status"), RUNS, ids=[r[0][14:] for r in RUNS])
def test_every_line_the_doc_shows_is_what_the_run_prints(
    command, shown, status, capsys, monkeypatch, tmp_path, predict_models_built_once
):
    # In this process, each model built and profiled once (conftest.py): the lines printed
    # are a fresh command's.
    monkeypatch.chdir(ROOT)  # the doc's paths are the repository's
    monkeypatch.delenv("DPKIT_DEBUG", raising=False)
    assert main([*shlex.split(command)[1:], "--out", str(tmp_path)]) == status
    captured = capsys.readouterr()
    printed = [line.rstrip() for line in (captured.out + captured.err).splitlines()]
    for line in shown:
        assert line.rstrip() in printed, f"the doc shows {line!r}; the run printed:\n" + "\n".join(
            printed
        )
