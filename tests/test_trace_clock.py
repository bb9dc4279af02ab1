"""The trace's GPU clock in a long-lived process: CUDA's elapsed_time is float32 milliseconds,
so times read from one origin per process lose precision as the process ages (a notebook
kernel open all afternoon). Simulated here with events that round as float32 does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import dpkit
from dpkit.tracing import clock
from dpkit.tracing.events import Event

HOURS = 3600 * 1000.0  # in milliseconds, elapsed_time's unit


class Float32Event:
    """A CUDA event at ``ms`` milliseconds of the GPU's clock; ``elapsed_time`` rounds to
    float32 as torch.cuda.Event.elapsed_time does."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def elapsed_time(self, other: Float32Event) -> float:
        return float(np.float32(other.ms - self.ms))

    def synchronize(self) -> None:
        pass


def test_a_40_us_phase_two_hours_into_a_kernel_is_timed_to_the_microsecond(monkeypatch):
    device = torch.device("cuda", 0)
    monkeypatch.setitem(clock._cuda_origins, device, (Float32Event(0.0), 100.0))
    start, end = Float32Event(2 * HOURS), Float32Event(2 * HOURS + 0.040)
    event = Event("apply", "cuda:0", 0.0, 0.0)
    clock._resolve(event, device, start, end)
    # from the origin, float32 rounds 7.2e6 ms to steps of 0.5 ms: 0 or 500 us, not 40
    assert event.end - event.start == pytest.approx(40e-6, abs=1e-7)
    assert event.start == pytest.approx(100.0 + 2 * 3600, abs=1e-3)


def test_an_outermost_trace_takes_fresh_origins_unless_times_wait_to_be_read(monkeypatch):
    device = torch.device("cuda", 0)
    monkeypatch.setitem(clock._cuda_origins, device, (Float32Event(0.0), 100.0))
    waiting = Event("apply", "cuda:0", 0.0, 0.0)  # its times not read yet
    monkeypatch.setattr(clock, "_pending", [(waiting, device, Float32Event(1), Float32Event(2))])
    with dpkit.trace():
        assert device in clock._cuda_origins  # kept: that event is read from it
    assert waiting.end - waiting.start == pytest.approx(1e-3)  # read when the trace ended
    monkeypatch.setattr(clock, "_pending", [])
    with dpkit.trace():
        assert device not in clock._cuda_origins  # the next GPU work sets a new one
