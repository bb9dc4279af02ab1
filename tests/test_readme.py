"""The README's example runs on a machine without a GPU and shows what it promises."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from dpkit import cli

README = Path(__file__).resolve().parents[1] / "README.md"


def _example_code() -> str:
    text = README.read_text()
    section = text.split("## Example", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_example_is_short():
    assert len(_example_code().strip().splitlines()) <= 14


def _python(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120)


def test_example_splits_10_as_3_3_3_1_and_matches_the_plain_model():
    result = _python("-c", _example_code())
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[3, 3, 3, 1]", "True True"]


def test_cli_devices_names_the_choice():
    result = _python("-m", "dpkit", "devices", "-n", "4")
    assert result.returncode == 0, result.stderr
    assert "devices(4) ->" in result.stdout
    assert "torch" in result.stdout


def test_cli_rejects_zero_devices_with_a_clear_error(capsys, monkeypatch):
    # In this process, through the parser `python -m dpkit` runs (the test above starts one):
    # the exit status the shell sees, and the message on stderr.
    monkeypatch.delenv("DPKIT_DEBUG", raising=False)
    try:
        status = cli.main(["devices", "-n", "0"])
    except SystemExit as exit:
        status = exit.code
    assert status == 2
    assert "n must be at least 1" in capsys.readouterr().err
