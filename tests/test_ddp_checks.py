"""The checks run before any rank starts, in the caller's process: each bad value is refused
naming the argument and the fix, and each good one comes back as the launcher uses it."""

from __future__ import annotations

import math
import os
import socket

import pytest
import torch
import torch.distributed as dist

from dpkit.ddp import checks
from dpkit.ddp.checks import (
    BUCKET_CAP_LIMIT_MB,
    MAX_RANKS_PER_CORE,
    MAX_TIMEOUT_S,
    check_bucket_cap,
    check_nproc,
    check_port,
    check_timeout,
    choose_backend,
    cores,
    free_port,
    loopback_interface,
)


def test_gloo_is_picked_without_gpus_and_nccl_is_refused_naming_the_fix(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert choose_backend(None, 2) == "gloo"
    assert choose_backend("gloo", 3) == "gloo"
    with pytest.raises(ValueError, match=r"backend='nccl' needs CUDA GPUs.*use backend='gloo'"):
        choose_backend("nccl", 1)
    with pytest.raises(ValueError, match=r"backend='mpi' is not supported here; use 'gloo'"):
        choose_backend("mpi", 2)


def test_nccl_needs_a_gpu_per_rank(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    assert choose_backend(None, 2) == "nccl"  # a GPU per rank: NCCL
    assert choose_backend(None, 3) == "gloo"  # one short: gloo
    assert choose_backend("nccl", 2) == "nccl"
    with pytest.raises(ValueError, match=r"nproc=3 with backend='nccl'.*there are 2; use nproc<=2"):
        choose_backend("nccl", 3)


def test_a_torch_without_distributed_or_gloo_is_told_where_to_get_one(monkeypatch):
    monkeypatch.setattr(dist, "is_gloo_available", lambda: False)
    with pytest.raises(RuntimeError, match="built without gloo"):
        choose_backend("gloo", 2)
    monkeypatch.setattr(dist, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="has no torch.distributed"):
        choose_backend(None, 2)


def test_nproc_is_a_whole_number_up_to_four_ranks_per_core(monkeypatch):
    monkeypatch.setattr(checks, "cores", lambda: 2)
    assert MAX_RANKS_PER_CORE == 4
    assert check_nproc(1) == 1 and check_nproc(8) == 8
    with pytest.raises(ValueError, match=r"nproc=9 is more than 4 processes per CPU core here "
                                         r"\(2 cores\).*use nproc<=8"):  # fmt: skip
        check_nproc(9)
    with pytest.raises(ValueError, match="nproc must be at least 1"):
        check_nproc(0)
    for wrong in (True, 2.0, "2", None):
        with pytest.raises(TypeError, match="nproc must be an int"):
            check_nproc(wrong)


def test_cores_are_the_ones_this_process_may_use():
    assert cores() == len(os.sched_getaffinity(0))


def test_a_free_port_can_be_bound_and_one_in_use_is_refused():
    port = free_port()
    assert 0 < port < 65536
    assert check_port(port) == port
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        taken = listening.getsockname()[1]
        with pytest.raises(ValueError, match=rf"port={taken} is in use on 127.0.0.1.*port=None"):
            check_port(taken)


def test_ports_1_and_65535_are_port_numbers():
    for port in (1, 65535):
        try:
            assert check_port(port) == port
        except PermissionError:  # below 1024 without root: the system refuses, not the check
            pass


@pytest.mark.parametrize("port", [0, 65536, -1, True, 80.0, "8080"])
def test_a_port_outside_1_to_65535_is_refused(port):
    with pytest.raises(ValueError, match=r"port must be a TCP port number \(1-65535\) or None"):
        check_port(port)


def test_a_port_that_cannot_be_bound_for_another_reason_raises_that_reason():
    with pytest.raises(OSError) as failed:  # an address this machine does not have
        check_port(free_port(), address="192.0.2.1")
    assert not isinstance(failed.value, ValueError)


def test_bucket_caps_are_positive_mib_that_torch_can_hold():
    assert check_bucket_cap(None) is None  # torch's default
    assert check_bucket_cap(25) == 25.0 and isinstance(check_bucket_cap(25), float)
    assert check_bucket_cap(0.01) == 0.01
    assert BUCKET_CAP_LIMIT_MB == 2**43  # MiB: 2**63 bytes
    assert check_bucket_cap(BUCKET_CAP_LIMIT_MB - 1) == BUCKET_CAP_LIMIT_MB - 1
    for wrong in (0, -1, True, "25", math.nan):
        with pytest.raises(ValueError, match="bucket_cap_mb must be a positive number of MiB"):
            check_bucket_cap(wrong)
    for too_large in (BUCKET_CAP_LIMIT_MB, math.inf):
        with pytest.raises(ValueError, match=r"more than torch can hold.*e\.g\. 1e6"):
            check_bucket_cap(too_large)


def test_timeouts_are_positive_seconds_inside_gloo_s_nanoseconds():
    assert check_timeout(30) == 30.0 and isinstance(check_timeout(30), float)
    assert check_timeout(MAX_TIMEOUT_S) == MAX_TIMEOUT_S
    for wrong in (0, -1, True, "30", math.nan):
        with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
            check_timeout(wrong)
    for too_long, shown in ((MAX_TIMEOUT_S * 1.01, "=1.01e+09"), (2 * 10**9, "=2e+09"),
                            (math.inf, "=inf"), (10**400, " (an int too large for a float)"),
                            (10**5000, " (an int too large for a float)")):  # fmt: skip
        with pytest.raises(ValueError, match=r"64-bit nanoseconds; use at most 1e\+09 s") as error:
            check_timeout(too_long)
        assert str(error.value).startswith(f"timeout{shown} is not a number of seconds")


def test_the_loopback_interface_is_named():
    names = {name for _, name in socket.if_nameindex()}
    assert loopback_interface() == ("lo" if "lo" in names else "lo0" if "lo0" in names else None)
