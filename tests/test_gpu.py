"""The core suite on real GPUs and on virtual lanes on one GPU, and torch's own primitives.

Marked ``gpu`` and skipped without CUDA; ``scripts/gpu_check.sh`` runs it on a GPU machine.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import parallel as torch_parallel

import dpkit

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _real_or_skip(n: int) -> list[dpkit.Device]:
    if torch.cuda.device_count() < n:
        pytest.skip(f"needs {n} real GPUs")
    return dpkit.devices(n)


def _kinds(n: int) -> list[list[dpkit.Device]]:
    """GPU lanes always; real devices where this many GPUs exist."""
    kinds = [dpkit.virtual_devices(n, on="cuda")]
    if torch.cuda.device_count() >= n:
        kinds.append(dpkit.devices(n))
    return kinds


def _model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(32, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Linear(256, 8)
    ).cuda()


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("batch", [3, 10, 257])
def test_outputs_grads_and_steps_match_one_device(n, batch):
    for devices in _kinds(n):
        torch.manual_seed(0)
        model = _model().double()
        reference = copy.deepcopy(model)
        wrapped = dpkit.DataParallel(model, device_ids=devices)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
        for _ in range(5):
            x = torch.randn(batch, 32, device="cuda", dtype=torch.double)
            # BatchNorm sees only replica 0's chunk under DataParallel: compare in eval mode.
            model.eval(), reference.eval()
            loss = wrapped(x).pow(2).mean()
            reference_loss = reference(x).pow(2).mean()
            torch.testing.assert_close(loss, reference_loss)
            optimizer.zero_grad(), reference_optimizer.zero_grad()
            loss.backward(), reference_loss.backward()
            for p, q in zip(model.parameters(), reference.parameters()):
                torch.testing.assert_close(p.grad, q.grad)
            optimizer.step(), reference_optimizer.step()
        torch.cuda.synchronize()


def test_gpu_lanes_use_one_stream_each():
    lanes = dpkit.virtual_devices(4, on="cuda")
    seen = {}

    class Probe(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(8, 8)

        def forward(self, x):
            seen[dpkit.current_device().index] = torch.cuda.current_stream().cuda_stream
            return self.linear(x)

    dpkit.DataParallel(Probe().cuda(), device_ids=lanes)(torch.randn(8, 8, device="cuda"))
    assert len(set(seen.values())) == 4
    assert torch.cuda.default_stream().cuda_stream not in seen.values()


def test_gpu_lane_copies_are_real_and_counted():
    lanes = dpkit.virtual_devices(4, on="cuda")
    moved = []
    handle = dpkit.add_transfer_listener(lambda t: moved.append(t))
    x = torch.randn(10, 5, device="cuda")
    chunks = dpkit.scatter(x, lanes)
    handle.remove()
    assert [c.shape[0] for c in chunks] == [3, 3, 3, 1]
    assert chunks[0].data_ptr() == x.data_ptr()
    assert all(c.untyped_storage().data_ptr() != x.untyped_storage().data_ptr() for c in chunks[1:])
    assert sum(t.nbytes for t in moved) == (3 + 3 + 1) * 5 * 4


def test_host_input_is_copied_to_every_gpu_lane():
    lanes = dpkit.virtual_devices(2, on="cuda")
    chunks = dpkit.scatter(torch.randn(4, 3), lanes)
    assert all(c.is_cuda for c in chunks)


def test_lanes_stay_correct_under_load():
    """Many lanes, large enough kernels to overlap: results must not race."""
    lanes = dpkit.virtual_devices(8, on="cuda")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512)).cuda()
    wrapped = dpkit.DataParallel(model, device_ids=lanes)
    for _ in range(10):
        x = torch.randn(4096, 512, device="cuda")
        torch.testing.assert_close(wrapped(x), model(x), rtol=1e-4, atol=1e-4)


# -- dpkit against torch.nn.parallel itself, on real devices ----------------------------


def test_scatter_and_gather_match_torch():
    devices = _real_or_skip(1) if torch.cuda.device_count() < 2 else dpkit.devices(2)
    ids = [d.index for d in devices]
    x = torch.randn(11, 4, 3, device="cuda")
    for dim in (0, 1):
        ours = dpkit.scatter(x, devices, dim=dim)
        theirs = torch_parallel.scatter(x, ids, dim=dim)
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            assert a.device == b.device
            torch.testing.assert_close(a, b)
        torch.testing.assert_close(
            dpkit.gather(list(ours), devices[0], dim=dim),
            torch_parallel.gather(list(theirs), ids[0], dim=dim),
        )


def test_data_parallel_matches_torch():
    devices = _real_or_skip(1) if torch.cuda.device_count() < 2 else dpkit.devices(2)
    torch.manual_seed(0)
    model = _model()
    ours_model, theirs_model = model, copy.deepcopy(model)
    x = torch.randn(9, 32, device="cuda")
    ours = dpkit.DataParallel(ours_model, device_ids=devices)(x)
    theirs = nn.DataParallel(theirs_model, device_ids=[d.index for d in devices])(x)
    torch.testing.assert_close(ours, theirs)
    ours.sum().backward(), theirs.sum().backward()
    for p, q in zip(ours_model.parameters(), theirs_model.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    torch.testing.assert_close(ours_model[1].running_mean, theirs_model[1].running_mean)


def test_replicate_matches_torch():
    devices = _real_or_skip(1) if torch.cuda.device_count() < 2 else dpkit.devices(2)
    model = _model()
    ours = dpkit.replicate(model, devices)
    theirs = torch_parallel.replicate(model, [d.index for d in devices])
    for a, b in zip(ours, theirs):
        for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
            assert p.device == q.device, name
    assert ours[0][0].weight.data_ptr() == model[0].weight.data_ptr()


@pytest.mark.parametrize("kind", ["lanes", "real"])
def test_trace_on_gpu_times_every_phase_and_counts_activations(kind):
    """On CUDA the trace's times come from CUDA events: after the block every event has
    finite, ordered times; each lane has its apply and backward events; the activations are
    the ReLU output each replica saves (its rows x 256 floats)."""
    devs = dpkit.virtual_devices(2, on="cuda") if kind == "lanes" else _real_or_skip(2)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 8)).cuda()
    with dpkit.trace() as tr:
        dpkit.DataParallel(model, device_ids=devs)(
            torch.randn(10, 32, device="cuda")
        ).sum().backward()
    events = tr.events
    assert all(e.start <= e.end and e.end < float("inf") for e in events)
    for device in devs:
        phases = {e.phase for e in events if e.device == device.name}
        assert {"scatter", "replicate", "apply", "gather", "backward"} <= phases
    activations = [r.nbytes for r in tr.memory if r.category == "activations"]
    assert activations == [5 * 256 * 4, 5 * 256 * 4]


def test_real_gpu_memory_comes_from_torchs_allocator():
    """On a real GPU the trace reads torch's allocator: at the end of forward it holds at
    least the parameters, the input and the output, and the step's peak (read when the trace
    ends, after backward) is at least that, and at least the gradients on top of the
    parameters. Virtual lanes on the GPU share its allocator and get no such reading."""
    (device,) = _real_or_skip(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256)).cuda()
    x = torch.randn(512, 256, device="cuda")
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    with dpkit.trace() as tr:
        y = dpkit.DataParallel(model, device_ids=[device])(x)
        y.sum().backward()
    readings = {r.category: r.nbytes for r in tr.memory if r.device == device.name}
    at_least = parameter_bytes + 2 * x.numel() * x.element_size()  # x and y: same shape
    assert readings["allocated (torch)"] >= at_least
    assert readings["peak (torch)"] >= max(readings["allocated (torch)"], 2 * parameter_bytes)

    with dpkit.trace() as lanes:
        dpkit.DataParallel(model, device_ids=dpkit.virtual_devices(2, on="cuda"))(x)
    assert not {r.category for r in lanes.memory} & {"allocated (torch)", "peak (torch)"}


def test_gpu_lanes_time_a_backward_that_skips_their_last_node():
    """The input's gradient alone: each lane's backward event is ended by the engine's
    callback, with a CUDA event on the lane's own stream, and resolves to finite times."""
    devs = dpkit.virtual_devices(2, on="cuda")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 8)).cuda()
    x = torch.randn(10, 32, device="cuda", requires_grad=True)
    with dpkit.trace() as tr:
        torch.autograd.grad(dpkit.DataParallel(model, device_ids=devs)(x).sum(), x)
    backward = [e for e in tr.events if e.phase == "backward"]
    assert sorted(e.device for e in backward) == sorted(d.name for d in devs)
    assert all(e.start <= e.end < float("inf") and "end" in e.details for e in backward)
