"""Which devices dpkit picks on machines this one is not: one GPU (Colab), several (a lab), an
XPU, a Mac (MPS), a torch older than ``torch.accelerator``.

The machine is faked at torch's edge: ``torch.accelerator`` and ``torch.cuda.is_available``
say what exists, and ``torch.get_device_module`` hands out a device module with a count, a
stream pool and current streams. Everything dpkit decides from there (real devices or lanes,
their names, what the notebooks print, the errors) is dpkit's own code, running as it would
on that machine. Found missing by mutation testing (``make mutation``): without these tests,
``devices(2)`` on a two-GPU box could have given lanes, and nobody would have known.
"""

from __future__ import annotations

import collections
import importlib
import threading
import time
import types

import pytest
import torch

import dpkit
from dpkit import lanes as lanes_module
from dpkit.device import HOST_DEVICE, REAL, VIRTUAL_CPU, VIRTUAL_GPU, Device
from dpkit.environment import describe_choice

# The module behind dpkit.devices (the function).
dev = importlib.import_module("dpkit.device")


class FakeStream:
    def __init__(self, device: torch.device, stream_id: int, priority: int = 0) -> None:
        self.device, self.stream_id, self.priority = device, stream_id, priority
        self.waited_for: list = []  # the streams it was told to wait for, in order

    def wait_stream(self, other) -> None:
        self.waited_for.append(other)


class FakeDeviceModule:
    """``torch.cuda`` (or ``torch.xpu``) of a machine with ``count`` devices."""

    def __init__(self, count: int, pool_size: int = 10_000) -> None:
        self.count = count
        self.pool_size = pool_size  # distinct stream ids before the pool wraps round
        self.taken = 0
        self.stream_devices: list[torch.device] = []

    def device_count(self) -> int:
        return self.count

    def Stream(self, device: torch.device, priority: int = 0) -> FakeStream:  # noqa: N802
        self.stream_devices.append(device)
        self.taken += 1
        return FakeStream(device, self.taken % self.pool_size, priority)

    def current_stream(self, device: torch.device) -> tuple[str, torch.device]:
        return ("current", device)


@pytest.fixture
def machine(monkeypatch):
    """``machine(kind, count)`` makes this a machine with ``count`` accelerators of ``kind``
    (None: a CPU-only machine), and returns its fake device module."""

    def make(kind: str | None, count: int, **module_options) -> FakeDeviceModule:
        module = FakeDeviceModule(count, **module_options)
        available = kind is not None and count > 0
        accelerator = types.SimpleNamespace(
            is_available=lambda: available,
            current_accelerator=lambda: torch.device(kind) if available else None,
        )
        monkeypatch.setattr(torch, "accelerator", accelerator, raising=False)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: available and kind == "cuda")

        def get_device_module(name):
            if name != kind:
                raise AssertionError(f"dpkit asked for the device module of {name!r}")
            return module

        monkeypatch.setattr(torch, "get_device_module", get_device_module)
        monkeypatch.setattr(lanes_module, "_lane_streams", {})
        return module

    return make


# --------------------------------------------------------------------------------------
# What accelerator is there, and how many


@pytest.mark.parametrize("kind", ["cuda", "xpu"])
def test_accelerator_type_is_what_torch_accelerator_reports(machine, kind):
    machine(kind, 2)
    assert dev.accelerator_type() == kind
    assert dev.accelerator_count() == 2


def test_mps_counts_as_no_accelerator_as_in_data_parallel(machine):
    machine("mps", 1)
    assert dev.accelerator_type() is None
    assert dev.accelerator_count() == 0
    assert [d.kind for d in dpkit.devices(2)] == [VIRTUAL_CPU] * 2


def test_a_torch_without_torch_accelerator_falls_back_to_cuda(machine, monkeypatch):
    machine("cuda", 1)
    monkeypatch.delattr(torch, "accelerator")  # torch < 2.6
    assert dev.accelerator_type() == "cuda"
    assert dev.accelerator_count() == 1


def test_a_cpu_only_machine_has_no_accelerator(machine):
    machine(None, 0)
    assert dev.accelerator_type() is None
    assert dev.accelerator_count() == 0


# --------------------------------------------------------------------------------------
# devices(n): real accelerators where that many exist, else lanes


def test_devices_on_a_two_gpu_machine_are_its_gpus(machine):
    machine("cuda", 2)
    chosen = dpkit.devices(2)
    assert chosen == [
        Device(0, REAL, torch.device("cuda", 0)),
        Device(1, REAL, torch.device("cuda", 1)),
    ]
    assert [d.name for d in chosen] == ["cuda:0", "cuda:1"]
    assert dpkit.devices() == chosen  # all of them
    assert dpkit.devices(1) == chosen[:1]
    assert dev.real_devices() == chosen
    assert dev.real_devices(1) == chosen[:1]


def test_devices_beyond_the_gpus_are_lanes_on_gpu_0(machine):
    machine("cuda", 2)
    lanes = dpkit.devices(3)
    assert [(d.index, d.kind, d.torch_device) for d in lanes] == [
        (i, VIRTUAL_GPU, torch.device("cuda", 0)) for i in range(3)
    ]
    assert lanes[1].name == "virtual:1 (cuda:0)"


def test_devices_on_one_gpu_is_that_gpu(machine):
    machine("cuda", 1)
    assert dpkit.devices() == [Device(0, REAL, torch.device("cuda", 0))]


def test_devices_without_accelerator_default_to_four_cpu_lanes(machine):
    machine(None, 0)
    assert [(d.index, d.kind) for d in dpkit.devices()] == [(i, VIRTUAL_CPU) for i in range(4)]


def test_asking_for_more_real_devices_than_exist_says_what_to_use(machine):
    machine("cuda", 2)
    with pytest.raises(ValueError) as raised:
        dev.real_devices(3)
    message = str(raised.value)
    assert "n=3 real accelerators" in message and "has 2" in message
    assert "dpkit.virtual_devices(3)" in message and "dpkit.devices(3)" in message
    assert "fall back to them automatically" in message


def test_real_devices_checks_its_count(machine):
    machine("cuda", 2)
    with pytest.raises(ValueError, match="n must be at least 1"):
        dev.real_devices(0)


@pytest.mark.parametrize(
    ("kind", "count", "n", "expected"),
    [
        ("cuda", 2, 2, "devices(2) -> 2 real accelerators: cuda:0, cuda:1"),
        ("cuda", 2, 1, "devices(1) -> 1 real accelerator: cuda:0"),
        (
            "cuda",
            1,
            4,
            "devices(4) -> 4 virtual lanes on the GPU, a CUDA stream each "
            "(this machine has 1 real accelerator)",
        ),
        (
            "cuda",
            2,
            3,
            "devices(3) -> 3 virtual lanes on the GPU, a CUDA stream each "
            "(this machine has 2 real accelerators)",
        ),
        (
            None,
            0,
            4,
            "devices(4) -> 4 virtual lanes on the CPU, a thread each "
            "(this machine has 0 real accelerators)",
        ),
        (
            None,
            0,
            1,
            "devices(1) -> 1 virtual lane on the CPU, a thread each "
            "(this machine has 0 real accelerators)",
        ),
    ],
)
def test_the_line_the_course_prints_about_the_choice(machine, kind, count, n, expected):
    # `dpkit devices` prints this line; on Colab (one GPU) it is the learner's explanation of
    # why their four devices are lanes.
    machine(kind, count)
    assert describe_choice(n) == expected


# --------------------------------------------------------------------------------------
# Lanes on a GPU


def test_lanes_on_a_gpu_machine_default_to_gpu_0(machine):
    machine("cuda", 2)
    for on in (None, "cuda", torch.device("cuda")):
        lanes = dpkit.virtual_devices(2, on=on)
        assert [(d.index, d.kind, d.torch_device) for d in lanes] == [
            (0, VIRTUAL_GPU, torch.device("cuda", 0)),
            (1, VIRTUAL_GPU, torch.device("cuda", 0)),
        ]
    assert {d.torch_device for d in dpkit.virtual_devices(2, on="cuda:1")} == {
        torch.device("cuda", 1)
    }
    assert [d.kind for d in dpkit.virtual_devices(2, on="cpu")] == [VIRTUAL_CPU] * 2


def test_lanes_on_an_xpu_machine_are_on_the_xpu(machine):
    machine("xpu", 1)
    assert {d.torch_device for d in dpkit.virtual_devices(2)} == {torch.device("xpu", 0)}


def test_lanes_on_an_accelerator_the_machine_lacks_are_refused(machine):
    machine("cuda", 1)
    with pytest.raises(ValueError, match="on='xpu': no xpu accelerator"):
        dpkit.virtual_devices(2, on="xpu")


# --------------------------------------------------------------------------------------
# Resolving what users pass


def test_device_names_resolve_to_the_gpus_that_exist(machine):
    machine("cuda", 2)
    assert dev.as_device("cuda") == Device(0, REAL, torch.device("cuda", 0))
    assert dev.as_device("cuda:1") == Device(1, REAL, torch.device("cuda", 1))
    assert dev.as_device(torch.device("cuda", 1)).name == "cuda:1"
    assert dev.as_device("cpu") is HOST_DEVICE


@pytest.mark.parametrize("spec", ["cuda:2", "xpu:0", torch.device("cuda", 5)])
def test_device_names_that_do_not_exist_say_how_many_there_are(machine, spec):
    machine("cuda", 2)
    with pytest.raises(ValueError) as raised:
        dev.as_device(spec, argument="output_device")
    message = str(raised.value)
    assert message.startswith(f"output_device={str(spec)!r} does not exist on this machine")
    assert "(2 accelerators)" in message
    assert "virtual lanes or dpkit.devices(n) to pick what exists" in message


def test_ints_name_gpus_that_exist_and_lanes_beyond(machine):
    machine("cuda", 2)
    assert dev.as_device(0) == Device(0, REAL, torch.device("cuda", 0))
    assert dev.as_device(1) == Device(1, REAL, torch.device("cuda", 1))
    assert dev.as_device(2) == Device(2, VIRTUAL_GPU, torch.device("cuda", 0))
    # The last lane one GPU can have.
    last = dev.MAX_GPU_LANES - 1
    assert dev.as_device(last) == Device(last, VIRTUAL_GPU, torch.device("cuda", 0))


def test_a_list_of_ints_is_gpus_when_all_exist_else_lanes(machine):
    machine("cuda", 2)
    assert [d.kind for d in dev.as_devices([0, 1])] == [REAL, REAL]
    assert [d.kind for d in dev.as_devices([1])] == [REAL]
    lanes = dev.as_devices([0, 1, 2])
    assert [(d.index, d.kind) for d in lanes] == [(i, VIRTUAL_GPU) for i in range(3)]
    assert dev.as_devices([0, 1, 2]) == dpkit.virtual_devices(3)


def test_bad_device_specs_name_the_argument(machine):
    machine(None, 0)
    with pytest.raises(TypeError, match=r"^device must be a device, got True$"):
        dev.as_device(True)
    with pytest.raises(TypeError, match=r"^device must be a dpkit.Device.*got float$"):
        dev.as_device(2.5)
    with pytest.raises(TypeError, match=r"got a single int; wrap it in a list: \[3\]"):
        dev.as_devices(3)
    with pytest.raises(TypeError, match=r"^device must be a dpkit.Device.*got float$"):
        dpkit.to_device(torch.zeros(1), 2.5)


def test_mixed_kinds_and_duplicates_are_listed_plainly(machine):
    machine(None, 0)
    lane = dpkit.virtual_devices(1)[0]
    with pytest.raises(ValueError) as raised:
        dev.as_devices([lane, "cpu"], argument="device_ids")
    assert "device_ids mixes kinds of device (host, virtual-cpu); use one kind, " in str(
        raised.value
    )
    assert "e.g. dpkit.devices(n) or dpkit.virtual_devices(n)" in str(raised.value)
    with pytest.raises(ValueError, match=r"use dpkit.virtual_devices\(n, on='cpu'\)$"):
        dev.as_devices(["cpu"])
    lanes = dpkit.virtual_devices(2)
    with pytest.raises(
        ValueError, match=r"lists virtual:0 \(cpu\), virtual:1 \(cpu\) more than once"
    ):
        dev.as_devices([lanes[0], lanes[1], lanes[0], lanes[1]])


# --------------------------------------------------------------------------------------
# Where a tensor is, and putting data on device_ids[0]


def test_a_tensor_on_a_gpu_is_on_that_real_device():
    def on(device):  # a tensor as far as device_of looks at it
        return types.SimpleNamespace(is_cpu=False, is_meta=False, device=torch.device(device))

    assert lanes_module.device_of(on("cuda:1")) == Device(1, REAL, torch.device("cuda", 1))
    assert lanes_module.device_of(on("cuda")) == Device(0, REAL, torch.device("cuda", 0))


def test_a_meta_tensor_has_no_device_to_move_from():
    with pytest.raises(ValueError, match=r"^a tensor on the meta device holds no data to move"):
        lanes_module.device_of(torch.empty(2, device="meta"))


def test_to_device_keeps_named_tuples(machine):
    machine(None, 0)
    Batch = collections.namedtuple("Batch", "x y")
    home = dpkit.devices(2)[0]
    moved = dpkit.to_device(Batch(torch.ones(2), torch.zeros(2)), home)
    assert type(moved) is Batch and torch.equal(moved.x, torch.ones(2))


def test_to_device_refuses_lanes_other_than_home(machine):
    machine(None, 0)
    with pytest.raises(ValueError, match=r"the other lanes' copies\. Pass devices\[0\]$"):
        dpkit.to_device(torch.ones(1), dpkit.devices(2)[1])


def test_device_names(machine):
    machine("cuda", 1)
    assert HOST_DEVICE.name == "cpu"
    assert Device(3, VIRTUAL_CPU, torch.device("cpu")).name == "virtual:3 (cpu)"
    assert Device(3, VIRTUAL_GPU, torch.device("cuda", 0)).name == "virtual:3 (cuda:0)"


# --------------------------------------------------------------------------------------
# Streams


def test_a_real_device_runs_on_its_current_stream(machine):
    machine("cuda", 2)
    gpu = dpkit.devices(2)[1]
    assert lanes_module.stream_of(gpu) == ("current", torch.device("cuda", 1))
    assert lanes_module.stream_of(dpkit.virtual_devices(2, on="cpu")[1]) is None
    assert lanes_module.stream_of(HOST_DEVICE) is None


def test_each_gpu_lane_keeps_one_stream_of_its_gpu_for_the_whole_process(machine):
    module = machine("cuda", 2)
    lanes = dpkit.virtual_devices(3)
    first = [lanes_module.stream_of(lane) for lane in lanes]
    assert len({id(s) for s in first}) == 3
    assert {s.device for s in first} == {torch.device("cuda", 0)}
    assert [lanes_module.stream_of(lane) for lane in lanes] == first  # the same ones, not new
    taken = module.taken
    assert taken == dev.MAX_GPU_LANES  # taken once, in one go
    other_gpu = dpkit.virtual_devices(2, on="cuda:1")
    assert lanes_module.stream_of(other_gpu[0]).device == torch.device("cuda", 1)
    assert module.taken == 2 * dev.MAX_GPU_LANES


def test_a_stream_pool_that_keeps_repeating_is_refused(machine):
    machine("cuda", 1, pool_size=dev.MAX_GPU_LANES // 2)
    with pytest.raises(
        RuntimeError,
        match=r"another thread takes streams at the same time\); create dpkit's lanes first$",
    ):
        lanes_module.stream_of(dpkit.virtual_devices(2)[1])


def test_two_threads_asking_first_get_the_same_lane_stream(machine):
    """The lanes' streams are made once, under a lock: a second thread that asked while the
    first was making them must get the first's streams, not a pool of its own."""
    module = machine("cuda", 1)
    inside, second_started = threading.Event(), threading.Event()
    make_stream = module.Stream

    def slow_first_stream(device, priority=0):
        if not inside.is_set():
            inside.set()
            second_started.wait(5)
            time.sleep(0.2)  # the second thread is past its first look by now, at the lock
        return make_stream(device, priority)

    module.Stream = slow_first_stream
    lane = dpkit.virtual_devices(2)[1]
    got = {}

    def first():
        got["first"] = lanes_module.stream_of(lane)

    def second():
        inside.wait(5)
        second_started.set()
        got["second"] = lanes_module.stream_of(lane)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert got["first"] is got["second"]
    assert module.taken == dev.MAX_GPU_LANES


def test_lane_streams_take_the_highest_priority_the_gpu_offers(machine):
    """The lanes' streams come from the pool of torch's highest priority (the second number
    of ``Stream.priority_range()``), which the default-priority streams that other code takes
    never share; a device module without the range gets -1."""
    module = machine("cuda", 1)
    make_stream = module.Stream

    def stream(device, priority=0):
        return make_stream(device, priority)

    stream.priority_range = lambda: (0, -3)  # as torch.cuda.Stream.priority_range on an H100
    module.Stream = stream
    lanes = dpkit.virtual_devices(3)
    assert [lanes_module.stream_of(lane).priority for lane in lanes] == [-3, -3, -3]
    lanes_module._lane_streams.clear()
    module.Stream = make_stream  # no priority_range
    assert lanes_module.stream_of(lanes[1]).priority == -1


def test_lanes_on_the_second_gpu_wait_for_the_callers_stream_on_that_gpu(machine):
    """Scatter and replicate queue a lane's inputs on the caller's current stream of the
    lanes' GPU, so each lane's stream waits for that one, even where the current device (the
    one ``current_stream()`` with no device means, as in torch) is another GPU."""
    module = machine("cuda", 2)
    module.current_stream = lambda device=None: ("current", device or torch.device("cuda", 0))
    lanes = dpkit.virtual_devices(3, on="cuda:1")
    streams, caller = lanes_module.lane_streams(lanes)
    assert caller == ("current", torch.device("cuda", 1))
    assert streams == [lanes_module.stream_of(lane) for lane in lanes]
    assert [s.waited_for for s in streams] == [[caller]] * 3


def test_the_host_is_named_cpu():
    assert Device(-1, dev.HOST, torch.device("cpu")).name == "cpu"
