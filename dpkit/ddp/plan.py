"""Which engine for this model, batch and machine? A prediction for each, and the choice.

    python -m dpkit.ddp.plan --model wide-mlp --hardware 8xA100-SXM-NVLink --batch 256
    from dpkit.ddp.plan import plan
    print(plan(model, sample, batch=256, devices=8, hardware="8xA100-SXM-NVLink"))

Every number is **predicted**: DataParallel and DDP by :func:`dpkit.cost.predict` (the
course's cost model: FLOPs, bytes, links, each device's memory by category); the others
derived from DDP's prediction with the ZeRO paper's arithmetic (Rajbhandari et al. 2020),
their assumptions stated in each row's ``how``:

- **ZeRO-1** (``ZeroRedundancyOptimizer``): the optimizer state split over the ``n``
  devices; the step DDP's plus an all-gather of the updated parameters (half a ring
  all-reduce's time).
- **FSDP** (``fully_shard``, ZeRO-3): parameters, gradients and state split over the ``n``
  devices, plus the largest layer gathered whole while it runs; no buckets; the step DDP's
  plus one more all-gather of the parameters (its traffic is 1.5 times DDP's), overlap
  not modelled.
- **pipeline** (GPipe, ``m = 4n`` micro-batches): each device a ``1/n`` slice of the
  layers with its parameters, gradients and state, and ``1/n`` of the activations; the
  step ``m + n - 1`` times one micro-batch's step on one device over ``n`` stages (the
  bubble included); the sends between stages left out. Not for fewer layers (modules with
  parameters of their own) than devices: a stage holds one at least.

Every prediction assumes Adam unless told otherwise (``optimizer=``): its state is what
ZeRO-1 shards. (``dpkit predict`` defaults to SGD, as torch's examples do.)
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Any

from torch import nn

import dpkit.cost as cost
from dpkit.table import Table

STRATEGIES = ("DataParallel", "DDP", "ZeRO-1", "FSDP", "pipeline")
PREFERENCE = ("DDP", "ZeRO-1", "FSDP", "pipeline", "DataParallel")  # simplest first
SWITCH = 2.0  # how much faster a predicted step must be to leave the simplest engine
SHARED = ("parameters", "gradients", "optimizer")  # what sharding divides


def _largest_layer_bytes(model: nn.Module) -> int:
    return max(
        (sum(p.numel() * p.element_size() for p in m.parameters(recurse=False))
         for m in model.modules()),
        default=0,
    )  # fmt: skip


def _layers(model: nn.Module) -> int:
    """Modules with parameters of their own: what a pipeline cuts into stages, one at least
    per stage."""
    return sum(next(m.parameters(recurse=False), None) is not None for m in model.modules())


def device_memory(machine: cost.Hardware, devices: int) -> float:
    """The bytes one of ``devices`` devices may hold: its own memory, or, for lanes of one
    machine, their share of the host's (``dpkit predict``'s check)."""
    return machine.memory_capacity / devices if machine.virtual_lanes else machine.memory_capacity


def plan(
    model: nn.Module,
    sample: Any,
    batch: int,
    devices: int,
    hardware: cost.Hardware | str,
    optimizer: str = "adam",
) -> Table:
    """One row per strategy: predicted bytes on the fullest device, whether that fits the
    hardware's memory, the predicted step time (ms), and how the numbers were made."""
    machine = cost.preset(hardware) if isinstance(hardware, str) else hardware
    n = devices
    one_node = n <= machine.devices_per_node  # DataParallel: one process, one machine
    if one_node:
        dp = cost.predict(model, sample, batch, n, machine, strategy="dp", optimizer=optimizer)
    ddp = cost.predict(model, sample, batch, n, machine, strategy="ddp", optimizer=optimizer)
    one = cost.predict(model, sample, batch, 1, machine, strategy="ddp", optimizer=optimizer)
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    gather = cost.allreduce(parameter_bytes, n, machine) / 2  # a ring all-gather: half
    held = ddp.held[0]
    zero1 = dict(held, optimizer=held.get("optimizer", 0) // n)
    fsdp = {k: (v // n if k in SHARED else v) for k, v in held.items() if k != "buckets"}
    fsdp["gathered layer"] = _largest_layer_bytes(model)
    single = one.held[0]
    stage = {k: (v // n if k in (*SHARED, "activations") else v) for k, v in single.items()}
    stage.pop("buckets", None)
    micro = max(1, min(4 * n, batch))
    # a micro-batch's step on one device, over n stages, m + n - 1 times (GPipe's schedule):
    # small micro-batches run matrix products less efficiently, which the cost model sees
    one_micro = cost.predict(
        model, sample, max(1, batch // micro), 1, machine, strategy="ddp", optimizer=optimizer
    )
    rows = [
        ("DataParallel", max(dp.memory_per_device), dp.step_time, "dpkit.cost.predict, 'dp'")
        if one_node
        else ("DataParallel", 0, math.inf, f"one machine only ({machine.devices_per_node})"),
        ("DDP", max(ddp.memory_per_device), ddp.step_time, "dpkit.cost.predict, 'ddp'"),
        ("ZeRO-1", sum(zero1.values()), ddp.step_time + gather,
         "DDP, state / n; + an all-gather"),
        ("FSDP", sum(fsdp.values()), ddp.step_time + gather,
         "DDP, all / n + a layer; + an all-gather"),
        ("pipeline", sum(stage.values()), one_micro.step_time / n * (micro + n - 1),
         f"a micro-batch's step / n x (m + n - 1), m={micro}; sends left out")
        if _layers(model) >= n  # a stage holds a layer at least
        else ("pipeline", 0, math.inf, f"{_layers(model)} layers for {n} stages"),
    ]  # fmt: skip
    if n == 1:  # torch's DataParallel calls the module itself; the others share out nothing
        rows = [rows[0][:3] + ("one device: the module as it is, no wrapper",)] + [
            (row[0], 0, math.inf, "one device: nothing to share out") for row in rows[1:]
        ]
    capacity = device_memory(machine, n)
    table = Table()
    for strategy, nbytes, seconds, how in rows:
        table.append(
            {
                "strategy": strategy,
                "predicted bytes/device": int(nbytes),
                "fits": nbytes <= capacity and math.isfinite(seconds),
                "predicted step ms": seconds * 1e3,
                "how": how,
            }
        )
    return table


def choose(rows: Table, memory_capacity: float) -> str:
    """The choice among ``rows`` (from :func:`plan`) for devices of ``memory_capacity``
    bytes (:func:`device_memory`: on lanes, their share of the host's), with its reasons: the
    simplest engine that fits (DDP, then ZeRO-1, FSDP, a pipeline: each adds communication
    or a bubble), unless another that fits is predicted at least :data:`SWITCH` times
    faster, enough to outweigh what the predictions leave out (the pipeline's sends, FSDP's
    overlap); on one device, no wrapper."""
    fitting = [
        r
        for r in rows
        if r["predicted bytes/device"] <= memory_capacity and math.isfinite(r["predicted step ms"])
    ]
    if not fitting:
        smallest = min(rows, key=lambda r: r["predicted bytes/device"] or math.inf)
        return (
            f"nothing fits {memory_capacity / 2**30:.1f} GiB a device: the smallest is "
            f"{smallest['strategy']} at {smallest['predicted bytes/device'] / 2**30:.3g} GiB; "
            "add devices, shard further (FSDP with a pipeline), or shrink the batch "
            "(activations) or the optimizer state"
        )
    simplest = min(fitting, key=lambda r: PREFERENCE.index(r["strategy"]))
    fastest = min(fitting, key=lambda r: r["predicted step ms"])
    gain = simplest["predicted step ms"] / fastest["predicted step ms"]
    # three significant digits: a small model's 5 MB is 0.00493 GiB, not "0.00"
    size = f"{simplest['predicted bytes/device'] / 2**30:.3g} of {memory_capacity / 2**30:.1f} GiB"
    if simplest.get("how", "").startswith("one device"):
        return (f"no wrapper: one device trains the model as it is ({size}); DataParallel "
                "would call it directly, and the others have nothing to share out")  # fmt: skip
    if fastest is not simplest and gain >= SWITCH:
        reasons = (
            f"{fastest['strategy']}: it fits and is predicted {gain:.1f}x faster than "
            f"{simplest['strategy']}, the simplest engine that fits ({size} a device): more "
            f"than the {SWITCH:g}x needed to outweigh what its prediction leaves out"
        )
    else:
        reasons = f"{simplest['strategy']}: the simplest engine that fits ({size} a device)"
        if fastest is not simplest:
            reasons += (
                f"; {fastest['strategy']} is predicted only {gain:.2f}x faster, less than "
                f"the {SWITCH:g}x needed to outweigh what its prediction leaves out"
            )
    left_out = [r["strategy"] for r in rows if r not in fitting]
    if left_out:
        reasons += f"; {', '.join(left_out)}: would not fit, or cannot run here"
    return reasons


DESCRIPTION = (
    "Predict memory per device and step time of DataParallel, DDP, ZeRO-1, FSDP and a "
    "pipeline split for a model, batch and machine, and pick one (every number predicted, "
    "Adam by default)."
)


def _preset(name: str) -> cost.Hardware:
    """An argparse type: the preset ``name`` names, in any case (argparse names the option)."""
    try:
        return cost.preset(name)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("hardware=")) from None


def _arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    from dpkit.cli_types import at_least_one
    from dpkit.models import PREDICTION_MODELS

    parser.add_argument("--model", default="wide-mlp", choices=PREDICTION_MODELS,
                        help="a model of dpkit.models, default: wide-mlp")  # fmt: skip
    parser.add_argument("--hardware", type=_preset, default=None, metavar="PRESET",
                        help="a preset, any case (dpkit predict --list), default: "
                        "8xA100-SXM-NVLink")  # fmt: skip
    parser.add_argument("--hardware-file", default=None, metavar="FILE.toml",
                        help="your machine, as dpkit predict reads it (docs/hardware_file.md)"
                        )  # fmt: skip
    parser.add_argument("--optimizer", default="adam", choices=("sgd", "adam"),
                        help="its state is what ZeRO-1 shards, default: adam")  # fmt: skip
    parser.add_argument("--batch", type=at_least_one, default=256,
                        help="global batch, default: 256")  # fmt: skip
    parser.add_argument("--devices", type=at_least_one, default=None,
                        help="default: all of the preset's")  # fmt: skip
    parser.set_defaults(run=_run)
    return parser


def _run(args: argparse.Namespace) -> int:
    from dpkit import models
    from dpkit.cli_types import in_flags

    if args.hardware is not None and args.hardware_file is not None:
        raise ValueError("--hardware and --hardware-file name two machines: give one")
    if args.hardware_file is not None:
        from dpkit.cost.cli import load_hardware_file

        machine = load_hardware_file(args.hardware_file)
    else:
        machine = args.hardware or cost.preset("8xA100-SXM-NVLink")
    model, sample = models.build_model(args.model, seed=0), models.sample_input()
    devices = args.devices or machine.devices_per_node * machine.nodes
    try:
        rows = plan(model, sample, args.batch, devices, machine, args.optimizer)
    except ValueError as error:  # in the words of the flags typed
        flags = {"batch_size": "--batch", "devices": "--devices"}
        raise ValueError(in_flags(str(error), flags)) from None
    optimizer = {"adam": "Adam", "sgd": "SGD"}[args.optimizer]
    print(f"{args.model} on {devices} x {machine.device_name}, global batch {args.batch} "
          f"(every number predicted by dpkit.cost, with {optimizer}):")  # fmt: skip
    print(rows)
    print("choice: " + choose(rows, device_memory(machine, devices)))
    return 0


def add_plan_command(commands: Any) -> None:
    """``dpkit plan``: the subcommand of the dpkit command line."""
    help = "which engine for a model, batch and machine (predicted memory and time)"
    _arguments(commands.add_parser("plan", help=help, description=DESCRIPTION))


def main(argv: Sequence[str] | None = None) -> int:
    parser = _arguments(argparse.ArgumentParser(prog="python -m dpkit.ddp.plan",
                                                description=DESCRIPTION))  # fmt: skip
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
