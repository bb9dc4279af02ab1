"""When the model does not fit: ZeRO-1 and FSDP beside DDP, memory per rank measured.

The surprise first: DDP keeps a whole copy of everything on every rank: parameters,
gradients (and DDP's buckets, a second copy of them unless ``gradient_as_bucket_view``),
and the optimizer's state (Adam: two more copies of the parameters). Sharding cuts them
over the ``n`` ranks (Rajbhandari et al., "ZeRO", SC 2020):

=================  ==================================================================
``ddp``            everything whole on every rank
``zero1``          torch's ``ZeroRedundancyOptimizer``: each rank keeps and updates the
                   optimizer state of 1/n of the parameters, then broadcasts them
``fsdp``           torch's FSDP2 ``fully_shard`` (ZeRO-3): parameters, gradients and
                   optimizer state all in 1/n shards; a layer's parameters are
                   all-gathered for its forward and backward, its gradients
                   reduce-scattered (runs on the CPU over gloo in torch 2.13)
=================  ==================================================================

:func:`sharding_main` is what each rank runs (through :func:`dpkit.ddp.script.run_main`):
it trains a few Adam steps under one engine and returns the bytes it holds, by category,
counted from the tensors themselves (a sharded parameter's local shard, the optimizer's
state tensors); :func:`predicted_bytes` is the ZeRO paper's arithmetic for the same.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from dpkit.ddp.workload import wide_mlp

ENGINES = ("ddp", "zero1", "fsdp")


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (FSDP2's parameters and gradients), else the tensor."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _nbytes(tensors: Any) -> int:
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors)


def held(model: nn.Module, optimizer: Any) -> dict[str, int]:
    """Bytes this rank holds: parameters, gradients, optimizer state (this rank's part)."""
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer's local Adam
    state = [t for s in inner.state.values() for t in s.values() if torch.is_tensor(t)]
    state = [t for t in state if t.dim() > 0]  # Adam's step counters are 0-d: left out
    parameters = list(model.parameters())
    return {
        "parameters": _nbytes(parameters),
        "gradients": _nbytes(p.grad for p in parameters if p.grad is not None),
        "optimizer state": _nbytes(state),
    }


# The collectives the engines call from Python, and how much of a payload of P bytes a rank
# sends over a ring of n (an all-gather's output, a reduce-scatter's input: (n - 1) / n of it;
# a broadcast pipelined down the ring: the same on average; an all-reduce, 2 (n - 1) / n).
RING_SHARE = {
    "all_gather_single": 1, "all_gather_into_tensor": 1,
    "reduce_scatter_single": 1, "reduce_scatter_tensor": 1, "broadcast": 1, "all_reduce": 2,
}  # fmt: skip
# what each names in a table: the collective, not torch's function
COLLECTIVE_NAMES = {"all_gather_single": "all-gather", "all_gather_into_tensor": "all-gather",
                    "reduce_scatter_single": "reduce-scatter",
                    "reduce_scatter_tensor": "reduce-scatter", "broadcast": "broadcast",
                    "all_reduce": "all-reduce"}  # fmt: skip


def _payload(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """Bytes of the collective's whole tensor: an all-gather's output, a reduce-scatter's
    input, the tensor broadcast or all-reduced."""
    if name.startswith("reduce_scatter"):
        tensor = kwargs.get("input", args[1] if len(args) > 1 else None)
    else:
        tensor = args[0] if args else kwargs.get("output_tensor", kwargs.get("tensor"))
    return 0 if tensor is None else tensor.numel() * tensor.element_size()


@contextlib.contextmanager
def counted_collectives(counts: Counter[str]) -> Iterator[None]:
    """Add the bytes each Python-level collective call sends from this rank to ``counts``,
    by collective (ring arithmetic, :data:`RING_SHARE`), while inside."""
    world = dist.get_world_size()
    saved = {name: getattr(dist, name) for name in RING_SHARE if hasattr(dist, name)}

    def counting(name: str, original: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            share = RING_SHARE[name] * (world - 1) / world
            counts[COLLECTIVE_NAMES[name]] += round(share * _payload(name, args, kwargs))
            return original(*args, **kwargs)

        return call

    for name, original in saved.items():
        setattr(dist, name, counting(name, original))
    try:
        yield
    finally:
        for name, original in saved.items():
            setattr(dist, name, original)


def train_engine(engine: str, width: int, batch: int, steps: int) -> dict[str, Any]:
    """A few Adam steps of :func:`wide_mlp` under ``engine`` on this rank's rows; the bytes
    it then holds, and the bytes its collectives sent from this rank in the last step."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = wide_mlp(width=width, hidden=2)
    if engine == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)  # a unit per layer: gathered for its forward and backward
        fully_shard(model)
        trained, optimizer = model, torch.optim.Adam(model.parameters(), lr=1e-3)
    if engine != "fsdp":
        trained = nn.parallel.DistributedDataParallel(model)
        # torch's own all-reduce hook: the same all-reduce as DDP's built-in one (which its
        # C++ Reducer calls), called from Python, where counted_collectives sees it
        trained.register_comm_hook(None, default_hooks.allreduce_hook)
        if engine == "zero1":
            from torch.distributed.optim import ZeroRedundancyOptimizer

            optimizer = ZeroRedundancyOptimizer(
                trained.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3
            )
        else:
            optimizer = torch.optim.Adam(trained.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(rank)
    images = torch.randn(batch // world, 1, 28, 28, generator=generator)
    labels = torch.randint(0, 10, (batch // world,), generator=generator)
    sent: Counter[str] = Counter()  # the last step's: the first ones also set things up
    for step in range(steps):
        with counted_collectives(sent) if step == steps - 1 else contextlib.nullcontext():
            optimizer.zero_grad(set_to_none=False)  # keep the gradients to count them
            nn.functional.cross_entropy(trained(images), labels).backward()
            optimizer.step()
    return {"rank": rank, "engine": engine, **held(model, optimizer), "sent": dict(sent)}


def sharding_main(argv: Sequence[str]) -> list[dict[str, Any]]:
    """One rank: each of ``--engines`` in turn (a fresh model each); the bytes it held
    after the last step under each, one dict per engine."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--init-method", required=True)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--width", type=int, default=512)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=args.init_method, rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]), timeout=datetime.timedelta(seconds=60),
    )  # fmt: skip
    results = [
        train_engine(engine, args.width, args.batch, args.steps)
        for engine in args.engines.split(",")
    ]
    gc.collect()  # DDP's reducers before the group (see dpkit.ddp.rank.free_reducers)
    dist.destroy_process_group()
    return results


def measure(ranks: int = 2, width: int = 512) -> list[dict[str, Any]]:
    """Rows of bytes per rank under each engine, measured on ``ranks`` gloo ranks (one
    launch), with the model's size and what :func:`predicted_bytes` predicts."""
    from dpkit.ddp.script import run_main

    argv = ["--init-method", "{store}", "--width", str(width)]
    per_rank = run_main(sharding_main, argv, nproc=ranks)
    model_bytes = sum(p.numel() * p.element_size() for p in wide_mlp(width, 2).parameters())
    rows = []
    for results in zip(*per_rank):
        for result in results:
            predicted = predicted_bytes(model_bytes, ranks, result["engine"])
            rows.append({**result, "model bytes": model_bytes,
                         **{f"predicted {k}": v for k, v in predicted.items()}})  # fmt: skip
    return rows


def predicted_bytes(parameter_bytes: int, ranks: int, engine: str, state_copies: int = 2) -> dict:
    """Bytes per rank the ZeRO paper's arithmetic predicts for ``engine``: parameters,
    gradients and optimizer state (``state_copies`` x the parameters: Adam's two moments),
    whole or divided over ``ranks``; DDP's buckets and FSDP's gathered layer left out."""
    state = state_copies * parameter_bytes
    split = {"ddp": (1, 1, 1), "zero1": (1, 1, ranks), "fsdp": (ranks, ranks, ranks)}[engine]
    return {
        "parameters": parameter_bytes // split[0],
        "gradients": parameter_bytes // split[1],
        "optimizer state": state // split[2],
    }
