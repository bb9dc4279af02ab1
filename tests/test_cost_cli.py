"""``dpkit predict`` end to end, in a subprocess as a learner runs it."""

from __future__ import annotations

import json
import subprocess
import sys

import dpkit.cost as cost


def dpkit(*arguments: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dpkit", *arguments],
        capture_output=True, text=True, timeout=120, cwd=cwd,
    )  # fmt: skip


def test_list_prints_a_preset_per_line_name_first():
    result = dpkit("predict", "--list")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == list(cost.presets())


def test_predict_prints_the_summaries_and_writes_the_files(tmp_path):
    result = dpkit(
        "predict", "--hardware", "2x8xA100-IB-HDR", "--devices", "16", "--batch", "512",
        "--model", "cnn", "--strategy", "ddp", "--out", str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("PREDICTED by dpkit's cost model, not measured: 2x8xA100-IB-HDR")
    assert "phase" in out and "allreduce" in out and "bytes held" in out
    assert "predicted:15 (A100, node 1)" in out
    assert "predicted step time:" in out
    chrome = json.loads((tmp_path / "trace.json").read_text())
    tracks = [e for e in chrome["traceEvents"] if e["name"] == "thread_name"]
    assert len(tracks) == 16
    process = next(e for e in chrome["traceEvents"] if e["name"] == "process_name")
    assert "predicted" in process["args"]["name"]
    assert (tmp_path / "timeline.png").stat().st_size > 10_000
    assert (tmp_path / "memory.png").stat().st_size > 10_000


def test_unknown_hardware_is_a_clear_error():
    result = dpkit("predict", "--hardware", "my-laptop-gpu")
    assert result.returncode == 2
    assert "is not a preset" in result.stderr and "8xA100-SXM-NVLink" in result.stderr
