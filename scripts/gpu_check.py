"""The GPU check in one run, on a machine with one CUDA GPU and no network, in under 5 minutes.

    bash scripts/gpu_wheels.sh            # first, on a machine with network: build/gpu_wheels/
    python scripts/gpu_check.py           # on the GPU machine, with build/gpu_wheels carried
    OUT=/tmp/check python scripts/gpu_check.py --budget 240 --skip tests_cpu
    .venv/bin/python scripts/gpu_check.py --rehearse --skip tests_cpu    # every stage, on CPU

Stages, each in its own process with its own time limit, so one that fails or hangs (it is
killed with its process group) never stops the next; the whole run keeps to ``--budget``:

    environment  Python, torch, CUDA, the GPU; ``python -m dpkit devices``; ``nvidia-smi``
    tests_gpu    pytest -m gpu over every test file with gpu-marked tests
    benchmark    benchmarks/gpu_step.py: dpkit on 1, 2, 4, 8 lanes vs the plain module vs
                 torch.nn.DataParallel; the trace's overhead on CUDA; the lanes' overlap
    probe        scripts/gpu_probe.py: suspected CUDA-stream bugs, OK or CONFIRMED each
    demo         ``python -m dpkit demo``, a smoke test
    tests_cpu    the fast CPU suite, with whatever time is left

Nothing is installed. dpkit runs from this tree (on PYTHONPATH); pytest and hypothesis come
from the wheels in ``build/gpu_wheels`` (unpacked into a temporary folder, placed on the path
after the machine's own packages, so those win where present) or from the machine itself;
without either the test stages are skipped and say why. Test files whose imports are missing
(matplotlib, nbformat, ...) are left out of the CPU suite and listed.

Writes ``$OUT/gpu_check.json`` (everything), ``$OUT/summary.txt`` (what it prints at the
end) and ``$OUT/logs/<stage>.log``; OUT defaults to build/gpu_check. Without CUDA it prints
"no GPU: ...", writes the JSON with ``"gpu": false`` and exits 0 at once. Exit status 1 when
a stage failed or ran out of time.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
WHEELS = REPO / "build" / "gpu_wheels"
CPU_SUITE_MARKERS = "not gpu and not browser and not notebooks and not slow"
MIN_CPU_SUITE_S = 30  # below this the CPU suite is skipped rather than cut short


@dataclass(frozen=True)
class Stage:
    name: str
    what: str
    cap_s: float  # at most this long, and never past the run's budget


STAGES = (
    Stage("environment", "versions, the GPU, `python -m dpkit devices`, nvidia-smi", 45),
    Stage("tests_gpu", "pytest -m gpu on the files with gpu-marked tests", 100),
    Stage("benchmark", "benchmarks/gpu_step.py: step times, trace overhead, lane overlap", 90),
    Stage("probe", "scripts/gpu_probe.py: suspected CUDA-stream bugs (OK/CONFIRMED)", 60),
    Stage("demo", "python -m dpkit demo (smoke test)", 45),
    Stage("tests_cpu", f'pytest -m "{CPU_SUITE_MARKERS}" with the time left', 1e9),
)

# Prints the environment as JSON on its last line; run in a child so a CUDA hang is killable.
ENVIRONMENT_PROBE = r"""
import importlib.util, json, platform, sys
found = {"python": platform.python_version(), "executable": sys.executable,
         "platform": platform.platform()}
import torch
found.update(torch=torch.__version__, cuda_build=torch.version.cuda,
             cuda_available=torch.cuda.is_available(), device_count=torch.cuda.device_count())
if found["cuda_available"]:
    found["gpus"] = [{"name": torch.cuda.get_device_name(i),
                      "capability": ".".join(map(str, torch.cuda.get_device_capability(i))),
                      "memory_gib": round(torch.cuda.get_device_properties(i).total_memory
                                          / 2**30, 1)} for i in range(found["device_count"])]
    found["cudnn"] = torch.backends.cudnn.version()
for name in ("numpy", "matplotlib", "pytest", "hypothesis", "pandas"):
    found[f"has_{name}"] = importlib.util.find_spec(name) is not None
print(json.dumps(found))
"""

# Runs pytest with the carried wheels *after* the machine's own packages on the path.
PYTEST_BOOT = (
    "import sys; extra = sys.argv[1]; sys.path.extend([extra] if extra else []); "
    "import pytest; sys.exit(pytest.main(sys.argv[2:]))"
)


# -- running a stage ----------------------------------------------------------------------


def run_logged(argv: list[str], log: Path, timeout: float, env: dict[str, str]) -> dict[str, Any]:
    """Run ``argv`` in its own process group, output to ``log``; kill the group on timeout."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log, "ab") as handle:
        handle.write(f"$ {' '.join(argv)}\n".encode())
        handle.flush()
        try:
            process = subprocess.Popen(
                argv, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        except OSError as error:
            return {"status": "failed", "returncode": None, "seconds": 0.0, "error": str(error)}
        try:
            returncode = process.wait(timeout=max(timeout, 1))
            status = "ok" if returncode == 0 else "failed"
        except subprocess.TimeoutExpired:
            kill_group(process)
            returncode, status = process.returncode, "timeout"
    return {"status": status, "returncode": returncode, "seconds": time.monotonic() - started}


def kill_group(process: subprocess.Popen) -> None:
    """Stop the stage's process group, then anything it started in a session of its own
    (dpkit's grader runs pytest that way), found through /proc before the group goes."""
    strays = descendants(process.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=5)
            break
        except subprocess.TimeoutExpired:
            continue
    for pid in strays:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc; none elsewhere)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def tail(path: Path, lines: int = 12) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# -- test tools, carried or installed -----------------------------------------------------


def wheel_fits(filename: str) -> bool:
    """Whether this interpreter can use a wheel: pure Python, or CPython abi3/cpXY on this
    Linux machine (hypothesis is compiled since 6.15x)."""
    parts = filename[: -len(".whl")].split("-")
    if len(parts) < 5:
        return False
    pythons, abis, platforms = (part.split(".") for part in parts[-3:])
    minor = sys.version_info.minor
    if "any" in platforms:
        return any(p in ("py3", f"py3{minor}") for p in pythons)  # py2.py3: ["py2", "py3"]
    machine = os.uname().machine if hasattr(os, "uname") else ""
    if not sys.platform.startswith("linux") or sys.implementation.name != "cpython":
        return False
    if not any("linux" in p and p.endswith(machine) and "musl" not in p for p in platforms):
        return False
    if "abi3" in abis:
        return any(p.startswith("cp3") and int(p[3:]) <= minor for p in pythons)
    return f"cp3{minor}" in pythons and f"cp3{minor}" in abis


def unpack_wheels(wheels: Path, into: Path) -> dict[str, Any]:
    """Unpack every usable wheel in ``wheels`` into ``into`` (a wheel is a zip of a
    site-packages fragment); report which were used and which left out."""
    found: dict[str, Any] = {"folder": str(wheels), "used": [], "left_out": []}
    for wheel in sorted(wheels.glob("*.whl")):
        if wheel_fits(wheel.name):
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(into)
            found["used"].append(wheel.name)
        else:
            found["left_out"].append(wheel.name)
    return found


def test_tools(site: Path, env: dict[str, str], wheels: Path) -> dict[str, Any]:
    """pytest and hypothesis for the test stages: from the carried wheels (after the
    machine's own packages on the path), else the machine's; which, and their versions."""
    tools: dict[str, Any] = {"extra_path": ""}
    if wheels.is_dir() and any(wheels.glob("*.whl")):
        tools["wheels"] = unpack_wheels(wheels, site)
        tools["extra_path"] = str(site)
    else:
        tools["wheels"] = f"none in {wheels} (bash scripts/gpu_wheels.sh where there is network)"
    probe = (
        "import sys; sys.path.extend([sys.argv[1]] if sys.argv[1] else []); import json\n"
        "found = {}\n"
        "for name in ('pytest', 'hypothesis'):\n"
        "    try:\n"
        "        module = __import__(name)\n"
        "        found[name] = f'{module.__version__} from {module.__file__}'\n"
        "    except Exception as error:\n"
        "        found[name] = None; found[name + '_error'] = repr(error)\n"
        "print(json.dumps(found))"
    )
    try:
        result = subprocess.run(
            [sys.executable, "-c", probe, tools["extra_path"]],
            capture_output=True, text=True, timeout=60, env=env, cwd=REPO,
        )  # fmt: skip
        tools.update(json.loads(result.stdout.strip().splitlines()[-1]))
    except (subprocess.TimeoutExpired, ValueError, IndexError) as error:
        tools["pytest"], tools["pytest_error"] = None, repr(error)
    return tools


# -- which test files ---------------------------------------------------------------------


def test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if "browser" not in p.parts)


def gpu_test_files() -> list[Path]:
    return [p for p in test_files() if "mark.gpu" in p.read_text(errors="replace")]


def missing_imports(path: Path, extra_path: str) -> list[str]:
    """Top-level modules a test file imports at module level that cannot be found here."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    names.discard("__future__")
    saved = list(sys.path)
    sys.path[:0] = [str(path.parent), str(REPO)]
    sys.path.extend([extra_path] if extra_path else [])
    try:
        return sorted(name for name in names if importlib.util.find_spec(name) is None)
    finally:
        sys.path[:] = saved


# A line of pytest -v: "tests/test_x.py::test_y[a b] PASSED     [ 12%]" (SKIPPED (reason) too).
RESULT_LINE = re.compile(r"::.*?\s(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b.*\[\s*\d+%\]\s*$")


def test_counts(junit: Path, log: Path) -> dict[str, Any]:
    """passed/failed/errors/skipped from pytest's JUnit XML, or from its -v log when the
    XML is missing (the stage was killed)."""
    counts: Counter[str] = Counter()
    failures: list[str] = []
    try:
        root = ElementTree.parse(junit).getroot()
    except (OSError, ElementTree.ParseError):
        text = log.read_text(errors="replace") if log.exists() else ""
        for match in filter(None, map(RESULT_LINE.search, text.splitlines())):
            outcome = match.group(1).lower()
            counts[{"error": "errors"}.get(outcome, outcome)] += 1
        return {**counts, "source": "log (no JUnit XML: the stage was cut short)"}
    for case in root.iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "errors"}.get(child.tag, child.tag)
                if child.tag != "skipped":
                    message = (child.get("message") or "").splitlines()
                    name = f"{case.get('classname')}::{case.get('name')}"
                    failures.append(f"{name}: {(message or [''])[0][:200]}")
        counts[outcome] += 1
    return {**counts, "failures": failures[:30], "source": str(junit.name)}


# -- the run ------------------------------------------------------------------------------


class Check:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.out: Path = args.out
        self.logs = self.out / "logs"
        self.started = time.monotonic()
        self.deadline = self.started + args.budget
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        self.env.setdefault("MPLBACKEND", "Agg")
        self.env["PYTHONUNBUFFERED"] = "1"
        self.report: dict[str, Any] = {
            "gpu": False,
            "rehearsal": args.rehearse,
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "budget_s": args.budget,
            "command": [sys.executable, *sys.argv],
            "stages": {},
        }
        self.tools: dict[str, Any] = {}

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        self.report["elapsed_s"] = round(time.monotonic() - self.started, 1)
        self.out.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.report, indent=2, default=str)
        (self.out / "gpu_check.json").write_text(text + "\n")

    def stage(
        self, stage: Stage, commands: list[list[str]], env: dict | None = None, more: bool = False
    ) -> dict:
        """Run a stage's commands one after another within its time; record and save. With
        ``more``, add to the stage's record and log (the environment runs in two parts)."""
        log = self.logs / f"{stage.name}.log"
        earlier = self.report["stages"].get(stage.name) if more else None
        if earlier is None:
            log.unlink(missing_ok=True)
        record: dict[str, Any] = earlier or {"what": stage.what, "status": "ok", "seconds": 0}
        record["log"] = str(log.relative_to(self.out))
        limit = min(stage.cap_s - record["seconds"], self.left())
        started = time.monotonic()
        heading = "(continued)" if earlier else stage.what
        print(f"-- {stage.name}: {heading} (up to {limit:.0f} s)", flush=True)
        for argv in commands:
            result = run_logged(argv, log, limit - (time.monotonic() - started), env or self.env)
            result["command"] = " ".join(argv[:3] if "-c" in argv[1:2] else argv)
            record["returncode"] = result["returncode"]
            if result["status"] != "ok":
                record.update(status=result["status"], failed_command=result["command"])
                break
        record["seconds"] = round(record["seconds"] + time.monotonic() - started, 1)
        if record["status"] != "ok":
            record["tail"] = tail(log)
            print("\n".join(f"   | {line}" for line in record["tail"]), flush=True)
        print(f"   {stage.name}: {record['status']} in {record['seconds']} s", flush=True)
        self.report["stages"][stage.name] = record
        self.save()
        return record

    def skip(self, stage: Stage, reason: str) -> None:
        print(f"-- {stage.name}: skipped, {reason}", flush=True)
        self.report["stages"][stage.name] = {"what": stage.what, "status": "skipped",
                                             "reason": reason}  # fmt: skip
        self.save()

    # -- the stages -------------------------------------------------------------------------

    def environment(self, stage: Stage) -> dict[str, Any] | None:
        """Python, torch and CUDA as JSON (the last line the child prints); None if torch
        could not be imported or inspected."""
        self.stage(stage, [[sys.executable, "-c", ENVIRONMENT_PROBE]])
        log = self.logs / f"{stage.name}.log"
        for line in reversed(log.read_text(errors="replace").splitlines() if log.exists() else []):
            if line.startswith("{"):
                return json.loads(line)
        return None

    def nvidia_smi(self) -> None:
        smi = shutil.which("nvidia-smi")
        if smi is None:
            self.report["environment"]["nvidia_smi"] = "not found"
            return
        query = "name,memory.total,driver_version,clocks.max.sm,power.limit,temperature.gpu"
        try:
            result = subprocess.run(
                [smi, f"--query-gpu={query}", "--format=csv"],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            self.report["environment"]["nvidia_smi"] = result.stdout.strip().splitlines()
        except (OSError, subprocess.TimeoutExpired) as error:
            self.report["environment"]["nvidia_smi"] = repr(error)

    def pytest_stage(self, stage: Stage, pytest_args: list[str]) -> None:
        if not self.tools.get("pytest"):
            self.skip(stage, f"no pytest: {self.tools.get('wheels')}")
            return
        junit = self.out / f"{stage.name}.xml"
        junit.unlink(missing_ok=True)
        argv = [sys.executable, "-c", PYTEST_BOOT, self.tools["extra_path"]]
        argv += ["-p", "no:cacheprovider", "-v", f"--junitxml={junit}", *pytest_args]
        self.stage(stage, [argv])
        counts = test_counts(junit, self.logs / f"{stage.name}.log")
        self.report[stage.name] = counts
        self.report["stages"][stage.name]["counts"] = {
            k: v for k, v in counts.items() if isinstance(v, int)
        }
        self.save()

    def tests_gpu(self, stage: Stage) -> None:
        files = [str(p.relative_to(REPO)) for p in gpu_test_files()]
        self.pytest_stage(stage, ["-m", "gpu", *files])

    def tests_cpu(self, stage: Stage) -> None:
        if self.left() < MIN_CPU_SUITE_S:
            self.skip(stage, f"{self.left():.0f} s left of the budget")
            return
        if not self.tools.get("pytest"):
            self.skip(stage, f"no pytest: {self.tools.get('wheels')}")
            return
        ignored = {}
        for path in test_files():
            missing = missing_imports(path, self.tools["extra_path"])
            if missing:
                ignored[str(path.relative_to(REPO))] = missing
        self.report["tests_cpu_left_out"] = ignored
        args = ["-m", CPU_SUITE_MARKERS, "--ignore=tests/browser"]
        args += [f"--ignore={name}" for name in ignored] + ["tests"]
        self.pytest_stage(stage, args)

    def benchmark(self, stage: Stage) -> None:
        path = self.out / "benchmark.json"
        path.unlink(missing_ok=True)
        # The benchmark sizes its rounds to its budget; leave room for CUDA start-up.
        budget = max(10.0, min(stage.cap_s, self.left()) - 25)
        argv = [sys.executable, "-m", "benchmarks.gpu_step", "--out", str(path)]
        argv += ["--budget", f"{budget:.0f}"]
        if self.args.rehearse:
            argv += ["--device", "cpu", "--quick"]
        self.stage(stage, [argv])
        self.report["benchmark"] = read_json(path)  # what it wrote, even if cut short
        self.save()

    def probe(self, stage: Stage) -> None:
        env = {**self.env, "OUT": str(self.out / "probe")}
        self.stage(stage, [[sys.executable, "scripts/gpu_probe.py"]], env)
        self.report["probe"] = read_json(self.out / "probe" / "probe.json")
        self.save()

    def demo(self, stage: Stage) -> None:
        out = self.out / "demo"
        out.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "dpkit", "demo", "--steps", "2", "--out", str(out)]
        record = self.stage(stage, [argv])
        lines = tail(self.logs / f"{stage.name}.log", 200)
        self.report["demo"] = {
            "devices_used": next((ln for ln in lines if ln.startswith("devices used")), None),
            "files": sorted(p.name for p in out.iterdir()),
            "status": record["status"],
        }
        self.save()

    # -- the whole run ----------------------------------------------------------------------

    def run(self) -> int:
        stages = {stage.name: stage for stage in STAGES}
        environment = self.environment(stages["environment"])
        if environment is None:
            print("gpu_check: torch could not be imported or inspected; see the log above")
            self.report["summary"] = ["torch could not be imported or inspected"]
            self.save()
            return 1
        self.report["environment"] = environment
        self.report["gpu"] = bool(environment.get("cuda_available"))
        if not self.report["gpu"] and not self.args.rehearse:
            return self.no_gpu(environment)
        if self.report["gpu"]:
            self.nvidia_smi()
        devices = [sys.executable, "-m", "dpkit", "devices"]
        self.stage(stages["environment"], [devices], more=True)
        with tempfile.TemporaryDirectory(prefix="dpkit-gpu-check-") as site:
            self.tools = test_tools(Path(site), self.env, self.args.wheels)
            self.report["test_tools"] = self.tools
            self.save()
            for name in ("tests_gpu", "benchmark", "probe", "demo", "tests_cpu"):
                stage = stages[name]
                if name in self.args.skip:
                    self.skip(stage, "--skip")
                elif self.left() < 10:
                    self.skip(stage, f"{max(self.left(), 0):.0f} s left of the budget")
                else:
                    getattr(self, name)(stage)
        lines = summary_lines(self.report)
        self.report["summary"] = lines
        self.save()
        (self.out / "summary.txt").write_text("\n".join(lines) + "\n")
        print("\n" + "\n".join(lines))
        print(f"\nwrote {self.out / 'gpu_check.json'} and summary.txt")
        failed = [
            n for n, s in self.report["stages"].items() if s["status"] in ("failed", "timeout")
        ]
        return 1 if failed else 0

    def no_gpu(self, environment: dict[str, Any]) -> int:
        lines = [
            f"no GPU: torch {environment.get('torch')} (Python {environment.get('python')}) "
            "sees no CUDA device, so nothing was run.",
            f"On a machine with CUDA this runs, within {self.args.budget:.0f} s:",
            *(f"  {stage.name:<12} {stage.what}" for stage in STAGES),
            "Rehearse every stage on this CPU with --rehearse (numbers meaningless).",
        ]
        self.report["summary"] = lines
        self.report["would_run"] = {stage.name: stage.what for stage in STAGES}
        self.save()
        (self.out / "summary.txt").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
        print(f"wrote {self.out / 'gpu_check.json'}")
        return 0


# -- the summary --------------------------------------------------------------------------


def summary_lines(report: dict[str, Any]) -> list[str]:
    environment = report.get("environment") or {}
    gpus = environment.get("gpus") or [{"name": "no GPU (rehearsal on CPU)"}]
    stages = report["stages"]
    good = sum(s["status"] == "ok" for s in stages.values())
    lines = [
        f"gpu_check on {gpus[0]['name']}: torch {environment.get('torch')}, CUDA "
        f"{environment.get('cuda_build')}, Python {environment.get('python')}; "
        f"{good} of {len(stages)} stages ok in {report.get('elapsed_s', 0):.0f} s",
    ]
    for name, stage in stages.items():
        line = f"{name:<12} {stage['status']:<8} {stage.get('seconds', 0):6.1f} s"
        if "counts" in stage:
            line += "  " + ", ".join(f"{v} {k}" for k, v in sorted(stage["counts"].items()))
        if stage["status"] == "skipped":
            line += f"  {stage.get('reason', '')}"
        lines.append(line)
        if name == "benchmark" and report.get("benchmark"):
            lines += benchmark_lines(report["benchmark"])
        if name == "probe" and report.get("probe"):
            by_status: dict[str, list[str]] = {}
            for check, row in report["probe"].items():
                by_status.setdefault(row.get("status", "?"), []).append(check)
            lines += [f"  {status}: {', '.join(names)}" for status, names in by_status.items()]
        if name == "tests_gpu" and report.get("tests_gpu", {}).get("failures"):
            lines += [f"  FAILED {f}" for f in report["tests_gpu"]["failures"][:10]]
        if name == "demo" and report.get("demo", {}).get("devices_used"):
            lines.append(f"  {report['demo']['devices_used']}")
        if stage["status"] in ("failed", "timeout") and stage.get("tail"):
            lines.append(f"  last line: {stage['tail'][-1][:150]}")
    return lines


def benchmark_lines(bench: dict[str, Any]) -> list[str]:
    lines = []
    for size, found in (bench.get("step_times") or {}).items():
        if not isinstance(found, dict) or "step_s" not in found:
            continue
        batch, width = bench["sizes"][size]
        medians = {name: row["median"] * 1e3 for name, row in found["step_s"].items()}
        shown = ", ".join(f"{name} {ms:.2f}" for name, ms in medians.items())
        lines.append(f"  step {size} ({batch} x {width}), median ms: {shown}")
        ratios = found["ratios_of_medians"]
        lanes = [f"{n}: {ratios[f'dpkit_lanes_{n}/plain']:.2f}" for n in (1, 2, 4, 8)
                 if f"dpkit_lanes_{n}/plain" in ratios]  # fmt: skip
        if lanes:
            lines.append(f"    lanes / plain module: {', '.join(lanes)}")
        goal = found.get("goal")
        if goal:
            verdict = "met" if goal["met"] else "NOT met"
            lines.append(f"    {goal['ratio']} {goal['value']:.3f} (goal <= {goal['limit']}: "
                         f"{verdict})")  # fmt: skip
        for name, error in found.get("errors", {}).items():
            lines.append(f"    {name} FAILED: {error[:120]}")
    overhead = bench.get("trace_overhead") or {}
    shown = [
        f"{key} {row['on/off_of_medians']:.3f} (paired {row['on/off_paired']:.3f})"
        for key, row in overhead.items()
        if isinstance(row, dict) and "on/off_paired" in row
    ]
    if shown:
        lines.append(f"  trace on/off: {'; '.join(shown)}")
    overlap = bench.get("apply_overlap") or {}
    for name, rows in overlap.items():
        if not isinstance(rows, dict):
            continue
        shown = []
        for lanes, row in rows.items():
            if isinstance(row, dict) and "overlap" in row:
                wall = row.get("stalls_at_once")  # the stall's own measure, from wall time
                extra = f" (wall {wall:.2f})" if wall is not None else ""
                shown.append(f"{lanes.split('_')[1]}: {row['overlap']:.2f}{extra}")
        if shown:
            lines.append(
                f"  apply overlap, {name} (sum/union; n = all at once): {', '.join(shown)}"
            )
    for section, found in bench.items():
        if isinstance(found, dict) and "error" in found:
            lines.append(f"  {section} FAILED: {found['error'][:150]}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--out", type=Path, default=Path(os.environ.get("OUT") or REPO / "build" / "gpu_check"),
        help="folder for gpu_check.json, summary.txt and logs/ (default $OUT or build/gpu_check)",
    )  # fmt: skip
    parser.add_argument("--budget", type=float, default=270, help="seconds for all (270)")
    parser.add_argument("--wheels", type=Path, default=WHEELS, help=f"(default {WHEELS})")
    parser.add_argument("--skip", action="append", default=[], metavar="STAGE",
                        choices=[s.name for s in STAGES[1:]], help="leave a stage out")  # fmt: skip
    parser.add_argument(
        "--rehearse", action="store_true",
        help="without a GPU, run every stage anyway (CPU lanes, tiny sizes) to try the script",
    )  # fmt: skip
    args = parser.parse_args(argv)
    args.out = args.out.resolve()
    return Check(args).run()


if __name__ == "__main__":
    sys.exit(main())
