"""scripts/gpu_check.py, the one GPU run, as far as a machine without a GPU can check it:
the dry run says "no GPU" and exits cleanly at once, and the pieces that read pytest's
results, pick wheels and measure overlap do what the GPU run relies on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.scripts import REPO, load

gpu_check = load("scripts/gpu_check.py")
gpu_step = load("benchmarks/gpu_step.py")


def _run_check(out: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OUT": str(out)}  # no GPU, even on one
    command = [sys.executable, str(REPO / "scripts" / "gpu_check.py"), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


def test_dry_run_without_a_gpu_says_so_writes_the_json_and_exits_cleanly(tmp_path):
    started = time.monotonic()
    result = _run_check(tmp_path, timeout=60)
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stdout + result.stderr
    assert any(line.startswith("no GPU: ") for line in result.stdout.splitlines()), result.stdout
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["gpu"] is False
    assert report["environment"]["cuda_available"] is False
    assert set(report["would_run"]) == {stage.name for stage in gpu_check.STAGES}
    assert (tmp_path / "summary.txt").read_text().startswith("no GPU: ")
    assert elapsed < 20, f"the dry run took {elapsed:.1f} s"


def test_test_counts_come_from_junit_xml_or_from_a_cut_short_log(tmp_path):
    junit = tmp_path / "run.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_gpu" name="test_a"/>'
        '<testcase classname="tests.test_gpu" name="test_b"><failure message="boom&#10;more"/>'
        "</testcase>"
        '<testcase classname="tests.test_gpu" name="test_c"><skipped message="no"/></testcase>'
        "</testsuite></testsuites>"
    )
    counts = gpu_check.test_counts(junit, tmp_path / "absent.log")
    assert (counts["passed"], counts["failed"], counts["skipped"]) == (1, 1, 1)
    assert counts["failures"] == ["tests.test_gpu::test_b: boom"]

    log = tmp_path / "run.log"
    log.write_text(
        "tests/test_gpu.py::test_a[mlp with dropout] PASSED    [ 10%]\n"
        "tests/test_gpu.py::test_b SKIPPED (needs a CUDA GPU)  [ 20%]\n"
        "tests/test_gpu.py::test_c FAILED                      [ 30%]\n"
        "FAILED tests/test_gpu.py::test_c - AssertionError: PASSED\n"
    )
    counts = gpu_check.test_counts(tmp_path / "absent.xml", log)
    assert (counts["passed"], counts["skipped"], counts["failed"]) == (1, 1, 1)
    assert "cut short" in counts["source"]


def test_missing_imports_names_the_modules_a_test_file_cannot_import(tmp_path):
    test_file = tmp_path / "test_uses_plots.py"
    test_file.write_text(
        "from __future__ import annotations\nimport os, torch\n"
        "from no_such_module_here.sub import thing\n"
        "def test_x():\n    import another_missing_one\n"  # inside a test: not collection
    )
    assert gpu_check.missing_imports(test_file, "") == ["no_such_module_here"]


def test_wheels_are_picked_for_this_interpreter():
    minor = sys.version_info.minor
    assert gpu_check.wheel_fits("pytest-9.2.0-py3-none-any.whl")
    assert gpu_check.wheel_fits("sortedcontainers-2.4.0-py2.py3-none-any.whl")
    assert not gpu_check.wheel_fits("old-1.0-py2-none-any.whl")
    assert not gpu_check.wheel_fits("hypothesis-6.0-cp311-abi3-win_amd64.whl")
    assert not gpu_check.wheel_fits(f"x-1.0-cp3{minor + 1}-abi3-manylinux2014_x86_64.whl")
    native = f"x-1.0-cp3{minor}-cp3{minor}-manylinux_2_17_{os.uname().machine}.whl"
    assert gpu_check.wheel_fits(native) == sys.platform.startswith("linux")


def test_overlap_is_summed_durations_over_their_union():
    assert gpu_step.union_length([(0, 2), (1, 3), (5, 6)]) == 4
    assert gpu_step.overlap_factor([(0, 1), (1, 2), (2, 3)]) == 1.0  # one after another
    assert gpu_step.overlap_factor([(0, 1)] * 4) == 4.0  # all four at once
    assert gpu_step.overlap_factor([(0, 2), (1, 3)]) == pytest.approx(4 / 3)


@pytest.mark.slow
def test_rehearsal_runs_every_stage_on_cpu_and_reports_each(tmp_path):
    """--rehearse: the GPU run's stages on CPU lanes with tiny sizes (about 15 s)."""
    result = _run_check(tmp_path, "--rehearse", "--skip", "tests_cpu", timeout=240)
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    stages = report["stages"]
    assert list(stages) == [stage.name for stage in gpu_check.STAGES], result.stdout
    assert stages["tests_cpu"]["status"] == "skipped"
    # Without CUDA every gpu test skips; the run still counts them.
    assert report["tests_gpu"]["skipped"] > 0 and "failed" not in report["tests_gpu"]
    for name in ("environment", "tests_gpu", "benchmark", "probe", "demo"):
        assert stages[name]["status"] == "ok", (name, stages[name].get("tail"))
    step_times = report["benchmark"]["step_times"]["small"]["step_s"]
    assert {"plain", "torch_dp", "dpkit_lanes_1", "dpkit_lanes_8"} <= set(step_times)
    assert report["benchmark"]["apply_overlap"]["stall"]["lanes_4"]["overlap"] > 1
    assert result.returncode == 0
    assert (tmp_path / "summary.txt").read_text() in result.stdout
