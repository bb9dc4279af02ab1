"""The ``dpkit`` command (also ``python -m dpkit``).

dpkit devices            what hardware is here and which kind of device dpkit uses
dpkit devices -n 2 -n 8  the same, for chosen device counts
dpkit check              is this environment ready for the course? (exit 1 if not)
dpkit demo               a few traced training steps: summaries, timeline.png, memory.png,
                         trace.json (--model mlp | cnn | transformer)
dpkit ddp                the same under torch's DistributedDataParallel, a process per rank
                         (--nproc N, --bucket-mb M; see dpkit.ddp)
dpkit predict            the cost model: a step predicted on hardware you may not have
                         (see dpkit.cost)
dpkit plan               which engine (DataParallel, DDP, ZeRO-1, FSDP, a pipeline) for a
                         model, batch and machine: predicted memory and time (dpkit.ddp.plan)
dpkit grade N            grade exercise N (see exercises/README.md)
dpkit course DIR         write the notebooks and exercises into DIR (after a pip install)
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
from collections.abc import Sequence

import torch

from dpkit.cli_types import at_least_one, plural, writable_folder
from dpkit.cost.cli import add_predict_command
from dpkit.ddp.command import add_ddp_command
from dpkit.ddp.plan import add_plan_command
from dpkit.ddp.workload import MODELS
from dpkit.device import accelerator_count, accelerator_type
from dpkit.environment import describe_choice
from dpkit.grading import add_grade_command


def hardware_report(counts: Sequence[int]) -> str:
    """What ``dpkit devices`` prints: the hardware present and what devices(n) picks."""
    kind = accelerator_type()
    count = accelerator_count()
    lines = [
        f"python {platform.python_version()}, torch {torch.__version__}",
        f"CPU: {torch.get_num_threads()} intra-op threads",
    ]
    if kind is None:
        lines.append("accelerators: none (dpkit uses virtual lanes on the CPU)")
    else:
        module = torch.get_device_module(kind)
        names = [module.get_device_name(i) for i in range(count)]
        lines.append(f"accelerators: {count} x {kind}: " + ", ".join(names))
    lines.append("")
    lines.extend(describe_choice(n) for n in counts)
    return "\n".join(lines)


def _devices_command(args: argparse.Namespace) -> int:
    print(hardware_report(args.n or [1, 2, 4, 8]))
    return 0


def _demo_command(args: argparse.Namespace) -> int:
    from dpkit import demo

    result = demo.run_demo(args.devices, args.batch, args.model, args.steps, args.out)
    print(demo.report(result, args.devices, args.batch, args.model, args.steps))
    return 0


def _check_command(args: argparse.Namespace) -> int:
    from dpkit.environment import check_environment

    return 0 if check_environment().ok else 1


def _course_command(args: argparse.Namespace) -> int:
    from dpkit.course import write_course

    folder = writable_folder(args.folder, "FOLDER", "dpkit course my-course")
    try:
        written = write_course(folder, overwrite=args.overwrite)
    except ValueError as error:  # what is in the folder: its messages start with the folder
        raise ValueError(f"FOLDER {error}") from None
    notebooks = plural(sum(path.suffix == ".ipynb" for path in written), "notebook")
    print(f"wrote {plural(len(written), 'file')} into {args.folder}: {notebooks} and the exercises")
    print(f"next: cd {shlex.quote(args.folder)} && jupyter lab notebooks/00_start_here.ipynb")
    print("      (dpkit grade 1 in that folder grades exercise 1)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dpkit", description="Data parallelism in PyTorch, on real or virtual devices."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    devices = commands.add_parser(
        "devices", help="show the hardware and which kind of device dpkit uses for N devices"
    )
    devices.add_argument(
        "-n", type=int, action="append", metavar="N", help="a device count (repeatable)"
    )
    devices.set_defaults(run=_devices_command)
    demo = commands.add_parser(
        "demo",
        help="train a tiny model for a few traced steps; print the summaries, write a timeline, "
        "a memory figure and a Chrome trace",
        description="Train a tiny model on random 1x28x28 images for a few SGD steps with "
        "dpkit.DataParallel, traced: print the devices used and the time and bytes of every "
        "phase and the bytes each device held, write timeline.png and memory.png (the last "
        "step) and trace.json (open it in https://ui.perfetto.dev or chrome://tracing).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    demo.add_argument("--devices", type=at_least_one, default=4, help="number of devices")
    demo.add_argument("--batch", type=at_least_one, default=256, help="batch size per step")
    demo.add_argument("--model", choices=MODELS, default="mlp", help="model on 1x28x28")
    demo.add_argument("--steps", type=at_least_one, default=3, help="training steps to trace")
    demo.add_argument("--out", default=".", help="folder for the figures and trace.json")
    demo.set_defaults(run=_demo_command)
    check = commands.add_parser(
        "check",
        help="is this environment ready for the course? a line per item (exit 1 if not)",
        description="Check Python, torch, the devices dpkit will use and the widget stack "
        "(JupyterLab, the classic Notebook or Colab): the same check notebook 00 runs first.",
    )
    check.set_defaults(run=_check_command)
    course = commands.add_parser(
        "course",
        help="write the course's notebooks and exercises into a folder (after pip install)",
        description="Copy the notebooks and the exercises (stubs, graders; no solutions) "
        "shipped with dpkit into FOLDER, so the course runs without git: then "
        "`cd FOLDER && jupyter lab notebooks/00_start_here.ipynb`.",
    )
    course.add_argument("folder", metavar="FOLDER", help="where to write them (made if missing)")
    course.add_argument(
        "--overwrite", action="store_true", help="replace files already there (edits are lost)"
    )
    course.set_defaults(run=_course_command)
    add_grade_command(commands)
    add_ddp_command(commands)
    add_predict_command(commands)
    add_plan_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from dpkit.placement_check import enable_from_environment

    enable_from_environment()  # DPKIT_CHECK_PLACEMENT=1: the tests' placement check
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    try:
        return args.run(args)
    except BrokenPipeError:
        # The reader of the output went away (`dpkit demo | head`): stop quietly, as `cat`
        # does. Python would complain again when it flushes stdout at exit, so stdout goes
        # to /dev/null first (the recipe in Python's signal module documentation).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE: what a shell reports for a command its pipe stopped
    except (ValueError, TypeError, RuntimeError, OSError) as error:
        # torch reports device problems as RuntimeError, and a path the user named that
        # cannot be read or written is an OSError; a learner needs the message, not a
        # traceback (DPKIT_DEBUG=1 shows it).
        if os.environ.get("DPKIT_DEBUG"):
            raise
        print(f"dpkit: error: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: what was started has been stopped on the way out
        if os.environ.get("DPKIT_DEBUG"):
            raise
        print("dpkit: interrupted", file=sys.stderr)
        return 130  # a shell's status for SIGINT
