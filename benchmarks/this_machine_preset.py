"""The ``this-machine`` preset, checked: how close its uncalibrated predictions come to measured
steps, beside what ``calibrate()`` measures here now.

    .venv/bin/python -m benchmarks.this_machine_preset             # ~4 minutes on 2 cores
    .venv/bin/python -m benchmarks.this_machine_preset --runs 3    # fewer calibrations

``dpkit predict --hardware this-machine`` without ``--calibrate`` predicts with
``dpkit.cost.catalog.this_machine_default``: rates and host terms, no per-op curves. This
script records

- ``--runs`` full ``dpkit.cost.calibrate()`` runs (4 virtual CPU lanes, one torch thread
  each): every term's median, smallest and largest value, so the preset's terms can be read
  beside what this machine measures (the host terms are fitted together with the op curves,
  and move between runs on a shared machine: `cost_accuracy.md` saw ``gil_handoff`` 8-26 us);
- the step times of ``benchmarks.cost_accuracy``'s grid (course and held-out models, 1, 2
  and 4 lanes, batches 32-1024, untraced, the fastest of 6 steps), predicted by the preset
  as shipped, by the terms' medians without op curves, and by the last calibration with its
  op curves: each one's median step error on the course models and on the held-out ones.

Writes ``benchmarks/results/this_machine_preset.json`` with the load average before and
after each part (a loaded machine measures slower terms and slower steps).
"""

from __future__ import annotations

import os

for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # before torch starts its thread pools
    os.environ.setdefault(_variable, "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from benchmarks import cost_accuracy  # noqa: E402
from benchmarks.machine import machine  # noqa: E402
from dpkit import cost  # noqa: E402
from dpkit.cost.catalog import this_machine_default  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "this_machine_preset.json"

# The terms calibrate() measures or fits: seconds, FLOP/s, bytes/s, or cores.
TERMS = (
    "op_overhead", "backward_op_overhead", "gil_handoff", "copy_overhead", "step_overhead",
    "thread_start", "module_overhead", "compute_units", "memory_bandwidth",
)  # fmt: skip


def terms_of(hardware: cost.Hardware) -> dict[str, float]:
    measured = {name: float(getattr(hardware, name)) for name in TERMS}
    measured["peak_flops_float32"] = float(hardware.peak_flops["float32"])
    measured["link_bandwidth"] = float(hardware.device_to_device.bandwidth)
    measured["link_latency"] = float(hardware.device_to_device.latency)
    return measured


def with_terms(hardware: cost.Hardware, terms: dict[str, float]) -> cost.Hardware:
    """``hardware`` with ``terms`` (as :func:`terms_of` names them) and no op curves."""
    link = dataclasses.replace(
        hardware.device_to_device,
        bandwidth=terms["link_bandwidth"],
        latency=terms["link_latency"],
    )
    return dataclasses.replace(
        hardware,
        **{name: terms[name] for name in TERMS},
        peak_flops={"float32": terms["peak_flops_float32"]},
        host_to_device=link, device_to_device=link, node_to_node=link, op_seconds={},
    )  # fmt: skip


def step_errors(configs: list[cost_accuracy.Config], hardware: cost.Hardware) -> dict:
    """The median |step error| per set of models, and the signed median (negative: under)."""
    compared = cost_accuracy.compare(configs, hardware)
    return {
        name: {
            "median_abs_error": compared[name]["step_time"]["median_abs_error"],
            "median_signed_error": compared[name]["step_time"]["median_signed_error"],
            "worst_abs_error": compared[name]["step_time"]["worst_abs_error"],
        }
        for name in cost_accuracy.SETS
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="full calibrations (default 5)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    loads = {"start": os.getloadavg()}
    runs, last = [], None
    for run in range(args.runs):
        started = time.perf_counter()
        last = cost.calibrate(4, progress=False)
        runs.append(terms_of(last))
        print(f"calibration {run + 1}/{args.runs}: {time.perf_counter() - started:.0f} s")
    loads["after_calibrations"] = os.getloadavg()
    spread = {
        name: {
            "median": statistics.median(run[name] for run in runs),
            "min": min(run[name] for run in runs),
            "max": max(run[name] for run in runs),
        }
        for name in runs[0]
    }
    names = [model for models in cost_accuracy.SETS.values() for model in models]
    configs = [
        cost_accuracy.Config(model, lanes, batch)
        for model in names
        for lanes in cost_accuracy.LANES
        for batch in cost_accuracy.BATCHES
    ]
    cost_accuracy.measure(configs, repeats=6, seed=0)
    loads["after_steps"] = os.getloadavg()
    preset = this_machine_default()
    medians = with_terms(preset, {name: values["median"] for name, values in spread.items()})
    predictions = {
        "preset as shipped (no op curves)": step_errors(configs, preset),
        "calibrated terms' medians, no op curves": step_errors(configs, medians),
        "last calibration, with its op curves": step_errors(configs, last),
    }
    RESULTS.write_text(json.dumps({
        "machine": machine(omp_num_threads=os.environ.get("OMP_NUM_THREADS")),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "load_average": loads,
        "preset": terms_of(preset),
        "calibrations": {"lanes": 4, "runs": len(runs), "spread": spread, "each": runs},
        "step_errors": predictions,
    }, indent=2) + "\n")  # fmt: skip
    print(f"{'term':22} {'preset':>10} {'calibrated median (min-max)':>36}")
    for name, values in spread.items():
        shipped = terms_of(preset)[name]
        print(f"{name:22} {shipped:10.4g} {values['median']:12.4g} "
              f"({values['min']:.4g}-{values['max']:.4g})")  # fmt: skip
    for label, errors in predictions.items():
        shown = ", ".join(
            f"{name} {e['median_abs_error']:.0%} (signed {e['median_signed_error']:+.0%})"
            for name, e in errors.items()
        )
        print(f"median step error, {label}: {shown}")
    print(f"load average {loads}; wrote {RESULTS}")


if __name__ == "__main__":
    main()
