"""The all-reduce, seen from inside DDP: a communication hook that times every bucket.

The surprise first: DDP does not all-reduce gradients one by one, nor all at once after
backward. It packs them into *buckets* (about ``bucket_cap_mb`` each) and all-reduces a
bucket as soon as every gradient in it is ready, while backward goes on computing the
rest: that is the overlap the timeline shows. Which parameters share a bucket is decided
twice. Before the first step DDP cannot know the order in which gradients become ready;
so torch (since 1.12, through 2.x) puts *every* parameter in one bucket for step 1: one
all-reduce after the whole backward (the comment in ``DistributedDataParallel.
_ddp_init_helper`` says why; with ``find_unused_parameters=True`` it guesses the reverse
order of ``model.parameters()`` instead). At the start of step 2's
forward DDP *rebuilds* the buckets in the order the gradients actually became ready, each
filled until it reaches ``bucket_cap_mb`` (so a bucket can be larger than the cap: a
parameter is never split). Bucket indices and contents therefore change after step 1;
each event records the bucket's index, its parameters and its bytes in ``details``.

:func:`recorded_allreduce` does exactly what DDP does without a hook (torch's
``default_hooks.allreduce_hook``: divide by the world size, then an asynchronous
all-reduce, so the sum is the mean), and adds a clock reading when DDP hands it the bucket
and another when the all-reduce's future completes. See "DDP Communication Hooks",
https://pytorch.org/docs/stable/ddp_comm_hooks.html.

Bytes: ``nbytes`` is the bucket, what every rank contributes and gets back. A ring
all-reduce (gloo's and NCCL's usual algorithm) *sends* ``2 (n - 1) / n`` of that per rank
(and receives as much): reduce-scatter then all-gather, ``n - 1`` steps each of ``1 / n``
of the bucket; that is ``details["ring_sent_bytes"]``
(:func:`dpkit.cost.collectives.ring_bytes_sent`, the cost model's formula).

Compression (``recorder.compression``): ``"bf16"`` / ``"fp16"`` do what torch's
``bf16_compress_hook`` / ``fp16_compress_hook`` do (the bucket travels in a 2-byte type:
half the bytes, rounded). ``"powersgd"`` (rank 1) or ``"powersgd-R"`` runs torch's own
``powerSGD_hook`` (Vogels et al. 2019): each weight matrix's gradient ``M`` (n x m) travels
as a rank-R approximation, ``P`` (n x R) and ``Q`` (m x R), two all-reduces, and the
tensors not worth compressing (biases) in a third; ``nbytes`` is what torch's own counter
(``PowerSGDState.total_numel_after_compression``) says went out. So that one step's error
can be measured against exact gradients, it compresses from step 1 with no error feedback
and no warm start; torch's defaults for training differ (``start_powerSGD_iter=1000`` plain
all-reduces first, then error feedback, which adds each step's error to the next step's
gradient so that it is not lost).

No ``from __future__ import annotations`` here: DDP checks the hook's annotations against
``dist.GradBucket`` and ``torch.futures.Future[torch.Tensor]`` at registration, and string
annotations would fail that check.
"""

import re
import time
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

from dpkit.cost.collectives import ring_bytes_sent
from dpkit.tracing.events import Phase

if TYPE_CHECKING:
    from dpkit.ddp.record import RankRecorder

ALLREDUCE = Phase.ALLREDUCE.value
# Gradient compression: None, or the 2-byte type the bucket travels in (as torch's
# default_hooks.bf16_compress_hook and fp16_compress_hook do).
COMPRESSIONS = {None: None, "bf16": torch.bfloat16, "fp16": torch.float16}


def powersgd_rank(compression: str | None) -> int | None:
    """The rank R of ``"powersgd"`` (1) or ``"powersgd-R"``; None for other compressions.
    Raises ValueError for anything else, naming what is accepted."""
    if compression is None or compression in ("bf16", "fp16"):
        return None
    # Exactly "powersgd" or "powersgd-R" (or "powersgdR"): "powersgd-" is a typo, not rank 1.
    match = (
        re.fullmatch(r"powersgd(?:-?([0-9]+))?", compression)
        if isinstance(compression, str)
        else None
    )
    rank = int(match.group(1) or 1) if match else 0
    if rank >= 1:
        return rank
    raise ValueError(
        "compression must be None, 'bf16', 'fp16', 'powersgd' or 'powersgd-R' (R a whole "
        f"number of at least 1: the rank of the approximation), got {compression!r}"
    )


def powersgd_state(compression: str) -> powersgd.PowerSGDState:
    """torch's PowerSGD state for one DDP model: rank R from step 1, no error feedback and
    no warm start (see the module doc), the same random start on every rank (seed 0)."""
    return powersgd.PowerSGDState(
        process_group=None,
        matrix_approximation_rank=powersgd_rank(compression),
        start_powerSGD_iter=0,
        use_error_feedback=False,
        warm_start=False,
    )


def recorded_allreduce(
    recorder: "RankRecorder", bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP's own all-reduce of one bucket (the mean over ranks), timed into ``recorder``."""
    start = recorder.clock.mark()
    tensor = bucket.buffer()
    bucket_bytes = tensor.numel() * tensor.element_size()
    step = recorder.step
    details = {
        "bucket": bucket.index(),
        "parameters": recorder.names_of(bucket.parameters()),
        "last_bucket": bucket.is_last(),
    }
    # DDP's buckets are a second copy of the gradients, unless gradient_as_bucket_view made
    # the gradients views into them: only the bytes no gradient shares count as buckets.
    storage = tensor.untyped_storage().data_ptr()
    shared = sum(
        p.grad.numel() * p.grad.element_size()
        for p in bucket.parameters()
        if p.grad is not None and p.grad.untyped_storage().data_ptr() == storage
    )
    recorder.bucket_bytes[step] = recorder.bucket_bytes.get(step, 0) + bucket_bytes - shared
    if recorder.powersgd is not None:
        # torch's powerSGD_hook, unchanged; its own counter says how many elements it sends
        sent_before = recorder.powersgd.total_numel_after_compression
        future = powersgd.powerSGD_hook(recorder.powersgd, bucket)
        sent_numel = recorder.powersgd.total_numel_after_compression - sent_before
        nbytes = sent_numel * tensor.element_size()
        compression, details["compression"] = None, recorder.compression
    else:
        compression = COMPRESSIONS[recorder.compression]
        # What travels: the bucket itself, or (torch's bf16/fp16_compress_hook) a copy cast
        # to a 2-byte type, all-reduced, then cast back into the bucket: half the bytes.
        sent = tensor if compression is None else tensor.to(compression)
        nbytes = sent.numel() * sent.element_size()
        if compression is not None:
            details["compression"] = recorder.compression
        # Divide first, as torch's allreduce_hook does, so that large sums cannot overflow.
        sent.div_(recorder.nproc)
        future = dist.all_reduce(sent, async_op=True).get_future()
    details["ring_sent_bytes"] = ring_bytes_sent(nbytes, recorder.nproc)

    def done(finished: torch.futures.Future) -> torch.Tensor:
        # Runs when the all-reduce has finished (on gloo, in its own thread; on CUDA with
        # the collective's stream current, so the clock's CUDA event marks its end).
        result = finished.value()
        result = result[0] if isinstance(result, list) else result
        if compression is not None:
            result = tensor.copy_(result)  # back into the bucket, in its own type
        if recorder.emulated_link is not None:
            hold_for_the_emulated_link(recorder, start, details)
        recorder.add(ALLREDUCE, start, recorder.clock.mark(), nbytes, step, details)
        return result

    return future.then(done)


def hold_for_the_emulated_link(recorder: "RankRecorder", start: float, details: dict) -> None:
    """An emulation, labelled as such: the bucket's all-reduce ends no earlier than if the
    ring's bytes (``2 (n - 1) / n`` of the bucket, sent by each rank) had crossed a link of
    ``recorder.emulated_link`` bytes/s, one bucket after another (a link carries one
    message at a time), instead of this machine's loopback. Holds the all-reduce's future
    (gloo's thread sleeps), so DDP waits for it as for a slow network. CPU ranks only."""
    wire = details["ring_sent_bytes"] / recorder.emulated_link
    begins = max(start, recorder.link_free_at)
    recorder.link_free_at = begins + wire
    lag = recorder.link_free_at - time.perf_counter()
    if lag > 0:
        time.sleep(lag)
    details["emulated_link_bytes_per_s"] = recorder.emulated_link
