"""DataParallel and DistributedDataParallel side by side, and DDP's bucket size swept.

The surprise first: the two move the *same* gradients, by different roads. dpkit's
DataParallel (as torch's) runs every replica in one process, copies the module to every
device on every forward, and sums all gradients onto device 0; DDP runs a process per
device, copies the module once (in its constructor), and all-reduces gradient buckets
between the ranks while backward still runs, so no device is special. Same model, same
global batch, same device count: :func:`compare_with_data_parallel` measures both, and
:func:`single_process_gradients` is the reference both must equal.

Timing is interleaved: the ranks start first and wait; then a block of DataParallel steps
runs in this process while the ranks wait, then a block of DDP steps while this process
waits, and so on, so that both meet the machine in the same state (other programs, heat,
caches). The first block of each is warm-up and left out. Both are recorded while timed
(dpkit's trace for DataParallel, the rank recorders for DDP), so both pay for recording.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

import dpkit
from dpkit.ddp.launch import Ranks
from dpkit.ddp.rank import run_rank
from dpkit.ddp.run import DDPResult, launch_plan, make_plan, rendezvous, result_of
from dpkit.ddp.workload import Workload, as_workload
from dpkit.nested import tensor_nbytes
from dpkit.table import Table
from dpkit.tracing import RANK, Trace, record_memory


def spread(times: Sequence[float]) -> dict[str, float]:
    """Median and quartiles of ``times`` in milliseconds (quartiles equal the median for one)."""
    ms = sorted(t * 1e3 for t in times)
    q1, _, q3 = statistics.quantiles(ms, n=4) if len(ms) > 1 else (ms[0], 0, ms[0])
    return {"median_ms": statistics.median(ms), "q1_ms": q1, "q3_ms": q3}


def single_process_gradients(workload: Workload | str, batch: int) -> dict[str, Any]:
    """The reference: each parameter's gradient after one step of ``workload`` on the whole
    ``batch`` in this process (numpy arrays by name), from the weights every rank starts with."""
    workload = as_workload(workload)
    torch.manual_seed(workload.seed)
    inputs, targets = workload.data(batch)
    torch.manual_seed(workload.seed)
    model = workload.model()
    workload.step(model, inputs, targets, workload.optimizer(model.parameters()))
    return {name: p.grad.detach().numpy().copy() for name, p in model.named_parameters()}


def _gradient_bytes(model: torch.nn.Module) -> int:
    return sum(tensor_nbytes(p.grad) for p in model.parameters() if p.grad is not None)


def traffic_per_device(trace: Trace, step: int | None = None) -> dict[str, int]:
    """Bytes in and out of each device in ``step`` (default: the last), by device name.

    DataParallel: every copy leaves or reaches ``device_ids[0]``, so a copy's bytes count on
    its device and on device 0 (its ``destination``, or the source of every scatter and
    broadcast). DDP: each rank sends and receives what a ring all-reduce of its buckets
    moves, ``2 (n - 1) / n`` of them each way (the ring's model, not a count of packets).
    """
    events = trace.events
    step = max(e.step for e in events) if step is None else step
    names = sorted({e.device for e in events}, key=_index)
    traffic = dict.fromkeys(names, 0)
    for event in events:
        if event.step != step or not event.nbytes:
            continue
        if event.kind == RANK:
            sent = event.details.get("ring_sent_bytes")
            traffic[event.device] += event.nbytes if sent is None else 2 * sent
        else:
            traffic[event.device] += event.nbytes
            traffic[event.details.get("destination", names[0])] += event.nbytes
    return traffic


def _index(name: str) -> tuple[int, str]:
    found = re.search(r":(\d+)", name)
    return (int(found.group(1)) if found else -1, name)


@dataclass
class Comparison:
    """Step times, traffic and memory per device of DataParallel and DDP, one workload."""

    nproc: int
    batch: int
    threads: int
    data_parallel: Trace  # dpkit's trace of the DataParallel steps
    data_parallel_step_times: list[float]  # seconds, warm-up left out
    ddp: DDPResult  # its step_times: warm-up left out too
    sweep: list[DDPResult] = field(default_factory=list)  # DDP at the other bucket caps
    workload: Workload | str = "mlp"  # what both trained

    def sweep_rows(self) -> Table:
        """:func:`bucket_rows` of the DDP run and of every other bucket cap it was run at."""
        return bucket_rows([self.ddp, *self.sweep])

    def engines(self) -> list[tuple[str, Trace, list[float]]]:
        return [
            ("DataParallel", self.data_parallel, self.data_parallel_step_times),
            ("DDP", self.ddp.trace, self.ddp.step_times),
        ]

    def rows(self) -> Table:
        """One row per engine: step time (median, quartiles), and on device 0 and on the
        busiest other device: bytes in and out per step, and bytes held (last step)."""
        rows = Table()
        for engine, trace, times in self.engines():
            traffic = list(traffic_per_device(trace).values())
            held = [row["counted"] for row in trace.memory_summary()]
            rows.append(
                {
                    "engine": engine,
                    **spread(times),
                    "steps": len(times),
                    "traffic dev 0": traffic[0],
                    "traffic others": max(traffic[1:], default=0),
                    "memory dev 0": held[0],
                    "memory others": max(held[1:], default=0),
                }
            )
        return rows

    def __str__(self) -> str:
        lines = [
            f"{self.nproc} devices, global batch {self.batch}, {self.threads} torch thread(s) "
            "per process. Step times in ms (interleaved, warm-up left out); traffic: bytes in "
            "and out of a device per step; memory: bytes it held, as counted",
            str(self.rows()),
        ]
        for engine, trace, _ in self.engines():
            lines += ["", f"{engine} — {trace.hardware}:", str(trace.memory_summary())]
        return "\n".join(lines)


def compare_with_data_parallel(
    workload: Workload | str = "mlp",
    nproc: int = 2,
    batch: int = 64,
    steps: int = 3,
    repeats: int = 4,
    bucket_cap_mb: float = 25.0,
    threads: int = 1,
    timeout: float = 120.0,
    sweep_caps_mb: Sequence[float] = (),
) -> Comparison:
    """Train ``workload`` with dpkit's DataParallel on ``nproc`` virtual CPU lanes and with
    DDP on ``nproc`` gloo ranks, in ``repeats`` interleaved blocks of ``steps`` steps each
    (after one warm-up block of each); ``threads`` torch intra-op threads per process (the
    DataParallel process too: its lanes are threads sharing them).

    ``sweep_caps_mb``: more bucket sizes, each trained afterwards by the same ranks (a fresh
    DDP model each, as many blocks, DataParallel idle) into ``comparison.sweep``: a bucket
    sweep without starting the processes again (starting them costs seconds)."""
    plan = make_plan(
        workload, nproc, batch, steps, [bucket_cap_mb, *sweep_caps_mb], "gloo", timeout, None,
        threads, blocks=repeats + 1,
    )  # fmt: skip
    workload = plan.workload
    lanes = dpkit.virtual_devices(nproc, on="cpu")
    torch.manual_seed(workload.seed)
    inputs, targets = dpkit.to_device(workload.data(batch), lanes[0])
    torch.manual_seed(workload.seed)
    model = dpkit.to_device(workload.model(), lanes[0])
    parallel = dpkit.DataParallel(model, device_ids=lanes)
    optimizer = workload.optimizer(model.parameters())

    threads_before = torch.get_num_threads()
    torch.set_num_threads(threads)
    dp_times: list[float] = []
    try:
        with (
            rendezvous(plan) as met,
            Ranks(run_rank, (met,), nproc, timeout) as running,
            dpkit.trace() as recorded,
        ):
            for block in range(plan.blocks):
                running.wait_for("waiting", block)  # the ranks are idle: DataParallel's turn
                for _ in range(steps):
                    start = time.perf_counter()
                    workload.step(parallel, inputs, targets, optimizer)
                    dp_times.append(time.perf_counter() - start)
                    # DataParallel's gradients live on device 0 only (the reduce puts them
                    # there); the trace does not count them, so they are added here.
                    record_memory(lanes[0], "gradients", _gradient_bytes(model))
                running.release()  # DDP's turn; this process waits in wait_for
            for _ in sweep_caps_mb:  # the other caps: DDP alone, block after block
                for block in range(plan.blocks):
                    running.wait_for("waiting", block)
                    running.release()
            per_rank, pids = running.wait_for("done"), running.pids
    finally:
        torch.set_num_threads(threads_before)
    ddp, *sweep = [
        result_of([runs[index] for runs in per_rank], plan, pids)
        for index in range(len(plan.bucket_caps))
    ]
    for result in (ddp, *sweep):
        result.step_times = result.step_times[steps:]
    return Comparison(nproc, batch, threads, recorded, dp_times[steps:], ddp, sweep, workload)


def bucket_rows(results: Sequence[DDPResult]) -> Table:
    """For each DDP run: its ``bucket_cap_mb``, how many all-reduces its last step made,
    their sizes, the bytes per rank, what a ring sends per rank, and the median step time."""
    rows = Table()
    for result in results:
        last = max(e.step for e in result.trace.events)
        rank0 = [
            e
            for e in result.trace.events
            if e.phase == "allreduce" and e.step == last and e.device.startswith("rank:0 ")
        ]
        rows.append(
            {
                "bucket_cap_mb": result.bucket_cap_mb,
                "allreduces/step": len(rank0),
                "bucket sizes (B)": " ".join(f"{e.nbytes:,d}" for e in rank0),
                "bytes/step/rank": sum(e.nbytes for e in rank0),
                "ring sent/rank": sum(e.details["ring_sent_bytes"] for e in rank0),
                "median_ms": result.median_step_s * 1e3,
            }
        )
    return rows


def bucket_sweep(
    bucket_caps_mb: Sequence[float] = (0.001, 0.01, 0.1, 1.0, 25.0),
    workload: Workload | str = "mlp",
    nproc: int = 2,
    batch: int = 64,
    steps: int = 4,
    threads: int = 1,
    timeout: float = 120.0,
) -> Table:
    """For each ``bucket_cap_mb``: how many all-reduces a step makes, their sizes, the bytes
    per rank, and the median step time (step 1 left out: its buckets are DDP's first guess).

    One set of ranks trains a fresh DDP model for each cap in turn (the processes start once).
    """
    plan = make_plan(
        workload, nproc, batch, steps, list(bucket_caps_mb), None, timeout, None, threads
    )
    per_rank, pids = launch_plan(plan, timeout)
    return bucket_rows(
        [result_of([runs[index] for runs in per_rank], plan, pids)
         for index in range(len(plan.bucket_caps))]
    )  # fmt: skip


def assign_buckets(sizes: Sequence[int], cap_bytes: float, rule: str = "torch") -> list[int]:
    """Bucket sizes in bytes for gradients of ``sizes`` (bytes, in the order they become
    ready) under a cap of ``cap_bytes``, by one of two rules:

    - ``"torch"``: add the gradient, then close the bucket once it has reached the cap
      (torch's reducer, ``compute_bucket_assignment_by_size``: a bucket can end larger
      than the cap, by up to one gradient);
    - ``"before overflow"``: close the bucket when the next gradient would overflow it
      (a plausible rule torch does not follow: a notebook sets both beside a measurement).
    """
    if rule not in ("torch", "before overflow"):
        raise ValueError(f"rule must be 'torch' or 'before overflow', got {rule!r}")
    buckets, current = [], 0
    for size in sizes:
        if rule == "before overflow" and current and current + size > cap_bytes:
            buckets.append(current)
            current = 0
        current += size
        if rule == "torch" and current >= cap_bytes:
            buckets.append(current)
            current = 0
    return buckets + ([current] if current else [])


def step_rows(result: DDPResult, rank: int = 0) -> Table:
    """One row per step of ``rank``: DDP's constructor (step 1 only), the backward's own
    computation, the all-reduces (how many, when the first started after backward began),
    the share of all-reduce time that ran while backward still computed (overlap), and
    how long the rank then waited for the last all-reduce (ms)."""
    mine = [e for e in result.trace.events if e.device.startswith(f"rank:{rank} ")]
    rows = Table()
    for step in sorted({e.step for e in mine}):
        events = [e for e in mine if e.step == step]
        (backward,) = [e for e in events if e.phase == "backward"]
        allreduces = [e for e in events if e.phase == "allreduce"]
        busy = sum(e.duration for e in allreduces)
        during = sum(
            max(0.0, min(e.end, backward.end) - max(e.start, backward.start)) for e in allreduces
        )
        rows.append(
            {
                "step": step,
                "constructor_ms": 1e3 * sum(e.duration for e in events if e.phase == "replicate"),
                "backward_ms": 1e3 * backward.duration,
                "allreduces": len(allreduces),
                # None in a step without all-reduces (a step under ddp.no_sync())
                "first_starts_ms": (
                    1e3 * (min(e.start for e in allreduces) - backward.start)
                    if allreduces
                    else None
                ),
                "overlap_%": 100 * during / busy if busy else 0.0,
                "waiting_ms": 1e3 * backward.details.get("waiting_s", 0.0),
            }
        )
    return rows
