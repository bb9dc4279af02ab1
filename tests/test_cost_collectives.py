"""The collective formulas against cases worked by hand, and the links they stand on."""

from __future__ import annotations

import dataclasses

import pytest

import dpkit.cost as cost
from dpkit.cost import Link
from dpkit.cost.collectives import COALESCE_BYTES, allreduce_link, messages


def test_nccl_broadcast_and_reduce_take_about_one_model_over_the_bus_bandwidth():
    link = Link(bandwidth=100e9, latency=2e-6)
    # 1 GB at 100 GB/s = 10 ms, whatever n; each of 3 calls pays 7 ring steps of 2 us
    assert cost.broadcast(1e9, 8, link, calls=3) == pytest.approx(0.010 + 3 * 7 * 2e-6)
    assert cost.reduce(1e9, 8, link, calls=3) == cost.broadcast(1e9, 8, link, calls=3)
    assert cost.reduce(1e9, 8, link) == pytest.approx(0.010 + 7 * 2e-6)  # one call by default
    assert cost.broadcast(1e9, 1, link) == 0


def test_coalesced_calls_pack_tensors_into_10_mib_buffers_as_torch_does():
    mib = 1 << 20
    assert COALESCE_BYTES == 10 * mib  # torch.nn.parallel.comm's buffer_size
    assert messages([4 * mib, 4 * mib, 4 * mib]) == 2  # 8 MiB, then 4 MiB
    assert messages([4 * mib, 6 * mib]) == 1  # exactly 10 MiB fits
    assert messages([30 * mib, 1, 1]) == 2  # a large tensor alone, then the small ones
    assert messages([4 * mib, 6 * mib, 4 * mib, 6 * mib]) == 2  # each buffer starts empty
    assert messages([]) == 0


def test_ring_allreduce_moves_2_n_minus_1_over_n_of_the_data_per_device():
    link = Link(bandwidth=100e9, latency=10e-6)
    # 2 * 3/4 * 1 GB / 100 GB/s = 15 ms, plus 2 * 3 steps of 10 us
    assert cost.ring_allreduce(1e9, 4, link) == pytest.approx(0.015 + 6 * 10e-6)
    assert cost.ring_allreduce(1e9, 1, link) == 0
    assert cost.ring_bytes_sent(1000, 4) == 1500
    assert cost.ring_bytes_sent(1000, 1) == 0
    # nccl-tests' bus bandwidth of a pure-bandwidth ring is the link's bandwidth, for any n
    for n in (2, 4, 8):
        seconds = cost.ring_allreduce(1e9, n, Link(50e9, 1e-15))
        assert cost.bus_bandwidth(1e9, seconds, n) == pytest.approx(50e9)


def test_allreduce_across_nodes_runs_at_the_node_ports_together():
    ib = cost.preset("2x8xA100-IB-HDR")
    assert cost.allreduce(1e8, 8, ib) == cost.ring_allreduce(1e8, 8, ib.device_to_device)
    # 8 HDR ports of 24 GB/s (200 Gb/s, 96 % reached) = 192 GB/s per node, under NVSwitch's 230
    across = allreduce_link(ib, 16)
    assert across.bandwidth == pytest.approx(8 * 24e9)
    assert across.source == "ring across nodes"  # what the tables print as its source
    assert across.latency == ib.node_to_node.latency  # every ring step waits for the network
    eth = cost.preset("2x8xA100-10GbE")
    assert allreduce_link(eth, 16).bandwidth == pytest.approx(1.25e9 * 0.5)  # one 10 GbE port
    assert cost.allreduce(1e8, 16, eth) > 100 * cost.allreduce(1e8, 16, ib)


def test_h100_all_reduces_with_nvlink_sharp_inside_a_node_and_its_ring_elsewhere():
    h100 = cost.preset("8xH100-SXM-NVLink")
    seconds = cost.allreduce(8 << 30, 8, h100)
    busbw = cost.bus_bandwidth(8 << 30, seconds, 8)
    assert busbw == pytest.approx(480e9, rel=0.01)  # nccl-tests#212: NVLS ~480 GB/s
    four = cost.bus_bandwidth(8 << 30, cost.allreduce(8 << 30, 4, h100), 4)
    assert four == pytest.approx(275e9 * 2 * 3 / 4, rel=0.01)  # algbw x 2 (n - 1) / n
    # NVLink SHARP is NVSwitch's, inside a node: two nodes' all-reduce is a ring over IB
    two = dataclasses.replace(h100, nodes=2, nics_per_node=8)
    assert cost.allreduce(1e9, 16, two) == cost.ring_allreduce(1e9, 16, allreduce_link(two, 16))
    # the faster of ring and switch, on any number of devices of a node (a made-up switch
    # faster than the ring: 1 GB at 1,000 GB/s after one message's latency)
    fast = dataclasses.replace(h100, allreduce_bandwidth=1000e9)
    assert cost.allreduce(1e9, 2, fast) == pytest.approx(h100.device_to_device.latency + 1e-3)
    # broadcast and reduce (DataParallel's) run the ring: 370 GB/s
    assert cost.broadcast(8 << 30, 8, h100.device_link()) == pytest.approx(
        (8 << 30) / 370e9, rel=0.01
    )


def test_devices_without_peer_to_peer_copy_through_host_memory_and_nccl_takes_its_own_path():
    t4 = cost.preset("T4-PCIe3")
    assert not t4.peer_to_peer
    link = t4.device_link()  # a copy: down to the host and up, CUDA overlapping the hops
    assert link.bandwidth == pytest.approx(t4.host_to_device.bandwidth / 2)
    assert link.latency == pytest.approx(2 * t4.host_to_device.latency)
    # NCCL's SHM transport, measured slower than the copies: nccl#384's 3.9 GB/s all-reduce
    assert t4.collective_link().bandwidth == pytest.approx(3.9e9)
    seconds = cost.allreduce(1e9, 2, t4)
    assert cost.bus_bandwidth(1e9, seconds, 2) == pytest.approx(3.9e9, rel=1e-3)
