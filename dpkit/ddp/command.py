"""``dpkit ddp``: a few traced DistributedDataParallel steps on N processes, like ``dpkit demo``.

    dpkit ddp                                   2 ranks (gloo on the CPU), batch 64, MLP
    dpkit ddp --nproc 4 --model transformer --bucket-mb 0.1 --out /tmp/ddp
    dpkit ddp --nnodes 2 --nproc 2 --out /tmp/nodes   2 "nodes" of 2 ranks, a torchrun each

It prints the ranks' per-phase summary and memory, and writes the merged ``trace.json``
(every rank a track), ``timeline.png`` and ``memory.png`` (the last step) into ``--out``.
With ``--nnodes`` above 1 there is no memory table or ``memory.png``: the nodes' ranks
(``python -m dpkit.ddp.train``) write only ``trace.json``, which holds no memory records.

Its errors name its flags (``--nproc 64``), not the Python arguments of
:func:`dpkit.ddp.run_ddp` that its checks name (``nproc=64``).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from dpkit import cli_types
from dpkit.cli_types import (
    DefaultsHelpFormatter,
    at_least_one,
    more_than_zero,
    plural,
    writable_folder,
)
from dpkit.ddp import checks
from dpkit.ddp.workload import random_images
from dpkit.models import DDP_MODELS
from dpkit.tracing.export import gaps_note


def write_figures(trace: Any, out: Path) -> tuple[Path | None, Path | None]:
    """``timeline.png`` and ``memory.png`` of ``trace`` in ``out`` (None, None without
    matplotlib)."""
    try:
        from dpkit import viz
    except ImportError:
        return None, None
    timeline_path, memory_path = out / "timeline.png", out / "memory.png"
    viz.timeline(trace).savefig(timeline_path, dpi=120)
    viz.memory_per_device(trace).savefig(memory_path, dpi=120)
    return timeline_path, memory_path


def steady_summary(trace: Any) -> str:
    """The per-phase table of the steps after the first, under a title that says so: step 1
    holds DDP's constructor (rank 0's parameters broadcast, once) and the warm-up, which
    averaged in would read as every step's work. With one step, that step."""
    from dpkit.tracing.export import summary

    steps = sorted({e.step for e in trace.events})
    if len(steps) < 2:
        return f"per phase, mean per step — {trace.hardware}:\n{trace.summary()}"
    later = [e for e in trace.events if e.step != steps[0]]
    first = [e for e in trace.events if e.step == steps[0]]
    first_ms = 1e3 * (max(e.end for e in first) - min(e.start for e in first))
    over = f"steps {steps[1]}-{steps[-1]}" if len(steps) > 2 else f"step {steps[1]}"
    return (
        f"per phase, mean per step over {over} — {trace.hardware}\n"
        f"(step {steps[0]}, {first_ms:.1f} ms, left out: DDP's constructor broadcasts rank 0's "
        f"parameters once, and the first step warms up):\n{summary(later)}"
    )


def report(result: Any, model: str, paths: tuple[Path, Path | None, Path | None]) -> str:
    """What ``dpkit ddp`` prints: the setup, the bytes, the summaries, where the files are."""
    trace_path, timeline_path, memory_path = paths
    last = max(e.step for e in result.trace.events)
    buckets = [
        e
        for e in result.trace.events
        if e.phase == "allreduce" and e.step == last and e.device.startswith("rank:0 ")
    ]
    payload = sum(e.nbytes for e in buckets)
    ring = sum(e.details["ring_sent_bytes"] for e in buckets)
    where = "the CPU" if result.backend == "gloo" else "one GPU each"
    cap = result.bucket_cap_mb
    cap_text = "torch's default (25, the first bucket 1)" if cap is None else f"{cap:g}"
    lines = [
        f"DistributedDataParallel: {result.nproc} processes (ranks), backend "
        f"{result.backend}, on {where}; pids {', '.join(map(str, result.pids))}",
        f"model {model}, global batch {result.batch} "
        f"({plural(result.batch // result.nproc, 'row')} per rank, random 1x28x28 images), "
        f"{plural(len(result.step_times), 'SGD step')}, bucket_cap_mb {cap_text}",
        f"parameters: {result.parameter_bytes:,d} bytes; all-reduced per step by each rank: "
        f"{payload:,d} bytes in {len(buckets)} bucket(s), of which a ring sends "
        f"{ring:,d} per rank (2(n-1)/n); the table's allreduce bytes are the buckets' bytes, "
        "summed over the ranks",
        "step times (ms, slowest rank): " + ", ".join(f"{t * 1e3:.1f}" for t in result.step_times),
        "",
        steady_summary(result.trace),
        *filter(None, [gaps_note(buckets, "allreduce", "rank 0's", "all-reduces")]),
        "",
        "memory per rank in the last step (counted: the sum of the categories):",
        str(result.trace.memory_summary()),
        "",
    ]
    if timeline_path is None:
        lines.append("figures: skipped, matplotlib is not installed (pip install matplotlib)")
    else:
        lines.append(f"timeline (last step): {timeline_path}")
        lines.append(f"memory (last step):   {memory_path}")
    lines += [
        f"Chrome trace:         {trace_path}",
        "  open it at https://ui.perfetto.dev; one track per rank, all-reduces over backward.",
    ]
    return "\n".join(lines)


# What the checks of dpkit.ddp name, and the flags a user of `dpkit ddp` typed instead.
FLAGS = {"nproc": "--nproc", "batch": "--batch", "backend": "--backend",
         "bucket_cap_mb": "--bucket-mb", "timeout": "--timeout", "steps": "--steps"}  # fmt: skip


def in_flags(message: str) -> str:
    """``message`` of a dpkit.ddp check with its Python arguments as ``dpkit ddp``'s flags:
    "nproc=4 with backend='nccl' ...; use nproc<=2" becomes "--nproc 4 with --backend
    nccl ...; use --nproc 2 or fewer"."""
    return cli_types.in_flags(message, FLAGS)


def check_ranks(nnodes: int, nproc: int, batch: int) -> int:
    """The number of ranks, ``nnodes`` x ``nproc``, checked before any starts, in the words
    of the flags: dpkit.ddp's checks see only the product, and would call it ``nproc``."""
    world = nnodes * nproc
    limit = checks.MAX_RANKS_PER_CORE * checks.cores()
    if nnodes == 1:
        asked, fix = f"--nproc {nproc}", f"--nproc {limit} or fewer"
    else:
        nodes = min(nnodes, limit)
        asked = f"--nnodes {nnodes} x --nproc {nproc} = {plural(world, 'rank')}"
        example = f"--nnodes {nodes} --nproc {limit // nodes}"
        fix = f"--nnodes x --nproc of {limit} or fewer, e.g. {example}"
    if world > limit:
        raise ValueError(
            f"{asked} is more than {checks.MAX_RANKS_PER_CORE} ranks per CPU core here "
            f"({plural(checks.cores(), 'core')}): each rank is a Python process with its own "
            f"torch and model copy, and they would only fight over the cores; use {fix}"
        )
    if batch % world:
        raise ValueError(
            f"--batch {batch} does not split evenly over {asked}: DDP averages the ranks' "
            "gradients, which equals the full batch's gradient only when every rank has as "
            f"many rows; use a multiple of {world}, e.g. --batch {(batch // world + 1) * world}"
        )
    return world


def memory_bytes() -> int | None:
    """This machine's physical memory in bytes (None where the OS does not say: Windows)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_batch_fits(nnodes: int, nproc: int, batch: int, steps: int) -> None:
    """Refuse a ``--batch`` whose images alone overflow this machine's memory, before any
    rank starts. Every rank builds the whole batch and keeps its rows (with ``--nnodes``,
    the training script builds all ``--batch`` x ``--steps`` rows), so such a batch fails
    in every rank at once, each with torch's allocator traceback. A loose bound: the
    activations come on top, so a batch that passes may still run out of memory in
    training, where the launcher reports the rank that failed."""
    memory = memory_bytes()
    rows = batch * (steps if nnodes > 1 else 1)
    row_bytes = sum(tensor.nbytes for tensor in random_images(1))  # an image and its label
    needed = nnodes * nproc * rows * row_bytes
    if memory is None or needed <= memory:
        return
    asked, smaller = f"--batch {batch}", "--batch"
    if nnodes > 1:
        asked, smaller = f"--batch {batch} x --steps {steps}", "--batch or --steps"
    raise ValueError(
        f"{asked}: {plural(nnodes * nproc, 'rank')}, each building all {rows:,d} random "
        f"1x28x28 images, need {needed / 1e9:,.1f} GB for them, more than this machine's "
        f"{memory / 1e9:,.1f} GB of memory; use a smaller {smaller} (the default --batch is 64)"
    )


def _ddp_command(args: argparse.Namespace) -> int:
    from dpkit.ddp.run import run_ddp

    check_ranks(args.nnodes, args.nproc, args.batch)
    check_batch_fits(args.nnodes, args.nproc, args.batch, args.steps)
    out = writable_folder(args.out, "--out", "--out runs/ddp")
    if args.nnodes > 1:
        return _nodes_command(args, out)
    try:
        result = run_ddp(
            args.model,
            nproc=args.nproc,
            batch=args.batch,
            steps=args.steps,
            bucket_cap_mb=args.bucket_mb,
            backend=args.backend,
            timeout=args.timeout,
        )
    except ValueError as error:  # its checks of the arguments, before any rank starts
        raise ValueError(in_flags(str(error))) from None
    trace_path = result.trace.to_chrome_trace(out / "trace.json")
    print(report(result, args.model, (trace_path, *write_figures(result.trace, out))))
    return 0


def _nodes_command(args: argparse.Namespace, out: Path) -> int:
    """``--nnodes N``: a ``torchrun`` per node on 127.0.0.1 (:func:`dpkit.ddp.nodes.
    train_on_nodes`); prints their commands, who ran where, and the summary of the trace."""
    import json

    from dpkit.ddp import nodes

    if args.backend is not None:
        raise ValueError(
            "--backend is not passed to --nnodes's ranks: each node's training script "
            "(python -m dpkit.ddp.train) picks nccl when each of its ranks has a CUDA GPU, "
            "else gloo; drop --backend"
        )
    world = args.nnodes * args.nproc
    print(f"{plural(args.nnodes, 'node')} x {plural(args.nproc, 'rank')} on 127.0.0.1, a "
          "torchrun per node (the same commands a cluster's nodes would run, each with its "
          "--node_rank):")  # fmt: skip
    run = nodes.train_on_nodes(
        out, args.nnodes, args.nproc, args.model, args.batch, args.steps, args.bucket_mb,
        args.timeout,
    )  # fmt: skip
    for command in run.commands:
        print("  torchrun " + " ".join(command[3:]))
    if not run.ok:
        print(f"a node failed: exit statuses {run.statuses}; the last lines of its log:")
        failed = next(log for log, status in zip(run.logs, run.statuses) if status)
        print("\n".join(failed.splitlines()[-15:]))
        return 1
    trace = nodes.read_trace(out / "trace.json")
    ranks = json.loads((out / "ranks.json").read_text())
    started = f"{plural(args.nnodes, 'torchrun')} and {plural(world, 'rank')}"
    print(f"exit statuses {run.statuses}, {run.seconds:.1f} s (most of it starting Python "
          f"and torch in {started})")  # fmt: skip
    for who in ranks:
        print(f"  rank {who['rank']}: node {who['node']}, LOCAL_RANK {who['local_rank']}, "
              f"pid {who['pid']}, {plural(who['steps'], 'step')}")  # fmt: skip
    print(f"\n{steady_summary(trace)}\n")
    print("memory per rank: not recorded across nodes (the nodes' trace.json holds none); "
          "run without --nnodes for the memory table and memory.png\n")  # fmt: skip
    try:
        from dpkit import viz
    except ImportError:
        print("figures: skipped, matplotlib is not installed (pip install matplotlib)")
    else:
        viz.timeline(trace).savefig(out / "timeline.png", dpi=120)
        print(f"timeline (last step): {out / 'timeline.png'}")
    print(f"Chrome trace:         {out / 'trace.json'}\n"
          "torchrun's rendezvous store listened on 127.0.0.1 only (node 0 hosted it on a "
          "socket bound there, dpkit.ddp.nodes.loopback_store), and the ranks' own "
          "connections stayed on the loopback interface.")  # fmt: skip
    return 0


def _bucket_cap(text: str) -> float:
    """An argparse type: a bucket cap in MiB that torch can hold (argparse names the option)."""
    return _number(text, checks.check_bucket_cap)


def _timeout(text: str) -> float:
    """An argparse type: a finite number of seconds torch can wait."""
    return _number(text, checks.check_timeout)


def _number(text: str, check: Any) -> float:
    value = more_than_zero(text)
    try:
        return check(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_ddp_command(commands: Any) -> None:
    """Add ``dpkit ddp`` to the ``dpkit`` command's subparsers."""

    parser = commands.add_parser(
        "ddp",
        help="train a tiny model for a few steps under torch's DistributedDataParallel on N "
        "processes, traced; print the summaries, write a timeline and a Chrome trace",
        description="Train a tiny model on random 1x28x28 images for a few SGD steps under "
        "torch.nn.parallel.DistributedDataParallel, one process per rank (gloo on the CPU, "
        "NCCL with a GPU per rank), every rank traced: print the time and bytes of every "
        "phase, one all-reduce per gradient bucket, and the bytes each rank held; write "
        "timeline.png and memory.png (the last step) and trace.json (one track per rank; "
        "open it in https://ui.perfetto.dev). With --nnodes above 1, the nodes' ranks record "
        "no memory: no memory table and no memory.png, only the summary, timeline.png and "
        "trace.json.",
        formatter_class=DefaultsHelpFormatter,
    )
    parser.add_argument(
        "--nproc", type=at_least_one, default=2, help="rank processes (per node with --nnodes)"
    )
    parser.add_argument(
        "--nnodes", type=at_least_one, default=1, help="\"nodes\" on this machine, a torchrun "
        "each on 127.0.0.1 (above 1: the training script of python -m dpkit.ddp.train)"
    )  # fmt: skip
    parser.add_argument(
        "--batch", type=at_least_one, default=64, help="global batch, split over the ranks"
    )
    parser.add_argument("--model", choices=DDP_MODELS, default="mlp", help="model on 1x28x28")
    parser.add_argument(
        "--bucket-mb",
        type=_bucket_cap,
        default=None,
        help="DDP's bucket_cap_mb (MiB); "
        "default: torch's (25, and 1 for the first bucket, which any cap given replaces)",
    )
    parser.add_argument("--steps", type=at_least_one, default=3, help="training steps")
    parser.add_argument("--out", default=".", help="folder for the figures and trace.json")
    parser.add_argument(
        "--backend", choices=("gloo", "nccl"), default=None, help="default: nccl when torch "
        "has NCCL and there is a CUDA GPU per rank (--nproc GPUs or more), else gloo; not "
        "with --nnodes, whose nodes pick their own"
    )  # fmt: skip
    parser.add_argument(
        "--timeout", type=_timeout, default=120.0,
        help="seconds with no rank moving on before all are stopped",
    )  # fmt: skip
    parser.set_defaults(run=_ddp_command)
