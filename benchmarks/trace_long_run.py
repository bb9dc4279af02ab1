"""What a long traced run holds: memory over 10,000 traced steps, bounded and not, and after.

    .venv/bin/python -m benchmarks.trace_long_run                # ~3-5 minutes on 2 cores
    .venv/bin/python -m benchmarks.trace_long_run --steps 2000   # quicker

A step is forward + backward of a tiny MLP (8-16-4, batch 32) by ``dpkit.DataParallel`` on
4 virtual CPU lanes: 30 events and 17 memory records a step, issue 18's reproducer (which
grew the process by 144 MB over 10,000 steps, and took 2.85 s to export 63 MB of Chrome
trace). Three runs, each in a fresh process so that one's heap does not hide another's:

``untraced``   the same steps with no trace: what the process grows by anyway
``bounded``    inside ``dpkit.trace()``, its default bound (the last 1000 steps kept)
``unbounded``  inside ``dpkit.trace(keep_steps=None)``: every step kept

Each reports the resident memory (RSS) every 1000 steps, and RSS after the trace is dropped,
with and without asking the C allocator to return its free memory (``malloc_trim``: what
stays without it is free heap, not held objects). A second run of each traced kind times
the Chrome export and the summary (in a run of its own: their temporary objects would stay
in the heap measured above). Results go to ``benchmarks/results/trace_long_run.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.machine import machine

RESULTS = Path(__file__).resolve().parent / "results" / "trace_long_run.json"
RUNS = ("untraced", "bounded", "unbounded")
EXPORT = " export"  # a second run of a traced kind, for the export (its heap would blur RSS)
MiB = 2**20


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MiB


def run(name: str, steps: int) -> dict[str, Any]:
    """One run in this process (called in a child process of its own)."""
    import torch
    from torch import nn

    import dpkit

    torch.manual_seed(0)
    parallel = dpkit.DataParallel(
        nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)),
        device_ids=dpkit.virtual_devices(4, on="cpu"),
    )
    x = torch.randn(32, 8)
    for _ in range(50):  # warm-up: torch's and Python's caches filled before measuring
        parallel(x).sum().backward()
    gc.collect()
    start_rss = rss_mib()
    curve = []
    kind = name.removesuffix(EXPORT)
    trace = {"untraced": contextlib.nullcontext, "bounded": dpkit.trace}.get(
        kind, lambda: dpkit.trace(keep_steps=None)
    )()
    started = time.perf_counter()
    with trace as recorded:
        for step in range(1, steps + 1):
            parallel(x).sum().backward()
            if step % 1000 == 0:
                curve.append([step, round(rss_mib() - start_rss, 2)])
    elapsed = time.perf_counter() - started
    result: dict[str, Any] = {
        "rss_growth_mib_every_1000_steps": curve,
        "seconds_per_step": elapsed / steps,
    }
    if recorded is not None and not name.endswith(EXPORT):
        result["rss_growth_mib_with_trace"] = rss_mib() - start_rss
        # counted from the stored columns: reading .events would build objects in this heap
        result["events_kept"] = len(recorded._event_columns)
        result["memory_records_kept"] = len(recorded._memory_columns)
        result["steps_dropped"] = recorded.dropped_steps
        del recorded, trace
        result["rss_growth_mib_after_dropping_it"] = rss_mib() - start_rss
        gc.collect()
        result["rss_growth_mib_after_gc"] = rss_mib() - start_rss
    elif recorded is not None:
        with tempfile.TemporaryDirectory() as folder:
            began = time.perf_counter()
            path = recorded.to_chrome_trace(Path(folder) / "trace.json")
            result["chrome_export_s"] = time.perf_counter() - began
            result["chrome_export_mib"] = path.stat().st_size / MiB
        began = time.perf_counter()
        result["summary_steps"] = recorded.dropped_steps + len({e.step for e in recorded.events})
        recorded.summary()
        result["summary_s"] = time.perf_counter() - began
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        result["rss_growth_mib_after_malloc_trim"] = rss_mib() - start_rss
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=10_000, help="traced steps (10,000)")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"JSON file (default {RESULTS})")
    parser.add_argument("--run", help=argparse.SUPPRESS)  # in the child: which run
    args = parser.parse_args()
    if args.run:
        print(json.dumps(run(args.run, args.steps)))
        return

    load_start = os.getloadavg()
    results = {}
    for name in RUNS + tuple(kind + EXPORT for kind in RUNS[1:]):
        child = subprocess.run(
            [sys.executable, "-m", "benchmarks.trace_long_run", "--run", name]
            + ["--steps", str(args.steps)],
            capture_output=True,
            text=True,
            check=True,
        )
        results[name] = json.loads(child.stdout.strip().splitlines()[-1])
        row = results[name]
        details = [f"{row['seconds_per_step'] * 1e3:.2f} ms a step"]
        if "events_kept" in row:
            details.append(f"{row['events_kept']} events kept")
            details.append(f"dropped: +{row['rss_growth_mib_after_gc']:.1f} MiB")
        if "chrome_export_s" in row:
            details.append(f"export {row['chrome_export_s']:.2f} s")
            details.append(f"{row['chrome_export_mib']:.1f} MiB")
        growth = row["rss_growth_mib_every_1000_steps"][-1][1]
        print(f"{name:<17} RSS +{growth:.1f} MiB after {args.steps} steps; " + ", ".join(details))
    result = {
        "what": (
            f"{args.steps} steps (forward+backward) of an MLP 8-16-4, batch 32, DataParallel on "
            "4 virtual CPU lanes; RSS growth in MiB from after 50 warm-up steps"
        ),
        "before": (
            "issue 18, before this change: 10,000 traced steps grew RSS by 144 MB (97 MB of "
            "event objects, held after the trace was dropped); Chrome export 2.85 s for 63 MB"
        ),
        "goal": "bounded: RSS flat within 20 MB over 10,000 traced steps",
        "runs": results,
        "steps": args.steps,
        "load_average_at_start": load_start,
        "load_average_at_end": os.getloadavg(),
        "machine": machine(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
