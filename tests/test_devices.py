"""Device handles: devices(n) without an accelerator, resolving specs, counting copies."""

from __future__ import annotations

import threading

import pytest
import torch
from lanes import recorded_transfers

import dpkit
import dpkit.device as devices_module
from dpkit import Device
from dpkit import lanes as lanes_module


def _has_accelerator() -> bool:
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and accelerator.is_available():
        return accelerator.current_accelerator().type != "mps"
    return torch.cuda.is_available()


needs_cpu_only = pytest.mark.skipif(
    _has_accelerator(), reason="checks what dpkit does on a machine without accelerators"
)


@needs_cpu_only
@pytest.mark.parametrize("n", [1, 2, 4, 7])
def test_devices_without_accelerator_are_virtual_cpu_lanes(n):
    lanes = dpkit.devices(n)
    assert len(lanes) == n
    assert [d.index for d in lanes] == list(range(n))
    assert all(d.kind == "virtual-cpu" for d in lanes)
    assert all(d.is_virtual for d in lanes)
    assert all("virtual" in d.name and "virtual" in str(d) for d in lanes)
    assert all(d.torch_device == torch.device("cpu") for d in lanes)


def test_virtual_devices_on_cpu():
    lanes = dpkit.virtual_devices(3, on="cpu")
    assert [(d.index, d.kind) for d in lanes] == [
        (0, "virtual-cpu"),
        (1, "virtual-cpu"),
        (2, "virtual-cpu"),
    ]
    assert all(d.torch_device.type == "cpu" for d in lanes)
    assert len({d.name for d in lanes}) == 3  # every lane is told apart in text


@needs_cpu_only
def test_devices_and_virtual_devices_agree_without_accelerator():
    assert dpkit.devices(3) == dpkit.virtual_devices(3) == dpkit.virtual_devices(3, on="cpu")


def test_device_handles_are_equal_and_hashable_by_value():
    first = dpkit.virtual_devices(4, on="cpu")
    second = dpkit.virtual_devices(4, on="cpu")
    assert first == second
    assert first[2] is not second[2]
    assert first[2] == Device(2, "virtual-cpu", torch.device("cpu"))
    assert hash(first[2]) == hash(second[2])
    assert len(set(first + second)) == 4
    table = {device: device.index for device in first}
    assert table[second[3]] == 3
    assert first[0] != first[1]
    assert first[0] != dpkit.as_device("cpu")  # lane 0 and the host are different handles


def test_as_devices_accepts_ints_as_lanes_without_enough_accelerators():
    # More ints than this machine has accelerators (it has none or fewer than 64) -> lanes.
    resolved = dpkit.as_devices(list(range(64)))
    assert [d.index for d in resolved] == list(range(64))
    assert all(d.is_virtual and "virtual" in d.name for d in resolved)


@needs_cpu_only
def test_as_devices_ints_equal_virtual_devices_without_accelerator():
    assert dpkit.as_devices([0, 1, 2]) == dpkit.virtual_devices(3, on="cpu")


def test_as_devices_accepts_device_handles_unchanged():
    lanes = dpkit.virtual_devices(3, on="cpu")
    assert dpkit.as_devices(lanes) == lanes
    assert dpkit.as_devices(tuple(lanes[1:])) == lanes[1:]
    assert dpkit.as_device(lanes[2]) == lanes[2]


def test_as_devices_ints_follow_the_lanes_they_are_mixed_with():
    lanes = dpkit.virtual_devices(3, on="cpu")
    resolved = dpkit.as_devices([lanes[0], 1, 2])
    assert resolved == lanes


def test_as_devices_rejects_mixed_kinds():
    lane = dpkit.virtual_devices(1, on="cpu")[0]
    with pytest.raises(ValueError, match=r"mixes kinds of device") as error:
        dpkit.as_devices([lane, "cpu"])
    assert "virtual-cpu" in str(error.value) and "host" in str(error.value)
    assert "dpkit.devices(n)" in str(error.value) or "virtual_devices(n)" in str(error.value)


def test_as_devices_rejects_mixed_kinds_with_torch_device():
    lane = dpkit.virtual_devices(1, on="cpu")[0]
    with pytest.raises(ValueError, match=r"devices mixes kinds"):
        dpkit.as_devices([torch.device("cpu"), lane])


def test_device_of_scatter_chunks_is_their_lane():
    lanes = dpkit.virtual_devices(4, on="cpu")
    chunks = dpkit.scatter(torch.randn(10, 5), lanes)
    assert [dpkit.device_of(chunk) for chunk in chunks] == lanes


def test_device_of_plain_cpu_tensor_is_the_host():
    host = dpkit.device_of(torch.zeros(3))
    assert host.kind == "host"
    assert not host.is_virtual
    assert host.torch_device == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="cuda:0 exists here")
@pytest.mark.parametrize("name", ["cuda:0", "cuda:3", "cuda"])
def test_cuda_name_without_cuda_is_a_clear_value_error(name):
    with pytest.raises(ValueError, match=r"does not exist on this machine") as error:
        dpkit.as_device(name)
    message = str(error.value)
    assert "cuda" in message
    assert "virtual_devices" in message  # the fix: use virtual lanes


@pytest.mark.skipif(torch.cuda.is_available(), reason="cuda:0 exists here")
def test_cuda_name_in_a_device_list_without_cuda_names_the_argument():
    with pytest.raises(ValueError, match=r"device_ids='cuda:0' does not exist.*virtual_devices"):
        dpkit.DataParallel(torch.nn.Linear(2, 2), device_ids=["cuda:0", "cuda:1"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA exists here")
def test_virtual_devices_on_cuda_without_cuda_says_use_cpu():
    with pytest.raises(ValueError, match=r"on='cuda'.*use on='cpu'"):
        dpkit.virtual_devices(2, on="cuda")


def test_transfer_listener_counts_scatter_copies_to_lanes_other_than_home():
    lanes = dpkit.virtual_devices(4, on="cpu")
    with recorded_transfers() as log:
        dpkit.scatter(torch.randn(10, 5, dtype=torch.float32), lanes)
    # Lane 0 is the home lane (plain CPU memory): its chunk is a view, not a copy.
    assert [t.destination for t in log] == lanes[1:]
    assert {t.op for t in log} == {"scatter"}
    assert [t.nbytes for t in log] == [3 * 5 * 4, 3 * 5 * 4, 1 * 5 * 4]
    assert sum(t.nbytes for t in log) == (3 + 3 + 1) * 5 * 4


def test_transfer_listener_remove_stops_it():
    lanes = dpkit.virtual_devices(4, on="cpu")
    log: list[dpkit.Transfer] = []
    handle = dpkit.add_transfer_listener(log.append)
    try:
        dpkit.scatter(torch.randn(8, 2), lanes)
        seen = len(log)
        assert seen == 3
    finally:
        handle.remove()
    dpkit.scatter(torch.randn(8, 2), lanes)
    assert len(log) == seen


def test_current_device_is_none_outside_parallel_apply():
    assert dpkit.current_device() is None
    # also in a thread that never ran a replica (a widget's callback, a data loader's worker)
    found = []
    thread = threading.Thread(target=lambda: found.append(dpkit.current_device()))
    thread.start()
    thread.join()
    assert found == [None]


class _RoundRobinPool:
    """Stands in for torch.cuda's stream pools (c10/cuda/CUDAStream.h): per priority, ``size``
    streams handed out in turn; priorities beyond the supported range clamp to its end."""

    def __init__(self, size: int, others_take_every: int | None = None) -> None:
        self.size, self.others_take_every = size, others_take_every
        self.taken: dict[int, int] = {}
        pools = self

        class Stream:
            @staticmethod
            def priority_range() -> tuple[int, int]:
                return 0, -3  # least, greatest: what a recent GPU gives torch

            def __new__(cls, device, priority: int = 0):  # noqa: ARG004 - torch's signature
                return pools.take(max(priority, -3))

        self.Stream = Stream

    def take(self, priority: int):
        taken = self.taken.get(priority, 0)
        if self.others_take_every and taken % self.others_take_every == 1:
            taken += 1  # another thread took one in between
        self.taken[priority] = taken + 1
        return type("FakeStream", (), {"stream_id": (priority, taken % self.size)})()


def test_the_lanes_of_one_gpu_get_distinct_streams_taken_in_one_go():
    pool = _RoundRobinPool(devices_module.MAX_GPU_LANES)
    for _ in range(7):  # other code took some streams before dpkit's first lane
        pool.Stream(torch.device("cuda", 0), priority=-3)
    streams = lanes_module._new_lane_streams(pool, torch.device("cuda", 0))
    assert len({s.stream_id for s in streams}) == devices_module.MAX_GPU_LANES


def test_streams_made_after_the_lanes_are_not_a_lanes_own():
    """torch.cuda.Stream() after the lanes exist (a side stream, a library's) must not be a
    lane's stream: its work would wait for that lane's instead of overlapping it."""
    pool = _RoundRobinPool(devices_module.MAX_GPU_LANES)
    lanes = {s.stream_id for s in lanes_module._new_lane_streams(pool, torch.device("cuda", 0))}
    later = [pool.Stream(torch.device("cuda", 0)).stream_id for _ in range(40)]
    assert lanes.isdisjoint(later)


def test_lane_streams_that_would_repeat_are_refused_with_a_clear_error():
    pool = _RoundRobinPool(devices_module.MAX_GPU_LANES, others_take_every=3)
    with pytest.raises(RuntimeError, match="distinct CUDA streams"):
        lanes_module._new_lane_streams(pool, torch.device("cuda", 0))


def test_more_cpu_lanes_than_threads_can_sensibly_run_is_a_clear_error_not_a_hang():
    from dpkit.device import MAX_CPU_LANES

    most = dpkit.virtual_devices(MAX_CPU_LANES, on="cpu")
    assert [d.index for d in most] == list(range(MAX_CPU_LANES))
    assert dpkit.as_devices(most) == most  # each listed once: the duplicates check passes
    # a slip of a few digits: refused at once (it built 10**20 handles, then hung)
    for n in (MAX_CPU_LANES + 1, 10**20):
        with pytest.raises(ValueError, match=rf"^n={n} lanes on the CPU: at most 1024, .*n<=1024"):
            dpkit.virtual_devices(n, on="cpu")
    if not devices_module.accelerator_count():  # devices(n) falls back to CPU lanes here
        with pytest.raises(ValueError, match=r"at most 1024"):
            dpkit.devices(10**20)


def test_more_device_ids_than_a_gpu_has_lane_streams_is_a_clear_error():
    from dpkit.device import MAX_GPU_LANES, VIRTUAL_GPU, as_device

    gpu_lane = Device(0, VIRTUAL_GPU, torch.device("cuda", 0))  # as device_ids=[0..] on 1 GPU
    assert MAX_GPU_LANES == 32  # torch's pool: 32 streams per device and priority
    assert as_device(31, like=gpu_lane).index == 31  # the last lane that has a stream
    # the first that has none, and the lanes there are, by index
    with pytest.raises(ValueError, match=r"lane 32 on one GPU: at most 32 .*; use lanes 0-31, or"):
        as_device(32, like=gpu_lane)
    with pytest.raises(ValueError, match=r"lane 39 on one GPU: at most 32 lanes"):
        as_device(39, like=gpu_lane)  # was a bare IndexError in stream_of later
    cpu_lane = dpkit.virtual_devices(1, on="cpu")[0]
    assert as_device(39, like=cpu_lane).index == 39  # CPU lanes have no stream pool
