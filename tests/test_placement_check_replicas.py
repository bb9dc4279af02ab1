"""The placement check inside the replicas' worker threads: the two classic mistakes made in a
forward, which pass on one GPU and fail on several, fail on checked lanes too; every forward
that reads only its own data keeps running, on several lanes and on one.

On ``n`` GPUs, ``replicate`` copies parameters and buffers only, so a plain tensor attribute
is read from ``cuda:0`` by the replica on ``cuda:1``, and a tensor a forward makes without
``device=`` is on the CPU: both raise torch's "Expected all tensors to be on the same device".
"""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

import dpkit
from dpkit.parallel_apply import _CallersModes
from dpkit.testing.placement_check import checking_placement

SAME_DEVICE = "Expected all tensors to be on the same device"


@pytest.fixture
def lanes():
    with checking_placement():
        yield dpkit.virtual_devices(4, on="cpu")


class PlainAttribute(nn.Module):
    """A plain tensor attribute, not a buffer: replicate does not copy it."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(5, 2)
        self.scale = torch.randn(5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x * self.scale)


class MadeOnTheHost(nn.Module):
    """A tensor made in the forward without ``device=``: on the CPU on a GPU box."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(5, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + torch.ones(len(x), 1)


class ReadsOnlyItsOwn(nn.Module):
    """Every way a correct forward reads data: its parameters and buffers (BatchNorm's updated
    in place), its input and keyword arguments, CPU scalars and Python numbers, tensors made
    with ``device=x.device`` or from ``x``, and a plain attribute brought over with ``.to``."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(5, 3)
        self.norm = nn.BatchNorm1d(3)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 5))
        self.shift = torch.full((3,), 0.25)  # a plain attribute, only ever read via .to(x.device)
        self.made: list[tuple[object, object]] = []  # shared by the replicas (a plain attribute)

    def forward(self, x: torch.Tensor, bias: torch.Tensor, factor: float = 1.0) -> torch.Tensor:
        h = self.norm(self.linear(x * self.scale)) + bias
        h = h * torch.tensor(2.0) * factor + self.shift.to(x.device)
        ones = torch.ones(len(x), 1, device=x.device)
        self.made.append((dpkit.current_device(), dpkit.device_of(ones)))
        ones = ones + x.new_ones(len(x), 1)
        return h + ones + torch.zeros_like(h) + torch.arange(3, device=x.device)


def _made_on_own_lanes(model: ReadsOnlyItsOwn, lanes) -> bool:
    """Whether each replica's ``device=x.device`` tensors were on its own lane (the check
    followed the replica's data), on every lane."""
    made, model.made[:] = list(model.made), []
    return {lane for lane, _ in made} == set(lanes) and all(a == b for a, b in made)


def _home(module: nn.Module, lanes) -> nn.Module:
    module = module.to(lanes[0].torch_device)
    for name, value in vars(module).items():  # plain attributes too, as the user would
        if isinstance(value, torch.Tensor):
            setattr(module, name, value.to(lanes[0].torch_device))
    return module


def test_a_plain_tensor_attribute_read_by_the_replicas_fails_as_on_several_gpus(lanes):
    torch.manual_seed(0)
    model = _home(PlainAttribute(), lanes)
    x = torch.randn(8, 5, device=lanes[0].torch_device)
    with pytest.raises(RuntimeError, match=SAME_DEVICE) as error:
        dpkit.DataParallel(model, device_ids=lanes)(x)
    message = str(error.value)
    # replica 0 reads its own (lane 0's) tensor; replica 1 is the first to read another lane's
    assert f"in replica 1 on device {lanes[1]}" in message
    assert f"(in mul, in the replica on {lanes[1]}; dpkit's placement check:" in message
    assert f"a tensor of {lanes[0]} met {lanes[1]}'s data" in message
    assert "register_buffer" in message


def test_a_tensor_made_in_a_forward_without_device_fails_even_on_lane_0(lanes):
    model = _home(MadeOnTheHost(), lanes)
    x = torch.randn(8, 5, device=lanes[0].torch_device)
    with pytest.raises(RuntimeError, match=SAME_DEVICE) as error:
        dpkit.DataParallel(model, device_ids=lanes)(x)
    message = str(error.value)
    assert f"in replica 0 on device {lanes[0]}" in message  # lane 0 is no longer the host's
    assert f"data on {lanes[0]} met a tensor of shape (2, 1) left on the host CPU" in message
    assert "device=x.device" in message


def test_a_forward_that_reads_only_its_own_data_trains_and_matches_one_device(lanes):
    torch.manual_seed(0)
    home = lanes[0].torch_device
    model = _home(ReadsOnlyItsOwn(), lanes)
    single = _home(ReadsOnlyItsOwn(), lanes)
    single.load_state_dict(model.state_dict())
    parallel = dpkit.DataParallel(model, device_ids=lanes)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):  # BatchNorm's buffers updated in place by each replica, on its lane
        x, bias = torch.randn(8, 5, device=home), torch.randn(8, 3, device=home)
        optimizer.zero_grad()
        parallel(x, bias, factor=0.5).pow(2).mean().backward()
        optimizer.step()
    assert _made_on_own_lanes(model, lanes)
    assert {dpkit.device_of(t) for t in model.state_dict().values()} == {lanes[0]}
    # in eval mode each row's output is its own: the replicas compute what one device does
    single.load_state_dict(model.state_dict())
    x, bias = torch.randn(8, 5, device=home), torch.randn(8, 3, device=home)
    expected = single.eval()(x, bias, factor=0.5)
    got = parallel.eval()(x, bias, factor=0.5)
    assert dpkit.device_of(got) == lanes[0] and _made_on_own_lanes(model, lanes)
    torch.testing.assert_close(got, expected)


def test_the_single_device_path_checks_the_forward_in_the_callers_thread(lanes):
    x = torch.randn(8, 5, device=lanes[0].torch_device)
    model = _home(ReadsOnlyItsOwn(), lanes)
    out = dpkit.DataParallel(model, device_ids=lanes[:1])(x, torch.zeros(8, 3, device=x.device))
    assert out.shape == (8, 3) and model.made == [(None, lanes[0])]  # no replica: lane 0
    # one lane: the plain attribute is lane 0's own, as on one GPU, but a host tensor is not
    assert dpkit.DataParallel(_home(PlainAttribute(), lanes), device_ids=lanes[:1])(x).shape
    with pytest.raises(RuntimeError, match="left on the host CPU"):
        dpkit.DataParallel(_home(MadeOnTheHost(), lanes), device_ids=lanes[:1])(x)


def test_tensors_a_replica_makes_for_its_device_are_on_its_own_lane(lanes):
    class Makes(nn.Module):
        def forward(self, x):
            return torch.ones(2, device=x.device), torch.zeros(2).to(x.device), x.new_ones(2)

    home = lanes[0].torch_device
    x = torch.randn(4, 1, device=home)
    assert x.device == home and torch.ones(1).device == torch.device("cpu")  # as cuda:0, cpu
    replicas = dpkit.replicate(Makes(), lanes)
    outputs = dpkit.parallel_apply(replicas, dpkit.scatter(x, lanes), devices=lanes)
    for lane, made in zip(lanes, outputs):
        assert [dpkit.device_of(t) for t in made] == [lane] * 3
    # Outside the replicas lanes may meet: cpu:0 is every checked lane's torch device, so code
    # there cannot put data on lane 1 itself (model-parallel stage.to(lanes[1].torch_device))
    assert torch.equal(outputs[0][0], outputs[1][0])


def test_dpkit_primitives_and_tracing_run_under_the_check_in_the_replicas(lanes):
    torch.manual_seed(0)
    home = lanes[0].torch_device
    model = _home(ReadsOnlyItsOwn(), lanes)
    x, bias = torch.randn(8, 5, device=home), torch.randn(8, 3, device=home)
    with dpkit.trace() as recorded:
        out = dpkit.DataParallel(model, device_ids=lanes)(x, bias)
        out.sum().backward()
    assert {e.phase for e in recorded.events} >= {"scatter", "replicate", "apply", "gather"}
    assert _made_on_own_lanes(model, lanes)
    replicas = dpkit.replicate(model, lanes)
    inputs, kwargs = dpkit.scatter_kwargs((x,), {"bias": bias, "factor": 2.0}, lanes)
    outputs = dpkit.parallel_apply(replicas, inputs, kwargs, lanes)
    gathered = dpkit.gather(outputs, lanes[0])
    assert gathered.shape == (8, 3) and dpkit.device_of(gathered) == lanes[0]
    assert _made_on_own_lanes(model, lanes)


class Tempered(nn.Module):
    """A 0-dim plain attribute: a CPU scalar mixes with any device's data, a GPU's does not."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(5, 2)
        self.temperature = torch.tensor(2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) / self.temperature


def test_a_0_dim_tensor_of_another_lane_is_no_cpu_scalar_in_a_replica(lanes):
    x = torch.randn(8, 5, device=lanes[0].torch_device)
    model = _home(Tempered(), lanes)  # the temperature too: on lane 0, as on cuda:0
    with pytest.raises(RuntimeError, match=SAME_DEVICE) as error:
        dpkit.DataParallel(model, device_ids=lanes)(x)
    assert f"(in div, in the replica on {lanes[1]}; " in str(error.value)
    assert f"a tensor of {lanes[0]} met {lanes[1]}'s data" in str(error.value)
    model.temperature = torch.tensor(2.0)  # left on the host: a CPU scalar, as with CUDA
    assert dpkit.DataParallel(model, device_ids=lanes)(x).shape == (8, 2)


def test_the_replicas_threads_are_not_checked_once_the_check_is_off():
    with checking_placement():
        checked = dpkit.virtual_devices(4, on="cpu")
        x = torch.randn(8, 5, device=checked[0].torch_device)
        with pytest.raises(RuntimeError, match=SAME_DEVICE):
            dpkit.DataParallel(_home(PlainAttribute(), checked), device_ids=checked)(x)
    lanes = dpkit.virtual_devices(4, on="cpu")  # ordinary lanes: lane 0 is the host memory
    out = dpkit.DataParallel(PlainAttribute(), device_ids=lanes)(torch.randn(8, 5))
    assert out.shape == (8, 2)
    assert dpkit.DataParallel(MadeOnTheHost(), device_ids=lanes)(torch.randn(8, 5)).shape == (8, 2)


def test_a_replicas_thread_ends_with_the_check_taken_off_so_that_exiting_cannot_abort(lanes):
    """torch frees a mode left on a thread only after the thread has let go of Python, and a
    process exiting meanwhile aborts ("terminate called without an active exception")."""
    modes, depths = _CallersModes(lanes), []

    def replica_thread() -> None:
        with modes.entered(lanes[1], None):
            depths.append(torch._C._len_torch_function_stack())  # the check's mode
        depths.append(torch._C._len_torch_function_stack())

    thread = threading.Thread(target=replica_thread)
    thread.start()
    thread.join()
    assert depths == [1, 0]
