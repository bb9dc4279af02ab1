"""``run_ddp``: N rank processes train under DistributedDataParallel; one Trace comes back.

The surprise first: the trace's devices are *processes*. Each rank records its own events
(:mod:`dpkit.ddp.rank`) on the machine's one monotonic clock, sends them to the parent
when it ends, and the parent merges them into a :class:`dpkit.Trace` whose devices are
``rank:0 (cpu)``, ``rank:1 (cpu)``, ... of kind ``rank``, so ``tr.summary()``,
``tr.memory_summary()``, ``tr.to_chrome_trace()`` and every figure of :mod:`dpkit.viz`
work on it as on a DataParallel trace, and say "processes (DistributedDataParallel)".
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import statistics
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from dpkit.ddp import checks, launch
from dpkit.ddp.hook import powersgd_rank
from dpkit.ddp.rank import Plan, run_rank
from dpkit.ddp.record import RankRun
from dpkit.ddp.workload import Workload, as_workload
from dpkit.tracing import RANK, Event, Trace


def rank_name(rank: int, device: str) -> str:
    """How traces and figures name a rank: ``rank:1 (cpu)``, ``rank:1 (cuda:1)``."""
    return f"rank:{rank} ({device})"


def merged_trace(runs: Sequence[RankRun]) -> Trace:
    """One Trace of every rank's events and memory records, ordered by start time (so a
    timeline draws a rank's backward first and the all-reduces overlapping it on top)."""
    events = [
        Event(phase, rank_name(run.rank, run.device), start, end, nbytes, step, RANK, details)
        for run in runs
        for phase, start, end, nbytes, step, details in run.events
    ]
    events.sort(key=lambda event: event.start)
    trace = Trace()
    # A Trace is filled by recording; these events were recorded in other processes, so
    # they go straight into its lists (the fields its properties read).
    trace._events = events
    trace._memory = [
        (rank_name(run.rank, run.device), category, nbytes, step, RANK)
        for run in runs
        for category, nbytes, step in run.memory
    ]
    trace.origin = min((event.start for event in events), default=trace.origin)
    return trace


@dataclass
class DDPResult:
    """What :func:`run_ddp` measured: the merged trace and the numbers a learner asks for.

    ``step_times``: per step, the wall time of the slowest rank (a DDP step ends for every
    rank when the last one's gradients are all-reduced). ``gradients``: per rank, each
    parameter's gradient after step 1's all-reduce (numpy arrays), when asked for.
    """

    trace: Trace
    nproc: int
    backend: str
    batch: int
    bucket_cap_mb: float | None  # None: torch's default
    parameter_bytes: int
    step_times: list[float]
    pids: list[int]
    gradients: list[dict[str, Any]] | None

    @property
    def median_step_s(self) -> float:
        """The median step time, leaving out step 1 (it builds DDP's buckets) when there
        are later steps."""
        times = self.step_times[1:] or self.step_times
        return statistics.median(times)

    def allreduce_bytes_per_step(self, step: int | None = None) -> dict[str, int]:
        """Bytes each rank all-reduced in ``step`` (default: the last), by rank name."""
        return bytes_per_device(self.trace.events, "allreduce", step)


def bytes_per_device(events: Sequence[Event], phase: str | None, step: int | None) -> dict:
    """Bytes each device moved in ``step`` (default: the last), in ``phase`` or in all."""
    step = max(e.step for e in events) if step is None else step
    moved: dict[str, int] = {}
    for event in events:
        if event.step == step and (phase is None or event.phase == phase):
            moved[event.device] = moved.get(event.device, 0) + event.nbytes
    return dict(sorted(moved.items()))


def result_of(runs: Sequence[RankRun], plan: Plan, pids: list[int]) -> DDPResult:
    """A :class:`DDPResult` from every rank's record of one run."""
    steps = len(runs[0].step_times)
    step_times = [
        max(run.step_times[i][1] for run in runs) - min(run.step_times[i][0] for run in runs)
        for i in range(steps)
    ]
    return DDPResult(
        trace=merged_trace(runs),
        nproc=plan.nproc,
        backend=plan.backend,
        batch=plan.batch,
        bucket_cap_mb=runs[0].bucket_cap_mb,
        parameter_bytes=runs[0].parameter_bytes,
        step_times=step_times,
        pids=pids,
        gradients=[run.gradients for run in runs] if plan.keep_gradients else None,
    )


def make_plan(
    workload: Workload | str,
    nproc: int,
    batch: int,
    steps: int,
    bucket_caps: Sequence[float | None],
    backend: str | None,
    timeout: float,
    port: int | None,
    threads: int,
    keep_gradients: bool = False,
    blocks: int = 1,
    ddp_options: dict[str, Any] | None = None,
    compression: str | None = None,
    emulated_link: float | None = None,
    variants: Sequence[dict[str, Any]] = ({},),
) -> Plan:
    """Every argument checked (a clear error naming it), into a :class:`Plan` for the ranks."""
    workload = as_workload(workload)
    nproc = checks.check_nproc(nproc)
    for argument, value in (("batch", batch), ("steps", steps), ("threads", threads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{argument} must be a whole number of at least 1, got {value!r}")
    if batch % nproc:
        even = (batch // nproc + 1) * nproc
        raise ValueError(
            f"batch={batch} does not split evenly over nproc={nproc}: DDP averages the ranks' "
            "gradients, which equals the full batch's gradient only when every rank has as "
            f"many rows; use a multiple of {nproc}, e.g. batch={even}"
        )
    bucket_caps = [checks.check_bucket_cap(cap) for cap in bucket_caps]
    timeout = checks.check_timeout(timeout)
    for given in (compression, *(variant.get("compression") for variant in variants)):
        powersgd_rank(given)  # a clear error for anything not understood
    backend = checks.choose_backend(backend, nproc)
    if emulated_link is not None:
        if isinstance(emulated_link, bool) or not isinstance(emulated_link, (int, float)):
            raise ValueError(f"emulated_link must be bytes/s or None, got {emulated_link!r}")
        if not (0 < emulated_link < float("inf")) or backend != "gloo":
            raise ValueError(
                f"emulated_link={emulated_link!r}: a finite number of bytes/s above 0, on "
                "gloo ranks (the emulation holds CPU all-reduces)"
            )
    port = None if port is None else checks.check_port(port)
    return Plan(
        workload=workload,
        nproc=nproc,
        batch=batch,
        steps=steps,
        backend=backend,
        # torch's collectives give up later than the parent: the parent's message, which
        # names the rank that is behind, comes first.
        timeout=timeout + 30,
        bucket_caps=tuple(bucket_caps),
        ddp_options=tuple(sorted((ddp_options or {}).items())),
        compression=compression,
        variants=tuple(tuple(sorted(variant.items())) for variant in variants),
        emulated_link=emulated_link,
        blocks=blocks,
        threads=threads,
        keep_gradients=keep_gradients,
        port=port,
    )


@contextlib.contextmanager
def rendezvous(plan: Plan) -> Iterator[Plan]:
    """``plan`` with the path of a fresh file store for its ranks to meet through (in a new
    private folder, removed afterwards); a plan with a TCP ``port`` unchanged."""
    if plan.port is not None:
        yield plan
        return
    folder = tempfile.mkdtemp(prefix="dpkit-ddp-")  # readable by this user only
    try:
        yield dataclasses.replace(plan, store=os.path.join(folder, "store"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def launch_plan(plan: Plan, timeout: float) -> tuple[list[list[RankRun]], list]:
    """Run ``plan`` on its ranks: every rank's runs, and their process ids."""
    with rendezvous(plan) as met, launch.Ranks(run_rank, (met,), met.nproc, timeout) as running:
        return running.wait_for("done"), running.pids


def run_ddp(
    workload: Workload | str = "mlp",
    nproc: int = 2,
    batch: int = 64,
    steps: int = 3,
    bucket_cap_mb: float | None = 25.0,
    backend: str | None = None,
    timeout: float = 120.0,
    port: int | None = None,
    threads: int = 1,
    keep_gradients: bool = False,
    ddp_options: dict[str, Any] | None = None,
    compression: str | None = None,
    emulated_link: float | None = None,
) -> DDPResult:
    """Train ``workload`` under DistributedDataParallel on ``nproc`` processes, traced.

    ``workload``: a demo model's name (``"mlp"``, ``"cnn"``, ``"transformer"``, on random
    1x28x28 images with SGD) or a :class:`~dpkit.ddp.Workload` of importable functions.
    ``batch`` is the global batch: each rank trains on ``batch // nproc`` rows of it.
    ``backend``: None picks NCCL with a GPU per rank, else gloo (CPU). ``timeout``: seconds
    for the whole run, after which every rank is stopped and the error says where each one
    was. ``port``: None (the default) lets the ranks meet through a file, so that nothing
    listens on the network; a port number makes rank 0 host torch's TCP store there, on
    127.0.0.1 alone.
    ``threads``: torch intra-op threads per rank.
    ``keep_gradients``: send step 1's all-reduced gradients back (``result.gradients``).
    ``bucket_cap_mb=None``: torch's own default (25 MiB, and 1 MiB for the first bucket,
    which torch uses only when no cap is given). ``ddp_options``: more keyword arguments of
    ``DistributedDataParallel`` (``gradient_as_bucket_view``, ``static_graph``, ...).
    ``compression``: ``"bf16"`` or ``"fp16"``: the buckets travel in that 2-byte type, as
    under torch's ``bf16_compress_hook`` / ``fp16_compress_hook`` (half the bytes, rounded);
    ``"powersgd"`` or ``"powersgd-R"``: torch's ``powerSGD_hook`` with a rank-1 (rank-R)
    approximation of each weight matrix's gradient, from step 1, without error feedback
    (:mod:`dpkit.ddp.hook`).
    ``emulated_link``: bytes/s; an **emulation**: each all-reduce is held until its ring's
    bytes could have crossed such a link, one bucket after another (:mod:`dpkit.ddp.hook`),
    as between nodes on a network slower than this machine's loopback; the events say so.

    Returns a :class:`DDPResult` whose ``trace`` holds every rank's events.
    """
    plan = make_plan(
        workload, nproc, batch, steps, [bucket_cap_mb], backend, timeout, port, threads,
        keep_gradients, ddp_options=ddp_options, compression=compression,
        emulated_link=emulated_link,
    )  # fmt: skip
    per_rank, pids = launch_plan(plan, timeout)
    return result_of([runs[0] for runs in per_rank], plan, pids)
