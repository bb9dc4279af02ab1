"""dpkit.host_clock.now: the host's clock read once the GPUs a timing used are done, so a
step timed on GPU lanes is the work's time, not its launch's (a fake torch.cuda here)."""

from __future__ import annotations

import torch

import dpkit
from dpkit import host_clock
from dpkit.device import VIRTUAL_GPU, Device


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


def test_without_devices_now_waits_for_every_gpu_the_process_started(monkeypatch):
    waited: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "synchronize", waited.append)
    host_clock.now()
    assert waited == [0, 1]


def test_the_course_s_step_timers_read_the_synchronised_clock(monkeypatch):
    from torch import nn

    from dpkit.pitfalls import timing
    from dpkit.viz import speedup

    read: list[object] = []
    plain = host_clock.now
    monkeypatch.setattr(host_clock, "now", lambda devices=None: read.append(devices) or plain())
    lanes = dpkit.virtual_devices(2, on="cpu")
    model = nn.Linear(4, 3)
    net = dpkit.DataParallel(model, device_ids=lanes)
    x, y = torch.randn(4, 4), torch.randint(0, 3, (4,))
    speedup._step(net, model, x, y)
    timing._step_ms(net, model, x)
    assert len(read) == 4  # a start and an end each, both after the GPUs' work
