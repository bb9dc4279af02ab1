"""What tracing costs: a DataParallel training step with tracing off, on, and with no checks.

    .venv/bin/python -m benchmarks.trace_overhead                 # from the repository root
    .venv/bin/python -m benchmarks.trace_overhead --repeats 200   # quicker, looser medians

One step is forward + backward + SGD of a small MLP (784-256-128-10) on a batch of 256,
split by ``dpkit.DataParallel`` across 4 virtual CPU lanes. Three configurations, timed
one step at a time in interleaved rounds (the order rotates every round, so drift in the
machine's speed lands on all three alike):

``baseline``  dpkit with the trace module's entry points replaced by unconditional no-ops:
              ``span`` returns a shared ``nullcontext`` without testing whether anything
              listens, ``record_memory`` does nothing and ``enabled`` returns False. The
              call sites themselves stay (removing them would mean editing the
              primitives), so this is dpkit as if the trace's "is anyone recording?" tests
              were free.
``off``       dpkit as shipped, no trace open: every entry point tests a list and returns.
``on``        dpkit as shipped inside ``with dpkit.trace()``, opened around each timed step
              (so the cost of entering and leaving the trace counts too).

``off / baseline`` is the cost of the disabled trace (the design promises ~nothing);
``on / off`` is the cost of recording (the goal is <= 1.05; not asserted anywhere). Each is
given twice: as a ratio of the medians, and as the median of per-round ratios (the three
steps of a round run back to back, so that ratio is less sensitive to a busy machine).
Results go to ``benchmarks/results/trace_overhead.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

import dpkit
from benchmarks.machine import machine
from dpkit import tracing as trace

RESULTS = Path(__file__).resolve().parent / "results" / "trace_overhead.json"


def make_step(devices: int, batch: int) -> Callable[[], None]:
    """One training step of the MLP on ``devices`` virtual CPU lanes, as a closure."""
    torch.manual_seed(0)
    module = nn.Sequential(
        nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
        nn.Linear(128, 10),
    )  # fmt: skip
    parallel = dpkit.DataParallel(module, device_ids=dpkit.virtual_devices(devices, on="cpu"))
    optimizer = torch.optim.SGD(module.parameters(), lr=0.01)
    images = torch.randn(batch, 1, 28, 28)
    labels = torch.randint(0, 10, (batch,))

    def step() -> None:
        optimizer.zero_grad()
        nn.functional.cross_entropy(parallel(images), labels).backward()
        optimizer.step()

    return step


_NO_OP = nullcontext()

# The baseline's trace entry points: what each would be if it tested nothing.
UNCHECKED: dict[str, Callable[..., Any]] = {
    "span": lambda *args, **kwargs: _NO_OP,
    "copy_span": lambda *args, **kwargs: _NO_OP,
    "host_span": lambda *args, **kwargs: _NO_OP,
    "applying": lambda worker, *args: nullcontext(worker),  # the seam around the replicas' run
    "holds": lambda *args, **kwargs: None,
    "record_memory": lambda *args, **kwargs: None,
    "enabled": lambda: False,
    "recording": lambda: False,
}


@contextmanager
def unchecked_trace() -> Iterator[None]:
    """The baseline: swap the trace's entry points for UNCHECKED while the block runs."""
    saved = {name: getattr(trace, name) for name in UNCHECKED}
    for name, replacement in UNCHECKED.items():
        setattr(trace, name, replacement)  # call sites look them up as trace.<name>
    try:
        yield
    finally:
        for name, original in saved.items():
            setattr(trace, name, original)


def measure(repeats: int, warmup: int, devices: int, batch: int) -> dict[str, list[float]]:
    """Step times in seconds per configuration, from interleaved, rotating rounds."""
    step = make_step(devices, batch)
    contexts: dict[str, Callable[[], Any]] = {
        "baseline": unchecked_trace,
        "off": nullcontext,
        "on": dpkit.trace,  # a fresh Trace per step: events do not pile up over the rounds
    }
    names = list(contexts)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(warmup + repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            with contexts[name]():
                start = time.perf_counter()
                step()
                elapsed = time.perf_counter() - start
            if round_index >= warmup:
                times[name].append(elapsed)
    return times


def paired_ratio(numerators: list[float], denominators: list[float]) -> float:
    """The median over rounds of one configuration's time over another's in the same round."""
    return statistics.median(n / d for n, d in zip(numerators, denominators))


def summarise(times: dict[str, list[float]], args: argparse.Namespace) -> dict[str, Any]:
    medians = {name: statistics.median(values) for name, values in times.items()}
    quartiles = {
        name: [float(q) for q in statistics.quantiles(values, n=4)[::2]]
        for name, values in times.items()
    }
    return {
        "what": (
            f"DataParallel training step (forward+backward+SGD), MLP 784-256-128-10, batch "
            f"{args.batch}, {args.devices} virtual CPU lanes"
        ),
        "configurations": {
            "baseline": "trace entry points replaced by unconditional no-ops (no checks)",
            "off": "dpkit as shipped, no trace open",
            "on": "dpkit as shipped, inside `with dpkit.trace()` around each step",
        },
        "median_step_s": medians,
        "quartiles_step_s": quartiles,
        "ratios_of_medians": {
            "on/off": medians["on"] / medians["off"],
            "off/baseline": medians["off"] / medians["baseline"],
        },
        # Each round times the three back to back, so a round's ratio cancels slow drift
        # (other processes, clock changes) that the medians above still carry.
        "median_paired_ratios": {
            "on/off": paired_ratio(times["on"], times["off"]),
            "off/baseline": paired_ratio(times["off"], times["baseline"]),
        },
        "goal": "on/off <= 1.05 (not asserted)",
        "repeats": args.repeats,
        "warmup": args.warmup,
        "machine": machine(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    # One step varies by +-20% on a shared 2-core machine; 1000 rounds (about a minute) pin
    # the median of the per-round ratios to about +-0.5%.
    parser.add_argument("--repeats", type=int, default=1000, help="timed rounds (default 1000)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed rounds (default 10)")
    parser.add_argument("--devices", type=int, default=4, help="virtual CPU lanes (default 4)")
    parser.add_argument("--batch", type=int, default=256, help="batch size (default 256)")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"JSON file (default {RESULTS})")
    args = parser.parse_args()

    result = summarise(measure(args.repeats, args.warmup, args.devices, args.batch), args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")

    print(result["what"])
    machine = result["machine"]
    print(f"torch {machine['torch']}, {machine['cpu_cores']} cores, {args.repeats} rounds\n")
    for name, median in result["median_step_s"].items():
        low, high = result["quartiles_step_s"][name]
        print(
            f"{name:<9} median {median * 1e3:7.3f} ms  (quartiles {low * 1e3:.3f}-{high * 1e3:.3f})"
        )
    print()
    print(f"{'ratio':<14}{'of medians':>12}{'paired':>10}")
    for name, ratio in result["ratios_of_medians"].items():
        print(f"{name:<14}{ratio:>12.3f}{result['median_paired_ratios'][name]:>10.3f}")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
