"""From DataParallel to DistributedDataParallel: the whole recipe in one script to copy.

    python examples/ddp_recipe.py --out runs/one                     # one process (world of 1)
    torchrun --nproc_per_node=4 examples/ddp_recipe.py --out runs/four    # 4 ranks, one machine
    torchrun --nnodes=2 --nproc_per_node=2 --node_rank=0 --master_addr=NODE0 \\
        --master_port=29500 examples/ddp_recipe.py --out runs/two_nodes     # on node 0; node 1
                                                                            # the same, rank 1

What changes from a DataParallel script, each marked ``# recipe:`` below:

1. **Launch**: ``torchrun`` starts one process per device (a *rank*) and tells each who it is
   in environment variables: ``RANK`` (0 to ``WORLD_SIZE - 1`` over all nodes), ``LOCAL_RANK``
   (its index on this node: its GPU), ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` (where
   rank 0's store listens: torch's TCPStore listens on every network interface of that
   machine, unauthenticated, so run on a private network or behind a firewall).
2. **Device**: ``torch.cuda.set_device(LOCAL_RANK)`` before the process group, NCCL on GPUs,
   gloo on CPUs; the model goes to that device and is wrapped in ``DistributedDataParallel``.
3. **Data**: ``DistributedSampler`` gives each rank its own share of every epoch (padded by
   repeating samples when the dataset does not divide evenly); ``set_epoch`` every epoch, or
   every epoch shuffles alike. ``--batch`` here is the *global* batch of an optimizer step:
   each rank loads ``batch / (WORLD_SIZE * accumulate)`` rows at a time.
4. **Learning rate**: scaled with the global batch (the linear rule: ``lr * batch /
   base_batch``) and warmed up over the first steps (Goyal et al., 2017, "Accurate, Large
   Minibatch SGD"). A run with the same global batch on 1 or 4 ranks uses the same rate and
   reaches the same parameters (tests/test_ddp_recipe.py).
5. **Gradient accumulation**: ``with ddp.no_sync():`` for every micro-batch but the last of
   a step, so DDP all-reduces once per optimizer step, not once per micro-batch; the loss is
   divided by ``accumulate``, so the step's gradient is the mean over its global batch.
6. **BatchNorm**: ``SyncBatchNorm.convert_sync_batchnorm`` computes the statistics over the
   global batch, not each rank's share (torch 2.13: GPU modules only; on CPU DDP refuses it).
7. **Side effects once**: rank 0 saves ``ddp.module.state_dict()`` (without DDP's
   ``module.`` prefix, so a plain model loads it) and the others wait at a barrier.
8. **Uneven inputs**: if ranks can get different numbers of batches (a sampler that does not
   pad), train inside ``with Join([ddp]):`` so the ranks that finish early shadow the others'
   all-reduces instead of hanging them (``--uneven`` shows it).

Only torch is needed. ``--trace`` records every rank with dpkit (not on PyPI: the course's
wheel, or ``pip install "dpkit @ git+COURSE_REPOSITORY"``) and writes ``trace.json`` (a track per rank, named with its node) and ``ranks.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import socket
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=512, help="images in the dataset")
    parser.add_argument("--batch", type=int, default=64, help="global batch per optimizer step")
    parser.add_argument("--accumulate", type=int, default=1, help="micro-batches per step")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate at --base-batch")
    parser.add_argument("--base-batch", type=int, default=64, help="the batch --lr was tuned at")
    parser.add_argument("--warmup", type=int, default=0, help="steps of linear warm-up")
    parser.add_argument("--batch-norm", action="store_true", help="a BatchNorm layer (synced)")
    parser.add_argument("--uneven", action="store_true", help="rank r skips r batches an epoch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init-method", default="env://", help="where the ranks meet")
    parser.add_argument("--timeout", type=float, default=120.0, help="collective timeout (s)")
    parser.add_argument("--out", default="runs/recipe", help="where rank 0 writes")
    parser.add_argument("--trace", action="store_true", help="record the ranks with dpkit")
    return parser.parse_args(argv)


def build_model(batch_norm: bool = False) -> nn.Module:
    norm = [nn.BatchNorm1d(64)] if batch_norm else []
    return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 64), *norm, nn.ReLU(), nn.Linear(64, 10))


def build_dataset(samples: int, seed: int) -> TensorDataset:
    """Random 1x28x28 images and labels, the same on every rank (its own generator)."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(samples, 1, 28, 28, generator=generator)
    return TensorDataset(images, torch.randint(0, 10, (samples,), generator=generator))


def learning_rate(step: int, args: argparse.Namespace) -> float:
    """The linear scaling rule, warmed up linearly over ``args.warmup`` steps."""
    scaled = args.lr * args.batch / args.base_batch  # recipe: scale with the global batch
    return scaled * min(1.0, (step + 1) / args.warmup) if args.warmup else scaled


def _world_of_one() -> str:
    """Without torchrun: this process is the whole world, meeting itself through a file."""
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
    return "file://" + os.path.join(tempfile.mkdtemp(prefix="ddp-recipe-"), "store")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    init_method = args.init_method
    if "RANK" not in os.environ:
        init_method = _world_of_one()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])  # recipe: which device on this node
    node = int(os.environ.get("GROUP_RANK", "0"))
    cuda = torch.cuda.is_available() and int(os.environ["LOCAL_WORLD_SIZE"]) <= (
        torch.cuda.device_count()
    )
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)  # recipe: before the process group (NCCL binds to it)
    else:
        torch.set_num_threads(1)  # the ranks of a node share its cores
    dist.init_process_group(  # recipe: join the others (env:// reads torchrun's variables)
        "nccl" if cuda else "gloo",
        init_method=init_method,
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=args.timeout),
    )
    if args.batch % (world * args.accumulate):
        raise SystemExit(f"--batch {args.batch} must split into {world} ranks x --accumulate")
    micro = args.batch // (world * args.accumulate)

    torch.manual_seed(args.seed)  # the same first weights everywhere (DDP broadcasts rank 0's)
    model = build_model(args.batch_norm).to(device)
    if args.batch_norm and cuda:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # recipe: global statistics
    dataset = build_dataset(args.samples, args.seed)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, seed=args.seed)
    loader = DataLoader(dataset, batch_size=micro, sampler=sampler)  # recipe: its share

    recorder = None
    if args.trace:  # optional: dpkit records this rank's steps, phases and all-reduces
        from dpkit.ddp.train import recorder_for

        recorder = recorder_for(rank, world, device)
        ddp = recorder.wrap(model, device_ids=[device] if cuda else None)
    else:
        ddp = DistributedDataParallel(model, device_ids=[device] if cuda else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=learning_rate(0, args))
    if recorder is not None:
        recorder.watch(optimizer, keep_gradients=False)

    step = 0
    with Join([ddp]) if args.uneven else contextlib.nullcontext():  # recipe: uneven inputs
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)  # recipe: a new shuffle each epoch, alike on every rank
            batches = list(loader)
            if args.uneven:
                batches = batches[: len(batches) - rank]  # rank r has r batches fewer
            for first in range(0, len(batches) - args.accumulate + 1, args.accumulate):
                group = batches[first : first + args.accumulate]
                for group_ in optimizer.param_groups:
                    group_["lr"] = learning_rate(step, args)
                if recorder is None:
                    optimizer_step(ddp, group, optimizer, device)
                else:
                    recorder.run_step(optimizer_step, ddp, group, optimizer, device)
                step += 1

    if rank == 0:  # recipe: side effects once, from rank 0
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        # ddp.module: the model itself, so the keys have no "module." prefix
        torch.save({"model": ddp.module.state_dict(), "steps": step}, out / "checkpoint.pt")
    if recorder is not None:
        from dpkit.ddp.train import write_trace

        recorder.close()
        who = {"rank": rank, "local_rank": local_rank, "node": node, "steps": step,
               "host": socket.gethostname(), "pid": os.getpid(), "device": str(device)}  # fmt: skip
        write_trace(recorder.result(None), who, Path(args.out))
    dist.barrier()  # recipe: nobody leaves before rank 0 has saved
    del ddp  # DDP's reducer before the group (see dpkit.ddp.rank.free_reducers)
    dist.destroy_process_group()
    return 0


def optimizer_step(ddp: nn.Module, group: list, optimizer: torch.optim.Optimizer, device) -> None:
    """One optimizer step over ``group``'s micro-batches: all-reduce once, at the last."""
    optimizer.zero_grad(set_to_none=True)
    for index, (images, labels) in enumerate(group):
        last = index == len(group) - 1
        with contextlib.nullcontext() if last else ddp.no_sync():  # recipe: accumulate
            loss = nn.functional.cross_entropy(ddp(images.to(device)), labels.to(device))
            (loss / len(group)).backward()  # the mean over the step's global batch
    optimizer.step()


if __name__ == "__main__":
    raise SystemExit(main())
