"""dpkit.ddp.rank.join_group, how a rank meets the others, with torch.distributed's calls
recorded instead of made: through the plan's file store, through rank 0's TCP store on the
loopback address, or through a network address that a cluster gives. Each way, every rank
must name the same world (``plan.nproc`` ranks, or a rank waits forever for ranks that
never come) and give torch the plan's timeout, the time after which a collective that
waits on a missing rank fails (torch's own default is 10 to 30 minutes).

tests/test_ddp_one_rank.py joins a real gloo group of one rank; a group of several needs
several processes, where a mutation tool does not look, and a timeout that never expires
cannot be seen in a run that goes well: hence the recorders here.
"""

from __future__ import annotations

import datetime
import os

import pytest

from dpkit.ddp import checks, nodes, rank
from dpkit.ddp.workload import Workload


def model():  # never built: join_group only reads the plan's numbers
    raise AssertionError("join_group builds no model")


WORKLOAD = Workload(model=model, name="unused")


class Torch:
    """torch.distributed as join_group uses it: its stores and init_process_group, which
    record their arguments (a store is the tuple of its own)."""

    def __init__(self):
        self.joined = []

    def FileStore(self, path, world_size):
        return ("FileStore", path, world_size)

    def TCPStore(self, host, port, **options):
        return ("TCPStore", host, port, options)

    def init_process_group(self, backend, **options):
        self.joined.append((backend, options))


@pytest.fixture
def torch_calls(monkeypatch):
    calls = Torch()
    monkeypatch.setattr(rank, "dist", calls)
    monkeypatch.setattr(checks, "loopback_interface", lambda: "lo")
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        monkeypatch.setenv(name, "unset")  # whatever join_group sets is undone after the test
        monkeypatch.delenv(name)
    served = []
    monkeypatch.setattr(nodes, "loopback_store", lambda port, address: served.append(
        (port, address)) or ("server", address, port))  # fmt: skip
    calls.served = served
    yield calls
    rank._held.clear()


def plan(port=None, address="127.0.0.1", nproc=4, timeout=45.0):
    return rank.Plan(WORKLOAD, nproc, 8, 1, "gloo", port, timeout, address=address,
                     store="/tmp/dpkit-x/store")  # fmt: skip


FORTY_FIVE_S = datetime.timedelta(seconds=45)


def test_through_the_file_store_every_rank_names_the_world_and_the_timeout(torch_calls):
    rank.join_group(plan(), 2)
    assert torch_calls.joined == [("gloo", {
        "store": ("FileStore", "/tmp/dpkit-x/store", 4), "rank": 2, "world_size": 4,
        "timeout": FORTY_FIVE_S, "device_id": None})]  # fmt: skip


def test_rank_0_serves_the_tcp_store_on_loopback_and_joins_with_the_timeout(torch_calls):
    rank.join_group(plan(port=29511), 0)
    assert torch_calls.served == [(29511, "127.0.0.1")]
    assert rank._held == [("server", "127.0.0.1", 29511)]  # kept open while the rank lives
    assert torch_calls.joined == [("gloo", {
        "store": ("server", "127.0.0.1", 29511), "rank": 0, "world_size": 4,
        "timeout": FORTY_FIVE_S, "device_id": None})]  # fmt: skip


def test_another_rank_reaches_rank_0_s_store_as_a_client_with_the_timeout(torch_calls):
    rank.join_group(plan(port=29511, nproc=3, timeout=7.5), 2)
    seven_and_a_half = datetime.timedelta(seconds=7.5)
    # a client (is_master False): only rank 0 serves, on 127.0.0.1 alone
    client = ("TCPStore", "127.0.0.1", 29511, {"is_master": False, "timeout": seven_and_a_half})
    assert torch_calls.served == [] and rank._held == []
    assert torch_calls.joined == [("gloo", {
        "store": client, "rank": 2, "world_size": 3, "timeout": seven_and_a_half,
        "device_id": None})]  # fmt: skip


def test_at_a_network_address_torch_meets_the_ranks_there_with_the_world_and_timeout(
    torch_calls,
):
    rank.join_group(plan(port=29511, address="10.1.2.3"), 1)
    assert torch_calls.served == []  # the user asked for the network: no loopback server
    assert torch_calls.joined == [("gloo", {
        "init_method": "tcp://10.1.2.3:29511", "rank": 1, "world_size": 4,
        "timeout": FORTY_FIVE_S, "device_id": None})]  # fmt: skip


def test_the_backend_s_connections_stay_on_loopback_unless_the_user_chose(torch_calls, monkeypatch):
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")  # the user's own choice wins
    rank.join_group(plan(), 0)
    assert (os.environ["GLOO_SOCKET_IFNAME"], os.environ["NCCL_SOCKET_IFNAME"]) == ("lo", "ib0")
