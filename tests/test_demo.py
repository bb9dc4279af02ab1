"""``dpkit demo`` end to end in a subprocess: it trains, prints and writes its files. Its
refusals of bad options (exit status 2 and the option's name) and its help come from the
parser before any work: those run in this process through ``dpkit.cli.main``, the same parser
and exit status as the command's, without starting a Python and torch for each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dpkit import cli

ROOT = Path(__file__).resolve().parents[1]


def _demo(*options: str) -> subprocess.CompletedProcess:
    # Under the placement check, as on a GPU: a model or batch left off the devices fails.
    env = {**os.environ, "MPLBACKEND": "Agg", "DPKIT_CHECK_PLACEMENT": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "dpkit", "demo", *options],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
    )


@pytest.fixture
def demo_here(capsys, monkeypatch):
    """``dpkit demo OPTIONS`` in this process: (exit status, stdout, stderr), the status as
    the shell sees it (argparse's SystemExit included)."""
    monkeypatch.delenv("DPKIT_DEBUG", raising=False)

    def run(*options: str) -> tuple[int, str, str]:
        try:
            status = cli.main(["demo", *options])
        except SystemExit as exit:  # the parser's refusals and --help
            status = exit.code
        captured = capsys.readouterr()
        return status, captured.out, captured.err

    return run


def test_demo_writes_a_timeline_and_a_chrome_trace(tmp_path):
    result = _demo("--steps", "1", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr

    timeline, trace_json = tmp_path / "timeline.png", tmp_path / "trace.json"
    memory = tmp_path / "memory.png"
    assert timeline.read_bytes().startswith(b"\x89PNG")
    assert memory.read_bytes().startswith(b"\x89PNG")
    events = json.loads(trace_json.read_text())["traceEvents"]
    phases = {e["name"] for e in events if e["ph"] == "X"}
    assert {"scatter", "replicate", "apply", "gather", "reduce"} <= phases

    out = result.stdout
    assert "virtual" in out  # this machine's lanes say what they are
    assert "devices(4) ->" in out
    assert "1 SGD step, traced" in out  # --steps 1: a count, not "1 SGD steps"
    assert "time/step" in out and "apply" in out  # the summary table
    assert str(timeline) in out and str(trace_json) in out and str(memory) in out
    # the memory table: lane 0 holds its chunk of 64 images (1x28x28 float32) and the
    # gathered logits of all 256 (10 float32 each)
    lane0 = next(line for line in out.splitlines() if line.startswith("virtual:0"))
    assert f"{64 * 28 * 28 * 4:,d}" in lane0 and f"{256 * 10 * 4:,d}" in lane0
    assert "perfetto" in out.lower() and "chrome://tracing" in out


def test_demo_cnn_on_two_devices(tmp_path):
    result = _demo(
        "--model", "cnn", "--devices", "2", "--batch", "8", "--steps", "1", "--out", str(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    devices = {
        e["args"]["name"]
        for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
        if e["name"] == "thread_name"
    }
    assert len(devices) == 2


def test_demo_rejects_zero_devices_naming_the_option(demo_here, tmp_path):
    status, _, err = demo_here("--devices", "0", "--out", str(tmp_path))
    assert status == 2
    assert "--devices" in err and "at least 1" in err
    assert not (tmp_path / "trace.json").exists()


def test_demo_rejects_zero_batch_naming_the_option(demo_here, tmp_path):
    status, _, err = demo_here("--batch", "0", "--out", str(tmp_path))
    assert status == 2
    assert "--batch" in err


def test_demo_help_lists_the_options(demo_here):
    status, out, _ = demo_here("--help")
    assert status == 0
    for option in ("--devices", "--batch", "--model", "--steps", "--out", "cnn"):
        assert option in out


def test_a_runtime_error_from_torch_is_a_message_not_a_traceback(monkeypatch, capsys):
    from dpkit import demo

    def misplaced(*args, **kwargs):
        raise RuntimeError("module must have its parameters and buffers on device cuda:0")

    monkeypatch.setattr(demo, "run_demo", misplaced)
    monkeypatch.delenv("DPKIT_DEBUG", raising=False)
    assert cli.main(["demo"]) == 2
    assert "dpkit: error: RuntimeError: module must have" in capsys.readouterr().err
    monkeypatch.setenv("DPKIT_DEBUG", "1")  # and the traceback for whoever asks
    with pytest.raises(RuntimeError):
        cli.main(["demo"])
