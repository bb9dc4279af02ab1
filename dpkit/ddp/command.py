"""``dpkit ddp``: a few traced DistributedDataParallel steps on N processes, like ``dpkit demo``.

    dpkit ddp                                   2 ranks (gloo on the CPU), batch 64, MLP
    dpkit ddp --nproc 4 --model transformer --bucket-mb 0.1 --out /tmp/ddp
    dpkit ddp --nnodes 2 --nproc 2 --out /tmp/nodes   2 "nodes" of 2 ranks, a torchrun each

It prints the ranks' per-phase summary and memory, and writes the merged ``trace.json``
(every rank a track), ``timeline.png`` and ``memory.png`` (the last step) into ``--out``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from dpkit.cli_types import at_least_one, more_than_zero
from dpkit.ddp import checks
from dpkit.models import DDP_MODELS


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
        f"model {model}, global batch {result.batch} ({result.batch // result.nproc} rows per "
        f"rank, random 1x28x28 images), {len(result.step_times)} SGD steps, bucket_cap_mb "
        + cap_text,
        f"parameters: {result.parameter_bytes:,d} bytes; all-reduced per step by each rank: "
        f"{payload:,d} bytes in {len(buckets)} bucket(s), of which a ring sends "
        f"{ring:,d} per rank (2(n-1)/n)",
        "step times (ms, slowest rank): " + ", ".join(f"{t * 1e3:.1f}" for t in result.step_times),
        "",
        f"per phase, mean per step — {result.trace.hardware}:",
        str(result.trace.summary()),
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


def writable_folder(out: str) -> Path:
    """``out`` resolved, made if missing, and proven writable by writing a file there: a
    folder ``dpkit ddp`` cannot write is refused before the ranks start, not after they
    trained."""
    folder = Path(out).resolve()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".dpkit-write-test-"):
            pass
    except OSError as error:
        raise ValueError(
            f"--out {out}: cannot write there ({error.strerror or error}); pick a folder you "
            "can write, e.g. --out runs/ddp"
        ) from None
    return folder


def _ddp_command(args: argparse.Namespace) -> int:
    from dpkit.ddp.run import run_ddp

    out = writable_folder(args.out)
    if args.nnodes > 1:
        return _nodes_command(args, out)
    result = run_ddp(
        args.model,
        nproc=args.nproc,
        batch=args.batch,
        steps=args.steps,
        bucket_cap_mb=args.bucket_mb,
        backend=args.backend,
        timeout=args.timeout,
    )
    trace_path = result.trace.to_chrome_trace(out / "trace.json")
    print(report(result, args.model, (trace_path, *write_figures(result.trace, out))))
    return 0


def _nodes_command(args: argparse.Namespace, out: Path) -> int:
    """``--nnodes N``: a ``torchrun`` per node on 127.0.0.1 (:func:`dpkit.ddp.nodes.
    train_on_nodes`); prints their commands, who ran where, and the summary of the trace."""
    import json

    from dpkit.ddp import nodes

    if args.backend == "nccl":
        raise ValueError("--nnodes runs its nodes on this machine's CPU (gloo): drop --backend")
    world = args.nnodes * args.nproc
    print(f"{args.nnodes} nodes x {args.nproc} ranks on 127.0.0.1, a torchrun per node (the "
          "same commands a cluster's nodes would run, each with its --node_rank):")  # fmt: skip
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
    print(f"exit statuses {run.statuses}, {run.seconds:.1f} s (most of it starting Python "
          f"and torch in {args.nnodes} torchruns and {world} ranks)")  # fmt: skip
    for who in ranks:
        print(f"  rank {who['rank']}: node {who['node']}, LOCAL_RANK {who['local_rank']}, "
              f"pid {who['pid']}, {who['steps']} steps")  # fmt: skip
    print(f"\nper phase, mean per step — {trace.hardware}:\n{trace.summary()}\n")
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
        "open it in https://ui.perfetto.dev).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
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
        "--bucket-mb", type=_bucket_cap, default=25.0, help="DDP's bucket_cap_mb (MiB)"
    )
    parser.add_argument("--steps", type=at_least_one, default=3, help="training steps")
    parser.add_argument("--out", default=".", help="folder for the figures and trace.json")
    parser.add_argument(
        "--backend", choices=("gloo", "nccl"), default=None, help="default: NCCL with a GPU "
        "per rank, else gloo"
    )  # fmt: skip
    parser.add_argument(
        "--timeout", type=_timeout, default=120.0,
        help="seconds with no rank moving on before all are stopped",
    )  # fmt: skip
    parser.set_defaults(run=_ddp_command)
