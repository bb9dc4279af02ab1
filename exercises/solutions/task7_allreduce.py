"""Task 7: gradient all-reduce by hand (DDP style) against DataParallel's reduce-add.

Goal: DataParallel sums gradients by sending every device's gradient to device 0 (a
*reduce-add*), so device 0's link carries ``(n - 1) * N`` bytes each step while the
others carry ``N``. DistributedDataParallel instead *all-reduces*: in a ring, every lane
sends one ``1/n`` chunk to its neighbour per step, first ``n - 1`` steps that add
(reduce-scatter: afterwards lane ``i`` holds the full sum of chunk ``(i + 1) % n``), then
``n - 1`` steps that pass the finished chunks on (all-gather). Every lane ends with the
sum, and every lane sends and receives ``2 * (n - 1) / n * N`` bytes: no hot spot.
The surprise: counted fairly, the two move the same total. The ring's gradient sync moves
``2 (n - 1) N`` bytes per step; DataParallel's reduce-add moves ``(n - 1) N``, but it also
broadcasts the parameters from device 0 on every forward, another ``(n - 1) N``. What
differs is the load per link (every DataParallel byte goes through device 0, while no ring
lane sends or receives more than two gradients' worth however many lanes there are) and
when the bytes move (DDP's all-reduce overlaps the backward; see notebook 05). Real DDP calls
its process group's all-reduce once per gradient bucket and lets the backend (NCCL, gloo)
choose a ring or a tree; on GPUs with NCCL, torch's own reduce-add and broadcast run as
NCCL collectives too, and only fall back to copy-then-add as dpkit does.

You may use torch, ``dpkit.comm.copy_to`` (a real, counted copy between lanes; slices and
gradients carry no lane tag, so pass ``source=``), ``dpkit.add_transfer_listener`` and
``dpkit.comm.reduce_add`` (DataParallel's reduce-add, for the comparison), but not
``torch.distributed``. Grade your work with ``dpkit grade 7``.
"""

# Reference solution: every TODO of the stub, done. Graded by the same grader.

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

import dpkit
from dpkit.comm import copy_to, reduce_add
from dpkit.device import Device

Traffic = dict[int, tuple[int, int]]


def ring_allreduce_(tensors: Sequence[torch.Tensor], devices: Sequence[Device]) -> None:
    """Sum ``tensors`` (``tensors[i]`` on ``devices[i]``, same shape) in place, by a ring.

    Afterwards every ``tensors[i]`` holds the sum, in its own storage. Flatten each tensor
    (``view(-1)``: they are contiguous) and cut it into ``n`` chunks of nearly equal size
    (some may be empty when a tensor has fewer than ``n`` elements). Lane ``i`` only ever
    sends to lane ``(i + 1) % n``, one chunk per step, with
    ``copy_to(chunk, devices[next], "allreduce", source=devices[i])``.
    """
    n = len(tensors)
    if n == 1:
        return
    flats = [tensor.view(-1) for tensor in tensors]
    base, extra = divmod(flats[0].numel(), n)
    sizes = [base + 1 if c < extra else base for c in range(n)]
    chunks = [flat.split(sizes) for flat in flats]  # views: writing them writes the tensors
    for step in range(n - 1):  # reduce-scatter: lane i sends chunk (i - step) to lane i + 1
        sent = [
            copy_to(chunks[i][(i - step) % n], devices[(i + 1) % n], "allreduce", devices[i])
            for i in range(n)
        ]  # every lane sends before any adds, as on real hardware
        for i in range(n):
            chunks[(i + 1) % n][(i - step) % n].add_(sent[i])
    for step in range(n - 1):  # all-gather: pass each finished chunk on around the ring
        sent = [
            copy_to(chunks[i][(i + 1 - step) % n], devices[(i + 1) % n], "allreduce", devices[i])
            for i in range(n)
        ]
        for i in range(n):
            chunks[(i + 1) % n][(i + 1 - step) % n].copy_(sent[i])


def allreduce_gradients_(replicas: Sequence[nn.Module], devices: Sequence[Device]) -> None:
    """The all-reduce at the heart of DDP: sum every parameter's ``.grad`` across replicas.

    ``replicas[i]`` is a full copy of the model on ``devices[i]`` that ran backward on its
    own chunk. Afterwards every replica holds the same ``.grad`` for each parameter: the
    *sum* over replicas, computed with :func:`ring_allreduce_`, which is what DataParallel's
    reduce-add leaves and what the grader checks. Do not divide it. (Real DDP goes on to
    divide by the number of processes, so its gradients are the average, and it all-reduces
    during backward, one bucket of gradients at a time as each bucket is ready; here it runs
    after backward, parameter by parameter, and leaves the sum, so that it is plain to check.)
    """
    for params in zip(*(replica.parameters() for replica in replicas)):
        ring_allreduce_([param.grad for param in params], devices)


def traffic_per_lane(run: Callable[[], object]) -> Traffic:
    """Bytes each lane sent and received while ``run()`` ran: ``{lane: (sent, received)}``.

    Count every ``dpkit.Transfer`` with ``dpkit.add_transfer_listener`` (remove the
    listener afterwards, even if ``run`` raises). A lane's key is its ``Device.index``;
    the host (index -1) is lane 0's plain memory, so count it as lane 0. Include only
    lanes that sent or received something.
    """
    traffic: dict[int, list[int]] = {}

    def count(transfer: dpkit.Transfer) -> None:
        source, destination = max(transfer.source.index, 0), max(transfer.destination.index, 0)
        traffic.setdefault(source, [0, 0])[0] += transfer.nbytes
        traffic.setdefault(destination, [0, 0])[1] += transfer.nbytes

    handle = dpkit.add_transfer_listener(count)
    try:
        run()
    finally:
        handle.remove()
    return {lane: (sent, received) for lane, (sent, received) in sorted(traffic.items())}


def compare_traffic(devices: Sequence[Device], numel: int) -> dict[str, Traffic]:
    """Traffic per lane to sum one float32 gradient of ``numel`` elements from every lane.

    Put a gradient on each lane (``copy_to(torch.randn(numel), lane, "setup")``, outside
    the measurement), then return ``{"reduce_add": ..., "ring": ...}``: the traffic of
    ``reduce_add([[g] for g in grads], devices[0], devices)`` (DataParallel's backward)
    and of :func:`ring_allreduce_` on the same gradients.
    """
    grads = [copy_to(torch.randn(numel), device, "setup") for device in devices]
    return {
        "reduce_add": traffic_per_lane(
            lambda: reduce_add([[g] for g in grads], devices[0], devices)
        ),
        "ring": traffic_per_lane(lambda: ring_allreduce_(grads, devices)),
    }
