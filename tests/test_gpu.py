"""The core suite on real GPUs and on virtual lanes on one GPU, and torch's own primitives.

Marked ``gpu`` and skipped without CUDA; ``scripts/gpu_check.sh`` runs it on a GPU machine.
The stream tests at the end (issue 19) stall a stream with ``torch.cuda._sleep`` to open the
window a missing wait or a missing ``record_stream`` leaves; ``tests/test_cuda_streams.py``
checks the same behaviour on the CPU, with a pretend GPU.
"""

from __future__ import annotations

import copy
import math
import threading

import pytest
import torch
from stalls import STALL_CYCLES, Stall, StalledNet
from torch import nn
from torch.nn import parallel as torch_parallel

import dpkit
from dpkit.device import HOST_DEVICE
from dpkit.lanes import stream_of
from dpkit.tracing import clock as trace_clock

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
    # streams made afterwards, as a user's side stream is, are none of the lanes' (issue 30.7)
    later = {torch.cuda.Stream().cuda_stream for _ in range(40)}
    lanes_all = {stream_of(lane).cuda_stream for lane in dpkit.virtual_devices(32, on="cuda")}
    assert later.isdisjoint(lanes_all)


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


def test_torch_data_parallel_on_one_gpu_repeated_is_the_reference_for_gpu_lanes():
    """Four GPU lanes are four devices on one GPU; torch's ``nn.DataParallel`` can name one
    GPU four times (``device_ids=[0, 0, 0, 0]``) where it accepts that: then the two must
    agree in float64, outputs and gradients. Where torch refuses, the refusal is the finding."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).cuda().double()
    ours_model, theirs_model = model, copy.deepcopy(model)
    x = torch.randn(10, 32, device="cuda", dtype=torch.double)
    try:
        theirs = nn.DataParallel(theirs_model, device_ids=[0, 0, 0, 0])(x)
    except Exception as error:  # noqa: BLE001 - torch's refusal is what is recorded
        pytest.skip(f"torch's DataParallel refuses device_ids=[0, 0, 0, 0]: {error}")
    ours = dpkit.DataParallel(ours_model, device_ids=dpkit.virtual_devices(4, on="cuda"))(x)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    ours.sum().backward(), theirs.sum().backward()
    for p, q in zip(ours_model.parameters(), theirs_model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-12, atol=1e-12)


def test_gpu_lanes_gather_to_the_host_with_output_device_minus_one():
    """torch's ``output_device=-1`` gathers onto the CPU; on GPU lanes too, with gradients
    flowing back to the lanes' parameters on the GPU."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).cuda().double()
    reference = copy.deepcopy(model)
    x = torch.randn(10, 32, device="cuda", dtype=torch.double)
    lanes = dpkit.virtual_devices(4, on="cuda")
    out = dpkit.DataParallel(model, device_ids=lanes, output_device=-1)(x)
    assert out.device.type == "cpu"
    expected = reference(x)
    torch.testing.assert_close(out, expected.cpu())
    out.sum().backward(), expected.sum().backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert p.grad.device.type == "cuda"
        torch.testing.assert_close(p.grad, q.grad)


def test_replicate_matches_torch():
    """Replica parameters are plain attributes (``named_parameters()`` is empty): compare
    them through ``_former_parameters``, which both replicates fill, and the buffers."""
    devices = _real_or_skip(1) if torch.cuda.device_count() < 2 else dpkit.devices(2)
    model = _model()
    ours = dpkit.replicate(model, devices)
    theirs = torch_parallel.replicate(model, [d.index for d in devices])
    compared = 0
    for ours_replica, theirs_replica in zip(ours, theirs, strict=True):
        for a, b in zip(ours_replica.modules(), theirs_replica.modules(), strict=True):
            assert type(a) is type(b)
            assert list(a._former_parameters) == list(b._former_parameters)
            pairs = [(a._former_parameters[k], q) for k, q in b._former_parameters.items()]
            pairs += [(a._buffers[k], q) for k, q in b._buffers.items()]
            for p, q in pairs:
                assert p.device == q.device
                assert p.requires_grad == q.requires_grad
                torch.testing.assert_close(p, q)
                compared += 1
    held = len(list(model.parameters())) + len(list(model.buffers()))
    assert compared == len(devices) * held
    assert ours[0][0].weight.data_ptr() == model[0].weight.data_ptr()
    x = torch.randn(6, 32, device="cuda")
    for device, ours_replica, theirs_replica in zip(devices, ours, theirs):
        chunk = x.to(device.torch_device)
        torch.testing.assert_close(ours_replica(chunk), theirs_replica(chunk))


def test_parallel_apply_matches_torch_on_real_gpus():
    """replicate, scatter and parallel_apply on real devices, one GPU included (a single
    replica runs in the calling thread, as in torch)."""
    devices = _real_or_skip(1) if torch.cuda.device_count() < 2 else dpkit.devices(2)
    ids = [d.index for d in devices]
    torch.manual_seed(0)
    model = _model().eval()
    x = torch.randn(9, 32, device="cuda")
    ours = dpkit.parallel_apply(
        dpkit.replicate(model, devices), dpkit.scatter(x, devices), devices=devices
    )
    theirs = torch_parallel.parallel_apply(
        torch_parallel.replicate(model, ids), torch_parallel.scatter(x, ids), devices=ids
    )
    assert len(ours) == len(theirs) == len(devices)
    for a, b in zip(ours, theirs):
        assert a.device == b.device
        torch.testing.assert_close(a, b)


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


# -- streams (issue 19) ------------------------------------------------------------------


class Mixed(nn.Module):
    """Returns a dense CUDA tensor, a CPU tensor and sparse CUDA tensors (COO and CSR)."""

    def forward(self, x):
        doubled = x * 2
        return {"dense": doubled, "rows": torch.tensor(x.shape[0]),
                "sparse": doubled.to_sparse(), "csr": doubled.to_sparse_csr()}  # fmt: skip


def test_gpu_lane_replicas_may_return_cpu_and_sparse_tensors():
    """A lane's CUDA outputs are recorded on the caller's stream (a sparse one through its
    dense parts: record_stream refuses sparse layouts), and a CPU output stays on the host."""
    lanes = dpkit.virtual_devices(2, on="cuda")
    x = torch.randn(4, 3, device="cuda")
    chunks = dpkit.scatter(x, lanes)
    outputs = dpkit.parallel_apply([Mixed(), Mixed()], chunks, devices=lanes)
    for output, chunk in zip(outputs, chunks):
        torch.testing.assert_close(output["dense"], chunk * 2)
        torch.testing.assert_close(output["sparse"].to_dense(), chunk * 2)
        torch.testing.assert_close(output["csr"].to_dense(), chunk * 2)
        assert output["rows"].device.type == "cpu" and output["rows"].item() == 2
        assert dpkit.device_of(output["rows"]) == HOST_DEVICE
    gathered = dpkit.gather([output["dense"] for output in outputs], lanes[0])
    torch.testing.assert_close(gathered, x * 2)


class ScaledSum(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.rand(1 << 20))

    def forward(self, x):
        return (Stall.apply(x) * self.scale).sum(dim=1)


def test_gpu_lane_inputs_and_parameters_keep_their_memory_while_the_lane_runs():
    """Lane copies are made on the caller's stream and read on the lane's. Freed while the
    lane is still stalled, their memory must not go to new work on the caller's stream: that
    is what happens to tensors saved for backward when autograd frees them mid-backward."""
    lanes = dpkit.virtual_devices(2, on="cuda")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # so that the caller's free blocks are the ones freed below
    model = ScaledSum().cuda()
    x = torch.randn(2, 1 << 20, device="cuda")  # a 4 MiB row per lane: lane 1's is a copy
    with torch.no_grad():
        expected = (x * model.scale).sum(dim=1)
    torch.cuda.synchronize()
    replicas = dpkit.replicate(model, lanes, detach=True)
    chunks = dpkit.scatter(x, lanes)
    # x itself (lane 0 reads a view of it), lane 1's input and lane 1's parameter copy
    blocks = {x.data_ptr(), chunks[1].data_ptr(), replicas[1].scale.data_ptr()}
    with torch.no_grad():
        outputs = dpkit.parallel_apply(replicas, chunks, devices=lanes)
    del x, chunks, replicas
    fresh = [torch.empty(1 << 20, device="cuda") for _ in range(6)]  # on the caller's stream
    lanes_busy = not any(stream_of(lane).query() for lane in lanes)
    reused = blocks & {tensor.data_ptr() for tensor in fresh}
    torch.cuda.synchronize()
    if not lanes_busy:
        pytest.skip("the lanes finished before the check; raise STALL_CYCLES")
    assert not reused
    torch.testing.assert_close(torch.cat(outputs), expected)


@pytest.mark.parametrize("side_stream", [False, True])
@pytest.mark.parametrize("n", [2, 4])
def test_gpu_lanes_stay_exact_when_stalled_in_forward_and_backward(n, side_stream):
    """Training on lanes that stall before and after their work, in forward and in backward,
    called from the default stream or from a side stream, matches one device exactly."""
    torch.manual_seed(0)
    model = StalledNet().cuda().double()
    reference = copy.deepcopy(model)
    wrapped = dpkit.DataParallel(model, device_ids=dpkit.virtual_devices(n, on="cuda"))
    x = torch.randn(64, 64, device="cuda", dtype=torch.double)
    caller = torch.cuda.Stream() if side_stream else torch.cuda.current_stream()
    caller.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(caller):
        y = wrapped(x)
        y.pow(2).mean().backward()
    torch.cuda.current_stream().wait_stream(caller)
    y_reference = reference(x)
    y_reference.pow(2).mean().backward()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, y_reference)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)


def test_real_gpus_run_replicas_on_the_callers_current_streams():
    """A worker thread's current stream is its device's default stream: each replica must
    run on the stream current in the caller for its device instead, as in torch."""
    devices = _real_or_skip(2)
    sides = [torch.cuda.Stream(device=d.torch_device) for d in devices]
    seen = {}

    class Where(nn.Module):
        def forward(self, x):
            seen[x.device.index] = torch.cuda.current_stream(x.device).cuda_stream
            return x + 1

    chunks = [torch.zeros(1, device=d.torch_device) for d in devices]
    torch.cuda.synchronize()
    with torch.cuda.stream(sides[0]), torch.cuda.stream(sides[1]):
        outputs = dpkit.parallel_apply([Where(), Where()], chunks, devices=devices)
    torch.cuda.synchronize()
    assert seen == {i: side.cuda_stream for i, side in enumerate(sides)}
    assert [output.item() for output in outputs] == [1.0, 1.0]


def test_real_gpus_wait_for_work_the_caller_queued_on_a_side_stream():
    """Under ``with torch.cuda.stream(s)`` the input is written on s, late (s is stalled):
    replicas on the workers' default streams would read it before it is written."""
    devices = _real_or_skip(2)
    torch.manual_seed(0)
    model = nn.Linear(64, 64).cuda()
    values = torch.randn(8, 64, device="cuda")
    with torch.no_grad():
        expected = model(values)
    x = torch.zeros_like(values)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(STALL_CYCLES)
        x.copy_(values)
        with torch.no_grad():
            y = dpkit.DataParallel(model, device_ids=devices)(x)
    torch.cuda.synchronize()
    torch.testing.assert_close(y, expected)


def test_trace_times_each_gpu_on_its_own_stream():
    """The caller's thread (cuda:0 current) queues the copy to cuda:1; with cuda:1's stream
    stalled the copy lands late, and cuda:1's scatter event, timed on cuda:1's stream against
    cuda:1's clock, says so."""
    devices = _real_or_skip(2)
    x = torch.randn(8, 64, device="cuda")
    with dpkit.trace():  # fixes each GPU's clock origin while nothing is stalled
        dpkit.scatter(x, devices)
    torch.cuda.synchronize()
    with dpkit.trace() as tr:
        with torch.cuda.device(1):
            torch.cuda._sleep(STALL_CYCLES)
        dpkit.scatter(x, devices)
    scatter = {e.device: e for e in tr.events if e.phase == "scatter"}
    assert all(0 < e.start <= e.end < math.inf for e in scatter.values())
    assert scatter["cuda:1"].end - scatter["cuda:0"].end > 0.01  # STALL_CYCLES: >= ~25 ms


def test_hooks_without_a_trace_get_final_times_on_gpu():
    """With no trace recording, hooks get finite times and no CUDA event is left pending."""
    lanes = dpkit.virtual_devices(2, on="cuda")
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)).cuda()
    wrapped = dpkit.DataParallel(model, device_ids=lanes)
    seen, lock = [], threading.Lock()

    def hook(event):
        with lock:  # apply events come from the workers, backward ones from autograd
            seen.append((event.phase, event.start, event.end))

    pending = len(trace_clock._pending)
    handle = dpkit.register_phase_hook(hook)
    try:
        for _ in range(3):
            wrapped(torch.randn(32, 64, device="cuda")).sum().backward()
    finally:
        handle.remove()
    assert {"scatter", "replicate", "apply", "gather", "backward", "reduce"} <= {
        phase for phase, _, _ in seen
    }
    assert all(0 < start <= end < math.inf for _, start, end in seen)
    assert len(trace_clock._pending) == pending


def test_a_long_trace_of_gpu_lanes_stores_pending_times_once_resolved():
    # Between steps a trace moves its records into columns once 512 wait; events whose CUDA
    # times are still pending (NaN) stay behind until read. 40 steps of 4 lanes pass 512
    # records several times; every step must come out whole, every time finite.
    lanes = dpkit.virtual_devices(4, on="cuda")
    parallel = dpkit.DataParallel(_model(), device_ids=lanes)
    x = torch.randn(16, 32, device="cuda")
    with dpkit.trace(keep_steps=None) as tr:
        for _ in range(40):
            parallel(x).sum().backward()
    events = tr.events
    per_step = {}
    for e in events:
        per_step.setdefault(e.step, []).append(e.phase)
        assert math.isfinite(e.start) and math.isfinite(e.end) and e.end >= e.start
    assert sorted(per_step) == list(range(1, 41))
    first = sorted(per_step[1])
    assert all(sorted(phases) == first for phases in per_step.values())
