"""A DDP training script the way clusters run them: started by ``torchrun``, one per rank.

    python -m dpkit.ddp.train                              # one process (a world of 1)
    torchrun --nproc_per_node=2 -m dpkit.ddp.train --model cnn --epochs 2 --out runs/ddp
    # two nodes: the same command on each, with its --node_rank (here both on one machine,
    # as scripts/two_nodes_localhost.sh does)
    torchrun --nnodes=2 --nproc_per_node=2 --node_rank=0 --master_addr=127.0.0.1 \\
        --master_port=29500 -m dpkit.ddp.train --out runs/two_nodes
    torchrun --nnodes=2 --nproc_per_node=2 --node_rank=1 --master_addr=127.0.0.1 \\
        --master_port=29500 -m dpkit.ddp.train --out runs/two_nodes

The surprise first: nothing in this file starts a process. ``torchrun`` starts one copy of
it per rank and tells each who it is in environment variables: ``RANK`` (0 to
``WORLD_SIZE - 1``, across all nodes), ``LOCAL_RANK`` (its index on this node: which GPU
it takes), ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` (where rank 0's store
listens), and ``GROUP_RANK`` (the node's index). ``init_process_group`` reads them
(``env://``). What changes from DataParallel code, line by line:

- the launcher: ``torchrun`` instead of ``python``; the model is wrapped by
  ``DistributedDataParallel(model, device_ids=[local_rank])`` instead of DataParallel;
- the data: each rank loads only its share, through ``DistributedSampler`` (call its
  ``set_epoch`` every epoch, or every epoch shuffles the same way); ``--batch-per-rank``
  is per rank, so the global batch is ``batch_per_rank * WORLD_SIZE``;
- side effects happen once: rank 0 saves the model (``ddp.module.state_dict()``: without
  DDP's ``module.`` prefix) and writes the trace; the others wait at a barrier.

Every rank records its steps as :func:`dpkit.ddp.run_ddp`'s ranks do; rank 0 gathers the
records (``all_gather_object``) and writes ``trace.json`` (a track per rank), ``ranks.json``
(who ran where) and ``model.pt`` into ``--out``. Ranks on other hosts have other clocks:
their times are shifted to rank 0's at a barrier, to within the barrier's skew.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from dpkit.ddp import checks, process
from dpkit.ddp.rank import free_reducers, import_what_ddp_imports
from dpkit.ddp.record import RankRecorder, RankRun
from dpkit.ddp.run import merged_trace
from dpkit.ddp.workload import DDP_MODELS, named_workload, training_step


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m dpkit.ddp.train",
        description="Train a tiny model on random 1x28x28 images under DDP, one process per "
        "rank (start it with torchrun); rank 0 writes trace.json, ranks.json and model.pt.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--model", choices=DDP_MODELS, default="mlp")
    parser.add_argument("--samples", type=int, default=256, help="images in the dataset")
    parser.add_argument("--batch-per-rank", type=int, default=32, help="rows per rank and step")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument(
        "--bucket-mb", type=float, default=None,
        help="DDP's bucket_cap_mb; None: torch's (25, the first bucket 1)",
    )  # fmt: skip
    parser.add_argument("--timeout", type=float, default=120.0, help="collective timeout (s)")
    parser.add_argument("--out", default=".", help="where rank 0 writes its files")
    return parser.parse_args(argv)


def _world_from_environment() -> None:
    """Run as a world of one when started by plain ``python`` (torchrun sets these)."""
    if "RANK" not in os.environ:
        os.environ.update(
            RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", GROUP_RANK="0"
        )
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(checks.free_port()))


def every_rank_has_a_gpu(local_world_size: int) -> bool:
    """Whether this node's ranks train on CUDA with NCCL: only when each of its
    ``local_world_size`` ranks has a GPU of its own. Every rank of the node decides alike;
    deciding by its own local rank would put rank 0 on NCCL and rank 1 on gloo on a 1-GPU
    box under ``--nproc_per_node=2``, and the first collective would hang until the timeout."""
    return torch.cuda.is_available() and local_world_size <= torch.cuda.device_count()


def _clock_offset(rank_zero_host: str) -> float:
    """What to add to this rank's clock to read rank 0's: 0 on rank 0's host (one
    monotonic clock per machine), else the difference of the two at a barrier."""
    dist.barrier()
    now = time.perf_counter()
    readings: list[float | None] = [None] * dist.get_world_size()
    dist.all_gather_object(readings, now)
    return 0.0 if socket.gethostname() == rank_zero_host else readings[0] - now


def train(args: argparse.Namespace, device: torch.device) -> tuple[RankRun, torch.nn.Module]:
    """This rank's training, recorded: its record and the trained model (DDP unwrapped)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    workload = named_workload(args.model)
    torch.manual_seed(workload.seed)  # the same dataset and first weights on every rank
    dataset = TensorDataset(*workload.data(args.samples))
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, seed=workload.seed)
    loader = DataLoader(dataset, batch_size=args.batch_per_rank, sampler=sampler)
    model = workload.model().to(device)

    recorder = RankRecorder(rank, world, device, process.Progress([0, 0], 0))
    cuda = device.type == "cuda"
    ddp = recorder.wrap(model, device_ids=[device] if cuda else None, bucket_cap_mb=args.bucket_mb)
    optimizer = workload.optimizer(ddp.parameters())
    recorder.watch(optimizer, keep_gradients=False)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            recorder.run_step(training_step, ddp, images, labels, optimizer)
    recorder.close()
    return recorder.result(args.bucket_mb), ddp.module


def recorder_for(rank: int, world: int, device: torch.device) -> RankRecorder:
    """A recorder for a rank that a launcher such as torchrun started (no dpkit parent
    watches its progress): ``recorder.wrap(model, ...)`` makes its DDP model."""
    import_what_ddp_imports()  # before the constructor is timed
    return RankRecorder(rank, world, device, process.Progress([0, 0], 0))


def write_trace(record: RankRun, who: dict, out: Path) -> None:
    """Every rank calls it at the end: rank 0 writes ``trace.json`` (a track per rank, named
    with its node: ``rank:2 (cpu, node 1)``) and ``ranks.json`` (``who`` of every rank) into
    ``out``. Times of ranks on another host than rank 0's are shifted onto rank 0's clock,
    read at a barrier here (to within the barrier's skew)."""
    world = dist.get_world_size()
    dist.barrier()
    reading: list[tuple[float, str] | None] = [None] * world
    dist.all_gather_object(reading, (time.perf_counter(), socket.gethostname()))
    zero_time, zero_host = reading[0]
    mine = reading[dist.get_rank()][0]
    offset = 0.0 if socket.gethostname() == zero_host else zero_time - mine
    record.events = [(p, s + offset, e + offset, *rest) for p, s, e, *rest in record.events]
    record.device = f"{record.device}, node {who.get('node', 0)}"
    gathered: list[tuple[RankRun, dict] | None] = [None] * world
    dist.all_gather_object(gathered, (record, who))
    if dist.get_rank() == 0:
        out.mkdir(parents=True, exist_ok=True)
        merged_trace([r for r, _ in gathered]).to_chrome_trace(out / "trace.json")
        (out / "ranks.json").write_text(json.dumps([w for _, w in gathered], indent=1))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    _world_from_environment()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    cuda = every_rank_has_a_gpu(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)  # before init: NCCL binds this rank to its GPU
    else:
        torch.set_num_threads(1)  # the ranks of a node share its cores
    import_what_ddp_imports()
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        timeout=datetime.timedelta(seconds=args.timeout),
        device_id=device if cuda else None,  # NCCL's communicator on this GPU, not a guess
    )
    hosts: list[str | None] = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    offset = _clock_offset(hosts[0])
    record, model = train(args, device)
    free_reducers()  # DDP is gone before the group is destroyed (see free_reducers)
    record.events = [(p, s + offset, e + offset, *rest) for p, s, e, *rest in record.events]
    who = {
        "rank": rank,
        "local_rank": local_rank,
        "node": int(os.environ.get("GROUP_RANK", "0")),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "device": str(device),
        "steps": len(record.step_times),
    }
    gathered: list[tuple[RankRun, dict] | None] = [None] * world
    dist.all_gather_object(gathered, (record, who))  # every rank gets them; rank 0 writes
    if rank == 0:
        _save(Path(args.out), model, gathered)
    dist.barrier()  # nobody leaves before rank 0 has saved
    dist.destroy_process_group()
    return 0


def _save(out: Path, model: torch.nn.Module, gathered: list) -> None:
    out.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out / "model.pt")  # DDP's .module: no "module." prefix
    runs = [record for record, _ in gathered]
    trace = merged_trace(runs)
    trace.to_chrome_trace(out / "trace.json")
    (out / "ranks.json").write_text(json.dumps([who for _, who in gathered], indent=1))
    steps = max(e.step for e in trace.events)
    print(f"rank 0: {len(runs)} ranks, {steps} steps each; wrote {out}/model.pt, trace.json,")
    print("ranks.json; per phase, mean per step:")
    print(trace.summary())


if __name__ == "__main__":
    raise SystemExit(main())
