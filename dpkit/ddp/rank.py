"""What each rank process runs: join the group, then train and record one DDP model per run.

The body of every rank that :func:`dpkit.ddp.run_ddp` (and the comparisons) spawn:
:func:`run_rank` joins the process group (gloo on the CPU, NCCL with a GPU per rank),
takes its rows of the batch, and for each bucket size in the :class:`Plan` wraps a fresh
model in DDP per variant (its DDP settings) and trains them, their steps taken in turn,
recorded by :class:`dpkit.ddp.record.RankRecorder`; in blocks of steps that wait for the
parent's go when the parent times something in between.

Nothing listens on the network: the ranks meet through a file (torch's ``FileStore``, in a
folder the parent made and removes). gloo's own connections between the ranks listen
on the loopback interface only (``GLOO_SOCKET_IFNAME``, NCCL's ``NCCL_SOCKET_IFNAME``).
A ``port`` given by the caller asks for torch's ``TCPStore`` instead, which in torch 2.13
listens on every network interface whatever address it is given (no bind address, no
authentication): rank 0 hosts it on a socket bound to 127.0.0.1 alone
(:func:`dpkit.ddp.nodes.loopback_store`).
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import importlib
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from dpkit.ddp import checks, process
from dpkit.ddp.record import RankRecorder, RankRun
from dpkit.ddp.workload import Workload, shard


@dataclass(frozen=True)
class Plan:
    """Everything a rank needs, sent to it when it starts (it must pickle)."""

    workload: Workload
    nproc: int
    batch: int
    steps: int  # per block
    backend: str
    port: int | None  # None: the ranks meet through the file ``store``
    timeout: float  # for torch's collectives; the parent's own deadline ends a run first
    bucket_caps: tuple[float | None, ...] = (25.0,)  # one DDP run after another, a model each
    ddp_options: tuple[tuple[str, Any], ...] = ()  # more DistributedDataParallel arguments
    compression: str | None = None  # "bf16", "fp16", "powersgd[-R]" (dpkit.ddp.hook)
    # Each cap's DDP run is repeated once per variant, each a fresh model with these extra
    # DistributedDataParallel arguments (and "compression"), the variants' steps taken in
    # turn: settings side by side, one launch (dpkit.ddp.settings).
    variants: tuple[tuple[tuple[str, Any], ...], ...] = ((),)
    emulated_link: float | None = None  # bytes/s: all-reduces held as if over such a link
    blocks: int = 1  # >1: each block of steps waits for the parent's go (interleaved timing)
    threads: int = 1  # torch intra-op threads per rank
    keep_gradients: bool = False  # send step 1's gradients back
    address: str = "127.0.0.1"
    store: str = ""  # the FileStore's path, set by dpkit.ddp.run.rendezvous


def import_what_ddp_imports() -> None:
    """Import torch._dynamo, which DDP's constructor imports on first use (recent torch;
    1-3 s on a laptop): done while every rank starts anyway, so that ``replicate`` times
    the constructor's own work, not an import."""
    with contextlib.suppress(ImportError):
        importlib.import_module("torch._dynamo")


def _move(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    return type(batch)(_move(item, device) for item in batch)


def free_reducers() -> None:
    """Free every DDP module already out of use (and its reducer) now: call it after the
    function that used DDP has returned, and before ``destroy_process_group``.

    Why: a reducer holds its process group. Freed last (at exit, after
    ``destroy_process_group``), it destroys the group while holding the GIL, and gloo's
    destructor joins its worker thread, which may be waiting for the GIL to free a finished
    collective's tensors: a deadlock at exit, seen here about one run in ten under torchrun
    (gdb: ``~Reducer -> ~ProcessGroupGloo -> thread::join`` against
    ``~AsyncAllgatherWork -> gil_scoped_acquire``; see pytorch/pytorch#56297 and #179291).
    Freed first, the group dies in ``destroy_process_group``, whose binding releases the GIL.
    """
    gc.collect()  # a DDP module caught in a reference cycle (hooks can make one) goes too


def wrapped(
    rank: int, where: process.Progress, plan: Plan, bucket_cap_mb: float | None,
    device: torch.device, variant: tuple[tuple[str, Any], ...],
) -> tuple[RankRecorder, Any, torch.optim.Optimizer]:  # fmt: skip
    """A fresh model (the same first weights on every rank, in every run) wrapped in DDP
    with the plan's options and the variant's, its recorder, and its optimizer."""
    where.at(process.WRAPPING, 0)
    torch.manual_seed(plan.workload.seed)
    model = plan.workload.model().to(device)
    options = {**dict(plan.ddp_options), **dict(variant)}
    compression = options.pop("compression", plan.compression)
    recorder = RankRecorder(rank, plan.nproc, device, where, compression, plan.emulated_link)
    ddp = recorder.wrap(
        model,
        device_ids=[device] if device.type == "cuda" else None,
        bucket_cap_mb=bucket_cap_mb,
        **options,
    )
    optimizer = plan.workload.optimizer(ddp.parameters())
    recorder.watch(optimizer, plan.keep_gradients)
    return recorder, ddp, optimizer


def train_runs(
    rank: int, where: process.Progress, messages: Any, go: Any, plan: Plan,
    bucket_cap_mb: float | None, batch: tuple[Any, torch.Tensor], device: torch.device,
) -> list[RankRun]:  # fmt: skip
    """A DDP model per variant of the plan, trained for ``plan.blocks`` x ``plan.steps``
    steps, recorded. Several variants take their steps in turn (step 1 of each, then step 2
    of each, ...), so that every variant meets the machine in the same state: differences
    of a fraction of a millisecond between them are then theirs, not the machine's."""
    models = [wrapped(rank, where, plan, bucket_cap_mb, device, v) for v in plan.variants]
    for block in range(plan.blocks):
        if plan.blocks > 1:  # the parent times something else meanwhile: wait for it
            where.at(process.WAITING)
            messages.put(("waiting", rank, block))
            if not go.acquire(timeout=plan.timeout):
                raise TimeoutError(f"the parent never started block {block}")
        for _ in range(plan.steps):
            for recorder, ddp, optimizer in models:
                recorder.run_step(plan.workload.step, ddp, *batch, optimizer)
    for recorder, _, _ in models:
        recorder.close()
    return [recorder.result(bucket_cap_mb) for recorder, _, _ in models]


def join_group(plan: Plan, rank: int, device: torch.device | None = None) -> None:
    """``init_process_group`` for this rank: through the plan's file store, or its TCP port;
    the backend's own connections on the loopback interface. ``device``: the GPU an NCCL
    rank uses, set current first and named to torch (``device_id``), so that NCCL binds its
    communicator to it instead of guessing from the rank."""
    loopback = checks.loopback_interface()
    if loopback is not None:  # the user's own choice, if any, wins
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", loopback)
    timeout = datetime.timedelta(seconds=plan.timeout)
    if plan.port is None:
        store = dist.FileStore(plan.store, plan.nproc)
        dist.init_process_group(
            plan.backend, store=store, rank=rank, world_size=plan.nproc, timeout=timeout,
            device_id=device,
        )  # fmt: skip
        return
    # imported here: a package import of dpkit.ddp.nodes made `python -m dpkit.ddp.nodes` warn
    from dpkit.ddp import nodes

    if plan.address not in nodes.LOOPBACK_ADDRESSES:  # a network address, asked for
        dist.init_process_group(
            plan.backend,
            init_method=f"tcp://{plan.address}:{plan.port}",
            rank=rank,
            world_size=plan.nproc,
            timeout=timeout,
            device_id=device,
        )
        return
    # dpkit: torch's TCPStore server binds every interface, whatever address it is given;
    # rank 0 serves it from a socket bound to the loopback address alone, kept open here.
    if rank == 0:
        store = nodes.loopback_store(plan.port, plan.address)
        _held[:] = [store]
    else:
        store = dist.TCPStore(plan.address, plan.port, is_master=False, timeout=timeout)
    dist.init_process_group(
        plan.backend, store=store, rank=rank, world_size=plan.nproc, timeout=timeout,
        device_id=device,
    )  # fmt: skip


_held: list[Any] = []  # rank 0's store (its server owns the socket), as long as the rank lives


def run_rank(rank: int, where: process.Progress, messages: Any, go: Any, plan: Plan) -> None:
    """The body of every rank process (started by :class:`dpkit.ddp.launch.Ranks`).

    On an error the process group is left alone: the launcher reports the error and ends
    the process at once (``destroy_process_group`` while peers still wait in a collective
    can hang, as torchtitan found: pytorch/torchtitan#1342).
    """
    torch.set_num_threads(plan.threads)  # ranks share the cores: one thread each by default
    import_what_ddp_imports()
    where.at(process.CONNECTING)
    cuda = plan.backend == "nccl"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)  # before the group: NCCL binds this rank to its GPU
    join_group(plan, rank, device if cuda else None)
    where.at(process.PREPARING)
    torch.manual_seed(plan.workload.seed)
    batch = _move(shard(plan.workload.data(plan.batch), rank, plan.nproc), device)
    runs = []
    for bucket_cap_mb in plan.bucket_caps:
        # Each run's DDP lives and dies inside train_runs: freed at its return.
        runs += train_runs(rank, where, messages, go, plan, bucket_cap_mb, batch, device)
        free_reducers()
    where.at(process.FINISHED)
    messages.put(("done", rank, runs))
    # No destroy_process_group: the rank's process ends with os._exit once its messages are
    # flushed (multiprocessing's fork server, Linux and macOS), so the group is never
    # destroyed. Destroyed here, a compression hook's group once died on one of gloo's own
    # threads ("terminate called ... Resource deadlock avoided", SIGABRT) after "done".
