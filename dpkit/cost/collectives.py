"""How long communication takes: the operation torch really issues, each a formula of a line.

The surprise first: on GPUs, DataParallel and DDP move about the same bytes per step.
torch's DataParallel does *not* copy the model to each GPU one after another: ``replicate``
calls ``comm.broadcast_coalesced`` (an NCCL broadcast, pipelined down a ring, in 10 MiB
buffers) and backward calls ``comm.reduce_add_coalesced`` (an NCCL reduce onto device 0),
each about ``S / B``. DDP's ring all-reduce moves ``2 (n - 1) / n * S / B``. What makes
DataParallel slower is not its bytes but *when* it moves them (every step, and the reduce
only after the whole backward) and device 0's extra work (the gather, the loss, the
memory). dpkit's virtual lanes are another path: there the host copies each tensor to each
lane itself (:func:`through_device0`).

Notation: ``S`` bytes, ``n`` devices, ``B`` a link's bandwidth (bytes/s one way), ``alpha``
its latency per message. nccl-tests reports *bus bandwidth*, ``busbw = S / t`` for
broadcast and reduce and ``S / t * 2 (n - 1) / n`` for all-reduce (its doc/PERFORMANCE.md),
which is the ``B`` below: a link measured by nccl-tests goes straight in.
"""

from __future__ import annotations

from collections.abc import Sequence

from dpkit.cost.hardware import Hardware, Link

# torch.nn.parallel.comm's buffer_size for broadcast_coalesced and reduce_add_coalesced.
COALESCE_BYTES = 10 * 1024 * 1024


def transfer(nbytes: float, link: Link) -> float:
    """One message of ``nbytes`` over ``link``: ``alpha + S / B``."""
    return link.time(nbytes)


def through_device0(sizes: Sequence[float], link: Link) -> float:
    """dpkit's virtual lanes: the host copies ``sizes[i]`` bytes between device 0 and each
    other device ``i``, one after another (entry 0 stays put): the sum."""
    return sum(transfer(size, link) for size in sizes[1:])


def messages(tensor_sizes: Sequence[int], buffer_bytes: int = COALESCE_BYTES) -> int:
    """How many NCCL calls ``*_coalesced`` makes for these tensors: torch's ``take_tensors``
    packs tensors into buffers of up to ``buffer_bytes``, a larger tensor alone."""
    count, filled = 0, 0
    for size in tensor_sizes:
        if filled and filled + size > buffer_bytes:
            count, filled = count + 1, 0
        filled += size
    return count + (1 if filled else 0)


def broadcast(nbytes: float, n: int, link: Link, calls: int = 1) -> float:
    """NCCL broadcast of ``nbytes`` from one device to ``n`` (pipelined down a ring):
    ``S / B + calls * (n - 1) * alpha``; DataParallel's replicate."""
    if n <= 1:
        return 0.0
    return nbytes / link.bandwidth + calls * (n - 1) * link.latency


def reduce(nbytes: float, n: int, link: Link, calls: int = 1) -> float:
    """NCCL reduce of ``nbytes`` from ``n`` devices onto one: as a broadcast, reversed;
    DataParallel's reduce-add of the gradients."""
    return broadcast(nbytes, n, link, calls)


def ring_allreduce(nbytes: float, n: int, link: Link) -> float:
    """Ring all-reduce: ``2 (n-1)/n * S/B + 2 (n-1) * alpha`` (Patarasuk and Yuan, 2009)."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes / link.bandwidth + 2 * (n - 1) * link.latency


def ring_bytes_sent(nbytes: float, n: int) -> int:
    """Bytes each device sends in a ring all-reduce of ``nbytes``: ``2 (n - 1) / n * S``."""
    return 0 if n <= 1 else round(2 * (n - 1) * nbytes / n)


def allreduce_link(hardware: Hardware, n: int) -> Link:
    """The link a ring all-reduce over ``n`` devices runs at: inside a node the device link;
    across nodes NCCL's rings cross the network once per node each, a ring per port, so the
    slower of the node's links and its ports together bounds the bus bandwidth, and every
    step waits for the network's latency."""
    inside = hardware.device_link()
    if n <= hardware.devices_per_node:
        return inside
    network = hardware.network_link()
    return Link(
        min(inside.bandwidth, network.bandwidth), max(inside.latency, network.latency),
        "ring across nodes",
    )  # fmt: skip


def allreduce(nbytes: float, n: int, hardware: Hardware) -> float:
    """All-reduce of ``nbytes`` over ``n`` devices of ``hardware`` (DDP's gradients): a ring
    at :func:`allreduce_link`'s bandwidth, devices filling node after node. Inside a node
    with NVLink SHARP (``Hardware.allreduce_bandwidth``) NCCL takes the faster of the ring
    and the switch's own reduction, where each device sends its ``S`` bytes once and gets
    the sum once: ``S / A`` (a bus bandwidth of ``A * 2 (n - 1) / n``)."""
    link = allreduce_link(hardware, n)
    ring = ring_allreduce(nbytes, n, link)
    if hardware.allreduce_bandwidth is None or n > hardware.devices_per_node or n <= 1:
        return ring
    return min(ring, link.latency + nbytes / hardware.allreduce_bandwidth)


def bus_bandwidth(nbytes: float, seconds: float, n: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce of ``nbytes`` that took ``seconds`` on ``n``
    devices: ``S / t * 2 (n - 1) / n``, comparable across ``n`` and with link speeds."""
    return nbytes / seconds * 2 * (n - 1) / n
