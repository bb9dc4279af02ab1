"""scripts/gpu_check.py, the one GPU run, as far as a machine without a GPU can check it:
without CUDA it says "no GPU" and exits 0 at once; a stage rehearsed on CPU lanes passes, and
fails with exit status 1 when an expectation is planted that it cannot meet; a stage that no
longer fits in the budget is a SKIP with its reason; at most 6 files come back (the device
machine returns 8); and, marked slow, the whole rehearsal passes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from tests.scripts import REPO, load

gpu_check = load("scripts/gpu_check.py")
gpu_step = load("benchmarks/gpu_step.py")

MOST_FILES = 6  # of the device machine's 8: room for what a caller adds


def _run_check(out: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OUT": str(out)}  # no GPU, even on one
    command = [sys.executable, str(REPO / "scripts" / "gpu_check.py"), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


def _written(out: Path) -> tuple[dict, list[str]]:
    files = sorted(str(path.relative_to(out)) for path in out.rglob("*") if path.is_file())
    assert len(files) <= MOST_FILES, files
    return json.loads((out / "gpu_check.json").read_text()), files


def test_without_a_gpu_it_says_so_and_exits_0_at_once(tmp_path):
    started = time.monotonic()
    result = _run_check(tmp_path, timeout=60)
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("no GPU: "), result.stdout
    report, files = _written(tmp_path)
    assert files == ["gpu_check.json", "summary.txt"]
    assert report["gpu"] is False
    assert list(report["would_run"]) == [stage.name for stage in gpu_check.STAGES]
    assert elapsed < 20, f"the run without a GPU took {elapsed:.1f} s"


def test_a_planted_impossible_limit_fails_its_stage_and_the_run(tmp_path):
    """The overlap stage on 4 CPU lanes (about 4 s): four stalls at once take about one
    stall's time, which passes 1.3x (the slow rehearsal below) and must fail 0.5x."""
    argv = ["--rehearse", "--only", "overlap", "--limit", "stall_ratio=0.5", "--out", str(tmp_path)]
    assert gpu_check.main(argv) == 1  # the stage in a process of its own, the rest in this one
    report, files = _written(tmp_path)
    assert files == ["gpu_check.json", "logs.tar.gz", "summary.txt"]
    (found,) = report["stages"]["overlap"]["verdicts"]
    assert found["status"] == "FAIL" and found["claim"].endswith("<= 0.5"), found
    assert report["stages"]["overlap"]["status"] == "FAIL"
    assert f"FAIL {found['claim']}" in (tmp_path / "summary.txt").read_text()
    with tarfile.open(tmp_path / "logs.tar.gz") as archive:
        assert "gpu_check/logs/overlap.log" in archive.getnames()


def test_a_stage_past_the_budget_is_skipped_with_the_reason_and_exits_0(tmp_path):
    argv = ["--rehearse", "--only", "calibrate", "--budget", "1", "--out", str(tmp_path)]
    assert gpu_check.main(argv) == 0  # no stage process starts: in this one
    report, _ = _written(tmp_path)
    (found,) = report["stages"]["calibrate"]["verdicts"]
    assert found["status"] == "SKIP" and "s left of 1" in found["measured"], found


def test_an_unknown_limit_is_refused_with_the_names_of_the_limits():
    with pytest.raises(SystemExit, match="stall_ratio"):
        gpu_check.parse_limits(["stall_rate=2"])


def test_test_counts_and_skip_reasons_come_from_junit_xml(tmp_path):
    junit = tmp_path / "run.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_gpu" name="test_a"/>'
        '<testcase classname="tests.test_gpu" name="test_b"><failure message="boom&#10;more"/>'
        "</testcase>"
        '<testcase classname="tests.test_gpu" name="test_c"><skipped message="no"/></testcase>'
        '<testcase classname="tests.test_gpu" name="test_d"><skipped message="no"/></testcase>'
        "</testsuite></testsuites>"
    )
    counts, failures, skips = gpu_check.junit_counts(junit)
    assert dict(counts) == {"passed": 1, "failed": 1, "errors": 0, "skipped": 2}
    assert failures == ["test_b: boom"]
    assert dict(skips) == {"no": 2}


def test_overlap_is_summed_durations_over_their_union():
    assert gpu_step.union_length([(0, 2), (1, 3), (5, 6)]) == 4
    assert gpu_step.overlap_factor([(0, 1), (1, 2), (2, 3)]) == 1.0  # one after another
    assert gpu_step.overlap_factor([(0, 1)] * 4) == 4.0  # all four at once
    assert gpu_step.overlap_factor([(0, 2), (1, 3)]) == pytest.approx(4 / 3)


# Only what a CPU cannot show is skipped in the rehearsal, each with its reason.
CPU_SKIPS = {
    ("clocks", "host_clock.now(lanes)"),
    ("tests_gpu", "pytest -m gpu"),
    ("speed", "large MLP step ("),
    ("speed", "small MLP step ("),
    ("streams", "control: "),
}


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("DPKIT_GPU_REHEARSAL") != "1",
    reason="2-4 minutes, too long for make test's budget: DPKIT_GPU_REHEARSAL=1 runs it, as "
    "does `.venv/bin/python scripts/gpu_check.py --rehearse`",
)
def test_the_rehearsal_passes_every_stage_on_cpu_lanes(tmp_path):
    """Every stage on CPU lanes, standing in for GPU lanes: 2 to 4 minutes on 2 busy cores
    (load 4 to 7), since each of the 13 stages starts torch in a process of its own, and
    calibrate (26-55 s), the explorers (notebook 07's starts 2 DDP ranks) and DDP take long."""
    result = _run_check(tmp_path, "--rehearse", timeout=700)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report, files = _written(tmp_path)
    assert files == ["gpu_check.json", "logs.tar.gz", "summary.txt"]
    stages = report["stages"]
    assert list(stages) == [stage.name for stage in gpu_check.STAGES]
    lines = [(name, line) for name, found in stages.items() for line in found["verdicts"]]
    assert {name for name, _ in lines} == set(stages)
    assert all(line["status"] in ("PASS", "SKIP") and line["measured"] for _, line in lines)
    skipped = [(name, line["claim"]) for name, line in lines if line["status"] == "SKIP"]
    matched = {(stage, start) for stage, start in CPU_SKIPS for name, claim in skipped
               if name == stage and claim.startswith(start)}  # fmt: skip
    assert matched == CPU_SKIPS and len(skipped) == len(CPU_SKIPS), skipped
    with tarfile.open(tmp_path / "logs.tar.gz") as archive:
        names = set(archive.getnames())
    assert {f"gpu_check/logs/{name}.log" for name in stages} <= names
    assert {"gpu_check/ddp/trace.json", "gpu_check/tests_gpu.xml"} <= names
