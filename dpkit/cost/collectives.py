"""How long collectives take: the formulas, each a few lines, side by side.

The surprise first: DataParallel and DistributedDataParallel move the same gradients, but
DataParallel moves them *through device 0*: every replica's gradients travel to device 0
(``n - 1`` copies of the whole model, one after another on device 0's link) and the new
parameters travel back out the same way on the next forward. A ring all-reduce moves only
``2 (n - 1) / n`` of the model through *each* device's link, all links at once, so its time
hardly grows with ``n``. Compare :func:`reduce_through_device0` with :func:`ring_allreduce`.

Every function takes bytes and :class:`~dpkit.cost.hardware.Link` objects (bandwidth in
bytes/s one way, latency in s per message) and returns seconds. Notation: ``S`` bytes, ``n``
devices, ``B`` a link's bandwidth, ``alpha`` its latency.

- through device 0 (DataParallel): each transfer is ``alpha + bytes / B``, one after another
  (funnelled through device 0's link) or all at once (separate links);
- ring all-reduce: reduce-scatter then all-gather, ``2 (n - 1)`` steps of ``S / n`` bytes:
  ``2 (n - 1) / n * S / B + 2 (n - 1) * alpha`` (Patarasuk and Yuan, 2009; the model behind
  nccl-tests' "bus bandwidth", ``busbw = S / t * 2 (n - 1) / n``);
- hierarchical all-reduce across ``m`` nodes of ``k`` devices: reduce-scatter inside each node,
  a ring all-reduce of each device's ``S / k`` shard across nodes (all ``k`` shards at once,
  sharing the node's network ports), all-gather inside each node.
"""

from __future__ import annotations

from collections.abc import Sequence

from dpkit.cost.hardware import Hardware, Link


def transfer(nbytes: float, link: Link) -> float:
    """One message of ``nbytes`` over ``link``: ``alpha + S / B``."""
    return link.time(nbytes)


def through_device0(sizes: Sequence[float], link: Link, funnel: bool = True) -> float:
    """Copies between device 0 and each other device (``sizes[i]`` bytes for device i; entry
    0, device 0's own share, moves nothing): scatter, broadcast, gather or the copies of
    reduce-add. Funnelled: one after another, the sum; else at once, the longest."""
    times = [transfer(size, link) for size in sizes[1:]]
    if not times:
        return 0.0
    return sum(times) if funnel else max(times)


def broadcast_through_device0(nbytes: float, n: int, link: Link, funnel: bool = True) -> float:
    """The same ``nbytes`` from device 0 to each of ``n - 1`` others (DataParallel's replicate)."""
    return through_device0([nbytes] * n, link, funnel)


def reduce_through_device0(
    nbytes: float, n: int, link: Link, memory_bandwidth: float, funnel: bool = True
) -> float:
    """DataParallel's reduce-add: ``n - 1`` copies of ``nbytes`` to device 0, then ``n - 1``
    additions there, each reading two tensors and writing one (``3 * nbytes`` of memory)."""
    copies = broadcast_through_device0(nbytes, n, link, funnel)
    return copies + (n - 1) * 3 * nbytes / memory_bandwidth


def ring_allreduce(nbytes: float, n: int, link: Link) -> float:
    """Ring all-reduce of ``nbytes`` on ``n`` devices: ``2 (n-1)/n * S/B + 2 (n-1) * alpha``."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes / link.bandwidth + 2 * (n - 1) * link.latency


def ring_bytes_sent(nbytes: float, n: int) -> int:
    """Bytes each device sends in a ring all-reduce of ``nbytes``: ``2 (n - 1) / n * S``."""
    return 0 if n <= 1 else round(2 * (n - 1) * nbytes / n)


def hierarchical_allreduce(
    nbytes: float, devices_per_node: int, nodes: int, intra: Link, inter: Link
) -> float:
    """All-reduce across ``nodes`` nodes of ``devices_per_node`` devices: reduce-scatter in
    each node, a ring all-reduce of each ``S / k`` shard across the nodes over ``inter`` (one
    device's share of its node's ports), then all-gather in each node."""
    k = devices_per_node
    inside = (k - 1) / k * nbytes / intra.bandwidth + (k - 1) * intra.latency if k > 1 else 0.0
    across = ring_allreduce(nbytes / k, nodes, inter)
    return 2 * inside + across


def allreduce(nbytes: float, n: int, hardware: Hardware) -> float:
    """All-reduce of ``nbytes`` over ``n`` devices of ``hardware``: a ring inside one node,
    hierarchical when ``n`` spans nodes (devices fill node after node)."""
    if n <= 1:
        return 0.0
    k = hardware.devices_per_node
    if n <= k:
        return ring_allreduce(nbytes, n, hardware.device_link())
    nodes = -(-n // k)
    return hierarchical_allreduce(
        nbytes, k, nodes, hardware.device_link(), hardware.network_share()
    )


def bus_bandwidth(nbytes: float, seconds: float, n: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce of ``nbytes`` that took ``seconds`` on ``n``
    devices: ``S / t * 2 (n - 1) / n``, comparable across ``n`` and with link speeds."""
    return nbytes / seconds * 2 * (n - 1) / n
