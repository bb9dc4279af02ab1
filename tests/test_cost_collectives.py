"""The collective formulas against cases worked by hand, and the links they stand on."""

from __future__ import annotations

import pytest

import dpkit.cost as cost
from dpkit.cost import Link


def test_a_transfer_is_latency_plus_bytes_over_bandwidth():
    assert cost.transfer(1000, Link(bandwidth=100, latency=2)) == pytest.approx(12)


def test_dataparallel_copies_through_device0_add_up_when_funnelled():
    link = Link(bandwidth=100, latency=1)
    sizes = [500, 100, 200, 300]  # device 0's own share moves nothing
    assert cost.through_device0(sizes, link) == pytest.approx((1 + 1) + (1 + 2) + (1 + 3))
    assert cost.through_device0(sizes, link, funnel=False) == pytest.approx(1 + 3)
    assert cost.through_device0([500], link) == 0
    assert cost.broadcast_through_device0(100, 4, link) == pytest.approx(3 * (1 + 1))


def test_reduce_through_device0_copies_then_adds_on_device0():
    # 2 copies of 100 bytes (2 s each), then 2 additions reading 200 and writing 100 bytes
    # at 300 bytes/s (1 s each)
    assert cost.reduce_through_device0(100, 3, Link(100, 1), memory_bandwidth=300) == (
        pytest.approx(2 * 2 + 2 * 1)
    )


def test_ring_allreduce_moves_2_n_minus_1_over_n_of_the_data_per_device():
    link = Link(bandwidth=100e9, latency=10e-6)
    # 2 * 3/4 * 1 GB / 100 GB/s = 15 ms, plus 2 * 3 steps of 10 us
    assert cost.ring_allreduce(1e9, 4, link) == pytest.approx(0.015 + 6 * 10e-6)
    assert cost.ring_allreduce(1e9, 1, link) == 0
    assert cost.ring_bytes_sent(1000, 4) == 1500
    assert cost.ring_bytes_sent(1000, 1) == 0
    # nccl-tests' bus bandwidth of a pure-bandwidth ring is the link's bandwidth, for any n
    for n in (2, 4, 8):
        seconds = cost.ring_allreduce(1e9, n, Link(50e9, 0.0))
        assert cost.bus_bandwidth(1e9, seconds, n) == pytest.approx(50e9)


def test_hierarchical_allreduce_inside_nodes_then_across():
    intra, inter = Link(100e9, 0.0), Link(10e9, 0.0)
    # reduce-scatter and all-gather inside a node: 2 * 7/8 * 8 GB / 100 GB/s = 0.14 s;
    # across 2 nodes, each device's 1 GB shard: 2 * 1/2 * 1 GB / 10 GB/s = 0.1 s
    assert cost.hierarchical_allreduce(8e9, 8, 2, intra, inter) == pytest.approx(0.24)
    with_latency = cost.hierarchical_allreduce(8e9, 8, 2, Link(100e9, 1e-6), Link(10e9, 1e-5))
    assert with_latency == pytest.approx(0.24 + 2 * 7 * 1e-6 + 2 * 1 * 1e-5)


def test_allreduce_picks_the_ring_inside_a_node_and_the_hierarchy_across():
    ib = cost.preset("2x8xA100-IB-HDR")
    assert cost.allreduce(1e8, 8, ib) == cost.ring_allreduce(1e8, 8, ib.device_to_device)
    # 8 HDR ports per node: each device has a port of its own
    share = ib.network_share()
    assert share.bandwidth == ib.node_to_node.bandwidth
    expected = cost.hierarchical_allreduce(1e8, 8, 2, ib.device_to_device, share)
    assert cost.allreduce(1e8, 16, ib) == pytest.approx(expected)
    # one 10 GbE port per node: eight devices share it
    eth = cost.preset("2x8xA100-10GbE")
    assert eth.network_share().bandwidth == pytest.approx(eth.node_to_node.bandwidth / 8)
    assert cost.allreduce(1e8, 16, eth) > 10 * cost.allreduce(1e8, 16, ib)


def test_devices_without_peer_to_peer_copy_through_host_memory():
    t4 = cost.preset("T4-PCIe3")
    assert not t4.peer_to_peer
    link = t4.device_link()
    assert link.bandwidth == pytest.approx(t4.host_to_device.bandwidth / 2)
    assert link.latency == pytest.approx(2 * t4.host_to_device.latency)
