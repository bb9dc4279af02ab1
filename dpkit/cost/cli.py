"""``dpkit predict``: a predicted training step on a named machine, printed and drawn like
``dpkit demo`` prints and draws a measured one, every output labelled predicted.

    dpkit predict --list                                   the machines, one per line
    dpkit predict --hardware 8xA100-SXM-NVLink --devices 8 --batch 512 --model cnn
    dpkit predict --hardware 2x8xA100-10GbE --devices 16 --batch 4096 --strategy ddp --out /tmp/p
    dpkit predict --hardware this-machine --calibrate      measure this machine first (~2 s)
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from dpkit.cli_types import at_least_one
from dpkit.cost.hardware import Hardware
from dpkit.cost.models import MODEL_NAMES, course_model, sample_input
from dpkit.cost.predict import STRATEGIES, PredictedTrace, predict
from dpkit.cost.presets import preset, presets


def list_presets() -> str:
    """What ``dpkit predict --list`` prints: a line per machine, its name first."""
    return "\n".join(hardware.summary() for hardware in presets().values())


def report(trace: PredictedTrace, model: str, files: dict[str, Path | None]) -> str:
    """What ``dpkit predict`` prints: the machine, the per-phase and memory summaries (the
    same tables ``dpkit demo`` prints), the predicted step time and where the files are."""
    machine = trace.machine
    lines = [
        f"PREDICTED by dpkit's cost model, not measured: {machine.name}",
        f"  {machine.description}",
        f"  numbers from: {machine.source}",
        f"model {model}, batch {trace.batch_size} (1x28x28 images), {trace.device_count} "
        f"device(s), strategy {trace.strategy}",
        "",
        f"per phase, per step — {trace.hardware}:",
        str(trace.summary()),
        "",
        "memory per device (counted: the sum of the categories), predicted:",
        str(trace.memory_summary()),
        "",
        f"predicted step time: {trace.step_time * 1e3:.3f} ms",
    ]
    for what, path in files.items():
        lines.append(f"{what + ':':<22}{path if path is not None else 'skipped (no matplotlib)'}")
    lines.append("  open trace.json at https://ui.perfetto.dev: a track per predicted device.")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.list:
        print(list_presets())
        return 0
    hardware: Hardware
    if args.calibrate:
        if args.hardware.lower() != "this-machine":
            raise ValueError("--calibrate measures this machine: use --hardware this-machine")
        from dpkit.cost.calibrate import calibrate

        hardware = calibrate(quick=True, progress=True)
    else:
        hardware = preset(args.hardware)
    trace = predict(
        course_model(args.model), sample_input(), args.batch, args.devices, hardware,
        strategy=args.strategy,
    )  # fmt: skip
    out = Path(args.out).resolve()
    files: dict[str, Path | None] = {"Chrome trace": trace.to_chrome_trace(out / "trace.json")}
    try:
        from dpkit import viz
    except ImportError:
        files.update({"timeline": None, "memory": None})
    else:
        files["timeline"] = out / "timeline.png"
        viz.timeline(trace).savefig(files["timeline"], dpi=120)
        files["memory"] = out / "memory.png"
        viz.memory_per_device(trace).savefig(files["memory"], dpi=120)
    print(report(trace, args.model, files))
    return 0


def add_predict_command(commands: Any) -> None:
    """Add ``dpkit predict`` to the subparsers ``commands`` of dpkit's command line."""
    parser = commands.add_parser(
        "predict",
        help="predict a training step on a named machine (cost model): summaries, a timeline "
        "and a Chrome trace, labelled predicted",
        description="Predict one training step of a course model with DataParallel (dp) or "
        "DistributedDataParallel (ddp) on a machine you may not have, with dpkit's cost "
        "model: print the time and bytes of every phase and the bytes each device holds, "
        "write timeline.png, memory.png and trace.json. Every output says predicted.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--list", action="store_true", help="list the machines and exit")
    parser.add_argument("--hardware", default="8xA100-SXM-NVLink", help="a name from --list")
    parser.add_argument(
        "--calibrate", action="store_true", help="with --hardware this-machine: measure it first"
    )
    parser.add_argument("--devices", type=at_least_one, default=8, help="number of devices")
    parser.add_argument("--batch", type=at_least_one, default=256, help="batch size per step")
    parser.add_argument("--model", choices=MODEL_NAMES, default="mlp", help="course model")
    parser.add_argument("--strategy", choices=STRATEGIES, default="dp", help="dp or ddp")
    parser.add_argument("--out", default=".", help="folder for the figures and trace.json")
    parser.set_defaults(run=run)
