"""The ``dpkit`` command (also ``python -m dpkit``).

dpkit devices            what hardware is here and which kind of device dpkit uses
dpkit devices -n 2 -n 8  the same, for chosen device counts
"""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Sequence

import torch

from dpkit.devices import accelerator_count, accelerator_type, describe_choice


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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    try:
        return args.run(args)
    except (ValueError, TypeError) as error:
        print(f"dpkit: error: {error}", file=sys.stderr)
        return 2
