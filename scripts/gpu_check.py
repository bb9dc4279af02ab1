"""The GPU check: one run on a machine with a CUDA GPU that says what holds there. Each stage
states its expectations and ends each in PASS, FAIL or SKIP (with the reason); under 5 minutes.

    python3 scripts/gpu_check.py                          # the GPU machine; writes to $OUT
    .venv/bin/python scripts/gpu_check.py --rehearse      # every stage here, on CPU lanes
    python3 scripts/gpu_check.py --only overlap --limit stall_ratio=1.2

The stages are the functions under ``@stage`` below, in the order they run, each with the
line it establishes; the numbers their expectations are held to are :data:`LIMITS`
(``--limit NAME=VALUE`` changes one: a planted impossible limit shows a FAIL). Each stage runs
in a process of its own (this script with ``--stage NAME``) under a time limit, and is killed
with everything it started if it runs over, so a stage that fails or hangs never stops the
next; the whole run keeps to ``--budget`` (270 s; 600 rehearsing), and a stage that no longer
fits is a SKIP.

Nothing is installed or fetched: dpkit runs from this tree, on the machine's own torch, numpy
and matplotlib; the gpu-marked tests need its pytest (a SKIP without). The CPU suite is CI's.
``--rehearse`` runs every stage without a GPU, virtual CPU lanes standing in for GPU lanes
and gloo for NCCL; what only a GPU can show (a launch returning before its work, dpkit on a
real GPU against torch's DataParallel on it) is a SKIP there, with the reason. Without CUDA
and without ``--rehearse`` it prints ``no GPU: ...`` and exits 0 at once.

Writes three files into ``$OUT`` (default build/gpu_check), again after every stage, so a run
cut short leaves what it did: ``summary.txt`` (what it prints at the end), ``gpu_check.json``
(every verdict and number) and ``logs.tar.gz`` (each stage's log, the pytest JUnit XML, the
step-time benchmark's JSON, the DDP and demo traces and figures). Exit status 1 when an
expectation failed, or a stage crashed or ran out of time; else 0.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any
from xml.etree import ElementTree

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # dpkit and benchmarks from this tree, not an installed copy

import torch  # noqa: E402
from torch import nn  # noqa: E402

import dpkit  # noqa: E402
from dpkit import host_clock  # noqa: E402
from dpkit import pipeline as pp  # noqa: E402
from dpkit.device import REAL, VIRTUAL_CPU, VIRTUAL_GPU  # noqa: E402
from dpkit.environment import describe_choice  # noqa: E402
from dpkit.lanes import stream_of  # noqa: E402

STALL_S = 0.02  # a known stall: long against launches and thread hand-offs, short in total
# On CPU lanes (the rehearsal) a thread's start and hand-offs on a busy 2-core machine took
# up to 12 ms: a longer stall keeps the same limits about dpkit rather than about the load,
# and each stage has REHEARSAL_SLOWER times its time (calibrate took 26 to over 60 s there).
REHEARSAL_STALL_S = 0.05
REHEARSAL_SLOWER = 3

# What the expectations are held to; --limit NAME=VALUE changes one.
LIMITS = {
    # largest |difference| over largest |value| per tensor, lanes against one device, in
    # float64: rounding is about 1e-16; a lost row or a missed reduction is off by far more
    "float64_rel": 1e-9,
    # 4 lanes stalling STALL_S each over 1 lane stalling once (wall): ~1 when the lanes run
    # at once, ~4 when one after another
    "stall_ratio": 1.3,
    # a traced apply's duration against the same stall timed alone, relative
    "trace_rel": 0.10,
    # a clock read after a stall reads at least this share of it (it waited for the work)
    "clock_share": 0.9,
    # dpkit on one real GPU over torch's DataParallel on it, median of per-round ratios
    "dp_ratio": 1.05,
    # a pipeline of stalling stages: |measured idle share - GPipe's (p-1)/(m+p-1)|
    "bubble_abs": 0.05,
}


# -- verdicts: the one place an expectation becomes PASS, FAIL or SKIP -----------------------


def verdict(status: str, claim: str, measured: str) -> dict[str, str]:
    return {"status": status, "claim": claim, "measured": measured}


def stage_status(verdicts: list[dict[str, str]]) -> str:
    """FAIL if any verdict failed, PASS if any passed, else SKIP."""
    statuses = {found["status"] for found in verdicts}
    return "FAIL" if "FAIL" in statuses else "PASS" if "PASS" in statuses else "SKIP"


class Verdicts:
    """A stage's verdicts and numbers, printed as they come and saved after each (a stage
    killed for time keeps those it reached)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.found: dict[str, Any] = {"verdicts": [], "info": {}}
        self.save()

    def record(self, status: str, claim: str, measured: str) -> None:
        self.found["verdicts"].append(verdict(status, claim, measured))
        print(f"{status:<4}  {claim}: {measured}", flush=True)
        self.save()

    def check(self, claim: str, ok: bool, measured: str) -> None:
        self.record("PASS" if ok else "FAIL", claim, measured)

    def at_most(self, claim: str, value: float, limit: float) -> None:
        self.check(f"{claim} <= {limit:g}", value <= limit, f"{value:.4g}")  # NaN fails

    def at_least(self, claim: str, value: float, limit: float) -> None:
        self.check(f"{claim} >= {limit:g}", value >= limit, f"{value:.4g}")

    def skip(self, claim: str, reason: str) -> None:
        self.record("SKIP", claim, reason)

    def info(self, key: str, value: Any) -> None:
        self.found["info"][key] = value
        self.save()

    @contextlib.contextmanager
    def guard(self, claim: str) -> Iterator[None]:
        """A FAIL for ``claim`` when the block raises; the stage goes on to its next check."""
        try:
            yield
        except Exception as error:  # noqa: BLE001 - a check reports, never stops the stage
            traceback.print_exc()
            first = (str(error).splitlines() or [""])[0][:300]
            self.record("FAIL", claim, f"raised {type(error).__name__}: {first}")

    def save(self) -> None:
        self.path.write_text(json.dumps(self.found, indent=1, default=str) + "\n")


# -- what the stages run on -----------------------------------------------------------------


class Rig:
    """Lanes on the GPU, or (rehearsal) virtual CPU lanes standing in for them, and a stall
    of known length on either: ``torch.cuda._sleep`` on the current stream, ``time.sleep``
    in a CPU lane's thread."""

    def __init__(self, rehearse: bool, work: Path, limits: dict[str, float]) -> None:
        self.gpu = not rehearse
        self.kind = "cuda" if self.gpu else "cpu"
        self.stall_s = STALL_S if self.gpu else REHEARSAL_STALL_S
        self.stall_ms = f"{self.stall_s * 1e3:g} ms"
        self.work, self.limits = work, limits
        # measured now, in the stage's own thread: measured on a lane's first stall it would
        # synchronise the GPU inside another stage's timing
        self.cycles_per_s = self._sleep_rate() if self.gpu else 0.0

    def lanes(self, n: int) -> list[dpkit.Device]:
        return dpkit.virtual_devices(n, on=self.kind)

    @property
    def home(self) -> torch.device:
        return self.lanes(1)[0].torch_device

    def stall(self, seconds: float | None = None) -> None:
        """Stall for ``seconds`` (default: ``stall_s``)."""
        seconds = self.stall_s if seconds is None else seconds
        if self.gpu:
            torch.cuda._sleep(int(seconds * self.cycles_per_s))
        else:
            time.sleep(seconds)

    def _sleep_rate(self) -> float:
        """torch.cuda._sleep's cycles per second here, the second of two readings (the
        GPU's clock has ramped up by then)."""
        cycles = 20_000_000
        self.alone(lambda: torch.cuda._sleep(cycles))
        return cycles / self.alone(lambda: torch.cuda._sleep(cycles))

    def alone(self, work: Callable[[], Any]) -> float:
        """Seconds ``work`` takes by itself: from CUDA events around it on the current stream
        on a GPU, from the host clock on CPU."""
        if not self.gpu:
            start = time.perf_counter()
            work()
            return time.perf_counter() - start
        torch.cuda.synchronize()
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        work()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3


class Stalled(torch.autograd.Function):
    """The identity, after a stall in forward and another in backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, stall: Callable[[], None]) -> torch.Tensor:
        ctx.stall = stall
        stall()
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.stall()
        return grad.clone(), None


class StallNet(nn.Module):
    """Scales its input by a parameter, stalling ``rig.stall_s`` in forward and backward."""

    def __init__(self, rig: Rig) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))
        self.rig = rig

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return Stalled.apply(x * self.scale, self.rig.stall)


def relative_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| over largest |b|."""
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def median_time(lanes: list[dpkit.Device], work: Callable[[], Any], repeats: int = 5) -> float:
    """Median seconds of ``work`` after an untimed call, on dpkit's host clock (which waits
    for the lanes' GPU)."""
    work()
    times = []
    for _ in range(repeats):
        start = host_clock.now(lanes)
        work()
        times.append(host_clock.now(lanes) - start)
    return statistics.median(times)


def run_logged(command: str, out: Path | None = None) -> subprocess.CompletedProcess:
    """``python -m <command> [--out out]`` from the tree, its output into this stage's log."""
    argv = [sys.executable, "-m", *command.split(), *(["--out", str(out)] if out else [])]
    result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    print(f"$ {' '.join(argv)}\n{result.stdout}{result.stderr}", flush=True)
    return result


# -- the stages, in the order they run ------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    name: str
    expects: str  # what it establishes, in a line
    need_s: float  # about what it takes on the GPU machine: not started with less left
    cap_s: float  # stopped after this long
    run: Callable[[Rig, Verdicts], None]


STAGES: list[Stage] = []


def stage(expects: str, need_s: float, cap_s: float) -> Callable:
    def register(run: Callable[[Rig, Verdicts], None]) -> Callable[[Rig, Verdicts], None]:
        STAGES.append(Stage(run.__name__, expects, need_s, cap_s, run))
        return run

    return register


@stage("the machine (Python, torch, CUDA, the GPU) and the devices dpkit picks on it", 5, 30)
def environment(rig: Rig, v: Verdicts) -> None:
    v.info("python", platform.python_version())
    v.info("torch", torch.__version__)
    v.info("cuda_build", torch.version.cuda)
    v.info("cpu_cores", os.cpu_count())
    if torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(0)
        v.info("gpu", properties.name)
        v.info("gpu_count", torch.cuda.device_count())
        v.info("capability", f"{properties.major}.{properties.minor}")
        v.info("gpu_memory_gib", round(properties.total_memory / 2**30, 1))
        v.info("sleep_cycles_per_s", rig.cycles_per_s)
    if shutil.which("nvidia-smi"):
        query = "--query-gpu=name,driver_version,clocks.max.sm,power.limit,temperature.gpu"
        smi = subprocess.run(["nvidia-smi", query, "--format=csv"], capture_output=True, text=True)
        v.info("nvidia_smi", smi.stdout.strip().splitlines())
    v.info("dpkit_devices", [describe_choice(n) for n in (1, 4)])
    lanes = {device.kind for device in dpkit.devices(4)}
    if rig.gpu:
        one = dpkit.devices(1)[0].kind
        claim = "dpkit.devices(4) are lanes on the GPU, dpkit.devices(1) the GPU itself"
        v.check(claim, lanes == {VIRTUAL_GPU} and one == REAL, f"{lanes}, {one}")
    else:
        claim = "dpkit.devices(4) are virtual CPU lanes (rehearsal: no CUDA)"
        v.check(claim, lanes == {VIRTUAL_CPU}, str(lanes))


@stage("training on 1, 2, 4, 8 lanes (and the real GPU) equals one device, in float64", 8, 45)
def equivalence(rig: Rig, v: Verdicts) -> None:
    cases = {f"{n} lane{'s' * (n > 1)}": rig.lanes(n) for n in (1, 2, 4, 8)}
    if rig.gpu:
        cases["the real GPU"] = dpkit.devices(1)
    for name, devices in cases.items():
        claim = f"{name}: outputs, gradients and parameters of 3 SGD steps against one device"
        with v.guard(claim):
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8))
            model = model.to(rig.home).double()
            reference = copy.deepcopy(model)
            wrapped = dpkit.DataParallel(model, device_ids=devices)
            pairs = list(zip(model.parameters(), reference.parameters(), strict=True))
            optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
                          for m in (model, reference)]  # fmt: skip
            gaps = []
            for _ in range(3):
                x = torch.randn(37, 32, device=rig.home, dtype=torch.float64)  # uneven chunks
                y, y_reference = wrapped(x), reference(x)
                for optimizer in optimizers:
                    optimizer.zero_grad()
                y.pow(2).mean().backward(), y_reference.pow(2).mean().backward()
                gaps += [relative_gap(y, y_reference)]
                gaps += [relative_gap(p.grad, q.grad) for p, q in pairs]
                for optimizer in optimizers:
                    optimizer.step()
                gaps += [relative_gap(p, q) for p, q in pairs]
            v.at_most(claim, max(gaps), rig.limits["float64_rel"])


@stage(f"4 lanes each stalling {STALL_S * 1e3:g} ms run at once", 5, 30)
def overlap(rig: Rig, v: Verdicts) -> None:
    model = StallNet(rig).to(rig.home)
    x = torch.randn(64, 8, device=rig.home)
    times = {}
    with torch.no_grad():
        for n in (1, 4):
            wrapped = dpkit.DataParallel(model, device_ids=rig.lanes(n))
            times[n] = median_time(rig.lanes(n), lambda wrapped=wrapped: wrapped(x))
    v.info("forward_s", times)
    claim = f"forward on 4 lanes stalling {rig.stall_ms} each over 1 lane once (median of 5)"
    v.at_most(claim, times[4] / times[1], rig.limits["stall_ratio"])


@stage("the trace times a known stall on each lane as long as the stall takes alone", 5, 30)
def trace(rig: Rig, v: Verdicts) -> None:
    x = torch.randn(64, 8, device=rig.home)
    wrapped = dpkit.DataParallel(StallNet(rig).to(rig.home), device_ids=rig.lanes(4))
    alone = min(rig.alone(rig.stall) for _ in range(3))
    with torch.no_grad():
        wrapped(x)
        with dpkit.trace() as recorded:
            for _ in range(3):
                wrapped(x)
    applies: dict[str, list[float]] = {}
    for event in recorded.events:
        if event.phase == "apply":
            applies.setdefault(event.device, []).append(event.duration)
    v.info("stall_alone_s", alone)
    v.info("apply_s", applies)
    counts = {device: len(durations) for device, durations in applies.items()}
    v.check("3 traced forwards on 4 lanes: 3 apply events on each lane",
            sorted(counts.values()) == [3] * 4, str(counts))  # fmt: skip
    # the shortest of each: a busy machine only lengthens, a wrong clock or stream is off
    # in every reading (and reading short is what a misplaced CUDA event would do)
    worst = max(abs(min(d) - alone) / alone for d in applies.values())
    claim = f"each lane's traced apply (shortest of 3) against the {alone * 1e3:.2f} ms stall alone"
    v.at_most(f"{claim}, relative", worst, rig.limits["trace_rel"])


@stage("host-side timers wait for the GPU work they time", 5, 30)
def clocks(rig: Rig, v: Verdicts) -> None:
    share, lanes = rig.limits["clock_share"], rig.lanes(4)
    claim = f"host_clock.now(lanes) after a {rig.stall_ms} stall queued on a lane, in ms"
    if rig.gpu:
        lane = stream_of(lanes[3])
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.cuda.stream(lane):
            rig.stall()
        launched = time.perf_counter() - start
        waited = host_clock.now(lanes) - start
        control = "control: perf_counter right after queueing it reads the launch alone, in ms"
        v.at_most(control, launched * 1e3, rig.stall_s * 1e3 / 4)
        v.at_least(claim, waited * 1e3, share * rig.stall_s * 1e3)
    else:
        v.skip(claim, "CPU lanes do their work as it is called: no launch to tell from the work")
    pipe = pp.Pipeline([StallNet(rig), StallNet(rig)], rig.lanes(2),
                       loss=nn.functional.mse_loss)  # fmt: skip
    times = pp.stage_times(pipe, torch.randn(16, 8), torch.randn(16, 8), repeats=3)
    v.info("stage_times_s", times)
    shortest = min(seconds for pair in times for seconds in pair)
    claim = f"pipeline.stage_times of stages stalling {rig.stall_ms} each way, the shortest in ms"
    v.at_least(claim, shortest * 1e3, share * rig.stall_s * 1e3)


@stage("every test marked gpu passes (but those that need 2 real GPUs)", 60, 110)
def tests_gpu(rig: Rig, v: Verdicts) -> None:
    claim = "pytest -m gpu over the test files with gpu-marked tests: none fails"
    if importlib.util.find_spec("pytest") is None:
        v.skip(claim, "pytest is not installed here")
        return
    files = sorted(str(path.relative_to(REPO)) for path in (REPO / "tests").rglob("test_*.py")
                   if "mark.gpu" in path.read_text(errors="replace"))  # fmt: skip
    junit = rig.work / "tests_gpu.xml"
    result = run_logged(
        f"pytest -m gpu -p no:cacheprovider -rs --junitxml={junit} {' '.join(files)}"
    )
    counts, failures, skips = junit_counts(junit)
    v.info("counts", dict(counts))
    v.info("skipped_because", dict(skips))
    if counts["failed"] or counts["errors"] or result.returncode not in (0, 5):
        v.check(claim, False, f"{dict(counts)}, pytest status {result.returncode}; "
                              + "; ".join(failures[:5]))  # fmt: skip
    elif counts["passed"] == 0:
        v.skip(claim, f"{counts['skipped']} collected, every one skipped: {dict(skips)}")
    else:
        v.check(claim, True, f"{dict(counts)}; skipped because {dict(skips)}")


def junit_counts(junit: Path) -> tuple[Counter, list[str], Counter]:
    """Passed, failed, errors and skipped from pytest's JUnit XML; the failures' first lines;
    the skip reasons, counted."""
    counts: Counter[str] = Counter(passed=0, failed=0, errors=0, skipped=0)
    failures: list[str] = []
    skips: Counter[str] = Counter()
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "errors"}.get(child.tag, child.tag)
                message = ((child.get("message") or "").splitlines() or [""])[0][:200]
                if child.tag == "skipped":
                    skips[message] += 1
                else:
                    failures.append(f"{case.get('name')}: {message}")
        counts[outcome] += 1
    return counts, failures, skips


@stage("dpkit on the real GPU is as fast as torch's DataParallel on it", 40, 75)
def speed(rig: Rig, v: Verdicts) -> None:
    from benchmarks import gpu_step  # step times of every configuration, interleaved

    bench = gpu_step.Bench(rig.kind, quick=not rig.gpu, budget=30, out=rig.work / "steps.json")
    found = bench.step_times(30)
    bench.save()
    for size, row in found.items():
        batch, width = bench.sizes[size]
        v.check(f"{size} MLP step: every configuration steps", not row["errors"],
                str(row["errors"] or sorted(row["step_s"])))  # fmt: skip
        claim = (f"{size} MLP step ({batch} x {width}): dpkit on the real GPU over torch's "
                 "DataParallel on it (median of per-round ratios)")  # fmt: skip
        if rig.gpu:
            ratio = row["paired_ratios"].get("dpkit_real_1/torch_dp", float("nan"))  # NaN fails
            v.at_most(claim, ratio, rig.limits["dp_ratio"])
        else:
            ratio = row["paired_ratios"].get("dpkit_lanes_1/torch_dp", float("nan"))
            v.skip(claim, f"no real GPU (dpkit on 1 CPU lane over torch's on the CPU: {ratio:.2f})")


@stage("lanes' streams: no autograd warnings; torch's hazard that record_stream prevents", 5, 30)
def streams(rig: Rig, v: Verdicts) -> None:
    lanes = rig.lanes(4)
    model = nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU()).to(rig.home)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            x = torch.randn(64, 64, device=rig.home)
            dpkit.DataParallel(model, device_ids=lanes)(x).sum().backward()
    texts = sorted({str(warning.message)[:120] for warning in caught})
    v.check("training with BatchNorm on 4 lanes gives no warning", not texts, str(texts))

    claim = ("control: without record_stream, torch gives a freed lane copy's memory to the "
             "caller's next tensor while the lane still reads it (why dpkit calls it)")  # fmt: skip
    if not rig.gpu:
        v.skip(claim, "CPU lanes have no streams")
        return
    chunks = dpkit.scatter(torch.randn(1 << 20, device="cuda"), lanes[:2])
    expected = chunks[1].clone()
    lane = stream_of(lanes[1])
    lane.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(lane):  # read on the lane's stream, late, with no record_stream
        rig.stall(5 * rig.stall_s)
        out = chunks[1] * 1
    del chunks
    junk = torch.full((1 << 19,), 7.0, device="cuda")  # likely the block just freed
    torch.cuda.synchronize()
    if torch.equal(out, expected):
        v.skip(claim, "the lane read its copy intact: the block went to no one, nothing shown")
    else:
        v.check(claim, True, "the lane read the caller's later write")
    del junk


@stage("the pipeline on lanes: exact gradients, GPipe's bubble", 8, 45)
def pipeline(rig: Rig, v: Verdicts) -> None:
    lanes = rig.lanes(4)
    claim = "4 stages, 4 micro-batches, float64: gradients against the unsplit model"
    with v.guard(claim):
        model = pp.mlp_blocks(width=64, blocks=4).double()
        x, y = torch.randn(32, 64, dtype=torch.float64), torch.randint(0, 64, (32,))
        reference = pp.single_device_gradients(model, x, y)
        pp.pipeline(model, lanes, micro_batches=4).step(x, y)  # moves model's blocks to lanes
        grads = {name: p.grad.cpu() for name, p in model.named_parameters()}
        gaps = [relative_gap(grads[name], grad) for name, grad in reference.items()]
        v.at_most(claim, max(gaps), rig.limits["float64_rel"])

    p, m = 4, 4
    formula = pp.bubble_formula(p, m)
    claim = f"{p} stages stalling {rig.stall_ms} per micro-batch, m={m}: measured idle share"
    with v.guard(claim):
        stages = [StallNet(rig) for _ in range(p)]
        pipe = pp.Pipeline(stages, lanes, micro_batches=m, loss=nn.functional.mse_loss)
        _, idle = pp.measure_steps(pipe, torch.randn(16, 8), torch.randn(16, 8), repeats=3)
        v.info("idle_shares", idle)
        measured = statistics.median(idle)
        claim += f" {measured:.3f} (median of 3 steps) minus GPipe's (p-1)/(m+p-1) {formula:.3f}"
        v.at_most(claim, abs(measured - formula), rig.limits["bubble_abs"])


@stage("calibrate() measures 4 lanes into a valid machine", 20, 60)
def calibrate(rig: Rig, v: Verdicts) -> None:
    from dpkit.cost import calibrate as measure

    claim = "calibrate(4 lanes, quick=True) returns a Hardware (which refuses a term not > 0)"
    with v.guard(claim):
        start = time.perf_counter()
        machine = measure(rig.lanes(4), quick=True, progress=False)
        link = machine.device_to_device
        found = {
            "seconds": time.perf_counter() - start,
            "peak_flops_float32": machine.peak_flops.get("float32"),
            "memory_bandwidth": machine.memory_bandwidth,
            "link_bandwidth": link.bandwidth,
            "link_latency_s": link.latency,
            "thread_start_s": machine.thread_start,
            "module_overhead_s": machine.module_overhead,
            "compute_units": machine.compute_units,
        }
        v.info("machine", found)
        v.check(claim, True, ", ".join(f"{key} {value:.3g}" for key, value in found.items()))


@stage("every notebook's explorer computes and draws once on the lanes", 30, 90)
def explorers(rig: Rig, v: Verdicts) -> None:
    sys.modules["ipywidgets"] = widget_stand_in()  # one path, with or without ipywidgets
    from benchmarks import widgets  # every explorer the course shows (a test checks)

    for name, case in widgets.EXPLORERS.items():
        claim = f"{name} explorer ({case.factory}): computes, draws and paints a PNG"
        with v.guard(claim):
            start = time.perf_counter()
            explorer = case.make()  # computes and draws once, as a notebook cell does
            seconds, png = time.perf_counter() - start, len(explorer.last_png)
            marker = explorer.marker.value[:100]
            v.check(claim, png > 1000, f"{png} bytes in {seconds:.1f} s; {marker}")


def widget_stand_in() -> ModuleType:
    """ipywidgets as far as an explorer needs it without a browser: a widget keeps what it
    is given (``value``, ``description``, ``layout``) and observes nothing. The GPU machine
    has no ipywidgets, and what the stage checks (the explorers computing and drawing on the
    lanes) does not go through it."""

    class Widget:
        def __init__(self, *children: Any, **given: Any) -> None:
            self.children, self.layout = children, SimpleNamespace()
            self.__dict__.update(given)

        def observe(self, *args: Any, **kwargs: Any) -> None:
            pass

        def add_class(self, name: str) -> None:
            pass

    def widget_class(name: str) -> type:
        if name.startswith("_"):  # __file__, __path__, ...: a module's, not a widget
            raise AttributeError(name)
        return Widget

    module = ModuleType("ipywidgets")
    module.__getattr__ = widget_class
    return module


@stage("dpkit ddp --nproc 1 trains on NCCL", 15, 60)
def ddp(rig: Rig, v: Verdicts) -> None:
    backend = "nccl" if rig.gpu else "gloo"
    command = f"dpkit ddp --nproc 1 --backend {backend} --steps 3 --timeout 45"
    claim = f"{command}: trains, all-reduces, writes trace.json"
    claim += "" if rig.gpu else " (gloo standing in: NCCL needs CUDA)"
    result = run_logged(command, rig.work / "ddp")
    said = [line for line in result.stdout.splitlines() if f"backend {backend}" in line]
    ok = result.returncode == 0 and bool(said) and "allreduce" in result.stdout
    ok = ok and (rig.work / "ddp" / "trace.json").is_file()
    v.check(claim, ok, f"status {result.returncode}; {(said or ['no backend line'])[0][:120]}")


@stage("dpkit demo runs on the lanes", 10, 45)
def demo(rig: Rig, v: Verdicts) -> None:
    result = run_logged("dpkit demo --devices 4 --steps 2", rig.work / "demo")
    used = [line for line in result.stdout.splitlines() if line.startswith("devices used")]
    kind = VIRTUAL_GPU if rig.gpu else VIRTUAL_CPU
    ok = result.returncode == 0 and bool(used) and kind in used[0]
    ok = ok and (rig.work / "demo" / "trace.json").is_file()
    claim = f"dpkit demo --devices 4: exits 0 on {kind} lanes, writes trace.json"
    v.check(claim, ok, f"status {result.returncode}; {(used or ['no devices line'])[0][:120]}")


# -- the run: each stage in a process of its own -------------------------------------------


def run_stage(stage: Stage, args: argparse.Namespace, work: Path, timeout: float) -> dict:
    """The stage in a child process, its output in logs/<stage>.log; its verdicts, and a
    FAIL when it crashed or ran out of time without failing an expectation itself."""
    log, results = work / "logs" / f"{stage.name}.log", work / "verdicts" / f"{stage.name}.json"
    command = [sys.executable, str(Path(__file__).resolve()), "--stage", stage.name,
               "--work", str(work), *(["--rehearse"] * args.rehearse),
               *(f"--limit={item}" for item in args.limit)]  # fmt: skip
    started = time.monotonic()
    with open(log, "wb") as handle:
        process = subprocess.Popen(command, cwd=REPO, env=child_env(args, work), stdout=handle,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)  # fmt: skip
        try:
            returncode: int | None = process.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            kill_group(process)
            returncode = None
    try:
        found = json.loads(results.read_text())
    except (OSError, ValueError):
        found = {"verdicts": [], "info": {}}
    verdicts = found["verdicts"]
    if returncode is None:
        verdicts.append(verdict("FAIL", f"{stage.name} ends within {timeout:.0f} s", "stopped"))
    elif returncode != 0 and stage_status(verdicts) != "FAIL":
        last = (log.read_text(errors="replace").strip().splitlines() or [""])[-1][:200]
        claim = f"{stage.name} runs to its end"
        verdicts.append(verdict("FAIL", claim, f"exit status {returncode}: {last}"))
    elif not verdicts:
        verdicts.append(verdict("FAIL", f"{stage.name} reaches a verdict", "it reached none"))
    seconds = round(time.monotonic() - started, 1)
    return {"expects": stage.expects, "status": stage_status(verdicts), "seconds": seconds,
            "returncode": returncode, "verdicts": verdicts, "info": found["info"]}  # fmt: skip


def child_env(args: argparse.Namespace, work: Path) -> dict[str, str]:
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONUNBUFFERED="1", MPLCONFIGDIR=str(work / "mpl"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    if args.rehearse:
        env["CUDA_VISIBLE_DEVICES"] = ""  # CPU lanes everywhere, even on a GPU machine
    return env


def kill_group(process: subprocess.Popen) -> None:
    """Stop the stage's process group, then anything it started in a session of its own
    (dpkit's DDP ranks each lead their own), found through /proc before the group goes."""
    strays = descendants(process.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=5)
            break
        except subprocess.TimeoutExpired:
            continue
    for pid in strays:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


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


def summary_lines(report: dict[str, Any]) -> list[str]:
    machine = report["stages"].get("environment", {}).get("info", {})
    if report.get("rehearsal"):
        where = "CPU lanes standing in for GPU lanes (rehearsal)"
    else:  # without the environment stage (--only), the run knows only that it had a GPU
        where = machine.get("gpu") or "a GPU"
    about = (
        f": torch {machine.get('torch')}, CUDA {machine.get('cuda_build')}, Python "
        f"{machine.get('python')}"
        if machine
        else " (the environment stage did not run)"
    )
    statuses = Counter(found["status"] for found in report["stages"].values())
    counts = ", ".join(f"{statuses[status]} {status}" for status in ("PASS", "FAIL", "SKIP"))
    lines = [f"gpu_check on {where}{about}; stages {counts} in {report['elapsed_s']:.0f} s"]
    for name, found in report["stages"].items():
        lines.append(f"{name:<12} {found['status']:<4} {found['seconds']:5.1f} s  "
                     f"{found['expects']}")  # fmt: skip
        lines += [f"  {v['status']:<4} {v['claim']}: {v['measured']}" for v in found["verdicts"]]
    return lines


def write_out(out: Path, work: Path, report: dict[str, Any]) -> None:
    """The three files: summary.txt, gpu_check.json, logs.tar.gz (what ``work`` holds)."""
    out.mkdir(parents=True, exist_ok=True)
    report["summary"] = summary_lines(report)
    (out / "summary.txt").write_text("\n".join(report["summary"]) + "\n")
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    with tarfile.open(out / "logs.tar.gz", "w:gz") as archive:
        for path in sorted(work.rglob("*")):
            if path.is_file() and "mpl" not in path.relative_to(work).parts:
                archive.add(path, arcname=str(Path("gpu_check") / path.relative_to(work)))


def run_all(args: argparse.Namespace) -> int:
    started = time.monotonic()
    report: dict[str, Any] = {
        "gpu": not args.rehearse, "rehearsal": args.rehearse, "budget_s": args.budget,
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": [sys.executable, *sys.argv], "limits": args.limits, "stages": {},
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="dpkit-gpu-check-") as folder:
        work = Path(folder)
        (work / "logs").mkdir(), (work / "verdicts").mkdir()
        for stage in [s for s in STAGES if not args.only or s.name in args.only]:
            left = args.budget - (time.monotonic() - started)
            if left < stage.need_s:
                why = f"{left:.0f} s left of {args.budget:g}; it takes about {stage.need_s:g}"
                skipped = verdict("SKIP", f"{stage.name} fits in the budget", why)
                found = {"expects": stage.expects, "status": "SKIP", "seconds": 0.0,
                         "verdicts": [skipped]}  # fmt: skip
            else:
                print(f"-- {stage.name}: {stage.expects}", flush=True)
                cap = stage.cap_s * (REHEARSAL_SLOWER if args.rehearse else 1)
                found = run_stage(stage, args, work, min(cap, left))
                for line in found["verdicts"]:
                    print(f"   {line['status']:<4} {line['claim']}: {line['measured']}")
            report["stages"][stage.name] = found
            report["elapsed_s"] = round(time.monotonic() - started, 1)
            write_out(args.out, work, report)
    print("\n" + "\n".join(report["summary"]))
    print(f"\nwrote summary.txt, gpu_check.json and logs.tar.gz to {args.out}")
    return 1 if any(found["status"] == "FAIL" for found in report["stages"].values()) else 0


def no_gpu(args: argparse.Namespace) -> int:
    lines = [
        f"no GPU: torch {torch.__version__} sees no CUDA device, so nothing ran. With one, "
        f"within {args.budget:g} s, each stage's expectations end in PASS, FAIL or SKIP:",
        *(f"  {stage.name:<12} {stage.expects}" for stage in STAGES),
        "Rehearse every stage here, on CPU lanes, with --rehearse.",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.txt").write_text("\n".join(lines) + "\n")
    report = {"gpu": False, "torch": torch.__version__, "summary": lines,
              "would_run": {stage.name: stage.expects for stage in STAGES}}  # fmt: skip
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1) + "\n")
    print("\n".join(lines))
    return 0


def run_one(args: argparse.Namespace) -> int:
    """In the stage's own process: run it; its verdicts go to work/verdicts/<name>.json."""
    stage = next(s for s in STAGES if s.name == args.stage)
    verdicts = Verdicts(args.work / "verdicts" / f"{stage.name}.json")
    stage.run(Rig(args.rehearse, args.work, args.limits), verdicts)
    return 0


def parse_limits(items: list[str]) -> dict[str, float]:
    limits = dict(LIMITS)
    for item in items:
        name, _, value = item.partition("=")
        if name not in LIMITS:
            raise SystemExit(f"--limit {item}: no limit {name!r}; the limits: {', '.join(LIMITS)}")
        limits[name] = float(value)
    return limits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    out = Path(os.environ.get("OUT") or REPO / "build" / "gpu_check")
    parser.add_argument(
        "--out", type=Path, default=out, help="for the 3 files ($OUT, else %(default)s)"
    )
    parser.add_argument("--budget", type=float, help="seconds for all (270; rehearsing 600)")
    parser.add_argument("--rehearse", action="store_true",
                        help="without a GPU: every stage on CPU lanes, gloo for NCCL")  # fmt: skip
    names = [stage.name for stage in STAGES]
    parser.add_argument("--only", action="append", default=[], metavar="STAGE", choices=names,
                        help="run this stage (repeatable)")  # fmt: skip
    limits = ", ".join(f"{name}={value:g}" for name, value in LIMITS.items())
    parser.add_argument("--limit", action="append", default=[], metavar="NAME=VALUE",
                        help=f"change a limit: {limits}")  # fmt: skip
    parser.add_argument("--stage", help=argparse.SUPPRESS)  # in a child: run this stage
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.limits = parse_limits(args.limit)
    args.budget = args.budget or (600 if args.rehearse else 270)
    if args.stage:
        return run_one(args)
    args.out = args.out.resolve()
    if not args.rehearse and not torch.cuda.is_available():
        return no_gpu(args)
    return run_all(args)


if __name__ == "__main__":
    sys.exit(main())
