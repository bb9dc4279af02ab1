"""How long communication takes: the operation torch really issues, each a formula of a line.

The surprise first: on GPUs, DataParallel and DDP move about the same bytes per step.
DataParallel's ``replicate`` is an NCCL broadcast (``comm.broadcast_coalesced``, 10 MiB
buffers) and its backward an NCCL reduce (``comm.reduce_add_coalesced``), each about
``S / B``; DDP's ring all-reduce moves ``2 (n - 1) / n * S / B``. DataParallel is slower for
*when* it moves them (every step; the reduce after the whole backward) and for device 0's
extra work. On dpkit's virtual lanes the host copies each tensor itself, one after another
(``prediction._copies``).

Notation: ``S`` bytes, ``n`` devices, ``B`` a link's bandwidth (bytes/s one way), ``alpha``
its latency. ``B`` is nccl-tests' *bus bandwidth* (``S / t`` for broadcast and reduce,
``S / t * 2 (n - 1) / n`` for all-reduce, its doc/PERFORMANCE.md): a measurement goes in.
"""

from collections.abc import Sequence

from dpkit.cost.hardware import Hardware, Link

# torch.nn.parallel.comm's buffer_size for broadcast_coalesced and reduce_add_coalesced.
COALESCE_BYTES = 10 * 1024 * 1024


def messages(tensor_sizes: Sequence[int], buffer_bytes: int = COALESCE_BYTES) -> int:
    """NCCL calls ``*_coalesced`` makes: ``take_tensors`` packs tensors into buffers of up
    to ``buffer_bytes``, a larger tensor alone."""
    count, filled = 0, 0
    for size in tensor_sizes:
        if filled and filled + size > buffer_bytes:
            count, filled = count + 1, 0
        filled += size
    return count + (1 if filled else 0)


def broadcast(nbytes: float, n: int, link: Link, calls: int = 1) -> float:
    """NCCL broadcast, pipelined down a ring: ``S / B + calls * (n - 1) * alpha``."""
    return 0.0 if n <= 1 else nbytes / link.bandwidth + calls * (n - 1) * link.latency


def reduce(nbytes: float, n: int, link: Link, calls: int = 1) -> float:
    """NCCL reduce onto one device: a broadcast, reversed."""
    return broadcast(nbytes, n, link, calls)


def ring_allreduce(nbytes: float, n: int, link: Link) -> float:
    """Ring all-reduce: ``2 (n-1)/n * S/B + 2 (n-1) * alpha`` (Patarasuk and Yuan, 2009)."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes / link.bandwidth + 2 * (n - 1) * link.latency


def ring_bytes_sent(nbytes: float, n: int) -> int:
    """Bytes each device sends in a ring all-reduce: ``2 (n - 1) / n * S``."""
    return 0 if n <= 1 else round(2 * (n - 1) * nbytes / n)


def allreduce_link(hardware: Hardware, n: int) -> Link:
    """The link a ring all-reduce over ``n`` devices runs at: inside a node NCCL's
    (:meth:`~dpkit.cost.Hardware.collective_link`); across nodes the slower of it and the
    node's ports together (a ring per port), at the network's latency."""
    inside = hardware.collective_link()
    if n <= hardware.devices_per_node:
        return inside
    network = hardware.network_link()
    return Link(min(inside.bandwidth, network.bandwidth), max(inside.latency, network.latency),
                "ring across nodes")  # fmt: skip


def allreduce(nbytes: float, n: int, hardware: Hardware) -> float:
    """All-reduce over ``n`` devices filling node after node: a ring at :func:`allreduce_link`;
    in a node with NVLink SHARP (``allreduce_bandwidth`` A), if faster, the switch's ``S / A``."""
    link = allreduce_link(hardware, n)
    ring = ring_allreduce(nbytes, n, link)
    if hardware.allreduce_bandwidth is None or n > hardware.devices_per_node or n <= 1:
        return ring
    return min(ring, link.latency + nbytes / hardware.allreduce_bandwidth)


def bus_bandwidth(nbytes: float, seconds: float, n: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce: ``S / t * 2 (n - 1) / n``."""
    return nbytes / seconds * 2 * (n - 1) / n
