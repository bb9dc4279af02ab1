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

Each step is recorded in the format of DDP's traces (:mod:`dpkit.ddp.record`): every
collective an engine calls from Python (FSDP's all-gathers and reduce-scatters, ZeRO-1's
broadcasts, DDP's all-reduces through torch's own ``allreduce_hook``) becomes an event on
its rank's track, named as the process group names it (``allgather``, ``reduce_scatter``,
``broadcast``, ``allreduce``), with its payload's bytes, its start and its end; beside them
the calls the rank made: ``apply`` (the forward), ``backward`` (``loss.backward()``) and
``optimizer`` (``optimizer.step()``), each a whole call, so the collectives it waited for
are inside it. :func:`traces` turns the rows into one :class:`~dpkit.tracing.Trace` per
engine; :func:`measure_link` times the same gloo ring the engines use, for
:func:`predicted_collective_seconds` (``dpkit.cost``'s ring formulas) to predict each event.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import os
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from dpkit.models import wide_mlp
from dpkit.table import Table

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


# The phase each collective's event gets: the name torch's ProcessGroup gives the operation
# (ProcessGroup.allgather, .reduce_scatter, .broadcast, .allreduce), as DDP's traces already
# call theirs "allreduce".
PHASES = {"all_gather_single": "allgather", "all_gather_into_tensor": "allgather",
          "reduce_scatter_single": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
          "broadcast": "broadcast", "all_reduce": "allreduce"}  # fmt: skip
COLLECTIVE_PHASES = tuple(dict.fromkeys(PHASES.values()))
# An event: phase, start, end (perf_counter seconds: one clock for every rank, see
# dpkit.ddp.record), bytes, step, details; as dpkit.ddp.record.RankRun.events holds them.
EventTuple = tuple[str, float, float, int, int, dict[str, Any]]


class StepRecorder:
    """One rank's events, in :class:`dpkit.ddp.record.RankRun`'s format, step by step."""

    def __init__(self) -> None:
        self.events: list[EventTuple] = []
        self.step = 0

    def add(self, phase: str, start: float, end: float, nbytes: int, details: dict) -> None:
        self.events.append((phase, start, end, nbytes, self.step, details))  # atomic: any thread

    @contextlib.contextmanager
    def call(self, phase: str) -> Iterator[None]:
        """Time what runs inside as one ``phase`` event of the current step."""
        start = time.perf_counter()
        yield
        self.add(phase, start, time.perf_counter(), 0, {})


@contextlib.contextmanager
def traced_collectives(recorder: StepRecorder) -> Iterator[None]:
    """Record each Python-level collective call as an event of ``recorder`` while inside:
    from the call to the collective's end (a synchronous call's return; an asynchronous
    one's future completing, in gloo's own thread, as DDP's recorded all-reduce times its
    buckets), its payload's bytes, and in ``details`` the bytes a ring sends from this
    rank (:data:`RING_SHARE`) and torch's function."""
    world = dist.get_world_size()
    saved = {name: getattr(dist, name) for name in RING_SHARE if hasattr(dist, name)}

    def traced(name: str, original: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            payload = _payload(name, args, kwargs)
            sent = round(RING_SHARE[name] * (world - 1) / world * payload)
            details = {"ring_sent_bytes": sent, "function": f"torch.distributed.{name}"}
            step, start = recorder.step, time.perf_counter()
            work = original(*args, **kwargs)

            def done(*_: Any) -> None:
                end = time.perf_counter()
                recorder.events.append((PHASES[name], start, end, payload, step, details))

            if work is None:  # a synchronous call: it has finished
                done()
            else:
                work.get_future().then(done)
            return work

        return call

    for name, original in saved.items():
        setattr(dist, name, traced(name, original))
    try:
        yield
    finally:
        for name, original in saved.items():
            setattr(dist, name, original)


def sent_in_step(events: Sequence[EventTuple], step: int) -> dict[str, int]:
    """Bytes a ring sends from this rank in ``step``, by collective (:data:`COLLECTIVE_NAMES`)."""
    sent: Counter[str] = Counter()
    names = {PHASES[name]: COLLECTIVE_NAMES[name] for name in PHASES}
    for phase, _, _, _, at, details in events:
        if at == step and phase in names:
            sent[names[phase]] += details["ring_sent_bytes"]
    return dict(sent)


@contextlib.contextmanager
def saved_activations(model: nn.Module, inputs: torch.Tensor, into: list[int]) -> Iterator[None]:
    """Append to ``into`` the bytes autograd saves for backward while inside (each storage
    once), but for the parameters (FSDP's gathered ones included: the module's parameters
    when the tensor is saved) and ``inputs``: the activations a rank holds between its
    forward and its backward."""
    seen: set[int] = set()

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = _local(tensor).untyped_storage()
        known = {_local(p).untyped_storage().data_ptr() for p in model.parameters()}
        known.add(inputs.untyped_storage().data_ptr())
        if storage.data_ptr() not in known | seen:
            seen.add(storage.data_ptr())
            into.append(storage.nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield


def train_engine(engine: str, width: int, batch: int, steps: int) -> dict[str, Any]:
    """A few Adam steps of :func:`wide_mlp` under ``engine`` on this rank's rows; the bytes
    it then holds, the activations its last forward saved (:func:`saved_activations`),
    every step's events (:class:`StepRecorder`), and the bytes its collectives sent from
    this rank in the last step."""
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
        # C++ Reducer calls), called from Python, where traced_collectives sees it
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
    recorder = StepRecorder()
    for step in range(1, steps + 1):
        recorder.step = step
        dist.barrier()  # every rank starts the step together (the barrier is not traced)
        with traced_collectives(recorder):
            optimizer.zero_grad(set_to_none=False)  # keep the gradients to count them
            saved: list[int] = []
            with recorder.call("apply"), saved_activations(model, images, saved):
                loss = nn.functional.cross_entropy(trained(images), labels)
            with recorder.call("backward"):
                loss.backward()
            with recorder.call("optimizer"):
                optimizer.step()
    events = sorted(recorder.events, key=lambda event: event[1])
    return {"rank": rank, "engine": engine, **held(model, optimizer), "activations": sum(saved),
            "sent": sent_in_step(events, steps), "events": events}  # fmt: skip


def sharding_main(argv: Sequence[str]) -> list[dict[str, Any]]:
    """One rank: the gloo link measured (:func:`measure_link`), then each of ``--engines``
    in turn (a fresh model each); the bytes it held after the last step under each, its
    events and the link, one dict per engine."""
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
    link = measure_link()
    results = [
        {**train_engine(engine, args.width, args.batch, args.steps), "link": link}
        for engine in args.engines.split(",")
    ]
    gc.collect()  # DDP's reducers before the group (see dpkit.ddp.rank.free_reducers)
    dist.destroy_process_group()
    return results


def measure(
    ranks: int = 2, width: int = 512, steps: int = 2, batch: int = 16
) -> list[dict[str, Any]]:
    """Rows of bytes per rank under each engine, measured on ``ranks`` gloo ranks (one
    launch), with the model's size and what :func:`predicted_bytes` predicts; each row's
    ``events`` are its rank's steps (:func:`traces` draws them), ``link`` the measured
    gloo ring's (bandwidth, latency)."""
    from dpkit.ddp.script import run_main

    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 2:
        raise ValueError(
            f"ranks={ranks!r}: sharding is measured on 2 ranks or more (one rank holds every "
            "shard and sends nothing, and its ring has no link to time); pass e.g. ranks=2"
        )
    argv = ["--init-method", "{store}", "--width", str(width), "--steps", str(steps),
            "--batch", str(batch)]  # fmt: skip
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


def measure_link(small: int = 1 << 12, large: int = 1 << 22, repeats: int = 20) -> tuple:
    """This rank's gloo ring, measured as the cost model describes a link: ``(bandwidth,
    latency)`` for ``t = 2 (n - 1) / n * S / B + 2 (n - 1) * alpha`` (dpkit.cost's ring
    all-reduce), each from the fastest of its repeats (a busy machine only adds time): the
    latency from all-reduces of ``small`` bytes, whose bytes take microseconds of them
    (``repeats`` of them), the bandwidth from ``repeats // 4`` of ``large`` bytes, less
    that latency; if the latency reads as all of it (noise), the large one's whole time.
    Every rank must call it; each returns its own reading."""
    world = dist.get_world_size()

    def fastest(size: int, times: int) -> float:
        tensor, best = torch.ones(size // 4), float("inf")
        for _ in range(times):
            dist.barrier()  # both ranks start together: the fastest repeat is the ring's
            start = time.perf_counter()
            dist.all_reduce(tensor)
            best = min(best, time.perf_counter() - start)
        return best

    tiny, whole = fastest(small, repeats), fastest(large, max(1, repeats // 4))
    return ring_link(tiny, whole, large, world)


def ring_link(tiny: float, whole: float, large: int, world: int) -> tuple[float, float]:
    """``(bandwidth, latency)`` of a ring of ``world`` ranks whose all-reduce of a few bytes
    took ``tiny`` seconds (all latency: its ``2 (n - 1)`` steps) and of ``large`` bytes
    ``whole`` seconds (``2 (n - 1) / n * large`` bytes on the wire, after that latency)."""
    latency = tiny / (2 * (world - 1))
    wire = whole - 2 * (world - 1) * latency
    bandwidth = 2 * (world - 1) / world * large / (wire if wire > 0 else whole)
    return bandwidth, latency


def predicted_collective_seconds(phase: str, nbytes: int, ranks: int, link: Any) -> float:
    """``dpkit.cost``'s time for one collective of ``nbytes`` (its payload) over ``ranks``
    on ``link`` (a :class:`dpkit.cost.Link`): a ring all-reduce; an all-gather or
    reduce-scatter, one half of it (the ring's ``n - 1`` steps of ``1/n``); a broadcast
    pipelined down the ring."""
    import dpkit.cost as cost

    if phase == "broadcast":
        return cost.broadcast(nbytes, ranks, link)
    ring = cost.ring_allreduce(nbytes, ranks, link)
    return ring if phase == "allreduce" else ring / 2


def link_of(rows: Sequence[dict[str, Any]]) -> Any:
    """The gloo ring rank 0 measured (:func:`measure_link`), as a :class:`dpkit.cost.Link`."""
    import dpkit.cost as cost

    bandwidth, latency = next(row["link"] for row in rows if row["rank"] == 0)
    return cost.Link(bandwidth, latency, "measured: gloo all-reduces on this machine's loopback")


def traces(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One :class:`~dpkit.tracing.Trace` per engine of ``rows`` (from :func:`measure`): a
    track per rank (``rank:0 (cpu)``, ...) with its calls and collectives, step by step, and
    the bytes it held after the last step; the format of :func:`dpkit.ddp.run_ddp`'s."""
    from dpkit.ddp.record import RankRun
    from dpkit.ddp.run import merged_trace

    by_engine: dict[str, list[RankRun]] = {}
    for row in rows:
        last = max(event[4] for event in row["events"])
        memory = [(c, row[c], last) for c in ("parameters", "gradients", "optimizer state")]
        by_engine.setdefault(row["engine"], []).append(
            RankRun(
                rank=row["rank"],
                device="cpu",
                pid=0,
                bucket_cap_mb=None,
                parameter_bytes=row["parameters"],
                events=list(row["events"]),
                memory=memory,
            )  # fmt: skip
        )
    return {engine: merged_trace(runs) for engine, runs in by_engine.items()}


def step_seconds(trace: Any, step: int | None = None) -> float:
    """How long ``step`` (default: the last) took: from the first rank's first event to
    the last rank's last."""
    events = trace.events
    step = max(e.step for e in events) if step is None else step
    chosen = [e for e in events if e.step == step]
    return max(e.end for e in chosen) - min(e.start for e in chosen)


def typical_step(trace: Any) -> int:
    """The step of median length among all but the first (which sets the engine up: DDP
    builds its buckets, Adam its state), the lower one of an even count."""
    steps = sorted({e.step for e in trace.events})
    later = steps[1:] or steps
    ranked = sorted(later, key=lambda number: step_seconds(trace, number))
    return ranked[(len(ranked) - 1) // 2]


def ddp_prediction(width: int, batch: int, ranks: int, link: Any, optimizer: str = "adam") -> Any:
    """:func:`dpkit.cost.predict`'s DDP step of :func:`wide_mlp` on ``ranks`` of this
    machine (its documented preset, the devices' link replaced by ``link``): a
    :class:`dpkit.cost.PredictedTrace`, its ``step_time`` and what each device ``held``."""
    import dataclasses

    import dpkit.cost as cost

    model = wide_mlp(width=width, hidden=2)
    machine = dataclasses.replace(cost.preset("this-machine"), device_to_device=link)
    sample = torch.randn(1, 1, 28, 28)
    return cost.predict(model, sample, batch, ranks, machine, strategy="ddp", optimizer=optimizer)


def predicted_step_seconds(
    ddp: Any, parameter_bytes: int, ranks: int, link: Any
) -> dict[str, float]:
    """Each engine's step time from ``ddp`` (:func:`ddp_prediction`): DDP's as predicted;
    ZeRO-1's, DDP's plus the broadcast of the updated parameters (``parameter_bytes``) over
    ``link``; FSDP's, DDP's plus one more ring all-gather of them (a ring all-reduce is a
    reduce-scatter and an all-gather; FSDP adds the backward's second all-gather). Overlap
    with computation is DDP's as predicted; FSDP's is not modelled."""
    extra = {
        "ddp": 0.0,
        "zero1": predicted_collective_seconds("broadcast", parameter_bytes, ranks, link),
        "fsdp": predicted_collective_seconds("allgather", parameter_bytes, ranks, link),
    }
    return {engine: ddp.step_time + seconds for engine, seconds in extra.items()}


def busy_seconds(intervals: Sequence[tuple[float, float]]) -> float:
    """How long at least one of ``intervals`` (start, end) ran: overlapping calls (ZeRO-1's
    broadcasts are issued together, then waited for) count once."""
    busy, reached = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reached:
            busy += end - max(start, reached)
            reached = end
    return busy


def step_table(
    traces: dict[str, Any], steps: dict[str, int], predicted_s: dict[str, float], link: Any
) -> Any:
    """A row per engine and collective of ``steps`` (by engine): calls, payload bytes, and
    rank 0's time in them, measured (how long at least one ran: :func:`busy_seconds`) and
    predicted (the sum of :func:`predicted_collective_seconds` over ``link``: a link
    carries one message at a time), after a row for the whole step (measured:
    :func:`step_seconds`; predicted: ``predicted_s``)."""
    table = Table()
    for engine, trace in traces.items():
        step = steps[engine]
        table.append({"engine": engine, "step": step, "what": "the step", "calls": 1,
                      "payload_bytes": 0, "measured_ms": step_seconds(trace, step) * 1e3,
                      "predicted_ms": predicted_s[engine] * 1e3})  # fmt: skip
        ranks = len({e.device for e in trace.events})
        found: dict[str, list] = {}
        for e in trace.events:
            if e.step == step and e.device.startswith("rank:0 ") and e.phase in PHASES.values():
                into = found.setdefault(e.phase, [0, 0, [], 0.0])
                into[0] += 1
                into[1] += e.nbytes
                into[2].append((e.start, e.end))
                into[3] += predicted_collective_seconds(e.phase, e.nbytes, ranks, link)
        for phase, (calls, nbytes, intervals, guess) in found.items():
            table.append({"engine": engine, "step": step, "what": f"rank 0's {phase}",
                          "calls": calls, "payload_bytes": nbytes,
                          "measured_ms": busy_seconds(intervals) * 1e3,
                          "predicted_ms": guess * 1e3})  # fmt: skip
    return table
