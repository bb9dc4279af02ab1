"""dpkit.host_clock.now: the host's clock read once the GPUs a timing used are done, so a
step timed on GPU lanes is the work's time, not its launch's (a fake torch.cuda here)."""

from __future__ import annotations

import torch

import dpkit
from dpkit import host_clock
from dpkit.devices import VIRTUAL_GPU, Device


def test_now_waits_for_each_gpu_the_devices_use_once(monkeypatch):
    waited: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "synchronize", waited.append)
    lanes = [Device(i, VIRTUAL_GPU, torch.device("cuda", 0)) for i in range(4)]
    before = host_clock.now(lanes)
    assert waited == [torch.device("cuda", 0)]  # four lanes, one GPU: one wait
    assert host_clock.now(lanes) >= before and len(waited) == 2


def test_on_cpu_lanes_now_is_the_plain_clock(monkeypatch):
    waited: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "synchronize", waited.append)
    host_clock.now(dpkit.virtual_devices(4, on="cpu"))
    assert waited == []
