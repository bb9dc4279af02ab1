"""What tracing costs in CPU instructions: the same step as trace_overhead, counted by callgrind.

    .venv/bin/python -m benchmarks.trace_instructions            # ~8 minutes; needs valgrind

Wall-clock ratios on a shared machine move by a few percent from one run to the next (other
tenants, CPU steal). Instructions retired do not: the counts below repeat to within 0.1%.
They are a different measure from time (a Python bytecode costs more time per instruction
than a matrix multiply), so they say where the trace's work goes and whether a change
reduced it, while ``trace_overhead`` says what it costs in time.

The script starts itself under ``valgrind --tool=callgrind`` with counting off, runs a few
untimed steps, then counts ``--steps`` steps per configuration, each between
``callgrind_control`` zero and dump calls. Workers run one after another in the calling
thread (valgrind runs one thread at a time anyway) and torch uses one thread.

Configurations: ``off`` (no trace), ``on`` (inside ``dpkit.trace()``), and two with a part of
the trace switched off, which show where its instructions go: ``no-replica-walk``
(``tracing.backward.trace_replica`` does nothing: no activations, no backward events) and
``no-spans`` (``tracing.span``, ``copy_span`` and ``host_span`` return the no-op). Results go to
``benchmarks/results/trace_instructions.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks.machine import machine

RESULTS = Path(__file__).resolve().parent / "results" / "trace_instructions.json"
CONFIGURATIONS = ("off", "on", "no-replica-walk", "no-spans")
_CHILD_FLAG = "--inside-callgrind"


@contextlib.contextmanager
def _replaced(owner: Any, name: str, value: Any) -> Iterator[None]:
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


def _configuration(name: str) -> contextlib.ExitStack:
    import dpkit
    from dpkit import tracing

    stack = contextlib.ExitStack()
    if name == "off":
        return stack
    if name == "no-replica-walk":  # after_apply calls it by its name in tracing.backward
        stack.enter_context(_replaced(tracing.backward, "trace_replica", lambda *args: None))
    if name == "no-spans":
        for entry in ("span", "copy_span", "host_span"):
            off = tracing.recorder.OFF
            stack.enter_context(_replaced(tracing, entry, lambda *args, off=off, **kwargs: off))
    stack.enter_context(dpkit.trace())
    return stack


class _InlineThread:
    """A thread that runs its target when started, in the starting thread, and is then done."""

    def __init__(self, target: Callable[..., Any], args: tuple = (), daemon: bool = False):
        self._target, self._args = target, args

    def start(self) -> None:
        self._target(*self._args)

    def is_alive(self) -> bool:
        return False

    def join(self, timeout: float | None = None) -> None:
        pass


def _count_inside_callgrind(steps: int, devices: int, batch: int) -> None:
    """Runs under callgrind: count each configuration's steps into its own dump."""
    import torch

    from benchmarks.trace_overhead import make_step

    torch.set_num_threads(1)
    parallel_apply = importlib.import_module("dpkit.parallel_apply")
    # the replicas one after another in this thread (callgrind counts the thread it follows)
    parallel_apply.threading = types.SimpleNamespace(
        Thread=_InlineThread, Lock=threading.Lock, TIMEOUT_MAX=threading.TIMEOUT_MAX
    )
    step: Callable[[], None] = make_step(devices, batch)
    for _ in range(3):  # warm up every path (first calls build caches)
        for name in CONFIGURATIONS:
            with _configuration(name):
                step()

    def control(*args: str) -> None:
        command = ["callgrind_control", *args, str(os.getpid())]
        subprocess.run(command, check=True, capture_output=True)

    for name in CONFIGURATIONS:
        control("--zero")
        control("--instr=on")
        for _ in range(steps):
            with _configuration(name):
                step()
        control("--instr=off")
        control(f"--dump={name}")


def _totals(folder: Path, steps: int) -> dict[str, float]:
    """Instructions per step of each configuration, read from callgrind's dump files."""
    per_step = {}
    for dump in folder.glob("callgrind.out.*"):
        text = dump.read_text(errors="replace")
        trigger = re.search(r"^desc: Trigger: dump (\S+)", text, re.M)  # from --dump=<name>
        total = re.search(r"^totals: (\d+)", text, re.M)
        if trigger and total:
            per_step[trigger.group(1)] = int(total.group(1)) / steps
    return per_step


def count(steps: int, devices: int, batch: int) -> dict[str, float]:
    """Run this script under callgrind and return instructions per step per configuration."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("trace_instructions needs valgrind (Debian: apt-get install valgrind)")
    with tempfile.TemporaryDirectory() as folder:
        command = [
            "valgrind", "--tool=callgrind", "--instr-atstart=no",
            f"--callgrind-out-file={folder}/callgrind.out.%p",
            sys.executable, "-m", "benchmarks.trace_instructions", _CHILD_FLAG,
            "--steps", str(steps), "--devices", str(devices), "--batch", str(batch),
        ]  # fmt: skip
        subprocess.run(command, check=True, capture_output=True)
        per_step = _totals(Path(folder), steps)
    missing = [name for name in CONFIGURATIONS if name not in per_step]
    if missing:
        sys.exit(f"callgrind wrote no counts for {', '.join(missing)}")
    return per_step


def summarise(per_step: dict[str, float], args: argparse.Namespace) -> dict[str, Any]:
    off, on = per_step["off"], per_step["on"]
    return {
        "what": (
            f"CPU instructions per DataParallel training step (MLP 784-256-128-10, batch "
            f"{args.batch}, {args.devices} virtual CPU lanes run one after another, 1 torch "
            "thread), counted by callgrind"
        ),
        "instructions_per_step": {name: per_step[name] for name in CONFIGURATIONS},
        "on/off": on / off,
        "trace_instructions_per_step": on - off,
        "share_of_the_trace": {
            "replica walk (activations, backward hooks)": (on - per_step["no-replica-walk"])
            / (on - off),
            "spans (phase events, bytes)": (on - per_step["no-spans"]) / (on - off),
        },
        "steps": args.steps,
        "machine": machine(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=5, help="counted steps per configuration")
    parser.add_argument("--devices", type=int, default=4, help="virtual CPU lanes (default 4)")
    parser.add_argument("--batch", type=int, default=256, help="batch size (default 256)")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"JSON file (default {RESULTS})")
    parser.add_argument(_CHILD_FLAG, action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside_callgrind:
        _count_inside_callgrind(args.steps, args.devices, args.batch)
        return

    print("running under callgrind (about 8 minutes: importing torch is slow there) ...")
    result = summarise(count(args.steps, args.devices, args.batch), args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for name, instructions in result["instructions_per_step"].items():
        print(f"{name:<16} {instructions / 1e6:8.3f} M instructions per step")
    added = result["trace_instructions_per_step"]
    print(f"\non/off {result['on/off']:.4f}; the trace adds {added / 1e6:.3f} M per step")
    for part, share in result["share_of_the_trace"].items():
        print(f"  {part}: {share:.0%}")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
