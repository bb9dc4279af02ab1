"""dpkit on the lanes of one GPU, timed: a training step against the plain module and
``torch.nn.DataParallel``, what tracing costs on CUDA, and how much the lanes' applies overlap.

    python -m benchmarks.gpu_step --out build/gpu_check/benchmark.json   # a GPU machine
    .venv/bin/python -m benchmarks.gpu_step --device cpu --quick        # a rehearsal on CPU

``scripts/gpu_check.py`` runs it as one stage of the GPU check (``--budget`` caps its time).
Three sections, each written to ``--out`` as soon as it is done, so a stage killed for time
keeps what it measured:

``step_times``     forward + backward of an MLP (3 square layers, GELU) on a "large" batch
                   (4096 x 4096, real GPU work) and a "small" one (256 x 512, launch-bound),
                   for the plain module on the device, ``nn.DataParallel(device_ids=[0])``
                   (with one GPU torch scatters to it and calls the module), dpkit on the one
                   real device, and dpkit on 1, 2, 4 and 8 virtual lanes. One step of each per
                   round, in rotating order, synchronised around every step. The goal: dpkit
                   on one device within 1.05x of torch's DataParallel.
``trace_overhead`` the same step on 4 lanes (and on the real device) with and without
                   ``with dpkit.trace()`` around it, interleaved the same way.
``apply_overlap``  from a traced step on n lanes, the apply events' summed durations over the
                   length of their union: 1.0 when the lanes ran one after another, n when all
                   ran at once. Then a module that only stalls (``torch.cuda._sleep`` on the
                   lane's stream; ``time.sleep`` on CPU) shows the lanes' concurrency alone:
                   n lanes stalling in n x the time of one lane means no overlap.

Times are seconds. Medians with quartiles and extremes; ratios both of medians and as the
median of per-round ratios (steadier on a busy machine). Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import dpkit
from benchmarks.machine import machine

LANES = (1, 2, 4, 8)
DEPTH = 3
SIZES = {"large": (4096, 4096), "small": (256, 512)}  # (batch, width)
QUICK_SIZES = {"large": (64, 64), "small": (16, 32)}
GOAL = 1.05  # dpkit on one device over torch's DataParallel
STALL_SECONDS = 0.02


# -- statistics ---------------------------------------------------------------------------


def describe(values: list[float]) -> dict[str, float]:
    """Median, quartiles and extremes of a list of times."""
    q1, _, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return {
        "median": statistics.median(values),
        "q1": q1,
        "q3": q3,
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def paired_ratio(numerators: list[float], denominators: list[float]) -> float:
    """The median over rounds of one configuration's time over another's in the same round."""
    return statistics.median(n / d for n, d in zip(numerators, denominators))


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by the intervals, overlaps counted once."""
    total, current_start, current_end = 0.0, None, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total


def overlap_factor(intervals: list[tuple[float, float]]) -> float:
    """Summed durations over the union: 1.0 when one at a time, n when n ran at once."""
    covered = union_length(intervals)
    summed = sum(end - start for start, end in intervals)
    return summed / covered if covered > 0 else float("nan")


# -- timing -------------------------------------------------------------------------------


class Bench:
    def __init__(self, device: str, quick: bool, budget: float, out: Path):
        self.device = device
        self.cuda = device == "cuda"
        self.sync: Callable[[], None] = torch.cuda.synchronize if self.cuda else lambda: None
        self.sizes = QUICK_SIZES if quick else SIZES
        self.warmup = 1 if quick else 3
        self.max_rounds = 5 if quick else 60
        self.min_rounds = 3 if quick else 8
        self.budget = budget
        self.out = out
        self.results: dict[str, Any] = {"machine": _machine(device), "sizes": self.sizes}

    def save(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.out.write_text(json.dumps(self.results, indent=2, default=str) + "\n")

    def section(self, name: str, measure: Callable[[float], dict[str, Any]], share: float):
        started = time.perf_counter()
        try:
            self.results[name] = measure(share * self.budget)
        except Exception as error:  # noqa: BLE001 - one section failing leaves the others
            self.results[name] = {"error": f"{type(error).__name__}: {error}"}
            traceback.print_exc()
        self.results[name]["seconds"] = time.perf_counter() - started
        self.save()
        print(f"[{name}] done in {self.results[name]['seconds']:.1f} s", flush=True)

    def timed(self, step: Callable[[], None]) -> float:
        self.sync()
        start = time.perf_counter()
        step()
        self.sync()
        return time.perf_counter() - start

    def interleaved(self, steps: dict[str, Callable[[], None]], seconds: float):
        """Step times per configuration from rotating rounds, as many as fit in ``seconds``
        (at least ``min_rounds``, at most ``max_rounds``)."""
        names = list(steps)
        for _ in range(self.warmup):
            for name in names:
                steps[name]()
        self.sync()
        one_round = sum(self.timed(steps[name]) for name in names)
        rounds = int(min(self.max_rounds, max(self.min_rounds, seconds / max(one_round, 1e-6))))
        times: dict[str, list[float]] = {name: [] for name in names}
        for index in range(rounds):
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                times[name].append(self.timed(steps[name]))
        return times

    # -- the model ----------------------------------------------------------------------

    def mlp(self, size: str) -> tuple[nn.Module, torch.Tensor]:
        batch, width = self.sizes[size]
        torch.manual_seed(0)
        layers: list[nn.Module] = []
        for index in range(DEPTH):
            layers.append(nn.Linear(width, width))
            if index < DEPTH - 1:
                layers.append(nn.GELU())
        model = nn.Sequential(*layers).to(self.device)
        return model, torch.randn(batch, width, device=self.device)

    def wrappers(self, model: nn.Module, lanes: Iterable[int]) -> dict[str, nn.Module]:
        found = {"plain": model}
        # With one GPU torch's DataParallel scatters to it and calls the module; without one
        # it calls the module (device_ids=[0] would fail there).
        found["torch_dp"] = nn.DataParallel(model, device_ids=[0] if self.cuda else None)
        if self.cuda:
            found["dpkit_real_1"] = dpkit.DataParallel(model, device_ids=dpkit.devices(1))
        for n in lanes:
            lanes_n = dpkit.virtual_devices(n, on=self.device)
            found[f"dpkit_lanes_{n}"] = dpkit.DataParallel(model, device_ids=lanes_n)
        return found

    @staticmethod
    def training_step(model: nn.Module, wrapper: nn.Module, x: torch.Tensor):
        def step() -> None:
            model.zero_grad(set_to_none=True)
            wrapper(x).pow(2).mean().backward()

        return step

    def working_steps(self, model, x, wrappers) -> tuple[dict[str, Callable], dict[str, str]]:
        """A step per wrapper that runs once without error; the errors of the others."""
        steps, errors = {}, {}
        for name, wrapper in wrappers.items():
            step = self.training_step(model, wrapper, x)
            try:
                step()
                self.sync()
                steps[name] = step
            except Exception as error:  # noqa: BLE001 - report it, time the others
                errors[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        return steps, errors

    # -- the sections ---------------------------------------------------------------------

    def step_times(self, seconds: float) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for size in self.sizes:
            model, x = self.mlp(size)
            steps, errors = self.working_steps(model, x, self.wrappers(model, LANES))
            times = self.interleaved(steps, seconds / len(self.sizes))
            found[size] = summarise_steps(times, errors)
            print(format_step_times(size, self.sizes[size], found[size]), flush=True)
            self.results["step_times"] = found  # saved now in case the next size hangs
            self.save()
        return found

    def trace_overhead(self, seconds: float) -> dict[str, Any]:
        cases = [(size, 4) for size in self.sizes]
        if self.cuda:
            cases.append(("small", "real_1"))
        found: dict[str, Any] = {}
        for size, lanes in cases:
            model, x = self.mlp(size)
            devices = (
                dpkit.virtual_devices(lanes, on=self.device)
                if isinstance(lanes, int)
                else dpkit.devices(1)  # the one real GPU
            )
            step = self.training_step(model, dpkit.DataParallel(model, device_ids=devices), x)

            def traced(step: Callable[[], None] = step) -> None:
                with dpkit.trace():  # a fresh trace per step: opening and closing it counts
                    step()

            times = self.interleaved({"off": step, "on": traced}, seconds / len(cases))
            medians = {name: statistics.median(values) for name, values in times.items()}
            key = f"{size}_lanes_{lanes}" if isinstance(lanes, int) else f"{size}_{lanes}"
            found[key] = {
                "step_s": {name: describe(values) for name, values in times.items()},
                "on/off_of_medians": medians["on"] / medians["off"],
                "on/off_paired": paired_ratio(times["on"], times["off"]),
            }
            print(
                f"trace overhead {key}: on/off {found[key]['on/off_of_medians']:.3f} of medians,"
                f" {found[key]['on/off_paired']:.3f} paired",
                flush=True,
            )
        return found

    def apply_overlap(self, seconds: float) -> dict[str, Any]:
        found: dict[str, Any] = {"mlp_large": {}, "stall": {}}
        model, x = self.mlp("large")
        for n in LANES[1:]:
            wrapper = dpkit.DataParallel(model, device_ids=dpkit.virtual_devices(n, on=self.device))
            step = self.training_step(model, wrapper, x)
            step(), step()
            self.sync()
            with dpkit.trace() as recorded:
                step()
            found["mlp_large"][f"lanes_{n}"] = apply_events_overlap(recorded.events)
        found["stall"] = self.stall_overlap()
        for name, rows in found.items():
            for lanes, row in rows.items():
                if isinstance(row, dict) and "overlap" in row:
                    print(f"apply overlap {name} {lanes}: {row['overlap']:.2f}", flush=True)
        return found

    def stall_overlap(self) -> dict[str, Any]:
        """Lanes that only stall: n stalls in the time of one means the lanes ran at once."""
        if self.cuda:
            cycles = int(STALL_SECONDS * cuda_sleep_cycles_per_second())
        found: dict[str, Any] = {"stall_s": STALL_SECONDS}

        class Stall(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.scale = nn.Parameter(torch.ones(()))

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                if x.is_cuda:
                    torch.cuda._sleep(cycles)
                else:
                    time.sleep(STALL_SECONDS)
                return x * self.scale

        stall = Stall().to(self.device)
        x = torch.randn(64, 8, device=self.device)
        one_lane = None
        for n in LANES:
            wrapper = dpkit.DataParallel(stall, device_ids=dpkit.virtual_devices(n, on=self.device))
            with torch.no_grad():
                wrapper(x)
                forward = functools.partial(wrapper, x)
                wall = statistics.median(self.timed(forward) for _ in range(3))
                with dpkit.trace() as recorded:
                    wrapper(x)
            one_lane = wall if n == 1 else one_lane
            row = {"forward_s": wall, "stalls_at_once": n * one_lane / wall}
            if n > 1:
                row.update(apply_events_overlap(recorded.events))
            found[f"lanes_{n}"] = row
        return found


def apply_events_overlap(events: list[Any]) -> dict[str, Any]:
    """The last step's apply events: their durations, union, and summed over union."""
    last = max(event.step for event in events)
    applies = [e for e in events if e.phase == "apply" and e.step == last]
    intervals = [(e.start, e.end) for e in applies]
    finite = all(
        e.start == e.start and e.end == e.end and e.start <= e.end for e in events
    )  # NaN != NaN
    return {
        "apply_s": [end - start for start, end in intervals],
        "union_s": union_length(intervals),
        "overlap": overlap_factor(intervals),
        "events": len(events),
        "all_events_finite_and_ordered": finite,
    }


def cuda_sleep_cycles_per_second() -> float:
    """How many ``torch.cuda._sleep`` cycles pass per second on this GPU."""
    cycles = 50_000_000
    torch.cuda._sleep(1000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / (start.elapsed_time(end) / 1000)


def summarise_steps(times: dict[str, list[float]], errors: dict[str, str]) -> dict[str, Any]:
    medians = {name: statistics.median(values) for name, values in times.items()}
    pairs = [("torch_dp", "plain")]
    pairs += [(one, "torch_dp") for one in ("dpkit_real_1", "dpkit_lanes_1")]
    pairs += [(f"dpkit_lanes_{n}", "plain") for n in LANES]
    pairs += [(f"dpkit_lanes_{n}", "dpkit_lanes_1") for n in LANES[1:]]
    pairs = [(a, b) for a, b in pairs if a in times and b in times]
    found: dict[str, Any] = {
        "step_s": {name: describe(values) for name, values in times.items()},
        "ratios_of_medians": {f"{a}/{b}": medians[a] / medians[b] for a, b in pairs},
        "paired_ratios": {f"{a}/{b}": paired_ratio(times[a], times[b]) for a, b in pairs},
        "errors": errors,
    }
    for one in ("dpkit_real_1", "dpkit_lanes_1"):
        key = f"{one}/torch_dp"
        if key in found["ratios_of_medians"]:
            ratio = found["ratios_of_medians"][key]
            found["goal"] = {"ratio": key, "value": ratio, "limit": GOAL, "met": ratio <= GOAL}
            break
    return found


def format_step_times(size: str, shape: tuple[int, int], found: dict[str, Any]) -> str:
    lines = [f"{size}: batch {shape[0]} x {shape[1]} features, {DEPTH} layers, fwd+bwd"]
    for name, row in found["step_s"].items():
        lines.append(
            f"  {name:<15} median {row['median'] * 1e3:9.3f} ms"
            f"  (q1-q3 {row['q1'] * 1e3:.3f}-{row['q3'] * 1e3:.3f}, n={row['n']})"
        )
    for name, ratio in found["ratios_of_medians"].items():
        lines.append(f"  {name:<30} {ratio:6.3f}  (paired {found['paired_ratios'][name]:.3f})")
    for name, error in found["errors"].items():
        lines.append(f"  {name}: FAILED {error}")
    return "\n".join(lines)


def _machine(device: str) -> dict[str, Any]:
    found = machine(device=device, float32_matmul_precision=torch.get_float32_matmul_precision())
    if device == "cuda":
        found["cuda"] = torch.version.cuda
        found["gpu"] = torch.cuda.get_device_name(0)
        found["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="cuda: lanes on GPU 0 (default where there is one); cpu: CPU lanes",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes, few rounds")
    parser.add_argument("--budget", type=float, default=90, help="seconds to aim for (90)")
    parser.add_argument("--out", type=Path, default=Path("build/gpu_check/benchmark.json"))
    args = parser.parse_args(argv)
    bench = Bench(args.device, args.quick, args.budget, args.out)
    print(f"gpu_step on {args.device}: {json.dumps(bench.results['machine'])}", flush=True)
    bench.save()
    bench.section("step_times", bench.step_times, 0.55)
    bench.section("trace_overhead", bench.trace_overhead, 0.3)
    bench.section("apply_overlap", bench.apply_overlap, 0.1)
    print(f"written to {args.out}")
    failed = [name for name, found in bench.results.items() if "error" in found]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
