"""Memory from torch's CUDA allocator in the trace: which devices, when it is read, the figure.

Without a GPU, torch.cuda's three memory functions are replaced by a fake allocator that logs
each call, and the CPU lanes stand in for CUDA devices; ``tests/test_gpu.py`` checks the real
numbers on a GPU.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from lanes import lanes
from matplotlib.collections import LineCollection
from matplotlib.container import BarContainer
from torch import nn

import dpkit
from dpkit import viz
from dpkit.device import HOST_DEVICE, REAL, VIRTUAL_CPU, VIRTUAL_GPU, Device
from dpkit.tracing import ALLOCATED, PEAK, MemoryRecord, allocator


class FakeAllocator:
    """Stands in for torch.cuda's memory statistics; ``log`` holds every call in order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []
        self.allocated = {"virtual:0 (cpu)": 1000, "virtual:1 (cpu)": 2000}
        self.peak_of = {name: 10 * nbytes for name, nbytes in self.allocated.items()}

    def install(self, monkeypatch) -> None:
        def reset(device) -> None:
            self.log.append(("reset", device.lane))

        def allocated(device) -> int:
            self.log.append(("allocated", device.lane))
            return self.allocated[device.lane]

        def peak(device) -> int:
            self.log.append(("peak", device.lane))
            return self.peak_of[device.lane]

        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
        monkeypatch.setattr(torch.cuda, "memory_allocated", allocated)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", peak)
        # Every lane counts as a real CUDA device, and tells the fake which lane it is.
        monkeypatch.setattr(
            allocator,
            "devices_with_allocator",
            lambda devs: tuple(map(_Named, dict.fromkeys(devs))),
        )


class _Named:
    """A lane whose ``torch_device`` carries the lane's name to the fake allocator."""

    def __init__(self, device: Device) -> None:
        self.name, self.kind = device.name, device.kind
        self.torch_device = SimpleNamespace(lane=device.name)


@pytest.fixture
def fake(monkeypatch):
    allocator = FakeAllocator()
    allocator.install(monkeypatch)
    return allocator


def _train(steps: int, log: list | None = None) -> dpkit.DataParallel:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    parallel = dpkit.DataParallel(model, device_ids=lanes(2))
    for _ in range(steps):
        parallel(torch.randn(6, 4)).sum().backward()
        if log is not None:
            log.append(("backward done", ""))
    return parallel


def test_only_real_cuda_devices_have_allocator_readings():
    cuda0, cuda1 = (Device(i, REAL, torch.device("cuda", i)) for i in (0, 1))
    shared = Device(0, VIRTUAL_GPU, torch.device("cuda", 0))
    cpu_lane = Device(0, VIRTUAL_CPU, torch.device("cpu"))
    xpu = Device(0, REAL, torch.device("xpu", 0))  # a real accelerator, but not torch.cuda's
    chosen = allocator.devices_with_allocator(
        [cuda0, shared, cpu_lane, xpu, cuda1, cuda0, HOST_DEVICE]
    )
    assert chosen == (cuda0, cuda1)


def test_cpu_lanes_record_no_allocator_memory():
    with dpkit.trace() as tr:
        _train(2)
    categories = {r.category for r in tr.memory}
    assert {"parameters", "input", "activations", "outputs", "gathered"} <= categories
    assert not categories & {ALLOCATED, PEAK}


def test_each_step_reads_allocated_after_forward_and_its_peak_after_backward(fake):
    with dpkit.trace() as tr:
        _train(2, fake.log)
    one_step = [("reset", "virtual:0 (cpu)"), ("reset", "virtual:1 (cpu)"),
                ("allocated", "virtual:0 (cpu)"), ("allocated", "virtual:1 (cpu)"),
                ("backward done", ""),
                ("peak", "virtual:0 (cpu)"), ("peak", "virtual:1 (cpu)")]  # fmt: skip
    assert fake.log == one_step * 2  # the last step's peak is read as the trace ends
    readings = {(r.step, r.device, r.category): r.nbytes for r in tr.memory
                if r.category in (ALLOCATED, PEAK)}  # fmt: skip
    expected = {}
    for step in (1, 2):
        for lane, nbytes in fake.allocated.items():
            expected[(step, lane, ALLOCATED)] = nbytes
            expected[(step, lane, PEAK)] = fake.peak_of[lane]
    assert readings == expected


def test_data_parallel_function_reads_the_allocator_too(fake):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    with dpkit.trace() as tr:
        dpkit.data_parallel(model, torch.randn(6, 4), lanes(2))
    assert sorted((r.category, r.device) for r in tr.memory if r.category in (ALLOCATED, PEAK)) == [
        (ALLOCATED, "virtual:0 (cpu)"), (ALLOCATED, "virtual:1 (cpu)"),
        (PEAK, "virtual:0 (cpu)"), (PEAK, "virtual:1 (cpu)"),
    ]  # fmt: skip


def test_memory_summary_shows_allocator_readings_beside_the_counted_sum(fake):
    with dpkit.trace() as tr:
        _train(1)
    for row in tr.memory_summary():
        columns = list(row)
        assert columns[-3:] == ["counted", ALLOCATED, PEAK]  # after the sum, not in it
        counted = sum(row[c] for c in columns[2:-3])
        assert row["counted"] == counted
        assert (row[ALLOCATED], row[PEAK]) == (
            fake.allocated[row["device"]],
            fake.peak_of[row["device"]],
        )


def test_nothing_resets_the_allocator_when_only_hooks_listen(fake):
    handle = dpkit.register_phase_hook(lambda event: None)
    try:
        _train(2)
    finally:
        handle.remove()
    assert fake.log == []


def test_nested_traces_read_each_peak_once(fake):
    with dpkit.trace() as outer:
        with dpkit.trace() as inner:
            _train(1)
        _train(1)
    peaks = [(r.step, r.device) for r in outer.memory if r.category == PEAK]
    assert sorted(peaks) == [(1, "virtual:0 (cpu)"), (1, "virtual:1 (cpu)"),
                             (2, "virtual:0 (cpu)"), (2, "virtual:1 (cpu)")]  # fmt: skip
    assert [r.step for r in inner.memory if r.category == PEAK] == [1, 1]


# --------------------------------------------------------------------------------------
# the memory figure: counted bytes stacked, allocator totals marked across the bars


def _records() -> list[MemoryRecord]:
    counted = [("cuda:0", "parameters", 100), ("cuda:0", "gathered", 50),
               ("cuda:1", "parameters", 100), ("cuda:1", "activations", 30)]  # fmt: skip
    totals = [("cuda:0", ALLOCATED, 400), ("cuda:1", ALLOCATED, 300),
              ("cuda:0", PEAK, 900), ("cuda:1", PEAK, 700)]  # fmt: skip
    return [MemoryRecord(d, c, n, 1, REAL) for d, c, n in counted + totals]


def test_memory_figure_stacks_counted_bytes_and_marks_allocator_totals():
    axes = viz.memory_per_device(_records()).axes[0]
    stacked = {c.get_label() for c in axes.containers if isinstance(c, BarContainer)}
    assert stacked == {"parameters", "gathered", "activations"}
    marks = {c.get_label(): c for c in axes.collections if isinstance(c, LineCollection)}
    assert set(marks) == {ALLOCATED, PEAK}
    heights = {label: sorted(seg[0][1] for seg in c.get_segments()) for label, c in marks.items()}
    assert heights == {ALLOCATED: [300, 400], PEAK: [700, 900]}
    assert axes.get_ylim()[1] >= 900  # the tallest mark fits
    legend = {text.get_text() for text in axes.get_legend().get_texts()}
    assert {ALLOCATED, PEAK} <= legend
    assert "real devices" in axes.get_title()


def test_held_per_device_sums_only_counted_bytes():
    held = viz.held_per_device(SimpleNamespace(memory=_records()))
    assert held == {"cuda:0": 150, "cuda:1": 130}
